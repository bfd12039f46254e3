-- postpone schema, version 11: jobs held back by their lock are parked out of the claim's way.
--
-- A job whose lock is held (its lock has a running job, or an earlier job still waiting)
-- stays in the due-jobs index, ahead of the jobs due after it, and every claim used to step
-- over it and look its lock up again. With 10,000 such jobs at the head of the queue a claim
-- looked up 10,000 locks before taking anything: 9,300 jobs/s instead of 26,000 on this
-- project's 2-core machine. Now the claim that finds such a job parks it: `blocked_by`
-- names the job it waits for, and the due-jobs indexes leave parked jobs out. Whatever
-- makes that job leave the queue (finished, cancelled, deleted) or go back from running to
-- waiting clears `blocked_by` in the same statement, and the next claim judges the job
-- again. A parked job keeps `status = 'todo'`: tools that read the table see what they
-- saw before. `blocked_by` is only a hint for the claim: the claim still checks every
-- job's lock itself, so a job wrongly left unparked costs a look, never a wrong start.
--
-- The same claim also stops walking jobs that are not due yet. Its index is in priority
-- order, then due time: a claim that found fewer due jobs than it asked for used to walk
-- every job scheduled for later, at every priority (3 ms for 50,000 of them, 60 for a
-- million, at each idle wake). It now takes one priority at a time, and finds the next
-- priority with one probe of the index: 0.6 ms with a million jobs for tomorrow.
--
-- Claims of queues with a concurrency, key or rate limit do not park (they skip held jobs
-- as before); a worker of version 10 or older, still running during the upgrade, calls
-- this very claim function.

ALTER TABLE postpone_jobs ADD COLUMN blocked_by bigint;

DROP INDEX postpone_jobs_due_idx;
DROP INDEX postpone_jobs_due_queue_idx;
CREATE INDEX postpone_jobs_due_idx ON postpone_jobs (priority DESC, scheduled_at, id)
    WHERE status = 'todo' AND blocked_by IS NULL;
CREATE INDEX postpone_jobs_due_queue_idx ON postpone_jobs (queue, priority DESC, scheduled_at, id)
    WHERE status = 'todo' AND blocked_by IS NULL;
-- The jobs parked behind a given job.
CREATE INDEX postpone_jobs_blocked_idx ON postpone_jobs (blocked_by)
    WHERE blocked_by IS NOT NULL;

-- A parked job that leaves `todo` any other way than by its blocker leaving (cancelled,
-- claimed by hand, ...) forgets whom it waited for: if it ever waits again, it is judged
-- again. Fires only for parked rows.
CREATE FUNCTION postpone_unpark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.blocked_by := NULL;
    RETURN NEW;
END
$$;
CREATE TRIGGER postpone_jobs_unpark BEFORE UPDATE ON postpone_jobs
    FOR EACH ROW WHEN (NEW.blocked_by IS NOT NULL AND NEW.status <> 'todo')
    EXECUTE FUNCTION postpone_unpark();

-- The statement trigger of version 10, which first unparks the jobs parked behind the jobs
-- the statement took out of the queue (or back from running to waiting).
CREATE OR REPLACE FUNCTION postpone_notify_done() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    ids text;
    left_ids bigint[];
BEGIN
    -- Jobs parked behind a job that left the queue (or went back from running to waiting)
    -- are free to be judged again. Nothing to read when no job is parked (an empty index).
    -- The unparking UPDATE fires this trigger again, with rows that stay 'todo': nothing to
    -- unpark then, so it ends there.
    IF EXISTS (SELECT 1 FROM postpone_jobs b WHERE b.blocked_by IS NOT NULL) THEN
        IF TG_OP = 'UPDATE' THEN
            left_ids := ARRAY(
                SELECT o.id FROM postpone_done_old o JOIN postpone_done_new n ON n.id = o.id
                 WHERE o.lock IS NOT NULL
                   AND ((o.status IN ('todo', 'doing') AND n.status NOT IN ('todo', 'doing'))
                        OR (o.status = 'doing' AND n.status = 'todo')));
        ELSE
            left_ids := ARRAY(
                SELECT o.id FROM postpone_done_old o
                 WHERE o.lock IS NOT NULL AND o.status IN ('todo', 'doing'));
        END IF;
        IF cardinality(left_ids) > 0 THEN
            UPDATE postpone_jobs b SET blocked_by = NULL WHERE b.blocked_by = ANY(left_ids);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM postpone_waiters) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        SELECT string_agg(n.id::text, ',') INTO ids
          FROM postpone_done_new n JOIN postpone_done_old o ON o.id = n.id
         WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
           AND o.status IS DISTINCT FROM n.status
           AND EXISTS (SELECT 1 FROM postpone_waiters w WHERE w.job_id = n.id);
    ELSE
        SELECT string_agg(o.id::text, ',') INTO ids
          FROM postpone_done_old o
         WHERE o.status IN ('todo', 'doing')
           AND EXISTS (SELECT 1 FROM postpone_waiters w WHERE w.job_id = o.id);
    END IF;
    IF ids IS NOT NULL THEN
        PERFORM pg_notify('postpone_done', CASE WHEN length(ids) > 7000 THEN '*' ELSE ids END);
    END IF;
    RETURN NULL;
END
$$;


-- As in version 9, on the new indexes: parked jobs are left out (they are due already, and
-- wait for their blocker rather than for a time).
CREATE OR REPLACE FUNCTION postpone_next_due(p_queues text[]) RETURNS timestamptz
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
                  WHERE c.status = 'todo' AND c.blocked_by IS NULL ORDER BY c.queue LIMIT 1)
                UNION ALL
                SELECT (SELECT c.queue FROM postpone_jobs c
                         WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.queue > qs.name
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
              WHERE c.status = 'todo' AND c.blocked_by IS NULL ORDER BY c.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT c.priority FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.priority < ps.p
                     ORDER BY c.priority DESC LIMIT 1)
              FROM ps WHERE ps.p IS NOT NULL
        )
        SELECT min((SELECT c.scheduled_at FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.priority = ps.p AND c.scheduled_at > now()
                     ORDER BY c.priority DESC, c.scheduled_at LIMIT 1))
          INTO v_min
          FROM ps WHERE ps.p IS NOT NULL;
        RETURN CASE WHEN isfinite(v_min) THEN v_min END;
    END IF;

    FOREACH v_q IN ARRAY v_queues LOOP
        WITH RECURSIVE ps(p) AS (
            (SELECT c.priority FROM postpone_jobs c
              WHERE c.queue = v_q AND c.status = 'todo' AND c.blocked_by IS NULL
              ORDER BY c.queue, c.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT c.priority FROM postpone_jobs c
                     WHERE c.queue = v_q AND c.status = 'todo' AND c.blocked_by IS NULL AND c.priority < ps.p
                     ORDER BY c.queue, c.priority DESC LIMIT 1)
              FROM ps WHERE ps.p IS NOT NULL
        )
        SELECT min((SELECT c.scheduled_at FROM postpone_jobs c
                     WHERE c.queue = v_q AND c.status = 'todo' AND c.blocked_by IS NULL AND c.priority = ps.p
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


-- The claim of version 8, with parking (see above) for queues without limits.
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
    v_limited := EXISTS (SELECT 1 FROM postpone_queue_limits)
              OR EXISTS (SELECT 1 FROM postpone_key_limits)
              OR EXISTS (SELECT 1 FROM postpone_rate_limits);
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

    IF v_limited AND (EXISTS (SELECT 1 FROM postpone_queue_limits l WHERE l.queue = ANY(v_queues))
                      OR EXISTS (SELECT 1 FROM postpone_key_limits l WHERE l.queue = ANY(v_queues))
                      OR EXISTS (SELECT 1 FROM postpone_rate_limits l WHERE l.queue = ANY(v_queues)))
    THEN
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
                      extract(epoch FROM now() - j.scheduled_at)::float8 AS queue_wait
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
               c.abort_requested, c.scheduled_at, c.queue_wait
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
                RETURN QUERY
                UPDATE postpone_jobs j
                   SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
                       started_at = now()
                 WHERE j.id = ANY(v_free)
                   AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
                RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                          j.abort_requested, j.scheduled_at,
                          extract(epoch FROM now() - j.scheduled_at)::float8;
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_want := v_want - v_n;
            END IF;
            EXIT WHEN v_parked = 0 OR v_want <= 0 OR v_rounds >= 20;
            v_scan := greatest(v_want, least(v_scan * 2, 16384));
        END LOOP;
    END IF;
END
$$;

-- The insert trigger's function of version 9, which sends nothing when the inserting
-- transaction set `postpone.quiet_insert` (for itself only: set_config(.., true)). The
-- library does so for a job due now that its own statement commits, and sends the wake-up
-- right behind it, pipelined, in a transaction that writes nothing: PostgreSQL lets one
-- notifying transaction at a time through its commit, WAL flush included, so defers that
-- notify wait for each other's fsyncs, while a transaction that writes nothing has no
-- flush to wait for. pgbench on this project's machine, 4 clients each inserting a job:
-- 3,131 inserts/s when the insert notifies, 4,250 with the notification sent this way.
-- Anyone else's insert (SQL, postpone_defer, a defer inside the caller's transaction)
-- notifies as before.
CREATE OR REPLACE FUNCTION postpone_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    q text;
    v_now boolean;
    v_at timestamptz;
BEGIN
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
