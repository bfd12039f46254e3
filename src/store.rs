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

/// Records the final outcomes of many attempts at once. Arrays: `$1` job ids, `$2` and `$3`
/// the fence of each attempt (the worker identity that claimed it and the attempt number the
/// claim gave it), `$4` outcome (`succeeded`, `failed`, `cancelled`, `aborted`, `delete`),
/// `$5` error text (appended to the job's errors). Returns the ids whose outcome was
/// recorded; a missing id was no longer that attempt's (it was requeued after its worker was
/// presumed dead, and maybe claimed again). Outcomes that put a job back in the queue go
/// through [`JOB_REQUEUE`] instead.
///
/// The plan must drive from the outcomes and reach each row by primary key, whatever the
/// statistics say. The guards are written with `IS NOT DISTINCT FROM`, which no index can
/// serve, so that the planner cannot scan the partial index on `doing` rows instead (it
/// estimates it at one row, then loops over every outcome for every row it finds: O(n²)).
/// Measured per batch of 1,000: with `=` guards, 4.4 s after 20,000 jobs (dead index entries)
/// and 334 ms with a million finished rows; with an `id = ANY($1)` filter, 256 ms; as written,
/// 12-16 ms in both cases.
///
/// Nothing here can collide with a unique index (final statuses are in none), and the error
/// texts are made safe by the caller (no NUL, bounded length).
pub(crate) const JOB_FINISH_BATCH: &str = "
WITH o AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::text[])
        AS o(id, worker, attempt, outcome, error)
), updated AS (
    UPDATE postpone_jobs j
       SET status = o.outcome,
           finished_at = now(),
           errors = CASE WHEN o.error IS NULL THEN j.errors
                         ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(
                             jsonb_build_object('attempt', j.attempts, 'at', now(),
                                                'error', o.error)) END
      FROM o
     WHERE j.id = o.id AND o.outcome <> 'delete'
       AND j.status IS NOT DISTINCT FROM 'doing'
       AND j.worker_id IS NOT DISTINCT FROM o.worker
       AND j.attempts IS NOT DISTINCT FROM o.attempt
    RETURNING j.id
), deleted AS (
    DELETE FROM postpone_jobs j
     USING o
     WHERE j.id = o.id AND o.outcome = 'delete'
       AND j.status IS NOT DISTINCT FROM 'doing'
       AND j.worker_id IS NOT DISTINCT FROM o.worker
       AND j.attempts IS NOT DISTINCT FROM o.attempt
    RETURNING j.id
)
SELECT id FROM updated UNION ALL SELECT id FROM deleted";

/// Puts jobs back in the queue through `postpone_requeue` (schema version 2), the one
/// definition every path back to `todo` uses: arrays `$1` ids, `$2` workers and `$3` attempts
/// (the fences; empty: no guard), `$4` delays in microseconds, `$5` error texts, `$6` whether
/// each attempt is given back. Returns (id, outcome) for each job changed: `todo`, `aborted`
/// (its abort was requested), `superseded` (another job of its queueing lock waits).
pub(crate) const JOB_REQUEUE: &str = "
SELECT job_id, outcome
  FROM postpone_requeue($1::bigint[], $2::bigint[], $3::int[], $4::bigint[], $5::text[],
                        $6::boolean[])";

/// The last resort for an outcome the database refused (a trigger of the user's, say): the
/// attempt `$1`/`$2`/`$3` ends `failed` with error `$4`, a text of ours. Returns its id.
pub(crate) const JOB_FAIL_UNRECORDABLE: &str = "
UPDATE postpone_jobs j
   SET status = 'failed', finished_at = now(),
       errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(
           jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', $4::text))
 WHERE j.id = $1 AND j.status = 'doing' AND j.worker_id = $2 AND j.attempts = $3
RETURNING j.id";

/// Registers a worker; returns its id.
pub(crate) const WORKER_INSERT: &str = "
INSERT INTO postpone_workers (name, host, pid, queues, concurrency)
VALUES ($1, $2, $3, $4, $5)
RETURNING id";

/// Refreshes a worker's heartbeat; 0 rows means the row is gone.
pub(crate) const WORKER_HEARTBEAT: &str =
    "UPDATE postpone_workers SET last_heartbeat = now() WHERE id = $1";

/// Removes workers whose heartbeat is older than `$1` milliseconds (never `$2`, the caller)
/// and requeues their running jobs, plus any running job whose worker row has been gone for
/// as long, through `postpone_rescue` (schema version 2): one job can never fail the rescue
/// of the others. Returns (workers removed, ids of the jobs touched, their outcomes).
pub(crate) const WORKER_RESCUE: &str = "SELECT dead, ids, outcomes FROM postpone_rescue($1, $2)";

/// At shutdown: puts every job still `doing` under worker `$1` back in the queue (the
/// attempts of `$2`, never started, are given back; the others get the note `$3`), through
/// `postpone_retire`, and deletes the worker row. Returns (id, outcome) per job touched.
pub(crate) const WORKER_RETIRE: &str =
    "SELECT job_id, outcome FROM postpone_retire($1, $2::bigint[], $3)";

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
    SELECT j.id, j.attempts
      FROM postpone_jobs j
     WHERE j.worker_id = $1 AND j.status = 'doing'
       AND j.started_at < $3::timestamptz
       AND NOT (j.id = ANY($2::bigint[]))
)
SELECT coalesce(array_agg(r.job_id), '{}'::bigint[])
  FROM postpone_requeue(ARRAY(SELECT id FROM lost ORDER BY id),
                        ARRAY(SELECT $1::bigint FROM lost ORDER BY id),
                        ARRAY(SELECT attempts FROM lost ORDER BY id),
                        '{}', '{}',
                        ARRAY(SELECT true FROM lost ORDER BY id)) r";

/// Status, worker and attempts of the jobs `$1` (to explain outcomes a guarded update did not
/// apply).
pub(crate) const JOB_STATES: &str =
    "SELECT id, status, worker_id, attempts FROM postpone_jobs WHERE id = ANY($1::bigint[])";

/// Running jobs of worker `$1` whose abort was requested: the truth behind every abort (a
/// notification only makes the worker look sooner), and the backstop for missed ones.
pub(crate) const JOB_ABORTS_POLL: &str =
    "SELECT id FROM postpone_jobs WHERE worker_id = $1 AND status = 'doing' AND abort_requested";

// ---------------------------------------------------------------------------------------
// Operations: periodic tasks, retention and the admin API (periodic.rs, retention.rs,
// admin.rs). Admin statements that filter on optional values are run unprepared (planned
// with their values), the others are cached like the worker's.
// ---------------------------------------------------------------------------------------

/// Name of the primary key of `postpone_periodic`: a unique violation on it means another
/// worker deferred the instant first.
pub(crate) const PERIODIC_PKEY: &str = "postpone_periodic_pkey";

/// The latest instant of periodic task `$1`, id `$2`, already deferred.
pub(crate) const PERIODIC_LATEST: &str =
    "SELECT max(instant) FROM postpone_periodic WHERE task = $1 AND periodic_id = $2";

/// Defers instant `$3` of periodic task `$1` (id `$2`) in one statement: the job (queue
/// `$4`, args `$5`, priority `$6`, lock `$7`, queueing lock `$8`, scheduled at the instant)
/// and the record of the instant. Returns no row if the instant was deferred already; one
/// row with the job id, or with NULL when a job of the queueing lock was still waiting.
/// Two workers racing past the NOT EXISTS both insert a job, but only one record: the
/// other statement fails on the primary key and its job is rolled back with it.
pub(crate) const PERIODIC_DEFER: &str = "
WITH fresh AS (
    SELECT 1 WHERE NOT EXISTS (
        SELECT 1 FROM postpone_periodic
         WHERE task = $1::text AND periodic_id = $2::text AND instant = $3::timestamptz)
), job AS (
    INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at)
    SELECT $4::text, $1::text, $5::jsonb, $6::int, $7::text, $8::text, $3::timestamptz
      FROM fresh
    ON CONFLICT (queueing_lock) WHERE status = 'todo' DO NOTHING
    RETURNING id
)
INSERT INTO postpone_periodic (task, periodic_id, instant, job_id)
SELECT $1::text, $2::text, $3::timestamptz, (SELECT id FROM job) FROM fresh
RETURNING job_id";

/// Deletes up to `$3` finished jobs whose status is in `$1` and that finished more than
/// `$2` milliseconds ago. Rows another transaction holds are skipped, not waited for.
pub(crate) const JOBS_PRUNE: &str = "
DELETE FROM postpone_jobs
 WHERE id = ANY(ARRAY(
       SELECT id FROM postpone_jobs
        WHERE status IN ('succeeded', 'failed', 'cancelled', 'aborted')
          AND status = ANY($1::text[])
          AND finished_at < now() - $2::bigint * interval '1 millisecond'
        LIMIT $3
          FOR UPDATE SKIP LOCKED))";

/// Deletes up to `$2` records of periodic instants older than `$1` milliseconds.
pub(crate) const PERIODIC_PRUNE: &str = "
DELETE FROM postpone_periodic
 WHERE (task, periodic_id, instant) IN (
       SELECT task, periodic_id, instant FROM postpone_periodic
        WHERE instant < now() - $1::bigint * interval '1 millisecond'
        LIMIT $2
          FOR UPDATE SKIP LOCKED)";

/// The columns of a job as the admin API shows it (`admin::JobInfo::from_row`).
macro_rules! job_columns {
    () => {
        "j.id, j.queue, j.task, j.args, j.status, j.priority, j.lock, j.queueing_lock, \
         j.scheduled_at, j.attempts, j.worker_id, j.abort_requested, j.created_at, \
         j.started_at, j.finished_at"
    };
}

/// Lists jobs, newest first. Each filter applies when its parameter is not NULL (not
/// empty for `$4`): `$1` id, `$2` queue, `$3` task, `$4` statuses, `$5` lock, `$6`
/// queueing lock; at most `$7` rows.
pub(crate) const JOBS_LIST: &str = concat!(
    "SELECT ",
    job_columns!(),
    "
  FROM postpone_jobs j
 WHERE ($1::bigint IS NULL OR j.id = $1)
   AND ($2::text IS NULL OR j.queue = $2)
   AND ($3::text IS NULL OR j.task = $3)
   AND (cardinality($4::text[]) = 0 OR j.status = ANY($4))
   AND ($5::text IS NULL OR j.lock = $5)
   AND ($6::text IS NULL OR j.queueing_lock = $6)
 ORDER BY j.id DESC
 LIMIT $7"
);

/// One job with its errors, its worker's name and the periodic instant it was deferred for.
pub(crate) const JOB_GET: &str = concat!(
    "SELECT ",
    job_columns!(),
    ", j.errors, w.name,
       (SELECT p.periodic_id FROM postpone_periodic p WHERE p.job_id = j.id LIMIT 1),
       (SELECT p.instant FROM postpone_periodic p WHERE p.job_id = j.id LIMIT 1)
  FROM postpone_jobs j
  LEFT JOIN postpone_workers w ON w.id = j.worker_id
 WHERE j.id = $1"
);

/// Running jobs whose worker has not sent a heartbeat for `$1` milliseconds, or is gone.
pub(crate) const JOBS_STALLED: &str = concat!(
    "SELECT ",
    job_columns!(),
    "
  FROM postpone_jobs j
 WHERE j.status = 'doing'
   AND NOT EXISTS (SELECT 1 FROM postpone_workers w
                    WHERE w.id = j.worker_id
                      AND w.last_heartbeat >= now() - $1::bigint * interval '1 millisecond')
 ORDER BY j.id"
);

/// The status of job `$1` (to explain why an operation did nothing).
pub(crate) const JOB_STATUS: &str = "SELECT status FROM postpone_jobs WHERE id = $1";

/// Puts failed, cancelled or aborted job `$1` back to `todo`, due now, with its attempts
/// counted from zero again (its errors are kept), and wakes the workers of its queue, through
/// `postpone_requeue`. Returns one row: outcome `todo`, or `collision` when a job of its
/// queueing lock already waits (nothing changed); no row if the job was in another state.
pub(crate) const JOB_RETRY: &str = "
SELECT outcome FROM postpone_requeue(ARRAY[$1::bigint], '{}', '{}', '{}', '{}', '{}', true)";

/// Cancels job `$1` if it is waiting (`todo`).
pub(crate) const JOB_CANCEL: &str = "
UPDATE postpone_jobs SET status = 'cancelled', finished_at = now()
 WHERE id = $1 AND status = 'todo'
RETURNING id";

/// Deletes job `$1` if it is waiting (`todo`).
pub(crate) const JOB_CANCEL_DELETE: &str =
    "DELETE FROM postpone_jobs WHERE id = $1 AND status = 'todo' RETURNING id";

/// Aborts job `$1`: a waiting job is cancelled; a running one gets `abort_requested` and
/// its worker is told by NOTIFY (`abort:<id>`; workers also poll the flag). Returns the
/// job's status after the call (`cancelled` or `doing`); no row if it was neither waiting
/// nor running.
pub(crate) const JOB_ABORT: &str = "
WITH a AS (
    UPDATE postpone_jobs
       SET status = CASE WHEN status = 'todo' THEN 'cancelled' ELSE status END,
           finished_at = CASE WHEN status = 'todo' THEN now() ELSE finished_at END,
           abort_requested = (status = 'doing')
     WHERE id = $1 AND status IN ('todo', 'doing')
    RETURNING id, status
)
SELECT a.status,
       (SELECT count(pg_notify('postpone', 'abort:' || a2.id)) FROM a a2
         WHERE a2.status = 'doing')
  FROM a";

/// Jobs per queue: due, scheduled later, running, and each finished status; and the age in
/// seconds of the oldest due job.
pub(crate) const QUEUE_COUNTS: &str = "
SELECT queue,
       count(*) FILTER (WHERE status = 'todo' AND scheduled_at <= now()),
       count(*) FILTER (WHERE status = 'todo' AND scheduled_at > now()),
       count(*) FILTER (WHERE status = 'doing'),
       count(*) FILTER (WHERE status = 'succeeded'),
       count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE status = 'cancelled'),
       count(*) FILTER (WHERE status = 'aborted'),
       extract(epoch FROM now() - min(scheduled_at)
                 FILTER (WHERE status = 'todo' AND scheduled_at <= now()))::float8
  FROM postpone_jobs
 GROUP BY queue
 ORDER BY queue";

/// Registered workers with the age of their heartbeat (seconds) and their running jobs.
pub(crate) const WORKERS_LIST: &str = "
SELECT w.id, w.name, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_heartbeat,
       extract(epoch FROM now() - w.last_heartbeat)::float8,
       (SELECT count(*) FROM postpone_jobs j WHERE j.worker_id = w.id AND j.status = 'doing')
  FROM postpone_workers w
 ORDER BY w.id";

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
