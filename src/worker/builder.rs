//! Building a worker: its options, their checks, and `spawn`, which starts its threads.
//!
//! Owns [`WorkerBuilder`] (a consuming builder; the periodic and retention setters live in
//! `periodic.rs`, the riding one in `ride.rs`), the options it collects (`WorkerOptions`), and what the worker says about
//! itself in `postpone_workers` (`Identity`). `spawn` checks the options, opens the first
//! connection (the beat thread's, which LISTENs on it too unless `listen_via` gives the
//! listener a thread and a connection of its own), checks the schema, registers the worker
//! row, then starts the threads in a fixed order (beat, executors, completer, fetcher,
//! listener, periodic) and waits, bounded, for the first LISTEN.
//!
//! Fails with `Config` on invalid options or task registry, before anything starts; with the
//! error of the connection, schema check or registration when the database says no; and
//! when a thread cannot be spawned, after stopping the threads already started.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::ledger::Ledger;
use super::{
    beat, complete, exec, fetch, listen, periodic, DeleteJobs, ExitGuard, JobHook, Role, Running,
    Shared, Stats, ThreadSlot, WorkerHandle,
};
use crate::app::App;
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::store;
use crate::task::Tasks;

#[derive(Clone, Debug)]
pub(crate) struct WorkerOptions {
    pub(crate) concurrency: usize,
    pub(crate) prefetch: Option<usize>,
    /// Most bytes of arguments held in jobs claimed and not started (`prefetch_bytes`).
    pub(crate) prefetch_bytes: usize,
    pub(crate) queues: Option<Vec<String>>,
    pub(crate) name: Option<String>,
    pub(crate) poll_interval: Duration,
    pub(crate) listen: bool,
    pub(crate) delete: DeleteJobs,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) stalled_after: Duration,
    pub(crate) graceful: Option<Duration>,
    pub(crate) only_registered: bool,
    /// Final outcomes may ride on the next claim's transaction (`ride.rs`).
    pub(crate) ride_claims: bool,
    /// Claims of large jobs go in two halves on two connections (`split.rs`).
    pub(crate) split_claims: bool,
    /// Jobs are written once, with their outcome, in the claim's transaction (`locked.rs`).
    pub(crate) locked_claims: bool,
    pub(crate) backoff_cap: Duration,
    pub(crate) listen_ping_interval: Duration,
    pub(crate) drop_timeout: Duration,
    pub(crate) periodic: periodic::PeriodicSettings,
    /// Where the listener connects, when not where the worker's App does (`listen_via`).
    pub(crate) listen_opts: Option<std::sync::Arc<crate::conn::options::ConnectOptions>>,
    pub(crate) vacuum: super::Vacuum,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 1,
            prefetch: None,
            prefetch_bytes: super::fetch::MAX_PREFETCH_BYTES,
            queues: None,
            name: None,
            poll_interval: Duration::from_secs(1),
            listen: true,
            delete: DeleteJobs::Never,
            heartbeat_interval: Duration::from_secs(10),
            stalled_after: Duration::from_secs(30),
            graceful: None,
            only_registered: true,
            ride_claims: true,
            split_claims: true,
            locked_claims: false,
            backoff_cap: Duration::from_secs(5),
            listen_ping_interval: Duration::from_secs(5),
            drop_timeout: Duration::from_secs(10),
            periodic: periodic::PeriodicSettings::default(),
            listen_opts: None,
            vacuum: super::Vacuum::default(),
        }
    }
}

/// Configures and spawns a worker; from [`Worker::builder`](super::Worker::builder).
///
/// ```no_run
/// use std::time::Duration;
/// use postpone::{App, Job, TaskError, Tasks, Worker};
///
/// # fn main() -> postpone::Result<()> {
/// let app = App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let mut tasks = Tasks::new();
/// tasks.register("send_email", |job: &Job| -> Result<(), TaskError> {
///     let to: String = job.args()?;
///     println!("mail to {to}");
///     Ok(())
/// });
/// let handle = Worker::builder(&app, tasks)
///     .concurrency(4)
///     .queues(["emails"])
///     .spawn()?;
/// // ... later, e.g. on SIGTERM:
/// let report = handle.shutdown(Duration::from_secs(10));
/// assert!(report.is_clean());
/// # Ok(())
/// # }
/// ```
#[must_use = "call .spawn() to start the worker"]
pub struct WorkerBuilder {
    app: App,
    tasks: Tasks,
    pub(super) opts: WorkerOptions,
    hook: Option<Arc<dyn JobHook>>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("tasks", &self.tasks)
            .field("options", &self.opts)
            .finish()
    }
}

impl WorkerBuilder {
    /// A builder with every option at its default, for `Worker::builder`.
    pub(super) fn new(app: &App, tasks: Tasks) -> WorkerBuilder {
        WorkerBuilder {
            app: app.clone(),
            tasks,
            opts: WorkerOptions::default(),
            hook: None,
        }
    }

    /// Threads that run jobs. Defaults to 1.
    pub fn concurrency(mut self, threads: usize) -> Self {
        self.opts.concurrency = threads;
        self
    }

    /// Jobs claimed ahead of free threads, so a thread that finishes finds its next job
    /// waiting instead of waiting for a claim. They are held by this worker (status `doing`)
    /// and given back untouched at shutdown. Defaults to adaptive: enough to keep every thread
    /// busy for two claim round-trips at the measured job duration (at least 1, at most 4,096,
    /// and fewer when the jobs claimed so far had large arguments), so fast jobs are claimed
    /// in large batches and slow ones are not hoarded. A number here fixes it; 0 disables it.
    /// Whatever the number, the jobs held are also bounded in bytes
    /// ([`prefetch_bytes`](Self::prefetch_bytes)).
    pub fn prefetch(mut self, jobs: usize) -> Self {
        self.opts.prefetch = Some(jobs);
        self
    }

    /// Most bytes of arguments (as JSON text) the worker holds in jobs it has claimed and
    /// not started, beside those of its running jobs. The database decides it at each claim:
    /// the claim returns jobs, in order, while their arguments fit in what is left of this
    /// budget, and leaves the others waiting for any worker; a job larger than the whole
    /// budget is claimed alone, when the worker holds no other. (Jobs of a queue with a
    /// concurrency, rate or key limit are started by their claim, at most one per free
    /// thread, and count as running.) Defaults to 64 MiB; at least 1.
    pub fn prefetch_bytes(mut self, bytes: usize) -> Self {
        self.opts.prefetch_bytes = bytes.max(1);
        self
    }

    /// Only claim jobs of these queues. Defaults to every queue.
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.opts.queues = Some(queues.into_iter().map(Into::into).collect());
        self
    }

    /// The worker's name in the workers table and in logs. Defaults to `host-pid-N`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.opts.name = Some(name.into());
        self
    }

    /// How often an idle worker looks for due jobs without being woken (scheduled jobs,
    /// missed notifications). Defaults to 1 s.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.opts.poll_interval = interval;
        self
    }

    /// Whether to LISTEN for new jobs and abort requests (woken at once) rather than only
    /// polling. Defaults to true.
    pub fn listen(mut self, listen: bool) -> Self {
        self.opts.listen = listen;
        self
    }

    /// LISTEN through `app`'s connection settings rather than the worker's App: for a worker
    /// whose App goes through a transaction-pooling PgBouncer (`pooler_mode=transaction`),
    /// give an App that connects directly to the server (or through a session-mode pool), and
    /// new jobs and abort requests wake the worker at once instead of at the next poll. The
    /// listener then has a thread and a connection of its own (without it, the heartbeat's
    /// connection LISTENs). Defaults to the worker's App.
    pub fn listen_via(mut self, app: &App) -> Self {
        self.opts.listen_opts = Some(app.inner.opts.clone());
        self
    }

    /// When the worker vacuums `postpone_jobs`, so that claims do not slow down as the dead
    /// entries of claimed jobs pile up in the pending index. Defaults to
    /// [`Vacuum::default()`](super::Vacuum) (past 20,000 dead rows and 2% of the live ones,
    /// checked every 5 s); [`Vacuum::off()`](super::Vacuum::off) leaves it to autovacuum.
    pub fn vacuum(mut self, vacuum: super::Vacuum) -> Self {
        self.opts.vacuum = vacuum;
        self
    }

    /// What to do with finished jobs' rows. Defaults to [`DeleteJobs::Never`].
    pub fn delete_finished(mut self, policy: DeleteJobs) -> Self {
        self.opts.delete = policy;
        self
    }

    /// How often the worker refreshes its heartbeat. Defaults to 10 s.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.opts.heartbeat_interval = interval;
        self
    }

    /// This worker is presumed dead once its last heartbeat is older than this: any other
    /// worker then removes it and puts its running jobs back in the queue. The setting is
    /// recorded with the worker's row (its lease), and other workers judge it by this value,
    /// never by their own, so workers with different settings can share a database (and
    /// `postpone stalled --after` can only lengthen it). Must be longer than
    /// `heartbeat_interval` plus the App's `io_timeout`, and `heartbeat_interval` below three
    /// quarters of it: a worker starts jobs only while its last accepted heartbeat is younger
    /// than three quarters of `stalled_after` (its lease), so that no other worker can have
    /// presumed it dead. Defaults to 30 s.
    pub fn stalled_after(mut self, after: Duration) -> Self {
        self.opts.stalled_after = after;
        self
    }

    /// How long [`WorkerHandle::shutdown`] lets running jobs finish before
    /// [`Job::should_abort`](crate::Job::should_abort) turns true. One that does not fit in
    /// the shutdown timeout is clipped (with a warning) to the default, so that jobs still
    /// get time to act on `should_abort` before the sockets are severed. Defaults to most
    /// of the shutdown timeout (80% of what the cleanup reserve leaves).
    pub fn shutdown_graceful_timeout(mut self, timeout: Duration) -> Self {
        self.opts.graceful = Some(timeout);
        self
    }

    /// Claim only jobs whose task is registered here, leaving the others to workers that know
    /// them. Defaults to true: during a rolling deploy, jobs of a task only the new version
    /// registers wait for the new workers instead of being failed by the old ones, and
    /// workers with different task sets can share queues. The worker records its task names
    /// in its row, so a due job that no running worker knows is reported once it has waited
    /// [`DEFAULT_UNKNOWN_TASK_AFTER`](crate::DEFAULT_UNKNOWN_TASK_AFTER) (`Admin::stats`,
    /// `Admin::unknown_tasks`, `postpone stats`, the dashboard) rather than silently stuck.
    ///
    /// The claim skips jobs of other tasks (measured with 200 task names: see docs/guide.md,
    /// Deploying section); a long run of them at the head of the queue costs each claim a
    /// walk past them. With false, the worker claims every job and fails one whose task it
    /// does not know at once, with an error naming the task: only for a deployment where
    /// every worker registers every task, and never during a rolling deploy that adds one.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let mut tasks = postpone::Tasks::new();
    /// tasks.register("resize", |_job: &postpone::Job| Ok(()));
    /// // Jobs of tasks other than "resize" wait for a worker that registers them.
    /// let handle = postpone::Worker::builder(&app, tasks).spawn()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn only_registered_tasks(mut self, only: bool) -> Self {
        self.opts.only_registered = only;
        self
    }

    /// The longest wait between two reconnection attempts. Defaults to 5 s.
    pub fn reconnect_backoff_max(mut self, cap: Duration) -> Self {
        self.opts.backoff_cap = cap;
        self
    }

    /// How long the listener waits for a notification before pinging its link (a dead
    /// LISTEN connection delivers nothing, so silence proves nothing). Defaults to 5 s.
    pub fn listen_ping_interval(mut self, interval: Duration) -> Self {
        self.opts.listen_ping_interval = interval;
        self
    }

    /// The shutdown timeout used when a [`WorkerHandle`] is dropped without calling
    /// `shutdown`. Defaults to 10 s.
    pub fn drop_timeout(mut self, timeout: Duration) -> Self {
        self.opts.drop_timeout = timeout;
        self
    }

    /// Observes every job start and outcome (for metrics). Called on the executor thread:
    /// keep it quick, and never block in it.
    pub fn hook(mut self, hook: impl JobHook + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::Config, m));
        if let Some(p) = self.tasks.problems.first() {
            return bad(format!("invalid task registry: {p}"));
        }
        if self.tasks.map.is_empty() {
            return bad(
                "invalid worker: no task is registered (give its Tasks at least one, \
                 with Tasks::register(name, f) or Tasks::add(task))"
                    .into(),
            );
        }
        let o = &self.opts;
        if o.concurrency == 0 || o.concurrency > 1024 {
            return bad(format!(
                "invalid concurrency {}: use 1 to 1024 threads",
                o.concurrency
            ));
        }
        if let Some(q) = &o.queues {
            if q.is_empty() || q.iter().any(|q| q.trim().is_empty()) {
                return bad("invalid queues: give at least one non-empty queue name, or none to serve every queue".into());
            }
        }
        for (name, d) in [
            ("poll_interval", o.poll_interval),
            ("heartbeat_interval", o.heartbeat_interval),
            ("stalled_after", o.stalled_after),
            ("listen_ping_interval", o.listen_ping_interval),
            ("reconnect_backoff_max", o.backoff_cap),
        ] {
            if d.is_zero() {
                return bad(format!("invalid {name}: it must be longer than zero"));
            }
        }
        if o.stalled_after <= o.heartbeat_interval {
            return bad(format!(
                "invalid stalled_after ({:?}): it must be longer than heartbeat_interval ({:?}), or live workers would be declared dead",
                o.stalled_after, o.heartbeat_interval
            ));
        }
        periodic::validate(&self.tasks, o)
    }

    /// Registers the worker and starts its threads. Fails (without starting anything) on
    /// invalid options, when the database cannot be reached, or when the schema is missing
    /// or outdated.
    pub fn spawn(self) -> Result<WorkerHandle> {
        self.validate()?;
        let WorkerBuilder {
            app,
            tasks,
            opts,
            hook,
        } = self;
        let listener = opts.listen_opts.as_ref().unwrap_or(&app.inner.opts);
        if opts.listen && listener.routing.transaction_pooler {
            return Err(crate::conn::session_attrs::needs_session(
                "the worker's LISTEN for new jobs (give it a direct connection with \
                 .listen_via(&direct_app), or turn it off with .listen(false): the fetcher then \
                 polls every poll_interval)",
            ));
        }
        let margin = opts.heartbeat_interval + app.inner.opts.io_timeout;
        if opts.stalled_after <= margin {
            log::warn!(
                "stalled_after ({}) is not longer than heartbeat_interval + io_timeout ({}): a live worker whose heartbeat round-trip runs to its deadline could be presumed dead and its jobs run twice",
                crate::error::fmt_duration(opts.stalled_after),
                crate::error::fmt_duration(margin)
            );
        }
        let lease = beat::lease_span(opts.stalled_after);
        if opts.heartbeat_interval >= lease {
            log::warn!(
                "heartbeat_interval ({}) is not below three quarters of stalled_after ({}): the worker's lease on its jobs would lapse between heartbeats, and it starts no job while its lease has lapsed; lower heartbeat_interval or raise stalled_after",
                crate::error::fmt_duration(opts.heartbeat_interval),
                crate::error::fmt_duration(lease)
            );
        }
        let group = app.inner.watchdog.new_group();
        let name = opts.name.clone().unwrap_or_else(default_name);
        let mut conn = Connection::open(&app.inner.opts, &app.inner.watchdog, group, None)
            .map_err(|e| e.context(format_args!("starting worker {name}")))?;
        app.ensure_schema(&mut conn)
            .map_err(|e| e.context(format_args!("starting worker {name}")))?;
        let identity = Identity::new(&name, &opts, &tasks);
        let schedules = periodic::schedules(&tasks);
        let registered = std::time::Instant::now();
        let id: i64 = conn
            .query_one(
                store::WORKER_INSERT,
                &[
                    &identity.name,
                    &identity.host,
                    &identity.pid,
                    &identity.queues,
                    &identity.concurrency,
                    &identity.heartbeat_interval_ms,
                    &identity.stalled_after_ms,
                    &identity.tasks,
                ],
            )
            .map_err(|e| e.context(format_args!("registering worker {name}")))?
            .get(0);

        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let (hard_tx, hard_rx) = crossbeam_channel::bounded::<()>(0);
        // The worker never holds more attempts than this waiting or running, nor twice this
        // in all (the fetcher claims only into free slots, and an attempt counts until its
        // outcome is recorded, beyond `capacity` finished ones), so neither channel can be
        // full when something is sent.
        let capacity = opts.concurrency + opts.prefetch.unwrap_or(fetch::MAX_PREFETCH) + 1;
        let (outcome_tx, outcome_rx) = crossbeam_channel::bounded(2 * capacity);
        let handoff = super::handoff::Handoff::new(opts.concurrency, capacity);
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let (exit_tx, exit_rx) = crossbeam_channel::unbounded();
        let (listening_tx, listening_rx) = crossbeam_channel::bounded::<()>(1);
        let (periodic_tx, periodic_rx) = crossbeam_channel::bounded::<()>(1);

        let lease_until = registered + beat::lease_span(opts.stalled_after);
        let task_time = tasks
            .map
            .keys()
            .map(|t| (t.clone(), fetch::Ewma::guess(Duration::from_secs(1))))
            .collect();
        // The connection spawn opened becomes the worker's lasting one, which the beat and
        // the completer share (`link.rs`); it LISTENs unless listen_via gives the listener
        // a connection elsewhere (or listen(false)).
        let beat_listens = opts.listen && opts.listen_opts.is_none();
        let channel = app.namespace().channel().to_owned();
        let conn = match beat_listens.then(|| conn.listen(&channel)) {
            Some(Err(e)) => {
                // The first thread to need the connection opens another.
                log::warn!("worker {name}: listening for jobs: {e}; connecting again");
                None
            }
            _ => Some(conn),
        };
        let shelf = super::link::Shelf::new(beat_listens.then_some(channel), conn);
        let shared = Arc::new(Shared {
            app,
            task_time,
            tasks: tasks.map,
            opts,
            group,
            name: name.clone(),
            identity,
            job_duration: fetch::Ewma::guess(Duration::from_millis(10)),
            stopping: AtomicBool::new(false),
            ledger: Ledger::new(id, lease_until),
            handoff,
            beat_wake: crossbeam_channel::bounded(1),
            unrecorded: Mutex::new(Vec::new()),
            listen_wake: Arc::new(tokio::sync::Notify::new()),
            hook,
            stats: Stats::default(),
            vacuum: super::vacuum::VacuumState::new(),
            due: Default::default(),
            ride: Default::default(),
            absorb: Default::default(),
            quiet_until: Mutex::new(None),
            refusals: Default::default(),
            starts_due: crossbeam_channel::bounded(1),
            schedules: periodic::Watch::default(),
            dormancy: Default::default(),
            shelf,
        });

        let mut threads = Vec::new();
        let mut spawn = |role: Role, name: String, body: Box<dyn FnOnce() + Send>| -> Result<()> {
            let exit = ExitGuard {
                tx: exit_tx.clone(),
                index: threads.len(),
            };
            let handle = thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let _exit = exit;
                    body();
                })
                .map_err(|e| {
                    Error::with_source(ErrorKind::Other, format!("spawning thread {name}"), e)
                })?;
            threads.push(ThreadSlot {
                name,
                role,
                handle: Some(handle),
                exited: false,
            });
            Ok(())
        };

        let result = (|| {
            {
                let (s, stop, hard, out, news) = (
                    shared.clone(),
                    stop_rx.clone(),
                    hard_rx.clone(),
                    outcome_tx.clone(),
                    wake_tx.clone(),
                );
                // The beat LISTENs on the worker's lasting connection, unless listen_via
                // gives the listener a connection elsewhere.
                let ready = beat_listens.then(|| listening_tx.clone());
                spawn(
                    Role::Beat,
                    "postpone-beat".into(),
                    Box::new(move || beat::run(&s, &stop, &hard, &out, &news, ready.as_ref())),
                )?;
            }
            for i in 0..shared.opts.concurrency {
                let (s, stop, out) = (shared.clone(), stop_rx.clone(), outcome_tx.clone());
                spawn(
                    Role::Exec,
                    format!("postpone-exec-{i}"),
                    Box::new(move || exec::run(&s, i, &stop, &out)),
                )?;
            }
            {
                let (s, hard, out, wake) = (
                    shared.clone(),
                    hard_rx.clone(),
                    outcome_rx.clone(),
                    wake_tx.clone(),
                );
                spawn(
                    Role::Complete,
                    "postpone-complete".into(),
                    Box::new(move || complete::run(&s, &out, &hard, &wake)),
                )?;
            }
            {
                let (s, stop, wake, out, back) = (
                    shared.clone(),
                    stop_rx.clone(),
                    wake_rx.clone(),
                    outcome_rx.clone(),
                    outcome_tx.clone(),
                );
                spawn(
                    Role::Fetch,
                    "postpone-fetch".into(),
                    Box::new(move || {
                        // Executors stop waiting for jobs once no one can hand them any.
                        let _close = super::board::CloseOnDrop(s.handoff.board());
                        fetch::run(&s, &stop, &wake, &out, back)
                    }),
                )?;
            }
            if shared.opts.listen && !beat_listens {
                let (s, stop, wake, ready) = (
                    shared.clone(),
                    stop_rx.clone(),
                    wake_tx.clone(),
                    listening_tx.clone(),
                );
                spawn(
                    Role::Listen,
                    "postpone-listen".into(),
                    Box::new(move || listen::run(&s, &stop, &wake, &ready)),
                )?;
            }
            if shared.opts.vacuum.enabled {
                let (s, stop) = (shared.clone(), stop_rx.clone());
                spawn(
                    Role::Vacuum,
                    "postpone-vacuum".into(),
                    Box::new(move || super::vacuum::run(&s, &stop)),
                )?;
            }
            {
                // Always there: stored schedules may come at any time. It holds a
                // connection only while it has something to defer or prune.
                let (s, stop, ready) = (shared.clone(), stop_rx.clone(), periodic_tx.clone());
                spawn(
                    Role::Periodic,
                    "postpone-periodic".into(),
                    Box::new(move || periodic::run(&s, schedules, &stop, ready)),
                )?;
            }
            Ok(())
        })();
        drop(outcome_tx);

        let handle = WorkerHandle {
            running: Some(Running {
                shared,
                threads,
                stop_tx: Some(stop_tx),
                hard_tx: Some(hard_tx),
                exit_rx,
                outcome_rx,
            }),
        };
        drop(listening_tx);
        drop(periodic_tx);
        match result {
            Ok(()) => {
                let s = &handle.running.as_ref().expect("just built").shared;
                // The periodic thread's first round reads the start instant (of schedules
                // that run on start) before spawn returns: it reads the clock first thing.
                let _ = periodic_rx.recv_timeout(Duration::from_secs(1));
                if s.opts.listen {
                    // A worker returned by spawn() hears notifications: wait (bounded) for the
                    // listener's first LISTEN, so that an abort or a job deferred right after
                    // spawn() is not left to polling.
                    let opts = &s.app.inner.opts;
                    let wait = opts.connect_timeout + opts.io_timeout;
                    if listening_rx.recv_timeout(wait).is_err() {
                        log::warn!(
                            "worker {}: not listening yet after {}; starting anyway (polling covers it)",
                            s.name,
                            crate::error::fmt_duration(wait)
                        );
                    }
                }
                log::info!(
                    "worker {} (id {id}) started: {} thread(s), queues {}, {} task(s)",
                    s.name,
                    s.opts.concurrency,
                    s.opts
                        .queues
                        .as_ref()
                        .map_or_else(|| "all".to_owned(), |q| q.join(",")),
                    s.tasks.len()
                );
                Ok(handle)
            }
            Err(e) => {
                // Some threads may have started: stop them before reporting.
                let report = handle.shutdown(Duration::from_secs(2));
                log::debug!("partial worker stopped: {report}");
                Err(e)
            }
        }
    }
}

/// What the worker says about itself in `postpone_workers`: who it is, what it serves, and
/// its lease (its heartbeat interval and `stalled_after`: no other worker presumes it dead
/// before its last heartbeat plus its own `stalled_after`).
#[derive(Debug)]
pub(crate) struct Identity {
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) queues: Option<Vec<String>>,
    pub(crate) concurrency: i32,
    pub(crate) heartbeat_interval_ms: i64,
    pub(crate) stalled_after_ms: i64,
    /// The task names it claims, sorted; `None`: every task.
    pub(crate) tasks: Option<Vec<String>>,
}

impl Identity {
    fn new(name: &str, opts: &WorkerOptions, tasks: &Tasks) -> Identity {
        Identity {
            name: name.to_owned(),
            host: hostname(),
            pid: std::process::id() as i32,
            queues: opts.queues.clone(),
            concurrency: opts.concurrency as i32,
            heartbeat_interval_ms: crate::limits::age_millis(opts.heartbeat_interval),
            stalled_after_ms: crate::limits::age_millis(opts.stalled_after),
            tasks: opts.only_registered.then(|| {
                let mut names: Vec<String> = tasks.map.keys().cloned().collect();
                names.sort_unstable();
                names
            }),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

fn default_name() -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    format!(
        "{}-{}-{}",
        hostname(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use crate::{App, ErrorKind, Tasks, Worker};

    #[test]
    fn a_worker_without_tasks_says_how_to_give_it_one() {
        // Checked before any connection: a lazy App on a closed port will do.
        let app = App::builder("postgres://postgres@127.0.0.1:1/none")
            .lazy(true)
            .build()
            .unwrap();
        let e = Worker::builder(&app, Tasks::new()).spawn().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(e.to_string().contains("no task is registered"), "{e}");
        assert!(e.to_string().contains("Tasks::register"), "{e}");
    }
}
