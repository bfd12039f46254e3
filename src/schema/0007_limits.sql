-- postpone schema, version 7: concurrency limits per queue. At most `max_running` jobs of a
-- queue run at once across every worker of the cluster.
--
-- Only additions: a table, an index and a claim function with the same signature. A worker
-- of version 5 or 6 still running during the upgrade calls the same postpone_claim and so
-- already obeys the limits.

-- The limits. A queue without a row has none. The queue need not have jobs yet.
CREATE TABLE postpone_queue_limits (
    queue       text        PRIMARY KEY,
    max_running integer     NOT NULL,
    set_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT postpone_queue_limits_name CHECK (queue <> ''),
    CONSTRAINT postpone_queue_limits_positive CHECK (max_running > 0)
);

-- The running jobs of one queue, counted by the claim of a limited queue (and by stats). Only
-- `doing` rows are in it: a few per worker thread.
CREATE INDEX postpone_jobs_doing_queue_idx ON postpone_jobs (queue) WHERE status = 'doing';

-- The claim of version 5, plus limits. When no limit exists (the usual case) the cost is one
-- more look at an empty table, then the very same statements and plans as in version 5.
--
-- When limits exist, the claim works per queue (as a worker of given queues does; a worker
-- of every queue first finds the queues with waiting jobs by the skip scan of version 5).
-- For each limited queue among them it takes a transaction-level advisory lock (class
-- 0x706f7374, key hashtext(queue); taken in key order, so two claimers cannot deadlock), then
-- counts the queue's running jobs and claims at most `max_running - running` of its jobs. The
-- lock is held until the claim commits, and each statement of this function takes a fresh
-- snapshot (READ COMMITTED, the default), so the next claimer of that queue counts the jobs
-- this one claimed: claims of a limited queue are serialised and never go past the limit.
-- A running job counts until it leaves `doing` (finished, failed, retried, snoozed, or
-- requeued by postpone_rescue when its worker is found dead), so a crashed worker's slots
-- come back with the rescue. A job finishing during a claim may be counted still running
-- (the claim takes fewer, never more); a lowered limit does not stop running jobs, it only
-- holds back claims until the queue is under it. Under REPEATABLE READ or SERIALIZABLE as
-- the default isolation the count would be stale: limits need READ COMMITTED.
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
    v_key integer;
BEGIN
    v_limited := EXISTS (SELECT 1 FROM postpone_queue_limits);
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

    IF v_limited AND EXISTS (SELECT 1 FROM postpone_queue_limits l
                              WHERE l.queue = ANY(v_queues)) THEN
        FOR v_key IN SELECT DISTINCT hashtext(l.queue) AS k FROM postpone_queue_limits l
                      WHERE l.queue = ANY(v_queues) ORDER BY k LOOP
            PERFORM pg_advisory_xact_lock(1886352244, v_key);
        END LOOP;
        -- A new statement, so a new snapshot: it sees every claim committed before the lock.
        SELECT array_agg(CASE WHEN l.max_running IS NULL THEN p_limit
                              ELSE greatest(0, least(p_limit, l.max_running - (
                                   SELECT count(*) FROM postpone_jobs d
                                    WHERE d.queue = q.name AND d.status = 'doing')))::integer
                         END ORDER BY q.ord)
          INTO v_caps
          FROM unnest(v_queues) WITH ORDINALITY AS q(name, ord)
          LEFT JOIN postpone_queue_limits l ON l.queue = q.name;

        RETURN QUERY
        UPDATE postpone_jobs j
           SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
               started_at = now()
         WHERE j.id = ANY(ARRAY(
               SELECT c.id
                 FROM unnest(v_queues, v_caps) AS q(name, cap),
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
                           LIMIT q.cap
                             FOR UPDATE SKIP LOCKED) c
                WHERE q.cap > 0
                ORDER BY c.priority DESC, c.scheduled_at, c.id
                LIMIT p_limit))
           AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
        RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                  j.abort_requested, j.scheduled_at,
                  extract(epoch FROM now() - j.scheduled_at)::float8;
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
