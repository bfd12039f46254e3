-- postpone schema, version 15: no row trigger on postpone_jobs.
--
-- A BEFORE UPDATE row trigger makes PostgreSQL lock every row an UPDATE changes before it
-- looks at the trigger's WHEN clause: one more row lock, and one more WAL record, for every
-- job a worker finishes, although the trigger of version 11 (postpone_jobs_unpark) fires for
-- a parked job leaving the queue only, which none of the library's own recordings is. Its
-- one rule, that a parked job that leaves `todo` forgets whom it waited for (so that it is
-- judged again if it ever waits again), moves into the statement trigger every UPDATE
-- already runs (postpone_notify_done), behind the same cheap test that nothing is parked at
-- all: with parked jobs in the table, a statement that took any of them out of `todo`
-- clears their `blocked_by` before it returns.

DROP TRIGGER postpone_jobs_unpark ON postpone_jobs;
DROP FUNCTION postpone_unpark();

CREATE OR REPLACE FUNCTION postpone_notify_done() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    ids text;
    left_ids bigint[];
    gone_ids bigint[];
BEGIN
    -- Jobs parked behind a job that left the queue (or went back from running to waiting)
    -- are free to be judged again. Nothing to read when no job is parked (an empty index).
    -- The UPDATEs below fire this trigger again, with rows whose blocked_by is NULL and
    -- whose status did not change: nothing to clear or unpark then, so it ends there.
    IF EXISTS (SELECT 1 FROM postpone_jobs b WHERE b.blocked_by IS NOT NULL) THEN
        IF TG_OP = 'UPDATE' THEN
            -- Parked jobs this statement took out of the queue (cancelled, claimed by hand,
            -- ...) forget their blocker.
            gone_ids := ARRAY(
                SELECT n.id FROM postpone_done_new n
                 WHERE n.blocked_by IS NOT NULL AND n.status <> 'todo');
            IF cardinality(gone_ids) > 0 THEN
                UPDATE postpone_jobs b SET blocked_by = NULL
                 WHERE b.id = ANY(gone_ids) AND b.blocked_by IS NOT NULL;
            END IF;
            left_ids := ARRAY(
                SELECT o.id FROM postpone_done_old o JOIN postpone_done_new n ON n.id = o.id
                 WHERE o.lock IS NOT NULL
                   AND ((o.status IN ('todo', 'doing') AND n.status NOT IN ('todo', 'doing'))
                        OR (o.status = 'doing' AND n.status = 'todo')));
        ELSE
            left_ids := ARRAY(
                SELECT o.id FROM postpone_done_old o
                 WHERE o.lock IS NOT NULL AND o.status IN ('todo', 'doing'));
        END IF;
        IF cardinality(left_ids) > 0 THEN
            UPDATE postpone_jobs b SET blocked_by = NULL WHERE b.blocked_by = ANY(left_ids);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM postpone_waiters) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        SELECT string_agg(n.id::text, ',') INTO ids
          FROM postpone_done_new n JOIN postpone_done_old o ON o.id = n.id
         WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
           AND o.status IS DISTINCT FROM n.status
           AND EXISTS (SELECT 1 FROM postpone_waiters w WHERE w.job_id = n.id);
    ELSE
        SELECT string_agg(o.id::text, ',') INTO ids
          FROM postpone_done_old o
         WHERE o.status IN ('todo', 'doing')
           AND EXISTS (SELECT 1 FROM postpone_waiters w WHERE w.job_id = o.id);
    END IF;
    IF ids IS NOT NULL THEN
        PERFORM pg_notify('postpone_done', CASE WHEN length(ids) > 7000 THEN '*' ELSE ids END);
    END IF;
    RETURN NULL;
END
$$;
