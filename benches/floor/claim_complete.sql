-- postpone's floor: one claim of :batch jobs and the recording of their success, the very
-- statements a worker sends (src/schema postpone_claim, src/store.rs JOB_FINISH_BATCH), with
-- no client work in between. Each pgbench client is worker :client_id + 1.
\set w :client_id + 1
SELECT quote_literal(coalesce(array_agg(id)::text, '{}')) AS ids,
       quote_literal(coalesce(array_agg(attempts)::text, '{}')) AS atts,
       count(*) AS n
  FROM postpone_claim(:w, :batch, NULL, NULL) \gset
WITH o AS (
    SELECT * FROM unnest(:ids::bigint[], array_fill(:w::bigint, ARRAY[:n]), :atts::int[],
                         array_fill('succeeded'::text, ARRAY[:n]), array_fill(NULL::text, ARRAY[:n]),
                         array_fill(NULL::jsonb, ARRAY[:n]))
        AS o(id, worker, attempt, outcome, error, output)
), updated AS (
    UPDATE postpone_jobs j
       SET status = CASE WHEN j.abort_requested THEN 'aborted' ELSE o.outcome END,
           finished_at = now(),
           output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                         THEN o.output ELSE j.output END,
           errors = CASE WHEN o.error IS NULL AND NOT (j.abort_requested AND o.outcome <> 'aborted')
                         THEN j.errors ELSE coalesce(j.errors, '[]'::jsonb) END
      FROM o
     WHERE j.id = o.id
       AND (o.outcome <> 'delete' OR j.abort_requested IS NOT DISTINCT FROM true)
       AND j.status IS NOT DISTINCT FROM 'doing'
       AND j.worker_id IS NOT DISTINCT FROM o.worker
       AND j.attempts IS NOT DISTINCT FROM o.attempt
    RETURNING j.id
)
SELECT count(*) FROM updated;
