-- postpone schema, version 47: jobs deferred with dependencies keep their arguments' text.
--
-- Since version 46 `postpone_jobs.args` is `json`, the text as deferred, and the library's
-- defers send it as `json`; but jobs deferred with dependencies went through
-- `postpone_defer_jobs`, whose arguments were `jsonb[]`: the server parsed them into jsonb
-- and printed them back (keys reordered, spaces added), the work version 46 removed from
-- every other defer. `postpone_defer_jobs` of fourteen arguments now has a `json[]`
-- overload that the library calls; the `jsonb[]` one, for SQL callers and the builds of
-- version 46, casts its arguments and calls it. The thirteen-argument one (builds before
-- version 25) is unchanged.

CREATE OR REPLACE FUNCTION postpone_defer_jobs(p_queue text[], p_task text[], p_args json[], p_priority integer[], p_lock text[], p_queueing_lock text[], p_at timestamp with time zone[], p_max_attempts integer[], p_tags jsonb[], p_meta jsonb[], p_edge_job integer[], p_edge_dep bigint[], p_edge_any boolean[], p_expires_at timestamp with time zone[])
 RETURNS SETOF bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_n integer := coalesce(cardinality(p_task), 0);
    v_deps bigint[];
    v_found bigint[];
    v_status text[];
    v_missing bigint;
    v_ids bigint[];
    v_has boolean[];
    v_pending integer[];
    v_bad bigint[];
    v_bad_status text[];
BEGIN
    PERFORM postpone_check_expiry(x.at, x.exp, 'postpone_defer_jobs')
       FROM unnest(p_at, p_expires_at) AS x(at, exp)
      WHERE x.exp IS NOT NULL;
    IF EXISTS (SELECT 1 FROM unnest(p_edge_job, p_edge_dep) AS e(j, d)
                WHERE e.j IS NULL OR e.j < 1 OR e.j > v_n OR e.d IS NULL) THEN
        RAISE EXCEPTION 'postpone_defer_jobs: every dependency needs the position of its job (1 to %) and a job id', v_n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The dependencies, locked in id order (so two defers naming the same jobs never wait
    -- for each other in a circle); a finish under way is waited for, and seen.
    v_deps := ARRAY(SELECT DISTINCT d FROM unnest(p_edge_dep) AS d ORDER BY 1);
    SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}'),
           coalesce(array_agg(x.status ORDER BY x.id), '{}')
      INTO v_found, v_status
      FROM (SELECT j.id, j.status FROM postpone_jobs j
             WHERE j.id = ANY(v_deps) ORDER BY j.id FOR NO KEY UPDATE) x;
    SELECT min(d) INTO v_missing FROM unnest(v_deps) AS d WHERE d <> ALL(v_found);
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'job % does not exist (it was never deferred, or it was deleted): a job can only run after jobs that exist', v_missing
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'postpone_deps_dependency',
                  HINT = 'name only ids returned by a defer, before retention or DeleteJobs removes them';
    END IF;
    -- The ones not finished will tell their dependents when they are.
    UPDATE postpone_jobs j SET has_dependents = true
     WHERE j.id = ANY(v_found) AND j.status IN ('todo', 'doing') AND NOT j.has_dependents;

    -- What each job's dependencies already say: how many have not finished, and the first
    -- `after` dependency that ended badly.
    WITH e AS (
        SELECT e.j, e.d, bool_and(coalesce(e.a, false)) AS any_outcome
          FROM unnest(p_edge_job, p_edge_dep, p_edge_any) AS e(j, d, a)
         GROUP BY e.j, e.d
    ), s AS (
        SELECT e.j, e.d, f.status, f.status IN ('todo', 'doing') AS pending,
               NOT e.any_outcome AND f.status IN ('failed', 'cancelled', 'aborted') AS bad
          FROM e JOIN unnest(v_found, v_status) AS f(id, status) ON f.id = e.d
    ), per AS (
        SELECT s.j, count(*) FILTER (WHERE s.pending)::integer AS pending,
               (array_agg(s.d ORDER BY s.d) FILTER (WHERE s.bad))[1] AS bad,
               (array_agg(s.status ORDER BY s.d) FILTER (WHERE s.bad))[1] AS bad_status
          FROM s GROUP BY s.j
    )
    SELECT array_agg(per.j IS NOT NULL ORDER BY g.n),
           array_agg(coalesce(per.pending, 0) ORDER BY g.n),
           array_agg(per.bad ORDER BY g.n),
           array_agg(per.bad_status ORDER BY g.n)
      INTO v_has, v_pending, v_bad, v_bad_status
      FROM generate_series(1, v_n) AS g(n) LEFT JOIN per ON per.j = g.n;

    WITH ins AS (
        INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock,
                                   scheduled_at, max_attempts, tags, meta, status,
                                   finished_at, errors, has_dependencies, expires_at)
        SELECT u.queue, u.task, coalesce(u.args, 'null'::json), coalesce(u.priority, 0),
               u.lock, u.queueing_lock,
               CASE WHEN v_bad[u.n] IS NULL AND v_pending[u.n] > 0 THEN 'infinity'::timestamptz
                    ELSE coalesce(u.at, now()) END,
               u.max_attempts,
               CASE WHEN u.tags IS NOT NULL
                    THEN ARRAY(SELECT jsonb_array_elements_text(u.tags)) END,
               u.meta,
               CASE WHEN v_bad[u.n] IS NULL THEN 'todo' ELSE 'cancelled' END,
               CASE WHEN v_bad[u.n] IS NOT NULL THEN now() END,
               CASE WHEN v_bad[u.n] IS NOT NULL THEN jsonb_build_array(jsonb_build_object(
                   'attempt', 0, 'at', now(),
                   'error', format('not run: job %s, which it was to run after, had ended %s when it was deferred',
                                   v_bad[u.n], v_bad_status[u.n]))) END,
               v_has[u.n], u.expires_at
          FROM unnest(p_queue, p_task, p_args, p_priority, p_lock, p_queueing_lock, p_at,
                      p_max_attempts, p_tags, p_meta, p_expires_at)
               WITH ORDINALITY AS u(queue, task, args, priority, lock, queueing_lock, at,
                                    max_attempts, tags, meta, expires_at, n)
         ORDER BY u.n
        RETURNING id
    )
    -- Ids are drawn in insertion order: the k-th smallest is the k-th job's.
    SELECT array_agg(ins.id ORDER BY ins.id) INTO v_ids FROM ins;

    INSERT INTO postpone_deps (job_id, dep_id, any_outcome, outcome)
    SELECT v_ids[e.j], e.d, bool_and(coalesce(e.a, false)),
           CASE WHEN f.status NOT IN ('todo', 'doing') THEN f.status END
      FROM unnest(p_edge_job, p_edge_dep, p_edge_any) AS e(j, d, a)
      JOIN unnest(v_found, v_status) AS f(id, status) ON f.id = e.d
     GROUP BY e.j, e.d, f.status;

    INSERT INTO postpone_deps_waiting (job_id, pending, due_at)
    SELECT v_ids[g.n], v_pending[g.n], coalesce(p_at[g.n], now())
      FROM generate_series(1, v_n) AS g(n)
     WHERE v_bad[g.n] IS NULL AND v_pending[g.n] > 0;

    RETURN QUERY SELECT x FROM unnest(v_ids) AS x;
END
$function$;

CREATE OR REPLACE FUNCTION postpone_defer_jobs(p_queue text[], p_task text[], p_args jsonb[], p_priority integer[], p_lock text[], p_queueing_lock text[], p_at timestamp with time zone[], p_max_attempts integer[], p_tags jsonb[], p_meta jsonb[], p_edge_job integer[], p_edge_dep bigint[], p_edge_any boolean[], p_expires_at timestamp with time zone[])
 RETURNS SETOF bigint
 LANGUAGE sql
AS $function$
    SELECT postpone_defer_jobs(p_queue, p_task, p_args::json[], p_priority, p_lock,
                               p_queueing_lock, p_at, p_max_attempts, p_tags, p_meta,
                               p_edge_job, p_edge_dep, p_edge_any, p_expires_at)
$function$;
