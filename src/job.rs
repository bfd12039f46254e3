//! Jobs as tasks see them: [`Job`] (its id and status types live in `types.rs`).
//!
//! A `Job` is handed to a task while it runs. It carries the job's identity, its arguments
//! (kept as the JSON text read from the database and deserialized only when the task asks),
//! an abort flag the worker raises (an abort request, a shutdown past its graceful deadline,
//! or the task's own timeout), and the [`App`] so the task can reach the database.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::app::App;
use crate::task_error::TaskError;
// The worker and the admin API name these through `crate::job`.
pub(crate) use crate::types::{JobId, JobStatus, RawJson};

/// Why a running job should stop: bits of [`AbortFlag`].
pub(crate) const ABORT_REQUESTED: u8 = 1;
pub(crate) const ABORT_SHUTDOWN: u8 = 2;
pub(crate) const ABORT_TIMEOUT: u8 = 4;

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
///             return Err(TaskError::fail("aborted before the last chunk"));
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
    /// shutting down past its graceful deadline, or the task ran past its timeout. Long tasks
    /// should check it between steps and return early.
    pub fn should_abort(&self) -> bool {
        self.abort.get() != 0
    }

    /// True when someone asked for this job to be aborted (not a shutdown or a timeout).
    pub fn abort_requested(&self) -> bool {
        self.abort.get() & ABORT_REQUESTED != 0
    }

    /// The application, to reach the database (`job.app().connection()`) or defer more jobs.
    pub fn app(&self) -> &App {
        &self.app
    }
}
