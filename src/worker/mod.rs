//! Workers: OS threads that claim jobs from PostgreSQL and run them.
//!
//! A worker is a set of named threads, each with one job and, where it talks to the
//! database, its own deadline-bounded connection registered in the worker's watchdog group:
//!
//! - `postpone-fetch` claims due jobs in batches (as many as there are free slots) and hands
//!   them to the executors through a board that wakes one sleeping executor at a time;
//!   when it has nothing to claim (or no room) while outcomes wait behind the completer's
//!   batch, it records a batch of them itself; when its claims have found nothing for the
//!   App's `pool_idle_timeout`, it closes its connection and sleeps, and the beat thread
//!   claims in its stead until there is work again (`dormant.rs`);
//! - `postpone-exec-N` (`concurrency` of them) run tasks under `catch_unwind`; they never
//!   touch the database themselves;
//! - `postpone-complete` records outcomes in batches, retrying on a fresh connection until
//!   they are stored;
//! - `postpone-beat` refreshes the heartbeat, rescues the jobs of stalled workers, gives
//!   back jobs of claims whose reply was lost, polls abort requests, and raises task
//!   timeouts; it keeps beating through a shutdown's graceful wait; it LISTENs for new jobs
//!   and abort requests on the same connection, so an idle worker holds that one alone;
//! - `postpone-listen`, only with `listen_via`, LISTENs on a connection of its own where
//!   that App says;
//! - `postpone-periodic` defers each scheduled instant (of the code's schedules and of those
//!   stored for the worker's tasks) once across all workers, and prunes finished jobs; it
//!   holds a connection only while it has a schedule to follow or a retention;
//! - `postpone-vacuum` (unless [`Vacuum::off`]) vacuums the jobs table when the completer
//!   finds its dead rows past the threshold, on a connection it holds only meanwhile.
//!
//! No thread ever ends on a database error: it logs, backs off, reconnects and goes on.
//! [`WorkerBuilder::spawn`] starts them (see `builder.rs`); [`WorkerHandle::shutdown`] stops
//! them all within its timeout (see `shutdown.rs`). This file holds what the threads share.

mod backoff;
mod backtrace;
mod beat;
mod board;
mod builder;
mod claim;
mod complete;
mod dormant;
mod due;
mod exec;
mod fetch;
mod handoff;
mod idhash;
mod ledger;
mod link;
mod listen;
mod locked;
mod observe;
mod outcome;
mod periodic;
mod record;
mod refused;
mod ride;
mod share;
mod shutdown;
mod split;
mod vacuum;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::app::App;
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::job::{JobId, RawJson};
use crate::task::{Registered, Tasks};

pub use builder::WorkerBuilder;
pub use exec::{JobEvent, JobEventKind, JobHook};
pub use shutdown::ShutdownReport;
pub use vacuum::Vacuum;

use builder::{Identity, WorkerOptions};
use ledger::{AttemptKey, Ledger};
pub(crate) use outcome::{Outcome, OutcomeKind};
#[cfg(feature = "test-util")]
pub(crate) use record::{write as write_outcomes, Fence};

/// What happens to a job's row once it has finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeleteJobs {
    /// Keep every finished job (prune them later with retention). The default.
    Never,
    /// Delete jobs that succeeded; keep failed, cancelled and aborted ones.
    Successful,
    /// Delete every job once it has finished, whatever its outcome.
    Always,
}

/// Entry point to start workers: [`Worker::builder`] takes the App and the tasks, and
/// [`WorkerBuilder::spawn`] starts the threads.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// use std::time::Duration;
/// use postpone::{App, Job, TaskError, Tasks, Worker};
///
/// let app = App::connect("postgres://postgres@127.0.0.1/app")?;
/// let mut tasks = Tasks::new();
/// tasks.register("send_email", |job: &Job| -> Result<(), TaskError> {
///     let to: String = job.args()?;
///     println!("mail to {to}");
///     Ok(())
/// });
/// let handle = Worker::builder(&app, tasks)
///     .concurrency(4)
///     .queues(["emails"])
///     .spawn()?; // fails at once, saying why, on a bad setting or an outdated schema
/// // ... run until the process is asked to stop, then:
/// let report = handle.shutdown(Duration::from_secs(10));
/// assert!(report.is_clean(), "{report}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Worker;

impl Worker {
    /// Starts configuring a worker that runs `tasks` on `app`'s database.
    pub fn builder(app: &App, tasks: Tasks) -> WorkerBuilder {
        WorkerBuilder::new(app, tasks)
    }
}

/// A job claimed by the fetcher, on its way to an executor.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) id: JobId,
    pub(crate) queue: String,
    pub(crate) task: String,
    pub(crate) args: RawJson,
    pub(crate) attempts: i32,
    pub(crate) priority: i32,
    pub(crate) lock: Option<String>,
    pub(crate) abort_requested: bool,
    /// The worker identity that claimed it: with `id` and `attempts`, the attempt's fence.
    pub(crate) worker: i64,
    /// Its own attempt limit, given when it was deferred (overrides the task's strategy).
    pub(crate) max_attempts: Option<i32>,
    /// Held by the claim (the table shows it waiting until its start is written), rather
    /// than started by it (a queue with limits).
    pub(crate) held: bool,
    /// When the claim that brought it was sent.
    pub(crate) claimed: Instant,
    /// How long it had waited when claimed (seconds; `None` for a job due at an infinite
    /// time).
    pub(crate) queue_wait: Option<f64>,
    /// Its deadline (schema version 25), by this process's clock: the claim's send time
    /// plus what was left of it at the claim's `now()`, so never later than the database's.
    pub(crate) expires: Option<Instant>,
    /// Only locked by the claim, in the fetcher's open transaction (`locked.rs`): the table
    /// shows it waiting until that transaction writes it, with its outcome or as running.
    pub(crate) locked: bool,
}

impl Claimed {
    pub(crate) fn key(&self) -> AttemptKey {
        AttemptKey {
            id: self.id,
            worker: self.worker,
            attempt: self.attempts,
        }
    }

    /// What the ledger notes of it.
    pub(crate) fn hold(&self) -> ledger::Hold {
        ledger::Hold {
            key: self.key(),
            queue: Arc::from(self.queue.as_str()),
            held: self.held || self.locked,
            locked: self.locked,
            claimed: self.claimed,
            expires: self.expires,
        }
    }
}

/// Counters, for the handle's [`WorkerStats`].
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) claims: AtomicU64,
    pub(crate) claimed: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) aborted: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) interrupted: AtomicU64,
    pub(crate) snoozed: AtomicU64,
    pub(crate) rode: AtomicU64,
    /// Claims sent in two halves on two connections (`split.rs`).
    pub(crate) split: AtomicU64,
    /// Jobs written once, with their outcome (`locked.rs`).
    pub(crate) once: AtomicU64,
    /// Lock-only claims' transactions lost, their jobs written again (`locked.rs`).
    pub(crate) lost: AtomicU64,
    /// Outcomes the fetcher recorded for a completer that was behind (`fetch.rs`, `Helper`).
    pub(crate) helped: AtomicU64,
    pub(crate) recorded: AtomicU64,
    pub(crate) db_errors: AtomicU64,
    pub(crate) reconnects: AtomicU64,
}

/// Everything the worker's threads share.
/// Most notifications a worker's listening connection (the beat's, or a dedicated
/// listener's: `listen.rs`) acts on at a time. Any role that can connect can NOTIFY, and
/// the server sends a listening session every notification before the answer to its next
/// statement: a flood (millions a second) held the heartbeat and the recording of outcomes,
/// on the same connection, behind it, for as long as it lasted (the lease ran out). More
/// than this many at once is a flood: the listener drops the connection, with what it had not
/// read yet, and listens again on a fresh one after [`FLOOD_MUTE`]; the fetcher polls
/// meanwhile, and aborts and pauses are read from the table anyway (notifications are hints).
pub(crate) const HEAR_AT_MOST: usize = 10_000;
/// How long a worker does not listen after a flood of notifications.
pub(crate) const FLOOD_MUTE: Duration = Duration::from_secs(5);
pub(crate) struct Shared {
    pub(crate) app: App,
    pub(crate) tasks: HashMap<String, Arc<Registered>>,
    pub(crate) opts: WorkerOptions,
    pub(crate) group: u64,
    pub(crate) name: String,
    pub(crate) identity: Identity,
    /// Average run time of a job, for the adaptive prefetch.
    pub(crate) job_duration: fetch::Ewma,
    /// Average run time of each task's jobs: when a running job is likely to end.
    pub(crate) task_time: HashMap<String, fetch::Ewma>,
    pub(crate) stopping: AtomicBool,
    /// The attempts this worker holds, from the claim's reply until their outcome is
    /// recorded, and whether each may start. Any other `doing` job of this worker was
    /// claimed by a statement whose reply was lost: the beat thread gives it back.
    pub(crate) ledger: Ledger,
    /// Claimed jobs on their way from the fetcher to the executors, the fetcher's wait for
    /// room, and the executor threads alive (`handoff.rs`).
    pub(crate) handoff: handoff::Handoff,
    /// Wakes the beat thread: a notification asked it to read abort requests now.
    pub(crate) beat_wake: (Sender<()>, Receiver<()>),
    /// Outcomes the completer could not record before it stopped.
    pub(crate) unrecorded: Mutex<Vec<Outcome>>,
    /// Wakes the listener out of its notification wait at shutdown.
    pub(crate) listen_wake: Arc<tokio::sync::Notify>,
    pub(crate) hook: Option<Arc<dyn JobHook>>,
    pub(crate) stats: Stats,
    pub(crate) vacuum: vacuum::VacuumState,
    /// When the next scheduled job is due, for the fetcher's idle wait.
    pub(crate) due: due::Due,
    /// Final outcomes waiting for the next claim to record them.
    pub(crate) ride: ride::Ride,
    /// The outcomes of jobs the fetcher's open transaction locked, kept for it (`locked.rs`).
    pub(crate) absorb: Arc<locked::Absorb>,
    /// Wakes the completer: a start is due to be written (see `ledger.rs`).
    pub(crate) starts_due: (Sender<()>, Receiver<()>),
    /// Until when the fetcher holds no job for a thread that is only expected to be free
    /// soon: a held job had to be given back, so that guess was wrong.
    pub(crate) quiet_until: Mutex<Option<Instant>>,
    /// The episode of refused connections under way, if any: logged once per episode.
    pub(crate) refusals: refused::Refusals,
    /// What the beat thread last saw of the stored schedules, and the wake-up it sends the
    /// periodic thread when that changes (`periodic.rs`).
    pub(crate) schedules: periodic::Watch,
    /// Whether the fetcher sleeps and the beat claims in its stead (`dormant.rs`).
    pub(crate) dormancy: dormant::Dormancy,
    /// The worker's lasting connection, which the beat and the completer take in turns
    /// (`link.rs`).
    pub(crate) shelf: link::Shelf,
}

impl Shared {
    pub(crate) fn id(&self) -> i64 {
        self.ledger.worker()
    }

    /// The typical run time of `task`'s jobs (1 s until one ran).
    pub(crate) fn typical_time(&self, task: &str) -> Duration {
        self.task_time
            .get(task)
            .map_or(Duration::from_secs(1), fetch::Ewma::get)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Wakes the beat thread: on its channel, and out of its wait for notifications when it
    /// listens itself.
    pub(crate) fn wake_beat(&self) {
        let _ = self.beat_wake.0.try_send(());
        self.listen_wake.notify_one();
    }

    /// News of a job (a notification, or a listener that may have missed some): wakes the
    /// fetcher, and has the beat claim at once while the fetcher sleeps (`dormant.rs`). The
    /// fetcher's channel is told first, so that a fetcher falling asleep meanwhile sees it.
    pub(crate) fn news(&self, wake: &Sender<()>) {
        let _ = wake.try_send(());
        if self.dormancy.is_dormant() {
            self.dormancy.ask();
            self.wake_beat();
        }
    }

    /// Opens a connection in the worker's group, bounded by `connect_timeout`.
    pub(crate) fn connect(&self) -> Result<Connection> {
        let conn = Connection::open(
            &self.app.inner.opts,
            &self.app.inner.watchdog,
            self.group,
            None,
        )?;
        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
        crate::metrics::reconnect();
        self.connected();
        Ok(conn)
    }

    /// A connection succeeded: ends an episode of refusals, if one was under way.
    fn connected(&self) {
        if let Some((n, over)) = self.refusals.accepted(Instant::now()) {
            log::info!(
                "worker {}: the server accepts connections again ({n} attempt(s) refused over {})",
                self.name,
                crate::error::fmt_duration(over)
            );
        }
    }

    /// Opens the listener's connection: like [`connect`](Self::connect), to where
    /// `listen_via` says when it was given.
    pub(crate) fn connect_listener(&self) -> Result<Connection> {
        let opts = self
            .opts
            .listen_opts
            .as_ref()
            .unwrap_or(&self.app.inner.opts);
        let conn = Connection::open(opts, &self.app.inner.watchdog, self.group, None)?;
        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
        self.connected();
        Ok(conn)
    }

    /// Logs a database error of a worker thread, once per failure streak at warn level.
    pub(crate) fn log_db_error(&self, what: &str, e: &Error, failures: u32) {
        self.stats.db_errors.fetch_add(1, Ordering::Relaxed);
        if e.is_refusal() {
            // One warning per episode for the whole worker, whichever thread meets it.
            if self.refusals.refused(Instant::now()) {
                log::warn!(
                    "worker {}: {what}: {e}; every thread of the worker retries with backoff \
                     and jitter (logged again when a connection succeeds)",
                    self.name
                );
            } else {
                log::debug!("worker {}: {what}: {e} (failure {failures})", self.name);
            }
            return;
        }
        if failures <= 1 || failures.is_power_of_two() {
            log::warn!(
                "worker {}: {what}: {e} (failure {failures} in a row; retrying)",
                self.name
            );
        } else {
            log::debug!("worker {}: {what}: {e} (failure {failures})", self.name);
        }
    }
}

/// Sleeps `wait` unless `stop` fires first; returns true if it did.
pub(crate) fn sleep_or_stop(stop: &Receiver<()>, wait: Duration) -> bool {
    matches!(
        stop.recv_timeout(wait),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) | Ok(())
    )
}

/// Which part of the worker a thread is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Fetch,
    Exec,
    Complete,
    Listen,
    Beat,
    Periodic,
    Vacuum,
}

/// Tells the handle, from inside the thread, that the thread is ending (even on panic).
pub(super) struct ExitGuard {
    pub(super) tx: Sender<usize>,
    pub(super) index: usize,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(self.index);
    }
}

pub(crate) struct ThreadSlot {
    pub(crate) name: String,
    pub(crate) role: Role,
    pub(crate) handle: Option<JoinHandle<()>>,
    pub(crate) exited: bool,
}

pub(crate) struct Running {
    pub(crate) shared: Arc<Shared>,
    pub(crate) threads: Vec<ThreadSlot>,
    pub(crate) stop_tx: Option<Sender<()>>,
    pub(crate) hard_tx: Option<Sender<()>>,
    pub(crate) exit_rx: Receiver<usize>,
    /// Outcomes the completer had not taken when it stopped: the shutdown records them.
    pub(crate) outcome_rx: Receiver<Outcome>,
}

/// Counters of a running worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Claim statements sent (round-trips, whatever they brought).
    pub claims: u64,
    /// Jobs claimed.
    pub claimed: u64,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs that failed for good.
    pub failed: u64,
    /// Failed attempts that were scheduled for a retry.
    pub retried: u64,
    /// Jobs cancelled by their task.
    pub cancelled: u64,
    /// Jobs aborted on request.
    pub aborted: u64,
    /// Jobs this worker ended as expired ([`NewJob::expires_at`](crate::NewJob::expires_at)):
    /// held past their deadline without starting, retried or snoozed past it, or ended
    /// waiting by its sweep of expired jobs.
    pub expired: u64,
    /// Outcomes recorded in the database.
    pub recorded: u64,
    /// Database errors met by the worker's threads (each was retried).
    pub db_errors: u64,
    /// Connections opened by the worker's threads.
    pub connections_opened: u64,
    /// Jobs snoozed by their task ([`TaskError::snooze`](crate::TaskError::snooze)).
    pub snoozed: u64,
    /// Vacuums of the jobs table this worker ran ([`Vacuum`]).
    pub vacuums: u64,
    /// Outcomes recorded in a claim's transaction rather than a commit of their own
    /// ([`WorkerBuilder::outcomes_ride_claims`]); counted in `recorded` too.
    pub outcomes_on_claims: u64,
    /// Outcomes the fetcher recorded on its own connection while the completer was behind
    /// (its batches waited behind the completer's, and the fetcher had nothing to claim or
    /// no room for more); counted in `recorded` too.
    pub outcomes_by_fetcher: u64,
    /// Claims of large jobs sent in two halves on two connections at once
    /// ([`WorkerBuilder::split_large_claims`]); each half counts in `claims` too.
    pub claims_split: u64,
    /// Jobs written once, their outcome in their claim's transaction
    /// ([`WorkerBuilder::claim_in_outcome_transaction`]); counted in `recorded` too.
    pub written_once: u64,
    /// Claims' transactions the server lost (or rolled back) while their jobs ran, whose
    /// jobs the worker then wrote again itself.
    pub claims_lost: u64,
}

/// The handle of a running worker: owns every thread it started.
///
/// Call [`shutdown`](Self::shutdown) to stop it; dropping the handle does the same with the
/// builder's `drop_timeout` (10 s by default) and logs the report. Dropped on a thread with
/// a tokio context (an async task, `#[tokio::main]`), the handle returns at once and the
/// shutdown runs on a thread of its own, which the process does not wait for: in an async
/// program, call `shutdown` (from `tokio::task::spawn_blocking`) before `main` returns.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/app")?;
/// # let tasks = postpone::Tasks::new();
/// use std::time::Duration;
///
/// let handle = postpone::Worker::builder(&app, tasks).spawn()?;
/// println!("{} claimed {} job(s)", handle.name(), handle.stats().claimed);
/// // Returns within the timeout, whatever the network does; jobs that did not finish go
/// // back to their queue.
/// let report = handle.shutdown(Duration::from_secs(10));
/// if !report.is_clean() {
///     eprintln!("threads stuck in task code: {:?}", report.abandoned_threads());
/// }
/// # Ok(())
/// # }
/// ```
pub struct WorkerHandle {
    pub(super) running: Option<Running>,
}

impl fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.running {
            Some(r) => f
                .debug_struct("WorkerHandle")
                .field("name", &r.shared.name)
                .field("id", &r.shared.id())
                .finish(),
            None => f.write_str("WorkerHandle(stopped)"),
        }
    }
}

impl WorkerHandle {
    /// Stops the worker and returns within `timeout` (plus a few milliseconds), whatever the
    /// database does: stops claiming, lets running jobs finish until the graceful deadline,
    /// then raises [`Job::should_abort`](crate::Job::should_abort), severs every socket the
    /// worker owns at the hard deadline and joins every thread that unwinds, then puts back
    /// the jobs that did not finish and deletes the worker row with the time left. Only a
    /// thread stuck in task code can outlive the call; the report names it.
    pub fn shutdown(mut self, timeout: Duration) -> ShutdownReport {
        let running = self.running.take().expect("a handle is shut down once");
        // A huge timeout means "very long", never an overflow (issue 17).
        shutdown::run(running, timeout.min(crate::conn::client::LONGEST))
    }

    /// The worker's id in `postpone_workers`.
    pub fn worker_id(&self) -> i64 {
        self.running.as_ref().map_or(0, |r| r.shared.id())
    }

    /// The worker's name.
    pub fn name(&self) -> &str {
        self.running.as_ref().map_or("", |r| r.shared.name.as_str())
    }

    /// Counters so far.
    pub fn stats(&self) -> WorkerStats {
        let Some(r) = &self.running else {
            return WorkerStats::default();
        };
        let s = &r.shared.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkerStats {
            claims: get(&s.claims),
            claimed: get(&s.claimed),
            succeeded: get(&s.succeeded),
            failed: get(&s.failed),
            retried: get(&s.retried),
            cancelled: get(&s.cancelled),
            aborted: get(&s.aborted),
            expired: get(&s.expired),
            recorded: get(&s.recorded),
            db_errors: get(&s.db_errors),
            connections_opened: get(&s.reconnects),
            snoozed: get(&s.snoozed),
            outcomes_on_claims: get(&s.rode),
            outcomes_by_fetcher: get(&s.helped),
            claims_split: get(&s.split),
            written_once: get(&s.once),
            claims_lost: get(&s.lost),
            vacuums: get(&r.shared.vacuum.runs),
        }
    }

    /// Sockets the worker's threads hold open right now.
    pub fn open_sockets(&self) -> usize {
        self.running.as_ref().map_or(0, |r| {
            r.shared.app.inner.watchdog.live(Some(r.shared.group))
        })
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        if !crate::conn::runtime::in_tokio_context() {
            return shut_down_dropped(running);
        }
        // A thread that may be driving an async runtime must not wait up to drop_timeout
        // here (its other tasks would stall): the shutdown runs on a thread of its own,
        // which nothing waits for.
        let slot = Arc::new(Mutex::new(Some(running)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("postpone-drop".into())
            .spawn(move || {
                let running = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(running) = running {
                    shut_down_dropped(running);
                }
            });
        if let Err(e) = spawned {
            log::warn!("dropping a worker inside an async runtime: no thread for its shutdown ({e}); shutting down on this one");
            let running = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(running) = running {
                shut_down_dropped(running);
            }
        }
    }
}

/// What dropping a handle does: a shutdown with the builder's `drop_timeout`, its report
/// logged.
fn shut_down_dropped(running: Running) {
    let timeout = running.shared.opts.drop_timeout;
    let name = running.shared.name.clone();
    let report = shutdown::run(running, timeout);
    if report.is_clean() {
        log::info!("worker {name} dropped without shutdown: {report}");
    } else {
        log::warn!("worker {name} dropped without shutdown: {report}");
    }
}
