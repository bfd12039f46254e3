-- postpone schema, version 22: a worker's lease belongs to it, and each worker says which
-- tasks it claims.
--
-- * Each worker records its own heartbeat_interval and stalled_after (in milliseconds) when
--   it registers. It is presumed dead only once its *own* lease has ended: its last
--   heartbeat plus its own stalled_after (postpone_lease_end). Before, every rescuer judged
--   every worker by the rescuer's threshold, so a worker with a shorter stalled_after (a
--   deploy that shortens the setting) presumed a healthy worker dead and ran its job a
--   second time. The workers' rescue (postpone_rescue) and the admin API's stalled jobs
--   judge by the lease; an operator's threshold can lengthen a lease, never shorten it.
--
-- * A row without a recorded stalled_after was written by a worker older than this schema,
--   which goes on running during a rolling upgrade (its INSERT and its heartbeat do not
--   name the new columns). Its setting is unknown, so its lease is the longest of: the
--   judge's own threshold (the rescuing worker's stalled_after, an operator's --after), the
--   longest stalled_after any registered worker records, and 30 s (the workers' default).
--
-- * `tasks`: the task names a worker claims (NULL: every task, as workers older than this
--   schema and those with `only_registered_tasks(false)` do). Read to tell which waiting
--   jobs no running worker knows.
--
-- Every statement here can run again on a schema that has it.

ALTER TABLE postpone_workers
    ADD COLUMN IF NOT EXISTS heartbeat_interval_ms bigint,
    ADD COLUMN IF NOT EXISTS stalled_after_ms bigint,
    ADD COLUMN IF NOT EXISTS tasks text[];

-- When a worker whose last heartbeat was `p_last_heartbeat` and whose recorded
-- stalled_after is `p_stalled_after_ms` (NULL: not recorded, see above) must be presumed
-- dead. `p_unknown_ms` is the judge's threshold, used only for a lease that was not
-- recorded; `p_at_least_ms` lengthens every lease to at least that (an operator's
-- threshold; 0 or NULL: the lease as recorded). Capped at 100 years, so that no value
-- written by hand can make the addition fail.
CREATE OR REPLACE FUNCTION postpone_lease_end(p_last_heartbeat timestamptz,
                                              p_stalled_after_ms bigint,
                                              p_unknown_ms bigint, p_at_least_ms bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT p_last_heartbeat
           + least(greatest(coalesce(p_stalled_after_ms,
                                     greatest(p_unknown_ms, 30000,
                                              (SELECT max(w.stalled_after_ms)
                                                 FROM postpone_workers w))),
                            p_at_least_ms, 0),
                   3155760000000) * interval '1 millisecond'
$$;

-- Removes the workers whose lease has ended (postpone_lease_end; `p_stalled_ms`, the
-- caller's stalled_after, counts only for leases not recorded), never `p_me` (the caller),
-- and requeues their running jobs through postpone_requeue, plus every running job whose
-- worker row has been gone for `p_stalled_ms` (claimed by a worker that was removed
-- meanwhile). Returns the number of workers removed and, for each job touched, its id and
-- outcome. As in version 17 but for the lease.
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
         WHERE postpone_lease_end(last_heartbeat, stalled_after_ms, p_stalled_ms, 0) < now()
           AND id <> p_me
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
