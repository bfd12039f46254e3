-- A model beside postpone's floor (benches/wal_models.sh's `as-is`): the claim and the outcome
-- as plain statements, each its own transaction, the job's row changing status twice
-- (todo -> doing -> succeeded), without postpone's functions, guards and fences.
\set w :client_id + 1
WITH u AS (
    UPDATE postpone_jobs j SET status = 'doing', worker_id = :w, attempts = j.attempts + 1,
           started_at = now()
     WHERE j.id = ANY(ARRAY(SELECT c.id FROM postpone_jobs c
                             WHERE c.status = 'todo' AND c.blocked_by IS NULL
                               AND c.expires_at IS NULL AND c.scheduled_at <= now()
                             ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT :batch
                             FOR UPDATE SKIP LOCKED))
    RETURNING j.id)
SELECT quote_literal(coalesce(array_agg(id)::text, '{}')) AS ids FROM u \gset
UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = ANY(:ids::bigint[]);
