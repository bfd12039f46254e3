//! What the admin API shows of a job: [`JobInfo`] (a row of a listing), [`JobDetail`] (one
//! job with its history) and [`AttemptError`]; how they are read from rows; and how times
//! and durations are written in JSON (RFC 3339 UTC, seconds as numbers).
//!
//! Reading never fails on a value another client may have stored: arguments are kept as the
//! database's JSON text (numbers of any size or precision survive), infinite times print as
//! `infinity`, an errors column that is not the expected array reads as no errors.

use std::time::{Duration, SystemTime};

use chrono::DateTime;
use postgres::Row;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, JobStatus, RawJson};

pub(crate) use crate::timefmt::{rfc3339, ser_opt_time, ser_time};

/// A job as the admin API shows it. Serializes to JSON with RFC 3339 times.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct JobInfo {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its task name.
    pub task: String,
    /// Where it is in its life.
    pub status: JobStatus,
    /// Higher runs first.
    pub priority: i32,
    /// Its arguments, as the JSON text the database holds (numbers exactly as stored).
    pub args: Box<RawValue>,
    /// Its lock, if any.
    pub lock: Option<String>,
    /// Its queueing lock, if any.
    pub queueing_lock: Option<String>,
    /// Attempts started so far.
    pub attempts: u32,
    /// Not run before this.
    #[serde(serialize_with = "ser_time")]
    pub scheduled_at: SystemTime,
    /// When it was deferred.
    #[serde(serialize_with = "ser_time")]
    pub created_at: SystemTime,
    /// When its current (or last) attempt started.
    #[serde(serialize_with = "ser_opt_time")]
    pub started_at: Option<SystemTime>,
    /// When it finished, for finished jobs.
    #[serde(serialize_with = "ser_opt_time")]
    pub finished_at: Option<SystemTime>,
    /// The worker running it, or that ran its last attempt (none once it is requeued).
    pub worker_id: Option<i64>,
    /// True once an abort was requested.
    pub abort_requested: bool,
    /// The error of its last failed attempt, if any.
    pub last_error: Option<String>,
    /// True while it waits for the jobs it was deferred to run after
    /// ([`NewJob::after`](crate::NewJob::after)): it is `todo`, but no worker claims it until
    /// they allow it (its `scheduled_at` reads `infinity` meanwhile).
    pub waiting_for_dependencies: bool,
    /// Its deadline ([`NewJob::expires_at`](crate::NewJob::expires_at)): not started by
    /// then, it never runs.
    #[serde(serialize_with = "ser_opt_time")]
    pub expires_at: Option<SystemTime>,
    /// True for a job that ended `cancelled` because it had not started by its deadline.
    pub expired: bool,
    /// The workflow it belongs to ([`App::workflow`](crate::App::workflow)), if any.
    pub workflow_id: Option<crate::WorkflowId>,
}

impl JobInfo {
    /// How long its last attempt ran, for finished jobs that started (`finished_at` minus
    /// `started_at`; `None` if either is missing or the clock went back).
    pub fn duration(&self) -> Option<Duration> {
        self.finished_at?.duration_since(self.started_at?).ok()
    }
}

impl PartialEq for JobInfo {
    fn eq(&self, other: &JobInfo) -> bool {
        self.id == other.id
            && self.queue == other.queue
            && self.task == other.task
            && self.status == other.status
            && self.priority == other.priority
            && self.args.get() == other.args.get()
            && self.lock == other.lock
            && self.queueing_lock == other.queueing_lock
            && self.attempts == other.attempts
            && self.scheduled_at == other.scheduled_at
            && self.created_at == other.created_at
            && self.started_at == other.started_at
            && self.finished_at == other.finished_at
            && self.worker_id == other.worker_id
            && self.abort_requested == other.abort_requested
            && self.last_error == other.last_error
            && self.waiting_for_dependencies == other.waiting_for_dependencies
            && self.expires_at == other.expires_at
            && self.expired == other.expired
            && self.workflow_id == other.workflow_id
    }
}

/// One failed attempt of a job, from [`JobDetail::errors`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AttemptError {
    /// Which attempt (1 for the first).
    pub attempt: u32,
    /// When it was recorded.
    #[serde(serialize_with = "ser_opt_time")]
    pub at: Option<SystemTime>,
    /// What went wrong.
    pub error: String,
}

/// What separates a panic's message from its backtrace in a recorded error (see
/// [`AttemptError::backtrace`]).
pub(crate) const BACKTRACE_MARK: &str = "\n\nbacktrace:\n";

impl AttemptError {
    /// The error without the backtrace a panic records after it: all of
    /// [`error`](Self::error) when there is none.
    ///
    /// ```
    /// # fn show(e: &postpone::AttemptError) {
    /// println!("attempt {}: {}", e.attempt, e.message());
    /// if let Some(bt) = e.backtrace() {
    ///     println!("{bt}");
    /// }
    /// # }
    /// ```
    pub fn message(&self) -> &str {
        self.error
            .split_once(BACKTRACE_MARK)
            .map_or(&self.error, |(m, _)| m)
    }

    /// The backtrace of the panic that ended this attempt: the task's own frames, at most
    /// 8 KiB, captured by the worker unless `RUST_LIB_BACKTRACE` (or, without it,
    /// `RUST_BACKTRACE`) is `0`. It is recorded in [`error`](Self::error), after the
    /// message and a line `backtrace:`.
    pub fn backtrace(&self) -> Option<&str> {
        self.error.split_once(BACKTRACE_MARK).map(|(_, b)| b)
    }
}

/// A job with its history; from [`Admin::job`](crate::Admin::job).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct JobDetail {
    /// The job.
    #[serde(flatten)]
    pub job: JobInfo,
    /// Its failed attempts, oldest first (also requeues after a worker died, and the
    /// reason of a cancel or abort).
    pub errors: Vec<AttemptError>,
    /// The name of that worker, while the worker is registered.
    pub worker_name: Option<String>,
    /// The periodic id, if a periodic schedule deferred it.
    pub periodic_id: Option<String>,
    /// The scheduled instant it was deferred for, if a periodic schedule deferred it.
    #[serde(serialize_with = "ser_opt_time")]
    pub periodic_instant: Option<SystemTime>,
    /// The output its task recorded with its success ([`Job::set_output`](crate::Job::set_output)).
    pub output: Option<serde_json::Value>,
    /// The latest progress its task recorded ([`Job::set_progress`](crate::Job::set_progress)).
    pub progress: Option<serde_json::Value>,
    /// When that progress was recorded.
    #[serde(serialize_with = "ser_opt_time")]
    pub progress_at: Option<SystemTime>,
    /// How many times its task snoozed it ([`TaskError::snooze`](crate::TaskError::snooze)):
    /// runs that gave their attempt back.
    pub snoozes: i32,
    /// The attempt limit it was deferred with
    /// ([`NewJob::max_attempts`](crate::NewJob::max_attempts)); `None`: its task's strategy.
    pub max_attempts: Option<i32>,
    /// The tags it was deferred with ([`NewJob::tags`](crate::NewJob::tags)).
    pub tags: Vec<String>,
    /// The metadata it was deferred with ([`NewJob::meta`](crate::NewJob::meta)).
    pub meta: Option<serde_json::Value>,
    /// While it waits: the job its lock makes it wait for, once a claim has found it held
    /// back and parked it (the latest earlier job of its lock still pending, else the
    /// lock's running job). `None` for a job no claim has looked at yet, or free to run.
    pub blocked_by: Option<JobId>,
    /// The jobs it was deferred to run after, by id (at most 1,000).
    pub dependencies: Vec<DependencyInfo>,
    /// The jobs deferred to run after it, by id (at most 1,000).
    pub dependents: Vec<JobId>,
    /// The batch it belongs to ([`App::batch`](crate::App::batch)), as a job or a callback.
    pub batch_id: Option<crate::BatchId>,
}

/// A job that another job was deferred to run after, as [`JobDetail::dependencies`] shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DependencyInfo {
    /// Its id.
    pub id: JobId,
    /// True when any outcome of it will do
    /// ([`after_finished`](crate::NewJob::after_finished)); false when it must succeed
    /// ([`after`](crate::NewJob::after)).
    pub any_outcome: bool,
    /// Its status now; else the outcome recorded when it finished, if its row was deleted
    /// since; `None` when it was deleted before it finished (or has a status this library
    /// does not know).
    pub status: Option<JobStatus>,
}

/// Reads the first 17 columns (see `store::JOB_COLUMNS`; the 16th, the last error, and the 17th,
/// whether it waits for dependencies, may be absent in statements that select only the
/// first 15), and the columns named `expires_at` and `expired` where the statement has them.
pub(crate) fn job_from_row(r: &Row) -> Result<JobInfo> {
    let status: String = r.get(4);
    let status = status.parse::<JobStatus>().map_err(|e| {
        Error::new(
            ErrorKind::Other,
            format!("reading job {}: {e}", r.get::<_, i64>(0)),
        )
    })?;
    let last_error = if r.len() > 15 && r.columns()[15].type_() == &postgres::types::Type::TEXT {
        r.get(15)
    } else {
        None
    };
    let waiting_for_dependencies = r.len() > 16
        && r.columns()[16].type_() == &postgres::types::Type::BOOL
        && r.get::<_, Option<bool>>(16).unwrap_or(false);
    Ok(JobInfo {
        id: JobId(r.get(0)),
        queue: r.get(1),
        task: r.get(2),
        args: raw_column(r, 3).unwrap_or_else(null),
        status,
        priority: r.get(5),
        lock: r.get(6),
        queueing_lock: r.get(7),
        scheduled_at: r.get(8),
        attempts: r.get::<_, i32>(9).max(0) as u32,
        worker_id: r.get(10),
        abort_requested: r.get(11),
        created_at: r.get(12),
        started_at: r.get(13),
        finished_at: r.get(14),
        last_error,
        waiting_for_dependencies,
        // By name: statements that select other columns after the first 17 leave them out.
        expires_at: r
            .try_get::<_, Option<SystemTime>>("expires_at")
            .ok()
            .flatten(),
        expired: r.try_get::<_, bool>("expired").unwrap_or(false),
        workflow_id: r
            .try_get::<_, Option<i64>>("workflow_id")
            .ok()
            .flatten()
            .map(crate::WorkflowId),
    })
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

/// A json or jsonb column as its exact text. Text serde_json refuses (a lone surrogate
/// escape, which a json column accepts from a raw INSERT) is returned as a JSON string of
/// itself.
pub(crate) fn raw_column(r: &Row, i: usize) -> Option<Box<RawValue>> {
    let raw: Option<RawJson> = r.get(i);
    raw.map(|RawJson(text)| {
        RawValue::from_string(text.clone()).unwrap_or_else(|_| {
            RawValue::from_string(serde_json::Value::String(text).to_string())
                .expect("a JSON string is JSON")
        })
    })
}

/// A json or jsonb column parsed into a value; `None` when absent or not parseable.
pub(crate) fn json_column(r: &Row, i: usize) -> Option<serde_json::Value> {
    let raw: Option<RawJson> = r.get(i);
    raw.and_then(|RawJson(text)| serde_json::from_str(&text).ok())
}

pub(crate) fn parse_errors(v: serde_json::Value) -> Vec<AttemptError> {
    let serde_json::Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .into_iter()
        .map(|item| AttemptError {
            attempt: item
                .get("attempt")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0) as u32,
            at: item
                .get("at")
                .and_then(serde_json::Value::as_str)
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(SystemTime::from),
            error: match item.get("error") {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            },
        })
        .collect()
}

/// Seconds (as PostgreSQL's float8 gives them) to a duration: negative is zero, infinite
/// is `Duration::MAX` (a time of `-infinity` is infinitely old), NaN is `None`.
pub(crate) fn secs(s: f64) -> Option<Duration> {
    if s.is_nan() {
        return None;
    }
    Some(Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX))
}

pub(crate) fn ser_secs<S: Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}

pub(crate) fn ser_opt_secs<S: Serializer>(
    d: &Option<Duration>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_secs(d, s),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_parse_leniently() {
        let v = serde_json::json!([
            {"attempt": 1, "at": "2024-05-01T12:00:00.5+00:00", "error": "boom"},
            {"attempt": 2, "error": {"odd": true}},
            "garbage"
        ]);
        let e = parse_errors(v);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].attempt, 1);
        assert_eq!(e[0].error, "boom");
        assert_eq!(rfc3339(e[0].at.unwrap()), "2024-05-01T12:00:00.500000Z");
        assert_eq!(e[1].at, None);
        assert_eq!(e[1].error, "{\"odd\":true}");
        assert_eq!(e[2].attempt, 0);
        assert!(parse_errors(serde_json::json!({"x": 1})).is_empty());
    }

    #[test]
    fn times_print_everywhere_in_range_and_never_panic() {
        let e = SystemTime::UNIX_EPOCH;
        assert_eq!(rfc3339(e), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(e - Duration::from_millis(1500)),
            "1969-12-31T23:59:58.500000Z"
        );
        let far = Duration::from_secs(300_000 * 365 * 86_400);
        assert_eq!(rfc3339(e + far), "infinity");
        assert_eq!(rfc3339(e - far), "-infinity");
    }

    #[test]
    fn seconds_never_panic() {
        assert_eq!(secs(-1.0), Some(Duration::ZERO));
        assert_eq!(secs(1.5), Some(Duration::from_millis(1500)));
        assert_eq!(secs(f64::INFINITY), Some(Duration::MAX));
        assert_eq!(secs(f64::NAN), None);
    }
}
