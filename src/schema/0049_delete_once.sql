-- postpone schema, version 49: jobs written once can be deleted once.
--
-- A worker that deletes finished jobs (`DeleteJobs::Successful` or `Always`) and claims in
-- its outcome's transaction (version 48) wrote each job that succeeded `doing` in that
-- transaction and deleted it after, on its completer's connection: two writes where one
-- will do, and a claim's next size halved each time (the worker took them for jobs still
-- running), down to a few jobs a claim. postpone_settle_locked now takes the outcome
-- `delete` (the job succeeded, and the worker deletes such jobs) and deletes the row in
-- the claim's transaction, where it is still `todo` and locked by it.
--
-- The statistics of deleted jobs move from the delete trigger to the statements that
-- delete them (postpone_finish, postpone_settle_locked), which know what the rows do not:
-- - a job the settle deletes is `todo` until the commit, and started `ran_us` ago;
-- - a held job (most jobs: those that run shorter than the start's delay) has no start on
--   its row: the trigger counted it with no wait, so a worker that deletes what succeeds
--   had no waits in its statistics at all;
-- - under DeleteJobs::Always the outcome of a job deleted as it ends is not written: the
--   trigger counted every such job a success. The worker now says it (`delete:failed`,
--   `delete:cancelled`, `delete:aborted`; `delete` is still a success).
-- So the trigger fires on UPDATE only (no one else deletes a running job: an operator's
-- delete refuses them), and the writing of postpone_stats is postpone_stats_add, which the
-- trigger and postpone_stats_add_counts (the statements' counts) call. A job other jobs
-- wait for is written `succeeded` by the settle first (its dependents see it succeed;
-- deleted `todo` they would see it deleted), then deleted, in the same transaction.

-- A claim's note (postpone_note_claim) takes its jobs as ranges of ids too, which the
-- worker finds: building one range per job cost the note's transaction more than the rest
-- of it.

-- Adds finished jobs to the statistics: `p_rows`, a cursor over rows of this minute's and
-- this hour's counts (span, at, queue, outcome, jobs, w0 to w23: the jobs that waited in
-- each bucket, in key order), added to postpone_stats (per queue, outcome and shard); rows
-- past their keeping are forgotten when it began an hour. The cursor is closed.
CREATE FUNCTION postpone_stats_add(p_rows refcursor)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    new_hours integer := 0;
    r record;
    v_shard smallint := (pg_backend_pid() % 4)::smallint;
    v_fresh boolean;
BEGIN
    -- A row of this minute or hour is added to by a plain UPDATE: an INSERT ... ON
    -- CONFLICT DO UPDATE locks the row it finds first, one more WAL record (54 bytes) per
    -- row, twice per statement that records outcomes. The INSERT is for a row not there
    -- yet (and for one another session inserted meanwhile).
    LOOP
        FETCH p_rows INTO r;
        EXIT WHEN NOT FOUND;
        UPDATE postpone_stats s
           SET jobs = CASE WHEN s.jobs > 9223372036854775807 - r.jobs
                               THEN 9223372036854775807 ELSE s.jobs + r.jobs END,
                   w0 = least(s.w0::bigint + r.w0, 2147483647)::integer,
                   w1 = least(s.w1::bigint + r.w1, 2147483647)::integer,
                   w2 = least(s.w2::bigint + r.w2, 2147483647)::integer,
                   w3 = least(s.w3::bigint + r.w3, 2147483647)::integer,
                   w4 = least(s.w4::bigint + r.w4, 2147483647)::integer,
                   w5 = least(s.w5::bigint + r.w5, 2147483647)::integer,
                   w6 = least(s.w6::bigint + r.w6, 2147483647)::integer,
                   w7 = least(s.w7::bigint + r.w7, 2147483647)::integer,
                   w8 = least(s.w8::bigint + r.w8, 2147483647)::integer,
                   w9 = least(s.w9::bigint + r.w9, 2147483647)::integer,
                   w10 = least(s.w10::bigint + r.w10, 2147483647)::integer,
                   w11 = least(s.w11::bigint + r.w11, 2147483647)::integer,
                   w12 = least(s.w12::bigint + r.w12, 2147483647)::integer,
                   w13 = least(s.w13::bigint + r.w13, 2147483647)::integer,
                   w14 = least(s.w14::bigint + r.w14, 2147483647)::integer,
                   w15 = least(s.w15::bigint + r.w15, 2147483647)::integer,
                   w16 = least(s.w16::bigint + r.w16, 2147483647)::integer,
                   w17 = least(s.w17::bigint + r.w17, 2147483647)::integer,
                   w18 = least(s.w18::bigint + r.w18, 2147483647)::integer,
                   w19 = least(s.w19::bigint + r.w19, 2147483647)::integer,
                   w20 = least(s.w20::bigint + r.w20, 2147483647)::integer,
                   w21 = least(s.w21::bigint + r.w21, 2147483647)::integer,
                   w22 = least(s.w22::bigint + r.w22, 2147483647)::integer,
                   w23 = least(s.w23::bigint + r.w23, 2147483647)::integer
         WHERE s.span = r.span AND s.at = r.at AND s.queue = r.queue
           AND s.outcome = r.outcome AND s.shard = v_shard;
        IF NOT FOUND THEN
            INSERT INTO postpone_stats AS s (span, at, queue, outcome, shard, jobs, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23)
            VALUES (r.span, r.at, r.queue, r.outcome, v_shard, r.jobs, r.w0, r.w1, r.w2, r.w3, r.w4, r.w5, r.w6, r.w7, r.w8, r.w9, r.w10, r.w11, r.w12, r.w13, r.w14, r.w15, r.w16, r.w17, r.w18, r.w19, r.w20, r.w21, r.w22, r.w23)
            ON CONFLICT (span, at, queue, outcome, shard) DO UPDATE
               SET jobs = CASE WHEN s.jobs > 9223372036854775807 - EXCLUDED.jobs
                               THEN 9223372036854775807 ELSE s.jobs + EXCLUDED.jobs END,
                   w0 = least(s.w0::bigint + EXCLUDED.w0, 2147483647)::integer,
                   w1 = least(s.w1::bigint + EXCLUDED.w1, 2147483647)::integer,
                   w2 = least(s.w2::bigint + EXCLUDED.w2, 2147483647)::integer,
                   w3 = least(s.w3::bigint + EXCLUDED.w3, 2147483647)::integer,
                   w4 = least(s.w4::bigint + EXCLUDED.w4, 2147483647)::integer,
                   w5 = least(s.w5::bigint + EXCLUDED.w5, 2147483647)::integer,
                   w6 = least(s.w6::bigint + EXCLUDED.w6, 2147483647)::integer,
                   w7 = least(s.w7::bigint + EXCLUDED.w7, 2147483647)::integer,
                   w8 = least(s.w8::bigint + EXCLUDED.w8, 2147483647)::integer,
                   w9 = least(s.w9::bigint + EXCLUDED.w9, 2147483647)::integer,
                   w10 = least(s.w10::bigint + EXCLUDED.w10, 2147483647)::integer,
                   w11 = least(s.w11::bigint + EXCLUDED.w11, 2147483647)::integer,
                   w12 = least(s.w12::bigint + EXCLUDED.w12, 2147483647)::integer,
                   w13 = least(s.w13::bigint + EXCLUDED.w13, 2147483647)::integer,
                   w14 = least(s.w14::bigint + EXCLUDED.w14, 2147483647)::integer,
                   w15 = least(s.w15::bigint + EXCLUDED.w15, 2147483647)::integer,
                   w16 = least(s.w16::bigint + EXCLUDED.w16, 2147483647)::integer,
                   w17 = least(s.w17::bigint + EXCLUDED.w17, 2147483647)::integer,
                   w18 = least(s.w18::bigint + EXCLUDED.w18, 2147483647)::integer,
                   w19 = least(s.w19::bigint + EXCLUDED.w19, 2147483647)::integer,
                   w20 = least(s.w20::bigint + EXCLUDED.w20, 2147483647)::integer,
                   w21 = least(s.w21::bigint + EXCLUDED.w21, 2147483647)::integer,
                   w22 = least(s.w22::bigint + EXCLUDED.w22, 2147483647)::integer,
                   w23 = least(s.w23::bigint + EXCLUDED.w23, 2147483647)::integer
            RETURNING (s.xmax = 0) INTO v_fresh;
            IF v_fresh AND r.span = 'hour' THEN
                new_hours := new_hours + 1;
            END IF;
        END IF;
    END LOOP;
    CLOSE p_rows;
    IF new_hours > 0 THEN
        DELETE FROM postpone_stats
         WHERE (span = 'minute' AND at < now() - interval '2 hours')
            OR (span = 'hour' AND at < now() - interval '8 days');
    END IF;
END
$function$;

-- Adds finished jobs to the statistics, counted by their callers per queue, outcome and
-- bucket of wait: `p_counts` jobs of queue `p_queues` with outcome `p_outcomes` in bucket
-- `p_buckets` (0 to 23, as postpone_stats_record finds them; NULL: no wait), for the
-- statements that delete the jobs they end (postpone_finish, postpone_settle_locked): the
-- rows they delete do not say the outcome, nor, for a held job, its start.
CREATE FUNCTION postpone_stats_add_counts(p_queues text[], p_outcomes text[], p_buckets integer[], p_counts bigint[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_rows refcursor;
BEGIN
    OPEN v_rows FOR
    WITH y AS (
            SELECT u.queue, u.outcome, u.b, u.n
              FROM unnest(p_queues, p_outcomes, p_buckets, p_counts) AS u(queue, outcome, b, n)
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
END
$function$;

-- The trigger: a statement's jobs that reached a final status (an UPDATE from `todo` or
-- `doing`). It no longer fires on DELETE: the statements that delete finished jobs
-- (postpone_finish, postpone_settle_locked) count them themselves, with their outcome and
-- their wait, which the rows do not hold (a held job has no start, and the outcome of a job
-- deleted as it ends is not written); and no one else deletes a running job (an operator's
-- delete refuses them).
DROP TRIGGER postpone_jobs_stats_delete ON postpone_jobs;

CREATE OR REPLACE FUNCTION postpone_stats_record()
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

-- Writes the jobs a lock-only claim took, each once: `p_outcomes` `succeeded` (it ended so,
-- `p_ran_us` µs after its start, with `p_outputs`), `delete` (it succeeded, and the worker
-- deletes such jobs: deleted, and counted in the statistics here), `running` (it started
-- `p_ran_us` µs ago: `doing`, its outcome recorded later as any running job's) or `held`
-- (not started: `doing` and held, as a claim without lock_only leaves it). Each job is
-- named with the attempt the claim gave it (`p_attempts`). `p_xid` is the claim's
-- transaction: the current one (the rows must be locked by it), or one that was lost (it
-- is `aborted` and the worker's note names it and the job). Rows changed meanwhile
-- (cancelled, requeued by the rescue: their attempt moved on) are left alone. `doing` is
-- written only while the worker's row is there. Returns the ids written.
CREATE OR REPLACE FUNCTION postpone_settle_locked(p_worker bigint, p_xid xid8, p_ids bigint[], p_attempts integer[], p_outcomes text[], p_outputs jsonb[], p_ran_us bigint[])
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
    v_mine boolean := p_xid = pg_current_xact_id();
    v_lost int8multirange;
    v_alive boolean := EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = p_worker);
    v_gone bigint[];
    v_queues text[];
    v_outcomes text[];
    v_buckets integer[];
    v_counts bigint[];
    v_written bigint[];
    v_then_delete bigint[];
    -- The buckets of waits, as postpone_stats_record has them.
    v_bounds interval[] := ARRAY(SELECT (2 ^ k) * interval '1 millisecond'
                                   FROM generate_series(0, 22) AS k);
BEGIN
    IF NOT v_mine THEN
        SELECT w.claim_jobs INTO v_lost
          FROM postpone_workers w
         WHERE w.id = p_worker AND w.claim_xids @> ARRAY[p_xid]
           AND pg_xact_status(p_xid) = 'aborted';
        IF v_lost IS NULL THEN
            RETURN;
        END IF;
    END IF;
    -- Jobs that succeeded, to delete: deleted at once, unless other jobs wait for them
    -- (below), and counted here (the statistics' trigger counts updates only).
    IF 'delete' = ANY(p_outcomes) THEN
        WITH o AS (
            SELECT * FROM unnest(p_ids, p_attempts, p_outcomes, p_ran_us)
                AS o(id, attempt, outcome, ran_us)
             WHERE o.outcome = 'delete'
        ), d AS (
            DELETE FROM postpone_jobs j
             USING o
             WHERE j.id = o.id AND j.id = ANY(p_ids)
               AND j.status = 'todo' AND NOT j.has_dependents
               AND least(j.attempts, 2147483646) + 1 = o.attempt
               AND j.lock IS NULL AND j.queueing_lock IS NULL AND j.unique_key IS NULL
               AND j.expires_at IS NULL AND NOT j.abort_requested
               AND CASE WHEN v_mine THEN j.xmax = p_xid::xid ELSE v_lost @> j.id END
            RETURNING j.id, j.queue,
                      CASE WHEN isfinite(j.scheduled_at)
                           THEN now() - least(greatest(coalesce(o.ran_us, 0), 0), 3155760000000000)
                                        * interval '1 microsecond' - j.scheduled_at END AS wait
        ), g AS (
            SELECT d.queue, width_bucket(d.wait, v_bounds) AS b, count(*) AS n
              FROM d GROUP BY d.queue, 2
        )
        SELECT (SELECT array_agg(d.id) FROM d), array_agg(g.queue),
               array_agg('succeeded'::text), array_agg(g.b), array_agg(g.n)
          INTO v_gone, v_queues, v_outcomes, v_buckets, v_counts
          FROM g;
        IF v_gone IS NOT NULL THEN
            PERFORM postpone_stats_add_counts(v_queues, v_outcomes, v_buckets, v_counts);
            RETURN QUERY SELECT unnest(v_gone);
        END IF;
    END IF;
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_attempts, p_outcomes, p_outputs, p_ran_us)
            AS o(id, attempt, outcome, output, ran_us)
         WHERE o.outcome IN ('succeeded', 'delete')
            OR (o.outcome IN ('running', 'held') AND v_alive)
    ), w AS (
        UPDATE postpone_jobs j
           SET status = CASE WHEN o.outcome IN ('succeeded', 'delete') THEN 'succeeded'
                             ELSE 'doing' END,
               worker_id = p_worker,
               attempts = o.attempt,
               claimed_at = CASE WHEN o.outcome = 'held' THEN now()
                                 ELSE now() - least(greatest(coalesce(o.ran_us, 0), 0), 3155760000000000)
                                              * interval '1 microsecond' END,
               started_at = CASE WHEN o.outcome = 'held' THEN NULL
                                 ELSE now() - least(greatest(coalesce(o.ran_us, 0), 0), 3155760000000000)
                                              * interval '1 microsecond' END,
               finished_at = CASE WHEN o.outcome IN ('succeeded', 'delete') THEN now() END,
               output = CASE WHEN o.outcome = 'succeeded' THEN o.output ELSE j.output END
          FROM o
         WHERE j.id = o.id AND j.id = ANY(p_ids)
           AND j.status = 'todo'
           AND least(j.attempts, 2147483646) + 1 = o.attempt
           AND j.lock IS NULL AND j.queueing_lock IS NULL AND j.unique_key IS NULL
           AND j.expires_at IS NULL AND NOT j.abort_requested
           AND CASE WHEN v_mine THEN j.xmax = p_xid::xid ELSE v_lost @> j.id END
        RETURNING j.id, o.outcome
    )
    SELECT array_agg(w.id), array_agg(w.id) FILTER (WHERE w.outcome = 'delete')
      INTO v_written, v_then_delete
      FROM w;
    -- Jobs others wait for, to delete: written `succeeded` above (their dependents see them
    -- succeed, and the statistics count them), deleted now.
    IF v_then_delete IS NOT NULL THEN
        DELETE FROM postpone_jobs j WHERE j.id = ANY(v_then_delete) AND j.status = 'succeeded';
    END IF;
    RETURN QUERY SELECT unnest(v_written);
END
$function$;

-- Notes the worker's open transactions of lock-only claims and their jobs, given as ranges
-- of ids (`p_from` to `p_to`, both included), in place of its note before (see the
-- three-argument postpone_note_claim of version 48, which takes one id a job). False: the
-- worker's row is gone.
CREATE FUNCTION postpone_note_claim(p_worker bigint, p_xids xid8[], p_from bigint[], p_to bigint[])
 RETURNS boolean
 LANGUAGE sql
AS $function$
    WITH n AS (
        UPDATE postpone_workers w
           SET claim_xids = p_xids,
               claim_jobs = (SELECT range_agg(int8range(u.f, u.t, '[]'))
                               FROM unnest(p_from, p_to) AS u(f, t))
         WHERE w.id = p_worker
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM n)
$function$;

-- Records outcomes (see version 20). `delete` is a success whose row is deleted, and
-- `delete:failed`, `delete:cancelled` and `delete:aborted` (DeleteJobs::Always) the other
-- final outcomes deleted; it counts the jobs it deletes in the statistics itself, with
-- their outcome and their wait (the trigger counts updates only, and a held job's row has
-- no start).
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

-- The outcomes of builds before version 20 (no `p_ran_us`): the jobs it deletes are counted
-- here too, as successes (their rows have their start), since the trigger counts updates
-- only.
CREATE OR REPLACE FUNCTION postpone_finish(p_ids bigint[], p_workers bigint[], p_attempts integer[], p_outcomes text[], p_errors text[], p_outputs jsonb[])
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
    v_bounds interval[] := ARRAY(SELECT (2 ^ k) * interval '1 millisecond'
                                   FROM generate_series(0, 22) AS k);
BEGIN
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_workers, p_attempts, p_outcomes, p_errors, p_outputs)
            AS o(id, worker, attempt, outcome, error, output)
    ), updated AS (
        UPDATE postpone_jobs j
           SET status = CASE WHEN j.abort_requested THEN 'aborted' ELSE o.outcome END,
               finished_at = now(),
               output = CASE WHEN o.outcome = 'succeeded' AND NOT j.abort_requested
                             THEN o.output ELSE j.output END,
               errors = CASE
                   WHEN o.error IS NULL AND NOT (j.abort_requested AND o.outcome <> 'aborted')
                       THEN j.errors
                   ELSE coalesce(j.errors, '[]'::jsonb)
                        || CASE WHEN o.error IS NULL THEN '[]'::jsonb
                                ELSE jsonb_build_array(jsonb_build_object(
                                    'attempt', j.attempts, 'at', now(), 'error', o.error)) END
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
        RETURNING j.id, j.queue,
                  CASE WHEN isfinite(j.scheduled_at) AND isfinite(j.started_at)
                       THEN j.started_at - j.scheduled_at END AS wait
    ), g AS (
        SELECT d.queue, width_bucket(d.wait, v_bounds) AS b, count(*) AS n
          FROM deleted d GROUP BY d.queue, 2
    )
    SELECT (SELECT array_agg(x.id)
              FROM (SELECT u.id FROM updated u UNION ALL SELECT d.id FROM deleted d) AS x),
           array_agg(g.queue), array_agg('succeeded'::text), array_agg(g.b), array_agg(g.n)
      INTO v_ids, v_queues, v_outcomes, v_buckets, v_counts
      FROM g;
    IF v_queues IS NOT NULL THEN
        PERFORM postpone_stats_add_counts(v_queues, v_outcomes, v_buckets, v_counts);
    END IF;
    RETURN QUERY SELECT unnest(v_ids);
END
$function$;
