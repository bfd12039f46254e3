-- postpone schema, version 45: less of the server's work per job on the claim and the outcome.
--
-- Measured as PostgreSQL's instructions per no-op job (benches/instructions.sh: callgrind on
-- a server in single-user mode; 10,000 jobs deferred in batches of 1,000, claimed and
-- recorded 1,000 at a time), from 276,025 at version 44 to 257,922 (-6.6%): the defer
-- 77,171 -> 74,631, the claim 90,637 -> 84,777, the outcome 108,217 -> 98,514. The figures
-- of each change below were measured alone on version 38, where this was first built.
--
-- * Ten partial indexes of postpone_jobs test the column that rules most rows out first:
--   `expires_at IS NOT NULL`, `lock IS NOT NULL`, `queueing_lock IS NOT NULL`,
--   `unique_key IS NOT NULL` (or its LIKE), `abort_requested OR cancel_requested`, before
--   the status. Every version of a row written (the insert, the claim's, the outcome's)
--   evaluates the predicate of every partial index; a text comparison of the status costs
--   a function call where a test for NULL costs none, and a no-op job meets none of these
--   ten predicates. -7,466 instructions a job. The indexes hold the same rows and serve the
--   same statements: they are dropped and built again (each build reads the table, and
--   writes to postpone_jobs wait while the migration runs).
-- * postpone_started_late, which the outcome evaluates four times for each job, tests
--   whether the job has a deadline first: -2,858 a job.
-- * The claim computes a job's time in the queue and to its deadline with date_part (a
--   double precision) instead of extract (a numeric, then converted): -1,859 a job.
-- * Rows returned by a PL/pgSQL function are copied into its result on the way out, once per
--   function they pass through: the four-argument postpone_claim_jobs runs the update of
--   postpone_take_at itself, and the seven-argument one does the work of the five-argument
--   one, which it called: two copies fewer, -1,120 a job. postpone_take_at and the
--   five-argument postpone_claim_jobs stay, for the builds that call them.
-- * postpone_stats_record, the trigger that counts finished jobs in postpone_stats, finds a
--   wait's bucket with width_bucket over the buckets' bounds instead of a logarithm of its
--   milliseconds (the wait was computed again for each use of it, four times a job); the
--   buckets are the same (tests/suite/stats_waits.rs tries each bound). A claim (no
--   finished job) is told from an outcome in two comparisons a row instead of four:
--   -3,944 a job in all.
--
-- Every function keeps its signature and its results.

DROP INDEX IF EXISTS postpone_jobs_control_idx;
CREATE INDEX postpone_jobs_control_idx ON postpone_jobs (worker_id)
    WHERE (abort_requested OR cancel_requested) AND status = 'doing';
DROP INDEX IF EXISTS postpone_jobs_due_expiring_idx;
CREATE INDEX postpone_jobs_due_expiring_idx ON postpone_jobs (priority DESC, scheduled_at, id)
    WHERE expires_at IS NOT NULL AND blocked_by IS NULL AND status = 'todo';
DROP INDEX IF EXISTS postpone_jobs_due_expiring_queue_idx;
CREATE INDEX postpone_jobs_due_expiring_queue_idx
    ON postpone_jobs (queue, priority DESC, scheduled_at, id)
    WHERE expires_at IS NOT NULL AND blocked_by IS NULL AND status = 'todo';
DROP INDEX IF EXISTS postpone_jobs_due_span_idx;
CREATE INDEX postpone_jobs_due_span_idx
    ON postpone_jobs ((CASE WHEN scheduled_at > '9999-12-31 00:00:00+00' THEN interval '0'
                            WHEN scheduled_at >= '1900-01-01 00:00:00+00'
                             AND expires_at >= '1900-01-01 00:00:00+00'
                             AND expires_at <= '9999-12-31 00:00:00+00'
                            THEN expires_at - scheduled_at END))
    WHERE expires_at IS NOT NULL AND blocked_by IS NULL AND status = 'todo';
DROP INDEX IF EXISTS postpone_jobs_expiry_idx;
CREATE INDEX postpone_jobs_expiry_idx ON postpone_jobs (expires_at)
    WHERE expires_at IS NOT NULL AND status = 'todo';
DROP INDEX IF EXISTS postpone_jobs_lock_doing_idx;
CREATE UNIQUE INDEX postpone_jobs_lock_doing_idx ON postpone_jobs (lock)
    WHERE lock IS NOT NULL AND status = 'doing';
DROP INDEX IF EXISTS postpone_jobs_lock_pending_idx;
CREATE INDEX postpone_jobs_lock_pending_idx ON postpone_jobs (lock, id)
    WHERE lock IS NOT NULL AND status IN ('todo', 'doing');
DROP INDEX IF EXISTS postpone_jobs_queueing_lock_idx;
CREATE UNIQUE INDEX postpone_jobs_queueing_lock_idx ON postpone_jobs (queueing_lock)
    WHERE queueing_lock IS NOT NULL AND status = 'todo';
DROP INDEX IF EXISTS postpone_jobs_unique_active_idx;
CREATE UNIQUE INDEX postpone_jobs_unique_active_idx ON postpone_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('todo', 'doing');
DROP INDEX IF EXISTS postpone_jobs_unique_succeeded_idx;
CREATE UNIQUE INDEX postpone_jobs_unique_succeeded_idx ON postpone_jobs (unique_key)
    WHERE unique_key LIKE 's:%' AND status IN ('todo', 'doing', 'succeeded');

CREATE OR REPLACE FUNCTION postpone_started_late(p_expires_at timestamp with time zone, p_started_at timestamp with time zone, p_ran_us bigint)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(p_expires_at IS NOT NULL AND p_started_at IS NULL AND p_ran_us IS NOT NULL
                    AND isfinite(p_expires_at)
                    AND now() - least(greatest(p_ran_us, 0), 3155760000000000)
                                * interval '1 microsecond' - interval '1 second'
                        > p_expires_at, false)
$function$;

CREATE OR REPLACE FUNCTION postpone_take_at(p_worker bigint, p_tids tid[])
 RETURNS TABLE(id bigint, queue text, task text, args jsonb, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, expires_in double precision)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    v_hold boolean := current_setting('postpone.hold', true) IS NOT DISTINCT FROM 'on';
BEGIN
    RETURN QUERY
    UPDATE postpone_jobs j
       SET status = 'doing', worker_id = p_worker, attempts = least(j.attempts, 2147483646) + 1,
           started_at = CASE WHEN v_hold THEN NULL ELSE now() END,
           claimed_at = now()
     WHERE j.ctid = ANY(p_tids) AND j.status = 'todo'
       AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
    RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
              j.abort_requested, j.scheduled_at,
              CASE WHEN isfinite(j.scheduled_at)
                   THEN date_part('epoch', now() - j.scheduled_at) END,
              j.max_attempts,
              CASE WHEN isfinite(j.expires_at)
                   THEN date_part('epoch', j.expires_at - now()) END;
END
$function$;

CREATE OR REPLACE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[])
 RETURNS TABLE(id bigint, queue text, task text, args jsonb, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, expires_in double precision)
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
    -- The claim's byte budget, set by the seven-argument postpone_claim_jobs (NULL: none),
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
    v_have_b integer;
    v_merge boolean;
    -- Whether claimed jobs are held, not started (set by the five- and seven-argument
    -- postpone_claim_jobs).
    v_hold boolean := current_setting('postpone.hold', true) IS NOT DISTINCT FROM 'on';
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
                                                     c.args -> q.karg AS k
                                                FROM postpone_jobs c
                                               WHERE c.queue = q.name
                                                 AND c.status = 'todo'
                                                 AND c.blocked_by IS NULL
                                                 AND c.scheduled_at <= now()
                                                 AND c.expires_at IS NULL
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
                                                 FOR UPDATE SKIP LOCKED) a)
                                              UNION ALL
                                              (SELECT * FROM (SELECT c.id, c.priority, c.scheduled_at,
                                                     c.args -> q.karg AS k
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
                                                 FOR UPDATE SKIP LOCKED) b)) c) y
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
               c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, c.expires_in
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
            IF v_queues IS NULL THEN
                -- The jobs without a deadline.
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
                -- The jobs with a deadline: each priority's walk starts at v_from, past every
                -- job whose deadline must have passed.
                IF v_deadlines THEN
                    v_have_b := 0;
                    SELECT c.priority INTO v_p
                      FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL
                       AND c.expires_at IS NOT NULL
                     ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                    WHILE v_p IS NOT NULL LOOP
                        SELECT v_ids || coalesce(array_agg(x.id),
                                                 '{}'),
                               v_tids || coalesce(array_agg(x.ctid),
                                                  '{}'),
                               v_sizes || coalesce(array_agg(CASE WHEN v_measure
                                                                  THEN x.args_bytes
                                                             END), '{}'),
                               v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                               v_have_b + count(*)
                          INTO v_ids, v_tids, v_sizes, v_locks, v_have_b
                          FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args, c.args_bytes
                                  FROM postpone_jobs c
                                 WHERE c.status = 'todo'
                                   AND c.blocked_by IS NULL
                                   AND c.expires_at IS NOT NULL
                                   AND c.priority = v_p
                                   AND c.scheduled_at > v_from
                                   AND c.scheduled_at <= now()
                                   AND c.expires_at > now()
                                   AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                 ORDER BY c.priority DESC, c.scheduled_at, c.id
                                 LIMIT v_scan - v_have_b
                                   FOR UPDATE SKIP LOCKED) x;
                        EXIT WHEN v_have_b >= v_scan;
                        SELECT c.priority INTO v_p
                          FROM postpone_jobs c
                         WHERE c.status = 'todo' AND c.blocked_by IS NULL
                           AND c.expires_at IS NOT NULL AND c.priority < v_p
                         ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                    END LOOP;
                    v_merge := v_have_b > 0;
                END IF;
            ELSE
                -- Each queue's walk names its queue as `= ANY (ARRAY[v_q])`: an equality
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
                    IF v_deadlines THEN
                        v_have_b := 0;
                        SELECT c.priority INTO v_p
                          FROM postpone_jobs c
                         WHERE c.queue = ANY (ARRAY[v_q]) AND c.status = 'todo' AND c.blocked_by IS NULL
                           AND c.expires_at IS NOT NULL
                         ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                        WHILE v_p IS NOT NULL LOOP
                            SELECT v_ids || coalesce(array_agg(x.id),
                                                     '{}'),
                                   v_tids || coalesce(array_agg(x.ctid),
                                                      '{}'),
                                   v_sizes || coalesce(array_agg(CASE WHEN v_measure
                                                                      THEN x.args_bytes
                                                                 END),
                                                       '{}'),
                                   v_locks OR coalesce(bool_or(x.lock IS NOT NULL), false),
                                   v_have_b + count(*)
                              INTO v_ids, v_tids, v_sizes, v_locks, v_have_b
                              FROM (SELECT c.id, c.ctid, c.lock, c.scheduled_at, c.args, c.args_bytes
                                      FROM postpone_jobs c
                                     WHERE c.queue = ANY (ARRAY[v_q])
                                       AND c.status = 'todo'
                                       AND c.blocked_by IS NULL
                                       AND c.expires_at IS NOT NULL
                                       AND c.priority = v_p
                                       AND c.scheduled_at > v_from
                                       AND c.scheduled_at <= now()
                                       AND c.expires_at > now()
                                       AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                                     ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                                     LIMIT v_scan - v_have_b
                                       FOR UPDATE SKIP LOCKED) x;
                            EXIT WHEN v_have_b >= v_scan;
                            SELECT c.priority INTO v_p
                              FROM postpone_jobs c
                             WHERE c.queue = ANY (ARRAY[v_q]) AND c.status = 'todo' AND c.blocked_by IS NULL
                               AND c.expires_at IS NOT NULL AND c.priority < v_p
                             ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id LIMIT 1;
                        END LOOP;
                        v_merge := v_merge OR v_have_b > 0;
                    END IF;
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

            IF cardinality(v_free) > 0 THEN
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
                               THEN date_part('epoch', j.expires_at - now()) END;
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
$function$;

CREATE OR REPLACE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[], p_start integer, p_bytes bigint, p_alone boolean)
 RETURNS TABLE(id bigint, queue text, task text, args jsonb, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, held boolean, expires_in double precision)
 LANGUAGE plpgsql
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    v_limited boolean;
    v_limit integer := p_limit;
BEGIN
    -- The byte budget and whether a first job larger than it may come alone, for the walk.
    PERFORM set_config('postpone.bytes',
                      CASE WHEN p_bytes IS NULL THEN '' ELSE greatest(p_bytes, 0)::text END, true);
    PERFORM set_config('postpone.alone', CASE WHEN p_alone THEN 'on' ELSE 'off' END, true);
    PERFORM set_config('postpone.cut', 'off', true);
    -- What the five-argument postpone_claim_jobs does: a claim of a limited queue starts
    -- every job it takes (at most p_start), others hold theirs until the worker starts them.
    PERFORM pg_advisory_xact_lock_shared(1886352245, 0);
    v_limited := (EXISTS (SELECT 1 FROM postpone_queue_limits)
                  OR EXISTS (SELECT 1 FROM postpone_key_limits)
                  OR EXISTS (SELECT 1 FROM postpone_rate_limits))
             AND (p_queues IS NULL
                  OR EXISTS (SELECT 1 FROM postpone_queue_limits l WHERE l.queue = ANY(p_queues))
                  OR EXISTS (SELECT 1 FROM postpone_key_limits l WHERE l.queue = ANY(p_queues))
                  OR EXISTS (SELECT 1 FROM postpone_rate_limits l WHERE l.queue = ANY(p_queues)));
    IF v_limited THEN
        v_limit := least(p_limit, greatest(p_start, 0));
    END IF;
    IF v_limit > 0 THEN
        PERFORM set_config('postpone.hold', CASE WHEN v_limited THEN 'off' ELSE 'on' END, true);
        RETURN QUERY
            SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock,
                   c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, NOT v_limited,
                   c.expires_in
              FROM postpone_claim_jobs(p_worker, v_limit, p_queues, p_tasks) c;
        PERFORM set_config('postpone.hold', 'off', true);
    END IF;
    PERFORM set_config('postpone.bytes', '', true);
    PERFORM set_config('postpone.alone', 'off', true);
END
$function$;

CREATE OR REPLACE FUNCTION postpone_stats_record()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    new_hours integer := 0;
    v_rows refcursor;
    r record;
    v_shard smallint := (pg_backend_pid() % 4)::smallint;
    v_fresh boolean;
    -- Where the buckets of a job's wait begin: bucket b (1 to 23) from 2^(b-1) ms on, bucket
    -- 0 below 1 ms. width_bucket finds a wait's bucket in five comparisons of intervals.
    v_bounds interval[] := ARRAY(SELECT (2 ^ k) * interval '1 millisecond'
                                   FROM generate_series(0, 22) AS k);
BEGIN
    -- The finished jobs of this statement, counted per queue and outcome, added to this
    -- minute's and this hour's rows (in key order). A job's wait has no bucket when it did
    -- not start or a time is infinite.
    IF TG_OP = 'UPDATE' THEN
        -- A claim, a heartbeat, a retry: no row reached a final status. Nothing to write.
        -- (The statuses are those of the table's CHECK: two comparisons a row, not four.)
        IF NOT EXISTS (SELECT 1 FROM postpone_stats_new n
                        WHERE n.status NOT IN ('todo', 'doing')) THEN
            RETURN NULL;
        END IF;
        OPEN v_rows FOR
        WITH x AS (
                SELECT n.queue, n.status AS outcome,
                       width_bucket(CASE WHEN isfinite(n.started_at) AND isfinite(n.scheduled_at)
                                         THEN n.started_at - n.scheduled_at END,
                                    v_bounds) AS b
                  FROM postpone_stats_new n JOIN postpone_stats_old o ON o.id = n.id
                 WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
                   AND o.status IN ('todo', 'doing')
            ), y AS (
                SELECT x.queue, x.outcome, x.b, count(*) AS n
                  FROM x GROUP BY x.queue, x.outcome, x.b
            ), g AS (
                SELECT y.queue, y.outcome, sum(y.n)::bigint AS jobs,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 0), 0)::integer AS w0,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 1), 0)::integer AS w1,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 2), 0)::integer AS w2,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 3), 0)::integer AS w3,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 4), 0)::integer AS w4,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 5), 0)::integer AS w5,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 6), 0)::integer AS w6,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 7), 0)::integer AS w7,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 8), 0)::integer AS w8,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 9), 0)::integer AS w9,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 10), 0)::integer AS w10,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 11), 0)::integer AS w11,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 12), 0)::integer AS w12,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 13), 0)::integer AS w13,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 14), 0)::integer AS w14,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 15), 0)::integer AS w15,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 16), 0)::integer AS w16,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 17), 0)::integer AS w17,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 18), 0)::integer AS w18,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 19), 0)::integer AS w19,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 20), 0)::integer AS w20,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 21), 0)::integer AS w21,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 22), 0)::integer AS w22,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 23), 0)::integer AS w23
                  FROM y GROUP BY y.queue, y.outcome
            )
            SELECT sp.span, date_trunc(sp.span, now()) AS at, g.*
              FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
             ORDER BY 1, g.queue, g.outcome;
    ELSE
        IF NOT EXISTS (SELECT 1 FROM postpone_stats_old o WHERE o.status = 'doing') THEN
            RETURN NULL;
        END IF;
        OPEN v_rows FOR
        WITH x AS (
                SELECT o.queue, 'succeeded'::text AS outcome,
                       width_bucket(CASE WHEN isfinite(o.started_at) AND isfinite(o.scheduled_at)
                                         THEN o.started_at - o.scheduled_at END,
                                    v_bounds) AS b
                  FROM postpone_stats_old o
                 WHERE o.status = 'doing'
            ), y AS (
                SELECT x.queue, x.outcome, x.b, count(*) AS n
                  FROM x GROUP BY x.queue, x.outcome, x.b
            ), g AS (
                SELECT y.queue, y.outcome, sum(y.n)::bigint AS jobs,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 0), 0)::integer AS w0,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 1), 0)::integer AS w1,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 2), 0)::integer AS w2,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 3), 0)::integer AS w3,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 4), 0)::integer AS w4,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 5), 0)::integer AS w5,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 6), 0)::integer AS w6,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 7), 0)::integer AS w7,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 8), 0)::integer AS w8,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 9), 0)::integer AS w9,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 10), 0)::integer AS w10,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 11), 0)::integer AS w11,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 12), 0)::integer AS w12,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 13), 0)::integer AS w13,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 14), 0)::integer AS w14,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 15), 0)::integer AS w15,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 16), 0)::integer AS w16,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 17), 0)::integer AS w17,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 18), 0)::integer AS w18,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 19), 0)::integer AS w19,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 20), 0)::integer AS w20,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 21), 0)::integer AS w21,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 22), 0)::integer AS w22,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 23), 0)::integer AS w23
                  FROM y GROUP BY y.queue, y.outcome
            )
            SELECT sp.span, date_trunc(sp.span, now()) AS at, g.*
              FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
             ORDER BY 1, g.queue, g.outcome;
    END IF;
    -- A row of this minute or hour is added to by a plain UPDATE: an INSERT ... ON
    -- CONFLICT DO UPDATE locks the row it finds first, one more WAL record (54 bytes) per
    -- row, twice per statement that records outcomes. The INSERT is for a row not there
    -- yet (and for one another session inserted meanwhile).
    LOOP
        FETCH v_rows INTO r;
        EXIT WHEN NOT FOUND;
        UPDATE postpone_stats s
           SET jobs = CASE WHEN s.jobs > 9223372036854775807 - r.jobs
                               THEN 9223372036854775807 ELSE s.jobs + r.jobs END,
                   w0 = least(s.w0::bigint + r.w0, 2147483647)::integer,
                   w1 = least(s.w1::bigint + r.w1, 2147483647)::integer,
                   w2 = least(s.w2::bigint + r.w2, 2147483647)::integer,
                   w3 = least(s.w3::bigint + r.w3, 2147483647)::integer,
                   w4 = least(s.w4::bigint + r.w4, 2147483647)::integer,
                   w5 = least(s.w5::bigint + r.w5, 2147483647)::integer,
                   w6 = least(s.w6::bigint + r.w6, 2147483647)::integer,
                   w7 = least(s.w7::bigint + r.w7, 2147483647)::integer,
                   w8 = least(s.w8::bigint + r.w8, 2147483647)::integer,
                   w9 = least(s.w9::bigint + r.w9, 2147483647)::integer,
                   w10 = least(s.w10::bigint + r.w10, 2147483647)::integer,
                   w11 = least(s.w11::bigint + r.w11, 2147483647)::integer,
                   w12 = least(s.w12::bigint + r.w12, 2147483647)::integer,
                   w13 = least(s.w13::bigint + r.w13, 2147483647)::integer,
                   w14 = least(s.w14::bigint + r.w14, 2147483647)::integer,
                   w15 = least(s.w15::bigint + r.w15, 2147483647)::integer,
                   w16 = least(s.w16::bigint + r.w16, 2147483647)::integer,
                   w17 = least(s.w17::bigint + r.w17, 2147483647)::integer,
                   w18 = least(s.w18::bigint + r.w18, 2147483647)::integer,
                   w19 = least(s.w19::bigint + r.w19, 2147483647)::integer,
                   w20 = least(s.w20::bigint + r.w20, 2147483647)::integer,
                   w21 = least(s.w21::bigint + r.w21, 2147483647)::integer,
                   w22 = least(s.w22::bigint + r.w22, 2147483647)::integer,
                   w23 = least(s.w23::bigint + r.w23, 2147483647)::integer
         WHERE s.span = r.span AND s.at = r.at AND s.queue = r.queue
           AND s.outcome = r.outcome AND s.shard = v_shard;
        IF NOT FOUND THEN
            INSERT INTO postpone_stats AS s (span, at, queue, outcome, shard, jobs, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23)
            VALUES (r.span, r.at, r.queue, r.outcome, v_shard, r.jobs, r.w0, r.w1, r.w2, r.w3, r.w4, r.w5, r.w6, r.w7, r.w8, r.w9, r.w10, r.w11, r.w12, r.w13, r.w14, r.w15, r.w16, r.w17, r.w18, r.w19, r.w20, r.w21, r.w22, r.w23)
            ON CONFLICT (span, at, queue, outcome, shard) DO UPDATE
               SET jobs = CASE WHEN s.jobs > 9223372036854775807 - EXCLUDED.jobs
                               THEN 9223372036854775807 ELSE s.jobs + EXCLUDED.jobs END,
                   w0 = least(s.w0::bigint + EXCLUDED.w0, 2147483647)::integer,
                   w1 = least(s.w1::bigint + EXCLUDED.w1, 2147483647)::integer,
                   w2 = least(s.w2::bigint + EXCLUDED.w2, 2147483647)::integer,
                   w3 = least(s.w3::bigint + EXCLUDED.w3, 2147483647)::integer,
                   w4 = least(s.w4::bigint + EXCLUDED.w4, 2147483647)::integer,
                   w5 = least(s.w5::bigint + EXCLUDED.w5, 2147483647)::integer,
                   w6 = least(s.w6::bigint + EXCLUDED.w6, 2147483647)::integer,
                   w7 = least(s.w7::bigint + EXCLUDED.w7, 2147483647)::integer,
                   w8 = least(s.w8::bigint + EXCLUDED.w8, 2147483647)::integer,
                   w9 = least(s.w9::bigint + EXCLUDED.w9, 2147483647)::integer,
                   w10 = least(s.w10::bigint + EXCLUDED.w10, 2147483647)::integer,
                   w11 = least(s.w11::bigint + EXCLUDED.w11, 2147483647)::integer,
                   w12 = least(s.w12::bigint + EXCLUDED.w12, 2147483647)::integer,
                   w13 = least(s.w13::bigint + EXCLUDED.w13, 2147483647)::integer,
                   w14 = least(s.w14::bigint + EXCLUDED.w14, 2147483647)::integer,
                   w15 = least(s.w15::bigint + EXCLUDED.w15, 2147483647)::integer,
                   w16 = least(s.w16::bigint + EXCLUDED.w16, 2147483647)::integer,
                   w17 = least(s.w17::bigint + EXCLUDED.w17, 2147483647)::integer,
                   w18 = least(s.w18::bigint + EXCLUDED.w18, 2147483647)::integer,
                   w19 = least(s.w19::bigint + EXCLUDED.w19, 2147483647)::integer,
                   w20 = least(s.w20::bigint + EXCLUDED.w20, 2147483647)::integer,
                   w21 = least(s.w21::bigint + EXCLUDED.w21, 2147483647)::integer,
                   w22 = least(s.w22::bigint + EXCLUDED.w22, 2147483647)::integer,
                   w23 = least(s.w23::bigint + EXCLUDED.w23, 2147483647)::integer
            RETURNING (s.xmax = 0) INTO v_fresh;
            IF v_fresh AND r.span = 'hour' THEN
                new_hours := new_hours + 1;
            END IF;
        END IF;
    END LOOP;
    CLOSE v_rows;
    IF new_hours > 0 THEN
        DELETE FROM postpone_stats
         WHERE (span = 'minute' AND at < now() - interval '2 hours')
            OR (span = 'hour' AND at < now() - interval '8 days');
    END IF;
    RETURN NULL;
END
$function$;
