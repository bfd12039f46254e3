-- postpone schema, version 46: job arguments stored as the JSON text they were deferred as.
--
-- `postpone_jobs.args` becomes `json` (it was `jsonb`). jsonb keeps a parsed binary form: the
-- server parses the text at the defer, and prints it back to text at every claim, for every
-- reader, and for the size column `args_bytes` at the defer. For large arguments that was
-- much of the server's work a job: 64 KiB of arguments cost about 140 microseconds to parse
-- and 90-200 to print (psql over 500-1,000 rows of each type held in shared buffers), where
-- `json` is checked at the insert and sent as stored. `defer_batch` of such jobs went from
-- about 950 to 1,500 a second on the project's machine; drains did not change (reading the
-- arguments back and receiving them bound them: docs/performance-log.md).
--
-- * The library defers through `json` parameters; `postpone_defer`, `postpone_defer_jobs`
--   and the schedules keep their `jsonb` parameters (PostgreSQL casts jsonb to json on the
--   insert), so SQL callers change nothing. Arguments are read back as the same JSON value;
--   their text is the library's compact serialization (a jsonb value cast to json prints as
--   jsonb did).
-- * The claim is `postpone_claim_batch`, seven and four arguments, the same as the
--   `postpone_claim_jobs` of those arities but returning `args json`. The older entry points
--   (`postpone_claim_jobs` of four, five and seven arguments, `postpone_claim`,
--   `postpone_take`, `postpone_take_at`) keep their signatures for the builds that call
--   them, and cast the arguments back to jsonb.
-- * json accepts text that PostgreSQL cannot read back as text: a \u0000 escape, a lone
--   surrogate (`->` and `->>` fail on them, as jsonb's input did). The library refuses them at
--   the defer; the insert trigger (`postpone_notify_jobs`) and a trigger on updates that set
--   `args` refuse them from any other writer, so that no row's arguments can fail a
--   statement over many jobs (a claim of a queue with a key limit reads `args -> key`).
--   They read the arguments as jsonb only when their text holds a `\u` escape: 55
--   microseconds a job of 64 KiB without one, under a tenth of one for a small job. (A
--   CHECK constraint did the same, but PostgreSQL evaluates every CHECK on every update:
--   the claim's and the outcome's too, about 1,000 instructions a job each, counted with
--   benches/instructions.sh.)
-- * Per-key concurrency limits compare a key's value as the JSON text stored for it: two
--   jobs share a key when `args -> key` prints the same text (jsonb compared values).
-- * `postpone_args_jsonb` reads arguments as jsonb for the filters that need it (the admin
--   API's containment filter), NULL where they cannot be read so (a number past numeric's
--   range, which json stores and jsonb refuses).
--
-- The table is rewritten (the column's type, and `args_bytes`, computed from it, with it):
-- writes to postpone_jobs wait while the migration runs.

ALTER TABLE postpone_jobs
    DROP COLUMN args_bytes,
    ALTER COLUMN args TYPE json USING args::json,
    ADD COLUMN args_bytes integer GENERATED ALWAYS AS (octet_length(args::text)) STORED;
-- A new type drops the column's compression method: lz4 again where the server has it, as
-- schema 34 set it.
DO $$
BEGIN
    IF current_setting('server_version_num')::integer >= 140000
       AND EXISTS (SELECT 1 FROM pg_settings
                    WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))
    THEN
        EXECUTE 'ALTER TABLE postpone_jobs ALTER COLUMN args SET COMPRESSION lz4';
    END IF;
END
$$;

CREATE FUNCTION postpone_claim_batch(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[])
 RETURNS TABLE(id bigint, queue text, task text, args json, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, expires_in double precision)
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
                                                     (c.args -> q.karg)::text AS k
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

CREATE FUNCTION postpone_claim_batch(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[], p_start integer, p_bytes bigint, p_alone boolean)
 RETURNS TABLE(id bigint, queue text, task text, args json, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, held boolean, expires_in double precision)
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
              FROM postpone_claim_batch(p_worker, v_limit, p_queues, p_tasks) c;
        PERFORM set_config('postpone.hold', 'off', true);
    END IF;
    PERFORM set_config('postpone.bytes', '', true);
    PERFORM set_config('postpone.alone', 'off', true);
END
$function$;

CREATE OR REPLACE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[])
 RETURNS TABLE(id bigint, queue text, task text, args jsonb, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, expires_in double precision)
 LANGUAGE sql
AS $function$
    SELECT c.id, c.queue, c.task, c.args::jsonb, c.attempts, c.priority, c.lock,
           c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, c.expires_in
      FROM postpone_claim_batch(p_worker, p_limit, p_queues, p_tasks) c
$function$;

CREATE OR REPLACE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[], p_start integer, p_bytes bigint, p_alone boolean)
 RETURNS TABLE(id bigint, queue text, task text, args jsonb, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, held boolean, expires_in double precision)
 LANGUAGE sql
AS $function$
    SELECT c.id, c.queue, c.task, c.args::jsonb, c.attempts, c.priority, c.lock,
           c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, c.held, c.expires_in
      FROM postpone_claim_batch(p_worker, p_limit, p_queues, p_tasks, p_start, p_bytes,
                                p_alone) c
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
    RETURNING j.id, j.queue, j.task, j.args::jsonb, j.attempts, j.priority, j.lock,
              j.abort_requested, j.scheduled_at,
              CASE WHEN isfinite(j.scheduled_at)
                   THEN date_part('epoch', now() - j.scheduled_at) END,
              j.max_attempts,
              CASE WHEN isfinite(j.expires_at)
                   THEN date_part('epoch', j.expires_at - now()) END;
END
$function$;

CREATE OR REPLACE FUNCTION postpone_take(p_worker bigint, p_ids bigint[])
 RETURNS TABLE(id bigint, queue text, task text, args jsonb, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE postpone_jobs j
       SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
           started_at = now()
     WHERE j.id = ANY(p_ids)
       AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
    RETURNING j.id, j.queue, j.task, j.args::jsonb, j.attempts, j.priority, j.lock,
              j.abort_requested, j.scheduled_at,
              extract(epoch FROM now() - j.scheduled_at)::float8, j.max_attempts;
END
$function$;

CREATE FUNCTION postpone_args_jsonb(p_args json)
 RETURNS jsonb
 LANGUAGE plpgsql
 IMMUTABLE STRICT
AS $function$
BEGIN
    RETURN p_args::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION postpone_notify_jobs()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
    -- In the same walk, arguments whose text holds a \u escape (5c 75: a backslash and a
    -- "u") are read as jsonb: an escape PostgreSQL cannot read back (\u0000, a lone
    -- surrogate) fails the statement here, as jsonb's input did, rather than a claim's
    -- `args -> key` later. (The second test is never true: it either passes or raises.)
    SELECT n.size, n.task INTO v_size, v_task
      FROM (SELECT j.args_bytes::bigint AS size, j.task, j.args
              FROM postpone_new_jobs j) n
     WHERE n.size > v_max
        OR (position(decode('5c75', 'hex') IN textsend(n.args::text)) > 0
            AND n.args::jsonb IS NULL)
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
$function$;

-- The same for an update that sets `args` (by hand: the library never does).
-- After the row, not before: a BEFORE row trigger on updates makes PostgreSQL lock every
-- updated row for it whatever the columns (the claim's and the outcome's rows included:
-- about 9,000 instructions a job each), where an AFTER trigger of a column list is queued
-- only for the updates that set that column.
CREATE FUNCTION postpone_args_readable()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM NEW.args::jsonb;
    RETURN NULL;
END
$function$;

CREATE TRIGGER postpone_jobs_args AFTER UPDATE OF args ON postpone_jobs
    FOR EACH ROW WHEN (position(decode('5c75', 'hex') IN textsend(NEW.args::text)) > 0)
    EXECUTE FUNCTION postpone_args_readable();
