-- postpone schema, version 51: a claim that names many queues costs a few statements, not
-- a few per queue.
--
-- A claim merges a walk of each named queue (and of its jobs with a deadline, when any
-- wait): a worker that names its queues, or a worker of every queue while some queues are
-- paused or limited (it then names the queues with due jobs). Each walk cost the claim at
-- least one statement, and since schema 50 the walk to take the next turn was found by
-- reading the place of every walk: a claim of 100 jobs naming 1,000 queues, with jobs with
-- a deadline among the others, took about 1 s (150 ms at schema 49).
--
-- With more than 64 walks, the walks now take their turns in rounds, each round one
-- statement for all of them (a lateral join of the walks and the jobs, each walk locking
-- at most its turn's jobs). One statement finds where every walk starts (its first job,
-- for the jobs with a deadline its first after the earliest time a live one can be
-- scheduled at); walks whose place is before a job not due yet move to their next
-- priority, one statement for all of them, as often as there are priorities; each round
-- gives a turn to the walks whose place comes before the bound, in claim order, while
-- their turns add up to fewer than an eighth of the claim (at least 32 jobs, or the
-- claim; at least 2 jobs a walk); a walk whose turn took all it asked for takes twice as
-- many at its next, one that took fewer moves to its next priority. The bound is computed again after every
-- round that holds more than the claim. Claims of 64 walks or fewer take their turns as in
-- schema 50.
--
-- A queue named twice in a claim is walked once. Two walks of one queue took the same
-- jobs (a transaction's own row locks do not make its walks skip them), and the merge
-- counted them twice: a claim of 12 jobs naming a queue ten times and two others claimed
-- 5 of the 15 waiting.

CREATE OR REPLACE FUNCTION postpone_claim_batch(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[])
 RETURNS TABLE(id bigint, queue text, task text, args json, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, expires_in double precision, locked boolean)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_sort TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
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
    -- The claim's byte budget, set by the seven-argument postpone_claim_batch (NULL: none),
    -- and whether a first job larger than it may be taken alone.
    v_bytes bigint := nullif(current_setting('postpone.bytes', true), '')::bigint;
    v_alone boolean := current_setting('postpone.alone', true) IS NOT DISTINCT FROM 'on';
    v_used bigint;
    v_cut boolean := false;
    -- The sizes of the arguments of the jobs in v_ids and v_free (in the same order; NULLs
    -- when the claim has no budget).
    v_sizes integer[];
    v_free_sizes integer[];
    -- Whether the walks measure (with a budget, when no merge of queues visits the rows
    -- again).
    v_measure boolean;
    -- Whether any waiting job has a deadline, and the earliest time a live one can be
    -- scheduled at (see the header).
    v_deadlines boolean := false;
    v_from timestamptz;
    v_merge boolean;
    -- Whether claimed jobs are held, not started (set by the five- and seven-argument
    -- postpone_claim_jobs).
    v_hold boolean := current_setting('postpone.hold', true) IS NOT DISTINCT FROM 'on';
    -- Whether jobs that need no row of their own while they run are only locked, left
    -- `todo` for the worker to write once, in this transaction, with their outcome (set
    -- by the eight-argument postpone_claim_batch; see postpone_settle_locked).
    v_lock_only boolean := v_hold
        AND current_setting('postpone.lock_only', true) IS NOT DISTINCT FROM 'on';
    -- The jobs of workers whose claim's transaction was lost while they ran them (see
    -- postpone_lost_jobs): no claim takes them until their worker wrote what became of
    -- them, or the rescue did; and, in a claim of several rounds, the jobs its earlier
    -- rounds only locked. NULL: none.
    v_lost int8multirange;
    -- The merge of several queues' walks: each queue's place (priority, scheduled time and id
    -- after which its walk goes on; NULL priority: no more due jobs), the keys of the jobs the
    -- walks hold (beside v_ids), the bound (NULL: none yet), and each walk's share and end.
    v_k integer;
    v_wp bigint;
    v_nw integer;
    v_qi integer;
    v_j integer;
    v_st_p bigint[];
    v_st_s timestamptz[];
    v_st_i bigint[];
    v_kp integer[];
    v_ks timestamptz[];
    v_cp integer;
    v_cs timestamptz;
    v_ci bigint;
    v_bs timestamptz;
    v_bi bigint;
    v_step integer;
    v_lim integer;
    v_recut integer;
    v_ls timestamptz;
    v_li bigint;
    -- The rounds of many walks: each walk's turn size; a round's walks and their queues,
    -- places and turn sizes (v_r*: jobs without a deadline, v_d*: with one); what each
    -- walk's turn took (how many, and the last job's place); the walks that move to their
    -- next priority.
    v_wl integer[];
    v_cap integer;
    v_wq text[];
    v_rn integer[];
    v_rq text[];
    v_rp bigint[];
    v_rs timestamptz[];
    v_ri bigint[];
    v_rbs timestamptz[];
    v_rbi bigint[];
    v_rl integer[];
    v_dn integer[];
    v_dq text[];
    v_dp bigint[];
    v_ds timestamptz[];
    v_di bigint[];
    v_dbs timestamptz[];
    v_dbi bigint[];
    v_dl integer[];
    v_tn integer[];
    v_tg integer[];
    v_ts timestamptz[];
    v_ti bigint[];
    v_mv integer[];
BEGIN
    IF EXISTS (SELECT 1 FROM postpone_workers w WHERE w.claim_xids IS NOT NULL) THEN
        v_lost := postpone_lost_jobs();
    END IF;
    -- What is configured, in one statement; and the named queues, each once: two walks of
    -- a queue named twice would take the same jobs (this transaction's own locks do not
    -- make its walks skip them), and the merge would count them twice and claim fewer.
    SELECT EXISTS (SELECT 1 FROM postpone_queue_limits)
           OR EXISTS (SELECT 1 FROM postpone_key_limits)
           OR EXISTS (SELECT 1 FROM postpone_rate_limits),
           EXISTS (SELECT 1 FROM postpone_paused_queues),
           CASE WHEN cardinality(v_queues) > 1
                THEN ARRAY(SELECT DISTINCT ON (q.name) q.name
                             FROM unnest(v_queues) WITH ORDINALITY AS q(name, ord)
                            ORDER BY q.name, q.ord)
                ELSE v_queues END
      INTO v_limited, v_any_paused, v_queues;
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
        v_queues := postpone_due_queues(v_paused);
    END IF;
    IF v_queues IS NOT NULL AND cardinality(v_queues) = 0 THEN
        RETURN;
    END IF;

    -- The jobs with a deadline: whether there are any (one probe of an index that holds
    -- only them), and the longest time between a waiting one's scheduled time and its
    -- deadline, which bounds where the live ones can be.
    v_from := postpone_expiring_from();
    v_deadlines := v_from IS NOT NULL;

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
                                        FROM ((SELECT * FROM (SELECT c.id, c.priority, c.scheduled_at,
                                                     (c.args -> q.karg)::text AS k
                                                FROM postpone_jobs c
                                               WHERE c.queue = q.name
                                                 AND c.status = 'todo'
                                                 AND c.blocked_by IS NULL
                                                 AND c.scheduled_at <= now()
                                                 AND c.expires_at IS NULL
                                                 AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                                 AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                                 AND (c.lock IS NULL OR NOT EXISTS (
                                                      SELECT 1 FROM postpone_jobs e
                                                       WHERE e.lock = c.lock
                                                         AND e.status IN ('todo', 'doing')
                                                         AND (e.status = 'doing' OR e.id < c.id)))
                                                 AND (q.klim IS NULL OR (
                                                      SELECT count(*) FROM postpone_jobs d
                                                       WHERE d.queue = q.name
                                                         AND d.status = 'doing'
                                                         AND (d.args -> q.karg)::text
                                                             IS NOT DISTINCT FROM (c.args -> q.karg)::text)
                                                      < q.klim)
                                               ORDER BY c.queue, c.priority DESC, c.scheduled_at,
                                                        c.id
                                               LIMIT CASE WHEN q.klim IS NULL THEN q.cap
                                                          ELSE q.cap::bigint * 4 END
                                                 FOR UPDATE SKIP LOCKED) a)
                                              UNION ALL
                                              (SELECT * FROM (SELECT c.id, c.priority, c.scheduled_at,
                                                     (c.args -> q.karg)::text AS k
                                                FROM postpone_jobs c
                                               WHERE c.queue = q.name
                                                 AND c.status = 'todo'
                                                 AND c.blocked_by IS NULL
                                                 AND c.scheduled_at <= now()
                                                 AND c.expires_at IS NOT NULL
                                                 AND c.expires_at > now()
                                                 AND c.scheduled_at > v_from
                                                 AND v_deadlines
                                                 AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                                 AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                                 AND (c.lock IS NULL OR NOT EXISTS (
                                                      SELECT 1 FROM postpone_jobs e
                                                       WHERE e.lock = c.lock
                                                         AND e.status IN ('todo', 'doing')
                                                         AND (e.status = 'doing' OR e.id < c.id)))
                                                 AND (q.klim IS NULL OR (
                                                      SELECT count(*) FROM postpone_jobs d
                                                       WHERE d.queue = q.name
                                                         AND d.status = 'doing'
                                                         AND (d.args -> q.karg)::text
                                                             IS NOT DISTINCT FROM (c.args -> q.karg)::text)
                                                      < q.klim)
                                               ORDER BY c.queue, c.priority DESC, c.scheduled_at,
                                                        c.id
                                               LIMIT CASE WHEN q.klim IS NULL THEN q.cap
                                                          ELSE q.cap::bigint * 4 END
                                                 FOR UPDATE SKIP LOCKED) b)) c) y
                               WHERE q.klim IS NULL
                                  OR y.rk + (SELECT count(*) FROM postpone_jobs d
                                              WHERE d.queue = q.name
                                                AND d.status = 'doing'
                                                AND (d.args -> q.karg)::text IS NOT DISTINCT FROM y.k)
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
                           THEN date_part('epoch', now() - j.scheduled_at)
                      END AS queue_wait,
                      j.max_attempts,
                      CASE WHEN isfinite(j.expires_at)
                           THEN date_part('epoch', j.expires_at - now())
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
               c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, c.expires_in,
               false
          FROM claimed c;
    ELSE
        -- Rounds: take up to v_scan due jobs in claim order (rows other claimers hold are
        -- skipped); when some have a lock, park those their lock holds back and claim the
        -- others. A round that parked jobs is followed by another, since the jobs it parked
        -- are out of the way: a claim parks every held-back job at the head of the queue,
        -- however many, then claims as if they were not there.
        v_measure := v_bytes IS NOT NULL AND (v_queues IS NULL OR cardinality(v_queues) = 1);
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
            v_sizes := '{}';
            v_locks := false;
            v_merge := v_queues IS NOT NULL AND cardinality(v_queues) > 1;
            IF v_queues IS NULL AND NOT v_deadlines THEN
                -- Every queue, and no job with a deadline waiting: one walk.
                v_have := 0;
                SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                  FROM postpone_jobs c
                 WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.expires_at IS NULL
                 ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                WHILE v_p IS NOT NULL LOOP
                    SELECT v_ids || coalesce(array_agg(x.id), '{}'),
                           v_tids || coalesce(array_agg(x.ctid),
                                              '{}'),
                           v_sizes || coalesce(array_agg(CASE WHEN v_measure
                                                              THEN x.args_bytes END), '{}'),
                           v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                           v_have + count(*)
                      INTO v_ids, v_tids, v_sizes, v_locks, v_have
                      FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args, c.args_bytes
                              FROM postpone_jobs c
                             WHERE c.status = 'todo'
                               AND c.blocked_by IS NULL
                               AND c.expires_at IS NULL
                               AND c.priority = v_p
                               AND (c.scheduled_at, c.id) >= (v_s, v_i)
                               AND c.scheduled_at <= now()
                               AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                             AND (v_lost IS NULL OR NOT v_lost @> c.id)
                             ORDER BY c.priority DESC, c.scheduled_at, c.id
                             LIMIT v_scan - v_have
                               FOR UPDATE SKIP LOCKED) x;
                    EXIT WHEN v_have >= v_scan;
                    SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                      FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.expires_at IS NULL
                       AND c.priority < v_p
                     ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                END LOOP;
            ELSIF v_merge OR v_deadlines THEN
                -- Several walks to merge: several queues, or the jobs with a deadline
                -- beside the others (an index of their own). The walks take turns, so that
                -- the merge locks about as many rows as it claims: the walk whose place (a
                -- priority, and the scheduled time and id after which it goes on) comes first
                -- in claim order takes a few jobs; once the walks hold v_scan jobs, the
                -- v_scan-th in claim order is a bound no turn passes. (Walks of v_scan jobs
                -- each, merged after, locked up to v_scan rows per walk, a WAL record each, to
                -- claim v_scan.) Walk w is of the queue v_queues[(w - 1) % k + 1] (of every
                -- queue when v_queues is NULL, k = 1), of its jobs with a deadline when w > k;
                -- those start each priority past v_from, where the live ones can be. A place
                -- of priority 2147483648 is a walk's start: its first turn finds its first
                -- priority.
                v_k := coalesce(cardinality(v_queues), 1);
                v_nw := v_k * CASE WHEN v_deadlines THEN 2 ELSE 1 END;
                v_st_p := array_fill(2147483648::bigint, ARRAY[v_nw]);
                v_st_s := array_fill(NULL::timestamptz, ARRAY[v_nw]);
                v_st_i := array_fill(NULL::bigint, ARRAY[v_nw]);
                v_kp := '{}';
                v_ks := '{}';
                v_cp := NULL;
                -- A turn takes an eighth of a walk's share, but at least the share or 32
                -- jobs, whichever is fewer: a turn costs the server about as much as locking
                -- 30-50 rows, so a small claim takes few turns. A walk locks at most a turn's
                -- jobs past the bound.
                v_step := greatest(ceil(v_scan::numeric / (8 * v_nw)),
                                   least(32, ceil(v_scan::numeric / v_nw)))::integer;
                IF v_queues IS NOT NULL AND v_nw > 64 THEN
                    -- Many walks: rounds, each one statement for every walk that takes a
                    -- turn in it (a statement per walk would cost a claim of many queues
                    -- as many statements). First, where each walk starts: its first
                    -- priority, and before its first job there (after v_from for the jobs
                    -- with a deadline). NULL: the walk has no waiting job.
                    SELECT array_agg(f.p ORDER BY w.n), array_agg(f.s ORDER BY w.n),
                           array_agg(f.i ORDER BY w.n)
                      INTO v_st_p, v_st_s, v_st_i
                      FROM unnest(v_queues) WITH ORDINALITY AS w(q, n)
                      LEFT JOIN LATERAL (
                          SELECT c.priority::bigint AS p, c.scheduled_at AS s, c.id - 1 AS i
                            FROM postpone_jobs c
                           WHERE c.queue = ANY (ARRAY[w.q]) AND c.status = 'todo'
                             AND c.blocked_by IS NULL AND c.expires_at IS NULL
                           ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                           LIMIT 1) f ON true;
                    IF v_deadlines THEN
                        SELECT v_st_p || array_agg(f.p ORDER BY w.n),
                               v_st_s || array_agg(CASE WHEN f.p IS NOT NULL
                                                        THEN coalesce(e.s, 'infinity') END
                                                   ORDER BY w.n),
                               v_st_i || array_agg(CASE WHEN f.p IS NOT NULL
                                                        THEN coalesce(e.i, 9223372036854775807) END
                                                   ORDER BY w.n)
                          INTO v_st_p, v_st_s, v_st_i
                          FROM unnest(v_queues) WITH ORDINALITY AS w(q, n)
                          LEFT JOIN LATERAL (
                              SELECT c.priority::bigint AS p
                                FROM postpone_jobs c
                               WHERE c.queue = ANY (ARRAY[w.q]) AND c.status = 'todo'
                                 AND c.blocked_by IS NULL AND c.expires_at IS NOT NULL
                               ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                               LIMIT 1) f ON true
                          LEFT JOIN LATERAL (
                              SELECT c.scheduled_at AS s, c.id - 1 AS i
                                FROM postpone_jobs c
                               WHERE c.queue = ANY (ARRAY[w.q]) AND c.status = 'todo'
                                 AND c.blocked_by IS NULL AND c.expires_at IS NOT NULL
                                 AND c.priority = f.p AND c.scheduled_at > v_from
                               ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                               LIMIT 1) e ON true;
                    END IF;
                    -- A round gives turns to the walks in claim order of their places
                    -- while the turns before add up to fewer than v_cap jobs (an eighth
                    -- of the claim, but at least 32 or the claim): a round locks at most
                    -- about that many jobs past the bound. A turn's size: v_cap shared
                    -- among the walks at first, but at least 2 (a walk with one job at a
                    -- priority then learns in one turn that it has no more there), then
                    -- twice as many for a walk whose last turn took all it asked for.
                    v_cap := greatest(v_scan / 8, least(v_scan, 32));
                    v_lim := greatest(2, ceil(v_cap::numeric
                                              / greatest(1, least(v_cap,
                                                  (SELECT count(*) FROM unnest(v_st_p) AS u(p)
                                                    WHERE u.p IS NOT NULL)))))::integer;
                    v_wl := array_fill(v_lim, ARRAY[v_nw]);
                    v_wq := CASE WHEN v_deadlines THEN v_queues || v_queues ELSE v_queues END;
                    v_mv := NULL;
                    LOOP
                        -- Walks whose place is before a job not due yet (a walk's first job
                        -- at a priority, as its probe found it; for the jobs with a deadline,
                        -- its first after v_from) have no due job at that priority: they move
                        -- to their next, before the round, until none is left (as often as
                        -- there are priorities).
                        LOOP
                            IF v_mv IS NULL THEN
                                SELECT array_agg(u.n) INTO v_mv
                                  FROM unnest(v_st_p, v_st_s) WITH ORDINALITY AS u(p, s, n)
                                 WHERE u.p IS NOT NULL AND u.s > now();
                            END IF;
                            EXIT WHEN v_mv IS NULL;
                            -- The moved walks' next places, found once (a join that read them
                            -- again for each walk would cost a round as many probes per walk).
                            WITH f AS MATERIALIZED (
                                SELECT m.n, x.p, x.s, x.i
                                  FROM unnest(v_mv, (SELECT array_agg(v_st_p[m.n] ORDER BY m.o)
                                                       FROM unnest(v_mv) WITH ORDINALITY AS m(n, o)),
                                              (SELECT array_agg(v_wq[m.n] ORDER BY m.o)
                                                 FROM unnest(v_mv) WITH ORDINALITY AS m(n, o)))
                                       AS m(n, p0, q)
                                  LEFT JOIN LATERAL (
                                      SELECT c.priority::bigint AS p, c.scheduled_at AS s,
                                             c.id - 1 AS i
                                        FROM postpone_jobs c
                                       WHERE m.n <= v_k
                                         AND c.queue = ANY (ARRAY[m.q]) AND c.status = 'todo'
                                         AND c.blocked_by IS NULL AND c.expires_at IS NULL
                                         AND c.priority < m.p0
                                       ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                       LIMIT 1) a ON m.n <= v_k
                                  LEFT JOIN LATERAL (
                                      SELECT c.priority::bigint AS p
                                        FROM postpone_jobs c
                                       WHERE m.n > v_k
                                         AND c.queue = ANY (ARRAY[m.q]) AND c.status = 'todo'
                                         AND c.blocked_by IS NULL AND c.expires_at IS NOT NULL
                                         AND c.priority < m.p0
                                       ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                       LIMIT 1) d ON m.n > v_k
                                  LEFT JOIN LATERAL (
                                      SELECT c.scheduled_at AS s, c.id - 1 AS i
                                        FROM postpone_jobs c
                                       WHERE c.queue = ANY (ARRAY[m.q]) AND c.status = 'todo'
                                         AND c.blocked_by IS NULL AND c.expires_at IS NOT NULL
                                         AND c.priority = d.p AND c.scheduled_at > v_from
                                       ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                       LIMIT 1) e ON d.p IS NOT NULL
                                  CROSS JOIN LATERAL (
                                      SELECT CASE WHEN m.n <= v_k THEN a.p ELSE d.p END AS p,
                                             CASE WHEN m.n <= v_k THEN a.s
                                                  WHEN d.p IS NOT NULL
                                                      THEN coalesce(e.s, 'infinity') END AS s,
                                             CASE WHEN m.n <= v_k THEN a.i
                                                  WHEN d.p IS NOT NULL
                                                      THEN coalesce(e.i, 9223372036854775807)
                                             END AS i) x
                            )
                            SELECT array_agg(CASE WHEN f.n IS NULL THEN u.p ELSE f.p END ORDER BY u.n),
                                   array_agg(CASE WHEN f.n IS NULL THEN u.s ELSE f.s END ORDER BY u.n),
                                   array_agg(CASE WHEN f.n IS NULL THEN u.i ELSE f.i END ORDER BY u.n)
                              INTO v_st_p, v_st_s, v_st_i
                              FROM unnest(v_st_p, v_st_s, v_st_i) WITH ORDINALITY AS u(p, s, i, n)
                              LEFT JOIN f ON f.n = u.n;
                            v_mv := NULL;
                        END LOOP;
                        -- This round's walks: the first of those whose place comes before the
                        -- bound (above), with their queue, their place, how far they may go
                        -- at the bound's priority and their turn's size; the jobs without a
                        -- deadline apart from those with one (indexes of their own).
                        SELECT array_agg(u.n) FILTER (WHERE u.n <= v_k),
                               array_agg(u.q) FILTER (WHERE u.n <= v_k),
                               array_agg(u.p) FILTER (WHERE u.n <= v_k),
                               array_agg(u.s) FILTER (WHERE u.n <= v_k),
                               array_agg(u.i) FILTER (WHERE u.n <= v_k),
                               array_agg(u.bs) FILTER (WHERE u.n <= v_k),
                               array_agg(u.bi) FILTER (WHERE u.n <= v_k),
                               array_agg(u.l) FILTER (WHERE u.n <= v_k),
                               array_agg(u.n) FILTER (WHERE u.n > v_k),
                               array_agg(u.q) FILTER (WHERE u.n > v_k),
                               array_agg(u.p) FILTER (WHERE u.n > v_k),
                               array_agg(u.s) FILTER (WHERE u.n > v_k),
                               array_agg(u.i) FILTER (WHERE u.n > v_k),
                               array_agg(u.bs) FILTER (WHERE u.n > v_k),
                               array_agg(u.bi) FILTER (WHERE u.n > v_k),
                               array_agg(u.l) FILTER (WHERE u.n > v_k)
                          INTO v_rn, v_rq, v_rp, v_rs, v_ri, v_rbs, v_rbi, v_rl,
                               v_dn, v_dq, v_dp, v_ds, v_di, v_dbs, v_dbi, v_dl
                          FROM (SELECT u.n, u.q, u.p, u.s, u.i, u.l,
                                       CASE WHEN u.p = v_cp THEN v_cs
                                            ELSE 'infinity'::timestamptz END AS bs,
                                       CASE WHEN u.p = v_cp THEN v_ci
                                            ELSE 9223372036854775807 END AS bi,
                                       sum(u.l) OVER (ORDER BY u.p DESC, u.s, u.i, u.n
                                                      ROWS UNBOUNDED PRECEDING) - u.l AS before
                                  FROM unnest(v_st_p, v_st_s, v_st_i, v_wl, v_wq)
                                       WITH ORDINALITY AS u(p, s, i, l, q, n)
                                 WHERE u.p IS NOT NULL
                                   AND (v_cp IS NULL OR u.p > v_cp
                                        OR (u.p = v_cp AND (u.s, u.i) < (v_cs, v_ci)))) u
                         WHERE u.before < v_cap;
                        EXIT WHEN v_rn IS NULL AND v_dn IS NULL;
                        -- The turns, one statement for each kind of walk: each walk's jobs
                        -- after its place, at its priority, up to the bound when it is at
                        -- the bound's priority, at most its turn's size.
                        v_tn := '{}';
                        v_tg := '{}';
                        v_ts := '{}';
                        v_ti := '{}';
                        IF v_rn IS NOT NULL THEN
                            WITH t AS MATERIALIZED (
                                SELECT w.n, w.p, x.id, x.ctid, x.lock, x.scheduled_at,
                                       x.args_bytes
                                  FROM unnest(v_rn, v_rq, v_rp, v_rs, v_ri, v_rbs, v_rbi, v_rl)
                                       AS w(n, q, p, s, i, bs, bi, l)
                                 CROSS JOIN LATERAL (
                                     SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args_bytes
                                       FROM postpone_jobs c
                                      WHERE c.queue = ANY (ARRAY[w.q])
                                        AND c.status = 'todo'
                                        AND c.blocked_by IS NULL
                                        AND c.expires_at IS NULL
                                        AND c.priority = w.p
                                        AND (c.scheduled_at, c.id) > (w.s, w.i)
                                        AND (c.scheduled_at, c.id) <= (w.bs, w.bi)
                                        AND c.scheduled_at <= now()
                                        AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                        AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                      ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                      LIMIT w.l
                                        FOR UPDATE SKIP LOCKED) x
                            )
                            SELECT v_ids || coalesce(a.ids, '{}'), v_tids || coalesce(a.tids, '{}'),
                                   v_sizes || coalesce(a.sizes, '{}'), v_kp || coalesce(a.kp, '{}'),
                                   v_ks || coalesce(a.ks, '{}'), v_locks OR coalesce(a.locks, false),
                                   coalesce(g.ns, '{}'), coalesce(g.gots, '{}'),
                                   coalesce(g.lss, '{}'), coalesce(g.lis, '{}')
                              INTO v_ids, v_tids, v_sizes, v_kp, v_ks, v_locks,
                                   v_tn, v_tg, v_ts, v_ti
                              FROM (SELECT array_agg(t.id) AS ids, array_agg(t.ctid) AS tids,
                                           array_agg(CASE WHEN v_bytes IS NOT NULL
                                                          THEN t.args_bytes END) AS sizes,
                                           array_agg(t.p::integer) AS kp,
                                           array_agg(t.scheduled_at) AS ks,
                                           bool_or(t.lock IS NOT NULL) AS locks
                                      FROM t) a,
                                   (SELECT array_agg(y.n) AS ns, array_agg(y.got) AS gots,
                                           array_agg(y.ls) AS lss, array_agg(y.li) AS lis
                                      FROM (SELECT t.n, count(*)::integer AS got,
                                                   (array_agg(t.scheduled_at ORDER BY t.scheduled_at, t.id))[count(*)::integer] AS ls,
                                                   (array_agg(t.id ORDER BY t.scheduled_at, t.id))[count(*)::integer] AS li
                                              FROM t GROUP BY t.n) y) g;
                        END IF;
                        IF v_dn IS NOT NULL THEN
                            WITH t AS MATERIALIZED (
                                SELECT w.n, w.p, x.id, x.ctid, x.lock, x.scheduled_at,
                                       x.args_bytes
                                  FROM unnest(v_dn, v_dq, v_dp, v_ds, v_di, v_dbs, v_dbi, v_dl)
                                       AS w(n, q, p, s, i, bs, bi, l)
                                 CROSS JOIN LATERAL (
                                     SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args_bytes
                                       FROM postpone_jobs c
                                      WHERE c.queue = ANY (ARRAY[w.q])
                                        AND c.status = 'todo'
                                        AND c.blocked_by IS NULL
                                        AND c.expires_at IS NOT NULL
                                        AND c.priority = w.p
                                        AND (c.scheduled_at, c.id) > (w.s, w.i)
                                        AND (c.scheduled_at, c.id) <= (w.bs, w.bi)
                                        AND c.scheduled_at <= now()
                                        AND c.expires_at > now()
                                        AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                        AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                      ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                      LIMIT w.l
                                        FOR UPDATE SKIP LOCKED) x
                            )
                            SELECT v_ids || coalesce(a.ids, '{}'), v_tids || coalesce(a.tids, '{}'),
                                   v_sizes || coalesce(a.sizes, '{}'), v_kp || coalesce(a.kp, '{}'),
                                   v_ks || coalesce(a.ks, '{}'), v_locks OR coalesce(a.locks, false),
                                   v_tn || coalesce(g.ns, '{}'), v_tg || coalesce(g.gots, '{}'),
                                   v_ts || coalesce(g.lss, '{}'), v_ti || coalesce(g.lis, '{}')
                              INTO v_ids, v_tids, v_sizes, v_kp, v_ks, v_locks,
                                   v_tn, v_tg, v_ts, v_ti
                              FROM (SELECT array_agg(t.id) AS ids, array_agg(t.ctid) AS tids,
                                           array_agg(CASE WHEN v_bytes IS NOT NULL
                                                          THEN t.args_bytes END) AS sizes,
                                           array_agg(t.p::integer) AS kp,
                                           array_agg(t.scheduled_at) AS ks,
                                           bool_or(t.lock IS NOT NULL) AS locks
                                      FROM t) a,
                                   (SELECT array_agg(y.n) AS ns, array_agg(y.got) AS gots,
                                           array_agg(y.ls) AS lss, array_agg(y.li) AS lis
                                      FROM (SELECT t.n, count(*)::integer AS got,
                                                   (array_agg(t.scheduled_at ORDER BY t.scheduled_at, t.id))[count(*)::integer] AS ls,
                                                   (array_agg(t.id ORDER BY t.scheduled_at, t.id))[count(*)::integer] AS li
                                              FROM t GROUP BY t.n) y) g;
                        END IF;
                        -- Each walk of the round goes on after the last job it took; one that
                        -- took all it asked for takes twice as many next; one that took fewer
                        -- has no more jobs at its priority before the bound, and moves to its
                        -- next priority (NULL: none), found for all such walks at once.
                        SELECT array_agg(CASE WHEN r.got > 0 THEN r.ls ELSE u.s END ORDER BY u.n),
                               array_agg(CASE WHEN r.got > 0 THEN r.li ELSE u.i END ORDER BY u.n),
                               array_agg(CASE WHEN rw.n IS NOT NULL AND coalesce(r.got, 0) >= u.l
                                              THEN least(u.l::bigint * 2, v_scan)::integer
                                              ELSE u.l END ORDER BY u.n),
                               array_agg(u.n ORDER BY u.n)
                                   FILTER (WHERE rw.n IS NOT NULL AND coalesce(r.got, 0) < u.l)
                          INTO v_st_s, v_st_i, v_wl, v_mv
                          FROM unnest(v_st_s, v_st_i, v_wl) WITH ORDINALITY AS u(s, i, l, n)
                          LEFT JOIN unnest(coalesce(v_rn, '{}') || coalesce(v_dn, '{}')) AS rw(n)
                                 ON rw.n = u.n
                          LEFT JOIN unnest(v_tn, v_tg, v_ts, v_ti) AS r(n, got, ls, li)
                                 ON r.n = u.n;
                        -- The bound, as below, cut again after every round that holds more.
                        IF cardinality(v_ids) > v_scan
                           OR (v_cp IS NULL AND cardinality(v_ids) = v_scan) THEN
                            SELECT array_agg(k.p), array_agg(k.s), array_agg(k.i), array_agg(k.t),
                                   array_agg(k.z)
                              INTO v_kp, v_ks, v_ids, v_tids, v_sizes
                              FROM (SELECT k.p, k.s, k.i, k.t, k.z
                                      FROM unnest(v_kp, v_ks, v_ids, v_tids, v_sizes) AS k(p, s, i, t, z)
                                     ORDER BY k.p DESC, k.s, k.i
                                     LIMIT v_scan) k;
                            v_cp := v_kp[v_scan];
                            v_cs := v_ks[v_scan];
                            v_ci := v_ids[v_scan];
                        END IF;
                    END LOOP;
                END IF;
                LOOP
                    EXIT WHEN v_queues IS NOT NULL AND v_nw > 64;
                    v_qi := NULL;
                    FOR v_j IN 1 .. v_nw LOOP
                        CONTINUE WHEN v_st_p[v_j] IS NULL;
                        IF v_qi IS NULL OR v_st_p[v_j] > v_st_p[v_qi]
                           OR (v_st_p[v_j] = v_st_p[v_qi]
                               AND (v_st_s[v_j], v_st_i[v_j]) < (v_st_s[v_qi], v_st_i[v_qi]))
                        THEN
                            v_qi := v_j;
                        END IF;
                    END LOOP;
                    EXIT WHEN v_qi IS NULL;
                    -- Every walk's place is past the bound: no due job before it is left.
                    EXIT WHEN v_cp IS NOT NULL
                              AND (v_st_p[v_qi] < v_cp
                                   OR (v_st_p[v_qi] = v_cp
                                       AND (v_st_s[v_qi], v_st_i[v_qi]) >= (v_cs, v_ci)));
                    v_q := v_queues[(v_qi - 1) % v_k + 1];
                    v_wp := v_st_p[v_qi];
                    v_s := v_st_s[v_qi];
                    v_i := v_st_i[v_qi];
                    v_lim := v_step;
                    v_have := 0;
                    IF v_wp < 2147483648 THEN
                        -- Its place is before the bound (above): its jobs up to the bound, when
                        -- this turn is at the bound's priority.
                        IF v_cp IS NOT NULL AND v_wp = v_cp THEN
                            v_bs := v_cs;
                            v_bi := v_ci;
                        ELSE
                            v_bs := 'infinity';
                            v_bi := 9223372036854775807;
                        END IF;
                        IF v_queues IS NULL THEN
                            IF v_qi > v_k THEN
                                SELECT v_ids || coalesce(array_agg(x.id), '{}'),
                                       v_tids || coalesce(array_agg(x.ctid), '{}'),
                                       v_sizes || coalesce(array_agg(CASE WHEN v_bytes IS NOT NULL
                                                                          THEN x.args_bytes END), '{}'),
                                       v_kp || coalesce(array_agg(v_wp::integer), '{}'),
                                       v_ks || coalesce(array_agg(x.scheduled_at), '{}'),
                                       v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                                       count(*),
                                       (array_agg(x.scheduled_at))[count(*)::integer],
                                       (array_agg(x.id))[count(*)::integer]
                                  INTO v_ids, v_tids, v_sizes, v_kp, v_ks, v_locks, v_have, v_ls, v_li
                                  FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args_bytes
                                          FROM postpone_jobs c
                                         WHERE c.status = 'todo'
                                           AND c.blocked_by IS NULL
                                           AND c.expires_at IS NOT NULL
                                           AND c.priority = v_wp
                                           AND (c.scheduled_at, c.id) > (v_s, v_i)
                                           AND (c.scheduled_at, c.id) <= (v_bs, v_bi)
                                           AND c.scheduled_at <= now()
                                   AND c.expires_at > now()
                                           AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                           AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                         ORDER BY c.priority DESC, c.scheduled_at, c.id
                                         LIMIT v_lim
                                           FOR UPDATE SKIP LOCKED) x;
                            ELSE
                                SELECT v_ids || coalesce(array_agg(x.id), '{}'),
                                       v_tids || coalesce(array_agg(x.ctid), '{}'),
                                       v_sizes || coalesce(array_agg(CASE WHEN v_bytes IS NOT NULL
                                                                          THEN x.args_bytes END), '{}'),
                                       v_kp || coalesce(array_agg(v_wp::integer), '{}'),
                                       v_ks || coalesce(array_agg(x.scheduled_at), '{}'),
                                       v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                                       count(*),
                                       (array_agg(x.scheduled_at))[count(*)::integer],
                                       (array_agg(x.id))[count(*)::integer]
                                  INTO v_ids, v_tids, v_sizes, v_kp, v_ks, v_locks, v_have, v_ls, v_li
                                  FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args_bytes
                                          FROM postpone_jobs c
                                         WHERE c.status = 'todo'
                                           AND c.blocked_by IS NULL
                                           AND c.expires_at IS NULL
                                           AND c.priority = v_wp
                                           AND (c.scheduled_at, c.id) > (v_s, v_i)
                                           AND (c.scheduled_at, c.id) <= (v_bs, v_bi)
                                           AND c.scheduled_at <= now()
                                           AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                           AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                         ORDER BY c.priority DESC, c.scheduled_at, c.id
                                         LIMIT v_lim
                                           FOR UPDATE SKIP LOCKED) x;
                            END IF;
                        ELSIF v_qi > v_k THEN
                            SELECT v_ids || coalesce(array_agg(x.id), '{}'),
                                   v_tids || coalesce(array_agg(x.ctid), '{}'),
                                   v_sizes || coalesce(array_agg(CASE WHEN v_bytes IS NOT NULL
                                                                      THEN x.args_bytes END), '{}'),
                                   v_kp || coalesce(array_agg(v_wp::integer), '{}'),
                                   v_ks || coalesce(array_agg(x.scheduled_at), '{}'),
                                   v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                                   count(*),
                                   (array_agg(x.scheduled_at))[count(*)::integer],
                                   (array_agg(x.id))[count(*)::integer]
                              INTO v_ids, v_tids, v_sizes, v_kp, v_ks, v_locks, v_have, v_ls, v_li
                              FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args_bytes
                                      FROM postpone_jobs c
                                     WHERE c.queue = ANY (ARRAY[v_q])
                               AND c.status = 'todo'
                                       AND c.blocked_by IS NULL
                                       AND c.expires_at IS NOT NULL
                                       AND c.priority = v_wp
                                       AND (c.scheduled_at, c.id) > (v_s, v_i)
                                       AND (c.scheduled_at, c.id) <= (v_bs, v_bi)
                                       AND c.scheduled_at <= now()
                               AND c.expires_at > now()
                                       AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                       AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                     ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                     LIMIT v_lim
                                       FOR UPDATE SKIP LOCKED) x;
                        ELSE
                            SELECT v_ids || coalesce(array_agg(x.id), '{}'),
                                   v_tids || coalesce(array_agg(x.ctid), '{}'),
                                   v_sizes || coalesce(array_agg(CASE WHEN v_bytes IS NOT NULL
                                                                      THEN x.args_bytes END), '{}'),
                                   v_kp || coalesce(array_agg(v_wp::integer), '{}'),
                                   v_ks || coalesce(array_agg(x.scheduled_at), '{}'),
                                   v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                                   count(*),
                                   (array_agg(x.scheduled_at))[count(*)::integer],
                                   (array_agg(x.id))[count(*)::integer]
                              INTO v_ids, v_tids, v_sizes, v_kp, v_ks, v_locks, v_have, v_ls, v_li
                              FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args_bytes
                                      FROM postpone_jobs c
                                     WHERE c.queue = ANY (ARRAY[v_q])
                               AND c.status = 'todo'
                                       AND c.blocked_by IS NULL
                                       AND c.expires_at IS NULL
                                       AND c.priority = v_wp
                                       AND (c.scheduled_at, c.id) > (v_s, v_i)
                                       AND (c.scheduled_at, c.id) <= (v_bs, v_bi)
                                       AND c.scheduled_at <= now()
                                       AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                       AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                     ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                     LIMIT v_lim
                                       FOR UPDATE SKIP LOCKED) x;
                        END IF;
                        IF v_have > 0 THEN
                            v_s := v_ls;
                            v_i := v_li;
                        END IF;
                    END IF;
                    -- Fewer than its turn's jobs (or its start): no more due jobs of this priority
                    -- before the bound, so its place moves to the next priority (NULL: none).
                    IF v_have < v_lim THEN
                        IF v_queues IS NULL THEN
                            IF v_qi > v_k THEN
                                SELECT c.priority INTO v_wp
                                  FROM postpone_jobs c
                                 WHERE c.status = 'todo'
                                   AND c.blocked_by IS NULL AND c.expires_at IS NOT NULL
                                   AND c.priority < v_wp
                                 ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                                v_s := v_from;
                                v_i := 9223372036854775807;
                            ELSE
                                SELECT c.priority, c.scheduled_at, c.id - 1 INTO v_wp, v_s, v_i
                                  FROM postpone_jobs c
                                 WHERE c.status = 'todo'
                                   AND c.blocked_by IS NULL AND c.expires_at IS NULL
                                   AND c.priority < v_wp
                                 ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                            END IF;
                        ELSIF v_qi > v_k THEN
                            SELECT c.priority INTO v_wp
                              FROM postpone_jobs c
                             WHERE c.queue = ANY (ARRAY[v_q]) AND c.status = 'todo'
                               AND c.blocked_by IS NULL AND c.expires_at IS NOT NULL
                               AND c.priority < v_wp
                             ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                            v_s := v_from;
                            v_i := 9223372036854775807;
                        ELSE
                            SELECT c.priority, c.scheduled_at, c.id - 1 INTO v_wp, v_s, v_i
                              FROM postpone_jobs c
                             WHERE c.queue = ANY (ARRAY[v_q]) AND c.status = 'todo'
                               AND c.blocked_by IS NULL AND c.expires_at IS NULL
                               AND c.priority < v_wp
                             ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                        END IF;
                    END IF;
                    v_st_p[v_qi] := v_wp;
                    v_st_s[v_qi] := v_s;
                    v_st_i[v_qi] := v_i;
                    -- The bound: the v_scan-th job in claim order of those the walks hold, when
                    -- they first hold v_scan and again each time later turns (which take only jobs
                    -- before it) have added an eighth more; the jobs past it are dropped then
                    -- (their rows stay locked until the commit, unclaimed).
                    v_recut := v_scan + CASE WHEN v_cp IS NULL THEN 0 ELSE greatest(1, v_scan / 8) END;
                    IF cardinality(v_ids) >= v_recut THEN
                        SELECT array_agg(k.p), array_agg(k.s), array_agg(k.i), array_agg(k.t),
                               array_agg(k.z)
                          INTO v_kp, v_ks, v_ids, v_tids, v_sizes
                          FROM (SELECT k.p, k.s, k.i, k.t, k.z
                                  FROM unnest(v_kp, v_ks, v_ids, v_tids, v_sizes) AS k(p, s, i, t, z)
                                 ORDER BY k.p DESC, k.s, k.i
                                 LIMIT v_scan) k;
                        v_cp := v_kp[v_scan];
                        v_cs := v_ks[v_scan];
                        v_ci := v_ids[v_scan];
                    END IF;
                END LOOP;
                -- The best v_scan in claim order, with their sizes (when there is a byte budget)
                -- from the walks: nothing left for the merge below to read.
                SELECT coalesce(array_agg(k.i), '{}'), coalesce(array_agg(k.t), '{}'),
                       coalesce(array_agg(k.z), '{}')
                  INTO v_ids, v_tids, v_sizes
                  FROM (SELECT k.i, k.t, k.z
                          FROM unnest(v_kp, v_ks, v_ids, v_tids, v_sizes) AS k(p, s, i, t, z)
                         ORDER BY k.p DESC, k.s, k.i
                         LIMIT v_scan) k;
                v_merge := false;
            ELSE
                -- One queue, and no job with a deadline waiting: one walk. It names its
                -- queue as `= ANY (ARRAY[v_q])` (as the merged walks do): an equality
                -- would make the leading `c.queue` of the ORDER BY a single value the planner
                -- drops, and it could then walk postpone_jobs_due_idx, stepping over every
                -- other queue's jobs, whenever its costs (the table's size, its statistics)
                -- say so. Kept, that order is one only postpone_jobs_due_queue_idx gives
                -- without a sort (enable_sort is off), and the index reads the condition as
                -- an equality: the walk still ends at the queue's first job not due.
                FOREACH v_q IN ARRAY v_queues LOOP
                    v_have := 0;
                    SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                      FROM postpone_jobs c
                     WHERE c.queue = ANY (ARRAY[v_q]) AND c.status = 'todo' AND c.blocked_by IS NULL
                       AND c.expires_at IS NULL
                     ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                    WHILE v_p IS NOT NULL LOOP
                        SELECT v_ids || coalesce(array_agg(x.id),
                                                 '{}'),
                               v_tids || coalesce(array_agg(x.ctid),
                                              '{}'),
                               v_sizes || coalesce(array_agg(CASE WHEN v_measure
                                                                  THEN x.args_bytes
                                                             END), '{}'),
                               v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                               v_have + count(*)
                          INTO v_ids, v_tids, v_sizes, v_locks, v_have
                          FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args, c.args_bytes
                                  FROM postpone_jobs c
                                 WHERE c.queue = ANY (ARRAY[v_q])
                                   AND c.status = 'todo'
                                   AND c.blocked_by IS NULL
                                   AND c.expires_at IS NULL
                                   AND c.priority = v_p
                                   AND (c.scheduled_at, c.id) >= (v_s, v_i)
                                   AND c.scheduled_at <= now()
                                   AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                 AND (v_lost IS NULL OR NOT v_lost @> c.id)
                                 ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                 LIMIT v_scan - v_have
                                   FOR UPDATE SKIP LOCKED) x;
                        EXIT WHEN v_have >= v_scan;
                        SELECT c.priority, c.scheduled_at, c.id INTO v_p, v_s, v_i
                          FROM postpone_jobs c
                         WHERE c.queue = ANY (ARRAY[v_q]) AND c.status = 'todo' AND c.blocked_by IS NULL
                           AND c.expires_at IS NULL AND c.priority < v_p
                         ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                    END LOOP;
                END LOOP;
            END IF;
            -- Claim order across the walks (several queues, or jobs with a deadline beside
            -- others), and the sizes of the arguments when the walks did not measure them.
            IF v_merge
               AND (cardinality(v_ids) > 1 OR (v_bytes IS NOT NULL AND cardinality(v_ids) > 0))
            THEN
                SELECT coalesce(array_agg(o.id ORDER BY o.priority DESC, o.scheduled_at, o.id),
                                '{}'),
                       coalesce(array_agg(o.ctid ORDER BY o.priority DESC, o.scheduled_at, o.id),
                                '{}'),
                       coalesce(array_agg(o.size ORDER BY o.priority DESC, o.scheduled_at, o.id),
                                '{}')
                  INTO v_ids, v_tids, v_sizes
                  FROM (SELECT c.id, c.ctid, c.priority, c.scheduled_at,
                               CASE WHEN v_bytes IS NOT NULL
                                    THEN c.args_bytes END AS size
                          FROM postpone_jobs c WHERE c.id = ANY(v_ids)
                         ORDER BY c.priority DESC, c.scheduled_at, c.id
                         LIMIT v_scan) o;
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
                       coalesce(array_agg(c.size ORDER BY c.priority DESC, c.scheduled_at, c.id)
                                    FILTER (WHERE c.by IS NULL), '{}'),
                       coalesce(jsonb_object_agg(c.id::text, c.by) FILTER (WHERE c.by IS NOT NULL),
                                '{}')
                  INTO v_free, v_free_tids, v_free_sizes, v_map
                  FROM (SELECT c.id, c.ctid, c.priority, c.scheduled_at,
                               CASE WHEN v_bytes IS NOT NULL
                                    THEN c.args_bytes END AS size,
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
                v_free_sizes := v_free_sizes[1:v_want];
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
                v_free_sizes := v_sizes[1:v_want];
            END IF;

            -- The byte budget: the jobs, in claim order, whose arguments (as JSON text, as
            -- the worker receives them, measured by the walk) fit in what is left of it; a
            -- first job larger than the whole budget alone when the worker holds nothing
            -- else. The rows left out stay waiting, unchanged (their row locks end with the
            -- claim's transaction).
            IF v_bytes IS NOT NULL AND cardinality(v_free_tids) > 0 THEN
                SELECT sum(z) INTO v_used FROM unnest(v_free_sizes) z;
                IF v_used > v_bytes AND NOT (cardinality(v_free_tids) = 1 AND v_alone) THEN
                    -- They do not all fit: the prefix that does.
                    SELECT coalesce(array_agg(t.tid ORDER BY t.ord)
                                        FILTER (WHERE t.run <= v_bytes OR (t.ord = 1 AND v_alone)),
                                    '{}'),
                           coalesce(max(t.run)
                                        FILTER (WHERE t.run <= v_bytes OR (t.ord = 1 AND v_alone)),
                                    0),
                           coalesce(bool_or(t.run > v_bytes AND NOT (t.ord = 1 AND v_alone)),
                                    false)
                      INTO v_free_tids, v_used, v_cut
                      FROM (SELECT u.tid, u.ord, sum(u.size) OVER (ORDER BY u.ord) AS run
                              FROM unnest(v_free_tids, v_free_sizes) WITH ORDINALITY
                                   AS u(tid, size, ord)) t;
                END IF;
                v_free := v_free[1:cardinality(v_free_tids)];
                v_bytes := v_bytes - v_used;
                v_alone := v_alone AND cardinality(v_free_tids) = 0;
                IF v_cut THEN
                    PERFORM set_config('postpone.cut', 'on', true);
                END IF;
            END IF;

            IF cardinality(v_free) > 0 AND v_lock_only THEN
                -- Locked only (by the walk): the jobs without a lock, a queueing lock, a
                -- unique key, a deadline or an abort request, which other sessions need not
                -- see running (those indexes and checks read `doing`). Their attempt is the
                -- next one; the worker writes it with the outcome (postpone_settle_locked).
                RETURN QUERY
                SELECT j.id, j.queue, j.task, j.args, least(j.attempts, 2147483646) + 1,
                       j.priority, j.lock, j.abort_requested, j.scheduled_at,
                       CASE WHEN isfinite(j.scheduled_at)
                            THEN date_part('epoch', now() - j.scheduled_at) END,
                       j.max_attempts, NULL::double precision, true
                  FROM postpone_jobs j
                 WHERE j.ctid = ANY(v_free_tids) AND j.status = 'todo'
                   AND j.lock IS NULL AND j.queueing_lock IS NULL AND j.unique_key IS NULL
                   AND j.expires_at IS NULL AND NOT j.abort_requested
                   AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker);
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_want := v_want - v_n;
                -- The others are claimed held, as without lock_only.
                RETURN QUERY
                UPDATE postpone_jobs j
                   SET status = 'doing', worker_id = p_worker,
                       attempts = least(j.attempts, 2147483646) + 1,
                       started_at = NULL,
                       claimed_at = now()
                 WHERE j.ctid = ANY(v_free_tids) AND j.status = 'todo'
                   AND NOT (j.lock IS NULL AND j.queueing_lock IS NULL AND j.unique_key IS NULL
                            AND j.expires_at IS NULL AND NOT j.abort_requested)
                   AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
                RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                          j.abort_requested, j.scheduled_at,
                          CASE WHEN isfinite(j.scheduled_at)
                               THEN date_part('epoch', now() - j.scheduled_at) END,
                          j.max_attempts,
                          CASE WHEN isfinite(j.expires_at)
                               THEN date_part('epoch', j.expires_at - now()) END,
                          false;
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_want := v_want - v_n;
            ELSIF cardinality(v_free) > 0 THEN
                -- The update of postpone_take_at, here: rows returned from a function called
                -- here would be copied once more on their way out.
                RETURN QUERY
                UPDATE postpone_jobs j
                   SET status = 'doing', worker_id = p_worker,
                       attempts = least(j.attempts, 2147483646) + 1,
                       started_at = CASE WHEN v_hold THEN NULL ELSE now() END,
                       claimed_at = now()
                 WHERE j.ctid = ANY(v_free_tids) AND j.status = 'todo'
                   AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
                RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                          j.abort_requested, j.scheduled_at,
                          CASE WHEN isfinite(j.scheduled_at)
                               THEN date_part('epoch', now() - j.scheduled_at) END,
                          j.max_attempts,
                          CASE WHEN isfinite(j.expires_at)
                               THEN date_part('epoch', j.expires_at - now()) END,
                          false;
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_want := v_want - v_n;
            END IF;
            EXIT WHEN v_parked = 0 OR v_want <= 0 OR v_rounds >= 20 OR v_cut;
            IF v_lock_only THEN
                -- The jobs this round only locked are still `todo`, and this transaction's
                -- own locks do not make the next round's walks skip them: they do now.
                v_lost := coalesce(v_lost, '{}'::int8multirange)
                          + coalesce((SELECT range_agg(int8range(j.id, j.id, '[]'))
                                        FROM postpone_jobs j
                                       WHERE j.ctid = ANY(v_free_tids) AND j.status = 'todo'),
                                     '{}'::int8multirange);
            END IF;
            -- A round that found only held-back jobs is followed by a wider one (the run of
            -- them at the head may be long); one that reached free jobs has passed that run,
            -- and the next walks (and locks) only as many jobs as are still wanted.
            v_scan := CASE WHEN cardinality(v_free) > 0 THEN v_want
                           ELSE greatest(v_want, least(v_scan * 2, 16384)) END;
        END LOOP;
    END IF;
END
$function$;
