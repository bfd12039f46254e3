-- postpone schema, version 48: a claim's jobs can be written once, with their outcome.
--
-- A claim today writes each job's row twice: `doing` at the claim and its outcome after,
-- two new row versions with their index entries. With `p_lock_only` (the eight-argument
-- postpone_claim_batch), the claim only locks the jobs that need no row of their own while
-- they run (no `lock`, queueing lock or unique key, no deadline, no abort request, no
-- limited queue: those are claimed as before) and returns them with `locked`; they stay `todo`, locked by the claim's
-- transaction, which the worker keeps open while it runs them, and postpone_settle_locked
-- writes each one once, in that transaction: its outcome, or `doing` for one still running
-- (or not started) when the worker commits. Jobs it does not name go back to the queue
-- when the transaction ends, untouched.
--
-- A server that loses that transaction (a restart, a failover, a terminated backend) while
-- the worker runs its jobs would leave them `todo` and unlocked: another worker could start
-- them. So the worker notes its claims before any of their jobs starts (postpone_note_claim,
-- committed on another connection: the ids of its open transactions, one per claiming
-- connection, and their jobs, as ranges of ids, on its postpone_workers row), and while a
-- noted transaction is `aborted` no claim takes the noted jobs (postpone_lost_jobs). The
-- worker, once connected again, writes what became of them (postpone_settle_locked with the
-- lost transaction's id) and takes that transaction off its note (postpone_unnote_claim); a
-- worker declared dead first has them requeued by the rescue, an attempt counted for each,
-- so a job that kills its process every time still runs out of attempts.
--
-- The four-argument postpone_claim_batch gets a last column, `locked`, so it is dropped and
-- created again; the seven-argument one, which builds of version 47 and before call, is
-- unchanged for them.

ALTER TABLE postpone_workers ADD COLUMN claim_xids xid8[], ADD COLUMN claim_jobs int8multirange;

-- Whether a worker's note names a transaction that is known lost.
CREATE FUNCTION postpone_note_lost(p_xids xid8[])
 RETURNS boolean
 LANGUAGE sql
 VOLATILE
AS $function$
    SELECT EXISTS (SELECT 1 FROM unnest(p_xids) AS x WHERE pg_xact_status(x) = 'aborted')
$function$;

-- The jobs of noted claims of which a transaction is known lost: ranges of ids (NULL:
-- none). A note names the open transactions of a worker (one per claiming connection) and
-- their jobs together, so all of them are kept from other claims then.
CREATE FUNCTION postpone_lost_jobs()
 RETURNS int8multirange
 LANGUAGE sql
 VOLATILE
AS $function$
    SELECT range_agg(r)
      FROM postpone_workers w, unnest(w.claim_jobs) AS r
     WHERE w.claim_xids IS NOT NULL AND postpone_note_lost(w.claim_xids)
$function$;

-- A worker's note of its open transactions `p_xids` and the jobs they locked (`p_ids`),
-- in place of the note before (whose transactions have ended and been written). Returns
-- false when the worker's row is gone (it was presumed dead): it must start none of them.
CREATE FUNCTION postpone_note_claim(p_worker bigint, p_xids xid8[], p_ids bigint[])
 RETURNS boolean
 LANGUAGE sql
AS $function$
    WITH n AS (
        UPDATE postpone_workers w
           SET claim_xids = p_xids,
               claim_jobs = (SELECT range_agg(int8range(i, i, '[]')) FROM unnest(p_ids) AS i)
         WHERE w.id = p_worker
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM n)
$function$;

-- Takes the lost transaction `p_xid`, whose jobs its worker has written, off the worker's
-- note (its other transactions stay).
CREATE FUNCTION postpone_unnote_claim(p_worker bigint, p_xid xid8)
 RETURNS void
 LANGUAGE sql
AS $function$
    UPDATE postpone_workers w
       SET claim_xids = nullif(array_remove(w.claim_xids, p_xid), '{}')
     WHERE w.id = p_worker AND w.claim_xids @> ARRAY[p_xid]
$function$;

-- Writes the jobs a lock-only claim took, each once: `p_outcomes` `succeeded` (it ended so,
-- `p_ran_us` µs after its start, with `p_outputs`), `running` (it started `p_ran_us` µs
-- ago: `doing`, its outcome recorded later as any running job's) or `held` (not started:
-- `doing` and held, as a claim without lock_only leaves it). Each job is named with the
-- attempt the claim gave it (`p_attempts`). `p_xid` is the claim's transaction: the current
-- one (the rows must be locked by it), or one that was lost (it is `aborted` and the
-- worker's note names it and the job). Rows changed meanwhile (cancelled, requeued by the
-- rescue: their attempt moved on) are left alone. `doing` is written only while the
-- worker's row is there. Returns the ids written.
CREATE FUNCTION postpone_settle_locked(p_worker bigint, p_xid xid8, p_ids bigint[], p_attempts integer[], p_outcomes text[], p_outputs jsonb[], p_ran_us bigint[])
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_nestloop TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
 SET lock_timeout TO '200ms'
AS $function$
DECLARE
    v_mine boolean := p_xid = pg_current_xact_id();
    v_lost int8multirange;
    v_alive boolean := EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker);
BEGIN
    IF NOT v_mine THEN
        SELECT w.claim_jobs INTO v_lost
          FROM postpone_workers w
         WHERE w.id = p_worker AND w.claim_xids @> ARRAY[p_xid]
           AND pg_xact_status(p_xid) = 'aborted';
        IF v_lost IS NULL THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_attempts, p_outcomes, p_outputs, p_ran_us)
            AS o(id, attempt, outcome, output, ran_us)
         WHERE o.outcome = 'succeeded' OR (o.outcome IN ('running', 'held') AND v_alive)
    )
    UPDATE postpone_jobs j
       SET status = CASE WHEN o.outcome = 'succeeded' THEN 'succeeded' ELSE 'doing' END,
           worker_id = p_worker,
           attempts = o.attempt,
           claimed_at = CASE WHEN o.outcome = 'held' THEN now()
                             ELSE now() - least(greatest(coalesce(o.ran_us, 0), 0), 3155760000000000)
                                          * interval '1 microsecond' END,
           started_at = CASE WHEN o.outcome = 'held' THEN NULL
                             ELSE now() - least(greatest(coalesce(o.ran_us, 0), 0), 3155760000000000)
                                          * interval '1 microsecond' END,
           finished_at = CASE WHEN o.outcome = 'succeeded' THEN now() END,
           output = CASE WHEN o.outcome = 'succeeded' THEN o.output ELSE j.output END
      FROM o
     WHERE j.id = o.id AND j.id = ANY(p_ids)
       AND j.status = 'todo'
       AND least(j.attempts, 2147483646) + 1 = o.attempt
       AND j.lock IS NULL AND j.queueing_lock IS NULL AND j.unique_key IS NULL
       AND j.expires_at IS NULL AND NOT j.abort_requested
       AND CASE WHEN v_mine THEN j.xmax = p_xid::xid ELSE v_lost @> j.id END
    RETURNING j.id;
END
$function$;

DROP FUNCTION postpone_claim_batch(bigint, integer, text[], text[]);

CREATE FUNCTION postpone_claim_batch(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[])
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
    v_have_b integer;
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
BEGIN
    IF EXISTS (SELECT 1 FROM postpone_workers w WHERE w.claim_xids IS NOT NULL) THEN
        v_lost := postpone_lost_jobs();
    END IF;
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
                                 AND (v_lost IS NULL OR NOT v_lost @> c.id)
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
                                     AND (v_lost IS NULL OR NOT v_lost @> c.id)
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

CREATE FUNCTION postpone_claim_batch(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[], p_start integer, p_bytes bigint, p_alone boolean, p_lock_only boolean)
 RETURNS TABLE(id bigint, queue text, task text, args json, attempts integer, priority integer, lock text, abort_requested boolean, scheduled_at timestamp with time zone, queue_wait double precision, max_attempts integer, held boolean, expires_in double precision, locked boolean)
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
        PERFORM set_config('postpone.lock_only', CASE WHEN p_lock_only THEN 'on' ELSE 'off' END,
                           true);
        RETURN QUERY
            SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock,
                   c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, NOT v_limited,
                   c.expires_in, c.locked
              FROM postpone_claim_batch(p_worker, v_limit, p_queues, p_tasks) c;
        PERFORM set_config('postpone.hold', 'off', true);
        PERFORM set_config('postpone.lock_only', 'off', true);
    END IF;
    PERFORM set_config('postpone.bytes', '', true);
    PERFORM set_config('postpone.alone', 'off', true);
END
$function$;


CREATE OR REPLACE FUNCTION postpone_rescue(p_stalled_ms bigint, p_me bigint)
 RETURNS TABLE(dead bigint, ids bigint[], outcomes text[])
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_dead bigint;
    v_ids bigint[];
    v_workers bigint[];
    v_attempts integer[];
    v_errors text[];
    v_out_ids bigint[] := '{}';
    v_outcomes text[] := '{}';
    i integer;
    v_gone bigint[];
    v_pid integer;
BEGIN
    -- The workers whose lease ended, locked until this transaction ends: a heartbeat that
    -- comes now waits, then finds its row gone. A row being written (a heartbeat under way)
    -- is skipped: that worker is alive.
    SELECT coalesce(array_agg(w.id), '{}') INTO v_gone
      FROM (SELECT w.id FROM postpone_workers w
             WHERE postpone_lease_end(w.last_heartbeat, w.stalled_after_ms, p_stalled_ms, 0) < now()
               AND w.id <> p_me
               FOR UPDATE SKIP LOCKED) w;
    -- A session still holding a transaction such a worker noted (a link gone half-open,
    -- which the server has not noticed) is ended, so that its jobs are free; a session
    -- this role may not end is left to the server's timeouts.
    IF cardinality(v_gone) > 0
       AND EXISTS (SELECT 1 FROM postpone_workers w
                    WHERE w.id = ANY(v_gone) AND w.claim_xids IS NOT NULL) THEN
        FOR v_pid IN
            SELECT a.pid
              FROM pg_stat_activity a
             WHERE a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
               AND a.backend_xid IN (SELECT x::xid
                                       FROM postpone_workers w, unnest(w.claim_xids) AS x
                                      WHERE w.id = ANY(v_gone))
        LOOP
            BEGIN
                PERFORM pg_terminate_backend(v_pid);
            EXCEPTION WHEN insufficient_privilege THEN
                NULL;
            END;
        END LOOP;
    END IF;
    -- Jobs such a worker lost with its claim's transaction (postpone_note_claim) are its
    -- running jobs: they get their attempt and are requeued with the others below. A row
    -- someone holds locked is left (when the note goes, it is claimable again).
    IF cardinality(v_gone) > 0
       AND EXISTS (SELECT 1 FROM postpone_workers w
                    WHERE w.id = ANY(v_gone) AND w.claim_xids IS NOT NULL) THEN
        UPDATE postpone_jobs j
           SET status = 'doing', worker_id = l.worker,
               attempts = least(j.attempts, 2147483646) + 1,
               claimed_at = now(), started_at = now()
          FROM (SELECT w.id AS worker, g.id
                  FROM postpone_workers w, unnest(w.claim_jobs) AS r,
                       generate_series(lower(r), upper(r) - 1) AS g(id)
                 WHERE w.id = ANY(v_gone) AND w.claim_xids IS NOT NULL
                   AND postpone_note_lost(w.claim_xids)) l
         WHERE j.id = l.id AND j.status = 'todo'
           AND j.id = ANY(ARRAY(
                   SELECT k.id FROM postpone_jobs k
                    WHERE k.id IN (SELECT g.id
                                     FROM postpone_workers w, unnest(w.claim_jobs) AS r,
                                          generate_series(lower(r), upper(r) - 1) AS g(id)
                                    WHERE w.id = ANY(v_gone) AND w.claim_xids IS NOT NULL
                                      AND postpone_note_lost(w.claim_xids))
                      AND k.status = 'todo'
                      FOR UPDATE SKIP LOCKED));
    END IF;
    WITH d AS (
        DELETE FROM postpone_workers WHERE id = ANY(v_gone)
        RETURNING id, name
    ), jobs AS (
        SELECT j.id, j.worker_id, j.attempts,
               format('worker %s (id %s) stopped sending heartbeats while running this job; requeued',
                      d.name, d.id) AS note
          FROM postpone_jobs j JOIN d ON j.worker_id = d.id
         WHERE j.status = 'doing'
        UNION ALL
        SELECT j.id, j.worker_id, j.attempts,
               format('worker id %s vanished while running this job; requeued', j.worker_id)
          FROM postpone_jobs j
         WHERE j.status = 'doing'
           -- No start time (written by hand) counts as long ago.
           AND coalesce(j.started_at, '-infinity') < now() - p_stalled_ms * interval '1 millisecond'
           AND NOT EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = j.worker_id)
           AND NOT EXISTS (SELECT 1 FROM d WHERE d.id = j.worker_id)
    )
    SELECT (SELECT count(*) FROM d),
           coalesce(array_agg(jobs.id ORDER BY jobs.id), '{}'),
           coalesce(array_agg(jobs.worker_id ORDER BY jobs.id), '{}'),
           coalesce(array_agg(jobs.attempts ORDER BY jobs.id), '{}'),
           coalesce(array_agg(jobs.note ORDER BY jobs.id), '{}')
      INTO v_dead, v_ids, v_workers, v_attempts, v_errors
      FROM jobs;
    BEGIN
        SELECT coalesce(array_agg(r.job_id), '{}'), coalesce(array_agg(r.outcome), '{}')
          INTO v_out_ids, v_outcomes
          FROM postpone_requeue(v_ids, v_workers, v_attempts, '{}', v_errors, '{}') r;
    EXCEPTION WHEN lock_not_available THEN
        -- A job another session holds: each job on its own, the held ones left for a
        -- later rescue (their worker row is gone: they are jobs of a vanished worker then).
        v_out_ids := '{}';
        v_outcomes := '{}';
        FOR i IN 1 .. coalesce(cardinality(v_ids), 0) LOOP
            BEGIN
                SELECT v_out_ids || coalesce(array_agg(r.job_id), '{}'),
                       v_outcomes || coalesce(array_agg(r.outcome), '{}')
                  INTO v_out_ids, v_outcomes
                  FROM postpone_requeue(ARRAY[v_ids[i]], ARRAY[v_workers[i]],
                                        ARRAY[v_attempts[i]], '{}', ARRAY[v_errors[i]],
                                        '{}') r;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END LOOP;
    END;
    RETURN QUERY SELECT v_dead, v_out_ids, v_outcomes;
END
$function$;
