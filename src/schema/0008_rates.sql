-- postpone schema, version 8: key limits and rate limits per queue.
--
--   * A key limit: at most `max_per_key` jobs of the queue run at once per value of the
--     job's argument `key_arg` (`args -> key_arg`, a top-level field of the JSON
--     arguments), across every worker of the cluster. Jobs whose arguments lack the field
--     (or are not an object) share one key, so no job of the queue escapes the limit.
--   * A rate limit: at most `max_starts` jobs of the queue start (are claimed) in any
--     sliding window of `period`, by the database's clock, across the cluster.
--
-- Only additions: three tables and a claim function with the same signature. A worker of
-- version 5 to 7 still running during the upgrade calls the same postpone_claim and so
-- already obeys the new limits.

CREATE TABLE postpone_key_limits (
    queue       text        PRIMARY KEY,
    max_per_key integer     NOT NULL,
    key_arg     text        NOT NULL,
    set_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT postpone_key_limits_name CHECK (queue <> ''),
    CONSTRAINT postpone_key_limits_arg CHECK (key_arg <> ''),
    CONSTRAINT postpone_key_limits_positive CHECK (max_per_key > 0)
);

CREATE TABLE postpone_rate_limits (
    queue      text        PRIMARY KEY,
    max_starts integer     NOT NULL,
    period     interval    NOT NULL,
    set_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT postpone_rate_limits_name CHECK (queue <> ''),
    CONSTRAINT postpone_rate_limits_positive CHECK (max_starts > 0),
    CONSTRAINT postpone_rate_limits_period CHECK (period > interval '0')
);

-- The start log of rate-limited queues, in buckets: `starts` jobs of the queue started in the
-- bucket that ends at `until`. A bucket spans a hundredth of the queue's period (at least one
-- microsecond), so a queue has at most about 101 rows whatever its limit: the claim of a
-- rate-limited queue sums them (one index range, never more than ~101 entries), adds its
-- own starts to the current bucket, and deletes the buckets that left the window. Only the
-- claims of that queue touch its rows, and they are serialised by the queue's advisory lock
-- anyway; no claim of another queue ever touches them. A start outlives its job, so deleting
-- finished jobs (or a job retried at once) gives the queue no extra starts.
--
-- Measured before choosing (tests/rates_admin.rs, cost_of_a_claim_with_each_limit): a log of one
-- row per start costs a claim a count over every start of the window, ~10 ms more per claim
-- with 20,000 starts in the window (loaded 2-core machine); buckets bound that count.
CREATE TABLE postpone_rate_starts (
    queue  text        NOT NULL,
    until  timestamptz NOT NULL,
    starts integer     NOT NULL,
    PRIMARY KEY (queue, until)
);

-- The claim of version 7, plus key and rate limits. When no limit of any kind exists (the
-- usual case) the cost is three looks at empty tables, then the very same statements and
-- plans as in version 5.
--
-- A queue with a limit of any kind (concurrency, key or rate) is claimed under the
-- transaction-level advisory lock of version 7 (class 0x706f7374, key hashtext(queue), in
-- key order), so the claims of a limited queue are serialised and each counts what the
-- previous ones committed. Queues without limits are claimed as before, in parallel.
--
--   * Concurrency limit (version 7): the queue's running jobs are counted.
--   * Key limit: a waiting job whose key already has `max_per_key` running jobs is passed
--     over; among the candidates of one claim, those of one key are ranked (priority, due
--     time, id) and only as many as the key has free slots are taken. A running job counts
--     until it leaves `doing`, so a dead worker's slots come back with the rescue. A claim
--     may take fewer jobs than it could (it looks at no more than four times the jobs it
--     may take); the next claim takes the rest.
--   * Rate limit: the time of a start is clock_timestamp() read after the advisory lock is
--     held (t), so start times grow in the order of the claims. A start is logged in the
--     bucket that ends at u, t < u <= t + period/100, and counts while u > now - period:
--     for at least `period` after t and at most period + period/100. A claim takes at most
--     `max_starts` minus the starts it counts. Hence in no window (a, a + period] of the
--     database's clock do more than `max_starts` jobs of the queue start (a sliding window
--     that is never exceeded), and a start's slot comes back between `period` and 1.01 x
--     `period` after it. The job's `started_at` is the claim transaction's now(), a little
--     earlier than t. A start is a claim: every attempt counts (retries, and jobs claimed
--     again after a rescue). Changing the period keeps the starts already logged, counted
--     with the new period.
CREATE OR REPLACE FUNCTION postpone_claim(p_worker bigint, p_limit integer, p_queues text[],
                                          p_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[] := p_queues;
    v_paused text[] := '{}';
    v_all boolean;
    v_limited boolean;
    v_caps integer[];
    v_klims integer[];
    v_kargs text[];
    v_rated text[];
    v_key integer;
    v_now timestamptz;
BEGIN
    v_limited := EXISTS (SELECT 1 FROM postpone_queue_limits)
              OR EXISTS (SELECT 1 FROM postpone_key_limits)
              OR EXISTS (SELECT 1 FROM postpone_rate_limits);
    IF EXISTS (SELECT 1 FROM postpone_paused_queues) THEN
        SELECT coalesce(array_agg(p.queue) FILTER (WHERE p.queue IS NOT NULL), '{}'),
               coalesce(bool_or(p.queue IS NULL), false)
          INTO v_paused, v_all
          FROM postpone_paused_queues p;
        IF v_all THEN
            RETURN;
        END IF;
        IF v_queues IS NOT NULL THEN
            SELECT coalesce(array_agg(q.name), '{}') INTO v_queues
              FROM unnest(v_queues) AS q(name) WHERE q.name <> ALL(v_paused);
        END IF;
    END IF;
    IF v_queues IS NULL AND (v_limited OR cardinality(v_paused) > 0) THEN
        WITH RECURSIVE qs(name) AS (
            (SELECT c.queue FROM postpone_jobs c
              WHERE c.status = 'todo' ORDER BY c.queue LIMIT 1)
            UNION ALL
            SELECT (SELECT c.queue FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.queue > qs.name
                     ORDER BY c.queue LIMIT 1)
              FROM qs WHERE qs.name IS NOT NULL
        )
        SELECT coalesce(array_agg(qs.name), '{}') INTO v_queues
          FROM qs WHERE qs.name IS NOT NULL AND qs.name <> ALL(v_paused);
    END IF;
    IF v_queues IS NOT NULL AND cardinality(v_queues) = 0 THEN
        RETURN;
    END IF;

    IF v_limited AND (EXISTS (SELECT 1 FROM postpone_queue_limits l WHERE l.queue = ANY(v_queues))
                      OR EXISTS (SELECT 1 FROM postpone_key_limits l WHERE l.queue = ANY(v_queues))
                      OR EXISTS (SELECT 1 FROM postpone_rate_limits l WHERE l.queue = ANY(v_queues)))
    THEN
        FOR v_key IN SELECT DISTINCT hashtext(l.queue) AS k
                       FROM (SELECT queue FROM postpone_queue_limits
                             UNION ALL SELECT queue FROM postpone_key_limits
                             UNION ALL SELECT queue FROM postpone_rate_limits) l
                      WHERE l.queue = ANY(v_queues) ORDER BY k LOOP
            PERFORM pg_advisory_xact_lock(1886352244, v_key);
        END LOOP;
        -- Read after the locks: later claims of a queue read later times.
        v_now := clock_timestamp();
        -- New statements, so new snapshots: they see every claim committed before the locks.
        DELETE FROM postpone_rate_starts s
         USING postpone_rate_limits r
         WHERE r.queue = ANY(v_queues) AND s.queue = r.queue
           AND s.until <= v_now - r.period;
        SELECT array_agg(greatest(0, least(p_limit,
                   CASE WHEN l.max_running IS NULL THEN p_limit
                        ELSE l.max_running - (SELECT count(*) FROM postpone_jobs d
                                               WHERE d.queue = q.name AND d.status = 'doing')
                   END,
                   CASE WHEN r.max_starts IS NULL THEN p_limit
                        ELSE r.max_starts - (SELECT coalesce(sum(s.starts), 0)
                                               FROM postpone_rate_starts s
                                              WHERE s.queue = q.name
                                                AND s.until > v_now - r.period)
                   END))::integer ORDER BY q.ord),
               array_agg(k.max_per_key ORDER BY q.ord),
               array_agg(k.key_arg ORDER BY q.ord),
               coalesce(array_agg(q.name) FILTER (WHERE r.queue IS NOT NULL), '{}')
          INTO v_caps, v_klims, v_kargs, v_rated
          FROM unnest(v_queues) WITH ORDINALITY AS q(name, ord)
          LEFT JOIN postpone_queue_limits l ON l.queue = q.name
          LEFT JOIN postpone_key_limits k ON k.queue = q.name
          LEFT JOIN postpone_rate_limits r ON r.queue = q.name;

        RETURN QUERY
        WITH claimed AS (
            UPDATE postpone_jobs j
               SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
                   started_at = now()
             WHERE j.id = ANY(ARRAY(
                   SELECT x.id
                     FROM unnest(v_queues, v_caps, v_klims, v_kargs) AS q(name, cap, klim, karg),
                          LATERAL (
                              SELECT y.id, y.priority, y.scheduled_at
                                FROM (SELECT c.id, c.priority, c.scheduled_at, c.k,
                                             row_number() OVER (PARTITION BY c.k
                                                 ORDER BY c.priority DESC, c.scheduled_at, c.id)
                                                 AS rk
                                        FROM (SELECT c.id, c.priority, c.scheduled_at,
                                                     c.args -> q.karg AS k
                                                FROM postpone_jobs c
                                               WHERE c.queue = q.name
                                                 AND c.status = 'todo'
                                                 AND c.scheduled_at <= now()
                                                 AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                                 AND (c.lock IS NULL OR NOT EXISTS (
                                                      SELECT 1 FROM postpone_jobs e
                                                       WHERE e.lock = c.lock
                                                         AND e.status IN ('todo', 'doing')
                                                         AND (e.status = 'doing' OR e.id < c.id)))
                                                 AND (q.klim IS NULL OR (
                                                      SELECT count(*) FROM postpone_jobs d
                                                       WHERE d.queue = q.name
                                                         AND d.status = 'doing'
                                                         AND (d.args -> q.karg)
                                                             IS NOT DISTINCT FROM (c.args -> q.karg))
                                                      < q.klim)
                                               ORDER BY c.queue, c.priority DESC, c.scheduled_at,
                                                        c.id
                                               LIMIT CASE WHEN q.klim IS NULL THEN q.cap
                                                          ELSE q.cap::bigint * 4 END
                                                 FOR UPDATE SKIP LOCKED) c) y
                               WHERE q.klim IS NULL
                                  OR y.rk + (SELECT count(*) FROM postpone_jobs d
                                              WHERE d.queue = q.name
                                                AND d.status = 'doing'
                                                AND (d.args -> q.karg) IS NOT DISTINCT FROM y.k)
                                     <= q.klim
                               ORDER BY y.priority DESC, y.scheduled_at, y.id
                               LIMIT q.cap) x
                    WHERE q.cap > 0
                    ORDER BY x.priority DESC, x.scheduled_at, x.id
                    LIMIT p_limit))
               AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
            RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                      j.abort_requested, j.scheduled_at,
                      extract(epoch FROM now() - j.scheduled_at)::float8 AS queue_wait
        ), logged AS (
            INSERT INTO postpone_rate_starts AS s (queue, until, starts)
            SELECT b.queue,
                   'epoch'::timestamptz
                       + ((floor(extract(epoch FROM v_now) * 1000000 / b.us) + 1) * b.us)::bigint
                         * interval '1 microsecond',
                   b.n
              FROM (SELECT c.queue, count(*)::integer AS n,
                           greatest(1, floor(extract(epoch FROM r.period) * 10000)) AS us
                      FROM claimed c JOIN postpone_rate_limits r ON r.queue = c.queue
                     WHERE c.queue = ANY(v_rated)
                     GROUP BY c.queue, r.period) b
            ON CONFLICT (queue, until) DO UPDATE SET starts = s.starts + EXCLUDED.starts
        )
        SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock,
               c.abort_requested, c.scheduled_at, c.queue_wait
          FROM claimed c;
    ELSIF v_queues IS NULL THEN
        RETURN QUERY
        UPDATE postpone_jobs j
           SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
               started_at = now()
         WHERE j.id = ANY(ARRAY(
               SELECT c.id
                 FROM postpone_jobs c
                WHERE c.status = 'todo'
                  AND c.scheduled_at <= now()
                  AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                  AND (c.lock IS NULL OR NOT EXISTS (
                       SELECT 1 FROM postpone_jobs e
                        WHERE e.lock = c.lock
                          AND e.status IN ('todo', 'doing')
                          AND (e.status = 'doing' OR e.id < c.id)))
                ORDER BY c.priority DESC, c.scheduled_at, c.id
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED))
           AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
        RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                  j.abort_requested, j.scheduled_at,
                  extract(epoch FROM now() - j.scheduled_at)::float8;
    ELSE
        RETURN QUERY
        UPDATE postpone_jobs j
           SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
               started_at = now()
         WHERE j.id = ANY(ARRAY(
               SELECT c.id
                 FROM unnest(v_queues) AS q(name),
                      LATERAL (
                          SELECT c.id, c.priority, c.scheduled_at
                            FROM postpone_jobs c
                           WHERE c.queue = q.name
                             AND c.status = 'todo'
                             AND c.scheduled_at <= now()
                             AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                             AND (c.lock IS NULL OR NOT EXISTS (
                                  SELECT 1 FROM postpone_jobs e
                                   WHERE e.lock = c.lock
                                     AND e.status IN ('todo', 'doing')
                                     AND (e.status = 'doing' OR e.id < c.id)))
                           ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                           LIMIT p_limit
                             FOR UPDATE SKIP LOCKED) c
                ORDER BY c.priority DESC, c.scheduled_at, c.id
                LIMIT p_limit))
           AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
        RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                  j.abort_requested, j.scheduled_at,
                  extract(epoch FROM now() - j.scheduled_at)::float8;
    END IF;
END
$$;

-- How long until a rate limit lets the next job of any of `p_queues` (NULL: every queue)
-- start, in seconds: 0 when some listed rate-limited queue may start a job now, NULL when
-- none of them is rate limited. A worker that got fewer jobs than it asked for can sleep
-- that long rather than poll (the claim itself keeps its signature, for older workers); the
-- admin API's rate_limits reads the same figure.
CREATE FUNCTION postpone_rate_wait(p_queues text[]) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT min(CASE WHEN w.n < r.max_starts THEN 0
                    ELSE greatest(0, extract(epoch FROM (
                        SELECT b.until FROM (
                            SELECT s.until, sum(s.starts) OVER (ORDER BY s.until) AS freed
                              FROM postpone_rate_starts s
                             WHERE s.queue = r.queue AND s.until > clock_timestamp() - r.period) b
                         WHERE w.n - b.freed < r.max_starts
                         ORDER BY b.until LIMIT 1) + r.period - clock_timestamp()))
               END)::float8
      FROM postpone_rate_limits r
     CROSS JOIN LATERAL (SELECT coalesce(sum(s.starts), 0) AS n FROM postpone_rate_starts s
                          WHERE s.queue = r.queue
                            AND s.until > clock_timestamp() - r.period) w
     WHERE p_queues IS NULL OR r.queue = ANY(p_queues)
$$;
