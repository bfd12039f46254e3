-- postpone's floor: one claim of :batch jobs and the recording of their success, the very
-- statements a worker sends (src/store.rs JOB_CLAIM's postpone_claim_jobs, and
-- JOB_FINISH_BATCH's postpone_finish; schema version 12), with no client work in between.
-- Each pgbench client is worker :client_id + 1.
\set w :client_id + 1
SELECT quote_literal(coalesce(array_agg(id)::text, '{}')) AS ids,
       quote_literal(coalesce(array_agg(attempts)::text, '{}')) AS atts,
       count(*) AS n
  FROM postpone_claim_jobs(:w, :batch, NULL, NULL) \gset
SELECT count(*)
  FROM postpone_finish(:ids::bigint[], array_fill(:w::bigint, ARRAY[:n]), :atts::int[],
                       array_fill('succeeded'::text, ARRAY[:n]), array_fill(NULL::text, ARRAY[:n]),
                       array_fill(NULL::jsonb, ARRAY[:n]));
