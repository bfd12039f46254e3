//! Periodic tasks: the record of deferred instants, the stored schedules, and their pruning.

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
    SELECT $4::text, $1::text, $5::json, $6::int, $7::text, $8::text, $3::timestamptz
      FROM fresh
    -- Matches the queueing-lock index whether or not its predicate also says
    -- `queueing_lock IS NOT NULL` (a later schema may add it: each defer then writes one
    -- index entry less, 18% of a 1,000-job insert's server time, measured).
    ON CONFLICT (queueing_lock) WHERE status = 'todo' AND queueing_lock IS NOT NULL DO NOTHING
    RETURNING id
)
INSERT INTO postpone_periodic (task, periodic_id, instant, job_id)
SELECT $1::text, $2::text, $3::timestamptz, (SELECT id FROM job) FROM fresh
RETURNING job_id";

/// Deletes up to `$2` records of periodic instants older than `$1` milliseconds, except the
/// latest of each schedule: a schedule without a record starts afresh at its next instant
/// (no catch-up), so its last record must outlive any pause. The latest is found through the
/// primary key, one short backward walk per candidate.
pub(crate) const PERIODIC_PRUNE: &str = "
DELETE FROM postpone_periodic
 WHERE (task, periodic_id, instant) IN (
       SELECT p.task, p.periodic_id, p.instant FROM postpone_periodic p
        WHERE p.instant < now() - $1::bigint * interval '1 millisecond'
          AND p.instant < (SELECT max(l.instant) FROM postpone_periodic l
                            WHERE l.task = p.task AND l.periodic_id = p.periodic_id)
        LIMIT $2
          FOR UPDATE SKIP LOCKED)";

/// The fingerprint of the stored schedules of tasks `$1`: their number
/// and highest revision. Every insert, update and delete of such a row changes it (an update
/// takes a new revision; a delete lowers the count; an insert raises the revision).
pub(crate) const SCHEDULE_FINGERPRINT: &str = "
SELECT count(*), coalesce(max(revision), 0) FROM postpone_schedules WHERE task = ANY($1::text[])";

/// The stored schedules of tasks `$1`, as a worker follows them.
pub(crate) const SCHEDULE_READ: &str = "
SELECT task, periodic_id, cron, time_zone, args, queue, priority, lock, queueing_lock,
       catch_up_ms, paused_at IS NOT NULL, since, revision
  FROM postpone_schedules WHERE task = ANY($1::text[])";

/// Every stored schedule (or only that of task `$1`, id `$2` when both are given), with the
/// last instant deferred for it and the server's now, in (task, id) order.
pub(crate) const SCHEDULE_LIST: &str = "
SELECT s.task, s.periodic_id, s.cron, s.time_zone, s.args, s.queue, s.priority, s.lock,
       s.queueing_lock, s.catch_up_ms, s.paused_at, s.since, s.created_at, s.updated_at,
       (SELECT max(p.instant) FROM postpone_periodic p
         WHERE p.task = s.task AND p.periodic_id = s.periodic_id),
       now()
  FROM postpone_schedules s
 WHERE ($1::text IS NULL OR (s.task = $1::text AND s.periodic_id = $2::text))
 ORDER BY s.task, s.periodic_id";

/// Creates schedule (`$1` task, `$2` id) or, when `$11` is true, replaces the one there is
/// (keeping its pause; `since` moves to now only when the cron expression or the time zone
/// changes). Returns `created` (false: replaced); no row when it existed and `$11` is false.
pub(crate) const SCHEDULE_SET: &str = "
WITH ins AS (
    INSERT INTO postpone_schedules AS s
           (task, periodic_id, cron, time_zone, args, queue, priority, lock, queueing_lock,
            catch_up_ms)
    VALUES ($1::text, $2::text, $3::text, $4::text, $5::jsonb, $6::text, $7::int, $8::text,
            $9::text, $10::bigint)
    ON CONFLICT (task, periodic_id) DO UPDATE
       SET cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, args = EXCLUDED.args,
           queue = EXCLUDED.queue, priority = EXCLUDED.priority, lock = EXCLUDED.lock,
           queueing_lock = EXCLUDED.queueing_lock, catch_up_ms = EXCLUDED.catch_up_ms,
           since = CASE WHEN s.cron IS DISTINCT FROM EXCLUDED.cron
                          OR s.time_zone IS DISTINCT FROM EXCLUDED.time_zone
                        THEN now() ELSE s.since END,
           updated_at = now(), revision = DEFAULT
     WHERE $11::bool
    RETURNING (xmax = 0) AS created
)
SELECT created FROM ins";

/// Pauses schedule (`$1`, `$2`). Returns one row if it was running.
pub(crate) const SCHEDULE_PAUSE: &str = "
UPDATE postpone_schedules SET paused_at = now(), updated_at = now(), revision = DEFAULT
 WHERE task = $1::text AND periodic_id = $2::text AND paused_at IS NULL
RETURNING 1";

/// Resumes schedule (`$1`, `$2`): it counts from now (no instant of the pause is caught up).
/// Returns one row if it was paused.
pub(crate) const SCHEDULE_RESUME: &str = "
UPDATE postpone_schedules
   SET paused_at = NULL, since = now(), updated_at = now(), revision = DEFAULT
 WHERE task = $1::text AND periodic_id = $2::text AND paused_at IS NOT NULL
RETURNING 1";

/// Deletes schedule (`$1`, `$2`). Returns one row if it existed.
pub(crate) const SCHEDULE_DELETE: &str =
    "DELETE FROM postpone_schedules WHERE task = $1::text AND periodic_id = $2::text RETURNING 1";

/// Whether schedule (`$1`, `$2`) exists.
pub(crate) const SCHEDULE_EXISTS: &str =
    "SELECT 1 FROM postpone_schedules WHERE task = $1::text AND periodic_id = $2::text";
