//! The admin API, [`App::admin`]: look at jobs, queues and workers; retry, cancel, abort
//! and prune. The `postpone` command-line tool uses nothing else.
//!
//! Every call checks a connection out of the App's pool (within `pool_timeout`) and makes
//! each round-trip under the App's `io_timeout`: no call can hang on a dead database.
//! Operations on one job fail with [`ErrorKind::NotFound`] when the id does not exist and
//! [`ErrorKind::InvalidState`] when the job's status does not allow them (retrying a
//! running job, cancelling a finished one); the message names the status.
//!
//! Changes are single statements: a cancel cannot race with a worker claiming the job
//! (one of them finds the row no longer `todo`), an abort stores the request and sends
//! the NOTIFY in the same transaction, a retry wakes the workers of the job's queue.

use std::fmt;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use postgres::Row;
use serde::{Serialize, Serializer};

use crate::app::App;
use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, JobStatus, RawJson};
use crate::retention::{self, PruneReport, Retention};
use crate::schema;
use crate::store;

/// Rows [`Admin::jobs`] returns unless the filter sets a limit.
const DEFAULT_LIMIT: u32 = 100;

impl App {
    /// The admin API of this App: list, inspect, retry, cancel, abort, prune.
    ///
    /// ```no_run
    /// use postpone::{JobFilter, JobStatus};
    /// # fn main() -> postpone::Result<()> {
    /// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let admin = app.admin();
    /// for job in admin.jobs(&JobFilter::new().status(JobStatus::Failed).limit(20))? {
    ///     println!("{} {} attempt {}", job.id, job.task, job.attempts);
    ///     admin.retry(job.id)?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn admin(&self) -> Admin {
        Admin { app: self.clone() }
    }
}

/// Administration of jobs, queues and workers; from [`App::admin`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Admin {
    app: App,
}

/// Which jobs [`Admin::jobs`] lists: every filter set must match. Newest jobs first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct JobFilter {
    id: Option<JobId>,
    queue: Option<String>,
    task: Option<String>,
    statuses: Vec<JobStatus>,
    lock: Option<String>,
    queueing_lock: Option<String>,
    limit: Option<u32>,
}

impl JobFilter {
    /// Every job (up to the limit).
    pub fn new() -> JobFilter {
        JobFilter::default()
    }

    /// Only the job with this id.
    pub fn id(mut self, id: JobId) -> JobFilter {
        self.id = Some(id);
        self
    }

    /// Only jobs of this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> JobFilter {
        self.queue = Some(queue.into());
        self
    }

    /// Only jobs of this task.
    pub fn task(mut self, task: impl Into<String>) -> JobFilter {
        self.task = Some(task.into());
        self
    }

    /// Only jobs with this status; call it again to accept several.
    pub fn status(mut self, status: JobStatus) -> JobFilter {
        if !self.statuses.contains(&status) {
            self.statuses.push(status);
        }
        self
    }

    /// Only jobs with this lock.
    pub fn lock(mut self, lock: impl Into<String>) -> JobFilter {
        self.lock = Some(lock.into());
        self
    }

    /// Only jobs with this queueing lock.
    pub fn queueing_lock(mut self, lock: impl Into<String>) -> JobFilter {
        self.queueing_lock = Some(lock.into());
        self
    }

    /// At most this many jobs (at least 1). Defaults to 100.
    pub fn limit(mut self, limit: u32) -> JobFilter {
        self.limit = Some(limit);
        self
    }
}

/// A job as the admin API shows it. Serializes to JSON with RFC 3339 times.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
    /// Its arguments.
    pub args: serde_json::Value,
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
    /// True once an abort was requested while it ran.
    pub abort_requested: bool,
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

/// A job with its history; from [`Admin::job`].
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
}

/// What [`Admin::abort`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AbortOutcome {
    /// The job was running: the abort is requested and its worker told;
    /// [`Job::should_abort`](crate::Job::should_abort) turns true within a second.
    Requested,
    /// The job was waiting: it is now cancelled and will not run.
    Cancelled,
}

/// Jobs of one queue, per status; from [`Admin::counts`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueCounts {
    /// The queue.
    pub queue: String,
    /// Waiting and due.
    pub todo: u64,
    /// Waiting, scheduled for later.
    pub scheduled: u64,
    /// Running.
    pub doing: u64,
    /// Succeeded (still kept).
    pub succeeded: u64,
    /// Failed.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Aborted.
    pub aborted: u64,
    /// How long the oldest due job has waited past its scheduled time, if any is due.
    #[serde(serialize_with = "ser_opt_secs", rename = "oldest_todo_age_secs")]
    pub oldest_todo_age: Option<Duration>,
}

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
    /// Its executor threads.
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
    /// Jobs it is running.
    pub running: u64,
}

impl Admin {
    fn conn(&self) -> Result<crate::app::PooledConnection> {
        self.app.connection()
    }

    /// Jobs matching `filter`, newest first.
    pub fn jobs(&self, filter: &JobFilter) -> Result<Vec<JobInfo>> {
        let limit = i64::from(filter.limit.unwrap_or(DEFAULT_LIMIT));
        if limit == 0 {
            return Err(Error::invalid("invalid limit 0: use 1 or more"));
        }
        let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        let id = filter.id.map(|i| i.0);
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "listing jobs",
            store::JOBS_LIST,
            &[
                &id,
                &filter.queue,
                &filter.task,
                &statuses,
                &filter.lock,
                &filter.queueing_lock,
                &limit,
            ],
        )?;
        rows.iter().map(job_from_row).collect()
    }

    /// One job with its errors; [`NotFound`](ErrorKind::NotFound) if there is none.
    pub fn job(&self, id: JobId) -> Result<JobDetail> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("reading a job", store::JOB_GET, &[&id.0])?;
        let row = rows.first().ok_or_else(|| not_found(id))?;
        let job = job_from_row(row)?;
        let errors = json_column(row, 15).map(parse_errors).unwrap_or_default();
        Ok(JobDetail {
            job,
            errors,
            worker_name: row.get(16),
            periodic_id: row.get(17),
            periodic_instant: row.get(18),
        })
    }

    /// Puts a failed, cancelled or aborted job back in its queue, due now; its attempts
    /// count from zero again (its recorded errors are kept). The workers of its queue are
    /// woken. [`AlreadyEnqueued`](ErrorKind::AlreadyEnqueued) if a job of its queueing lock
    /// is already waiting.
    pub fn retry(&self, id: JobId) -> Result<()> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("retrying a job", store::JOB_RETRY, &[&id.0])?;
        if rows.is_empty() {
            return Err(wrong_state(
                &mut conn,
                id,
                "retry",
                "only failed, cancelled or aborted jobs can be retried",
            ));
        }
        if rows[0].get::<_, &str>(0) == "collision" {
            return Err(Error::new(
                ErrorKind::AlreadyEnqueued,
                format!(
                    "retrying job {id}: a job with its queueing lock is already waiting (todo)"
                ),
            )
            .set_sqlstate("23505"));
        }
        log::info!("job {id} retried by the admin API");
        Ok(())
    }

    /// Cancels a waiting (`todo`) job: it becomes `cancelled` and will not run. A running
    /// job cannot be cancelled ([`InvalidState`](ErrorKind::InvalidState)): use
    /// [`abort`](Self::abort).
    pub fn cancel(&self, id: JobId) -> Result<()> {
        self.cancel_with(id, "cancelling a job", store::JOB_CANCEL, "cancelled")
    }

    /// Like [`cancel`](Self::cancel), and deletes the job's row.
    pub fn cancel_and_delete(&self, id: JobId) -> Result<()> {
        self.cancel_with(
            id,
            "deleting a job",
            store::JOB_CANCEL_DELETE,
            "cancelled and deleted",
        )
    }

    fn cancel_with(&self, id: JobId, what: &str, sql: &str, done: &str) -> Result<()> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(what, sql, &[&id.0])?;
        if rows.is_empty() {
            return Err(wrong_state(
                &mut conn,
                id,
                "cancel",
                "only waiting (todo) jobs can be cancelled; abort a running one",
            ));
        }
        log::info!("job {id} {done} by the admin API");
        Ok(())
    }

    /// Aborts a job. A running job gets the request stored and its worker told by NOTIFY
    /// (and by polling, when notifications are off or lost): its task sees
    /// [`Job::should_abort`](crate::Job::should_abort) turn true within a second, and the
    /// job ends `aborted` whatever the task returns. A waiting job is cancelled. Finished
    /// jobs are an [`InvalidState`](ErrorKind::InvalidState) error.
    pub fn abort(&self, id: JobId) -> Result<AbortOutcome> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("aborting a job", store::JOB_ABORT, &[&id.0])?;
        let Some(row) = rows.first() else {
            return Err(wrong_state(
                &mut conn,
                id,
                "abort",
                "only waiting or running jobs can be aborted",
            ));
        };
        let status: String = row.get(0);
        let outcome = if status == "doing" {
            AbortOutcome::Requested
        } else {
            AbortOutcome::Cancelled
        };
        log::info!("job {id}: abort requested by the admin API ({outcome:?})");
        Ok(outcome)
    }

    /// Jobs per queue and status, queues in name order. (Scans the jobs table: prune
    /// finished jobs to keep it quick.)
    pub fn counts(&self) -> Result<Vec<QueueCounts>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("counting jobs", store::QUEUE_COUNTS, &[])?;
        Ok(rows
            .iter()
            .map(|r| {
                let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
                QueueCounts {
                    queue: r.get(0),
                    todo: n(1),
                    scheduled: n(2),
                    doing: n(3),
                    succeeded: n(4),
                    failed: n(5),
                    cancelled: n(6),
                    aborted: n(7),
                    oldest_todo_age: r.get::<_, Option<f64>>(8).map(secs),
                }
            })
            .collect())
    }

    /// Registered workers, oldest first, with the age of their heartbeat.
    pub fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("listing workers", store::WORKERS_LIST, &[])?;
        Ok(rows
            .iter()
            .map(|r| WorkerInfo {
                id: r.get(0),
                name: r.get(1),
                host: r.get(2),
                pid: r.get(3),
                queues: r.get(4),
                concurrency: r.get(5),
                started_at: r.get(6),
                last_heartbeat: r.get(7),
                heartbeat_age: secs(r.get(8)),
                running: r.get::<_, i64>(9).max(0) as u64,
            })
            .collect())
    }

    /// Running jobs whose worker has sent no heartbeat for `stalled_after`, or whose
    /// worker row is gone: a live worker rescues them once its own `stalled_after` passes.
    pub fn stalled_jobs(&self, stalled_after: Duration) -> Result<Vec<JobInfo>> {
        let ms = stalled_after.as_millis().min(i64::MAX as u128) as i64;
        let mut conn = self.conn()?;
        let rows = conn.query_named("listing stalled jobs", store::JOBS_STALLED, &[&ms])?;
        rows.iter().map(job_from_row).collect()
    }

    /// Deletes finished jobs as `retention` says, in batches (see [`Retention`]).
    pub fn prune(&self, retention: &Retention) -> Result<PruneReport> {
        retention.validate()?;
        let mut conn = self.conn()?;
        let report = retention::prune(&mut conn, retention, || true)?;
        log::info!("prune by the admin API: {report}");
        Ok(report)
    }

    /// The schema version installed, if it is at least the one this library needs:
    /// [`SchemaMissing`](ErrorKind::SchemaMissing) or
    /// [`SchemaOutdated`](ErrorKind::SchemaOutdated) otherwise. For health checks.
    pub fn check_schema(&self) -> Result<i32> {
        let mut conn = self.app.connection_unchecked()?;
        schema::check(&mut conn)
    }
}

fn not_found(id: JobId) -> Error {
    Error::new(ErrorKind::NotFound, format!("job {id} not found"))
}

/// Why an operation on job `id` changed nothing: it does not exist, or its status.
fn wrong_state(conn: &mut crate::Connection, id: JobId, op: &str, rule: &str) -> Error {
    match conn.query_named("reading a job's status", store::JOB_STATUS, &[&id.0]) {
        Ok(rows) => match rows.first() {
            None => not_found(id),
            Some(r) => {
                let status: String = r.get(0);
                Error::new(
                    ErrorKind::InvalidState,
                    format!("cannot {op} job {id}: it is {status}; {rule}"),
                )
            }
        },
        Err(e) => e.context(format_args!("cannot {op} job {id}")),
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

fn job_from_row(r: &Row) -> Result<JobInfo> {
    let status: String = r.get(4);
    let status = status.parse::<JobStatus>().map_err(|e| {
        Error::new(
            ErrorKind::Other,
            format!("reading job {}: {e}", r.get::<_, i64>(0)),
        )
    })?;
    Ok(JobInfo {
        id: JobId(r.get(0)),
        queue: r.get(1),
        task: r.get(2),
        args: json_column(r, 3).unwrap_or(serde_json::Value::Null),
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
    })
}

/// A jsonb column, read as text and parsed here: a value serde_json cannot hold (a number
/// beyond f64, say, stored by another client) comes back as a JSON string of its text
/// instead of failing the whole call.
fn json_column(r: &Row, i: usize) -> Option<serde_json::Value> {
    let raw: Option<RawJson> = r.get(i);
    raw.map(|RawJson(text)| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

fn parse_errors(v: serde_json::Value) -> Vec<AttemptError> {
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

/// An instant in RFC 3339, UTC, to the microsecond: `2024-05-01T12:00:00.123456Z`
/// (`"infinity"` or `"-infinity"` past chrono's range of ±262,000 years).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    match to_chrono(t) {
        Some(d) => d.to_rfc3339_opts(SecondsFormat::Micros, true),
        None if t > SystemTime::UNIX_EPOCH => "infinity".to_owned(),
        None => "-infinity".to_owned(),
    }
}

/// `SystemTime` to chrono without the panic of chrono's `From` out of its range.
fn to_chrono(t: SystemTime) -> Option<DateTime<Utc>> {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => DateTime::from_timestamp(i64::try_from(d.as_secs()).ok()?, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).ok()?;
            match d.subsec_nanos() {
                0 => DateTime::from_timestamp(-secs, 0),
                n => DateTime::from_timestamp(-secs - 1, 1_000_000_000 - n),
            }
        }
    }
}

fn ser_time<S: Serializer>(t: &SystemTime, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

fn ser_opt_time<S: Serializer>(
    t: &Option<SystemTime>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&rfc3339(*t)),
        None => s.serialize_none(),
    }
}

fn ser_secs<S: Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}

fn ser_opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_secs(d, s),
        None => s.serialize_none(),
    }
}

impl fmt::Display for AbortOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AbortOutcome::Requested => "abort requested",
            AbortOutcome::Cancelled => "cancelled (it was waiting)",
        })
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
    fn filter_collects_distinct_statuses() {
        let f = JobFilter::new()
            .status(JobStatus::Failed)
            .status(JobStatus::Failed)
            .status(JobStatus::Todo)
            .limit(5);
        assert_eq!(f.statuses, vec![JobStatus::Failed, JobStatus::Todo]);
        assert_eq!(f.limit, Some(5));
    }
}
