-- postpone schema, version 4: job output and progress, a notification when jobs finish
-- (for App::wait), and postpone_defer(), to defer jobs from SQL.

-- What a task recorded: its result (written with the success outcome, in the same
-- statement) and its latest progress (written while it runs). Sizes are bounded by the
-- library before they are written (see job.rs), not by a constraint here: a constraint
-- would let one oversized value fail the batch of outcomes it is recorded with.
ALTER TABLE postpone_jobs
    ADD COLUMN output      jsonb,
    ADD COLUMN progress    jsonb,
    ADD COLUMN progress_at timestamptz;

-- Tells waiters that jobs finished: one notification per statement on the channel
-- 'postpone_done', whose payload is the ids that reached a final status (or left the table
-- while waiting or running), comma-separated; '*' when they do not fit in a payload. A
-- notification is only a hint: a waiter reads the row again, and polls as a backstop.
CREATE FUNCTION postpone_notify_done() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        SELECT string_agg(n.id::text, ',') INTO ids
          FROM postpone_done_new n JOIN postpone_done_old o ON o.id = n.id
         WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
           AND o.status IS DISTINCT FROM n.status;
    ELSE
        SELECT string_agg(o.id::text, ',') INTO ids
          FROM postpone_done_old o
         WHERE o.status IN ('todo', 'doing');
    END IF;
    IF ids IS NOT NULL THEN
        PERFORM pg_notify('postpone_done', CASE WHEN length(ids) > 7000 THEN '*' ELSE ids END);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER postpone_jobs_done AFTER UPDATE ON postpone_jobs
    REFERENCING OLD TABLE AS postpone_done_old NEW TABLE AS postpone_done_new
    FOR EACH STATEMENT EXECUTE FUNCTION postpone_notify_done();

CREATE TRIGGER postpone_jobs_done_delete AFTER DELETE ON postpone_jobs
    REFERENCING OLD TABLE AS postpone_done_old
    FOR EACH STATEMENT EXECUTE FUNCTION postpone_notify_done();

-- Defers a job from SQL, inside the caller's transaction: any driver, ORM or trigger can
-- call it. Every parameter but the task is optional, and may be passed by name:
--   SELECT postpone_defer('send_email', '{"to": "a@b.c"}', queue => 'emails', priority => 5);
-- scheduled_at wins over schedule_in; neither means now. Returns the job's id. Listening
-- workers are woken by the insert trigger, as for a defer from Rust. A queueing lock that
-- is taken raises unique_violation on postpone_jobs_queueing_lock_idx, as a defer does.
CREATE FUNCTION postpone_defer(
    task          text,
    args          jsonb       DEFAULT 'null',
    queue         text        DEFAULT 'default',
    priority      integer     DEFAULT 0,
    lock          text        DEFAULT NULL,
    queueing_lock text        DEFAULT NULL,
    scheduled_at  timestamptz DEFAULT NULL,
    schedule_in   interval    DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    IF postpone_defer.task IS NULL OR btrim(postpone_defer.task) = '' THEN
        RAISE EXCEPTION 'postpone_defer: the task name must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF postpone_defer.queue IS NULL OR btrim(postpone_defer.queue) = '' THEN
        RAISE EXCEPTION 'postpone_defer: the queue name must not be empty (leave it out for the default queue)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF postpone_defer.lock = '' OR postpone_defer.queueing_lock = '' THEN
        RAISE EXCEPTION 'postpone_defer: a lock or queueing lock must not be empty (leave it out instead)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at)
    VALUES (postpone_defer.queue, postpone_defer.task,
            coalesce(postpone_defer.args, 'null'::jsonb),
            coalesce(postpone_defer.priority, 0),
            postpone_defer.lock, postpone_defer.queueing_lock,
            coalesce(postpone_defer.scheduled_at,
                     now() + coalesce(postpone_defer.schedule_in, interval '0')))
    RETURNING id INTO new_id;
    RETURN new_id;
END
$$;

-- Job::periodic_instant and the admin job detail find the instant of a job by its id.
CREATE INDEX postpone_periodic_job_idx ON postpone_periodic (job_id);
