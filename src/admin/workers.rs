//! Workers as the database sees them, and the work stuck with dead ones: [`WorkerInfo`]
//! (with a stale mark), stalled jobs, and what an operator does about them (requeue or fail
//! the stalled jobs, forget dead workers), each with a dry run.
//!
//! The database knows which jobs a worker has *claimed* (`doing` under its id), and which of
//! them it has started (schema version 20: a held job has no `started_at` yet).
//!
//! A worker is stale once its own lease has ended: its last heartbeat plus the
//! `stalled_after` it recorded when it registered (`postpone_lease_end`, schema version 22).
//! The threshold an operator gives here can lengthen a lease, never shorten it, so a short
//! `--after` cannot presume a healthy worker with a longer setting dead. A worker older than
//! schema 22 recorded no lease: its lease is the longest of the threshold given, the longest
//! any registered worker records, and 30 s (the workers' default).
//!
//! Every change is one statement whose guard is in its `WHERE`: a stalled job is only
//! touched while it is still `doing` under a worker that is still stale (or gone), so a
//! worker that comes back to life and finishes the job first wins.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::info::{job_from_row, secs, ser_opt_secs, ser_secs, ser_time, JobInfo};
use super::Admin;
use crate::error::Result;
use crate::store;
use crate::store::{JOB_COLUMNS, STALLED_CONDITION};

/// A registered worker; from [`Admin::workers`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: i32,
    /// The queues it serves (`None`: all).
    pub queues: Option<Vec<String>>,
    /// Its executor threads: at most this many of its claimed jobs run at once.
    pub concurrency: i32,
    /// When it started.
    #[serde(serialize_with = "ser_time")]
    pub started_at: SystemTime,
    /// Its last heartbeat.
    #[serde(serialize_with = "ser_time")]
    pub last_heartbeat: SystemTime,
    /// How long ago that was, by the database's clock.
    #[serde(serialize_with = "ser_secs", rename = "heartbeat_age_secs")]
    pub heartbeat_age: Duration,
    /// How often it sends a heartbeat, as it recorded when it registered; `None` for a
    /// worker older than schema version 22.
    #[serde(serialize_with = "ser_opt_secs", rename = "heartbeat_interval_secs")]
    pub heartbeat_interval: Option<Duration>,
    /// Its `stalled_after`, as it recorded when it registered: it is presumed dead once its
    /// last heartbeat is older than this (its lease). `None` for a worker older than schema
    /// version 22, whose lease is the longest of the threshold asked for, the longest any
    /// registered worker records, and 30 s.
    #[serde(serialize_with = "ser_opt_secs", rename = "stalled_after_secs")]
    pub stalled_after: Option<Duration>,
    /// The task names it claims, sorted; `None`: every task (a worker with
    /// `only_registered_tasks(false)`, or older than schema version 22).
    pub tasks: Option<Vec<String>>,
    /// True when its lease has ended (lengthened to the threshold asked for, if that is
    /// longer): the worker is dead or cut off, and its jobs will be rescued.
    pub stale: bool,
    /// Jobs `doing` under it: running, or claimed and held, not started yet.
    pub claimed: u64,
    /// Of those, the jobs it has started (and not finished). The others it holds are
    /// waiting (shown as `todo` everywhere) and can be given back at any moment.
    pub running: u64,
}

/// What [`Admin::requeue_stalled`], [`Admin::fail_stalled`] or [`Admin::forget_workers`]
/// did, or would do with a dry run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StalledReport {
    /// True for a dry run: nothing was changed.
    pub dry_run: bool,
    /// Stalled jobs requeued or failed (or that would be).
    pub jobs: u64,
    /// Worker rows deleted (or that would be).
    pub workers: u64,
}

/// What to do with stalled jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StalledFix {
    Requeue,
    Fail,
}

fn millis(d: Duration) -> i64 {
    crate::limits::age_millis(d)
}

/// A duration recorded in milliseconds (none when not recorded, or negative: by hand).
fn ms(v: Option<i64>) -> Option<Duration> {
    v.filter(|&m| m >= 0)
        .map(|m| Duration::from_millis(m as u64))
}

impl Admin {
    /// Registered workers, oldest first, marked stale once their own lease has ended (their
    /// last heartbeat is older than their own `stalled_after`).
    pub fn workers(&self) -> Result<Vec<WorkerInfo>> {
        self.workers_stale_after(Duration::ZERO)
    }

    /// Registered workers, oldest first, marked stale once their own lease has ended,
    /// lengthened to `stale_after` when that is longer (a threshold never shortens a
    /// worker's lease; `Duration::ZERO`: each worker's own).
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// use std::time::Duration;
    /// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// for w in app.admin().workers_stale_after(Duration::from_secs(60))? {
    ///     let own = w.stalled_after.map_or("unrecorded".to_owned(), |d| format!("{d:?}"));
    ///     println!("{} stale={} (its stalled_after: {own})", w.name, w.stale);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn workers_stale_after(&self, stale_after: Duration) -> Result<Vec<WorkerInfo>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "listing workers",
            store::WORKER_LIST,
            &[&millis(stale_after)],
        )?;
        Ok(rows
            .iter()
            .map(|r| {
                let age = secs(r.get(8)).unwrap_or(Duration::ZERO);
                WorkerInfo {
                    id: r.get(0),
                    name: r.get(1),
                    host: r.get(2),
                    pid: r.get(3),
                    queues: r.get(4),
                    concurrency: r.get(5),
                    started_at: r.get(6),
                    last_heartbeat: r.get(7),
                    heartbeat_age: age,
                    heartbeat_interval: ms(r.get(10)),
                    stalled_after: ms(r.get(11)),
                    tasks: r.get(12),
                    stale: r.get(13),
                    claimed: r.get::<_, i64>(9).max(0) as u64,
                    running: r.get::<_, i64>(14).max(0) as u64,
                }
            })
            .collect())
    }

    /// Running jobs whose worker's lease has ended (its last heartbeat is older than its own
    /// `stalled_after`, and than `stalled_after` here when that is longer: this threshold
    /// lengthens leases, never shortens them; `Duration::ZERO`: each worker's own), or whose
    /// worker row is gone. A live worker rescues them on its own.
    pub fn stalled_jobs(&self, stalled_after: Duration) -> Result<Vec<JobInfo>> {
        let mut conn = self.conn()?;
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM postpone_jobs j WHERE {STALLED_CONDITION} ORDER BY j.id"
        );
        let rows = conn.query_named("listing stalled jobs", &sql, &[&millis(stalled_after)])?;
        rows.iter().map(job_from_row).collect()
    }

    /// Puts the stalled jobs (see [`stalled_jobs`](Self::stalled_jobs)) back to `todo`
    /// through `postpone_requeue`, the way a worker's rescue does: due at once, keeping
    /// their scheduled time, the reason recorded in their errors, their attempt still
    /// counted; a job whose abort was requested ends `aborted`, one whose queueing lock has
    /// a waiting job ends `cancelled` (superseded). Wakes the workers of their queues. With
    /// `dry_run`, only counts them.
    pub fn requeue_stalled(&self, stalled_after: Duration, dry_run: bool) -> Result<StalledReport> {
        self.fix_stalled(stalled_after, StalledFix::Requeue, dry_run)
    }

    /// Ends the stalled jobs as `failed`, recording why in their errors. With `dry_run`,
    /// only counts them.
    pub fn fail_stalled(&self, stalled_after: Duration, dry_run: bool) -> Result<StalledReport> {
        self.fix_stalled(stalled_after, StalledFix::Fail, dry_run)
    }

    fn fix_stalled(
        &self,
        after: Duration,
        fix: StalledFix,
        dry_run: bool,
    ) -> Result<StalledReport> {
        let mut conn = self.conn()?;
        let ms = millis(after);
        if dry_run {
            let sql = format!("SELECT count(*) FROM postpone_jobs j WHERE {STALLED_CONDITION}");
            let rows = conn.query_named("counting stalled jobs", &sql, &[&ms])?;
            let n = rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64);
            return Ok(StalledReport {
                dry_run,
                jobs: n,
                workers: 0,
            });
        }
        let sql = match fix {
            // The one way back to todo (schema 2), fenced on the worker and attempt seen
            // here: a job whose abort was requested ends aborted; one whose queueing lock
            // has a waiting job meanwhile ends cancelled (superseded).
            StalledFix::Requeue => format!(
                "WITH s AS (
    SELECT coalesce(array_agg(j.id ORDER BY j.id), '{{}}') AS ids,
           coalesce(array_agg(j.worker_id ORDER BY j.id), '{{}}') AS workers,
           coalesce(array_agg(j.attempts ORDER BY j.id), '{{}}') AS attempts,
           coalesce(array_agg(format('requeued by an operator: its worker (id %s) was silent or gone',
                                     j.worker_id) ORDER BY j.id), '{{}}') AS notes
      FROM postpone_jobs j
     WHERE {STALLED_CONDITION}
)
SELECT count(*), 0::bigint
  FROM s, postpone_requeue(s.ids, s.workers, s.attempts, '{{}}', s.notes, '{{}}') r"
            ),
            StalledFix::Fail => format!(
                "WITH s AS (
    UPDATE postpone_jobs j
       SET status = 'failed', finished_at = now(),
           errors = coalesce(CASE WHEN jsonb_typeof(j.errors) = 'array' THEN j.errors END,
                             '[]'::jsonb)
                    || jsonb_build_array(jsonb_build_object(
                         'attempt', j.attempts, 'at', now(),
                         'error', format('failed by an operator: its worker (id %s) was silent or gone',
                                         j.worker_id)))
     WHERE {STALLED_CONDITION}
    RETURNING j.id
)
SELECT count(*), 0::bigint FROM s"
            ),
        };
        let rows = conn.query_named("changing stalled jobs", &sql, &[&ms])?;
        let n = rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64);
        log::info!("{n} stalled job(s) {fix:?} by the admin API");
        Ok(StalledReport {
            dry_run,
            jobs: n,
            workers: 0,
        })
    }

    /// Deletes the rows of workers whose lease has ended (lengthened to `stale_after` when
    /// that is longer, as for [`stalled_jobs`](Self::stalled_jobs)). Jobs they still hold
    /// stay stalled (requeue or fail them, or let a live worker rescue them); a
    /// worker that was only cut off registers again when it comes back. With `dry_run`,
    /// only counts them.
    pub fn forget_workers(&self, stale_after: Duration, dry_run: bool) -> Result<StalledReport> {
        let mut conn = self.conn()?;
        let ms = millis(stale_after);
        let sql = if dry_run {
            store::WORKER_STALE_COUNT
        } else {
            store::WORKER_STALE_DELETE
        };
        let rows = conn.query_named("forgetting dead workers", sql, &[&ms])?;
        let n = rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64);
        if !dry_run {
            log::info!("{n} dead worker(s) forgotten by the admin API");
        }
        Ok(StalledReport {
            dry_run,
            jobs: 0,
            workers: n,
        })
    }
}
