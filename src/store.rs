//! Every SQL statement the library runs, in one place, named `noun_verb`.
//!
//! Statements whose text is fixed are `&'static str` and are prepared once per connection.
//! The claim depends on the worker's queues and task filter, so [`job_claim_sql`] builds it
//! once per worker.
//!
//! Guards live in the SQL, not in the callers: a completion only touches a row that is still
//! `doing` *and* still held by the completing worker; a rescue only touches rows still
//! `doing` under a worker it deletes in the same statement. Neither can overwrite a job that
//! finished meanwhile.

/// The channel every worker listens on. Payloads: `job:<queue>` (new work), `abort:<id>`.
pub(crate) const CHANNEL: &str = "postpone";

/// Inserts one job. `$7` an absolute time, else `$8` microseconds from the server's now.
pub(crate) const JOB_INSERT: &str = "
INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at)
VALUES ($1, $2, $3, $4, $5, $6,
        COALESCE($7::timestamptz, now() + $8::bigint * interval '1 microsecond'))
RETURNING id";

/// Inserts many jobs in one statement; ids come back in input order.
pub(crate) const JOB_INSERT_BATCH: &str = "
INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at)
SELECT u.queue, u.task, u.args, u.priority, u.lock, u.queueing_lock,
       COALESCE(u.at, now() + u.delay_us * interval '1 microsecond')
  FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::int[], $5::text[], $6::text[],
              $7::timestamptz[], $8::bigint[])
       WITH ORDINALITY AS u(queue, task, args, priority, lock, queueing_lock, at, delay_us, n)
 ORDER BY u.n
RETURNING id";

/// Name of the unique index behind `AlreadyEnqueued`.
pub(crate) const QUEUEING_LOCK_INDEX: &str = "postpone_jobs_queueing_lock_idx";

/// Builds the claim for a worker: takes up to `$2` due jobs for worker `$1`, highest priority
/// first then oldest (the ids are collected into an array so that the update reaches them by
/// primary key, whatever the generic plan guesses of `LIMIT $2`), skipping rows other claimers hold, and never a job whose lock has a
/// running job or an older pending one. `$3` (queues) and `$4` (task names) are present only
/// when the worker filters on them. Nothing is claimed if the worker's row is gone (it was
/// declared dead): it must register again first.
pub(crate) fn job_claim_sql(filter_queues: bool, filter_tasks: bool) -> String {
    let mut filters = String::new();
    let mut n = 3;
    if filter_queues {
        filters.push_str(&format!("\n          AND j.queue = ANY(${n}::text[])"));
        n += 1;
    }
    if filter_tasks {
        filters.push_str(&format!("\n          AND j.task = ANY(${n}::text[])"));
    }
    format!(
        "
UPDATE postpone_jobs j
   SET status = 'doing', worker_id = $1, attempts = j.attempts + 1, started_at = now()
 WHERE j.id = ANY(ARRAY(
       SELECT j.id
         FROM postpone_jobs j
        WHERE j.status = 'todo'
          AND j.scheduled_at <= now(){filters}
          AND (j.lock IS NULL OR NOT EXISTS (
               SELECT 1 FROM postpone_jobs e
                WHERE e.lock = j.lock
                  AND e.status IN ('todo', 'doing')
                  AND (e.status = 'doing' OR e.id < j.id)))
        ORDER BY j.priority DESC, j.id
        LIMIT $2
          FOR UPDATE SKIP LOCKED))
   AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = $1)
RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock, j.abort_requested"
    )
}

/// Records the outcomes of many jobs of worker `$1` at once. Arrays: `$2` ids, `$3` outcome
/// (`succeeded`, `failed`, `cancelled`, `aborted`, `retry`, `release`, `delete`), `$4` retry
/// delay in microseconds, `$5` error text (appended to the job's errors). Returns the ids
/// whose outcome was recorded; a missing id was no longer this worker's.
pub(crate) const JOB_FINISH_BATCH: &str = "
WITH o AS (
    SELECT * FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::text[])
        AS o(id, outcome, delay_us, error)
), updated AS (
    UPDATE postpone_jobs j
       SET status = CASE WHEN o.outcome IN ('retry', 'release') THEN 'todo' ELSE o.outcome END,
           scheduled_at = CASE WHEN o.outcome IN ('retry', 'release')
                               THEN now() + o.delay_us * interval '1 microsecond'
                               ELSE j.scheduled_at END,
           attempts = CASE WHEN o.outcome = 'release' THEN j.attempts - 1 ELSE j.attempts END,
           worker_id = CASE WHEN o.outcome IN ('retry', 'release') THEN NULL ELSE j.worker_id END,
           started_at = CASE WHEN o.outcome = 'release' THEN NULL ELSE j.started_at END,
           finished_at = CASE WHEN o.outcome IN ('retry', 'release') THEN NULL ELSE now() END,
           abort_requested = CASE WHEN o.outcome IN ('retry', 'release') THEN false
                                  ELSE j.abort_requested END,
           errors = CASE WHEN o.error IS NULL THEN j.errors
                         ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(
                             jsonb_build_object('attempt', j.attempts, 'at', now(),
                                                'error', o.error)) END
      FROM o
     WHERE j.id = o.id AND o.outcome <> 'delete'
       AND j.status = 'doing' AND j.worker_id = $1
    RETURNING j.id
), deleted AS (
    DELETE FROM postpone_jobs j
     USING o
     WHERE j.id = o.id AND o.outcome = 'delete'
       AND j.status = 'doing' AND j.worker_id = $1
    RETURNING j.id
)
SELECT id FROM updated UNION ALL SELECT id FROM deleted";

/// Registers a worker; returns its id.
pub(crate) const WORKER_INSERT: &str = "
INSERT INTO postpone_workers (name, host, pid, queues, concurrency)
VALUES ($1, $2, $3, $4, $5)
RETURNING id";

/// Registers a worker again under the id it had (after it was declared dead while alive).
pub(crate) const WORKER_REINSERT: &str = "
INSERT INTO postpone_workers (id, name, host, pid, queues, concurrency)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO UPDATE SET last_heartbeat = now()";

/// Refreshes a worker's heartbeat; 0 rows means the row is gone.
pub(crate) const WORKER_HEARTBEAT: &str =
    "UPDATE postpone_workers SET last_heartbeat = now() WHERE id = $1";

/// Removes workers whose heartbeat is older than `$1` milliseconds (never `$2`, the caller)
/// and puts their running jobs back to `todo` in the same statement, plus any running job
/// whose worker row has been gone for as long. Attempts already counted stay counted. Wakes
/// listening workers. Returns (workers removed, job ids requeued).
pub(crate) const WORKER_RESCUE: &str = "
WITH dead AS (
    DELETE FROM postpone_workers
     WHERE last_heartbeat < now() - $1::bigint * interval '1 millisecond' AND id <> $2
    RETURNING id, name
), rescued AS (
    UPDATE postpone_jobs j
       SET status = 'todo', worker_id = NULL, started_at = NULL, scheduled_at = now(),
           errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempts, 'at', now(),
               'error', format('worker %s (id %s) stopped sending heartbeats while running this job; requeued', d.name, d.id)))
      FROM dead d
     WHERE j.worker_id = d.id AND j.status = 'doing'
    RETURNING j.id, j.queue
), orphans AS (
    UPDATE postpone_jobs j
       SET status = 'todo', worker_id = NULL, started_at = NULL, scheduled_at = now(),
           errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempts, 'at', now(),
               'error', format('worker id %s vanished while running this job; requeued', j.worker_id)))
     WHERE j.status = 'doing'
       AND j.started_at < now() - $1::bigint * interval '1 millisecond'
       AND NOT EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = j.worker_id)
    RETURNING j.id, j.queue
), requeued AS (
    SELECT id, queue FROM rescued UNION ALL SELECT id, queue FROM orphans
)
SELECT (SELECT count(*) FROM dead),
       coalesce((SELECT array_agg(id) FROM requeued), '{}'::bigint[]),
       (SELECT count(pg_notify('postpone', 'job:' || q.queue))
          FROM (SELECT DISTINCT queue FROM requeued) q)";

/// At shutdown: puts every job still `doing` under worker `$1` back to `todo` (jobs in `$2`
/// never started: their attempt is given back), wakes listening workers, and deletes the
/// worker row. Returns the number of jobs requeued.
pub(crate) const WORKER_RETIRE: &str = "
WITH released AS (
    UPDATE postpone_jobs j
       SET status = 'todo', worker_id = NULL, started_at = NULL, abort_requested = false,
           attempts = CASE WHEN j.id = ANY($2::bigint[]) THEN j.attempts - 1 ELSE j.attempts END
     WHERE j.worker_id = $1 AND j.status = 'doing'
    RETURNING j.id, j.queue
), gone AS (
    DELETE FROM postpone_workers WHERE id = $1
)
SELECT count(*), (SELECT count(pg_notify('postpone', 'job:' || q.queue))
                    FROM (SELECT DISTINCT queue FROM released) q)
  FROM released";

/// The database's clock minus `$1` milliseconds: the cutoff of [`JOB_LOST_CLAIMS_RELEASE`],
/// read before the worker takes the set of jobs it holds.
pub(crate) const LOST_CLAIMS_CUTOFF: &str = "SELECT now() - $1::bigint * interval '1 millisecond'";

/// Gives back the jobs `doing` under worker `$1` that it does not hold (`$2`): a claim that
/// committed but whose reply was lost (connection reset or stranded) left them there, and
/// no rescue would ever touch them while the worker lives. Only rows claimed before `$3`
/// (see [`LOST_CLAIMS_CUTOFF`]), so a claim whose reply is still on its way is never
/// touched. They never ran: their attempt is given back. Wakes listening workers. Returns
/// the ids given back.
pub(crate) const JOB_LOST_CLAIMS_RELEASE: &str = "
WITH lost AS (
    UPDATE postpone_jobs j
       SET status = 'todo', worker_id = NULL, started_at = NULL,
           attempts = greatest(j.attempts - 1, 0)
     WHERE j.worker_id = $1 AND j.status = 'doing'
       AND j.started_at < $3::timestamptz
       AND NOT (j.id = ANY($2::bigint[]))
    RETURNING j.id, j.queue
)
SELECT coalesce((SELECT array_agg(id) FROM lost), '{}'::bigint[]),
       (SELECT count(pg_notify('postpone', 'job:' || q.queue))
          FROM (SELECT DISTINCT queue FROM lost) q)";

/// Running jobs of worker `$1` whose abort was requested (the backstop for missed NOTIFYs).
pub(crate) const JOB_ABORTS_POLL: &str =
    "SELECT id FROM postpone_jobs WHERE worker_id = $1 AND status = 'doing' AND abort_requested";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_numbers_its_parameters_in_order() {
        let both = job_claim_sql(true, true);
        assert!(both.contains("j.queue = ANY($3::text[])"));
        assert!(both.contains("j.task = ANY($4::text[])"));
        let tasks_only = job_claim_sql(false, true);
        assert!(tasks_only.contains("j.task = ANY($3::text[])"));
        assert!(!tasks_only.contains("j.queue = ANY"));
        let none = job_claim_sql(false, false);
        assert!(!none.contains("queue = ANY") && !none.contains("task = ANY"));
    }
}
