-- The statement a worker of version 11 sent to record final outcomes (its JOB_FINISH_BATCH,
-- src/store.rs at 3348bf7), kept here to show that schema 12 still takes it.
WITH o AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::text[],
                         $6::jsonb[])
        AS o(id, worker, attempt, outcome, error, output)
), updated AS (
    UPDATE postpone_jobs j
       SET status = CASE WHEN j.abort_requested THEN 'aborted' ELSE o.outcome END,
           finished_at = now(),
           output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                         THEN o.output ELSE j.output END,
           errors = CASE
               WHEN o.error IS NULL AND NOT (j.abort_requested AND o.outcome <> 'aborted')
                   THEN j.errors
               ELSE coalesce(j.errors, '[]'::jsonb)
                    || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                            ELSE jsonb_build_array(jsonb_build_object(
                                'attempt', j.attempts, 'at', now(), 'error', o.error)) END
                    || CASE WHEN j.abort_requested AND o.outcome <> 'aborted'
                            THEN jsonb_build_array(jsonb_build_object(
                                'attempt', j.attempts, 'at', now(),
                                'error', format('aborted on request while it ran (its task ended %s before the worker saw the request)',
                                                CASE WHEN o.outcome = 'delete' THEN 'succeeded'
                                                     ELSE o.outcome END)))
                            ELSE '[]'::jsonb END END
      FROM o
     WHERE j.id = o.id
       AND (o.outcome <> 'delete' OR j.abort_requested IS NOT DISTINCT FROM true)
       AND j.status IS NOT DISTINCT FROM 'doing'
       AND j.worker_id IS NOT DISTINCT FROM o.worker
       AND j.attempts IS NOT DISTINCT FROM o.attempt
    RETURNING j.id
), deleted AS (
    DELETE FROM postpone_jobs j
     USING o
     WHERE j.id = o.id AND o.outcome = 'delete'
       AND j.abort_requested IS NOT DISTINCT FROM false
       AND j.status IS NOT DISTINCT FROM 'doing'
       AND j.worker_id IS NOT DISTINCT FROM o.worker
       AND j.attempts IS NOT DISTINCT FROM o.attempt
    RETURNING j.id
)
SELECT id FROM updated UNION ALL SELECT id FROM deleted
