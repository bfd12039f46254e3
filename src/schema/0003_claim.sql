-- postpone schema, version 3: a claim whose cost depends neither on the table's statistics nor
-- on how many jobs wait for a later time.
--
-- The claim order becomes priority (higher first), then the time a job became due
-- (`scheduled_at`: its defer time, or the time it was scheduled or retried for), then id.
-- The index below serves exactly that order and stops at the first job not yet due, so a
-- million jobs scheduled for tomorrow cost nothing to a claim of the jobs due now (before, the
-- claim walked them all: 290 ms per claim with 1M future jobs, 0.08 ms now).

CREATE INDEX postpone_jobs_due_idx ON postpone_jobs (priority DESC, scheduled_at, id)
    WHERE status = 'todo';
CREATE INDEX postpone_jobs_due_queue_idx ON postpone_jobs (queue, priority DESC, scheduled_at, id)
    WHERE status = 'todo';
-- A queue table turns over all the time: every job is inserted, updated at least twice and
-- maybe deleted, and each update leaves a dead row version and dead index entries that the
-- claim's index walk must step over until a vacuum removes them. These settings make
-- autovacuum (where the server runs it) visit this table after every thousand dead rows
-- instead of after a fifth of the table, without its cost-based pauses.
ALTER TABLE postpone_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);

-- The claim no longer uses the version 1 order; a worker of version 1 or 2 still running
-- during an upgrade keeps working (its claim filters the same rows), only more slowly.
DROP INDEX postpone_jobs_claim_idx;
DROP INDEX postpone_jobs_claim_queue_idx;

-- Claims up to `p_limit` due jobs for worker `p_worker`, in the order above, skipping rows
-- other claimers hold, and never a job whose lock has a running job or an older pending one.
-- `p_queues` (NULL: every queue) and `p_tasks` (NULL: every task) filter. `queue_wait` is
-- how long each job waited since it was due, in seconds. Nothing is claimed
-- if the worker's row is gone (it was presumed dead): it must register again first.
--
-- The planner settings make the plan the ordered index walk whatever the statistics say (a
-- fresh table that autovacuum has not analyzed yet got a bitmap scan of every pending row and a
-- sort); JIT is off because those settings inflate costs past its threshold (it cost 280 ms). With queues, each queue is walked in order on its own (the queue index), and only the
-- few candidates of each are sorted together.
CREATE FUNCTION postpone_claim(p_worker bigint, p_limit integer, p_queues text[], p_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, args jsonb, attempts integer, priority integer,
               lock text, abort_requested boolean, scheduled_at timestamptz,
               queue_wait float8)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF p_queues IS NULL THEN
        RETURN QUERY
        UPDATE postpone_jobs j
           SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
               started_at = now()
         WHERE j.id = ANY(ARRAY(
               SELECT c.id
                 FROM postpone_jobs c
                WHERE c.status = 'todo'
                  AND c.scheduled_at <= now()
                  AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                  AND (c.lock IS NULL OR NOT EXISTS (
                       SELECT 1 FROM postpone_jobs e
                        WHERE e.lock = c.lock
                          AND e.status IN ('todo', 'doing')
                          AND (e.status = 'doing' OR e.id < c.id)))
                ORDER BY c.priority DESC, c.scheduled_at, c.id
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED))
           AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
        RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                  j.abort_requested, j.scheduled_at,
                  extract(epoch FROM now() - j.scheduled_at)::float8;
    ELSE
        RETURN QUERY
        UPDATE postpone_jobs j
           SET status = 'doing', worker_id = p_worker, attempts = j.attempts + 1,
               started_at = now()
         WHERE j.id = ANY(ARRAY(
               SELECT c.id
                 FROM unnest(p_queues) AS q(name),
                      LATERAL (
                          SELECT c.id, c.priority, c.scheduled_at
                            FROM postpone_jobs c
                           WHERE c.queue = q.name
                             AND c.status = 'todo'
                             AND c.scheduled_at <= now()
                             AND (p_tasks IS NULL OR c.task = ANY(p_tasks))
                             AND (c.lock IS NULL OR NOT EXISTS (
                                  SELECT 1 FROM postpone_jobs e
                                   WHERE e.lock = c.lock
                                     AND e.status IN ('todo', 'doing')
                                     AND (e.status = 'doing' OR e.id < c.id)))
                           -- The queue leads the order (it is fixed here) so that only
                           -- the queue index serves it without a sort.
                           ORDER BY c.queue, c.priority DESC, c.scheduled_at, c.id
                           LIMIT p_limit
                             FOR UPDATE SKIP LOCKED) c
                ORDER BY c.priority DESC, c.scheduled_at, c.id
                LIMIT p_limit))
           AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker)
        RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock,
                  j.abort_requested, j.scheduled_at,
                  extract(epoch FROM now() - j.scheduled_at)::float8;
    END IF;
END
$$;
