//! The worker process of a chaos run, and its tasks.
//!
//! The orchestrator starts it (this test binary or the example, re-invoked) with env
//! `CHAOS_CHILD_URL` (the database through this slot's fault proxy, and a PgBouncer for some
//! slots of a server of the run's own), `CHAOS_LOG_URL` (the execution log, on a server the
//! faults never touch), `CHAOS_LISTEN_URL` (optional: where LISTEN goes, for a slot behind a
//! transaction pooler), `CHAOS_SLOT` and the worker's timings. It prints
//! `CHAOS_READY <pid> <worker id>` once its worker runs, shuts the worker down when its
//! standard input closes, and prints `CHAOS_REPORT <clean> <report>`.
//!
//! Every task logs its execution in `chaos_exec` on its own plain connection (not the
//! library's, not through the proxy), so the row survives whatever happens to the job: a
//! row at entry (job, attempt, pid, lock, start time), completed at exit (end time, what the
//! task returned, whether it saw an abort request). A task that panics logs before it panics.

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use postpone::{App, DeleteJobs, Job, RetryStrategy, TaskError, Tasks, Worker};
use serde::Deserialize;

use super::{now_us, Kind};

pub const ENV_URL: &str = "CHAOS_CHILD_URL";
pub const ENV_LOG_URL: &str = "CHAOS_LOG_URL";
pub const ENV_SLOT: &str = "CHAOS_SLOT";
pub const ENV_CONCURRENCY: &str = "CHAOS_CONCURRENCY";
pub const ENV_STALLED_MS: &str = "CHAOS_STALLED_MS";
pub const ENV_HEARTBEAT_MS: &str = "CHAOS_HEARTBEAT_MS";
/// Where the worker's LISTEN connection goes instead of `CHAOS_CHILD_URL` (set for a slot
/// behind a transaction pooler).
pub const ENV_LISTEN_URL: &str = "CHAOS_LISTEN_URL";

/// The task timeout of [`Kind::Timeout`].
pub const TASK_TIMEOUT: Duration = Duration::from_millis(300);
/// Attempts allowed to the kinds that retry.
pub const RETRY_ATTEMPTS: u32 = 3;

/// The arguments every chaos job is deferred with.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
pub struct Args {
    /// How long the task works, in milliseconds.
    pub ms: u64,
    /// The queueing lock of a [`Kind::QlockCollide`] job (its successor takes the same).
    #[serde(default)]
    pub ql: Option<String>,
    /// The deferrer's sequence number (none for the successors tasks defer).
    #[serde(default)]
    pub seq: Option<u64>,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the worker process if env `CHAOS_CHILD_URL` is set, and returns true when it is
/// done; returns false at once otherwise.
pub fn main_from_env() -> bool {
    let Ok(url) = std::env::var(ENV_URL) else {
        return false;
    };
    let log_url = std::env::var(ENV_LOG_URL).expect("CHAOS_LOG_URL is set with CHAOS_CHILD_URL");
    let slot = env_u64(ENV_SLOT, 0) as i32;
    let concurrency = env_u64(ENV_CONCURRENCY, 2) as usize;
    let stalled = Duration::from_millis(env_u64(ENV_STALLED_MS, 2000));
    let heartbeat = Duration::from_millis(env_u64(ENV_HEARTBEAT_MS, 250));
    let listen_url = std::env::var(ENV_LISTEN_URL).ok();
    let _ = env_logger::builder().try_init();

    // Standard input closing is the signal to stop (the orchestrator closes it, or dies).
    let (stdin_tx, stdin_rx) = crossbeam_channel::bounded::<()>(1);
    thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = stdin_tx.send(());
    });

    let ctx = Arc::new(Ctx {
        log_url,
        slot,
        pid: std::process::id() as i32,
        idle: Mutex::new(Vec::new()),
    });
    // The proxy may be stranding or refusing right now: keep trying.
    let handle = loop {
        let built = App::builder(url.as_str())
            .pool_size(2)
            .io_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(1))
            .lazy(true)
            .build()
            .and_then(|app| {
                let listen = match &listen_url {
                    Some(u) => Some(
                        App::builder(u.as_str())
                            .pool_size(1)
                            .io_timeout(Duration::from_secs(2))
                            .connect_timeout(Duration::from_secs(1))
                            .lazy(true)
                            .build()?,
                    ),
                    None => None,
                };
                let mut builder = Worker::builder(&app, tasks(&ctx));
                if let Some(l) = &listen {
                    builder = builder.listen_via(l);
                }
                builder
                    .name(format!("chaos-{slot}-{}", ctx.pid))
                    .concurrency(concurrency)
                    .poll_interval(Duration::from_millis(100))
                    .heartbeat_interval(heartbeat)
                    .stalled_after(stalled)
                    .listen_ping_interval(Duration::from_millis(500))
                    .reconnect_backoff_max(Duration::from_millis(500))
                    .drop_timeout(Duration::from_secs(3))
                    .delete_finished(DeleteJobs::Never)
                    .spawn()
            });
        match built {
            Ok(h) => break h,
            Err(e) => {
                eprintln!("chaos child {slot}: starting the worker: {e}; retrying");
                if stdin_rx.recv_timeout(Duration::from_millis(300)).is_ok() {
                    println!("CHAOS_REPORT false never started");
                    return true;
                }
            }
        }
    };
    println!("CHAOS_READY {} {}", ctx.pid, handle.worker_id());
    let _ = stdin_rx.recv();
    let report = handle.shutdown(Duration::from_secs(8));
    println!(
        "CHAOS_REPORT {} {}",
        report.is_clean() && report.cleanup_error().is_none(),
        report.to_string().replace('\n', " | ")
    );
    true
}

/// What every task of a process shares.
struct Ctx {
    log_url: String,
    slot: i32,
    pid: i32,
    /// Idle log connections (not thread-locals: a `postgres::Client` cannot be dropped
    /// during thread-local destruction).
    idle: Mutex<Vec<Client>>,
}

impl Ctx {
    /// Runs `f` on a log connection, reconnecting (a few times) when it fails.
    fn log<T>(
        &self,
        what: &str,
        mut f: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Option<T> {
        let mut conn = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        for round in 0..5 {
            let mut client = match conn.take() {
                Some(c) if !c.is_closed() => c,
                _ => match Client::connect(&self.log_url, NoTls) {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("chaos log: connecting ({what}): {e}");
                        thread::sleep(Duration::from_millis(50 << round));
                        continue;
                    }
                },
            };
            match f(&mut client) {
                Ok(v) => {
                    self.idle
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(client);
                    return Some(v);
                }
                Err(e) => eprintln!("chaos log: {what}: {e}"),
            }
        }
        None
    }

    fn log_start(&self, job: &Job, kind: Kind, seq: Option<i64>, t_start: i64) -> Option<i64> {
        let attempt = job.attempts() as i32;
        let lock = job.lock().map(str::to_owned);
        self.log("logging a start", |c| {
            c.query_one(
                "INSERT INTO chaos_exec (job_id, seq, attempt, kind, pid, slot, lock, t_start) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
                &[
                    &job.id().get(),
                    &seq,
                    &attempt,
                    &kind.name(),
                    &self.pid,
                    &self.slot,
                    &lock,
                    &t_start,
                ],
            )
            .map(|r| r.get::<_, i64>(0))
        })
    }

    fn log_end(&self, exec: Option<i64>, outcome: &str, abort_seen: bool) {
        let t_end = now_us();
        let Some(exec) = exec else { return };
        self.log("logging an end", |c| {
            c.execute(
                "UPDATE chaos_exec SET t_end = $2, outcome = $3, abort_seen = $4 WHERE id = $1",
                &[&exec, &t_end, &outcome, &abort_seen],
            )
        });
    }
}

/// Works for `ms`, checking `should_abort` every 20 ms; true if it stopped early.
fn work(job: &Job, ms: u64) -> bool {
    let until = Instant::now() + Duration::from_millis(ms);
    loop {
        if job.should_abort() {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        thread::sleep((until - now).min(Duration::from_millis(20)));
    }
}

fn run_task(ctx: &Ctx, kind: Kind, job: &Job) -> Result<(), TaskError> {
    let t_start = now_us();
    let args: Args = job.args().unwrap_or_default();
    let exec = ctx.log_start(job, kind, args.seq.map(|s| s as i64), t_start);
    if kind == Kind::QlockCollide {
        if let Some(ql) = &args.ql {
            // A successor waiting under the same queueing lock (and the same lock, if any),
            // due in 3 s, deferred before the work so that a kill or a pause during the work leaves a
            // rescue to collide with it too. Through the worker's own App (and proxy): it
            // may fail under faults, or find a successor already waiting.
            // Scheduled a little later, so that it still waits when the retry comes.
            let mut b = job
                .app()
                .job(&Kind::Ok.task())
                .queueing_lock(ql.as_str())
                .schedule_in(Duration::from_secs(3));
            if let Some(lock) = job.lock() {
                b = b.lock(lock);
            }
            if let Err(e) = b.defer(&Args {
                ms: 20,
                ql: None,
                seq: None,
            }) {
                eprintln!("chaos: deferring the successor of job {}: {e}", job.id());
            }
        }
    }
    let stopped = work(job, args.ms);
    let (outcome, result): (&str, Result<(), TaskError>) = if job.abort_requested() {
        (
            "aborted",
            Err(TaskError::fail("chaos: stopped on an abort request")),
        )
    } else if stopped && kind == Kind::Timeout {
        (
            "timeout",
            Err(TaskError::fail("chaos: stopped at the task timeout")),
        )
    } else if stopped {
        (
            "interrupted",
            Err(TaskError::retry("chaos: interrupted (shutdown)")),
        )
    } else {
        match kind {
            Kind::Ok | Kind::Slow => ("ok", Ok(())),
            Kind::Timeout => ("ok", Ok(())),
            Kind::NulFail => (
                "fail",
                Err(TaskError::fail("chaos: an error with a NUL \0 byte in it")),
            ),
            Kind::NulPanic | Kind::Panic => ("panic", Ok(())),
            Kind::HugeDelay => (
                "retry_huge",
                Err(TaskError::retry_in(
                    "chaos: retry in Duration::MAX",
                    Duration::MAX,
                )),
            ),
            Kind::RetryOnce if job.attempts() <= 1 => {
                ("retry", Err(TaskError::retry("chaos: retry once")))
            }
            Kind::RetryOnce => ("ok", Ok(())),
            // The successor was deferred before the work (see above).
            Kind::QlockCollide => (
                "retry",
                Err(TaskError::retry("chaos: retry into a taken queueing lock")),
            ),
            Kind::Cancel => (
                "cancel",
                Err(TaskError::cancel("chaos: cancelled by its task")),
            ),
        }
    };
    ctx.log_end(exec, outcome, job.abort_requested());
    match kind {
        Kind::NulPanic if outcome == "panic" => panic!("chaos: a panic with a NUL \0 byte"),
        Kind::Panic if outcome == "panic" => panic!("chaos: a plain panic"),
        _ => result,
    }
}

/// One task per kind, named `chaos_<kind>`.
fn tasks(ctx: &Arc<Ctx>) -> Tasks {
    let mut tasks = Tasks::new();
    for kind in Kind::ALL {
        let c = Arc::clone(ctx);
        let opts = tasks.register(kind.task(), move |job: &Job| run_task(&c, kind, job));
        match kind {
            Kind::HugeDelay | Kind::RetryOnce | Kind::QlockCollide => {
                opts.retry(RetryStrategy::fixed(
                    Duration::from_millis(50),
                    RETRY_ATTEMPTS,
                ));
            }
            Kind::Timeout => {
                opts.timeout(TASK_TIMEOUT);
            }
            _ => {}
        }
    }
    tasks
}
