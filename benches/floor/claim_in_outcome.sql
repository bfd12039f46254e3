-- A model beside postpone's floor (benches/wal_models.sh's `one-txn`): the claim only locks its
-- rows and the outcome is written in the claim's transaction, so the job's row changes status
-- once (todo -> succeeded). Plain statements, as claim_complete_plain.sql.
\set w :client_id + 1
BEGIN;
SELECT quote_literal(coalesce(array_agg(id)::text, '{}')) AS ids
  FROM (SELECT c.id FROM postpone_jobs c
         WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.expires_at IS NULL
           AND c.scheduled_at <= now()
         ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT :batch
           FOR UPDATE SKIP LOCKED) s \gset
UPDATE postpone_jobs SET status = 'succeeded', worker_id = :w, attempts = attempts + 1,
       started_at = now(), finished_at = now()
 WHERE id = ANY(:ids::bigint[]);
COMMIT;
