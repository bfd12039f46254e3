\set w :client_id + 1
BEGIN;
SELECT pg_try_advisory_xact_lock(42);
SELECT quote_literal(coalesce(array_agg(id)::text, '{}')) AS ids,
       quote_literal(coalesce(array_agg(attempts)::text, '{}')) AS atts,
       count(*) AS n
  FROM postpone_claim_jobs(:w, :batch, NULL, NULL) \gset
COMMIT;
SELECT count(*)
  FROM postpone_finish(:ids::bigint[], array_fill(:w::bigint, ARRAY[:n]), :atts::int[],
                       array_fill('succeeded'::text, ARRAY[:n]), array_fill(NULL::text, ARRAY[:n]),
                       array_fill(NULL::jsonb, ARRAY[:n]));
