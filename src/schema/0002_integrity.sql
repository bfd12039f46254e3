-- postpone schema, version 2: one way back to `todo`, fenced outcomes, rescue that one job
-- cannot fail, notifications that any queue name fits in.
--
-- Everything here is functions: no table changes, so a worker of version 1 still running
-- against this schema keeps working (its statements do not call these functions).

-- Wakes the workers of queue `q`. A payload must stay under 8000 bytes: a queue name too long
-- for it (only SQL written by hand can store one; `defer` refuses them) wakes every worker
-- with 'job:*' instead. A notification is only ever a hint to look at the table.
CREATE FUNCTION postpone_wake(q text) RETURNS void LANGUAGE sql AS $$
    SELECT pg_notify('postpone',
                     CASE WHEN octet_length(q) <= 1000 THEN 'job:' || q ELSE 'job:*' END)
$$;

CREATE OR REPLACE FUNCTION postpone_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT queue FROM postpone_new_jobs
             WHERE status = 'todo' AND scheduled_at <= now()
    LOOP
        PERFORM postpone_wake(q);
    END LOOP;
    RETURN NULL;
END
$$;

-- The one way back to `todo`. Every path that puts a job back in the queue calls it: a task's
-- retry and a shutdown's release (the completer), the rescue of a dead worker's jobs, a
-- retiring worker, the lost claims of a worker, and an operator's retry.
--
-- Arrays are aligned by position (a shorter array reads as NULLs):
--   p_ids        the jobs;
--   p_workers    when not NULL, the job must be `doing` under this worker ...
--   p_attempts   ... and at this attempt: the fence of the claim that ran it;
--   p_delays_us  when it is due again, in microseconds from now (at most 100 years); NULL:
--                due at once, keeping its scheduled time (a rescued or released job keeps
--                its place and the instant it was scheduled for);
--   p_errors     a text appended to the job's errors for this attempt, or NULL;
--   p_give_back  true when the attempt never ran: it is counted back.
-- Without p_admin a job must be `doing`. With p_admin (an operator's retry) it must have
-- finished as failed, cancelled or aborted; its attempts start from zero again and a pending
-- abort request is cleared (the operator asked for a new run).
--
-- A job whose abort was requested is not requeued: it ends `aborted` (abort requests survive
-- retry, release, rescue and shutdown).
--
-- A queueing-lock collision (another job of the same queueing lock already waits) means that
-- job already covers the work: a running job is then not requeued but ends `cancelled`, with
-- the reason and the id of the waiting job in its errors ('superseded'); an operator's retry
-- changes nothing ('collision').
--
-- A job that something else refuses (a trigger of the user's) is taken alone: it ends
-- `failed` with the reason in its errors ('failed'), or, if even that is refused, is left as
-- it was ('error: <reason>'). No job can make the others fail.
--
-- Returns (job_id, outcome) for every job it changed or refused, outcome one of 'todo',
-- 'aborted', 'superseded', 'collision', 'failed', 'error: ...'. A job that fails its guard (finished meanwhile, now
-- another worker's or another attempt's) is left alone and not returned. Wakes the workers of
-- every queue that got a job due now.
CREATE FUNCTION postpone_requeue(
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
                             WHEN j.abort_requested THEN 'aborted' ELSE 'todo' END,
               scheduled_at = CASE WHEN NOT p_admin AND j.abort_requested THEN j.scheduled_at
                                   WHEN p_admin THEN now()
                                   WHEN u.delay_us IS NULL THEN least(j.scheduled_at, now())
                                   ELSE now() + least(greatest(u.delay_us, 0), 3155760000000000)
                                                * interval '1 microsecond' END,
               attempts = CASE WHEN p_admin THEN 0
                               WHEN coalesce(u.give_back, false) THEN greatest(j.attempts - 1, 0)
                               ELSE j.attempts END,
               worker_id = CASE WHEN NOT p_admin AND j.abort_requested THEN j.worker_id END,
               started_at = CASE WHEN NOT p_admin AND j.abort_requested THEN j.started_at END,
               finished_at = CASE WHEN NOT p_admin AND j.abort_requested THEN now() END,
               abort_requested = CASE WHEN p_admin THEN false ELSE j.abort_requested END,
               errors = CASE
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
        RETURNING j.id, j.status, j.queue, j.scheduled_at
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
                                 WHEN j.abort_requested THEN 'aborted' ELSE 'todo' END,
                   scheduled_at = CASE WHEN NOT p_admin AND j.abort_requested THEN j.scheduled_at
                                       WHEN p_admin THEN now()
                                       WHEN r.delay_us IS NULL THEN least(j.scheduled_at, now())
                                       ELSE now() + least(greatest(r.delay_us, 0), 3155760000000000)
                                                    * interval '1 microsecond' END,
                   attempts = CASE WHEN p_admin THEN 0
                                   WHEN coalesce(r.give_back, false)
                                       THEN greatest(j.attempts - 1, 0)
                                   ELSE j.attempts END,
                   worker_id = CASE WHEN NOT p_admin AND j.abort_requested THEN j.worker_id END,
                   started_at = CASE WHEN NOT p_admin AND j.abort_requested THEN j.started_at END,
                   finished_at = CASE WHEN NOT p_admin AND j.abort_requested THEN now() END,
                   abort_requested = CASE WHEN p_admin THEN false ELSE j.abort_requested END,
                   errors = CASE
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
            RETURNING j.status INTO v_status;
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

-- Removes the workers whose heartbeat is older than `p_stalled_ms` (never `p_me`, the caller)
-- and requeues their running jobs through postpone_requeue, plus every running job whose
-- worker row has been gone for as long (claimed by a worker that was removed meanwhile).
-- Returns the number of workers removed and, for each job touched, its id and outcome.
CREATE FUNCTION postpone_rescue(p_stalled_ms bigint, p_me bigint)
RETURNS TABLE (dead bigint, ids bigint[], outcomes text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_dead bigint;
    v_ids bigint[];
    v_workers bigint[];
    v_attempts integer[];
    v_errors text[];
BEGIN
    WITH d AS (
        DELETE FROM postpone_workers
         WHERE last_heartbeat < now() - p_stalled_ms * interval '1 millisecond' AND id <> p_me
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
           AND j.started_at < now() - p_stalled_ms * interval '1 millisecond'
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
    RETURN QUERY
        SELECT v_dead, coalesce(array_agg(r.job_id), '{}'), coalesce(array_agg(r.outcome), '{}')
          FROM postpone_requeue(v_ids, v_workers, v_attempts, '{}', v_errors, '{}') r;
END
$$;

-- A worker stopping: requeues every job still `doing` under it (the attempts of
-- `p_never_started` are counted back), then deletes its row. Returns, for each job touched,
-- its id and outcome.
CREATE FUNCTION postpone_retire(p_worker bigint, p_never_started bigint[], p_note text)
RETURNS TABLE (job_id bigint, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
BEGIN
    SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_ids
      FROM postpone_jobs WHERE worker_id = p_worker AND status = 'doing';
    RETURN QUERY
        SELECT r.job_id, r.outcome
          FROM postpone_requeue(
                   v_ids,
                   array_fill(p_worker, ARRAY[cardinality(v_ids)]),
                   '{}',
                   '{}',
                   ARRAY(SELECT CASE WHEN i = ANY(p_never_started) THEN NULL ELSE p_note END
                           FROM unnest(v_ids) WITH ORDINALITY AS t(i, n) ORDER BY n),
                   ARRAY(SELECT i = ANY(p_never_started)
                           FROM unnest(v_ids) WITH ORDINALITY AS t(i, n) ORDER BY n)) r;
    DELETE FROM postpone_workers WHERE id = p_worker;
END
$$;
