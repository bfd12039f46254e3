//! Helpers for the tests of programs that use postpone (feature `test-util`): see what a piece
//! of code deferred, assert it, and run those jobs synchronously, in the test's thread,
//! against the real database.
//!
//! A [`Mark`] remembers the newest job id when it is taken; everything deferred after it
//! (through the App, inside the program's own transactions, from SQL with
//! `postpone_defer`, or by jobs that ran) is "what the code deferred". Jobs deferred before
//! the mark, and by other tests on other databases, are never seen.
//!
//! [`Mark::run`] claims those jobs one at a time, highest priority first, and runs them with
//! a task registry in the calling thread, recording each outcome on the job as a worker
//! would (succeeded with its output, failed, cancelled, or back to `todo` for a retry, which
//! runs at once if its delay is zero). Jobs that the tasks defer are run too. No worker,
//! thread or notification is involved, so a test needs no waiting.
//!
//! ```no_run
//! # fn main() -> postpone::Result<()> {
//! use postpone::testing::Mark;
//! use postpone::{Job, TaskError, Tasks};
//! use serde_json::json;
//!
//! // The code under test: signing up defers a welcome mail.
//! fn sign_up(app: &postpone::App, email: &str) -> postpone::Result<()> {
//!     app.job("welcome").queue("emails").defer(&json!({ "to": email }))?;
//!     Ok(())
//! }
//!
//! let app = postpone::App::connect("postgres://postgres@127.0.0.1/myapp_test")?;
//! app.migrate()?;
//! let mark = Mark::new(&app)?;
//! sign_up(&app, "a@b.c")?;
//!
//! // What was deferred, as stored.
//! let deferred = mark.deferred()?;
//! let job = deferred.assert_one("welcome", &json!({ "to": "a@b.c" }));
//! assert_eq!(job.queue, "emails");
//!
//! // Run it now, in this thread, with the real task code.
//! let mut tasks = Tasks::new();
//! tasks.register("welcome", |job: &Job| -> Result<(), TaskError> {
//!     job.set_output(&"sent")?;
//!     Ok(())
//! });
//! let ran = mark.run(&tasks)?;
//! assert_eq!(ran.len(), 1);
//! assert!(ran[0].succeeded(), "{:?}", ran[0]);
//! # Ok(())
//! # }
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::app::App;
use crate::error::{Error, ErrorKind, Result};
use crate::job::{AbortFlag, Job, JobExtras};
use crate::retry::jitter_rand;
use crate::store;
use crate::task::{TaskAction, Tasks};
use crate::types::{serialize_args, JobId, JobStatus, RawJson};
use crate::worker::{write_outcomes, Fence, Outcome, OutcomeKind};

/// Most jobs one [`Mark::run`] runs: a task that defers itself forever is stopped there.
pub const MAX_RUNS: usize = 10_000;

/// A point in the job table: what is deferred after it is what the code under test deferred.
#[derive(Clone, Debug)]
pub struct Mark {
    app: App,
    after: i64,
}

/// A job as it was deferred, read from the database.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeferredJob {
    /// Its id.
    pub id: JobId,
    /// Its task name.
    pub task: String,
    /// Its arguments.
    pub args: serde_json::Value,
    /// Its queue.
    pub queue: String,
    /// Its priority.
    pub priority: i32,
    /// Its lock.
    pub lock: Option<String>,
    /// Its queueing lock.
    pub queueing_lock: Option<String>,
    /// When it is due.
    pub scheduled_at: SystemTime,
    /// Its status now.
    pub status: JobStatus,
}

impl DeferredJob {
    /// The arguments deserialized into `T`; an error of kind `InvalidInput` if they do not
    /// fit.
    pub fn args_as<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.args).map_err(|e| {
            Error::with_source(
                ErrorKind::InvalidInput,
                format!(
                    "the arguments of job {} ({}) do not deserialize into {}",
                    self.id,
                    self.task,
                    std::any::type_name::<T>()
                ),
                e,
            )
        })
    }

    /// How long after `since` the job is due (zero if it is due by then); with
    /// `SystemTime::now()`, a test checks a `schedule_in` without racing the clock too much.
    pub fn due_in(&self, since: SystemTime) -> Duration {
        self.scheduled_at.duration_since(since).unwrap_or_default()
    }
}

/// The jobs deferred after a [`Mark`], oldest first; dereferences to a slice of
/// [`DeferredJob`], with assertions that panic with a list of what was deferred.
#[derive(Clone, Debug, PartialEq)]
pub struct DeferredJobs(Vec<DeferredJob>);

/// The former name of [`DeferredJob`] (`postpone::Deferred` is the outcome of a unique
/// defer).
#[deprecated(note = "renamed `DeferredJob`")]
pub type Deferred = DeferredJob;

impl std::ops::Deref for DeferredJobs {
    type Target = [DeferredJob];
    fn deref(&self) -> &[DeferredJob] {
        &self.0
    }
}

impl DeferredJobs {
    /// The jobs of `task`.
    pub fn of_task(&self, task: &str) -> Vec<&DeferredJob> {
        self.0.iter().filter(|d| d.task == task).collect()
    }

    /// Asserts that exactly one job of `task` with arguments equal to `args` (compared as
    /// JSON) was deferred, and returns it to check its queue, schedule and locks. Panics
    /// otherwise, listing the jobs that were deferred.
    #[track_caller]
    pub fn assert_one<A: Serialize + ?Sized>(&self, task: &str, args: &A) -> &DeferredJob {
        let want = match serialize_args(args) {
            Ok(RawJson(text)) => {
                serde_json::from_str::<serde_json::Value>(&text).expect("serialized JSON parses")
            }
            Err(e) => panic!("assert_one({task:?}, ..): {e}"),
        };
        let found: Vec<&DeferredJob> = self
            .0
            .iter()
            .filter(|d| d.task == task && d.args == want)
            .collect();
        match found.as_slice() {
            [one] => one,
            _ => panic!(
                "expected one job of task {task:?} with arguments {want}, found {}; deferred: {}",
                found.len(),
                self.describe()
            ),
        }
    }

    /// Asserts that no job of `task` was deferred; panics listing them otherwise.
    #[track_caller]
    pub fn assert_none(&self, task: &str) {
        let n = self.of_task(task).len();
        assert!(
            n == 0,
            "expected no job of task {task:?}, found {n}; deferred: {}",
            self.describe()
        );
    }

    fn describe(&self) -> String {
        if self.0.is_empty() {
            return "nothing".to_owned();
        }
        self.0
            .iter()
            .map(|d| format!("#{} {} {} on {:?}", d.id, d.task, d.args, d.queue))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// One job run by [`Mark::run`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Ran {
    /// The job.
    pub id: JobId,
    /// Its task.
    pub task: String,
    /// Which attempt this was (1 on the first run).
    pub attempt: u32,
    /// The status recorded: `Succeeded`, `Failed`, `Cancelled`, or `Todo` for a retry.
    pub status: JobStatus,
    /// The task's error, or the panic message.
    pub error: Option<String>,
    /// The output recorded with a success.
    pub output: Option<serde_json::Value>,
}

impl Ran {
    /// True when the run succeeded.
    pub fn succeeded(&self) -> bool {
        self.status == JobStatus::Succeeded
    }
}

impl Mark {
    /// Takes a mark now: later jobs are what the code under test defers.
    pub fn new(app: &App) -> Result<Mark> {
        let mut conn = app.connection()?;
        let row = conn.query_cached("reading the newest job id", store::TESTING_MARK, &[])?;
        Ok(Mark {
            app: app.clone(),
            after: row[0].get(0),
        })
    }

    /// The jobs deferred after the mark, oldest first, whatever their status.
    pub fn deferred(&self) -> Result<DeferredJobs> {
        let mut conn = self.app.connection()?;
        let rows = conn.query_cached(
            "reading deferred jobs",
            store::TESTING_DEFERRED,
            &[&self.after],
        )?;
        rows.iter()
            .map(|r| {
                let args: RawJson = r.get(2);
                let status: String = r.get(8);
                Ok(DeferredJob {
                    id: JobId(r.get(0)),
                    task: r.get(1),
                    args: serde_json::from_str(&args.0).unwrap_or(serde_json::Value::Null),
                    queue: r.get(3),
                    priority: r.get(4),
                    lock: r.get(5),
                    queueing_lock: r.get(6),
                    scheduled_at: r.get(7),
                    status: status.parse()?,
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(DeferredJobs)
    }

    /// Runs, in this thread, every job deferred after the mark that is waiting and due,
    /// with `tasks`, until none is left (jobs the tasks defer included, and retries whose
    /// delay is zero); returns the runs in order. A job of a task `tasks` does not know
    /// fails, as on a worker. A job past its deadline
    /// ([`expires_at`](crate::NewJob::expires_at)) is not run (a worker's sweep would end it
    /// expired). More than [`MAX_RUNS`] runs is an error of kind `InvalidState` (a task that
    /// keeps deferring itself).
    pub fn run(&self, tasks: &Tasks) -> Result<Vec<Ran>> {
        self.run_jobs(tasks, false)
    }

    /// Like [`run`](Self::run), but also runs the jobs scheduled for later, at once.
    pub fn run_scheduled_too(&self, tasks: &Tasks) -> Result<Vec<Ran>> {
        self.run_jobs(tasks, true)
    }

    fn run_jobs(&self, tasks: &Tasks, scheduled_too: bool) -> Result<Vec<Ran>> {
        let mut ran = Vec::new();
        loop {
            if ran.len() >= MAX_RUNS {
                return Err(Error::new(
                    ErrorKind::InvalidState,
                    format!("running deferred jobs: stopped after {MAX_RUNS} runs (does a task keep deferring jobs?)"),
                ));
            }
            let mut conn = self.app.connection()?;
            let rows = conn.query_cached(
                "claiming a deferred job",
                store::TESTING_CLAIM,
                &[&self.after, &scheduled_too],
            )?;
            drop(conn);
            let Some(r) = rows.first() else {
                return Ok(ran);
            };
            let job = Job {
                id: JobId(r.get(0)),
                queue: r.get(1),
                task: r.get(2),
                args: r.get(3),
                attempts: r.get(4),
                priority: r.get(5),
                lock: r.get(6),
                abort: Arc::new(AbortFlag::default()),
                app: self.app.clone(),
                extras: JobExtras::default(),
            };
            let max_attempts: Option<i32> = r.get(7);
            ran.push(self.run_one(tasks, &job, max_attempts)?);
        }
    }

    fn run_one(&self, tasks: &Tasks, job: &Job, max_attempts: Option<i32>) -> Result<Ran> {
        let attempt = job.attempts();
        let mut snoozed = false;
        let (mut status, delay, error) = match tasks.map.get(&job.task) {
            None => (
                JobStatus::Failed,
                Duration::ZERO,
                Some(format!(
                    "task {:?} is not registered in the tasks given to Mark::run (it knows: {})",
                    job.task,
                    tasks.names().join(", ")
                )),
            ),
            Some(task) => match catch_unwind(AssertUnwindSafe(|| (task.func)(job))) {
                Ok(Ok(())) => (JobStatus::Succeeded, Duration::ZERO, None),
                Ok(Err(e)) => {
                    // The job's own attempt limit overrides the strategy's, as in a worker.
                    let strategy = &match max_attempts {
                        Some(n) => task.options.retry.clone().max_attempts(n.max(1) as u32),
                        None => task.options.retry.clone(),
                    };
                    let msg = e.message().to_owned();
                    match e.action {
                        TaskAction::Fail => (JobStatus::Failed, Duration::ZERO, Some(msg)),
                        TaskAction::Cancel => (JobStatus::Cancelled, Duration::ZERO, Some(msg)),
                        TaskAction::Error => match strategy.next_delay(attempt, jitter_rand()) {
                            Some(d) => (JobStatus::Todo, d, Some(msg)),
                            None => (JobStatus::Failed, Duration::ZERO, Some(msg)),
                        },
                        TaskAction::RetryIn(d) if attempt < strategy.attempts_allowed() => {
                            (JobStatus::Todo, d, Some(msg))
                        }
                        TaskAction::RetryIn(_) => (JobStatus::Failed, Duration::ZERO, Some(msg)),
                        TaskAction::Snooze(d) => {
                            snoozed = true;
                            (JobStatus::Todo, d, None)
                        }
                    }
                }
                Err(p) => {
                    let text = p
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a non-text panic payload".to_owned());
                    (
                        JobStatus::Failed,
                        Duration::ZERO,
                        Some(format!("task panicked: {text}")),
                    )
                }
            },
        };
        let output = if status == JobStatus::Succeeded {
            job.take_output()
        } else {
            None
        };
        let error = error.map(|e| crate::limits::safe_text(&e));
        // Recorded by the worker's own writer (`postpone_finish`, `postpone_requeue`,
        // `postpone_snooze`), fenced on the attempt: an abort or a cancel requested meanwhile
        // wins over what the task returned, and dependents follow.
        let kind = match status {
            _ if snoozed => OutcomeKind::Snooze,
            JobStatus::Todo => OutcomeKind::Retry,
            JobStatus::Succeeded => OutcomeKind::Succeeded,
            JobStatus::Cancelled => OutcomeKind::Cancelled,
            _ => OutcomeKind::Failed,
        };
        let outcome = Outcome::outside_worker(
            job.id,
            attempt as i32,
            kind,
            delay,
            error.clone(),
            output.clone(),
        );
        let mut conn = self.app.connection()?;
        let done = write_outcomes(&mut conn, &[&outcome], Fence::NoWorker)
            .map_err(|e| e.context("recording the outcome of a deferred job"))?;
        if outcome.requeues() {
            if let Some(came) = done.get(&job.id.0) {
                status = match came.as_str() {
                    "aborted" => JobStatus::Aborted,
                    "superseded" | "expired" => JobStatus::Cancelled,
                    "failed" => JobStatus::Failed,
                    _ => JobStatus::Todo,
                };
            }
        } else {
            let rows = conn.query_cached(
                "reading the outcome of a deferred job",
                store::JOB_STATUS,
                &[&job.id.0],
            )?;
            if let Some(Ok(s)) = rows.first().map(|r| r.get::<_, &str>(0).parse()) {
                status = s;
            }
        }
        Ok(Ran {
            id: job.id,
            task: job.task.clone(),
            attempt,
            status,
            error,
            output: output.map(|RawJson(t)| serde_json::from_str(&t).unwrap_or_default()),
        })
    }
}
