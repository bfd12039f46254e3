//! Keeping the claim cheap: the `postpone-vacuum` thread vacuums `postpone_jobs` when the
//! dead rows left behind by claims, outcomes and deletions pile up.
//!
//! Every claim moves jobs out of the pending index; their entries stay in it, dead, until
//! the table is vacuumed, and each claim walks over them before it reaches a live job. On
//! this project's machine a claim of 64 jobs took 0.1 ms on a vacuumed table and 15 ms
//! after 300,000 jobs had been claimed since the last vacuum. Autovacuum removes them where
//! the server runs it (migration 3 asks for a visit after every 1,000 dead rows), but it is
//! sometimes off, and it visits a database at most once per `autovacuum_naptime` (a minute
//! by default), during which a busy queue leaves hundreds of thousands of dead entries.
//!
//! So the completer, at most once per [`Vacuum::check_every`], reads the table's counters
//! from `pg_stat_user_tables` (one short query on its own connection) and, past the
//! threshold, wakes this thread. The thread opens a connection of its own in the worker's
//! watchdog group, reads the counters again, runs
//! `VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) postpone_jobs` (with `ANALYZE` when the table's
//! statistics are missing or stale), and closes the connection: a worker holds it only while
//! it vacuums. `SKIP_LOCKED` makes a vacuum already under way (another worker's, or
//! autovacuum's) a reason to skip, so the workers of a cluster do not queue up behind one
//! another. A role that does not own the table cannot vacuum it: the thread says so once,
//! and stops asking.

use std::fmt;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};

use super::link::Link;
use super::Shared;
use crate::conn::Connection;
use crate::error::Result;
use crate::store;

/// When a worker vacuums the jobs table; see [`WorkerBuilder::vacuum`](super::WorkerBuilder::vacuum).
///
/// The default checks the table's counters every 5 s and vacuums once its dead rows reach
/// 20,000 and 2% of its live rows: with a million finished jobs kept, that is every 20,000
/// claims, and each vacuum reads the primary key and the finished-jobs index once.
///
/// ```
/// use postpone::Vacuum;
/// use std::time::Duration;
///
/// let v = Vacuum::default().dead_rows(50_000).check_every(Duration::from_secs(30));
/// let off = Vacuum::off(); // autovacuum (or an operator) keeps the table clean
/// # let _ = (v, off);
/// ```
#[derive(Clone, PartialEq)]
pub struct Vacuum {
    pub(crate) enabled: bool,
    pub(crate) every: Duration,
    pub(crate) dead_rows: i64,
    pub(crate) fraction: f64,
    pub(crate) timeout: Duration,
}

impl Default for Vacuum {
    fn default() -> Self {
        Vacuum {
            enabled: true,
            every: Duration::from_secs(5),
            dead_rows: 20_000,
            fraction: 0.02,
            timeout: Duration::from_secs(600),
        }
    }
}

impl fmt::Debug for Vacuum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.enabled {
            return f.write_str("Vacuum(off)");
        }
        f.debug_struct("Vacuum")
            .field("check_every", &self.every)
            .field("dead_rows", &self.dead_rows)
            .field("live_fraction", &self.fraction)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Vacuum {
    /// Never vacuums: for a server whose autovacuum is tuned for the table, or a role that
    /// does not own it.
    pub fn off() -> Self {
        Vacuum {
            enabled: false,
            ..Vacuum::default()
        }
    }

    /// How often a busy worker reads the table's counters. Defaults to 5 s; at least 100 ms.
    pub fn check_every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(100));
        self
    }

    /// Vacuums once the table holds at least this many dead rows (and the live fraction
    /// below). Defaults to 20,000.
    pub fn dead_rows(mut self, n: u64) -> Self {
        self.dead_rows = i64::try_from(n).unwrap_or(i64::MAX);
        self
    }

    /// ...and at least this fraction of its live rows (0 to 1; defaults to 0.02), so that a
    /// table keeping millions of finished jobs is not read in full every few seconds.
    pub fn live_fraction(mut self, fraction: f64) -> Self {
        self.fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.02
        };
        self
    }

    /// The longest a vacuum may run before it is cancelled (it then starts over at the next
    /// check). Defaults to 10 minutes.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_secs(1));
        self
    }
}

/// The table's counters, as `pg_stat_user_tables` has them.
#[derive(Debug)]
struct Counters {
    dead: i64,
    live: i64,
    /// Rows changed since the last analyze; `None` when it was never analyzed.
    since_analyze: Option<i64>,
}

fn counters(conn: &mut Connection) -> Result<Option<Counters>> {
    Ok(conn
        .query_opt(store::VACUUM_COUNTERS, &[])?
        .map(|r| Counters {
            dead: r.get(0),
            live: r.get(1),
            since_analyze: r.get(2),
        }))
}

impl Vacuum {
    fn wants_vacuum(&self, c: &Counters) -> bool {
        c.dead >= self.dead_rows && c.dead as f64 >= self.fraction * c.live as f64
    }

    fn wants_analyze(&self, c: &Counters) -> bool {
        // Never analyzed: every row counts as changed (a small table is not worth it).
        let changed = c.since_analyze.unwrap_or(c.live + c.dead);
        changed >= self.dead_rows && changed as f64 >= 0.1 * c.live as f64
    }
}

/// The completer's side: at most once per `check_every`, reads the counters on the
/// connection the completer records on and wakes the vacuum thread when they pass the threshold.
#[derive(Debug)]
pub(crate) struct Check {
    next: Instant,
}

impl Check {
    pub(crate) fn new(v: &Vacuum) -> Check {
        Check {
            next: Instant::now() + v.every,
        }
    }

    /// Whether [`after_record`](Self::after_record) would read the counters now.
    pub(crate) fn due(&self, shared: &Shared) -> bool {
        let v = &shared.opts.vacuum;
        v.enabled && Instant::now() >= self.next && !shared.vacuum.disabled()
    }

    /// Errors are the caller's to judge like any other round-trip's.
    pub(crate) fn after_record(&mut self, shared: &Shared, conn: &mut Connection) -> Result<()> {
        let v = &shared.opts.vacuum;
        if !v.enabled || Instant::now() < self.next || shared.vacuum.disabled() {
            return Ok(());
        }
        self.next = Instant::now() + v.every;
        if let Some(c) = counters(conn)? {
            if v.wants_vacuum(&c) || v.wants_analyze(&c) {
                let _ = shared.vacuum.wake.0.try_send(());
            }
        }
        Ok(())
    }
}

/// What the worker's threads share about vacuuming.
#[derive(Debug)]
pub(crate) struct VacuumState {
    pub(crate) wake: (crossbeam_channel::Sender<()>, Receiver<()>),
    /// The role cannot vacuum the table: stop asking.
    refused: std::sync::atomic::AtomicBool,
    pub(crate) runs: std::sync::atomic::AtomicU64,
}

impl VacuumState {
    pub(crate) fn new() -> VacuumState {
        VacuumState {
            wake: crossbeam_channel::bounded(1),
            refused: std::sync::atomic::AtomicBool::new(false),
            runs: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn disabled(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The `postpone-vacuum` thread: waits for a wake-up, vacuums, closes its connection.
pub(crate) fn run(shared: &Shared, stop: &Receiver<()>) {
    let v = shared.opts.vacuum.clone();
    let wake = shared.vacuum.wake.1.clone();
    loop {
        select! {
            recv(stop) -> _ => return,
            recv(wake) -> _ => {}
        }
        let mut link = Link::new(shared, "vacuuming postpone_jobs");
        loop {
            if shared.stopping() {
                return;
            }
            let res = match link.get() {
                Ok((c, ())) => {
                    let res = vacuum_once(shared, c, &v);
                    link.judge(res)
                }
                Err(wait) => Err(wait),
            };
            match res {
                Ok(()) => break,
                Err(wait) => {
                    if super::sleep_or_stop(stop, wait) {
                        return;
                    }
                }
            }
        }
        // Closes the connection: it is only held while vacuuming.
        drop(link);
        if shared.vacuum.disabled() {
            return;
        }
    }
}

fn vacuum_once(shared: &Shared, conn: &mut Connection, v: &Vacuum) -> Result<()> {
    let owner: bool = conn.query_one(store::JOBS_TABLE_OWNED, &[])?.get(0);
    if !owner {
        log::info!(
            "worker {}: not vacuuming postpone_jobs: role {} does not own it (let autovacuum keep it, or give the worker `Vacuum::off()`)",
            shared.name,
            conn.query_one(store::CURRENT_ROLE, &[])?
                .get::<_, String>(0)
        );
        shared
            .vacuum
            .refused
            .store(true, std::sync::atomic::Ordering::Relaxed);
        return Ok(());
    }
    let Some(c) = counters(conn)? else {
        return Ok(());
    };
    let (vacuum, analyze) = (v.wants_vacuum(&c), v.wants_analyze(&c));
    if !vacuum && !analyze {
        return Ok(());
    }
    let sql = if analyze {
        "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, ANALYZE) postpone_jobs"
    } else {
        "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) postpone_jobs"
    };
    let started = Instant::now();
    conn.set_io_timeout(v.timeout);
    conn.batch_execute(sql)?;
    shared
        .vacuum
        .runs
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    log::debug!(
        "worker {}: vacuumed postpone_jobs ({} dead rows, {} live{}) in {} ms",
        shared.name,
        c.dead,
        c.live,
        if analyze { ", with analyze" } else { "" },
        started.elapsed().as_millis()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_needs_both_the_count_and_the_fraction() {
        let v = Vacuum::default();
        let c = |dead, live| Counters {
            dead,
            live,
            since_analyze: Some(0),
        };
        assert!(!v.wants_vacuum(&c(19_999, 0)));
        assert!(v.wants_vacuum(&c(20_000, 0)));
        assert!(v.wants_vacuum(&c(20_000, 1_000_000)));
        assert!(!v.wants_vacuum(&c(20_000, 1_000_001)));
        assert!(v.wants_vacuum(&c(100_000, 5_000_000)));
        let never = |live| Counters {
            dead: 0,
            live,
            since_analyze: None,
        };
        assert!(v.wants_analyze(&never(50_000)), "a table never analyzed is");
        assert!(!v.wants_analyze(&never(100)), "unless it is small");
        assert!(!v.wants_analyze(&c(0, 0)));
    }

    #[test]
    fn settings_are_kept_in_range() {
        let v = Vacuum::default()
            .live_fraction(f64::NAN)
            .check_every(Duration::ZERO)
            .timeout(Duration::ZERO);
        assert_eq!(v.fraction, 0.02);
        assert_eq!(v.every, Duration::from_millis(100));
        assert_eq!(v.timeout, Duration::from_secs(1));
        assert_eq!(Vacuum::default().live_fraction(7.0).fraction, 1.0);
        assert_eq!(format!("{:?}", Vacuum::off()), "Vacuum(off)");
    }
}
