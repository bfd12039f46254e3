-- postpone schema, version 9: workers know when the next scheduled job is due, and hear of
-- jobs scheduled for later.
--
-- Only additions (two functions) and a new body for the insert trigger's function that sends
-- one more kind of notification. A worker of an older version ignores that payload and
-- never calls the new functions: it keeps working as before.

-- When, after now(), the earliest waiting job of queues `p_queues` (NULL: every queue) is
-- due; NULL when none is. Paused queues are left out (a job there is not due for anyone
-- until the queue is resumed, and resuming wakes the workers). Jobs already due are left out
-- too: the claim called in the same statement (hence with the same now()) takes those. A job
-- scheduled for 'infinity' (only SQL written by hand can store one) is never due.
--
-- The due-jobs indexes lead with the priority, so the earliest `scheduled_at` is found by a
-- skip scan: one probe per distinct priority to find the next priority, one to find its
-- first job after now(). Its cost grows with the number of distinct priorities (and, for a
-- worker of given queues or when queues are paused, of queues), never with the number of
-- jobs. The planner settings fix that plan, as in postpone_claim.
CREATE FUNCTION postpone_next_due(p_queues text[]) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    v_queues text[] := p_queues;
    v_paused text[] := '{}';
    v_all boolean := false;
    v_q text;
    v_at timestamptz;
    v_min timestamptz;
BEGIN
    IF EXISTS (SELECT 1 FROM postpone_paused_queues) THEN
        SELECT coalesce(array_agg(p.queue) FILTER (WHERE p.queue IS NOT NULL), '{}'),
               coalesce(bool_or(p.queue IS NULL), false)
          INTO v_paused, v_all
          FROM postpone_paused_queues p;
        IF v_all THEN
            RETURN NULL;
        END IF;
        IF v_queues IS NULL THEN
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
        ELSE
            SELECT coalesce(array_agg(q.name), '{}') INTO v_queues
              FROM unnest(v_queues) AS q(name) WHERE q.name <> ALL(v_paused);
        END IF;
    END IF;

    IF v_queues IS NULL THEN
        WITH RECURSIVE ps(p) AS (
            (SELECT c.priority FROM postpone_jobs c
              WHERE c.status = 'todo' ORDER BY c.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT c.priority FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.priority < ps.p
                     ORDER BY c.priority DESC LIMIT 1)
              FROM ps WHERE ps.p IS NOT NULL
        )
        SELECT min((SELECT c.scheduled_at FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.priority = ps.p AND c.scheduled_at > now()
                     ORDER BY c.priority DESC, c.scheduled_at LIMIT 1))
          INTO v_min
          FROM ps WHERE ps.p IS NOT NULL;
        RETURN CASE WHEN isfinite(v_min) THEN v_min END;
    END IF;

    FOREACH v_q IN ARRAY v_queues LOOP
        WITH RECURSIVE ps(p) AS (
            (SELECT c.priority FROM postpone_jobs c
              WHERE c.queue = v_q AND c.status = 'todo'
              ORDER BY c.queue, c.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT c.priority FROM postpone_jobs c
                     WHERE c.queue = v_q AND c.status = 'todo' AND c.priority < ps.p
                     ORDER BY c.queue, c.priority DESC LIMIT 1)
              FROM ps WHERE ps.p IS NOT NULL
        )
        SELECT min((SELECT c.scheduled_at FROM postpone_jobs c
                     WHERE c.queue = v_q AND c.status = 'todo' AND c.priority = ps.p
                       AND c.scheduled_at > now()
                     ORDER BY c.queue, c.priority DESC, c.scheduled_at LIMIT 1))
          INTO v_at
          FROM ps WHERE ps.p IS NOT NULL;
        IF v_at IS NOT NULL AND (v_min IS NULL OR v_at < v_min) THEN
            v_min := v_at;
        END IF;
    END LOOP;
    RETURN CASE WHEN isfinite(v_min) THEN v_min END;
END
$$;

-- Tells the workers of queue `q` that a job of it is due at `at` (later than now). Payload
-- 'at:<microseconds since the epoch, on this server's clock>:<queue>', or with '*' for a
-- queue name too long for a payload (as postpone_wake). A worker that waits for a later
-- time, or for nothing, moves its wait earlier; one that waits for an earlier time ignores
-- it. Only a hint, as every notification.
CREATE FUNCTION postpone_wake_at(q text, at timestamptz) RETURNS void LANGUAGE sql AS $$
    SELECT pg_notify('postpone',
                     'at:' || floor(extract(epoch FROM at) * 1000000)::bigint::text || ':'
                     || CASE WHEN octet_length(q) <= 1000 THEN q ELSE '*' END)
$$;

-- The insert trigger's function: as in version 2 for jobs due now ('job:<queue>'), plus,
-- for each queue that got jobs due later, one 'at:' notification with the earliest of them
-- (none for 'infinity').
CREATE OR REPLACE FUNCTION postpone_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    q text;
    v_now boolean;
    v_at timestamptz;
BEGIN
    FOR q, v_now, v_at IN
        SELECT queue, bool_or(scheduled_at <= now()),
               min(scheduled_at) FILTER (WHERE scheduled_at > now() AND isfinite(scheduled_at))
          FROM postpone_new_jobs
         WHERE status = 'todo'
         GROUP BY queue
    LOOP
        IF v_now THEN
            PERFORM postpone_wake(q);
        END IF;
        IF v_at IS NOT NULL THEN
            PERFORM postpone_wake_at(q, v_at);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
