//! Operations on every job a [`JobFilter`] selects: retry, cancel, delete, reschedule,
//! reprioritise ([`BulkAction`]), with a dry run that only counts.
//!
//! Each action touches only the jobs its rule allows (retry: failed, cancelled or aborted;
//! cancel, reschedule, priority: waiting; delete: anything not running); the others that
//! match are counted as skipped. One scan collects the ids the action may touch; then
//! batches of 1,000 ids, each its own statement and transaction, re-check the filter and the
//! rule by primary key, so a job that fails again while the call runs is not retried twice
//! and the call always ends. Rows another transaction holds are skipped, never waited for.
//!
//! A retry goes through `postpone_requeue`, the one way back to `todo` that every other path
//! uses: a job whose queueing lock already has a waiting job, or that the database refuses,
//! is skipped (counted, not an error) and never fails the others.

use std::time::SystemTime;

use serde::Serialize;

use super::filter::{JobFilter, Query};
use super::Admin;
use crate::error::{Error, Result};

/// Rows per statement of a bulk operation.
const BATCH: usize = 1000;

/// What [`Admin::bulk`] does to each job it selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BulkAction {
    /// Failed, cancelled or aborted jobs go back to `todo`, due now, attempts from zero.
    Retry,
    /// Waiting (`todo`) jobs become `cancelled`.
    Cancel,
    /// Jobs that are not running are deleted.
    Delete,
    /// Waiting jobs become due at this time.
    Reschedule(SystemTime),
    /// Waiting jobs get this priority.
    Priority(i32),
}

impl BulkAction {
    /// `retry`, `cancel`, `delete`, `reschedule`, `priority`.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
            BulkAction::Reschedule(_) => "reschedule",
            BulkAction::Priority(_) => "priority",
        }
    }

    /// Which jobs the action may touch, as SQL over `postpone_jobs j`.
    pub(crate) fn eligible(self) -> &'static str {
        match self {
            BulkAction::Retry => {
                "j.status IN ('failed', 'cancelled', 'aborted')
   AND (j.queueing_lock IS NULL OR NOT EXISTS (
        SELECT 1 FROM postpone_jobs t WHERE t.queueing_lock = j.queueing_lock AND t.status = 'todo'))"
            }
            BulkAction::Cancel | BulkAction::Reschedule(_) | BulkAction::Priority(_) => {
                "j.status = 'todo'"
            }
            BulkAction::Delete => "j.status <> 'doing'",
        }
    }

    /// The rule, for messages.
    pub(crate) fn rule(self) -> &'static str {
        match self {
            BulkAction::Retry => "only failed, cancelled or aborted jobs can be retried",
            BulkAction::Cancel => "only waiting (todo) jobs can be cancelled; abort a running one",
            BulkAction::Delete => "a running job cannot be deleted; abort it first",
            BulkAction::Reschedule(_) => "only waiting (todo) jobs can be rescheduled",
            BulkAction::Priority(_) => "only waiting (todo) jobs can be reprioritised",
        }
    }

    /// The statement changing the rows whose ids are in the CTE `b`; returns their ids and
    /// queues; `None` for a retry, which is `postpone_requeue`'s.
    fn change(self, q: &mut Query) -> Option<String> {
        Some(match self {
            // Retry goes through postpone_requeue (see `Admin::bulk`).
            BulkAction::Retry => return None,
            BulkAction::Cancel => "UPDATE postpone_jobs j
   SET status = 'cancelled', finished_at = now()
  FROM b WHERE j.id = b.id RETURNING j.id, j.queue"
                .to_owned(),
            BulkAction::Delete => {
                "DELETE FROM postpone_jobs j USING b WHERE j.id = b.id RETURNING j.id, j.queue"
                    .to_owned()
            }
            BulkAction::Reschedule(at) => format!(
                "UPDATE postpone_jobs j SET scheduled_at = {}::timestamptz
  FROM b WHERE j.id = b.id RETURNING j.id, j.queue",
                q.bind(at)
            ),
            BulkAction::Priority(p) => format!(
                "UPDATE postpone_jobs j SET priority = {}::integer
  FROM b WHERE j.id = b.id RETURNING j.id, j.queue",
                q.bind(p)
            ),
        })
    }

    /// Whether workers of the touched queues should be woken.
    fn wakes(self) -> bool {
        matches!(
            self,
            BulkAction::Retry | BulkAction::Reschedule(_) | BulkAction::Priority(_)
        )
    }
}

/// What [`Admin::bulk`] did, or would do with a dry run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BulkReport {
    /// `retry`, `cancel`, `delete`, `reschedule` or `priority`.
    pub action: &'static str,
    /// True for a dry run: nothing was changed.
    pub dry_run: bool,
    /// Jobs the filter matched when the call began.
    pub matched: u64,
    /// Jobs changed (for a dry run: that the action would change now).
    pub changed: u64,
    /// Jobs that matched but that the action does not touch (wrong status, a queueing lock
    /// already waiting, or changed by someone else meanwhile).
    pub skipped: u64,
}

impl std::fmt::Display for BulkReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = match self.action {
            "retry" => "retried",
            "cancel" => "cancelled",
            "delete" => "deleted",
            "reschedule" => "rescheduled",
            _ => "reprioritised",
        };
        if self.dry_run {
            write!(
                f,
                "dry run: {} job(s) match; {} would be {verb}, {} skipped",
                self.matched, self.changed, self.skipped
            )
        } else {
            write!(
                f,
                "{} job(s) matched; {} {verb}, {} skipped",
                self.matched, self.changed, self.skipped
            )
        }
    }
}

impl Admin {
    /// Applies `action` to every job `filter` selects (its limit and cursor are ignored),
    /// or with `dry_run` only counts them. A filter with no condition is refused: select
    /// every job explicitly, with the statuses the action applies to.
    ///
    /// ```no_run
    /// use postpone::{BulkAction, JobFilter, JobStatus};
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let failed = JobFilter::new().status(JobStatus::Failed).task("send_email");
    /// let plan = app.admin().bulk(BulkAction::Retry, &failed, true)?;
    /// println!("{plan}");
    /// let done = app.admin().bulk(BulkAction::Retry, &failed, false)?;
    /// assert!(done.changed <= plan.matched);
    /// # Ok(())
    /// # }
    /// ```
    pub fn bulk(
        &self,
        action: BulkAction,
        filter: &JobFilter,
        dry_run: bool,
    ) -> Result<BulkReport> {
        if filter.is_unfiltered() {
            return Err(Error::invalid(format!(
                "{}: refusing to touch every job; give at least one condition (a status, queue, task...)",
                action.as_str()
            )));
        }
        filter.validate()?;
        if let BulkAction::Reschedule(at) = action {
            crate::limits::check_time("reschedule time", at)?;
        }
        let mut conn = self.conn()?;
        let eligible = action.eligible();
        if dry_run {
            let (matched, eligible) = filter.with_args_fallback(|filter| {
                let mut q = Query::default();
                let cond = filter.conditions(&mut q);
                let sql = format!(
                    "SELECT count(*), count(*) FILTER (WHERE {eligible}) FROM postpone_jobs j WHERE {cond}"
                );
                let rows = conn.query_named("counting jobs", &sql, &q.params())?;
                Ok(rows.first().map_or((0, 0), |r| {
                    (
                        r.get::<_, i64>(0).max(0) as u64,
                        r.get::<_, i64>(1).max(0) as u64,
                    )
                }))
            })?;
            return Ok(BulkReport {
                action: action.as_str(),
                dry_run,
                matched,
                changed: eligible,
                skipped: matched.saturating_sub(eligible),
            });
        }
        // One scan: how many match, and the ids the action may touch (highest first; for a
        // retry lowest first, so that a job's dependencies, which are older, go back to the
        // queue before it is judged).
        let order = if matches!(action, BulkAction::Retry) {
            "ASC"
        } else {
            "DESC"
        };
        let (matched, ids) = filter.with_args_fallback(|filter| {
            let mut q = Query::default();
            let cond = filter.conditions(&mut q);
            let sql = format!(
                "SELECT count(*),
       coalesce(array_agg(j.id ORDER BY j.id {order}) FILTER (WHERE {eligible}), '{{}}')
  FROM postpone_jobs j
 WHERE {cond}"
            );
            let rows = conn.query_named("selecting jobs", &sql, &q.params())?;
            let row = rows
                .first()
                .ok_or_else(|| Error::invalid("selecting jobs: no row"))?;
            Ok((
                row.get::<_, i64>(0).max(0) as u64,
                row.get::<_, Vec<i64>>(1),
            ))
        })?;
        // Then batches by primary key, each re-checking the filter and the rule: a job
        // changed meanwhile (claimed, finished, retried by someone else) is skipped, and no
        // job is touched twice however fast workers send it back.
        let mut changed = 0u64;
        for chunk in ids.chunks(BATCH) {
            changed += filter
                .with_args_fallback(|filter| change_isolating(&mut conn, action, filter, chunk))?;
        }
        log::info!(
            "{} of {matched} matching job(s): {changed} changed by the admin API",
            action.as_str()
        );
        Ok(BulkReport {
            action: action.as_str(),
            dry_run,
            matched,
            changed,
            skipped: matched.saturating_sub(changed),
        })
    }
}

/// How long a statement of a bulk operation waits for a row lock: the rows it changes are
/// taken with `SKIP LOCKED`, but changing them may lock others (the dependents of a job it
/// cancels or deletes, the dependencies of one it retries).
const BULK_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '200ms'";

/// Applies `action` to the jobs of `ids` (one statement); a lock another session holds past
/// [`BULK_LOCK_TIMEOUT`] fails only the half that needs it, down to the one job, which is
/// skipped. Returns how many jobs changed.
fn change_isolating(
    conn: &mut crate::conn::Connection,
    action: BulkAction,
    filter: &JobFilter,
    ids: &[i64],
) -> Result<u64> {
    match change_once(conn, action, filter, ids) {
        Err(e) if e.sqlstate() == Some("55P03") && !conn.is_broken() => {
            if let [id] = ids {
                log::warn!(
                    "{}: job {id} skipped: changing it needs a row another session holds locked",
                    action.as_str()
                );
                return Ok(0);
            }
            let (a, b) = ids.split_at(ids.len() / 2);
            Ok(change_isolating(conn, action, filter, a)?
                + change_isolating(conn, action, filter, b)?)
        }
        r => r,
    }
}

/// One statement changing the jobs of `ids` that still match `filter` and the action's
/// rule, in a transaction of its own under [`BULK_LOCK_TIMEOUT`].
fn change_once(
    conn: &mut crate::conn::Connection,
    action: BulkAction,
    filter: &JobFilter,
    ids: &[i64],
) -> Result<u64> {
    let eligible = action.eligible();
    let mut q = Query::default();
    let cond = filter.conditions(&mut q);
    let chunk_p = q.bind(ids.to_vec());
    let select = format!(
        "WITH c AS (
    SELECT j.id FROM postpone_jobs j
     WHERE j.id = ANY({chunk_p}::bigint[])
       AND {cond}
       AND {eligible}
       FOR UPDATE SKIP LOCKED
), low AS (SELECT min(id) AS id, count(*) AS n, coalesce(array_agg(id), '{{}}') AS ids FROM c)"
    );
    let sql = if let Some(change) = action.change(&mut q) {
        format!(
            "{select},
b AS (SELECT id FROM c),
done AS ({change})
SELECT (SELECT id FROM low), (SELECT n FROM low), count(*),
       (SELECT count(postpone_wake(q.queue))
          FROM (SELECT DISTINCT queue FROM done) q WHERE {wake})
  FROM done",
            wake = action.wakes()
        )
    } else {
        // The one way back to todo (schema 2): a queueing-lock collision or a row the
        // database refuses is reported for that job alone, never fails the batch.
        format!(
            "{select}
SELECT low.id, low.n,
       (SELECT count(*) FROM postpone_requeue(low.ids, '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', true) r
         WHERE r.outcome = 'todo')
  FROM low"
        )
    };
    let rows = super::query_in_tx(
        conn,
        BULK_LOCK_TIMEOUT,
        "changing jobs in bulk",
        &sql,
        &q.params(),
    )?;
    Ok(rows.first().map_or(0, |r| r.get::<_, i64>(2).max(0) as u64))
}
