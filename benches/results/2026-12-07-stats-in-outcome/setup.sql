CREATE OR REPLACE FUNCTION public.postpone_stats_record()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_rows refcursor;
    -- Where the buckets of a job's wait begin: bucket b (1 to 23) from 2^(b-1) ms on, bucket
    -- 0 below 1 ms. width_bucket finds a wait's bucket in five comparisons of intervals.
    v_bounds interval[] := ARRAY(SELECT (2 ^ k) * interval '1 millisecond'
                                   FROM generate_series(0, 22) AS k);
BEGIN
    IF pg_trigger_depth() = 1 AND current_setting('postpone.counted', true) = 'on' THEN
        RETURN NULL;
    END IF;
    -- The finished jobs of this statement, counted per queue and outcome, added to this
    -- minute's and this hour's rows (in key order). A job's wait has no bucket when it did
    -- not start or a time is infinite. (A worker that deletes its jobs counts them in its
    -- own statements: see postpone_stats_add_counts.)
    -- A claim, a heartbeat, a retry: no row reached a final status. Nothing to write.
    -- (The statuses are those of the table's CHECK: two comparisons a row, not four.)
    IF NOT EXISTS (SELECT 1 FROM postpone_stats_new n
                    WHERE n.status NOT IN ('todo', 'doing')) THEN
        RETURN NULL;
    END IF;
    OPEN v_rows FOR
    WITH x AS (
            SELECT n.queue, n.status AS outcome,
                   width_bucket(CASE WHEN isfinite(n.started_at) AND isfinite(n.scheduled_at)
                                     THEN n.started_at - n.scheduled_at END,
                                v_bounds) AS b
              FROM postpone_stats_new n JOIN postpone_stats_old o ON o.id = n.id
             WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
               AND o.status IN ('todo', 'doing')
        ), y AS (
            SELECT x.queue, x.outcome, x.b, count(*) AS n
              FROM x GROUP BY x.queue, x.outcome, x.b
        ), g AS (
            SELECT y.queue, y.outcome, sum(y.n)::bigint AS jobs,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 0), 0)::integer AS w0,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 1), 0)::integer AS w1,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 2), 0)::integer AS w2,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 3), 0)::integer AS w3,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 4), 0)::integer AS w4,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 5), 0)::integer AS w5,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 6), 0)::integer AS w6,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 7), 0)::integer AS w7,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 8), 0)::integer AS w8,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 9), 0)::integer AS w9,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 10), 0)::integer AS w10,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 11), 0)::integer AS w11,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 12), 0)::integer AS w12,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 13), 0)::integer AS w13,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 14), 0)::integer AS w14,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 15), 0)::integer AS w15,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 16), 0)::integer AS w16,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 17), 0)::integer AS w17,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 18), 0)::integer AS w18,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 19), 0)::integer AS w19,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 20), 0)::integer AS w20,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 21), 0)::integer AS w21,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 22), 0)::integer AS w22,
                   coalesce(sum(y.n) FILTER (WHERE y.b = 23), 0)::integer AS w23
              FROM y GROUP BY y.queue, y.outcome
        )
        SELECT sp.span, date_trunc(sp.span, now()) AS at, g.*
          FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
         ORDER BY 1, g.queue, g.outcome;
    PERFORM postpone_stats_add(v_rows);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.postpone_finish(p_ids bigint[], p_workers bigint[], p_attempts integer[], p_outcomes text[], p_errors text[], p_outputs jsonb[], p_ran_us bigint[])
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
DECLARE
    v_ids bigint[];
    v_queues text[];
    v_outcomes text[];
    v_buckets integer[];
    v_counts bigint[];
    -- The buckets of waits, as postpone_stats_record has them.
    v_bounds interval[] := ARRAY(SELECT (2 ^ k) * interval '1 millisecond'
                                   FROM generate_series(0, 22) AS k);
BEGIN
    -- A statement without a deletion leaves out the DELETE: even deleting nothing, it would
    -- fire the jobs table's statement trigger for DELETE.
    IF p_outcomes && ARRAY['delete', 'delete:failed', 'delete:cancelled', 'delete:aborted'] THEN
        WITH o AS (
            -- Every deletion is `delete` below; `kind` is the outcome it is (`succeeded`
            -- for `delete`), for the statistics and the errors written.
            SELECT u.id, u.worker, u.attempt,
                   CASE WHEN u.word IN ('delete', 'delete:failed', 'delete:cancelled',
                                        'delete:aborted')
                        THEN 'delete' ELSE u.word END AS outcome,
                   CASE u.word WHEN 'delete' THEN 'succeeded'
                               WHEN 'delete:failed' THEN 'failed'
                               WHEN 'delete:cancelled' THEN 'cancelled'
                               WHEN 'delete:aborted' THEN 'aborted'
                               ELSE u.word END AS kind,
                   u.error, u.output, u.ran_us
              FROM unnest(p_ids, p_workers, p_attempts, p_outcomes, p_errors, p_outputs,
                          p_ran_us)
                AS u(id, worker, attempt, word, error, output, ran_us)
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
                                                                 CASE WHEN o.outcome = 'delete' THEN o.kind
                                                                      ELSE o.outcome END) END))
                       WHEN o.error IS NULL AND NOT (j.abort_requested AND o.kind <> 'aborted')
                           THEN j.errors
                       ELSE coalesce(j.errors, '[]'::jsonb)
                            || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                    ELSE jsonb_build_array(jsonb_build_object(
                                        'attempt', CASE WHEN j.started_at IS NULL AND o.ran_us IS NULL
                                                        THEN greatest(j.attempts - 1, 0)
                                                        ELSE j.attempts END,
                                        'at', now(), 'error', o.error)) END
                            || CASE WHEN j.abort_requested AND o.kind <> 'aborted'
                                    THEN jsonb_build_array(jsonb_build_object(
                                        'attempt', j.attempts, 'at', now(),
                                        'error', format('aborted on request while it ran (its task ended %s before the worker saw the request)',
                                                        CASE WHEN o.outcome = 'delete' THEN o.kind
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
            RETURNING j.id, j.queue, o.kind,
                      -- A held job's row has no start (it ran shorter than the start's
                      -- delay): it started `ran_us` ago.
                      CASE WHEN isfinite(j.scheduled_at)
                                AND (j.started_at IS NULL OR isfinite(j.started_at))
                           THEN coalesce(j.started_at,
                                         now() - least(greatest(o.ran_us, 0), 3155760000000000)
                                                 * interval '1 microsecond')
                                - j.scheduled_at END AS wait
        ), g AS (
            SELECT d.queue, d.kind, width_bucket(d.wait, v_bounds) AS b, count(*) AS n
              FROM deleted d GROUP BY d.queue, d.kind, 3
        )
        SELECT (SELECT array_agg(x.id)
                  FROM (SELECT u.id FROM updated u UNION ALL SELECT d.id FROM deleted d) AS x),
               array_agg(g.queue), array_agg(g.kind), array_agg(g.b), array_agg(g.n)
          INTO v_ids, v_queues, v_outcomes, v_buckets, v_counts
          FROM g;
        IF v_queues IS NOT NULL THEN
            PERFORM postpone_stats_add_counts(v_queues, v_outcomes, v_buckets, v_counts);
        END IF;
        RETURN QUERY SELECT unnest(v_ids);
    ELSE
        PERFORM set_config('postpone.counted', 'on', true);
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
            RETURNING j.id, j.queue, j.status,
                      CASE WHEN isfinite(j.started_at) AND isfinite(j.scheduled_at)
                           THEN j.started_at - j.scheduled_at END AS wait
        ), g AS (
            SELECT u.queue, u.status, width_bucket(u.wait, v_bounds) AS b, count(*) AS n
              FROM updated u GROUP BY u.queue, u.status, 3
        )
        SELECT (SELECT array_agg(u.id) FROM updated u),
               array_agg(g.queue), array_agg(g.status), array_agg(g.b), array_agg(g.n)
          INTO v_ids, v_queues, v_outcomes, v_buckets, v_counts
          FROM g;
        PERFORM set_config('postpone.counted', '', true);
        IF v_queues IS NOT NULL THEN
            PERFORM postpone_stats_add_counts(v_queues, v_outcomes, v_buckets, v_counts);
        END IF;
        RETURN QUERY SELECT unnest(v_ids);
    END IF;
END
$function$;
