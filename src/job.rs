//! Jobs as tasks see them: [`Job`] (its id and status types live in `types.rs`), and
//! [`AbortReason`].
//!
//! A `Job` is handed to a task while it runs. It carries the job's identity, its arguments
//! (kept as the JSON text read from the database and deserialized only when the task asks),
//! an abort flag the worker raises (an abort request, a shutdown past its graceful deadline,
//! the task's own timeout, or a lost lease), and the [`App`] so the task can reach the
//! database.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::app::App;
use crate::error::{Error, ErrorKind, Result};
use crate::store;
use crate::task_error::TaskError;
use crate::types::serialize_args;
// The worker and the admin API name these through `crate::job`.
pub(crate) use crate::types::{JobId, JobStatus, RawJson};

/// Why a running job should stop: bits of [`AbortFlag`].
pub(crate) const ABORT_REQUESTED: u8 = 1;
pub(crate) const ABORT_SHUTDOWN: u8 = 2;
pub(crate) const ABORT_TIMEOUT: u8 = 4;
/// The worker was presumed dead by another (its heartbeat went stale): this attempt's outcome
/// will be refused, and the job runs again elsewhere.
pub(crate) const ABORT_LOST: u8 = 8;

/// Why a running job is asked to stop; from [`Job::abort_reason`].
///
/// What the task returns then, and what becomes of the job:
///
/// | reason | the job ends | the task should return |
/// |---|---|---|
/// | [`Requested`](Self::Requested) | `aborted`, whatever the task returns | anything, at once |
/// | [`Shutdown`](Self::Shutdown) | back in its queue, its attempt given back (see below) | any error, or `Ok` if the work is done |
/// | [`Timeout`](Self::Timeout) | as the task decides: an error retries per the strategy | an error (or `fail`, `cancel`) |
/// | [`LeaseLost`](Self::LeaseLost) | nothing this attempt returns is recorded | anything, at once |
///
/// A job interrupted by a shutdown goes back to its queue whatever its task returned (an
/// ordinary error, [`TaskError::fail`], [`TaskError::cancel`], a retry, a panic), does not
/// count against its retry budget, and its history (the job's errors) says it was
/// interrupted. A task that means its answer even then says so with
/// [`TaskError::even_on_shutdown`]. A task that finishes during the graceful window (before
/// `should_abort` turns true) was not interrupted: its outcome counts as usual.
///
/// When several reasons hold, `abort_reason` gives the first of: `Requested`, `LeaseLost`,
/// `Shutdown`, `Timeout` (the one that decides the job).
///
/// ```
/// use postpone::{AbortReason, Job, TaskError};
///
/// fn import(job: &Job) -> Result<(), TaskError> {
///     for _chunk in 0..100 {
///         match job.abort_reason() {
///             None => {} // ... import a chunk ...
///             // Any error: the job runs again later, its attempt not counted.
///             Some(AbortReason::Shutdown) => return Err("stopped by a shutdown".into()),
///             Some(AbortReason::Timeout) => return Err(TaskError::fail("took too long")),
///             // The job ends aborted (or runs elsewhere) whatever this returns.
///             Some(_) => return Err("aborted".into()),
///         }
///     }
///     Ok(())
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AbortReason {
    /// Someone asked for this job to be aborted (`Admin::abort`, `postpone abort`, the
    /// dashboard). The job ends `aborted` whatever the task returns: stop at once.
    Requested,
    /// The worker is shutting down and its graceful window has passed. The job goes back to
    /// its queue whatever the task returns (unless the error says
    /// [`TaskError::even_on_shutdown`]), without using an attempt; return `Ok` only if
    /// the work is in fact complete.
    Shutdown,
    /// The task ran past the timeout it was registered with
    /// ([`TaskOptions::timeout`](crate::TaskOptions::timeout)). What it returns decides, as
    /// usual: an error is retried per its strategy.
    Timeout,
    /// Another worker presumed this one dead (its heartbeats could not reach the database
    /// for its `stalled_after`, so its lease ended) and put the job back in its queue: it may
    /// already run elsewhere, and nothing this attempt returns is recorded. Stop at once.
    LeaseLost,
}

impl AbortReason {
    /// The reason that decides, from the flag's bits (see the type's docs for the order).
    pub(crate) fn from_bits(bits: u8) -> Option<AbortReason> {
        [
            (ABORT_REQUESTED, AbortReason::Requested),
            (ABORT_LOST, AbortReason::LeaseLost),
            (ABORT_SHUTDOWN, AbortReason::Shutdown),
            (ABORT_TIMEOUT, AbortReason::Timeout),
        ]
        .into_iter()
        .find(|(bit, _)| bits & bit != 0)
        .map(|(_, r)| r)
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AbortReason::Requested => "abort requested",
            AbortReason::Shutdown => "worker shutting down",
            AbortReason::Timeout => "task timeout passed",
            AbortReason::LeaseLost => "worker presumed dead (lease lost)",
        })
    }
}

/// Raised by the worker, read by the task through [`Job::should_abort`].
#[derive(Debug, Default)]
pub(crate) struct AbortFlag(AtomicU8);

impl AbortFlag {
    pub(crate) fn raise(&self, why: u8) {
        self.0.fetch_or(why, Ordering::AcqRel);
    }
    pub(crate) fn get(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }
}

/// A job, as its task sees it while running.
///
/// ```
/// # use postpone::{Job, TaskError};
/// #[derive(serde::Deserialize)]
/// struct Email { to: String }
///
/// fn send_email(job: &Job) -> Result<(), TaskError> {
///     let email: Email = job.args()?;
///     for _chunk in 0..10 {
///         if job.should_abort() {
///             // On a shutdown the job goes back to its queue; see `AbortReason`.
///             return Err(TaskError::retry("stopped before the last chunk"));
///         }
///         // ... send a part ...
///     }
///     log::info!("job {} (attempt {}) sent mail to {}", job.id(), job.attempts(), email.to);
///     Ok(())
/// }
/// ```
pub struct Job {
    pub(crate) id: JobId,
    pub(crate) task: String,
    pub(crate) queue: String,
    pub(crate) args: RawJson,
    pub(crate) attempts: i32,
    pub(crate) priority: i32,
    pub(crate) lock: Option<String>,
    pub(crate) abort: Arc<AbortFlag>,
    pub(crate) app: App,
    /// What the task records while it runs (`Default` when the worker builds the job).
    pub(crate) extras: JobExtras,
}

/// The largest output a job may record, as JSON text.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// The largest progress value a job may record, as JSON text.
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;

/// State a running job accumulates: its output until the worker records it with the
/// outcome, and the periodic instant once read.
#[derive(Debug, Default)]
pub(crate) struct JobExtras {
    output: Mutex<Option<RawJson>>,
    instant: OnceLock<Option<SystemTime>>,
    /// For a job only locked by its worker's claim (`claim_in_outcome_transaction`): waits,
    /// at most the given time, until its row shows it running; true once it does.
    pub(crate) written: Option<WaitWritten>,
}

impl JobExtras {
    /// Extras of a job whose row its task may have to wait for (see `written`).
    pub(crate) fn waiting_for(written: Option<WaitWritten>) -> JobExtras {
        JobExtras {
            written,
            ..Default::default()
        }
    }
}

/// See [`JobExtras::written`].
#[derive(Clone)]
pub(crate) struct WaitWritten(pub(crate) Arc<dyn Fn(Duration) -> bool + Send + Sync>);

impl fmt::Debug for WaitWritten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WaitWritten")
    }
}

/// Longest `set_progress` waits for a job only locked by its worker's claim to show running.
const PROGRESS_WAIT: Duration = Duration::from_secs(2);

/// Serializes `value` as a job's `what`, refusing more than `max` bytes of JSON.
fn bounded_json<T: Serialize + ?Sized>(what: &str, value: &T, max: usize) -> Result<RawJson> {
    let json =
        serialize_args(value).map_err(|e| e.context(format_args!("recording the {what}")))?;
    if json.0.len() > max {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "recording the {what}: it is {} bytes of JSON, more than the {} allowed; store large results elsewhere and record a reference to them",
                json.0.len(),
                max
            ),
        ));
    }
    Ok(json)
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("task", &self.task)
            .field("queue", &self.queue)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// The job's id.
    pub fn id(&self) -> JobId {
        self.id
    }

    /// The task name it was deferred with.
    pub fn task(&self) -> &str {
        &self.task
    }

    /// The queue it was deferred to.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Which attempt this is: 1 on the first run.
    pub fn attempts(&self) -> u32 {
        self.attempts.max(0) as u32
    }

    /// Its priority (higher runs first).
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Its lock, if it was deferred with one.
    pub fn lock(&self) -> Option<&str> {
        self.lock.as_deref()
    }

    /// Deserializes the job's arguments. On failure the error fails the job without retry
    /// (the arguments will not change), with a message naming the task and the cause.
    pub fn args<T: DeserializeOwned>(&self) -> Result<T, TaskError> {
        serde_json::from_str(&self.args.0).map_err(|e| {
            TaskError::fail(format!(
                "arguments of task {:?} do not deserialize into {}: {e}",
                self.task,
                std::any::type_name::<T>()
            ))
        })
    }

    /// The arguments as the JSON text stored in the database.
    pub fn args_json(&self) -> &str {
        &self.args.0
    }

    /// True once the task should stop: an abort was requested for this job, the worker is
    /// shutting down past its graceful deadline, the task ran past its timeout, or the
    /// worker lost its lease. Long tasks should check it between steps and return early;
    /// [`abort_reason`](Self::abort_reason) tells which, and what to return:
    ///
    /// - an abort request: anything (the job ends `aborted` whatever it returns);
    /// - a shutdown: any error, or `Ok` if the work is done (the job goes back to its
    ///   queue, its attempt not counted, even after [`TaskError::fail`] or
    ///   [`TaskError::cancel`], unless the error says [`TaskError::even_on_shutdown`]);
    /// - a timeout: the outcome the task wants (an error retries per its strategy);
    /// - a lost lease: anything (nothing is recorded; the job may run elsewhere).
    pub fn should_abort(&self) -> bool {
        self.abort.get() != 0
    }

    /// Why the task should stop, once [`should_abort`](Self::should_abort) is true; `None`
    /// before. See [`AbortReason`] for what to return in each case.
    pub fn abort_reason(&self) -> Option<AbortReason> {
        AbortReason::from_bits(self.abort.get())
    }

    /// True when someone asked for this job to be aborted (not a shutdown or a timeout).
    pub fn abort_requested(&self) -> bool {
        self.abort.get() & ABORT_REQUESTED != 0
    }

    /// The application, to reach the database (`job.app().connection()`) or defer more jobs.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Sets the job's output: a JSON value stored on the job if, and only if, the task then
    /// succeeds, in the same statement that records the success (a retried, failed or
    /// cancelled attempt records none). A later call replaces an earlier one. Readers get it
    /// from [`App::wait`](crate::App::wait) and the admin API's job detail.
    ///
    /// Nothing is written yet, so this never blocks; a value that does not serialize, whose
    /// JSON is larger than [`MAX_OUTPUT_BYTES`], or whose JSON jsonb cannot store (as for a
    /// job's arguments: see [`NewJob::new`](crate::NewJob::new)), is an error of kind
    /// `InvalidInput` (and the output set before, if any, is kept).
    ///
    /// ```
    /// # use postpone::{Job, TaskError};
    /// fn resize(job: &Job) -> Result<(), TaskError> {
    ///     // ... resize ...
    ///     job.set_output(&serde_json::json!({"width": 640, "height": 480}))?;
    ///     Ok(())
    /// }
    /// ```
    pub fn set_output<T: Serialize + ?Sized>(&self, output: &T) -> Result<()> {
        let json = bounded_json("job output", output, MAX_OUTPUT_BYTES)?;
        *self.extras.output.lock().unwrap_or_else(|e| e.into_inner()) = Some(json);
        Ok(())
    }

    /// Takes the output set by the task, for the worker to record with a success.
    pub(crate) fn take_output(&self) -> Option<RawJson> {
        self.extras
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Records the job's progress now: any JSON value (a percentage, a step name, counts),
    /// replacing the previous one, with the time it was written. It is written at once, on a
    /// pooled connection under the App's `io_timeout`, so a watcher sees it while the task
    /// runs (admin job detail, [`App::job_result`](crate::App::job_result)).
    ///
    /// Errors: JSON larger than [`MAX_PROGRESS_BYTES`] (kind `InvalidInput`); the database
    /// unreachable or slow (`Timeout`, `Connect`...); the job no longer running as this
    /// attempt (`InvalidState`: it was requeued after its worker was presumed dead). A task
    /// may ignore these errors and carry on: progress is informative.
    ///
    /// ```
    /// # use postpone::{Job, TaskError};
    /// fn import(job: &Job) -> Result<(), TaskError> {
    ///     for chunk in 0..10 {
    ///         // ... import chunk ...
    ///         let _ = job.set_progress(&serde_json::json!({"done": chunk + 1, "of": 10}));
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn set_progress<T: Serialize + ?Sized>(&self, progress: &T) -> Result<()> {
        let json = bounded_json("job progress", progress, MAX_PROGRESS_BYTES)?;
        let mut conn = self.app.connection()?;
        let mut n = conn.execute_cached(
            "recording a job's progress",
            store::JOB_PROGRESS_SET,
            &[&self.id.0, &json, &self.attempts],
        )?;
        // A job its worker's claim only locked shows running within a few milliseconds
        // (`claim_in_outcome_transaction`): then its progress is written.
        if n == 0
            && self
                .extras
                .written
                .as_ref()
                .is_some_and(|w| (w.0)(PROGRESS_WAIT))
        {
            n = conn.execute_cached(
                "recording a job's progress",
                store::JOB_PROGRESS_SET,
                &[&self.id.0, &json, &self.attempts],
            )?;
        }
        if n == 0 {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "recording the progress of job {}: it is no longer running as attempt {} (it was requeued after its worker was presumed dead, or finished)",
                    self.id, self.attempts
                ),
            ));
        }
        Ok(())
    }

    /// The jobs this job was deferred to run after ([`NewJob::after`](crate::NewJob::after),
    /// [`after_finished`](crate::NewJob::after_finished)), by id, each with its status and
    /// the output it recorded ([`set_output`](Self::set_output)); empty for a job without
    /// dependencies. Read from the database at each call (one query, under the App's
    /// `io_timeout`). See [`Dependency`](crate::Dependency) for an example.
    pub fn dependency_outputs(&self) -> Result<Vec<crate::Dependency>> {
        let mut conn = self.app.connection()?;
        crate::deps::read(&mut conn, self.id)
    }

    /// The batch this job belongs to ([`App::batch`](crate::App::batch)), or `None`. A
    /// batch's callbacks belong to it too. Read from the database at each call (one query).
    pub fn batch_id(&self) -> Result<Option<crate::BatchId>> {
        let mut conn = self.app.connection()?;
        crate::batch::of_job(&mut conn, self.id)
    }

    /// The workflow this job belongs to ([`App::workflow`](crate::App::workflow)), or
    /// `None`. Read from the database at each call (one query).
    pub fn workflow_id(&self) -> Result<Option<crate::WorkflowId>> {
        let mut conn = self.app.connection()?;
        crate::workflow::of_job(&mut conn, self.id)
    }

    /// Adds `jobs` to this job's batch ([`App::add_to_batch`](crate::App::add_to_batch)):
    /// its callbacks wait for them too. Always accepted while this job of the batch runs,
    /// since the callbacks wait for it. [`InvalidState`](crate::ErrorKind::InvalidState) if
    /// this job is in no batch, or is a callback of a batch that has finished.
    ///
    /// ```
    /// # use postpone::{Job, NewJob, TaskError};
    /// fn crawl(job: &Job) -> Result<(), TaskError> {
    ///     let url: String = job.args()?;
    ///     // Each page found joins the batch: its on_complete waits for them all.
    ///     let found = vec![NewJob::new("crawl", &format!("{url}/next"))?];
    ///     job.add_to_batch(&found)?;
    ///     Ok(())
    /// }
    /// ```
    pub fn add_to_batch(&self, jobs: &[crate::NewJob]) -> Result<Vec<JobId>> {
        let batch = self.batch_id()?.ok_or_else(|| {
            crate::Error::new(
                crate::ErrorKind::InvalidState,
                format!("adding jobs to the batch of job {}: it is in no batch (defer it with App::batch)", self.id),
            )
        })?;
        self.app.add_to_batch(batch, jobs)
    }

    /// The instant of the periodic schedule this job was deferred for, or `None` if no
    /// periodic schedule deferred it. The instant is the one of the schedule (in its time
    /// zone, as a point in time), not the time the job started, so a task that runs late, or
    /// again after a retry, still knows which period it covers. Read from the database on the
    /// first call (under the App's `io_timeout`), then remembered.
    pub fn periodic_instant(&self) -> Result<Option<SystemTime>> {
        if let Some(v) = self.extras.instant.get() {
            return Ok(*v);
        }
        let mut conn = self.app.connection()?;
        let rows = conn.query_cached(
            "reading the periodic instant of a job",
            store::JOB_PERIODIC_INSTANT,
            &[&self.id.0],
        )?;
        let v: Option<SystemTime> = rows.first().and_then(|r| r.get(0));
        Ok(*self.extras.instant.get_or_init(|| v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_that_decides_the_job_comes_first() {
        use AbortReason::*;
        assert_eq!(AbortReason::from_bits(0), None);
        assert_eq!(AbortReason::from_bits(ABORT_TIMEOUT), Some(Timeout));
        assert_eq!(
            AbortReason::from_bits(ABORT_TIMEOUT | ABORT_SHUTDOWN),
            Some(Shutdown)
        );
        assert_eq!(
            AbortReason::from_bits(ABORT_SHUTDOWN | ABORT_LOST),
            Some(LeaseLost)
        );
        assert_eq!(AbortReason::from_bits(0xff), Some(Requested));
        assert_eq!(Shutdown.to_string(), "worker shutting down");
    }
}
