INSERT INTO postpone_jobs (queue, task, args) VALUES ('default','t','{}');
SELECT id AS jid, attempts AS att FROM postpone_claim_jobs(1, 1, NULL, NULL) \gset
SELECT * FROM postpone_finish(ARRAY[:jid]::bigint[], ARRAY[1]::bigint[], ARRAY[:att]::int[], ARRAY['succeeded'], ARRAY[NULL]::text[], ARRAY[NULL]::jsonb[]);
