//! What a job reports and what a waiter reads: progress, output, dependencies' outcomes,
//! and the waiters' registrations.

/// Records the progress `$2` of job `$1`, if it still runs as attempt `$3`.
pub(crate) const JOB_PROGRESS_SET: &str = "
UPDATE postpone_jobs SET progress = $2::jsonb, progress_at = now()
 WHERE id = $1 AND status = 'doing' AND attempts = $3";

/// The periodic instant job `$1` was deferred for.
pub(crate) const JOB_PERIODIC_INSTANT: &str =
    "SELECT instant FROM postpone_periodic WHERE job_id = $1 LIMIT 1";

/// The dependencies of job `$1`, by id: id, status (the row's, else the
/// outcome recorded when it finished; NULL or 'deleted' when it was deleted before), output.
pub(crate) const JOB_DEPENDENCIES: &str = "
SELECT d.dep_id, coalesce(j.status, d.outcome), j.output
  FROM postpone_deps d LEFT JOIN postpone_jobs j ON j.id = d.dep_id
 WHERE d.job_id = $1
 ORDER BY d.dep_id";

/// Status, output, progress and its time, and errors of job `$1` (what a waiter reads).
pub(crate) const JOB_RESULT: &str = "
SELECT CASE WHEN status = 'doing' AND started_at IS NULL
            THEN 'todo' ELSE status END,
       output, progress, progress_at, errors FROM postpone_jobs WHERE id = $1";

/// Registers this session as a waiter for job `$1` (its completion then notifies the done
/// channel), first deleting waiter rows whose session ended more than a minute ago without
/// removing them.
pub(crate) const WAITER_INSERT: &str = "WITH gone AS (
             DELETE FROM postpone_waiters w
              WHERE w.since < now() - interval '1 minute'
                AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.backend))
         INSERT INTO postpone_waiters (job_id) VALUES ($1)";

/// Removes this session's waiter row for job `$1`.
pub(crate) const WAITER_DELETE: &str =
    "DELETE FROM postpone_waiters WHERE job_id = $1 AND backend = pg_backend_pid()";
