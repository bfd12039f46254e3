//! The admin API, [`App::admin`]: the one way tools (the `postpone` command, a dashboard)
//! look at and change jobs, queues and workers. One concept per file:
//!
//! - [`filter`]: which jobs ([`JobFilter`]), in what order, one page at a time (keyset
//!   cursors);
//! - [`info`]: what a job looks like ([`JobInfo`], [`JobDetail`]);
//! - [`preview`]: a job read for display, its large values cut ([`JobPreview`]), and its
//!   arguments written whole a chunk at a time;
//! - [`bulk`]: retry, cancel, delete, reschedule, reprioritise every job a filter selects,
//!   with a dry run;
//! - [`stats`]: counts per queue or task, failure rate, run-time percentiles, lag;
//! - [`workers`]: workers, stale heartbeats, stalled jobs and what to do about them;
//! - [`queues`]: pausing and resuming queues across every worker;
//! - [`concurrency`]: at most N running jobs per queue across every worker;
//! - [`schedules`]: periodic schedules stored in the database, changed at runtime;
//! - [`schema`]: the installed version against this library's, bounded migration, its SQL;
//! - [`grants`]: the privileges each part of a deployment needs, as SQL from the catalogue.
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

pub(crate) mod bulk;
pub(crate) mod concurrency;
pub(crate) mod filter;
pub(crate) mod grants;
pub(crate) mod info;
pub(crate) mod preview;
pub(crate) mod queues;
pub(crate) mod rates;
pub(crate) mod schedules;
pub(crate) mod schema;
pub(crate) mod settings;
pub(crate) mod stats;
pub(crate) mod workers;

use std::fmt;
use std::time::SystemTime;

use serde::Serialize;

use crate::app::App;
use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, JobStatus};
use crate::retention::{self, PruneReport, Retention};
use crate::store;

pub use bulk::{BulkAction, BulkReport};
pub use concurrency::QueueLimit;
pub use filter::{JobFilter, JobPage, JobSort};
pub use grants::GrantsFor;
pub use info::{AttemptError, DependencyInfo, JobDetail, JobInfo};
pub use preview::{JobPreview, JobValue, JsonPrefix};
pub use queues::{PausedQueue, Pauses};
pub use rates::{KeyLimit, RateLimit, MIN_RATE_PERIOD};
pub use schedules::{NewSchedule, ScheduleInfo};
pub use schema::{MigrateReport, SchemaState};
pub use settings::{DEFAULT_MAX_ARGS_BYTES, MAX_ARGS_BYTES_CEILING};
pub use stats::{QueueCounts, StatsBy, UnknownTask, DEFAULT_UNKNOWN_TASK_AFTER};
pub use workers::{StalledReport, WorkerInfo};

use filter::Query;
pub(crate) use info::rfc3339;
use info::{job_from_row, json_column, parse_errors};

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
///
/// A call on one job ([`retry`](Self::retry), [`cancel`](Self::cancel),
/// [`abort`](Self::abort), [`reschedule`](Self::reschedule), ...) waits at most a second for
/// a row another session holds locked (the job's, or a job it depends on or that depends on
/// it: an operator's open transaction, say), then fails with
/// [`Timeout`](ErrorKind::Timeout), having changed nothing. [`bulk`](Self::bulk) skips such
/// jobs instead and counts them as skipped.
#[derive(Clone, Debug)]
pub struct Admin {
    app: App,
}

/// What [`Admin::abort`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AbortOutcome {
    /// The job was `doing`: the abort is recorded and its worker told; a running task sees
    /// [`Job::should_abort`](crate::Job::should_abort) within a second, a job not yet
    /// started ends aborted without running.
    Requested,
    /// The job was waiting: it is now cancelled and will not run.
    Cancelled,
}

impl Admin {
    /// The App this admin API acts through.
    pub(crate) fn app(&self) -> &App {
        &self.app
    }

    fn conn(&self) -> Result<crate::app::PooledConnection> {
        self.app.connection()
    }

    /// Jobs matching `filter`, in its order (newest first by default), up to its limit.
    /// Use [`job_page`](Self::job_page) to know whether more match.
    pub fn jobs(&self, filter: &JobFilter) -> Result<Vec<JobInfo>> {
        Ok(self.job_page(filter)?.jobs)
    }

    /// One page of the jobs matching `filter`, with the cursor of the next page when more
    /// match (see [`JobFilter::after`]).
    pub fn job_page(&self, filter: &JobFilter) -> Result<JobPage> {
        let mut conn = self.conn()?;
        let (rows, limit) = filter.with_args_fallback(|filter| {
            let mut q = Query::default();
            let (sql, limit) = filter.list_sql(&mut q)?;
            Ok((conn.query_named("listing jobs", &sql, &q.params())?, limit))
        })?;
        let mut jobs = rows
            .iter()
            .take(limit)
            .map(job_from_row)
            .collect::<Result<Vec<_>>>()?;
        let next_cursor = if rows.len() > limit {
            let last = &rows[limit - 1];
            // After the 20 columns of JOB_COLUMNS.
            let key: String = last.get(20);
            Some(filter.cursor(&key, JobId(last.get(0))))
        } else {
            None
        };
        jobs.truncate(limit);
        Ok(JobPage { jobs, next_cursor })
    }

    /// One job with its errors; [`NotFound`](ErrorKind::NotFound) if there is none.
    pub fn job(&self, id: JobId) -> Result<JobDetail> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("reading a job", store::JOB_GET, &[&id.0])?;
        let row = rows.first().ok_or_else(|| not_found(id))?;
        let mut detail = detail_from_row(row)?;
        detail.batch_id = row.get::<_, Option<i64>>(28).map(crate::BatchId);
        if row.get::<_, bool>(27) {
            read_dependencies(&mut conn, &mut detail)?;
        }
        Ok(detail)
    }

    /// The progress of batch `id` ([`App::batch`]): its jobs counted by state, and its
    /// callbacks' states, read in one statement over an index of the batch's jobs.
    /// [`NotFound`](ErrorKind::NotFound) if there is no such batch. See
    /// [`BatchProgress`](crate::BatchProgress) for an example.
    pub fn batch(&self, id: crate::BatchId) -> Result<crate::BatchProgress> {
        let mut conn = self.conn()?;
        crate::batch::progress(&mut conn, id)
    }

    /// Puts a failed, cancelled or aborted job back in its queue, due now; its attempts
    /// count from zero again (its recorded errors are kept). The workers of its queue are
    /// woken. [`AlreadyEnqueued`](ErrorKind::AlreadyEnqueued) if a job of its queueing lock
    /// is already waiting.
    pub fn retry(&self, id: JobId) -> Result<()> {
        let mut conn = self.conn()?;
        let rows = one_job(&mut conn, id, "retrying a job", store::JOB_RETRY, &[&id.0])?;
        if rows.is_empty() {
            return Err(wrong_state(
                &mut conn,
                id,
                "retry",
                "only failed, cancelled or aborted jobs can be retried",
            ));
        }
        if let Some(why) = rows[0].get::<_, &str>(0).strip_prefix("error: ") {
            // Refused by the database for this job alone (a dependency that ended badly,
            // a trigger of the application's): the job is as it was.
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!("retrying job {id}: {why}"),
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

    /// Cancels a waiting (`todo`) job: it becomes `cancelled` and will not run. A job a
    /// worker claimed but has not started is waiting too: its worker ends it `cancelled`
    /// without running it (this waits up to 2 s for that). A worker that has not answered
    /// after 2 s (a loaded machine) may have begun the task in the moment before: then
    /// `cancel` returns `Ok` with the cancel requested, and the job runs on; its status
    /// says which happened, and [`abort`](Self::abort) stops a job that runs. A running job cannot be
    /// cancelled ([`InvalidState`](ErrorKind::InvalidState)): use [`abort`](Self::abort).
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

    /// Longest [`cancel`](Self::cancel) waits for the worker holding a job to end it.
    const CANCEL_HELD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

    fn cancel_with(&self, id: JobId, what: &str, sql: &str, done: &str) -> Result<()> {
        let mut conn = self.conn()?;
        let mut rows = one_job(&mut conn, id, what, sql, &[&id.0])?;
        if rows.is_empty()
            && !one_job(
                &mut conn,
                id,
                what,
                store::JOB_CANCEL_HELD,
                &[&id.0, &self.app.namespace().channel()],
            )?
            .is_empty()
        {
            // Held by a worker, not started: it ends the job without running it, or gives
            // it back (then it is cancelled here), or it started meanwhile.
            let until = std::time::Instant::now() + Self::CANCEL_HELD_WAIT;
            loop {
                std::thread::sleep(std::time::Duration::from_millis(5));
                rows = one_job(&mut conn, id, what, sql, &[&id.0])?;
                if !rows.is_empty() {
                    break;
                }
                let shown = conn.query_named(what, store::JOB_SHOWN_STATUS, &[&id.0])?;
                let (status, held) = shown
                    .first()
                    .map_or((None, false), |r| (Some(r.get::<_, String>(0)), r.get(1)));
                match status.as_deref() {
                    Some("cancelled") if sql == store::JOB_CANCEL => {
                        log::info!("job {id} {done} by the admin API (its worker held it)");
                        return Ok(());
                    }
                    Some("cancelled") => {
                        rows = one_job(&mut conn, id, what, store::JOB_DELETE_CANCELLED, &[&id.0])?;
                        break;
                    }
                    _ if held && std::time::Instant::now() < until => continue,
                    Some("todo") | Some("doing") if held => {
                        log::info!(
                            "job {id}: cancel requested by the admin API; the worker holding it has not answered within 2 s (it ends the job cancelled if it has not begun it; a task that began just now runs on, and abort stops it)"
                        );
                        return Ok(());
                    }
                    _ => break,
                }
            }
        }
        if rows.is_empty() {
            // A cancel asked of a job held then started meanwhile is not left to take effect
            // later (after a retry, say): the job was not cancelled.
            one_job(
                &mut conn,
                id,
                what,
                store::JOB_CANCEL_REQUEST_CLEAR,
                &[&id.0],
            )?;
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

    /// Aborts a job. A `doing` job gets the request stored and its worker told by NOTIFY
    /// (and by polling, when notifications are off or lost): a running task sees
    /// [`Job::should_abort`](crate::Job::should_abort) turn true within a second, and the
    /// job ends `aborted` whatever the task returns; a job claimed but not yet started (held
    /// by a worker) ends `aborted` at once, without running and without using an attempt. A waiting job is cancelled. Finished jobs are an
    /// [`InvalidState`](ErrorKind::InvalidState) error.
    pub fn abort(&self, id: JobId) -> Result<AbortOutcome> {
        let mut conn = self.conn()?;
        let rows = one_job(
            &mut conn,
            id,
            "aborting a job",
            store::JOB_ABORT,
            &[&id.0, &self.app.namespace().channel()],
        )?;
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

    /// Makes a waiting (`todo`) job due at `at` instead; workers of its queue are woken. A
    /// time outside the years 1 to 9999 is an [`InvalidInput`](crate::ErrorKind::InvalidInput)
    /// error.
    pub fn reschedule(&self, id: JobId, at: SystemTime) -> Result<()> {
        self.one(id, BulkAction::Reschedule(at), "reschedule")
    }

    /// Gives a waiting (`todo`) job another priority (higher runs first).
    pub fn set_priority(&self, id: JobId, priority: i32) -> Result<()> {
        self.one(id, BulkAction::Priority(priority), "reprioritise")
    }

    fn one(&self, id: JobId, action: BulkAction, op: &str) -> Result<()> {
        let r = self.bulk(action, &JobFilter::new().id(id), false)?;
        if r.changed == 0 {
            let mut conn = self.conn()?;
            // The bulk path skips rows other sessions hold: wait for this one's as the other
            // calls on one job do (held past the timeout: a Timeout), then say its status.
            let what = format!("the {op}");
            one_job(&mut conn, id, &what, store::JOB_LOCK_ONE, &[&id.0])?;
            return Err(wrong_state(&mut conn, id, op, action.rule()));
        }
        Ok(())
    }

    /// How many jobs [`prune`](Self::prune) would delete now, without deleting any.
    pub fn prune_count(&self, retention: &Retention) -> Result<u64> {
        retention.validate()?;
        // No status given means every finished one, as `prune` reads it.
        let statuses: Vec<&str> = if retention.statuses.is_empty() {
            JobStatus::ALL
                .iter()
                .filter(|s| s.is_finished())
                .map(|s| s.as_str())
                .collect()
        } else {
            retention.statuses.iter().map(|s| s.as_str()).collect()
        };
        let ms = crate::limits::age_millis(retention.older_than);
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "counting jobs to prune",
            store::JOBS_PRUNE_COUNT,
            &[&statuses, &ms],
        )?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    /// Deletes finished jobs as `retention` says, in batches (see [`Retention`]).
    pub fn prune(&self, retention: &Retention) -> Result<PruneReport> {
        retention.validate()?;
        let mut conn = self.conn()?;
        let report = retention::prune(&mut conn, retention, || true)?;
        log::info!("prune by the admin API: {report}");
        Ok(report)
    }
}

/// A [`JobDetail`] from a row of [`store::JOB_GET`]'s columns (or a statement with the
/// same first 27).
pub(crate) fn detail_from_row(row: &postgres::Row) -> Result<JobDetail> {
    let mut job = job_from_row(row)?;
    let errors = json_column(row, 15).map(parse_errors).unwrap_or_default();
    job.last_error = errors.last().map(|e| e.error.clone());
    Ok(JobDetail {
        job,
        errors,
        worker_name: row.get(16),
        periodic_id: row.get(17),
        periodic_instant: row.get(18),
        output: json_column(row, 19),
        progress: json_column(row, 20),
        progress_at: row.get(21),
        snoozes: row.get(22),
        max_attempts: row.get(23),
        tags: row.get::<_, Option<Vec<String>>>(24).unwrap_or_default(),
        meta: json_column(row, 25),
        blocked_by: row.get::<_, Option<i64>>(26).map(JobId),
        dependencies: Vec::new(),
        dependents: Vec::new(),
        batch_id: None,
    })
}

/// Fills the dependencies and dependents of `detail` (schema version 23), and whether it
/// waits for them: one more query, made only for a job that has dependencies or dependents.
pub(crate) fn read_dependencies(
    conn: &mut crate::Connection,
    detail: &mut JobDetail,
) -> Result<()> {
    let id = detail.job.id;
    let rows = conn.query_named(
        "reading the dependencies of a job",
        store::JOB_DEPENDENCY_INFO,
        &[&id.0],
    )?;
    let Some(r) = rows.first() else {
        return Ok(());
    };
    let ids: Vec<i64> = r.get(0);
    let any: Vec<bool> = r.get(1);
    let statuses: Vec<Option<String>> = r.get(2);
    detail.dependencies = ids
        .into_iter()
        .zip(any)
        .zip(statuses)
        .map(|((id, any_outcome), status)| DependencyInfo {
            id: JobId(id),
            any_outcome,
            status: status.and_then(|s| s.parse().ok()),
        })
        .collect();
    detail.dependents = r.get::<_, Vec<i64>>(3).into_iter().map(JobId).collect();
    detail.job.waiting_for_dependencies = r.get(4);
    Ok(())
}

fn not_found(id: JobId) -> Error {
    Error::new(ErrorKind::NotFound, format!("job {id} not found"))
}

/// How long a call of the admin API on one job waits for a row lock another session holds
/// (the job's own row, or one its change reaches: the dependents a cancel settles, the
/// dependencies a retry reads) before giving up.
const ONE_JOB_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '1s'";

/// Runs one statement of a call on job `id` in a transaction of its own under
/// [`ONE_JOB_LOCK_TIMEOUT`]; a lock it could not get is a [`Timeout`](ErrorKind::Timeout)
/// error saying so, and nothing is changed.
fn one_job(
    conn: &mut crate::Connection,
    id: JobId,
    what: &str,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<Vec<postgres::Row>> {
    query_in_tx(conn, ONE_JOB_LOCK_TIMEOUT, what, sql, params).map_err(|e| {
        if e.sqlstate() == Some("55P03") && !conn.is_broken() {
            held_locked(id, what)
        } else {
            e
        }
    })
}

/// Runs `sql` in a transaction of its own after `lock_timeout` (a `SET LOCAL lock_timeout`
/// statement): committed when it succeeds, rolled back (on a link still usable) when not.
fn query_in_tx(
    conn: &mut crate::Connection,
    lock_timeout: &str,
    what: &str,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<Vec<postgres::Row>> {
    conn.begin()?;
    let res = conn
        .batch_execute(lock_timeout)
        .and_then(|()| conn.query_named(what, sql, params));
    match res {
        Ok(rows) => {
            conn.commit()?;
            Ok(rows)
        }
        Err(e) => {
            if !conn.is_broken() {
                let _ = conn.rollback();
            }
            Err(e)
        }
    }
}

fn held_locked(id: JobId, what: &str) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!(
            "job {id} ({what}): gave up waiting for a row another session holds locked (the \
             job's own, or a job that depends on it or that it depends on); nothing was \
             changed: try again once that session's transaction ends (pg_locks and \
             pg_stat_activity show which)"
        ),
    )
    .set_sqlstate("55P03")
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

impl fmt::Display for AbortOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AbortOutcome::Requested => "abort requested",
            AbortOutcome::Cancelled => "cancelled (it was waiting)",
        })
    }
}
