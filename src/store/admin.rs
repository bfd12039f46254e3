//! The admin API's reads and controls of single jobs (get, preview, retry, cancel, abort),
//! its statistics, and retention.

/// One job with its errors, its worker's name and the periodic instant it was deferred for;
/// then whether it takes part in a dependency and its batch; its deadline and its workflow
/// (`expires_at`, `expired`, `workflow_id`), read by name.
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
       j.expires_at AS expires_at, j.expired AS expired,
       (SELECT f.workflow_id FROM postpone_workflow_jobs f WHERE f.job_id = j.id) AS workflow_id
  FROM postpone_jobs j
  LEFT JOIN postpone_workers w ON w.id = j.worker_id
 WHERE j.id = $1"
);

/// The dependencies of job `$1`, at most 1,000, by id: their ids,
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

/// Status of job `$1` as every view shows it (held: `todo`), and whether it is held.
pub(crate) const JOB_SHOWN_STATUS: &str = "
SELECT CASE WHEN status = 'doing' AND started_at IS NULL
            THEN 'todo' ELSE status END,
       status = 'doing' AND started_at IS NULL
  FROM postpone_jobs WHERE id = $1";

/// Puts failed, cancelled or aborted job `$1` back to `todo`, due now, with its attempts
/// counted from zero again (its errors are kept), and wakes the workers of its queue, through
/// `postpone_requeue`. Returns one row: outcome `todo`, or `collision` when a job of its
/// queueing lock already waits (nothing changed); no row if the job was in another state.
pub(crate) const JOB_RETRY: &str = "
SELECT outcome FROM postpone_requeue(ARRAY[$1::bigint], '{}', '{}', '{}', '{}', '{}', true)";

/// Locks job `$1`'s row (its id if it exists): waits for a session that holds it.
pub(crate) const JOB_LOCK_ONE: &str = "SELECT id FROM postpone_jobs WHERE id = $1 FOR UPDATE";

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

/// Deletes up to `$3` finished jobs whose status is in `$1` and that finished more than
/// `$2` milliseconds ago, the oldest first. Rows another transaction holds are skipped, not
/// waited for. The order keeps the plan on the finished-jobs index whatever the statistics
/// say: unordered, a LIMIT over jobs the statistics call all old enough prices a sequential
/// scan lower, and that scan reads the table from its start, through the waiting and young
/// jobs that reuse its first pages, for each batch.
pub(crate) const JOBS_PRUNE: &str = "
DELETE FROM postpone_jobs
 WHERE id = ANY(ARRAY(
       SELECT id FROM postpone_jobs
        WHERE status IN ('succeeded', 'failed', 'cancelled', 'aborted')
          AND status = ANY($1::text[])
          AND finished_at < now() - $2::bigint * interval '1 millisecond'
        ORDER BY finished_at
        LIMIT $3
          FOR UPDATE SKIP LOCKED))";

/// Due jobs (`$1` ms past their scheduled time at least) per queue and task, where some live
/// worker serves the queue and none that does claims the task (lease: `postpone_lease_end`).
pub(crate) const JOB_UNKNOWN_TASKS: &str = "
SELECT j.queue, j.task, count(*),
       date_part('epoch', now()) - date_part('epoch', min(j.scheduled_at))
  FROM postpone_jobs j
 WHERE j.status = 'todo'
   AND j.scheduled_at <= now() - $1::bigint * interval '1 millisecond'
 GROUP BY j.queue, j.task
HAVING EXISTS (SELECT 1 FROM postpone_workers w
                WHERE (w.queues IS NULL OR j.queue = ANY(w.queues))
                  AND postpone_lease_end(w.last_heartbeat, w.stalled_after_ms, 0, 0) >= now())
   AND NOT EXISTS (SELECT 1 FROM postpone_workers w
                    WHERE (w.queues IS NULL OR j.queue = ANY(w.queues))
                      AND (w.tasks IS NULL OR j.task = ANY(w.tasks))
                      AND postpone_lease_end(w.last_heartbeat, w.stalled_after_ms, 0, 0)
                          >= now())
 ORDER BY j.queue, j.task";

/// The statement: `{group}` is the grouping column, `$1` the window in milliseconds (NULL:
/// no window), `$2` the most groups returned, the first by name (NULL: all).
pub(crate) const JOB_STATS: &str = "
SELECT {group},
       count(*) FILTER (WHERE status = 'todo' AND scheduled_at <= now()),
       count(*) FILTER (WHERE status = 'todo' AND scheduled_at > now() AND NOT deps),
       count(*) FILTER (WHERE status = 'doing'),
       count(*) FILTER (WHERE status = 'succeeded' AND w),
       count(*) FILTER (WHERE status = 'failed' AND w),
       count(*) FILTER (WHERE status = 'cancelled' AND w),
       count(*) FILTER (WHERE status = 'aborted' AND w),
       count(*) FILTER (WHERE status NOT IN
                        ('todo', 'doing', 'succeeded', 'failed', 'cancelled', 'aborted')),
       date_part('epoch', now()) - date_part('epoch',
           min(scheduled_at) FILTER (WHERE status = 'todo' AND scheduled_at <= now())),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]::float8[]) WITHIN GROUP (ORDER BY run)
           FILTER (WHERE status IN ('succeeded', 'failed', 'aborted') AND w AND run IS NOT NULL),
       count(*) FILTER (WHERE held),
       count(*) FILTER (WHERE deps),
       count(*) FILTER (WHERE status = 'cancelled' AND w AND expired)
  FROM (SELECT j.queue, j.task, j.expired,
               -- A job a worker holds but has not started is waiting.
               CASE WHEN j.status = 'doing' AND j.started_at IS NULL
                    THEN 'todo' ELSE j.status END AS status,
               j.scheduled_at,
               (j.status = 'todo' AND j.scheduled_at = 'infinity' AND j.has_dependencies) AS deps,
               (j.status = 'todo' AND j.scheduled_at <= now() AND j.lock IS NOT NULL
                AND EXISTS (SELECT 1 FROM postpone_jobs e
                             WHERE e.lock = j.lock AND e.status IN ('todo', 'doing')
                               AND (e.status = 'doing' OR e.id < j.id))) AS held,
               ($1::bigint IS NULL OR j.finished_at >= now() - $1::bigint * interval '1 millisecond') AS w,
               CASE WHEN isfinite(j.started_at) AND isfinite(j.finished_at)
                    THEN date_part('epoch', j.finished_at) - date_part('epoch', j.started_at)
               END AS run
          FROM postpone_jobs j) s
 GROUP BY {group}
 ORDER BY {group}
 LIMIT $2::bigint";

/// `$1` the id, `$2` the budget in characters, `$3` the errors kept, `$4` the characters
/// and `$5` the number of tags kept. The first 27 columns are those of
/// `store::JOB_GET` (with the large values left out); then each value's prefix and size,
/// the number of errors, whether it takes part in a dependency, its batch, its deadline
/// (`expires_at`, `expired`), its number of tags (`tags_total`) and its workflow
/// (`workflow_id`), the last four read by name.
pub(crate) const JOB_PREVIEW: &str = "
SELECT j.id, j.queue, j.task, 'null'::jsonb, j.status, j.priority, j.lock, j.queueing_lock,
       j.scheduled_at, j.attempts, j.worker_id, j.abort_requested, j.created_at,
       j.started_at, j.finished_at,
       CASE WHEN jsonb_typeof(j.errors) = 'array' THEN (
           SELECT coalesce(jsonb_agg(
                    CASE WHEN jsonb_typeof(x.e) = 'object'
                         THEN x.e || jsonb_build_object('error',
                                       left(coalesce(x.e ->> 'error', ''), 16384))
                         ELSE to_jsonb(left(x.e::text, 16384)) END ORDER BY x.n), '[]')
             FROM jsonb_array_elements(j.errors) WITH ORDINALITY AS x(e, n)
            WHERE x.n > jsonb_array_length(j.errors) - $3::int) END,
       w.name,
       (SELECT p.periodic_id FROM postpone_periodic p WHERE p.job_id = j.id LIMIT 1),
       (SELECT p.instant FROM postpone_periodic p WHERE p.job_id = j.id LIMIT 1),
       NULL::jsonb, NULL::jsonb, j.progress_at, j.snoozes, j.max_attempts,
       ARRAY(SELECT left(t, $4::int) FROM unnest(j.tags[1:$5::int]) AS t WHERE t IS NOT NULL),
       CASE WHEN octet_length(j.meta::text) <= $2::int THEN j.meta END,
       j.blocked_by,
       left(t.a, $2::int), octet_length(t.a),
       left(t.o, $2::int), octet_length(t.o),
       left(t.p, $2::int), octet_length(t.p),
       CASE WHEN jsonb_typeof(j.errors) = 'array' THEN jsonb_array_length(j.errors) ELSE 0 END,
       j.has_dependents OR j.has_dependencies, j.batch_id,
       j.expires_at AS expires_at, j.expired AS expired,
       coalesce(cardinality(j.tags), 0) AS tags_total,
       (SELECT f.workflow_id FROM postpone_workflow_jobs f WHERE f.job_id = j.id) AS workflow_id
  FROM postpone_jobs j
  LEFT JOIN postpone_workers w ON w.id = j.worker_id
 CROSS JOIN LATERAL (SELECT j.args::text AS a, j.output::text AS o, j.progress::text AS p) t
 WHERE j.id = $1";

/// The columns of a job as [`job_from_row`] reads them, for `SELECT ... FROM postpone_jobs j`.
///
/// A job a worker holds but has not started shows as waiting: status
/// `todo`, its attempt not counted.
pub(crate) const JOB_COLUMNS: &str = "j.id, j.queue, j.task, j.args, \
     CASE WHEN j.status = 'doing' AND j.started_at IS NULL \
          THEN 'todo' ELSE j.status END, j.priority, \
     j.lock, j.queueing_lock, j.scheduled_at, \
     CASE WHEN j.status = 'doing' AND j.started_at IS NULL \
          THEN greatest(j.attempts - 1, 0) ELSE j.attempts END, \
     j.worker_id, j.abort_requested, \
     j.created_at, j.started_at, j.finished_at, \
     CASE WHEN jsonb_typeof(j.errors) = 'array' THEN j.errors -> -1 ->> 'error' END, \
     (j.has_dependencies AND j.status = 'todo' AND j.scheduled_at = 'infinity'), \
     j.expires_at AS expires_at, j.expired AS expired, \
     (SELECT wf.workflow_id FROM postpone_workflow_jobs wf WHERE wf.job_id = j.id) AS workflow_id";

/// Deletes job `$1` if it is `cancelled` (a held job its worker cancelled, for a cancel that
/// deletes). Returns its id, or no row.
pub(crate) const JOB_DELETE_CANCELLED: &str =
    "DELETE FROM postpone_jobs WHERE id = $1 AND status = 'cancelled' RETURNING id";

/// Withdraws the cancel request of job `$1` when it is no longer waiting or held (it started
/// or finished meanwhile), so that it cannot take effect later, after a retry say. Returns its
/// id when a request was withdrawn.
pub(crate) const JOB_CANCEL_REQUEST_CLEAR: &str =
    "UPDATE postpone_jobs SET cancel_requested = false
                  WHERE id = $1 AND cancel_requested AND status <> 'todo'
                    AND (status <> 'doing' OR started_at IS NOT NULL)
                 RETURNING id";

/// Deletes up to `$2` workflows created more than `$1` milliseconds ago none of whose jobs
/// is left (pruned or deleted), with their membership rows (`ON DELETE CASCADE`). A workflow
/// still being inserted is not visible yet; rows another transaction holds are skipped.
pub(crate) const WORKFLOWS_PRUNE: &str = "
DELETE FROM postpone_workflows
 WHERE id = ANY(ARRAY(
       SELECT w.id FROM postpone_workflows w
        WHERE w.created_at < now() - $1::bigint * interval '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM postpone_workflow_jobs f
                            JOIN postpone_jobs j ON j.id = f.job_id
                           WHERE f.workflow_id = w.id)
        LIMIT $2
          FOR UPDATE SKIP LOCKED))";

/// Deletes up to `$2` batches created more than `$1` milliseconds ago none of whose jobs
/// (callbacks included: they carry the batch's id too) is left. Rows another transaction
/// holds (a job being added) are skipped.
pub(crate) const BATCHES_PRUNE: &str = "
DELETE FROM postpone_batches
 WHERE id = ANY(ARRAY(
       SELECT b.id FROM postpone_batches b
        WHERE b.created_at < now() - $1::bigint * interval '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM postpone_jobs j WHERE j.batch_id = b.id)
        LIMIT $2
          FOR UPDATE SKIP LOCKED))";

/// How many jobs [`JOBS_PRUNE`] would delete with no limit: finished, status in `$1`,
/// finished more than `$2` milliseconds ago.
pub(crate) const JOBS_PRUNE_COUNT: &str = "SELECT count(*) FROM postpone_jobs
              WHERE status IN ('succeeded', 'failed', 'cancelled', 'aborted')
                AND status = ANY($1::text[])
                AND finished_at < now() - $2::bigint * interval '1 millisecond'";

/// The limit on a job's arguments in bytes of JSON text (schema version 27); no row when
/// its row was deleted by hand (the default applies).
pub(crate) const SETTINGS_MAX_ARGS_BYTES: &str = "
SELECT max_args_bytes FROM postpone_settings";

/// Sets the limit on a job's arguments to `$1` bytes (schema version 27), creating the row
/// if it was deleted; returns the previous limit (NULL: none was stored). The table's check
/// refuses a limit outside 1 to 1 GiB less a byte.
pub(crate) const SETTINGS_SET_MAX_ARGS_BYTES: &str = "
WITH old AS (SELECT max_args_bytes FROM postpone_settings),
     up AS (INSERT INTO postpone_settings (one, max_args_bytes) VALUES (true, $1::bigint)
            ON CONFLICT (one) DO UPDATE SET max_args_bytes = EXCLUDED.max_args_bytes,
                                            updated_at = now()
            RETURNING 1)
SELECT (SELECT max_args_bytes FROM old), (SELECT count(*) FROM up)";
