-- postpone schema, version 10: less work per job for the database.
--
-- 1. A completion notifies only the jobs someone waits for. Until now every statement that
--    finished jobs sent a notification on 'postpone_done'. PostgreSQL serialises the commits
--    of every transaction that has sent a notification (one at a time, across the whole
--    server, each holding the queue's lock through its WAL flush), so the completers of many
--    worker processes could not share a flush: on this project's 2-core machine (loaded by builds at the time), pgbench
--    running a worker's claim and completion with 8 clients did 232 and 166 batches/s with
--    the notification, 453 and 398 without. Now App::wait registers the job in
--    postpone_waiters (after its LISTEN, before it reads the row) and removes it when done;
--    the trigger looks at that table first and sends nothing when it is empty, and otherwise
--    names only the jobs waited for. A waiter of an older library does not register: it
--    still gets its result, by its poll (the row is the truth; the notification only made it
--    look sooner). The table is UNLOGGED: its rows last as long as the waits that wrote them,
--    and a server crash ends those waits anyway.
--
-- 2. The unique index that keeps one running job per lock holds only jobs that have a lock.
--    It used to hold an entry for every running job (NULL locks never conflict), written by
--    every claim.

CREATE UNLOGGED TABLE postpone_waiters (
    job_id  bigint      NOT NULL,
    backend integer     NOT NULL DEFAULT pg_backend_pid(),
    since   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX postpone_waiters_job_idx ON postpone_waiters (job_id);

CREATE OR REPLACE FUNCTION postpone_notify_done() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text;
BEGIN
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

DROP INDEX postpone_jobs_lock_doing_idx;
CREATE UNIQUE INDEX postpone_jobs_lock_doing_idx ON postpone_jobs (lock)
    WHERE status = 'doing' AND lock IS NOT NULL;
