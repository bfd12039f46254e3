-- postpone schema, version 27: bounded arguments (issue 44).
--
-- * postpone_settings: one row of settings every part of a deployment reads. Its
--   max_args_bytes (default 16 MiB) is the most a job's arguments may weigh, as JSON text as
--   PostgreSQL writes it (`octet_length(args::text)`, which is what a worker receives):
--   every INSERT into postpone_jobs, by the library, postpone_defer or SQL written by hand,
--   with larger arguments fails with SQLSTATE 54000 (program_limit_exceeded), naming the
--   constraint postpone_max_args_bytes, the size and the limit. The check runs in the
--   table's insert trigger (one per statement, already there), before anything else it
--   does. Jobs already stored are not checked, nor are updates: no statement that touches
--   many jobs can be failed by one of them.
--
-- * The claim takes a byte budget: postpone_claim_jobs with seven arguments, the five of
--   version 25 then p_bytes (the most bytes of arguments it returns; NULL: no bound) and
--   p_alone (whether a first job larger than p_bytes may be returned alone: the worker
--   holds no job waiting). It takes the jobs in claim order while their arguments' total
--   (as JSON text) stays within p_bytes; the others it walked stay waiting, untouched. When
--   it left one out for its size, the transaction's setting postpone.cut is 'on' (the
--   library's claim statement returns it), so that the worker claims again once it has
--   room rather than waiting for news. In a queue with a limit (concurrency, rate or key)
--   the claim starts at most the worker's free threads, as before, with no byte bound: those
--   jobs are running, not held. The five-argument function and postpone_claim are
--   unchanged: workers of earlier versions keep working.

CREATE TABLE postpone_settings (
    one boolean PRIMARY KEY DEFAULT true CONSTRAINT postpone_settings_one CHECK (one),
    max_args_bytes bigint NOT NULL DEFAULT 16777216
        CONSTRAINT postpone_settings_max_args_bytes
            CHECK (max_args_bytes BETWEEN 1 AND 1073741823),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO postpone_settings DEFAULT VALUES ON CONFLICT DO NOTHING;

-- The insert trigger's function of version 11, with the arguments' limit checked first.
-- Every new row's arguments are measured as text (about a microsecond for a small value):
-- their stored size says nothing of it (a number such as 1e-1000 is a few bytes stored and
-- a thousand as text; a compressible value stores in a hundredth of its size).
CREATE OR REPLACE FUNCTION postpone_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    q text;
    v_now boolean;
    v_at timestamptz;
    v_max bigint;
    v_size bigint;
    v_task text;
BEGIN
    -- A missing row (deleted by hand) means the default.
    SELECT coalesce((SELECT s.max_args_bytes FROM postpone_settings s), 16777216) INTO v_max;
    SELECT n.size, n.task INTO v_size, v_task
      FROM (SELECT octet_length(j.args::text)::bigint AS size, j.task
              FROM postpone_new_jobs j) n
     WHERE n.size > v_max
     LIMIT 1;
    IF v_size IS NOT NULL THEN
        RAISE EXCEPTION 'the arguments of a job of task % are % bytes of JSON, more than the % allowed',
                        left(v_task, 255), v_size, v_max
            USING ERRCODE = 'program_limit_exceeded',
                  CONSTRAINT = 'postpone_max_args_bytes',
                  HINT = 'store large data elsewhere and pass a reference to it, or raise the limit: UPDATE postpone_settings SET max_args_bytes = N (Admin::set_max_args_bytes)';
    END IF;
    IF current_setting('postpone.quiet_insert', true) = 'on' THEN
        RETURN NULL;
    END IF;
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

-- The claim of version 25 with the byte budget (see the header), read from the
-- transaction's setting postpone.bytes that the seven-argument function sets around it.
CREATE OR REPLACE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[],
                                    p_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8, max_attempts integer, expires_in float8)
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
    v_tids tid[];
    v_locks boolean;
    v_free bigint[];
    v_free_tids tid[];
    v_map jsonb;
    v_parked integer;
    v_n integer;
    v_q text;
    v_p integer;
    v_s timestamptz;
    v_i bigint;
    v_have integer;
    -- The claim's byte budget, set by the seven-argument postpone_claim_jobs (NULL: none),
    -- and whether a first job larger than it may be taken alone.
    v_bytes bigint := nullif(current_setting('postpone.bytes', true), '')::bigint;
    v_alone boolean := current_setting('postpone.alone', true) IS NOT DISTINCT FROM 'on';
    v_used bigint;
    v_cut boolean := false;
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
               SET status = 'doing', worker_id = p_worker,
                   attempts = least(j.attempts, 2147483646) + 1, started_at = now()
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
                                                 AND (c.expires_at IS NULL OR c.expires_at > now())
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
                      CASE WHEN isfinite(j.scheduled_at)
                           THEN extract(epoch FROM now() - j.scheduled_at)::float8
                      END AS queue_wait,
                      j.max_attempts,
                      CASE WHEN isfinite(j.expires_at)
                           THEN extract(epoch FROM j.expires_at - now())::float8
                      END AS expires_in
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
               c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, c.expires_in
          FROM claimed c;
    ELSE
        -- Rounds: take up to v_scan due jobs in claim order (rows other claimers hold are
        -- skipped); when some have a lock, park those their lock holds back and claim the
        -- others. A round that parked jobs is followed by another, since the jobs it parked
        -- are out of the way: a claim parks every held-back job at the head of the queue,
        -- however many, then claims as if they were not there.
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
            v_tids := '{}';
            v_locks := false;
            IF v_queues IS NULL THEN
                v_have := 0;
                SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                  FROM postpone_jobs c
                 WHERE c.status = 'todo' AND c.blocked_by IS NULL
                 ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                WHILE v_p IS NOT NULL LOOP
                    SELECT v_ids || coalesce(array_agg(x.id ORDER BY x.scheduled_at, x.id), '{}'),
                           v_tids || coalesce(array_agg(x.ctid ORDER BY x.scheduled_at, x.id),
                                              '{}'),
                           v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                           v_have + count(*)
                      INTO v_ids, v_tids, v_locks, v_have
                      FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at
                              FROM postpone_jobs c
                             WHERE c.status = 'todo'
                               AND c.blocked_by IS NULL
                               AND c.priority = v_p
                               AND (c.scheduled_at, c.id) >= (v_s, v_i)
                               AND c.scheduled_at <= now()
                               AND (c.expires_at IS NULL OR c.expires_at > now())
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
                               v_tids || coalesce(array_agg(x.ctid ORDER BY x.scheduled_at, x.id),
                                              '{}'),
                               v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                               v_have + count(*)
                          INTO v_ids, v_tids, v_locks, v_have
                          FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at
                                  FROM postpone_jobs c
                                 WHERE c.queue = v_q
                                   AND c.status = 'todo'
                                   AND c.blocked_by IS NULL
                                   AND c.priority = v_p
                                   AND (c.scheduled_at, c.id) >= (v_s, v_i)
                                   AND c.scheduled_at <= now()
                                   AND (c.expires_at IS NULL OR c.expires_at > now())
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
                    SELECT coalesce(array_agg(o.id ORDER BY o.priority DESC, o.scheduled_at, o.id),
                                    '{}'),
                           coalesce(array_agg(o.ctid ORDER BY o.priority DESC, o.scheduled_at,
                                                  o.id), '{}')
                      INTO v_ids, v_tids
                      FROM (SELECT c.id, c.ctid, c.priority, c.scheduled_at
                              FROM postpone_jobs c WHERE c.id = ANY(v_ids)
                             ORDER BY c.priority DESC, c.scheduled_at, c.id
                             LIMIT v_scan) o;
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
                SELECT coalesce(array_agg(c.id ORDER BY c.priority DESC, c.scheduled_at, c.id)
                                    FILTER (WHERE c.by IS NULL), '{}'),
                       coalesce(array_agg(c.ctid ORDER BY c.priority DESC, c.scheduled_at, c.id)
                                    FILTER (WHERE c.by IS NULL), '{}'),
                       coalesce(jsonb_object_agg(c.id::text, c.by) FILTER (WHERE c.by IS NOT NULL),
                                '{}')
                  INTO v_free, v_free_tids, v_map
                  FROM (SELECT c.id, c.ctid, c.priority, c.scheduled_at,
                               CASE WHEN c.lock IS NOT NULL THEN coalesce(
                                   (SELECT e.id FROM postpone_jobs e
                                     WHERE e.lock = c.lock AND e.status IN ('todo', 'doing')
                                       AND e.id < c.id
                                     ORDER BY e.id DESC LIMIT 1),
                                   (SELECT e.id FROM postpone_jobs e
                                     WHERE e.lock = c.lock AND e.status = 'doing'
                                       AND e.id <> c.id LIMIT 1))
                               END AS by
                          FROM postpone_jobs c
                         WHERE c.id = ANY(v_ids)
                        OFFSET 0) c;
                v_free := v_free[1:v_want];
                v_free_tids := v_free_tids[1:v_want];
                IF v_map = '{}' THEN
                    v_parked := 0;
                ELSE
                    UPDATE postpone_jobs j
                       SET blocked_by = (v_map ->> j.id::text)::bigint
                     WHERE j.id = ANY(ARRAY(SELECT k::bigint FROM jsonb_object_keys(v_map) k))
                       AND EXISTS (SELECT 1 FROM postpone_jobs e
                                    WHERE e.id = (v_map ->> j.id::text)::bigint
                                      AND e.status IN ('todo', 'doing')
                                      FOR SHARE SKIP LOCKED);
                    GET DIAGNOSTICS v_parked = ROW_COUNT;
                END IF;
            ELSE
                v_parked := 0;
                v_free := v_ids[1:v_want];
                v_free_tids := v_tids[1:v_want];
            END IF;

            -- The byte budget: the jobs, in claim order, whose arguments (as JSON text, as
            -- the worker receives them) fit in what is left of it; a first job larger than
            -- the whole budget alone when the worker holds nothing else. The rows left out
            -- stay waiting, unchanged (their row locks end with the claim's transaction).
            IF v_bytes IS NOT NULL AND cardinality(v_free_tids) > 0 THEN
                SELECT coalesce(array_agg(t.tid ORDER BY t.ord)
                                    FILTER (WHERE t.run <= v_bytes OR (t.ord = 1 AND v_alone)),
                                '{}'),
                       coalesce(max(t.run)
                                    FILTER (WHERE t.run <= v_bytes OR (t.ord = 1 AND v_alone)),
                                0),
                       coalesce(bool_or(t.run > v_bytes AND NOT (t.ord = 1 AND v_alone)), false)
                  INTO v_free_tids, v_used, v_cut
                  FROM (SELECT u.tid, u.ord,
                               sum(octet_length(c.args::text)) OVER (ORDER BY u.ord) AS run
                          FROM unnest(v_free_tids) WITH ORDINALITY AS u(tid, ord)
                          JOIN postpone_jobs c ON c.ctid = u.tid) t;
                v_free := v_free[1:cardinality(v_free_tids)];
                v_bytes := v_bytes - v_used;
                v_alone := v_alone AND cardinality(v_free_tids) = 0;
                IF v_cut THEN
                    PERFORM set_config('postpone.cut', 'on', true);
                END IF;
            END IF;

            IF cardinality(v_free) > 0 THEN
                RETURN QUERY SELECT * FROM postpone_take_at(p_worker, v_free_tids);
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_want := v_want - v_n;
            END IF;
            EXIT WHEN v_parked = 0 OR v_want <= 0 OR v_rounds >= 20 OR v_cut;
            -- A round that found only held-back jobs is followed by a wider one (the run of
            -- them at the head may be long); one that reached free jobs has passed that run,
            -- and the next walks (and locks) only as many jobs as are still wanted.
            v_scan := CASE WHEN cardinality(v_free) > 0 THEN v_want
                           ELSE greatest(v_want, least(v_scan * 2, 16384)) END;
        END LOOP;
    END IF;
END
$$;


CREATE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[],
                                    p_tasks text[], p_start integer, p_bytes bigint,
                                    p_alone boolean)
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8, max_attempts integer, held boolean, expires_in float8)
LANGUAGE plpgsql
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('postpone.bytes',
                      CASE WHEN p_bytes IS NULL THEN '' ELSE greatest(p_bytes, 0)::text END, true);
    PERFORM set_config('postpone.alone', CASE WHEN p_alone THEN 'on' ELSE 'off' END, true);
    PERFORM set_config('postpone.cut', 'off', true);
    RETURN QUERY
        SELECT * FROM postpone_claim_jobs(p_worker, p_limit, p_queues, p_tasks, p_start);
    PERFORM set_config('postpone.bytes', '', true);
    PERFORM set_config('postpone.alone', 'off', true);
END
$$;
