-- postpone schema, version 37: less per call of the claim and of the outcome.
--
-- Claims and outcome statements of hundreds of jobs pay these once per statement; claims and
-- outcomes of a few jobs pay them for each few (PostgreSQL 15; docs/performance.md, "Where
-- the server's CPU goes per job").
--
-- * postpone_expiring_from() (version 30: the earliest time a waiting job with a deadline
--   can be scheduled at, read by every claim) was a SQL function with SET clauses, which
--   PostgreSQL never inlines and plans afresh at every call: about 160 us of planning per
--   claim (pg_stat_statements, track = all, track_planning = on). It is now a PL/pgSQL
--   function with the same query and the same settings; PL/pgSQL keeps the plan for the
--   session. A claim of one job: 891 -> 732 us of execution.
-- * postpone_finish (seven arguments, version 25's) leaves out its DELETE when no outcome is
--   'delete': an UPDATE and a DELETE in one statement fire the statement triggers of both
--   events, even when nothing is deleted (two more trigger calls, and the DELETE's set-up).
--   The update is the same statement as before, without the DELETE beside it. An outcome
--   statement of one job: 381-414 -> 351-380 us.
--
-- (The claim's walk is planned at every call as well, about 130 us, as a custom plan: its
-- generic plan reads the wrong index for a claim from named queues, so it stays.)

CREATE OR REPLACE FUNCTION postpone_expiring_from()
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
AS $function$
BEGIN
    RETURN (SELECT CASE WHEN s.span IS NOT NULL AND s.span < interval '1000 years'
                        THEN now() - s.span ELSE '-infinity' END
              FROM (SELECT CASE WHEN c.scheduled_at > '9999-12-31 00:00:00+00' THEN interval '0'
                                WHEN c.scheduled_at >= '1900-01-01 00:00:00+00'
                                 AND c.expires_at >= '1900-01-01 00:00:00+00'
                                 AND c.expires_at <= '9999-12-31 00:00:00+00'
                                THEN c.expires_at - c.scheduled_at END AS span
                      FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.expires_at IS NOT NULL
                     ORDER BY 1 DESC NULLS FIRST LIMIT 1) s);
END
$function$;

CREATE OR REPLACE FUNCTION postpone_finish(p_ids bigint[], p_workers bigint[], p_attempts integer[], p_outcomes text[], p_errors text[], p_outputs jsonb[], p_ran_us bigint[])
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_nestloop TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
 SET lock_timeout TO '200ms'
AS $function$
BEGIN
    -- A statement without a deletion leaves out the DELETE: even deleting nothing, it would
    -- fire the jobs table's statement triggers for DELETE (two more trigger calls).
    IF 'delete' = ANY(p_outcomes) THEN
        RETURN QUERY
        WITH o AS (
            SELECT * FROM unnest(p_ids, p_workers, p_attempts, p_outcomes, p_errors, p_outputs,
                                 p_ran_us)
                AS o(id, worker, attempt, outcome, error, output, ran_us)
        ), updated AS (
            UPDATE postpone_jobs j
               SET status = CASE WHEN j.abort_requested THEN 'aborted'
                                 WHEN o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us)
                                     THEN 'cancelled'
                                 WHEN j.cancel_requested AND o.outcome = 'aborted' THEN 'cancelled'
                                 ELSE o.outcome END,
                   finished_at = now(),
                   started_at = CASE WHEN j.started_at IS NOT NULL OR o.ran_us IS NULL
                                     THEN j.started_at
                                     ELSE now() - least(greatest(o.ran_us, 0), 3155760000000000)
                                                  * interval '1 microsecond' END,
                   attempts = CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                   THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
                   cancel_requested = false,
                   expired = (NOT j.abort_requested AND (o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us))),
                   output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                                  AND NOT postpone_started_late(j.expires_at, j.started_at, o.ran_us)
                                 THEN o.output ELSE j.output END,
                   errors = CASE
                       WHEN (NOT j.abort_requested AND (o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us)))
                           THEN coalesce(j.errors, '[]'::jsonb)
                                || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                        ELSE jsonb_build_array(jsonb_build_object(
                                            'attempt', j.attempts, 'at', now(), 'error', o.error)) END
                                || jsonb_build_array(jsonb_build_object(
                                    'attempt', CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                                    THEN greatest(j.attempts - 1, 0)
                                                    ELSE j.attempts END,
                                    'at', now(),
                                    'error', postpone_expiry_text(j.expires_at, NULL)
                                             || CASE WHEN o.outcome = 'expired' THEN ''
                                                     ELSE format(' (its worker started it %s later; what its task returned, %s, is not kept)',
                                                                 (now() - least(greatest(o.ran_us, 0), 3155760000000000)
                                                                          * interval '1 microsecond') - j.expires_at,
                                                                 CASE WHEN o.outcome = 'delete' THEN 'succeeded'
                                                                      ELSE o.outcome END) END))
                       WHEN o.error IS NULL AND NOT (j.abort_requested AND o.outcome <> 'aborted')
                           THEN j.errors
                       ELSE coalesce(j.errors, '[]'::jsonb)
                            || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                    ELSE jsonb_build_array(jsonb_build_object(
                                        'attempt', CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                                        THEN greatest(j.attempts - 1, 0)
                                                        ELSE j.attempts END,
                                        'at', now(), 'error', o.error)) END
                            || CASE WHEN j.abort_requested AND o.outcome <> 'aborted'
                                    THEN jsonb_build_array(jsonb_build_object(
                                        'attempt', j.attempts, 'at', now(),
                                        'error', format('aborted on request while it ran (its task ended %s before the worker saw the request)',
                                                        CASE WHEN o.outcome = 'delete' THEN 'succeeded'
                                                             ELSE o.outcome END)))
                                    ELSE '[]'::jsonb END END
              FROM o
             WHERE j.id = o.id AND j.id = ANY(p_ids)
               AND (o.outcome <> 'delete' OR j.abort_requested IS NOT DISTINCT FROM true)
               AND j.status IS NOT DISTINCT FROM 'doing'
               AND j.worker_id IS NOT DISTINCT FROM o.worker
               AND j.attempts IS NOT DISTINCT FROM o.attempt
            RETURNING j.id
        ), deleted AS (
            DELETE FROM postpone_jobs j
             USING o
             WHERE j.id = o.id AND j.id = ANY(p_ids) AND o.outcome = 'delete'
               AND j.abort_requested IS NOT DISTINCT FROM false
               AND j.status IS NOT DISTINCT FROM 'doing'
               AND j.worker_id IS NOT DISTINCT FROM o.worker
               AND j.attempts IS NOT DISTINCT FROM o.attempt
            RETURNING j.id
        )
        SELECT id FROM updated UNION ALL SELECT id FROM deleted;
    ELSE
        RETURN QUERY
        WITH o AS (
            SELECT * FROM unnest(p_ids, p_workers, p_attempts, p_outcomes, p_errors, p_outputs,
                                 p_ran_us)
                AS o(id, worker, attempt, outcome, error, output, ran_us)
        ), updated AS (
            UPDATE postpone_jobs j
               SET status = CASE WHEN j.abort_requested THEN 'aborted'
                                 WHEN o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us)
                                     THEN 'cancelled'
                                 WHEN j.cancel_requested AND o.outcome = 'aborted' THEN 'cancelled'
                                 ELSE o.outcome END,
                   finished_at = now(),
                   started_at = CASE WHEN j.started_at IS NOT NULL OR o.ran_us IS NULL
                                     THEN j.started_at
                                     ELSE now() - least(greatest(o.ran_us, 0), 3155760000000000)
                                                  * interval '1 microsecond' END,
                   attempts = CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                   THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
                   cancel_requested = false,
                   expired = (NOT j.abort_requested AND (o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us))),
                   output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                                  AND NOT postpone_started_late(j.expires_at, j.started_at, o.ran_us)
                                 THEN o.output ELSE j.output END,
                   errors = CASE
                       WHEN (NOT j.abort_requested AND (o.outcome = 'expired' OR postpone_started_late(j.expires_at, j.started_at, o.ran_us)))
                           THEN coalesce(j.errors, '[]'::jsonb)
                                || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                        ELSE jsonb_build_array(jsonb_build_object(
                                            'attempt', j.attempts, 'at', now(), 'error', o.error)) END
                                || jsonb_build_array(jsonb_build_object(
                                    'attempt', CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                                    THEN greatest(j.attempts - 1, 0)
                                                    ELSE j.attempts END,
                                    'at', now(),
                                    'error', postpone_expiry_text(j.expires_at, NULL)
                                             || CASE WHEN o.outcome = 'expired' THEN ''
                                                     ELSE format(' (its worker started it %s later; what its task returned, %s, is not kept)',
                                                                 (now() - least(greatest(o.ran_us, 0), 3155760000000000)
                                                                          * interval '1 microsecond') - j.expires_at,
                                                                 CASE WHEN o.outcome = 'delete' THEN 'succeeded'
                                                                      ELSE o.outcome END) END))
                       WHEN o.error IS NULL AND NOT (j.abort_requested AND o.outcome <> 'aborted')
                           THEN j.errors
                       ELSE coalesce(j.errors, '[]'::jsonb)
                            || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                    ELSE jsonb_build_array(jsonb_build_object(
                                        'attempt', CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                                        THEN greatest(j.attempts - 1, 0)
                                                        ELSE j.attempts END,
                                        'at', now(), 'error', o.error)) END
                            || CASE WHEN j.abort_requested AND o.outcome <> 'aborted'
                                    THEN jsonb_build_array(jsonb_build_object(
                                        'attempt', j.attempts, 'at', now(),
                                        'error', format('aborted on request while it ran (its task ended %s before the worker saw the request)',
                                                        CASE WHEN o.outcome = 'delete' THEN 'succeeded'
                                                             ELSE o.outcome END)))
                                    ELSE '[]'::jsonb END END
              FROM o
             WHERE j.id = o.id AND j.id = ANY(p_ids)
               AND (o.outcome <> 'delete' OR j.abort_requested IS NOT DISTINCT FROM true)
               AND j.status IS NOT DISTINCT FROM 'doing'
               AND j.worker_id IS NOT DISTINCT FROM o.worker
               AND j.attempts IS NOT DISTINCT FROM o.attempt
            RETURNING j.id
        )
        SELECT id FROM updated;
    END IF;
END
$function$;
