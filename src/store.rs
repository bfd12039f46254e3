//! Every SQL statement the library runs, in one place, named `noun_verb`.
//!
//! Statements are `&'static str` and are prepared once per connection.
//!
//! Guards live in the SQL, not in the callers: a completion only touches a row that is still
//! `doing` *and* still held by the completing worker; a rescue only touches rows still
//! `doing` under a worker it deletes in the same statement. Neither can overwrite a job that
//! finished meanwhile.

// The channels (`Namespace::channel`, `postpone` by default) carry `job:<queue>` (new
// work), `abort:<id>`, `pause:<queue>` and `at:<µs since the epoch>:<queue>` (a job due
// later; schema version 9); the done channels (`postpone_done` by default) finished ids.

/// Inserts one job. `$7` an absolute time, else `$8` microseconds from the server's now; `$9`
/// its own attempt limit, `$10` its tags and `$11` its metadata (schema version 5), or NULLs;
/// its deadline (schema version 25): `$12` a time, else `$13` microseconds from now, or
/// neither.
pub(crate) const JOB_INSERT: &str = "
INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at,
                           max_attempts, tags, meta, expires_at)
VALUES ($1, $2, $3, $4, $5, $6,
        COALESCE($7::timestamptz, now() + $8::bigint * interval '1 microsecond'), $9::int,
        $10::text[], $11::jsonb,
        COALESCE($12::timestamptz, now() + $13::bigint * interval '1 microsecond'))
RETURNING id";

/// [`JOB_INSERT`] for a job due now, inserted outside any transaction of the caller's: the
/// insert trigger sends no notification (schema version 11: `postpone.quiet_insert` is set
/// for this transaction only), and [`WAKE_QUEUE`] follows in a transaction of its own.
pub(crate) const JOB_INSERT_QUIET: &str = "
INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at,
                           max_attempts, tags, meta, expires_at)
SELECT $1::text, $2::text, $3::jsonb, $4::int, $5::text, $6::text,
       COALESCE($7::timestamptz, now() + $8::bigint * interval '1 microsecond'), $9::int,
       $10::text[], $11::jsonb,
       COALESCE($12::timestamptz, now() + $13::bigint * interval '1 microsecond')
  FROM (SELECT set_config('postpone.quiet_insert', 'on', true)) q
RETURNING id";

/// Ends up to `$1` waiting jobs past their deadline, earliest first from deadline `$2` on
/// (NULL: the earliest), as `cancelled`, `expired` (schema version 25, `postpone_expire`),
/// skipping rows others hold locked. Returns how many it ended (`$1`: there may be more) and
/// the latest deadline among them (the next call's `$2` while a backlog lasts).
pub(crate) const JOB_EXPIRE: &str =
    "SELECT ended, reached FROM postpone_expire($1::int, $2::timestamptz)";

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
  FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::int[], $5::text[], $6::text[],
              $7::timestamptz[], $8::bigint[], $9::int[], $10::jsonb[], $11::jsonb[],
              $12::timestamptz[], $13::bigint[])
       WITH ORDINALITY AS u(queue, task, args, priority, lock, queueing_lock, at, delay_us,
                            max_attempts, tags, meta, expires_at, expires_in_us, n)
 ORDER BY u.n
RETURNING id";

/// Inserts jobs with dependencies through `postpone_defer_jobs` (schema version 23), in one
/// statement: the columns of [`JOB_INSERT_BATCH`], then the dependencies as three aligned
/// arrays: `$12` the position (1-based) of the job that waits, `$13` the id of the job it
/// waits for, `$14` whether any outcome of that job will do (`after_finished`) or it must
/// succeed (`after`); `$15` and `$16` the deadlines as in [`JOB_INSERT_BATCH`] (schema
/// version 25). Ids come back in input order. A dependency that does not exist fails the
/// statement with [`DEPENDENCY_CONSTRAINT`].
pub(crate) const JOB_INSERT_AFTER: &str = "
SELECT id FROM postpone_defer_jobs(
    $1::text[], $2::text[], $3::jsonb[], $4::int[], $5::text[], $6::text[],
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

/// Claims up to `$2` due jobs for worker `$1` through `postpone_claim_jobs` (schema version 12;
/// `postpone_claim` of version 3 and later, which returns the same less the attempt limit):
/// highest priority first, then the earliest due, then the oldest; skipping rows other
/// claimers hold, and never a job whose lock has a running job or an older pending one. `$3`
/// the worker's queues and `$4` its task names (each NULL: no filter). Nothing is claimed if
/// the worker's row is gone (it was presumed dead): it must register again first. The
/// function fixes the plan (an ordered walk of the due-jobs index; see migration 3),
/// whatever the table's statistics say.
///
/// Each job's own attempt limit (schema version 5) comes with it, or NULL (none), and its
/// deadline as seconds from the claim's `now()` (schema version 25; NULL: none). The claim
/// never takes a job past its deadline.
///
/// `$5` is how many of the jobs the worker can start at once (its free threads). The jobs
/// are *held* (schema version 20): counted as attempts, `started_at` NULL, shown as waiting
/// by every view until the worker writes their start ([`JOB_START`], or with their outcome);
/// the last column says so. In a queue with a limit the claim takes at most `$5` jobs and
/// starts them (`held` false).
///
/// Every row also carries the database's `now()` and, when the claim took fewer jobs than
/// asked, when the earliest job of the worker's queues not due yet will be due
/// (`postpone_next_due`, schema version 9), both in µs since the epoch: the same `now()` as
/// the claim's, so a job is either claimable or counted there, never neither. When a rate
/// limit of one of those queues holds its due jobs back (schema version 8), the time its
/// next start is allowed counts as a due time too (`postpone_rate_wait`, over the
/// rate-limited queues that have due jobs; at least 1 ms ahead, since the start may have
/// become allowed between the claim's look and this one), so that the worker comes back then
/// rather than at its next poll. A claim that takes nothing returns one row
/// with only those (NULL id). See `worker/due.rs`. Those two are computed once per claim
/// (`n` is materialized): as a plain subquery, the planner pulled them into the join and
/// called `postpone_next_due` once per job returned. The due time is capped at 9e18 µs
/// (about the year 287,000): PostgreSQL stores times up to the year 294,276, past what a
/// bigint holds in µs, and a job moved there by hand would otherwise make every claim that
/// takes fewer jobs than it asks for fail.
pub(crate) const JOB_CLAIM: &str = "
WITH c AS MATERIALIZED (
    SELECT * FROM postpone_claim_jobs($1::bigint, $2::int, $3::text[], $4::text[], $5::int)
), n AS MATERIALIZED (
        SELECT floor(extract(epoch FROM now()) * 1000000)::bigint AS db_now,
               CASE WHEN (SELECT count(*) FROM c) < $2::int
                    THEN least(9000000000000000000, floor(extract(epoch FROM least(
                             postpone_next_due($3::text[]),
                             (SELECT now() + greatest(w.s, 0.001) * interval '1 second'
                                FROM postpone_rate_wait(ARRAY(
                                         SELECT r.queue FROM postpone_rate_limits r
                                          WHERE ($3::text[] IS NULL OR r.queue = ANY($3::text[]))
                                            AND EXISTS (
                                                SELECT 1 FROM postpone_jobs d
                                                 WHERE d.queue = r.queue AND d.status = 'todo'
                                                   AND d.blocked_by IS NULL
                                                   AND d.scheduled_at <= now()))) AS w(s)
                               WHERE w.s IS NOT NULL
                                 -- Checked first (a one-time filter): without rate limits,
                                 -- the function is not called (0.2 ms a claim).
                                 AND EXISTS (SELECT 1 FROM postpone_rate_limits)))) * 1000000))::bigint
               END AS next_due
)
SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock, c.abort_requested,
       c.scheduled_at, c.queue_wait, c.max_attempts, n.db_now, n.next_due, c.held,
       c.expires_in
  FROM n LEFT JOIN c ON true";

/// Records the final outcomes of many attempts at once through `postpone_finish` (schema
/// version 12; the statement itself is there, planned once per session). Arrays: `$1` job
/// ids, `$2` and `$3` the fence of each attempt (the worker identity that claimed it and the
/// attempt number the claim gave it), `$4` outcome (`succeeded`, `failed`, `cancelled`,
/// `aborted`, `delete`), `$5` error text (appended to the job's errors), `$6` output (stored
/// with `succeeded` only, see `Job::set_output`). Returns the ids whose outcome was
/// recorded; a missing id was no longer that attempt's (it was requeued after its worker was
/// presumed dead, and maybe claimed again). Outcomes that put a job back in the queue go
/// through [`JOB_REQUEUE`] instead.
///
/// The plan drives from the outcomes and reaches each row by primary key, whatever the
/// statistics say: the guards are written with `IS NOT DISTINCT FROM`, which no index can
/// serve, so that the planner cannot scan the partial index on `doing` rows instead (it
/// estimates it at one row, then loops over every outcome for every row it finds: O(n²)).
/// Measured per batch of 1,000 before schema 12: with `=` guards, 4.4 s after 20,000 jobs
/// (dead index entries) and 334 ms with a million finished rows; with an `id = ANY($1)`
/// filter, 256 ms; as written, 12-16 ms in both cases.
///
/// Nothing here can collide with a unique index (final statuses are in none), and the error
/// texts are made safe by the caller (no NUL, bounded length).
///
/// The table is the truth about aborts: a job whose abort was recorded while it ran ends
/// `aborted` whatever its task returned, even if the worker never saw the request (its links
/// were down), with a note in its errors; it is never deleted then.
pub(crate) const JOB_FINISH_BATCH: &str = "
SELECT id FROM postpone_finish($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::text[],
                               $6::jsonb[], $7::bigint[]) AS f(id)";

/// Writes the start of held jobs that started (schema version 20, `postpone_start`): arrays
/// `$1` ids, `$2` and `$3` each attempt's fence, `$4` how long ago it started (µs). A row
/// another session holds locked is skipped: its start is written with its outcome. Returns
/// the ids written.
pub(crate) const JOB_START: &str = "
SELECT id FROM postpone_start($1::bigint[], $2::bigint[], $3::int[], $4::bigint[]) AS s(id)";

/// What the controls say to worker `$1`: one row per job it holds whose abort (`cancel`
/// false) or cancel (`cancel` true: an operator cancelled it while it was held) was
/// requested, and one row per paused queue (`id` NULL; `queue` NULL when every queue is
/// paused). The truth behind every abort, cancel and pause: a notification only makes the
/// worker look sooner.
pub(crate) const WORKER_CONTROL_POLL: &str = "
SELECT j.id, j.cancel_requested AND NOT j.abort_requested AS cancel, NULL::text AS queue
  FROM postpone_jobs j
 WHERE j.worker_id = $1 AND j.status = 'doing' AND (j.abort_requested OR j.cancel_requested)
UNION ALL
SELECT NULL, NULL, p.queue FROM postpone_paused_queues p";

/// Held jobs (claimed, not started) of queue `$1` (NULL: of every queue): what a pause waits
/// for.
pub(crate) const QUEUE_HELD: &str = "
SELECT count(*) FROM postpone_jobs
 WHERE status = 'doing' AND started_at IS NULL
   AND ($1::text IS NULL OR queue = $1::text)";

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

/// Registers a worker; returns its id. `$6` and `$7` its heartbeat interval and
/// `stalled_after` in milliseconds (its lease: schema version 22), `$8` the task names it
/// claims (NULL: every task).
pub(crate) const WORKER_INSERT: &str = "
INSERT INTO postpone_workers (name, host, pid, queues, concurrency, heartbeat_interval_ms,
                              stalled_after_ms, tasks)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id";

/// Refreshes a worker's heartbeat; 0 rows means the row is gone.
pub(crate) const WORKER_HEARTBEAT: &str =
    "UPDATE postpone_workers SET last_heartbeat = now() WHERE id = $1";

/// Removes workers whose own lease has ended (their last heartbeat plus their own
/// `stalled_after`; `$1` milliseconds, the caller's, only for workers older than schema 22,
/// see `postpone_lease_end`), never `$2` (the caller), and requeues their running jobs, plus
/// any running job whose worker row has been gone for `$1` milliseconds, through
/// `postpone_rescue` (schema version 22): one job can never fail the rescue of the others.
/// Returns (workers removed, ids of the jobs touched, their outcomes).
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
       AND coalesce(j.claimed_at, j.started_at) < $3::timestamptz
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
    -- Matches the queueing-lock index whether or not its predicate also says
    -- `queueing_lock IS NOT NULL` (a later schema may add it: each defer then writes one
    -- index entry less, 18% of a 1,000-job insert's server time, measured).
    ON CONFLICT (queueing_lock) WHERE status = 'todo' AND queueing_lock IS NOT NULL DO NOTHING
    RETURNING id
)
INSERT INTO postpone_periodic (task, periodic_id, instant, job_id)
SELECT $1::text, $2::text, $3::timestamptz, (SELECT id FROM job) FROM fresh
RETURNING job_id";

/// The fingerprint of the stored schedules of tasks `$1` (schema version 24): their number
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

/// The columns of a job as the admin API shows it (`admin::JobInfo::from_row`); a job a
/// worker holds but has not started shows as waiting.
macro_rules! job_columns {
    () => {
        "j.id, j.queue, j.task, j.args, \
         CASE WHEN j.status = 'doing' AND j.started_at IS NULL \
              THEN 'todo' ELSE j.status END, j.priority, j.lock, j.queueing_lock, \
         j.scheduled_at, \
         CASE WHEN j.status = 'doing' AND j.started_at IS NULL \
              THEN greatest(j.attempts - 1, 0) ELSE j.attempts END, \
         j.worker_id, j.abort_requested, j.created_at, \
         j.started_at, j.finished_at"
    };
}

/// One job with its errors, its worker's name and the periodic instant it was deferred for;
/// then whether it takes part in a dependency (schema version 23) and its batch (version 24).
pub(crate) const JOB_GET: &str = concat!(
    "SELECT ",
    job_columns!(),
    ", j.errors, w.name,
       (SELECT p.periodic_id FROM postpone_periodic p WHERE p.job_id = j.id LIMIT 1),
       (SELECT p.instant FROM postpone_periodic p WHERE p.job_id = j.id LIMIT 1),
       j.output, j.progress, j.progress_at, j.snoozes, j.max_attempts,
       -- Written by hand, the array may hold NULLs (or have two dimensions).
       ARRAY(SELECT t FROM unnest(j.tags) AS t WHERE t IS NOT NULL), j.meta,
       j.blocked_by, j.has_dependents OR j.has_dependencies, j.batch_id,
       j.expires_at AS expires_at, j.expired AS expired
  FROM postpone_jobs j
  LEFT JOIN postpone_workers w ON w.id = j.worker_id
 WHERE j.id = $1"
);

/// The dependencies of job `$1` (schema version 23), at most 1,000, by id: their ids,
/// whether any outcome will do, and their status (the row's, else the outcome recorded when
/// it finished); then at most 1,000 ids of its dependents; then whether it waits for its
/// dependencies now.
pub(crate) const JOB_DEPENDENCY_INFO: &str = "
SELECT coalesce(array_agg(d.dep_id ORDER BY d.dep_id), '{}'),
       coalesce(array_agg(d.any_outcome ORDER BY d.dep_id), '{}'),
       coalesce(array_agg(coalesce(x.status, d.outcome) ORDER BY d.dep_id), '{}'),
       ARRAY(SELECT e.job_id FROM postpone_deps e WHERE e.dep_id = $1
              ORDER BY e.job_id LIMIT 1000),
       EXISTS (SELECT 1 FROM postpone_jobs j
                WHERE j.id = $1 AND j.has_dependencies AND j.status = 'todo'
                  AND j.scheduled_at = 'infinity')
  FROM (SELECT * FROM postpone_deps WHERE job_id = $1 ORDER BY dep_id LIMIT 1000) d
  LEFT JOIN postpone_jobs x ON x.id = d.dep_id";

/// The status of job `$1` (to explain why an operation did nothing).
pub(crate) const JOB_STATUS: &str = "
SELECT CASE WHEN status = 'doing' AND started_at IS NULL
            THEN 'todo' ELSE status END
  FROM postpone_jobs WHERE id = $1";

/// Puts failed, cancelled or aborted job `$1` back to `todo`, due now, with its attempts
/// counted from zero again (its errors are kept), and wakes the workers of its queue, through
/// `postpone_requeue`. Returns one row: outcome `todo`, or `collision` when a job of its
/// queueing lock already waits (nothing changed); no row if the job was in another state.
pub(crate) const JOB_RETRY: &str = "
SELECT outcome FROM postpone_requeue(ARRAY[$1::bigint], '{}', '{}', '{}', '{}', '{}', true)";

/// Cancels job `$1` if it is waiting (`todo`).
pub(crate) const JOB_CANCEL: &str = "
UPDATE postpone_jobs SET status = 'cancelled', finished_at = now(), cancel_requested = false
 WHERE id = $1 AND status = 'todo'
RETURNING id";

/// Asks the worker holding job `$1` (claimed, not started) to cancel it, and tells it at
/// once (`abort:<id>` on channel `$2`, a hint: it reads the table). Returns the id if the
/// job was held.
pub(crate) const JOB_CANCEL_HELD: &str = "
WITH c AS (
    UPDATE postpone_jobs SET cancel_requested = true
     WHERE id = $1 AND status = 'doing' AND started_at IS NULL
    RETURNING id
)
SELECT c.id, pg_notify($2::text, 'abort:' || c.id)::text FROM c";

/// Status of job `$1` as every view shows it (held: `todo`), and whether it is held.
pub(crate) const JOB_SHOWN_STATUS: &str = "
SELECT CASE WHEN status = 'doing' AND started_at IS NULL
            THEN 'todo' ELSE status END,
       status = 'doing' AND started_at IS NULL
  FROM postpone_jobs WHERE id = $1";

/// Deletes job `$1` if it is waiting (`todo`).
pub(crate) const JOB_CANCEL_DELETE: &str =
    "DELETE FROM postpone_jobs WHERE id = $1 AND status = 'todo' RETURNING id";

/// Aborts job `$1`: a waiting job is cancelled; a running one gets `abort_requested` and
/// its worker is told by NOTIFY (`abort:<id>` on channel `$2`; workers also poll the flag). Returns the
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
       (SELECT count(pg_notify($2::text, 'abort:' || a2.id)) FROM a a2
         WHERE a2.status = 'doing')
  FROM a";

// ---------------------------------------------------------------------------------------
// Results: progress, output and waiting for a job (job.rs, wait.rs).
// ---------------------------------------------------------------------------------------

/// Records the progress `$2` of job `$1`, if it still runs as attempt `$3`.
pub(crate) const JOB_PROGRESS_SET: &str = "
UPDATE postpone_jobs SET progress = $2::jsonb, progress_at = now()
 WHERE id = $1 AND status = 'doing' AND attempts = $3";

/// The periodic instant job `$1` was deferred for.
pub(crate) const JOB_PERIODIC_INSTANT: &str =
    "SELECT instant FROM postpone_periodic WHERE job_id = $1 LIMIT 1";

/// The dependencies of job `$1` (schema version 23), by id: id, status (the row's, else the
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

// ---------------------------------------------------------------------------------------
// Test helpers for users (testing.rs, feature `test-util`): jobs run in the test's thread,
// outside any worker (worker_id stays NULL).
// ---------------------------------------------------------------------------------------

/// The newest job id (0 when there is none).
#[cfg(feature = "test-util")]
pub(crate) const TESTING_MARK: &str = "SELECT coalesce(max(id), 0)::bigint FROM postpone_jobs";

/// Jobs with an id above `$1`, oldest first.
#[cfg(feature = "test-util")]
pub(crate) const TESTING_DEFERRED: &str = "
SELECT id, task, args, queue, priority, lock, queueing_lock, scheduled_at, status
  FROM postpone_jobs WHERE id > $1 ORDER BY id";

/// Claims the next waiting job with an id above `$1`, due now unless `$2`, highest priority
/// first then oldest; never one past its deadline (schema version 25), as a worker's claim.
#[cfg(feature = "test-util")]
pub(crate) const TESTING_CLAIM: &str = "
UPDATE postpone_jobs
   SET status = 'doing', attempts = attempts + 1, started_at = now()
 WHERE id = (SELECT id FROM postpone_jobs
              WHERE status = 'todo' AND id > $1 AND ($2 OR scheduled_at <= now())
                AND (expires_at IS NULL OR expires_at > now())
              ORDER BY priority DESC, id
              LIMIT 1
                FOR UPDATE SKIP LOCKED)
RETURNING id, queue, task, args, attempts, priority, lock, max_attempts";

/// Pauses queue `$1` (NULL: every queue), schema version 5. Returns the pause time, or no
/// row when it was already paused (the first pause keeps its time).
pub(crate) const QUEUE_PAUSE: &str = "SELECT paused_at FROM postpone_pause($1::text)";

/// Lifts the pause of queue `$1` and wakes its workers (the table is the truth; the wake
/// only makes them look at once). Returns how many pauses were lifted (0 or 1).
pub(crate) const QUEUE_RESUME: &str = "
WITH d AS (DELETE FROM postpone_paused_queues WHERE queue = $1::text RETURNING 1)
SELECT (SELECT count(*) FROM d), postpone_wake($1::text)::text";

/// Lifts every pause (of all queues and of each queue) and wakes every worker (`job:*` on
/// channel `$1`). Returns how many pauses were lifted.
pub(crate) const QUEUE_RESUME_ALL: &str = "
WITH d AS (DELETE FROM postpone_paused_queues RETURNING 1)
SELECT (SELECT count(*) FROM d), pg_notify($1::text, 'job:*')::text";

/// Whether queue `$1` has been seen: a worker serves it by name, or a job of it is in the
/// table, whatever its status. The cheap looks come first (the workers' table, then the
/// indexes of waiting and of running jobs), and `OR` stops at the first that finds one; only
/// a queue none of them knows costs a scan of the jobs (finished jobs have no queue index).
pub(crate) const QUEUE_SEEN: &str = "
SELECT EXISTS (SELECT 1 FROM postpone_workers WHERE $1::text = ANY(queues))
    OR EXISTS (SELECT 1 FROM postpone_jobs
                WHERE queue = $1::text AND status = 'todo' AND blocked_by IS NULL)
    OR EXISTS (SELECT 1 FROM postpone_jobs WHERE queue = $1::text AND status = 'doing')
    OR EXISTS (SELECT 1 FROM postpone_jobs WHERE queue = $1::text)";

/// The pauses: queue (NULL: every queue) and since when, the pause of all queues first.
pub(crate) const QUEUE_PAUSED: &str = "
SELECT queue, paused_at FROM postpone_paused_queues ORDER BY queue NULLS FIRST";

/// Snoozes attempts through `postpone_snooze` (schema version 5): back to `todo` through
/// `postpone_requeue`, due after `$4` microseconds, the attempt given back, one more snooze
/// counted. Arrays `$1` ids, `$2` workers and `$3` attempts (the fences). Returns what
/// [`JOB_REQUEUE`] returns.
pub(crate) const JOB_SNOOZE: &str = "
SELECT job_id, outcome
  FROM postpone_snooze($1::bigint[], $2::bigint[], $3::int[], $4::bigint[])";

/// Inserts a unique job (schema version 6): the parameters of [`JOB_INSERT`], then `$14` the
/// scope of its key (`w`, `r` or `s`), `$15` whether the queue is part of the key, `$16` the
/// period in microseconds (NULL: none). A waiting-only key (`w`) goes in `queueing_lock`,
/// the others in `unique_key`. A conflict inserts nothing: returns (NULL, key), else (id, key).
pub(crate) const JOB_INSERT_UNIQUE: &str = "
WITH k AS (
    SELECT s.at, postpone_unique_key($14::text, $2::text, CASE WHEN $15::bool THEN $1::text END,
                                     $3::jsonb, $16::bigint, s.at) AS key
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

/// Sets the concurrency limit of queue `$1` to `$2` running jobs (schema version 7), and
/// wakes the queue's workers (a raised limit frees slots). Returns the previous limit (NULL:
/// none).
pub(crate) const QUEUE_LIMIT_SET: &str = "
WITH old AS (SELECT max_running FROM postpone_queue_limits WHERE queue = $1::text),
     up AS (INSERT INTO postpone_queue_limits (queue, max_running) VALUES ($1::text, $2::int)
            ON CONFLICT (queue) DO UPDATE SET max_running = EXCLUDED.max_running, set_at = now()
            RETURNING 1)
SELECT (SELECT max_running FROM old), (SELECT count(*) FROM up), postpone_wake($1::text)::text";

/// Removes the concurrency limit of queue `$1` and wakes its workers. Returns the removed
/// limit, or no row when there was none.
pub(crate) const QUEUE_LIMIT_CLEAR: &str = "
WITH d AS (DELETE FROM postpone_queue_limits WHERE queue = $1::text RETURNING max_running)
SELECT d.max_running, postpone_wake($1::text)::text FROM d";

/// The concurrency limits: queue, limit, running jobs now, since when; by queue.
pub(crate) const QUEUE_LIMITS: &str = "
SELECT l.queue, l.max_running,
       (SELECT count(*) FROM postpone_jobs d WHERE d.queue = l.queue AND d.status = 'doing'),
       l.set_at
  FROM postpone_queue_limits l ORDER BY l.queue";
