//! Pausing and resuming queues: [`Admin::pause`], [`Admin::resume`], their `_all` forms and
//! [`Admin::paused`]; and [`Admin::queue_seen`], whether a queue name is known at all.
//!
//! A pause is a row of `postpone_paused_queues`, so it survives restarts and holds on every
//! worker of the cluster: the claim (the SQL function `postpone_claim`) never takes a job of
//! a paused queue. Jobs already running finish; jobs keep being deferred into a paused
//! queue and wait. Resuming deletes the row and sends a notification so that workers look at
//! once; a worker that misses it finds the work at its next poll.
//!
//! A pause applies to the claims that start after it is committed: a claim already under
//! way when [`Admin::pause`] returns may still take the jobs it found (they run, as jobs
//! already running do), none after.
//!
//! Queues are not declared: a queue is a name that jobs and workers use. So every setting
//! of a queue (a pause, a concurrency, key or rate limit) is stored for any valid name, one
//! never seen included, which lets a queue be paused or limited before its first job; a
//! typo is not refused but told: [`Admin::queue_seen`] says whether any job or worker has
//! used the name, and the `postpone` commands that name a queue print the same note when
//! none has (`queue_seen` in their JSON).

use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use super::info::ser_time;
use super::Admin;
use crate::error::Result;
use crate::limits;
use crate::store;

/// One pause; from [`Admin::paused`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PausedQueue {
    /// The queue; `None`: every queue is paused.
    pub queue: Option<String>,
    /// Since when.
    #[serde(serialize_with = "ser_time")]
    pub paused_at: SystemTime,
}

/// Every pause in force; from [`Admin::paused`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Pauses {
    /// Since when every queue is paused, if it is ([`Admin::pause_all`]).
    #[serde(serialize_with = "super::info::ser_opt_time")]
    pub all: Option<SystemTime>,
    /// The queues paused one by one ([`Admin::pause`]), in name order.
    pub queues: Vec<PausedQueue>,
}

impl Pauses {
    /// Whether no job of `queue` is claimed now (its own pause, or the pause of all).
    pub fn is_paused(&self, queue: &str) -> bool {
        self.all.is_some()
            || self
                .queues
                .iter()
                .any(|p| p.queue.as_deref() == Some(queue))
    }

    /// Whether nothing is paused.
    pub fn is_empty(&self) -> bool {
        self.all.is_none() && self.queues.is_empty()
    }
}

impl Admin {
    /// Pauses `queue`: no worker claims its jobs until [`resume`](Self::resume); running
    /// jobs finish, and new jobs can still be deferred (they wait). Jobs a worker claimed
    /// but has not started go back to the queue: once this returns, no job of the queue
    /// starts (it waits up to 1.75 s for workers to give them back; a worker that
    /// does not answer by then cannot start them either). The pause is stored, so
    /// it survives restarts. Returns `false` if the queue was already paused (nothing
    /// changes). The queue need not have been seen ([`queue_seen`](Self::queue_seen) tells).
    /// An empty name, a NUL, or a name over 255 bytes is an
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) error.
    pub fn pause(&self, queue: &str) -> Result<bool> {
        limits::check_name("queue", queue).map_err(|e| e.context("pausing a queue"))?;
        let mut conn = self.conn()?;
        let rows = conn.query_named("pausing a queue", store::QUEUE_PAUSE, &[&Some(queue)])?;
        if !rows.is_empty() {
            log::info!("queue {queue:?} paused by the admin API");
        }
        wait_held_gone(&mut conn, Some(queue))?;
        Ok(!rows.is_empty())
    }

    /// Pauses every queue, those without jobs yet too (see [`pause`](Self::pause)). Returns
    /// `false` if every queue was already paused.
    pub fn pause_all(&self) -> Result<bool> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("pausing every queue", store::QUEUE_PAUSE, &[&None::<&str>])?;
        if !rows.is_empty() {
            log::info!("every queue paused by the admin API");
        }
        wait_held_gone(&mut conn, None)?;
        Ok(!rows.is_empty())
    }

    /// Lifts the pause of `queue` and wakes its workers. Returns `false` if it was not
    /// paused on its own. While every queue is paused ([`pause_all`](Self::pause_all)) the
    /// queue stays paused until [`resume_all`](Self::resume_all).
    pub fn resume(&self, queue: &str) -> Result<bool> {
        limits::check_name("queue", queue).map_err(|e| e.context("resuming a queue"))?;
        let mut conn = self.conn()?;
        let rows = conn.query_named("resuming a queue", store::QUEUE_RESUME, &[&queue])?;
        let lifted = rows.first().is_some_and(|r| r.get::<_, i64>(0) > 0);
        if lifted {
            log::info!("queue {queue:?} resumed by the admin API");
        }
        Ok(lifted)
    }

    /// Lifts every pause (that of all queues and those of single queues) and wakes every
    /// worker. Returns how many pauses were lifted.
    pub fn resume_all(&self) -> Result<u64> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "resuming every queue",
            store::QUEUE_RESUME_ALL,
            &[&self.app.namespace().channel()],
        )?;
        let n = rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64);
        if n > 0 {
            log::info!("every queue resumed by the admin API ({n} pauses lifted)");
        }
        Ok(n)
    }

    /// Whether `queue` has ever been seen, as far as the database still shows: a job of it
    /// is in the table (any status, until it is pruned), or a registered worker serves it by
    /// name. `false` for a name nothing uses (a typo, or a queue configured before its first
    /// job). Settings of a queue are stored either way; this is what tools tell their users.
    ///
    /// Cheap for a queue with waiting or running jobs or a worker of its own (indexes); a
    /// queue that has only finished jobs, or none, costs one scan of the jobs table.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let admin = app.admin();
    /// admin.pause("emials")?;
    /// if !admin.queue_seen("emials")? {
    ///     eprintln!("note: queue \"emials\" has never been seen; paused all the same");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn queue_seen(&self, queue: &str) -> Result<bool> {
        let what = "looking a queue up";
        limits::check_name("queue", queue).map_err(|e| e.context(what))?;
        let mut conn = self.conn()?;
        let rows = conn.query_named(what, store::QUEUE_SEEN, &[&queue])?;
        Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// The pauses in force.
    pub fn paused(&self) -> Result<Pauses> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("reading the paused queues", store::QUEUE_PAUSED, &[])?;
        let mut p = Pauses::default();
        for r in &rows {
            let queue: Option<String> = r.get(0);
            let paused_at: SystemTime = r.get(1);
            match queue {
                None => p.all = Some(paused_at),
                Some(q) => p.queues.push(PausedQueue {
                    queue: Some(q),
                    paused_at,
                }),
            }
        }
        Ok(p)
    }
}

/// Longest a pause waits for the jobs of its queue that workers hold unstarted to go back:
/// longer than a worker may start such a job on what it last read of the pauses.
pub(crate) const PAUSE_WAIT: Duration = Duration::from_millis(1750);

/// Waits until no worker holds an unstarted job of `queue` (`None`: of any queue), at most
/// [`PAUSE_WAIT`].
fn wait_held_gone(conn: &mut crate::conn::Connection, queue: Option<&str>) -> Result<()> {
    let until = Instant::now() + PAUSE_WAIT;
    loop {
        let held: i64 = conn
            .query_named(
                "waiting for held jobs to go back",
                store::QUEUE_HELD,
                &[&queue],
            )?
            .first()
            .map_or(0, |r| r.get(0));
        if held == 0 || Instant::now() >= until {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
