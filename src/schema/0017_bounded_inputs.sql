-- postpone schema, version 17: two values written by hand no longer break what reads them.
--
-- * A rate limit whose period is longer than the database can subtract from now() (say,
--   interval '10000 years', inserted by SQL written by hand; the library's API refuses more
--   than 100 years) made every claim of every worker fail with "timestamp out of range":
--   the claim prunes and counts each rate-limited queue's starts of the last period, queue
--   by queue, whatever queue the worker serves. Such a period is now cut to the API's
--   bound, and a check keeps any other from being stored. 36,525 days is the library's
--   `MAX_DELAY` (100 years and 25 leap days).
--
-- * A job inserted with a time in PostgreSQL's last years (from about the year 294,247 to
--   294,276) made its insert fail with "bigint out of range": the insert trigger tells the
--   workers when it is due in microseconds since 1970, and a bigint holds no more. That time
--   is now capped at 9e18 µs (about the year 287,000), as the claim caps it (a worker waits
--   for such a job no differently: it polls long before).
--
-- * A running job with no start time whose worker row is gone (both written by hand) was
--   never requeued by the workers' rescue, which waits until such a job started longer ago
--   than `stalled_after`: a NULL start now counts as long ago. The function is as in
--   version 2 otherwise.

LOCK TABLE postpone_rate_limits IN SHARE ROW EXCLUSIVE MODE;

UPDATE postpone_rate_limits SET period = interval '36525 days'
 WHERE period > interval '36525 days';

ALTER TABLE postpone_rate_limits
    DROP CONSTRAINT postpone_rate_limits_period,
    ADD CONSTRAINT postpone_rate_limits_period
        CHECK (period > interval '0' AND period <= interval '36525 days');

CREATE OR REPLACE FUNCTION postpone_wake_at(q text, at timestamptz) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify('postpone',
                     'at:' || least(floor(extract(epoch FROM at) * 1000000),
                                    9000000000000000000)::bigint::text || ':'
                     || CASE WHEN octet_length(q) <= 1000 THEN q ELSE '*' END)
$$;

CREATE OR REPLACE FUNCTION postpone_rescue(p_stalled_ms bigint, p_me bigint)
RETURNS TABLE (dead bigint, ids bigint[], outcomes text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_dead bigint;
    v_ids bigint[];
    v_workers bigint[];
    v_attempts integer[];
    v_errors text[];
BEGIN
    WITH d AS (
        DELETE FROM postpone_workers
         WHERE last_heartbeat < now() - p_stalled_ms * interval '1 millisecond' AND id <> p_me
        RETURNING id, name
    ), jobs AS (
        SELECT j.id, j.worker_id, j.attempts,
               format('worker %s (id %s) stopped sending heartbeats while running this job; requeued',
                      d.name, d.id) AS note
          FROM postpone_jobs j JOIN d ON j.worker_id = d.id
         WHERE j.status = 'doing'
        UNION ALL
        SELECT j.id, j.worker_id, j.attempts,
               format('worker id %s vanished while running this job; requeued', j.worker_id)
          FROM postpone_jobs j
         WHERE j.status = 'doing'
           -- No start time (written by hand) counts as long ago.
           AND coalesce(j.started_at, '-infinity') < now() - p_stalled_ms * interval '1 millisecond'
           AND NOT EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = j.worker_id)
           AND NOT EXISTS (SELECT 1 FROM d WHERE d.id = j.worker_id)
    )
    SELECT (SELECT count(*) FROM d),
           coalesce(array_agg(jobs.id ORDER BY jobs.id), '{}'),
           coalesce(array_agg(jobs.worker_id ORDER BY jobs.id), '{}'),
           coalesce(array_agg(jobs.attempts ORDER BY jobs.id), '{}'),
           coalesce(array_agg(jobs.note ORDER BY jobs.id), '{}')
      INTO v_dead, v_ids, v_workers, v_attempts, v_errors
      FROM jobs;
    RETURN QUERY
        SELECT v_dead, coalesce(array_agg(r.job_id), '{}'), coalesce(array_agg(r.outcome), '{}')
          FROM postpone_requeue(v_ids, v_workers, v_attempts, '{}', v_errors, '{}') r;
END
$$;
