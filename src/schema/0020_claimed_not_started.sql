-- postpone schema, version 20: a claimed job is not a started job.
--
-- A worker claims jobs ahead of its free threads (the prefetch that makes drains fast). Until
-- this version a claim wrote `started_at` and counted the attempt at once, so a job waiting
-- in a busy worker's memory looked running to every view, and no pause, cancel or other
-- worker could reach it. Now:
--
-- * A job claimed by a worker of this version is *held*: `status = 'doing'` under the
--   worker, `attempts` counted (the fence of the attempt, as before), but `started_at` stays
--   NULL and `claimed_at` says when it was claimed. Every view shows a held job as waiting.
--   The worker writes `started_at` when the job really starts (postpone_start, for a job
--   still running a few milliseconds after its start, or with its outcome, postpone_finish's
--   `p_ran_us`). A held job that goes back to the queue unstarted gets its attempt back.
-- * postpone_claim_jobs with a fifth argument (`p_start`, the worker's free threads) holds
--   the jobs it takes; in queues with a concurrency, per-key or rate limit it takes at most
--   `p_start` jobs and starts them at once (a held job would count against the limit while
--   another worker's thread could run it). Workers of older versions call the four-argument
--   function, unchanged: their jobs start at claim, as before.
-- * Claims take a shared advisory lock that postpone_pause takes exclusively: once a pause
--   has committed, no claim that began before it is still running, and every later claim
--   reads it.
-- * `cancel_requested`: an operator cancelled a held job. The worker holding it ends it
--   `cancelled` without running it; the flag survives a give-back (the next holder honours
--   it) and is cleared with any final status.
-- * The rescue of a dead worker's jobs is unchanged: a job it held may have started (a
--   start is written a few milliseconds late), so its attempt stays counted; a job that
--   kills its worker at once still runs out of attempts.

ALTER TABLE postpone_jobs
    ADD COLUMN IF NOT EXISTS claimed_at timestamptz,
    ADD COLUMN IF NOT EXISTS cancel_requested boolean NOT NULL DEFAULT false;

-- The control poll of a worker (abort and cancel requests of the jobs it holds) reads this
-- index; the poll of older workers (abort requests only) can read it too.
CREATE INDEX postpone_jobs_control_idx ON postpone_jobs (worker_id)
    WHERE status = 'doing' AND (abort_requested OR cancel_requested);
DROP INDEX postpone_jobs_abort_idx;

-- The claim's last step, as in version 16, except that inside a claim of this version (the
-- transaction-local setting postpone.hold is 'on') the jobs are held rather than started.
CREATE OR REPLACE FUNCTION postpone_take_at(p_worker bigint, p_tids tid[])
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
              j.max_attempts;
END
$$;

-- A claim that holds what it takes (see the header). `held` is true for every job returned
-- unless the claim went through a limited queue (then every job returned has started).
CREATE FUNCTION postpone_claim_jobs(p_worker bigint, p_limit integer, p_queues text[],
                                    p_tasks text[], p_start integer)
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8, max_attempts integer, held boolean)
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
               c.abort_requested, c.scheduled_at, c.queue_wait, c.max_attempts, NOT v_limited
          FROM postpone_claim_jobs(p_worker, v_limit, p_queues, p_tasks) c;
    PERFORM set_config('postpone.hold', 'off', true);
END
$$;

-- Records final outcomes, as the six-argument function of version 12 (which stays for older
-- workers), and also: `p_ran_us`, how long each attempt ran (NULL: it never started), which
-- writes the start of a held job that started and gives its attempt back to one that never
-- did; a held job whose cancel was requested ends `cancelled` rather than `aborted`; every
-- final status clears `cancel_requested`.
CREATE FUNCTION postpone_finish(p_ids bigint[], p_workers bigint[], p_attempts integer[],
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
               output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                             THEN o.output ELSE j.output END,
               errors = CASE
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

-- Writes the start of held jobs that started on their worker (`p_ran_us` ago): each only
-- for its own attempt, and only once. A row another session holds locked is skipped (the
-- start is then written with the job's outcome). Returns the ids written.
CREATE FUNCTION postpone_start(p_ids bigint[], p_workers bigint[], p_attempts integer[],
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

-- Pauses queue `p_queue` (NULL: every queue) and tells the workers (`pause:<queue>`, a hint:
-- they read the table). Waits for the claims running now to commit, and no claim begins
-- before this transaction ends, so every later claim reads the pause. Returns the pause
-- time, or no row when the queue was already paused.
CREATE FUNCTION postpone_pause(p_queue text)
RETURNS TABLE (paused_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(1886352245, 0);
    PERFORM pg_notify('postpone', 'pause:' || CASE WHEN p_queue IS NULL THEN '*'
                                                  WHEN octet_length(p_queue) <= 1000 THEN p_queue
                                                  ELSE '*' END);
    RETURN QUERY
        INSERT INTO postpone_paused_queues (queue) VALUES (p_queue)
        ON CONFLICT DO NOTHING
        RETURNING paused_at;
END
$$;
