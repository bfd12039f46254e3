//! Jobs as tasks see them: [`Job`], its [`JobId`] and [`JobStatus`].
//!
//! A `Job` is handed to a task while it runs. It carries the job's identity, its arguments
//! (kept as the JSON text read from the database and deserialized only when the task asks),
//! an abort flag the worker raises (an abort request, a shutdown past its graceful deadline,
//! or the task's own timeout), and the [`App`] so the task can reach the database.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};

use crate::app::App;
use crate::error::{Error, ErrorKind};
use crate::task::TaskError;

/// The id of a job: a newtype over the `bigint` primary key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub i64);

impl JobId {
    /// The id as a number.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<i64> for JobId {
    fn from(id: i64) -> JobId {
        JobId(id)
    }
}

impl From<JobId> for i64 {
    fn from(id: JobId) -> i64 {
        id.0
    }
}

impl FromStr for JobId {
    type Err = Error;
    fn from_str(s: &str) -> Result<JobId, Error> {
        s.trim()
            .parse::<i64>()
            .map(JobId)
            .map_err(|_| Error::invalid(format!("invalid job id {s:?}: expected a whole number")))
    }
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum JobStatus {
    /// Waiting to be claimed (possibly scheduled for later).
    Todo,
    /// Claimed by a worker, running.
    Doing,
    /// Ran and returned `Ok`.
    Succeeded,
    /// Ran and failed with no retry left (or failed without retry).
    Failed,
    /// Cancelled before it ran, or by its task.
    Cancelled,
    /// Aborted on request while it ran.
    Aborted,
}

impl JobStatus {
    /// Every status, in life order.
    pub const ALL: [JobStatus; 6] = [
        JobStatus::Todo,
        JobStatus::Doing,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Cancelled,
        JobStatus::Aborted,
    ];

    /// The status as stored in the database (`"todo"`, `"doing"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Todo => "todo",
            JobStatus::Doing => "doing",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Aborted => "aborted",
        }
    }

    /// True for the statuses a job never leaves by itself.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled | JobStatus::Aborted
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<JobStatus, Error> {
        JobStatus::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "unknown job status {s:?}: expected one of todo, doing, succeeded, failed, cancelled, aborted"
                    ),
                )
            })
    }
}

/// Why a running job should stop: bits of [`AbortFlag`].
pub(crate) const ABORT_REQUESTED: u8 = 1;
pub(crate) const ABORT_SHUTDOWN: u8 = 2;
pub(crate) const ABORT_TIMEOUT: u8 = 4;
/// The worker was presumed dead by another (its heartbeat went stale): this attempt's outcome
/// will be refused, and the job runs again elsewhere.
pub(crate) const ABORT_LOST: u8 = 8;

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

/// JSON text read from or written to a `jsonb` column without going through `serde_json::Value`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawJson(pub(crate) String);

impl ToSql for RawJson {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            out.extend_from_slice(&[1]);
        }
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }

    tokio_postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for RawJson {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<RawJson, Box<dyn std::error::Error + Sync + Send>> {
        let body = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, rest)) => rest,
                _ => return Err("unsupported jsonb encoding version".into()),
            }
        } else {
            raw
        };
        Ok(RawJson(std::str::from_utf8(body)?.to_owned()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_text() {
        for st in JobStatus::ALL {
            assert_eq!(st.as_str().parse::<JobStatus>().unwrap(), st);
            assert_eq!(st.to_string(), st.as_str());
        }
        assert!(JobStatus::Succeeded.is_finished());
        assert!(!JobStatus::Doing.is_finished());
        let e = "done".parse::<JobStatus>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("unknown job status \"done\""));
    }

    #[test]
    fn job_ids_parse_and_print() {
        assert_eq!("42".parse::<JobId>().unwrap(), JobId(42));
        assert_eq!(JobId(7).to_string(), "7");
        assert_eq!(i64::from(JobId(7)), 7);
        assert_eq!(
            "x".parse::<JobId>().unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
}
