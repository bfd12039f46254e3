-- postpone schema, version 12: less work for the database per claim, per completion and
-- per defer.
--
-- Measured on this project's 2-core machine with pg_stat_statements (track = all,
-- track_planning = on), a worker fed 941 jobs/s one `defer` at a time (claims of about 3
-- jobs, outcomes riding on them): a claim cost 1.3 ms of server time and a recording of
-- outcomes 1.1 ms, and the server used 1.6 of the 2 cores. Much of it was planning:
--
-- * PostgreSQL plans a statement again at every execution whenever it judges a plan made
--   for the values at hand cheaper than a generic one, and planning a statement on
--   postpone_jobs is dear (its twelve partial indexes are each weighed against the query):
--   the claim's UPDATE was planned at every call (0.19 ms each), the recording of outcomes
--   at 28% of them (0.48 ms each), the reading of attempt limits at every call. The claim's
--   UPDATE (postpone_take) and the recording (postpone_finish) now run with
--   plan_cache_mode = force_generic_plan: planned once per session. A plan made once must
--   suit any table, so both are written so that their planner settings leave one plan
--   whatever the statistics say (see each function). The claim's other statements keep
--   PostgreSQL's own choice, which already kept their plans (they are plans over the due
--   index that no statistics change, or rare and joined, like the parking of held jobs).
-- * The claim statement evaluated postpone_next_due once per job it returned instead of
--   once per claim (the library's statement; fixed there, not here).
-- * The claim returns each job's own attempt limit (postpone_claim_jobs): the library read
--   it with one more probe per job, and with one more statement when the claim had taken a
--   job its statement's snapshot did not see yet (13% of claims at that rate).
-- * A claim with no limit and no pause configured checks that in one statement, and
--   runs no other statement about limits.
--
-- And one index entry less per defer: the queueing-lock index held an entry for every
-- waiting job, NULL queueing locks included (which never conflict). Leaving them out took
-- 18% off the server time of a 1,000-job insert. Every ON CONFLICT of the library that names
-- this index has named a predicate that fits both forms since the release before this one.
--
-- Workers of version 11 go on calling postpone_claim and sending their own recording
-- statement: both still work (postpone_claim now returns what postpone_claim_jobs does,
-- less the attempt limit).

DROP INDEX postpone_jobs_queueing_lock_idx;
CREATE UNIQUE INDEX postpone_jobs_queueing_lock_idx ON postpone_jobs (queueing_lock)
    WHERE status = 'todo' AND queueing_lock IS NOT NULL;

-- Claims jobs `p_ids` (walked and locked by the caller) for worker `p_worker`, unless the
-- worker's row is gone (it was presumed dead). Planned once per session: the only plan is a
-- probe of the primary key per id (no other index serves `id = ANY`, and neither a
-- sequential nor a bitmap scan may be used), whatever the statistics were when it was made.
CREATE FUNCTION postpone_take(p_worker bigint, p_ids bigint[])
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8, max_attempts integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE postpone_jobs j
       SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
           started_at = now()
     WHERE j.id = ANY(p_ids)
       AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
    RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
              j.abort_requested, j.scheduled_at,
              extract(epoch FROM now() - j.scheduled_at)::float8, j.max_attempts;
END
$$;

-- The claim of version 11 (see 0011_parked.sql for how it walks and parks), returning each
-- job's attempt limit too; the jobs it takes (queues without limits) are taken by
-- postpone_take.
CREATE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[],
                                    p_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8, max_attempts integer)
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
    v_any_paused boolean;
    v_caps integer[];
    v_klims integer[];
    v_kargs text[];
    v_rated text[];
    v_key integer;
    v_now timestamptz;
    v_want integer := p_limit;
    v_scan integer := p_limit;
    v_rounds integer := 0;
    v_ids bigint[];
    v_locks boolean;
    v_free bigint[];
    v_parked integer;
    v_n integer;
    v_q text;
    v_p integer;
    v_s timestamptz;
    v_i bigint;
    v_have integer;
BEGIN
    -- What is configured, in one statement.
    SELECT EXISTS (SELECT 1 FROM postpone_queue_limits)
           OR EXISTS (SELECT 1 FROM postpone_key_limits)
           OR EXISTS (SELECT 1 FROM postpone_rate_limits),
           EXISTS (SELECT 1 FROM postpone_paused_queues)
      INTO v_limited, v_any_paused;
    IF v_any_paused THEN
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
              WHERE c.status = 'todo' AND c.blocked_by IS NULL ORDER BY c.queue LIMIT 1)
            UNION ALL
            SELECT (SELECT c.queue FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.queue > qs.name
                     ORDER BY c.queue LIMIT 1)
              FROM qs WHERE qs.name IS NOT NULL
        )
        SELECT coalesce(array_agg(qs.name), '{}') INTO v_queues
          FROM qs WHERE qs.name IS NOT NULL AND qs.name <> ALL(v_paused);
    END IF;
    IF v_queues IS NOT NULL AND cardinality(v_queues) = 0 THEN
        RETURN;
    END IF;

    -- Nested, so that a claim with no limit configured runs no statement here.
    IF v_limited THEN
        v_limited := EXISTS (SELECT 1 FROM postpone_queue_limits l WHERE l.queue = ANY(v_queues))
                  OR EXISTS (SELECT 1 FROM postpone_key_limits l WHERE l.queue = ANY(v_queues))
                  OR EXISTS (SELECT 1 FROM postpone_rate_limits l WHERE l.queue = ANY(v_queues));
    END IF;
    IF v_limited THEN
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
                                                 AND c.blocked_by IS NULL
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
                      extract(epoch FROM now() - j.scheduled_at)::float8 AS queue_wait,
                      j.max_attempts
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
               c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts
          FROM claimed c;
    ELSE
        -- Rounds: take up to v_scan due jobs in claim order (rows other claimers hold are
        -- skipped); when some have a lock, park those their lock holds back and claim the
        -- others. A round that parked jobs is followed by a wider one, since the jobs it
        -- parked are out of the way: a claim parks every held-back job at the head of the
        -- queue, however many, then claims as if they were not there.
        LOOP
            v_rounds := v_rounds + 1;
            -- The due jobs, one priority at a time (highest first): the walk of a priority
            -- ends at its first job not due yet, and the next priority is found by one
            -- probe of the index, so jobs scheduled for later never lie in the walk, however
            -- many there are (a claim that found fewer due jobs than it asked for used to
            -- walk all of them, at every priority). A priority's walk starts at the first
            -- row its probe found: the dead entries that claims leave at the head of the
            -- index until a vacuum are stepped over once, by the probe. (A job that became
            -- visible between the probe and the walk with an earlier place is left to the
            -- next claim.)
            v_ids := '{}';
            v_locks := false;
            IF v_queues IS NULL THEN
                v_have := 0;
                SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                  FROM postpone_jobs c
                 WHERE c.status = 'todo' AND c.blocked_by IS NULL
                 ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                WHILE v_p IS NOT NULL LOOP
                    SELECT v_ids || coalesce(array_agg(x.id ORDER BY x.scheduled_at, x.id), '{}'),
                           v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                           v_have + count(*)
                      INTO v_ids, v_locks, v_have
                      FROM (SELECT c.id, c.lock, c.scheduled_at
                              FROM postpone_jobs c
                             WHERE c.status = 'todo'
                               AND c.blocked_by IS NULL
                               AND c.priority = v_p
                               AND (c.scheduled_at, c.id) >= (v_s, v_i)
                               AND c.scheduled_at <= now()
                               AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                             ORDER BY c.priority DESC, c.scheduled_at, c.id
                             LIMIT v_scan - v_have
                               FOR UPDATE SKIP LOCKED) x;
                    EXIT WHEN v_have >= v_scan;
                    SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                      FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.priority < v_p
                     ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                END LOOP;
            ELSE
                FOREACH v_q IN ARRAY v_queues LOOP
                    v_have := 0;
                    SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                      FROM postpone_jobs c
                     WHERE c.queue = v_q AND c.status = 'todo' AND c.blocked_by IS NULL
                     ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                    WHILE v_p IS NOT NULL LOOP
                        SELECT v_ids || coalesce(array_agg(x.id ORDER BY x.scheduled_at, x.id),
                                                 '{}'),
                               v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                               v_have + count(*)
                          INTO v_ids, v_locks, v_have
                          FROM (SELECT c.id, c.lock, c.scheduled_at
                                  FROM postpone_jobs c
                                 WHERE c.queue = v_q
                                   AND c.status = 'todo'
                                   AND c.blocked_by IS NULL
                                   AND c.priority = v_p
                                   AND (c.scheduled_at, c.id) >= (v_s, v_i)
                                   AND c.scheduled_at <= now()
                                   AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                 ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                 LIMIT v_scan - v_have
                                   FOR UPDATE SKIP LOCKED) x;
                        EXIT WHEN v_have >= v_scan;
                        SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                          FROM postpone_jobs c
                         WHERE c.queue = v_q AND c.status = 'todo' AND c.blocked_by IS NULL
                           AND c.priority < v_p
                         ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                    END LOOP;
                END LOOP;
                -- Claim order across queues.
                IF cardinality(v_queues) > 1 AND cardinality(v_ids) > 1 THEN
                    v_ids := ARRAY(SELECT c.id FROM postpone_jobs c WHERE c.id = ANY(v_ids)
                                    ORDER BY c.priority DESC, c.scheduled_at, c.id
                                    LIMIT v_scan);
                END IF;
            END IF;

            IF v_locks THEN
                -- A job is held back by the latest earlier job of its lock still waiting or
                -- running, else by its lock's running job. It is parked (blocked_by) only
                -- while this transaction holds a share lock on that job's row, taken on its
                -- latest version, which must still be waiting or running: the job cannot
                -- leave (nor go back from running to waiting) before this claim commits,
                -- and its leaving clears blocked_by in the same statement (the trigger of
                -- postpone_notify_done), so no job stays parked behind a job that left.
                -- A row locked by anyone else is not waited for: the job is not parked this
                -- time, and not claimed.
                WITH judged AS MATERIALIZED (
                    SELECT u.ord, u.id,
                           CASE WHEN c.lock IS NOT NULL THEN coalesce(
                               (SELECT e.id FROM postpone_jobs e
                                 WHERE e.lock = c.lock AND e.status IN ('todo', 'doing')
                                   AND e.id < c.id
                                 ORDER BY e.id DESC LIMIT 1),
                               (SELECT e.id FROM postpone_jobs e
                                 WHERE e.lock = c.lock AND e.status = 'doing'
                                   AND e.id <> c.id LIMIT 1))
                           END AS by
                      FROM unnest(v_ids) WITH ORDINALITY AS u(id, ord)
                      JOIN postpone_jobs c ON c.id = u.id
                ), parked AS (
                    UPDATE postpone_jobs j
                       SET blocked_by = b.id
                      FROM judged c
                      CROSS JOIN LATERAL (
                          SELECT e.id FROM postpone_jobs e
                           WHERE e.id = c.by AND e.status IN ('todo', 'doing')
                             FOR SHARE SKIP LOCKED) b
                     WHERE j.id = c.id
                    RETURNING j.id
                )
                SELECT (SELECT count(*) FROM parked)::integer,
                       ARRAY(SELECT c.id FROM judged c WHERE c.by IS NULL
                              ORDER BY c.ord LIMIT v_want)
                  INTO v_parked, v_free;
            ELSE
                v_parked := 0;
                v_free := v_ids[1:v_want];
            END IF;

            IF cardinality(v_free) > 0 THEN
                RETURN QUERY SELECT * FROM postpone_take(p_worker, v_free);
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_want := v_want - v_n;
            END IF;
            EXIT WHEN v_parked = 0 OR v_want <= 0 OR v_rounds >= 20;
            v_scan := greatest(v_want, least(v_scan * 2, 16384));
        END LOOP;
    END IF;
END
$$;


-- The claim of version 11, for workers of that version.
CREATE OR REPLACE FUNCTION postpone_claim(p_worker bigint, p_limit integer, p_queues text[],
                                          p_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8)
LANGUAGE sql
AS $$
    SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock, c.abort_requested,
           c.scheduled_at, c.queue_wait
      FROM postpone_claim_jobs(p_worker, p_limit, p_queues, p_tasks) c
$$;

-- Records the final outcomes of many attempts at once: the statement that the library of
-- version 11 sent itself (see JOB_FINISH_BATCH in src/store.rs), now planned once per
-- session. Arrays: job ids, the fence of each attempt (the worker identity that claimed it
-- and the attempt number the claim gave it), the outcome (succeeded, failed, cancelled,
-- aborted, delete), the error text to append, the output to store (with succeeded only).
-- Returns the ids whose outcome was recorded.
--
-- Planned once per session, so the plan must not depend on the statistics of the moment it
-- was made. The rows are reached through `id = ANY(p_ids)`, a probe of the primary key per
-- outcome (the guards use IS NOT DISTINCT FROM, which no index serves, so no plan can walk
-- the index of running jobs instead), and joined to the outcomes by hash: no nested loop,
-- which could rescan the outcomes for every row, and no merge join, which could walk the
-- whole primary key in order. Without the `id = ANY` bound, a plan made while the table was
-- nearly empty walked the whole primary key at every recording: 1.6 ms for 4 outcomes after
-- a few seconds, growing with the table.
CREATE FUNCTION postpone_finish(p_ids bigint[], p_workers bigint[], p_attempts integer[],
                                p_outcomes text[], p_errors text[], p_outputs jsonb[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_nestloop = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_workers, p_attempts, p_outcomes, p_errors, p_outputs)
            AS o(id, worker, attempt, outcome, error, output)
    ), updated AS (
        UPDATE postpone_jobs j
           SET status = CASE WHEN j.abort_requested THEN 'aborted' ELSE o.outcome END,
               finished_at = now(),
               output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                             THEN o.output ELSE j.output END,
               errors = CASE
                   WHEN o.error IS NULL AND NOT (j.abort_requested AND o.outcome <> 'aborted')
                       THEN j.errors
                   ELSE coalesce(j.errors, '[]'::jsonb)
                        || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                ELSE jsonb_build_array(jsonb_build_object(
                                    'attempt', j.attempts, 'at', now(), 'error', o.error)) END
                        || CASE WHEN j.abort_requested AND o.outcome <> 'aborted'
                                THEN jsonb_build_array(jsonb_build_object(
                                    'attempt', j.attempts, 'at', now(),
                                    'error', format('aborted on request while it ran (its task ended %s before the worker saw the request)',
                                                    CASE WHEN o.outcome = 'delete' THEN 'succeeded'
                                                         ELSE o.outcome END)))
                                ELSE '[]'::jsonb END END
          FROM o
         WHERE j.id = o.id AND j.id = ANY(p_ids)
           AND (o.outcome <> 'delete' OR j.abort_requested IS NOT DISTINCT FROM true)
           AND j.status IS NOT DISTINCT FROM 'doing'
           AND j.worker_id IS NOT DISTINCT FROM o.worker
           AND j.attempts IS NOT DISTINCT FROM o.attempt
        RETURNING j.id
    ), deleted AS (
        DELETE FROM postpone_jobs j
         USING o
         WHERE j.id = o.id AND j.id = ANY(p_ids) AND o.outcome = 'delete'
           AND j.abort_requested IS NOT DISTINCT FROM false
           AND j.status IS NOT DISTINCT FROM 'doing'
           AND j.worker_id IS NOT DISTINCT FROM o.worker
           AND j.attempts IS NOT DISTINCT FROM o.attempt
        RETURNING j.id
    )
    SELECT id FROM updated UNION ALL SELECT id FROM deleted;
END
$$;
