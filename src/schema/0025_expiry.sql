-- postpone schema, version 25: jobs that expire.
--
-- A job deferred with an expiry (`expires_at`) that has not *started* by then never starts:
-- it ends `cancelled`, `expired` set, with an error saying it expired and when. A job that
-- started before its deadline runs to its end. The statuses stay as they were.
--
-- Where it is enforced:
--
-- * The claim never takes a job whose deadline has passed: its walks skip such jobs (a test
--   of a column of the row each walk reads anyway; NULL for jobs without an expiry, so the
--   claim of those costs what it did).
-- * postpone_expire ends waiting jobs past their deadline, at most `p_limit` of them per
--   call, found through postpone_jobs_expiry_idx, which holds only waiting jobs that have a
--   deadline (so it is empty when no job expires, and the call reads nothing). Workers call
--   it from their heartbeat thread, again at once while a call ends a full batch: a backlog
--   of expired jobs is ended in bounded batches, never a statement per job, never on the
--   claim's path. Until they are ended, expired jobs due before the live ones (the head of
--   the claim's order) are stepped over by every claim, a row at a time (about a
--   microsecond each, measured: benches/claim_expiry.sh); those due after them cost
--   nothing.
-- * A held job (claimed, not started: schema 20) knows its remaining time from the claim
--   (`expires_in`, seconds from the claim's now()); its worker ends it `expired` instead of
--   starting it once that has passed (postpone_finish's outcome 'expired', its attempt given
--   back). The database agrees: postpone_start does not write a start more than a second
--   (the time an outcome takes to arrive) past the deadline, and postpone_finish records
--   such an attempt as expired, its task's answer not kept.
-- * postpone_requeue (retries, snoozes, releases, rescues): a job whose next run would come
--   at or after its deadline expires instead of going back to the queue. An operator's
--   retry starts the job afresh: its deadline is dropped.
-- * A dependent (schema 23) that expires while it waits for its dependencies ends the same
--   way; its own dependents follow the rules for a cancelled dependency.
--
-- Only additions (two columns with constant defaults: no table rewrite), a partial index
-- that is empty until jobs with a deadline exist, and functions. The claim, take and
-- the five-argument claim functions gain a last column (`expires_in`): workers of earlier
-- versions name the columns they read, so they keep working, and skip expired jobs too.
-- Every statement can run again on a schema that has it.

ALTER TABLE postpone_jobs
    ADD COLUMN IF NOT EXISTS expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS expired boolean NOT NULL DEFAULT false;

-- The waiting jobs that have a deadline, earliest first: what postpone_expire reads.
CREATE INDEX IF NOT EXISTS postpone_jobs_expiry_idx ON postpone_jobs (expires_at)
    WHERE status = 'todo' AND expires_at IS NOT NULL;

-- The error text of an expired job: its deadline in UTC, and, for a retry or snooze, when
-- its next run would have been due.
CREATE OR REPLACE FUNCTION postpone_expiry_text(p_expires_at timestamptz, p_next timestamptz)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_next IS NULL
                THEN format('expired at %s: not started by its deadline',
                            coalesce(to_char(p_expires_at AT TIME ZONE 'UTC',
                                             'YYYY-MM-DD HH24:MI:SS.MS') || ' UTC', 'an unknown time'))
                ELSE format('expired: its next run, due at %s, would come after its deadline, %s; not run again',
                            to_char(p_next AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') || ' UTC',
                            coalesce(to_char(p_expires_at AT TIME ZONE 'UTC',
                                             'YYYY-MM-DD HH24:MI:SS.MS') || ' UTC', 'an unknown time'))
           END
$$;

-- Whether a job going back to the queue, due again `p_delay_us` from now (NULL: at once),
-- would be due at or after its deadline `p_expires_at` (NULL: none): it then expires.
CREATE OR REPLACE FUNCTION postpone_expires_by(p_expires_at timestamptz, p_delay_us bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p_expires_at <= now() + coalesce(least(greatest(p_delay_us, 0),
                                                           3155760000000000), 0)
                                            * interval '1 microsecond', false)
$$;

-- When a job going back to the queue `p_delay_us` from now is due (NULL: at once).
CREATE OR REPLACE FUNCTION postpone_next_run(p_delay_us bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now() + least(greatest(p_delay_us, 0), 3155760000000000) * interval '1 microsecond'
$$;

-- Whether a held job (no start written: `p_started_at` NULL) that its worker started
-- `p_ran_us` ago started more than a second past its deadline `p_expires_at`. The second
-- covers the time an outcome takes to reach the database (its worker checked the deadline
-- against a clock that runs ahead of the database's). False for a job without a deadline,
-- one whose start is already written, and one that never started.
CREATE OR REPLACE FUNCTION postpone_started_late(p_expires_at timestamptz,
                                                 p_started_at timestamptz, p_ran_us bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p_started_at IS NULL AND p_ran_us IS NOT NULL
                    AND now() - least(greatest(p_ran_us, 0), 3155760000000000)
                                * interval '1 microsecond'
                        > p_expires_at + interval '1 second', false)
$$;

-- Checks an expiry `p_expires_at` for a job due at `p_at` (NULL: now), for `p_who` (the
-- function named in the message): it must be a finite time after the job's due time.
CREATE OR REPLACE FUNCTION postpone_check_expiry(p_at timestamptz, p_expires_at timestamptz,
                                                 p_who text)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_expires_at IS NULL THEN
        RETURN;
    END IF;
    IF NOT isfinite(p_expires_at) THEN
        RAISE EXCEPTION '%: invalid expiry %: it must be a finite time (leave it out for a job that never expires)',
            p_who, p_expires_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_expires_at <= coalesce(p_at, now()) THEN
        RAISE EXCEPTION '%: invalid expiry %: it must come after the job''s scheduled time, %',
            p_who, p_expires_at, coalesce(p_at, now())
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'a job due at once needs an expiry in the future';
    END IF;
END
$$;

-- Ends up to `p_limit` waiting jobs whose deadline has passed, earliest deadline first from
-- `p_from` on (NULL: the earliest): `cancelled`, `expired` set, the error saying when they
-- expired. Rows other sessions hold locked (a claim walking them, another worker's call) are
-- skipped. Jobs they were parked behind, waits for them (postpone_wait) and their dependents
-- are settled by the table's triggers, as for any other cancel. Returns how many it ended
-- (`p_limit`: there may be more) and the latest deadline among them: the caller passes it
-- back as `p_from` while it works through a backlog, so that each call starts where the
-- last one stopped instead of stepping again over the index entries the earlier calls left
-- behind (they stay until a vacuum).
CREATE OR REPLACE FUNCTION postpone_expire(p_limit integer, p_from timestamptz)
RETURNS TABLE (ended integer, reached timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH x AS (
        SELECT j.ctid AS t
          FROM postpone_jobs j
         WHERE j.status = 'todo' AND j.expires_at IS NOT NULL AND j.expires_at <= now()
           AND j.expires_at >= coalesce(p_from, '-infinity')
         ORDER BY j.expires_at
         LIMIT greatest(p_limit, 0)
           FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE postpone_jobs j
           SET status = 'cancelled', finished_at = now(), expired = true,
               errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                   'attempt', j.attempts, 'at', now(),
                   'error', postpone_expiry_text(j.expires_at, NULL)))
          FROM x
         WHERE j.ctid = x.t AND j.status = 'todo'
        RETURNING j.expires_at
    )
    SELECT count(*)::integer, max(done.expires_at) FROM done;
END
$$;

-- The claim, as in version 20, with the jobs past their deadline skipped and each job's
-- remaining time returned (`expires_in`, seconds from now(); NULL: no deadline). Dropped
-- and created again, since the result gains a column.
DROP FUNCTION IF EXISTS postpone_claim_jobs(bigint, integer, text[], text[], integer);
DROP FUNCTION IF EXISTS postpone_claim_jobs(bigint, integer, text[], text[]);
DROP FUNCTION IF EXISTS postpone_take_at(bigint, tid[]);


CREATE FUNCTION postpone_take_at(p_worker bigint, p_tids tid[])
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8, max_attempts integer, expires_in float8)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
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
                   THEN extract(epoch FROM now() - j.scheduled_at)::float8 END,
              j.max_attempts,
              CASE WHEN isfinite(j.expires_at)
                   THEN extract(epoch FROM j.expires_at - now())::float8 END;
END
$$;

-- As in version 16, with the deadline (see above).
CREATE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[],
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

            IF cardinality(v_free) > 0 THEN
                RETURN QUERY SELECT * FROM postpone_take_at(p_worker, v_free_tids);
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_want := v_want - v_n;
            END IF;
            EXIT WHEN v_parked = 0 OR v_want <= 0 OR v_rounds >= 20;
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
                                    p_tasks text[], p_start integer)
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8, max_attempts integer, held boolean, expires_in float8)
LANGUAGE plpgsql
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_limited boolean;
    v_limit integer := p_limit;
BEGIN
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
        IF v_limit <= 0 THEN
            RETURN;
        END IF;
    END IF;
    PERFORM set_config('postpone.hold', CASE WHEN v_limited THEN 'off' ELSE 'on' END, true);
    RETURN QUERY
        SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock,
               c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, NOT v_limited,
               c.expires_in
          FROM postpone_claim_jobs(p_worker, v_limit, p_queues, p_tasks) c;
    PERFORM set_config('postpone.hold', 'off', true);
END
$$;

-- As in version 20, with outcome 'expired' (a held job its worker did not start: see the
-- header) and starts past the deadline recorded as expired.
CREATE OR REPLACE FUNCTION postpone_finish(p_ids bigint[], p_workers bigint[], p_attempts integer[],
                                p_outcomes text[], p_errors text[], p_outputs jsonb[],
                                p_ran_us bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_nestloop = off
SET enable_mergejoin = off
SET jit = off
SET lock_timeout = '200ms'
AS $$
BEGIN
    RETURN QUERY
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_workers, p_attempts, p_outcomes, p_errors, p_outputs,
                             p_ran_us)
            AS o(id, worker, attempt, outcome, error, output, ran_us)
    ), updated AS (
        UPDATE postpone_jobs j
           SET status = CASE WHEN j.abort_requested THEN 'aborted'
                             WHEN o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us)
                                 THEN 'cancelled'
                             WHEN j.cancel_requested AND o.outcome = 'aborted' THEN 'cancelled'
                             ELSE o.outcome END,
               finished_at = now(),
               started_at = CASE WHEN j.started_at IS NOT NULL OR o.ran_us IS NULL
                                 THEN j.started_at
                                 ELSE now() - least(greatest(o.ran_us, 0), 3155760000000000)
                                              * interval '1 microsecond' END,
               attempts = CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                               THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
               cancel_requested = false,
               expired = (NOT j.abort_requested AND (o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us))),
               output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                              AND NOT postpone_started_late(j.expires_at, j.started_at, o.ran_us)
                             THEN o.output ELSE j.output END,
               errors = CASE
                   WHEN (NOT j.abort_requested AND (o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us)))
                       THEN coalesce(j.errors, '[]'::jsonb)
                            || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                    ELSE jsonb_build_array(jsonb_build_object(
                                        'attempt', j.attempts, 'at', now(), 'error', o.error)) END
                            || jsonb_build_array(jsonb_build_object(
                                'attempt', CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                                THEN greatest(j.attempts - 1, 0)
                                                ELSE j.attempts END,
                                'at', now(),
                                'error', postpone_expiry_text(j.expires_at, NULL)
                                         || CASE WHEN o.outcome = 'expired' THEN ''
                                                 ELSE format(' (its worker started it %s later; what its task returned, %s, is not kept)',
                                                             (now() - least(greatest(o.ran_us, 0), 3155760000000000)
                                                                      * interval '1 microsecond') - j.expires_at,
                                                             CASE WHEN o.outcome = 'delete' THEN 'succeeded'
                                                                  ELSE o.outcome END) END))
                   WHEN o.error IS NULL AND NOT (j.abort_requested AND o.outcome <> 'aborted')
                       THEN j.errors
                   ELSE coalesce(j.errors, '[]'::jsonb)
                        || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                ELSE jsonb_build_array(jsonb_build_object(
                                    'attempt', CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                                    THEN greatest(j.attempts - 1, 0)
                                                    ELSE j.attempts END,
                                    'at', now(), 'error', o.error)) END
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

-- As in version 20, but a start past the deadline is not written (see the header).
CREATE OR REPLACE FUNCTION postpone_start(p_ids bigint[], p_workers bigint[], p_attempts integer[],
                               p_ran_us bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH s AS (
        SELECT * FROM unnest(p_ids, p_workers, p_attempts, p_ran_us)
            AS s(id, worker, attempt, ran_us)
    ), locked AS (
        SELECT j.ctid AS t, s.ran_us
          FROM postpone_jobs j JOIN s ON j.id = s.id
         WHERE j.id = ANY(p_ids)
           AND j.status = 'doing' AND j.started_at IS NULL
           AND j.worker_id IS NOT DISTINCT FROM s.worker
           AND j.attempts IS NOT DISTINCT FROM s.attempt
           AND NOT postpone_started_late(j.expires_at, NULL, s.ran_us)
           FOR NO KEY UPDATE OF j SKIP LOCKED
    )
    UPDATE postpone_jobs j
       SET started_at = now() - least(greatest(l.ran_us, 0), 3155760000000000)
                                * interval '1 microsecond'
      FROM locked l
     WHERE j.ctid = l.t
    RETURNING j.id;
END
$$;

-- As in version 2, with the deadline (see the header): a job whose next run would come at or
-- after its deadline ends cancelled and expired (outcome 'expired'); an operator's retry drops
-- the deadline.
CREATE OR REPLACE FUNCTION postpone_requeue(
    p_ids bigint[], p_workers bigint[], p_attempts integer[], p_delays_us bigint[],
    p_errors text[], p_give_back boolean[], p_admin boolean DEFAULT false)
RETURNS TABLE (job_id bigint, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_outcomes text[];
    v_queues text[] := '{}';
    v_status text;
    v_other bigint;
    v_error text;
    v_one_by_one boolean := false;
    r record;
    q text;
BEGIN
    -- Jobs without a queueing lock cannot collide: one statement for all of them, unless
    -- something else refuses one of them (a trigger of the user's, say): then every job is
    -- taken one at a time below, each in a block of its own.
    BEGIN
    WITH u AS (
        SELECT * FROM unnest(p_ids, p_workers, p_attempts, p_delays_us, p_errors, p_give_back)
            AS u(id, worker, attempt, delay_us, error, give_back)
    ), upd AS (
        UPDATE postpone_jobs j
           SET status = CASE WHEN p_admin THEN 'todo'
                             WHEN j.abort_requested THEN 'aborted'
                             WHEN (NOT p_admin AND NOT j.abort_requested AND postpone_expires_by(j.expires_at, u.delay_us)) THEN 'cancelled' ELSE 'todo' END,
               scheduled_at = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, u.delay_us)) THEN j.scheduled_at
                                   WHEN p_admin THEN now()
                                   WHEN u.delay_us IS NULL THEN least(j.scheduled_at, now())
                                   ELSE now() + least(greatest(u.delay_us, 0), 3155760000000000)
                                                * interval '1 microsecond' END,
               attempts = CASE WHEN p_admin THEN 0
                               WHEN coalesce(u.give_back, false) THEN greatest(j.attempts - 1, 0)
                               ELSE j.attempts END,
               worker_id = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, u.delay_us)) THEN j.worker_id END,
               started_at = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, u.delay_us)) THEN j.started_at END,
               finished_at = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, u.delay_us)) THEN now() END,
               expired = (NOT p_admin AND NOT j.abort_requested AND postpone_expires_by(j.expires_at, u.delay_us)),
               expires_at = CASE WHEN p_admin THEN NULL ELSE j.expires_at END,
               abort_requested = CASE WHEN p_admin THEN false ELSE j.abort_requested END,
               errors = CASE
                   WHEN (NOT p_admin AND NOT j.abort_requested AND postpone_expires_by(j.expires_at, u.delay_us))
                       THEN coalesce(j.errors, '[]'::jsonb)
                            || CASE WHEN u.error IS NULL THEN '[]'::jsonb
                                    ELSE jsonb_build_array(jsonb_build_object(
                                        'attempt', j.attempts, 'at', now(), 'error', u.error)) END
                            || jsonb_build_array(jsonb_build_object(
                                'attempt', j.attempts, 'at', now(),
                                'error', postpone_expiry_text(j.expires_at, postpone_next_run(u.delay_us))))
                   WHEN u.error IS NULL AND (p_admin OR NOT j.abort_requested) THEN j.errors
                   ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                       'attempt', j.attempts, 'at', now(),
                       'error', CASE WHEN NOT p_admin AND j.abort_requested
                                     THEN coalesce(u.error || '; ', '')
                                          || 'aborted on request: not run again'
                                     ELSE u.error END)) END
          FROM u
         WHERE j.id = u.id
           AND j.queueing_lock IS NULL
           AND CASE WHEN p_admin THEN j.status IN ('failed', 'cancelled', 'aborted')
                    ELSE j.status IS NOT DISTINCT FROM 'doing' END
           AND (u.worker IS NULL OR j.worker_id IS NOT DISTINCT FROM u.worker)
           AND (u.attempt IS NULL OR j.attempts IS NOT DISTINCT FROM u.attempt)
        RETURNING j.id, CASE WHEN j.expired THEN 'expired' ELSE j.status END AS status, j.queue,
                  j.scheduled_at
    )
    SELECT coalesce(array_agg(upd.id), '{}'), coalesce(array_agg(upd.status), '{}'),
           coalesce(array_agg(DISTINCT upd.queue)
                        FILTER (WHERE upd.status = 'todo' AND upd.scheduled_at <= now()), '{}')
      INTO v_ids, v_outcomes, v_queues
      FROM upd;
    EXCEPTION WHEN OTHERS THEN
        v_one_by_one := true;
        v_ids := '{}';
        v_outcomes := '{}';
        v_queues := '{}';
    END;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_outcomes);

    -- Jobs with a queueing lock (or all of them, see above): one at a time, each in a block
    -- of its own, so that a collision or a refusal is caught for that job alone.
    FOR r IN
        SELECT u.id, u.worker, u.attempt, u.delay_us, u.error, u.give_back, j.queueing_lock
          FROM unnest(p_ids, p_workers, p_attempts, p_delays_us, p_errors, p_give_back)
               AS u(id, worker, attempt, delay_us, error, give_back)
          JOIN postpone_jobs j ON j.id = u.id
         WHERE j.queueing_lock IS NOT NULL OR v_one_by_one
         ORDER BY u.id
    LOOP
        BEGIN
            UPDATE postpone_jobs j
               SET status = CASE WHEN p_admin THEN 'todo'
                                 WHEN j.abort_requested THEN 'aborted'
                             WHEN (NOT p_admin AND NOT j.abort_requested AND postpone_expires_by(j.expires_at, r.delay_us)) THEN 'cancelled' ELSE 'todo' END,
                   scheduled_at = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, r.delay_us)) THEN j.scheduled_at
                                       WHEN p_admin THEN now()
                                       WHEN r.delay_us IS NULL THEN least(j.scheduled_at, now())
                                       ELSE now() + least(greatest(r.delay_us, 0), 3155760000000000)
                                                    * interval '1 microsecond' END,
                   attempts = CASE WHEN p_admin THEN 0
                                   WHEN coalesce(r.give_back, false)
                                       THEN greatest(j.attempts - 1, 0)
                                   ELSE j.attempts END,
                   worker_id = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, r.delay_us)) THEN j.worker_id END,
                   started_at = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, r.delay_us)) THEN j.started_at END,
                   finished_at = CASE WHEN NOT p_admin
                                        AND (j.abort_requested OR postpone_expires_by(j.expires_at, r.delay_us)) THEN now() END,
                   expired = (NOT p_admin AND NOT j.abort_requested AND postpone_expires_by(j.expires_at, r.delay_us)),
                   expires_at = CASE WHEN p_admin THEN NULL ELSE j.expires_at END,
                   abort_requested = CASE WHEN p_admin THEN false ELSE j.abort_requested END,
                   errors = CASE
                       WHEN (NOT p_admin AND NOT j.abort_requested AND postpone_expires_by(j.expires_at, r.delay_us))
                       THEN coalesce(j.errors, '[]'::jsonb)
                            || CASE WHEN r.error IS NULL THEN '[]'::jsonb
                                    ELSE jsonb_build_array(jsonb_build_object(
                                        'attempt', j.attempts, 'at', now(), 'error', r.error)) END
                            || jsonb_build_array(jsonb_build_object(
                                'attempt', j.attempts, 'at', now(),
                                'error', postpone_expiry_text(j.expires_at, postpone_next_run(r.delay_us))))
                   WHEN r.error IS NULL AND (p_admin OR NOT j.abort_requested) THEN j.errors
                       ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                           'attempt', j.attempts, 'at', now(),
                           'error', CASE WHEN NOT p_admin AND j.abort_requested
                                         THEN coalesce(r.error || '; ', '')
                                              || 'aborted on request: not run again'
                                         ELSE r.error END)) END
             WHERE j.id = r.id
               AND CASE WHEN p_admin THEN j.status IN ('failed', 'cancelled', 'aborted')
                        ELSE j.status IS NOT DISTINCT FROM 'doing' END
               AND (r.worker IS NULL OR j.worker_id IS NOT DISTINCT FROM r.worker)
               AND (r.attempt IS NULL OR j.attempts IS NOT DISTINCT FROM r.attempt)
            RETURNING CASE WHEN j.expired THEN 'expired' ELSE j.status END INTO v_status;
            IF FOUND THEN
                job_id := r.id;
                outcome := v_status;
                RETURN NEXT;
                IF v_status = 'todo' AND coalesce(r.delay_us, 0) <= 0 THEN
                    v_queues := v_queues || (SELECT queue FROM postpone_jobs WHERE id = r.id);
                END IF;
            END IF;
        EXCEPTION WHEN unique_violation THEN
            SELECT o.id INTO v_other FROM postpone_jobs o
             WHERE o.queueing_lock = r.queueing_lock AND o.status = 'todo' AND o.id <> r.id
             LIMIT 1;
            IF p_admin THEN
                job_id := r.id;
                outcome := 'collision';
                RETURN NEXT;
            ELSE
                UPDATE postpone_jobs j
                   SET status = 'cancelled', finished_at = now(),
                       errors = coalesce(j.errors, '[]'::jsonb)
                           || CASE WHEN r.error IS NULL THEN '[]'::jsonb
                                   ELSE jsonb_build_array(jsonb_build_object(
                                       'attempt', j.attempts, 'at', now(), 'error', r.error)) END
                           || jsonb_build_array(jsonb_build_object(
                               'attempt', j.attempts, 'at', now(),
                               'error', format('not requeued: job %s already waits with the same queueing lock and does this work',
                                               coalesce(v_other::text, '(unknown)'))))
                 WHERE j.id = r.id AND j.status IS NOT DISTINCT FROM 'doing'
                   AND (r.worker IS NULL OR j.worker_id IS NOT DISTINCT FROM r.worker)
                   AND (r.attempt IS NULL OR j.attempts IS NOT DISTINCT FROM r.attempt);
                IF FOUND THEN
                    job_id := r.id;
                    outcome := 'superseded';
                    RETURN NEXT;
                END IF;
            END IF;
        WHEN OTHERS THEN
            -- Refused for a reason of its own: at worst the job fails, with the reason.
            GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT;
            BEGIN
                UPDATE postpone_jobs j
                   SET status = 'failed', finished_at = now(),
                       errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(
                           jsonb_build_object('attempt', j.attempts, 'at', now(),
                               'error', 'could not be put back in the queue: ' || v_error))
                 WHERE j.id = r.id
                   AND j.status IS NOT DISTINCT FROM 'doing'
                   AND (r.worker IS NULL OR j.worker_id IS NOT DISTINCT FROM r.worker)
                   AND (r.attempt IS NULL OR j.attempts IS NOT DISTINCT FROM r.attempt);
                IF FOUND THEN
                    job_id := r.id;
                    outcome := 'failed';
                    RETURN NEXT;
                ELSIF p_admin THEN
                    job_id := r.id;
                    outcome := 'error: ' || v_error;
                    RETURN NEXT;
                END IF;
            EXCEPTION WHEN OTHERS THEN
                job_id := r.id;
                outcome := 'error: ' || v_error;
                RETURN NEXT;
            END;
        END;
    END LOOP;

    FOR q IN SELECT DISTINCT x FROM unnest(v_queues) AS x LOOP
        PERFORM postpone_wake(q);
    END LOOP;
END
$$;

-- As in version 23, with each job's expiry (`p_expires_at`, NULL: none; checked by
-- postpone_check_expiry). The function of version 23 stays for workers of that version.
CREATE OR REPLACE FUNCTION postpone_defer_jobs(
    p_queue text[], p_task text[], p_args jsonb[], p_priority integer[], p_lock text[],
    p_queueing_lock text[], p_at timestamptz[], p_max_attempts integer[], p_tags jsonb[],
    p_meta jsonb[], p_edge_job integer[], p_edge_dep bigint[], p_edge_any boolean[],
    p_expires_at timestamptz[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_task), 0);
    v_deps bigint[];
    v_found bigint[];
    v_status text[];
    v_missing bigint;
    v_ids bigint[];
    v_has boolean[];
    v_pending integer[];
    v_bad bigint[];
    v_bad_status text[];
BEGIN
    PERFORM postpone_check_expiry(x.at, x.exp, 'postpone_defer_jobs')
       FROM unnest(p_at, p_expires_at) AS x(at, exp)
      WHERE x.exp IS NOT NULL;
    IF EXISTS (SELECT 1 FROM unnest(p_edge_job, p_edge_dep) AS e(j, d)
                WHERE e.j IS NULL OR e.j < 1 OR e.j > v_n OR e.d IS NULL) THEN
        RAISE EXCEPTION 'postpone_defer_jobs: every dependency needs the position of its job (1 to %) and a job id', v_n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The dependencies, locked in id order (so two defers naming the same jobs never wait
    -- for each other in a circle); a finish under way is waited for, and seen.
    v_deps := ARRAY(SELECT DISTINCT d FROM unnest(p_edge_dep) AS d ORDER BY 1);
    SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}'),
           coalesce(array_agg(x.status ORDER BY x.id), '{}')
      INTO v_found, v_status
      FROM (SELECT j.id, j.status FROM postpone_jobs j
             WHERE j.id = ANY(v_deps) ORDER BY j.id FOR NO KEY UPDATE) x;
    SELECT min(d) INTO v_missing FROM unnest(v_deps) AS d WHERE d <> ALL(v_found);
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'job % does not exist (it was never deferred, or it was deleted): a job can only run after jobs that exist', v_missing
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'postpone_deps_dependency',
                  HINT = 'name only ids returned by a defer, before retention or DeleteJobs removes them';
    END IF;
    -- The ones not finished will tell their dependents when they are.
    UPDATE postpone_jobs j SET has_dependents = true
     WHERE j.id = ANY(v_found) AND j.status IN ('todo', 'doing') AND NOT j.has_dependents;

    -- What each job's dependencies already say: how many have not finished, and the first
    -- `after` dependency that ended badly.
    WITH e AS (
        SELECT e.j, e.d, bool_and(coalesce(e.a, false)) AS any_outcome
          FROM unnest(p_edge_job, p_edge_dep, p_edge_any) AS e(j, d, a)
         GROUP BY e.j, e.d
    ), s AS (
        SELECT e.j, e.d, f.status, f.status IN ('todo', 'doing') AS pending,
               NOT e.any_outcome AND f.status IN ('failed', 'cancelled', 'aborted') AS bad
          FROM e JOIN unnest(v_found, v_status) AS f(id, status) ON f.id = e.d
    ), per AS (
        SELECT s.j, count(*) FILTER (WHERE s.pending)::integer AS pending,
               (array_agg(s.d ORDER BY s.d) FILTER (WHERE s.bad))[1] AS bad,
               (array_agg(s.status ORDER BY s.d) FILTER (WHERE s.bad))[1] AS bad_status
          FROM s GROUP BY s.j
    )
    SELECT array_agg(per.j IS NOT NULL ORDER BY g.n),
           array_agg(coalesce(per.pending, 0) ORDER BY g.n),
           array_agg(per.bad ORDER BY g.n),
           array_agg(per.bad_status ORDER BY g.n)
      INTO v_has, v_pending, v_bad, v_bad_status
      FROM generate_series(1, v_n) AS g(n) LEFT JOIN per ON per.j = g.n;

    WITH ins AS (
        INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock,
                                   scheduled_at, max_attempts, tags, meta, status,
                                   finished_at, errors, has_dependencies, expires_at)
        SELECT u.queue, u.task, coalesce(u.args, 'null'::jsonb), coalesce(u.priority, 0),
               u.lock, u.queueing_lock,
               CASE WHEN v_bad[u.n] IS NULL AND v_pending[u.n] > 0 THEN 'infinity'::timestamptz
                    ELSE coalesce(u.at, now()) END,
               u.max_attempts,
               CASE WHEN u.tags IS NOT NULL
                    THEN ARRAY(SELECT jsonb_array_elements_text(u.tags)) END,
               u.meta,
               CASE WHEN v_bad[u.n] IS NULL THEN 'todo' ELSE 'cancelled' END,
               CASE WHEN v_bad[u.n] IS NOT NULL THEN now() END,
               CASE WHEN v_bad[u.n] IS NOT NULL THEN jsonb_build_array(jsonb_build_object(
                   'attempt', 0, 'at', now(),
                   'error', format('not run: job %s, which it was to run after, had ended %s when it was deferred',
                                   v_bad[u.n], v_bad_status[u.n]))) END,
               v_has[u.n], u.expires_at
          FROM unnest(p_queue, p_task, p_args, p_priority, p_lock, p_queueing_lock, p_at,
                      p_max_attempts, p_tags, p_meta, p_expires_at)
               WITH ORDINALITY AS u(queue, task, args, priority, lock, queueing_lock, at,
                                    max_attempts, tags, meta, expires_at, n)
         ORDER BY u.n
        RETURNING id
    )
    -- Ids are drawn in insertion order: the k-th smallest is the k-th job's.
    SELECT array_agg(ins.id ORDER BY ins.id) INTO v_ids FROM ins;

    INSERT INTO postpone_deps (job_id, dep_id, any_outcome, outcome)
    SELECT v_ids[e.j], e.d, bool_and(coalesce(e.a, false)),
           CASE WHEN f.status NOT IN ('todo', 'doing') THEN f.status END
      FROM unnest(p_edge_job, p_edge_dep, p_edge_any) AS e(j, d, a)
      JOIN unnest(v_found, v_status) AS f(id, status) ON f.id = e.d
     GROUP BY e.j, e.d, f.status;

    INSERT INTO postpone_deps_waiting (job_id, pending, due_at)
    SELECT v_ids[g.n], v_pending[g.n], coalesce(p_at[g.n], now())
      FROM generate_series(1, v_n) AS g(n)
     WHERE v_bad[g.n] IS NULL AND v_pending[g.n] > 0;

    RETURN QUERY SELECT x FROM unnest(v_ids) AS x;
END
$$;

-- postpone_defer of version 23, with an expiry: `expires_in` (an interval from now) or
-- `expires_at` (a time), at most one of them, after the job's scheduled time:
--   SELECT postpone_defer('send_code', '{"to": "a@b.c"}', expires_in => interval '10 minutes');
-- The signature of version 23 goes (a second one with defaults would make every call
-- ambiguous); every call written for it, by position or by name, reaches this one.
DROP FUNCTION IF EXISTS postpone_defer(text, jsonb, text, integer, text, text, timestamptz,
                                       interval, bigint[], bigint[]);
CREATE OR REPLACE FUNCTION postpone_defer(
    task           text,
    args           jsonb       DEFAULT 'null',
    queue          text        DEFAULT 'default',
    priority       integer     DEFAULT 0,
    lock           text        DEFAULT NULL,
    queueing_lock  text        DEFAULT NULL,
    scheduled_at   timestamptz DEFAULT NULL,
    schedule_in    interval    DEFAULT NULL,
    after          bigint[]    DEFAULT NULL,
    after_finished bigint[]    DEFAULT NULL,
    expires_in     interval    DEFAULT NULL,
    expires_at     timestamptz DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
    v_at timestamptz;
    v_exp timestamptz;
    v_deps bigint[];
    v_any boolean[];
BEGIN
    IF postpone_defer.task IS NULL OR btrim(postpone_defer.task) = '' THEN
        RAISE EXCEPTION 'postpone_defer: the task name must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF postpone_defer.queue IS NULL OR btrim(postpone_defer.queue) = '' THEN
        RAISE EXCEPTION 'postpone_defer: the queue name must not be empty (leave it out for the default queue)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF postpone_defer.lock = '' OR postpone_defer.queueing_lock = '' THEN
        RAISE EXCEPTION 'postpone_defer: a lock or queueing lock must not be empty (leave it out instead)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(postpone_defer.after, NULL) IS NOT NULL
       OR array_position(postpone_defer.after_finished, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'postpone_defer: after and after_finished must not hold NULL (job ids only)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF postpone_defer.expires_in IS NOT NULL AND postpone_defer.expires_at IS NOT NULL THEN
        RAISE EXCEPTION 'postpone_defer: give expires_in or expires_at, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF postpone_defer.expires_in <= interval '0' THEN
        RAISE EXCEPTION 'postpone_defer: invalid expires_in %: it must be positive', postpone_defer.expires_in
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_at := coalesce(postpone_defer.scheduled_at,
                     now() + coalesce(postpone_defer.schedule_in, interval '0'));
    BEGIN
        v_exp := coalesce(postpone_defer.expires_at, now() + postpone_defer.expires_in);
    EXCEPTION WHEN datetime_field_overflow OR interval_field_overflow THEN
        RAISE EXCEPTION 'postpone_defer: invalid expires_in %: past what a timestamp can hold', postpone_defer.expires_in
            USING ERRCODE = 'invalid_parameter_value';
    END;
    PERFORM postpone_check_expiry(v_at, v_exp, 'postpone_defer');
    IF coalesce(cardinality(postpone_defer.after), 0) = 0
       AND coalesce(cardinality(postpone_defer.after_finished), 0) = 0 THEN
        INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at,
                                   expires_at)
        VALUES (postpone_defer.queue, postpone_defer.task,
                coalesce(postpone_defer.args, 'null'::jsonb),
                coalesce(postpone_defer.priority, 0),
                postpone_defer.lock, postpone_defer.queueing_lock, v_at, v_exp)
        RETURNING id INTO new_id;
        RETURN new_id;
    END IF;
    v_deps := coalesce(postpone_defer.after, '{}') || coalesce(postpone_defer.after_finished, '{}');
    v_any := array_fill(false, ARRAY[coalesce(cardinality(postpone_defer.after), 0)])
             || array_fill(true, ARRAY[coalesce(cardinality(postpone_defer.after_finished), 0)]);
    SELECT x INTO new_id
      FROM postpone_defer_jobs(
               ARRAY[postpone_defer.queue], ARRAY[postpone_defer.task],
               ARRAY[coalesce(postpone_defer.args, 'null'::jsonb)],
               ARRAY[coalesce(postpone_defer.priority, 0)],
               ARRAY[postpone_defer.lock], ARRAY[postpone_defer.queueing_lock], ARRAY[v_at],
               ARRAY[NULL::integer], ARRAY[NULL::jsonb], ARRAY[NULL::jsonb],
               array_fill(1, ARRAY[cardinality(v_deps)]), v_deps, v_any, ARRAY[v_exp]) AS x;
    RETURN new_id;
END
$$;
