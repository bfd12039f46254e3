-- postpone schema, version 42: a way back to the queue waits at most 200 ms for a row lock.
--
-- postpone_finish waits at most 200 ms for a job row another session holds (version 13), and
-- the worker sets such an outcome aside and tries it again. postpone_requeue (retries,
-- releases, snoozes, the rescue, the shutdown's retirement, the admin API's retry) had no
-- such bound: a retry whose job row an operator's open transaction held made the worker's
-- recording of outcomes wait until its io_timeout severed the connection, again at every
-- try, with every outcome after it (and the heartbeat, on the same connection) behind it.
-- It now waits at most 200 ms, and a lock it could not get is raised to the caller (the
-- worker sets that outcome aside, the admin API skips that job) instead of being taken, by
-- its handlers for a job the database refuses, as a reason to fail the job. Otherwise as in
-- version 25.
--
-- Every statement here can run again on a schema that has it.

CREATE OR REPLACE FUNCTION postpone_requeue(
    p_ids bigint[], p_workers bigint[], p_attempts integer[], p_delays_us bigint[],
    p_errors text[], p_give_back boolean[], p_admin boolean DEFAULT false)
RETURNS TABLE (job_id bigint, outcome text)
LANGUAGE plpgsql SET lock_timeout = '200ms' AS $$
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
    EXCEPTION WHEN lock_not_available THEN
        RAISE;
    WHEN OTHERS THEN
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
        EXCEPTION WHEN lock_not_available THEN
            RAISE;
        WHEN unique_violation THEN
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
            EXCEPTION WHEN lock_not_available THEN
                RAISE;
            WHEN OTHERS THEN
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

