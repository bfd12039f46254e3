-- postpone schema, version 44: one held job cannot stop the rescue of the others.
--
-- postpone_rescue (version 22) removes the dead workers and requeues all their running jobs
-- in one statement. Since version 42 postpone_requeue gives up a row lock after 200 ms, and
-- one job held by another session (an operator's open transaction) failed the rescue of
-- every dead worker, at every try for as long as it was held (before, the rescue waited for
-- it until the worker's io_timeout). The jobs are now requeued one at a time when that
-- happens, each in a block of its own; a held one is left for a later rescue, which finds it
-- as a job of a vanished worker. Otherwise as in version 22.
--
-- Every statement here can run again on a schema that has it.

CREATE OR REPLACE FUNCTION postpone_rescue(p_stalled_ms bigint, p_me bigint)
RETURNS TABLE (dead bigint, ids bigint[], outcomes text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_dead bigint;
    v_ids bigint[];
    v_workers bigint[];
    v_attempts integer[];
    v_errors text[];
    v_out_ids bigint[] := '{}';
    v_outcomes text[] := '{}';
    i integer;
BEGIN
    WITH d AS (
        DELETE FROM postpone_workers
         WHERE postpone_lease_end(last_heartbeat, stalled_after_ms, p_stalled_ms, 0) < now()
           AND id <> p_me
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
$$;
