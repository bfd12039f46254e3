-- postpone schema, version 5: flow control. Queues can be paused (one queue, or all of them)
-- and the claim honours it.
--
-- Only additions: a new table and a claim function with the same signature. A worker of
-- version 4 still running during the upgrade keeps working, and already obeys pauses (it
-- calls the same postpone_claim).

-- Paused queues. A row whose `queue` is NULL pauses every queue (at most one such row). The
-- table is the truth: a worker never claims a job of a paused queue, whatever notifications
-- it got or missed. Resuming deletes the row and wakes the workers.
CREATE TABLE postpone_paused_queues (
    queue     text,
    paused_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT postpone_paused_queues_name CHECK (queue IS NULL OR queue <> '')
);
CREATE UNIQUE INDEX postpone_paused_queues_queue_idx ON postpone_paused_queues (queue);
CREATE UNIQUE INDEX postpone_paused_queues_all_idx ON postpone_paused_queues ((true))
    WHERE queue IS NULL;

-- The claim of version 3, plus pauses. When nothing is paused (the usual case) the cost is
-- one look at the empty paused-queues table, then the very same statements and plans as in
-- version 3. When some queues are paused:
--   - every queue paused: nothing is claimed;
--   - a worker of given queues: the paused ones are removed from its list;
--   - a worker of every queue: the queues that have waiting jobs are found by a skip scan of
--     the queue index (one index probe per distinct queue, not per job), the paused ones
--     removed, and the claim then walks each remaining queue as a worker of given queues does.
--     A paused queue's backlog is therefore never walked.
-- A pause applies to the claims that start after it commits (a claim already under way may
-- still take the jobs it found, as a job already running finishes).
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
    v_paused text[];
    v_all boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM postpone_paused_queues) THEN
        SELECT coalesce(array_agg(p.queue) FILTER (WHERE p.queue IS NOT NULL), '{}'),
               coalesce(bool_or(p.queue IS NULL), false)
          INTO v_paused, v_all
          FROM postpone_paused_queues p;
        IF v_all THEN
            RETURN;
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
        IF cardinality(v_queues) = 0 THEN
            RETURN;
        END IF;
    END IF;

    IF v_queues IS NULL THEN
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

-- How many times a job asked to run again later without using an attempt (a snooze); shown
-- with the job. A constant default: no table rewrite.
ALTER TABLE postpone_jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;

-- A snooze: the attempts `p_ids`/`p_workers`/`p_attempts` (the fences, as for
-- postpone_requeue) go back to `todo`, due after `p_delays_us`, their attempt given back and
-- no error recorded, through postpone_requeue (the one way back to `todo`: an abort request
-- still ends the job `aborted`, a queueing-lock collision still ends it `superseded`). The
-- jobs that went back to `todo` count one more snooze; that count is a record only: if
-- something refuses it (a trigger of the user's), the jobs are requeued all the same.
-- Returns what postpone_requeue returns.
CREATE FUNCTION postpone_snooze(p_ids bigint[], p_workers bigint[], p_attempts integer[],
                                p_delays_us bigint[])
RETURNS TABLE (job_id bigint, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_outcomes text[];
BEGIN
    SELECT coalesce(array_agg(r.job_id), '{}'), coalesce(array_agg(r.outcome), '{}')
      INTO v_ids, v_outcomes
      FROM postpone_requeue(p_ids, p_workers, p_attempts, p_delays_us,
                            NULL::text[],
                            array_fill(true, ARRAY[coalesce(cardinality(p_ids), 0)])) r;
    BEGIN
        UPDATE postpone_jobs j
           SET snoozes = j.snoozes + 1
          FROM unnest(v_ids, v_outcomes) AS r(id, outcome)
         WHERE j.id = r.id AND r.outcome = 'todo';
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_outcomes);
END
$$;

-- The attempt limit a job was deferred with (at least 1, checked by the library), overriding
-- its task's retry strategy; NULL: the strategy decides.
ALTER TABLE postpone_jobs ADD COLUMN max_attempts integer;

-- Tags and metadata given when a job was deferred: a text array and a JSON object, for the
-- operators (filtering, context); workers do not read them. No index: the admin filters that
-- use them scan the jobs as the other admin filters do.
ALTER TABLE postpone_jobs
    ADD COLUMN tags text[],
    ADD COLUMN meta jsonb;
