//! Queues: pauses, concurrency limits, per-key limits, rate limits, and the gauges of
//! waiting jobs.

/// Held jobs (claimed, not started) of queue `$1` (NULL: of every queue): what a pause waits
/// for.
///
/// Jobs only locked by a worker's open claim transaction (schema version 48,
/// `claim_in_outcome_transaction`) count too while it is open: they are `todo` to others,
/// and those not started when it commits become held jobs, counted then.
pub(crate) const QUEUE_HELD: &str = "
SELECT (SELECT count(*) FROM postpone_jobs
         WHERE status = 'doing' AND started_at IS NULL
           AND ($1::text IS NULL OR queue = $1::text))
     + (SELECT count(*)
          FROM postpone_workers w, unnest(w.claim_jobs) AS r,
               generate_series(lower(r), upper(r) - 1) AS g(id), postpone_jobs j
         WHERE w.claim_xids IS NOT NULL
           AND EXISTS (SELECT 1 FROM unnest(w.claim_xids) x
                        WHERE pg_xact_status(x) = 'in progress')
           AND j.id = g.id AND j.status = 'todo'
           AND ($1::text IS NULL OR j.queue = $1::text))";

/// Pauses queue `$1` (NULL: every queue) through `postpone_pause`. Returns the pause time, or no
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
/// indexes of waiting jobs without and with a deadline and of running jobs), and `OR` stops at the first that finds one; only
/// a queue none of them knows costs a scan of the jobs (finished jobs have no queue index).
pub(crate) const QUEUE_SEEN: &str = "
SELECT EXISTS (SELECT 1 FROM postpone_workers WHERE $1::text = ANY(queues))
    OR EXISTS (SELECT 1 FROM postpone_jobs
                WHERE queue = $1::text AND status = 'todo' AND blocked_by IS NULL
                  AND expires_at IS NULL)
    OR EXISTS (SELECT 1 FROM postpone_jobs
                WHERE queue = $1::text AND status = 'todo' AND blocked_by IS NULL
                  AND expires_at IS NOT NULL)
    OR EXISTS (SELECT 1 FROM postpone_jobs WHERE queue = $1::text AND status = 'doing')
    OR EXISTS (SELECT 1 FROM postpone_jobs WHERE queue = $1::text)";

/// The pauses: queue (NULL: every queue) and since when, the pause of all queues first.
pub(crate) const QUEUE_PAUSED: &str = "
SELECT queue, paused_at FROM postpone_paused_queues ORDER BY queue NULLS FIRST";

/// Sets the concurrency limit of queue `$1` to `$2` running jobs, and
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

pub(crate) const KEY_LIMIT_SET: &str = "
WITH old AS (SELECT max_per_key, key_arg FROM postpone_key_limits WHERE queue = $1::text),
     up AS (INSERT INTO postpone_key_limits (queue, max_per_key, key_arg)
            VALUES ($1::text, $2::int, $3::text)
            ON CONFLICT (queue) DO UPDATE
               SET max_per_key = EXCLUDED.max_per_key, key_arg = EXCLUDED.key_arg, set_at = now()
            RETURNING 1)
SELECT (SELECT max_per_key FROM old), (SELECT key_arg FROM old), (SELECT count(*) FROM up),
       postpone_wake($1::text)::text";

pub(crate) const KEY_LIMIT_CLEAR: &str = "
WITH d AS (DELETE FROM postpone_key_limits WHERE queue = $1::text RETURNING 1)
SELECT postpone_wake($1::text)::text FROM d";

pub(crate) const KEY_LIMITS: &str = "
SELECT l.queue, l.key_arg, l.max_per_key,
       (SELECT count(*) FROM postpone_jobs d WHERE d.queue = l.queue AND d.status = 'doing'),
       (SELECT count(*) FROM (SELECT 1 FROM postpone_jobs d
                               WHERE d.queue = l.queue AND d.status = 'doing'
                               GROUP BY (d.args -> l.key_arg)::text
                              HAVING count(*) >= l.max_per_key) f),
       (SELECT count(*) FROM postpone_jobs c
         WHERE c.queue = l.queue AND c.status = 'todo' AND c.scheduled_at <= now()
           AND (SELECT count(*) FROM postpone_jobs d
                 WHERE d.queue = l.queue AND d.status = 'doing'
                   AND (d.args -> l.key_arg)::text IS NOT DISTINCT FROM (c.args -> l.key_arg)::text)
               >= l.max_per_key),
       l.set_at
  FROM postpone_key_limits l ORDER BY l.queue";

pub(crate) const RATE_LIMIT_SET: &str = "
WITH old AS (SELECT max_starts FROM postpone_rate_limits WHERE queue = $1::text),
     up AS (INSERT INTO postpone_rate_limits (queue, max_starts, period)
            VALUES ($1::text, $2::int, $3::bigint * interval '1 microsecond')
            ON CONFLICT (queue) DO UPDATE
               SET max_starts = EXCLUDED.max_starts, period = EXCLUDED.period, set_at = now()
            RETURNING 1)
SELECT (SELECT max_starts FROM old), (SELECT count(*) FROM up), postpone_wake($1::text)::text";

pub(crate) const RATE_LIMIT_CLEAR: &str = "
WITH d AS (DELETE FROM postpone_rate_limits WHERE queue = $1::text RETURNING 1),
     s AS (DELETE FROM postpone_rate_starts WHERE queue = $1::text AND EXISTS (SELECT 1 FROM d))
SELECT postpone_wake($1::text)::text FROM d";

pub(crate) const RATE_LIMITS: &str = "
SELECT r.queue, r.max_starts, extract(epoch FROM r.period)::float8, w.n::bigint,
       CASE WHEN w.n >= r.max_starts
            THEN coalesce(postpone_rate_wait(ARRAY[r.queue]), 0)
       END,
       r.set_at
  FROM postpone_rate_limits r
 CROSS JOIN LATERAL (SELECT coalesce(sum(s.starts), 0) AS n FROM postpone_rate_starts s
                      WHERE s.queue = r.queue
                        AND s.until > clock_timestamp() - r.period) w
 ORDER BY r.queue";

/// Waiting jobs per queue: `todo` rows (the partial claim indexes cover them) and jobs
/// workers hold unstarted (the index of running jobs holds those).
#[cfg(feature = "metrics")]
pub(crate) const QUEUE_GAUGES: &str = "
SELECT queue,
   count(*) FILTER (WHERE scheduled_at <= now()),
   count(*) FILTER (WHERE scheduled_at > now()
                      AND NOT (scheduled_at = 'infinity' AND has_dependencies)),
   EXTRACT(EPOCH FROM now() - min(scheduled_at) FILTER (WHERE scheduled_at <= now()))::float8,
   count(*) FILTER (WHERE scheduled_at = 'infinity' AND has_dependencies)
  FROM (SELECT queue, scheduled_at, has_dependencies FROM postpone_jobs WHERE status = 'todo'
    UNION ALL
    SELECT queue, scheduled_at, has_dependencies FROM postpone_jobs
     WHERE status = 'doing' AND started_at IS NULL) w
 GROUP BY queue";
