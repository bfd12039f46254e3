//! Deferring jobs: inserts (one, many, unique, with dependencies), the names of the
//! constraints a defer can hit, and batches.

/// Inserts one job. `$7` an absolute time, else `$8` microseconds from the server's now; `$9`
/// its own attempt limit, `$10` its tags and `$11` its metadata, or NULLs; its deadline:
/// `$12` a time, else `$13` microseconds from now, or neither (none). `$1`..`$6` queue, task,
/// args, priority, lock, queueing lock. Returns the new id; a second waiting job of the same
/// queueing lock fails on [`QUEUEING_LOCK_INDEX`].
pub(crate) const JOB_INSERT: &str = "
INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at,
                           max_attempts, tags, meta, expires_at)
VALUES ($1, $2, $3, $4, $5, $6,
        COALESCE($7::timestamptz, now() + $8::bigint * interval '1 microsecond'), $9::int,
        $10::text[], $11::jsonb,
        COALESCE($12::timestamptz, now() + $13::bigint * interval '1 microsecond'))
RETURNING id";

/// [`JOB_INSERT`] for a job due now, inserted outside any transaction of the caller's: the
/// insert trigger sends no notification (`postpone.quiet_insert` is set for this transaction
/// only), and [`WAKE_QUEUE`] follows in a transaction of its own.
pub(crate) const JOB_INSERT_QUIET: &str = "
INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at,
                           max_attempts, tags, meta, expires_at)
SELECT $1::text, $2::text, $3::json, $4::int, $5::text, $6::text,
       COALESCE($7::timestamptz, now() + $8::bigint * interval '1 microsecond'), $9::int,
       $10::text[], $11::jsonb,
       COALESCE($12::timestamptz, now() + $13::bigint * interval '1 microsecond')
  FROM (SELECT set_config('postpone.quiet_insert', 'on', true)) q
RETURNING id";

/// Wakes the workers of queue `$1` (`job:<queue>` on the workers' channel).
pub(crate) const WAKE_QUEUE: &str = "SELECT postpone_wake($1::text)";

/// Inserts many jobs in one statement (the columns of [`JOB_INSERT`] as arrays); ids come
/// back in input order.
pub(crate) const JOB_INSERT_BATCH: &str = "
INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at,
                           max_attempts, tags, meta, expires_at)
SELECT u.queue, u.task, u.args, u.priority, u.lock, u.queueing_lock,
       COALESCE(u.at, now() + u.delay_us * interval '1 microsecond'), u.max_attempts,
       CASE WHEN u.tags IS NOT NULL
            THEN ARRAY(SELECT jsonb_array_elements_text(u.tags)) END,
       u.meta,
       COALESCE(u.expires_at, now() + u.expires_in_us * interval '1 microsecond')
  FROM unnest($1::text[], $2::text[], $3::json[], $4::int[], $5::text[], $6::text[],
              $7::timestamptz[], $8::bigint[], $9::int[], $10::jsonb[], $11::jsonb[],
              $12::timestamptz[], $13::bigint[])
       WITH ORDINALITY AS u(queue, task, args, priority, lock, queueing_lock, at, delay_us,
                            max_attempts, tags, meta, expires_at, expires_in_us, n)
 ORDER BY u.n
RETURNING id";

/// Inserts jobs with dependencies through `postpone_defer_jobs`, in one
/// statement: the columns of [`JOB_INSERT_BATCH`], then the dependencies as three aligned
/// arrays: `$12` the position (1-based) of the job that waits, `$13` the id of the job it
/// waits for, `$14` whether any outcome of that job will do (`after_finished`) or it must
/// succeed (`after`); `$15` and `$16` the deadlines as in [`JOB_INSERT_BATCH`]. Ids come back in input order. A dependency that does not exist fails the
/// statement with [`DEPENDENCY_CONSTRAINT`].
pub(crate) const JOB_INSERT_AFTER: &str = "
SELECT id FROM postpone_defer_jobs(
    $1::text[], $2::text[], $3::json[], $4::int[], $5::text[], $6::text[],
    ARRAY(SELECT COALESCE(u.at, now() + u.delay_us * interval '1 microsecond')
            FROM unnest($7::timestamptz[], $8::bigint[]) WITH ORDINALITY AS u(at, delay_us, n)
           ORDER BY u.n),
    $9::int[], $10::jsonb[], $11::jsonb[], $12::int[], $13::bigint[], $14::bool[],
    ARRAY(SELECT COALESCE(e.at, now() + e.us * interval '1 microsecond')
            FROM unnest($15::timestamptz[], $16::bigint[]) WITH ORDINALITY AS e(at, us, n)
           ORDER BY e.n)) AS id";

/// The constraint name of the error a defer gets for a dependency that does not exist.
pub(crate) const DEPENDENCY_CONSTRAINT: &str = "postpone_deps_dependency";

/// Name of the unique index behind `AlreadyEnqueued`.
pub(crate) const QUEUEING_LOCK_INDEX: &str = "postpone_jobs_queueing_lock_idx";

/// The constraint the insert trigger names when a job's arguments are over the
/// installation's limit (`postpone_settings.max_args_bytes`, schema version 27): SQLSTATE
/// 54000, which `Error::from_db` reports as `InvalidInput`.
pub(crate) const MAX_ARGS_CONSTRAINT: &str = "postpone_max_args_bytes";

/// Inserts a unique job: the parameters of [`JOB_INSERT`], then `$14` the
/// scope of its key (`w`, `r` or `s`), `$15` whether the queue is part of the key, `$16` the
/// period in microseconds (NULL: none). A waiting-only key (`w`) goes in `queueing_lock`,
/// the others in `unique_key`. A conflict inserts nothing: returns (NULL, key), else (id, key).
pub(crate) const JOB_INSERT_UNIQUE: &str = "
WITH k AS (
    SELECT s.at, postpone_unique_key($14::text, $2::text, CASE WHEN $15::bool THEN $1::text END,
                                     $3::json::jsonb, $16::bigint, s.at) AS key
      FROM (SELECT COALESCE($7::timestamptz, now() + $8::bigint * interval '1 microsecond') AS at) s
), ins AS (
    INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at,
                               max_attempts, tags, meta, unique_key, expires_at)
    SELECT $1, $2, $3, $4, $5,
           CASE WHEN $14::text = 'w' THEN k.key ELSE $6::text END,
           k.at, $9::int, $10::text[], $11::jsonb,
           CASE WHEN $14::text = 'w' THEN NULL ELSE k.key END,
           COALESCE($12::timestamptz, now() + $13::bigint * interval '1 microsecond')
      FROM k
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT (SELECT id FROM ins), k.key FROM k";

/// The job that holds unique key `$1` of scope `w` (a waiting job with it as queueing lock).
pub(crate) const JOB_UNIQUE_HOLDER_W: &str = "
SELECT id FROM postpone_jobs WHERE queueing_lock = $1 AND status = 'todo' LIMIT 1";

/// The job that holds unique key `$1` of scope `r` (waiting or running).
pub(crate) const JOB_UNIQUE_HOLDER_R: &str = "
SELECT id FROM postpone_jobs
 WHERE unique_key = $1 AND status IN ('todo', 'doing') AND unique_key IS NOT NULL LIMIT 1";

/// The job that holds unique key `$1` of scope `s` (waiting, running or succeeded).
pub(crate) const JOB_UNIQUE_HOLDER_S: &str = "
SELECT id FROM postpone_jobs
 WHERE unique_key = $1 AND status IN ('todo', 'doing', 'succeeded') AND unique_key LIKE 's:%'
 LIMIT 1";

/// A waiting job that holds queueing lock `$1`.
pub(crate) const JOB_QUEUEING_LOCK_HOLDER: &str = "
SELECT id FROM postpone_jobs WHERE queueing_lock = $1 AND status = 'todo' LIMIT 1";

/// A new batch row; its id.
pub(crate) const BATCH_INSERT: &str = "INSERT INTO postpone_batches DEFAULT VALUES RETURNING id";

/// Batch `$1` gets its members `$2` (jobs and callbacks), its total `$3` and its callbacks
/// `$4` (on_complete) and `$5` (on_success).
pub(crate) const BATCH_OPEN: &str = "
WITH m AS (UPDATE postpone_jobs SET batch_id = $1 WHERE id = ANY($2::bigint[]))
UPDATE postpone_batches SET total = $3, on_complete = $4, on_success = $5 WHERE id = $1";

/// Adds jobs `$2`, inserted in this transaction, to batch `$1` (`postpone_batch_join`:
/// counts them in its total and lets its callbacks wait for them).
pub(crate) const BATCH_JOIN: &str = "SELECT postpone_batch_join($1, $2::bigint[])";

/// The progress of batch `$1`: the batch row, counts of its jobs by state (the callbacks
/// left out; a job held by a worker but not started waits), and its callbacks' states.
pub(crate) const BATCH_PROGRESS: &str = "
SELECT b.id, b.created_at, b.total,
       c.waiting, c.running, c.succeeded, c.failed, c.cancelled, c.aborted,
       b.on_complete,
       CASE WHEN oc.status = 'doing' AND oc.started_at IS NULL THEN 'todo' ELSE oc.status END,
       oc.status = 'todo' AND oc.scheduled_at = 'infinity',
       b.on_success,
       CASE WHEN os.status = 'doing' AND os.started_at IS NULL THEN 'todo' ELSE os.status END,
       os.status = 'todo' AND os.scheduled_at = 'infinity'
  FROM postpone_batches b
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE j.status = 'todo'
                                  OR (j.status = 'doing' AND j.started_at IS NULL)) AS waiting,
              count(*) FILTER (WHERE j.status = 'doing' AND j.started_at IS NOT NULL) AS running,
              count(*) FILTER (WHERE j.status = 'succeeded') AS succeeded,
              count(*) FILTER (WHERE j.status = 'failed') AS failed,
              count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled,
              count(*) FILTER (WHERE j.status = 'aborted') AS aborted
         FROM postpone_jobs j
        WHERE j.batch_id = b.id
          AND j.id IS DISTINCT FROM b.on_complete AND j.id IS DISTINCT FROM b.on_success) c
  LEFT JOIN postpone_jobs oc ON oc.id = b.on_complete
  LEFT JOIN postpone_jobs os ON os.id = b.on_success
 WHERE b.id = $1";

/// The batch of job `$1`: one row, NULL when it is in none; no row when there is no such job.
pub(crate) const BATCH_OF_JOB: &str = "SELECT batch_id FROM postpone_jobs WHERE id = $1";
