-- postpone schema, version 23: job dependencies.
--
-- A job deferred `after` other jobs runs once every one of them has succeeded; `after_finished`,
-- once every one of them has finished, whatever its outcome. If a dependency of `after` ends
-- failed, cancelled or aborted (or is deleted before it ran), the dependent ends `cancelled`
-- with an error naming it, and so do its own dependents in turn.
--
-- How it is kept, and what it costs the jobs without dependencies:
--
-- * A dependent that has to wait is an ordinary `todo` job whose `scheduled_at` is
--   'infinity': the claim, which stops at the first job not due, never reaches it, and
--   nothing in the claim changed. Its own due time waits in postpone_deps_waiting with the
--   number of its dependencies that have not finished.
-- * postpone_deps holds one row per (dependent, dependency), with the dependency's outcome
--   once it is known (so a dependency deleted afterwards, by retention or
--   `DeleteJobs`, has still been counted).
-- * A job that others wait for has `has_dependents` set, by the defer that named it. Row
--   triggers whose WHEN clause reads that flag (or `has_dependencies`, set on dependents)
--   release or cancel the dependents in the very statement that records the dependency's
--   outcome, whoever writes it (a worker, an operator, a rescue, SQL by hand). For every
--   other row PostgreSQL evaluates the WHEN clause and queues nothing: no trigger function
--   runs, no row is read or locked.
-- * The race between a defer naming a job and that job finishing: the defer locks the rows
--   of its dependencies (FOR NO KEY UPDATE, in id order) before reading their status. A
--   dependency finishing meanwhile either committed first (the defer sees its outcome and
--   counts it at once) or waits for the defer to commit (its trigger then sees the
--   dependent's rows). A dependency must exist when it is named, so there can be no cycle.
--
-- Only additions: two columns with constant defaults (no table rewrite), two tables, functions
-- and triggers. Workers of earlier versions keep working (they never set the flags).

ALTER TABLE postpone_jobs
    ADD COLUMN IF NOT EXISTS has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS has_dependencies boolean NOT NULL DEFAULT false;

-- One row per dependency of a job. `any_outcome`: after_finished (any final status will do);
-- otherwise the dependency must succeed. `outcome`: the dependency's final status once it
-- has one ('deleted' for a job deleted before it finished), NULL until then.
CREATE TABLE IF NOT EXISTS postpone_deps (
    job_id      bigint  NOT NULL,
    dep_id      bigint  NOT NULL,
    any_outcome boolean NOT NULL,
    outcome     text,
    PRIMARY KEY (job_id, dep_id)
);
-- The dependents of a job (its trigger, the job page).
CREATE INDEX IF NOT EXISTS postpone_deps_dep_idx ON postpone_deps (dep_id);

-- The dependents that wait: how many of their dependencies have not finished yet, and when
-- they are due once none is left (their own schedule: `scheduled_at` holds 'infinity'
-- meanwhile). A dependent leaves this table when it is released or cancelled.
CREATE TABLE IF NOT EXISTS postpone_deps_waiting (
    job_id  bigint      PRIMARY KEY,
    pending integer     NOT NULL,
    due_at  timestamptz NOT NULL
);

-- Defers jobs with dependencies, in one statement (postpone_defer and the library call it;
-- jobs without dependencies are inserted as before). The job arrays are aligned by position
-- (1-based), as the library's batch insert: queue, task, args, priority, lock, queueing
-- lock, due time (NULL: now), attempt limit, tags (a JSON array of texts, or NULL), meta.
-- The edge arrays are aligned with each other: the position of the dependent, the id of its
-- dependency, and whether any outcome will do (after_finished) or it must succeed (after).
-- A job named twice counts once, as `after` if either says so.
--
-- Every dependency must exist: an unknown id (never deferred, or deleted) raises
-- foreign_key_violation naming it (constraint postpone_deps_dependency), and nothing is
-- inserted. A dependency that already finished counts at once: a job whose dependencies
-- have all finished as it needs is due as it would be without them; one whose `after`
-- dependency ended failed, cancelled or aborted is inserted `cancelled`, with the error.
-- Returns the ids in input order.
CREATE OR REPLACE FUNCTION postpone_defer_jobs(
    p_queue text[], p_task text[], p_args jsonb[], p_priority integer[], p_lock text[],
    p_queueing_lock text[], p_at timestamptz[], p_max_attempts integer[], p_tags jsonb[],
    p_meta jsonb[], p_edge_job integer[], p_edge_dep bigint[], p_edge_any boolean[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
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
                                   finished_at, errors, has_dependencies)
        SELECT u.queue, u.task, coalesce(u.args, 'null'::jsonb), coalesce(u.priority, 0),
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
               v_has[u.n]
          FROM unnest(p_queue, p_task, p_args, p_priority, p_lock, p_queueing_lock, p_at,
                      p_max_attempts, p_tags, p_meta)
               WITH ORDINALITY AS u(queue, task, args, priority, lock, queueing_lock, at,
                                    max_attempts, tags, meta, n)
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
$$;
-- Records that jobs `p_ids` finished with `p_outcomes` (a final status, or 'deleted' for a
-- job deleted before it finished) for the jobs that depend on them: each open edge gets its
-- outcome; a waiting dependent whose `after` dependency ended badly is cancelled, with an
-- error naming it; one with no dependency left is released (due at its own time, or now if
-- that has passed, and its queue's workers woken). A dependent cancelled here counts in turn
-- as a dependency that ended `cancelled`, in the same call, so a chain of any length is
-- settled by one loop, never by nested triggers.
--
-- Waiting dependents are locked in id order (postpone_deps_waiting), so that two statements
-- settling dependencies of the same dependents take turns instead of missing each other's
-- outcome: the second one reads the first one's count once it committed.
--
-- Its own updates of the dependents run with `postpone.deps_settling` on (for this
-- transaction, and put back before it returns): the triggers they fire then leave the work to
-- this loop.
CREATE OR REPLACE FUNCTION postpone_deps_settle(p_ids bigint[], p_outcomes text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[] := p_ids;
    v_outcomes text[] := p_outcomes;
    v_jobs bigint[];
    v_ns integer[];
    v_bads bigint[];
    v_bad_outcomes text[];
    v_done bigint[];
    v_due timestamptz[];
    v_done_bad bigint[];
    v_done_outcome text[];
    v_rounds integer := 0;
    q text;
    v_now boolean;
    v_at timestamptz;
BEGIN
    WHILE coalesce(cardinality(v_ids), 0) > 0 LOOP
        v_rounds := v_rounds + 1;
        -- Each open edge of these dependencies gets its outcome.
        WITH e AS (
            UPDATE postpone_deps d SET outcome = u.outcome
              FROM unnest(v_ids, v_outcomes) AS u(id, outcome)
             WHERE d.dep_id = u.id AND d.outcome IS NULL
            RETURNING d.job_id, d.dep_id, d.any_outcome, d.outcome
        ), x AS (
            SELECT e.job_id, count(*)::integer AS n,
                   (array_agg(e.dep_id ORDER BY e.dep_id)
                        FILTER (WHERE NOT e.any_outcome AND e.outcome <> 'succeeded'))[1] AS bad,
                   (array_agg(e.outcome ORDER BY e.dep_id)
                        FILTER (WHERE NOT e.any_outcome AND e.outcome <> 'succeeded'))[1] AS bad_outcome
              FROM e GROUP BY e.job_id
        )
        SELECT coalesce(array_agg(x.job_id ORDER BY x.job_id), '{}'),
               coalesce(array_agg(x.n ORDER BY x.job_id), '{}'),
               coalesce(array_agg(x.bad ORDER BY x.job_id), '{}'),
               coalesce(array_agg(x.bad_outcome ORDER BY x.job_id), '{}')
          INTO v_jobs, v_ns, v_bads, v_bad_outcomes
          FROM x;
        EXIT WHEN cardinality(v_jobs) = 0;

        -- Their waits, locked in id order, then counted down; those done waiting leave.
        PERFORM 1 FROM postpone_deps_waiting w
          WHERE w.job_id = ANY(v_jobs) ORDER BY w.job_id FOR UPDATE;
        WITH gone AS (
            DELETE FROM postpone_deps_waiting w
             USING unnest(v_jobs, v_ns, v_bads, v_bad_outcomes) AS x(job_id, n, bad, bad_outcome)
             WHERE w.job_id = x.job_id AND (x.bad IS NOT NULL OR w.pending <= x.n)
            RETURNING w.job_id, w.due_at, x.bad, x.bad_outcome
        )
        SELECT coalesce(array_agg(gone.job_id), '{}'), coalesce(array_agg(gone.due_at), '{}'),
               coalesce(array_agg(gone.bad), '{}'), coalesce(array_agg(gone.bad_outcome), '{}')
          INTO v_done, v_due, v_done_bad, v_done_outcome
          FROM gone;
        UPDATE postpone_deps_waiting w SET pending = w.pending - x.n
          FROM unnest(v_jobs, v_ns) AS x(job_id, n)
         WHERE w.job_id = x.job_id;

        v_ids := '{}';
        v_outcomes := '{}';
        EXIT WHEN cardinality(v_done) = 0;
        PERFORM set_config('postpone.deps_settling', 'on', true);
        -- A dependency they needed ended badly: cancelled, and their own dependents are
        -- settled in the next round.
        WITH c AS (
            UPDATE postpone_jobs j
               SET status = 'cancelled', finished_at = now(), scheduled_at = d.due_at,
                   errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                       'attempt', j.attempts, 'at', now(),
                       'error', format('not run: job %s, which it was to run after, %s', d.bad,
                                       CASE WHEN d.outcome = 'deleted'
                                            THEN 'was deleted before it finished'
                                            ELSE 'ended ' || d.outcome END)))
              FROM unnest(v_done, v_due, v_done_bad, v_done_outcome) AS d(id, due_at, bad, outcome)
             WHERE j.id = d.id AND d.bad IS NOT NULL AND j.status = 'todo'
            RETURNING j.id, j.has_dependents
        )
        SELECT coalesce(array_agg(c.id) FILTER (WHERE c.has_dependents), '{}')
          INTO v_ids FROM c;
        v_outcomes := array_fill('cancelled'::text, ARRAY[cardinality(v_ids)]);
        -- Nothing left to wait for: due at their own time, or now if it has passed.
        FOR q, v_now, v_at IN
            WITH r AS (
                UPDATE postpone_jobs j SET scheduled_at = greatest(d.due_at, now())
                  FROM unnest(v_done, v_due, v_done_bad) AS d(id, due_at, bad)
                 WHERE j.id = d.id AND d.bad IS NULL AND j.status = 'todo'
                   AND j.scheduled_at = 'infinity'
                RETURNING j.queue, j.scheduled_at
            )
            SELECT r.queue, bool_or(r.scheduled_at <= now()),
                   min(r.scheduled_at) FILTER (WHERE r.scheduled_at > now())
              FROM r GROUP BY r.queue
        LOOP
            IF v_now THEN
                PERFORM postpone_wake(q);
            END IF;
            IF v_at IS NOT NULL THEN
                PERFORM postpone_wake_at(q, v_at);
            END IF;
        END LOOP;
        PERFORM set_config('postpone.deps_settling', 'off', true);
    END LOOP;
END
$$;

-- The triggers' function. For a job others wait for that reached a final status, or was
-- deleted before it did (a running job deleted is a worker's `DeleteJobs` recording its
-- end: it counts as succeeded, the outcome the row last had being lost), the dependents are
-- settled. For a dependent:
--   * deleted: its edges and wait go with it;
--   * leaving its wait other than by being released (an operator's cancel or abort): its
--     wait is dropped, and it keeps its own schedule for display;
--   * rescheduled while it waits (an operator's reschedule): it keeps waiting, and the new
--     time becomes its due time once released;
--   * put back to `todo` from a final status (an operator's retry): its dependencies are
--     judged again as at a defer. One that must succeed and ended badly refuses the retry
--     (the error names it: retry that job first, or both together); unfinished ones make it
--     wait again.
-- Does nothing while postpone_deps_settle updates the dependents itself.
CREATE OR REPLACE FUNCTION postpone_deps_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[];
    v_status text[];
    v_bad bigint;
    v_bad_outcome text;
    v_pending integer;
    v_due timestamptz;
BEGIN
    IF current_setting('postpone.deps_settling', true) = 'on' THEN
        RETURN NULL;
    END IF;

    IF TG_OP = 'DELETE' THEN
        IF OLD.has_dependencies THEN
            DELETE FROM postpone_deps WHERE job_id = OLD.id;
            DELETE FROM postpone_deps_waiting WHERE job_id = OLD.id;
        END IF;
        IF OLD.has_dependents AND OLD.status IN ('todo', 'doing') THEN
            PERFORM postpone_deps_settle(ARRAY[OLD.id],
                ARRAY[CASE WHEN OLD.status = 'doing' THEN 'succeeded' ELSE 'deleted' END]);
        END IF;
        RETURN NULL;
    END IF;

    -- A job others wait for reached a final status.
    IF OLD.has_dependents AND OLD.status IN ('todo', 'doing')
       AND NEW.status NOT IN ('todo', 'doing') THEN
        PERFORM postpone_deps_settle(ARRAY[NEW.id], ARRAY[NEW.status]);
    END IF;

    IF NOT NEW.has_dependencies THEN
        RETURN NULL;
    END IF;
    IF OLD.status = 'todo' AND OLD.scheduled_at = 'infinity' THEN
        IF NEW.status <> 'todo' THEN
            -- Cancelled or aborted while it waited.
            DELETE FROM postpone_deps_waiting WHERE job_id = NEW.id RETURNING due_at INTO v_due;
            IF FOUND AND NEW.scheduled_at = 'infinity' THEN
                PERFORM set_config('postpone.deps_settling', 'on', true);
                UPDATE postpone_jobs SET scheduled_at = v_due WHERE id = NEW.id;
                PERFORM set_config('postpone.deps_settling', 'off', true);
            END IF;
        ELSIF NEW.scheduled_at <> 'infinity' THEN
            -- Rescheduled while it waits.
            UPDATE postpone_deps_waiting SET due_at = NEW.scheduled_at WHERE job_id = NEW.id;
            IF FOUND THEN
                PERFORM set_config('postpone.deps_settling', 'on', true);
                UPDATE postpone_jobs SET scheduled_at = 'infinity' WHERE id = NEW.id;
                PERFORM set_config('postpone.deps_settling', 'off', true);
            END IF;
        END IF;
        RETURN NULL;
    END IF;

    IF OLD.status IN ('succeeded', 'failed', 'cancelled', 'aborted') AND NEW.status = 'todo' THEN
        -- Retried: its dependencies locked (as at a defer) and read again.
        SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}'),
               coalesce(array_agg(x.status ORDER BY x.id), '{}')
          INTO v_found, v_status
          FROM (SELECT j.id, j.status FROM postpone_jobs j
                 WHERE j.id IN (SELECT d.dep_id FROM postpone_deps d WHERE d.job_id = NEW.id)
                 ORDER BY j.id FOR NO KEY UPDATE) x;
        WITH now_is AS (
            SELECT d.dep_id, d.any_outcome,
                   CASE WHEN f.id IS NULL THEN coalesce(d.outcome, 'deleted')
                        WHEN f.status IN ('todo', 'doing') THEN NULL
                        ELSE f.status END AS outcome
              FROM postpone_deps d
              LEFT JOIN unnest(v_found, v_status) AS f(id, status) ON f.id = d.dep_id
             WHERE d.job_id = NEW.id
        )
        SELECT (array_agg(n.dep_id ORDER BY n.dep_id)
                    FILTER (WHERE NOT n.any_outcome AND n.outcome <> 'succeeded'))[1],
               (array_agg(n.outcome ORDER BY n.dep_id)
                    FILTER (WHERE NOT n.any_outcome AND n.outcome <> 'succeeded'))[1],
               count(*) FILTER (WHERE n.outcome IS NULL)
          INTO v_bad, v_bad_outcome, v_pending
          FROM now_is n;
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION 'job % cannot run: job %, which it is to run after, %; retry that job first (or both together)',
                NEW.id, v_bad,
                CASE WHEN v_bad_outcome = 'deleted' THEN 'was deleted before it finished'
                     ELSE 'ended ' || v_bad_outcome END
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        UPDATE postpone_deps d
           SET outcome = CASE WHEN f.status IN ('todo', 'doing') THEN NULL ELSE f.status END
          FROM unnest(v_found, v_status) AS f(id, status)
         WHERE d.job_id = NEW.id AND d.dep_id = f.id
           AND d.outcome IS DISTINCT FROM
               CASE WHEN f.status IN ('todo', 'doing') THEN NULL ELSE f.status END;
        IF v_pending > 0 THEN
            UPDATE postpone_jobs j SET has_dependents = true
             WHERE j.id = ANY(v_found) AND j.status IN ('todo', 'doing') AND NOT j.has_dependents;
            INSERT INTO postpone_deps_waiting (job_id, pending, due_at)
            VALUES (NEW.id, v_pending, NEW.scheduled_at)
            ON CONFLICT (job_id) DO UPDATE SET pending = EXCLUDED.pending,
                                               due_at = EXCLUDED.due_at;
            PERFORM set_config('postpone.deps_settling', 'on', true);
            UPDATE postpone_jobs SET scheduled_at = 'infinity' WHERE id = NEW.id;
            PERFORM set_config('postpone.deps_settling', 'off', true);
        ELSE
            DELETE FROM postpone_deps_waiting WHERE job_id = NEW.id;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- Fired only for rows whose flags say they take part: for every other row PostgreSQL
-- evaluates the WHEN clause (and, for the updates, only when the statement sets `status` or
-- `scheduled_at`) and queues nothing.
DROP TRIGGER IF EXISTS postpone_jobs_deps ON postpone_jobs;
CREATE TRIGGER postpone_jobs_deps AFTER UPDATE OF status, scheduled_at ON postpone_jobs
    FOR EACH ROW
    WHEN ((OLD.has_dependents AND OLD.status IN ('todo', 'doing')
           AND NEW.status NOT IN ('todo', 'doing'))
          OR (NEW.has_dependencies
              AND ((OLD.status = 'todo' AND OLD.scheduled_at = 'infinity'
                    AND (NEW.status <> 'todo' OR NEW.scheduled_at <> 'infinity'))
                   OR (OLD.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
                       AND NEW.status = 'todo'))))
    EXECUTE FUNCTION postpone_deps_trigger();

DROP TRIGGER IF EXISTS postpone_jobs_deps_delete ON postpone_jobs;
CREATE TRIGGER postpone_jobs_deps_delete AFTER DELETE ON postpone_jobs
    FOR EACH ROW
    WHEN (OLD.has_dependencies OR (OLD.has_dependents AND OLD.status IN ('todo', 'doing')))
    EXECUTE FUNCTION postpone_deps_trigger();

-- postpone_defer of version 4, with dependencies: `after` (jobs that must have succeeded)
-- and `after_finished` (jobs that must have finished, whatever their outcome), arrays of
-- job ids, both optional:
--   SELECT postpone_defer('report', after => ARRAY[41, 42]::bigint[]);
-- Without them the job is inserted as before; with them, through postpone_defer_jobs (whose
-- comment says what is checked and counted at once). The old signature goes: a second one
-- with defaults would make every call ambiguous.
DROP FUNCTION IF EXISTS postpone_defer(text, jsonb, text, integer, text, text, timestamptz,
                                       interval);
CREATE OR REPLACE FUNCTION postpone_defer(
    task           text,
    args           jsonb       DEFAULT 'null',
    queue          text        DEFAULT 'default',
    priority       integer     DEFAULT 0,
    lock           text        DEFAULT NULL,
    queueing_lock  text        DEFAULT NULL,
    scheduled_at   timestamptz DEFAULT NULL,
    schedule_in    interval    DEFAULT NULL,
    after          bigint[]    DEFAULT NULL,
    after_finished bigint[]    DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
    v_at timestamptz;
    v_deps bigint[];
    v_any boolean[];
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
    IF array_position(postpone_defer.after, NULL) IS NOT NULL
       OR array_position(postpone_defer.after_finished, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'postpone_defer: after and after_finished must not hold NULL (job ids only)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_at := coalesce(postpone_defer.scheduled_at,
                     now() + coalesce(postpone_defer.schedule_in, interval '0'));
    IF coalesce(cardinality(postpone_defer.after), 0) = 0
       AND coalesce(cardinality(postpone_defer.after_finished), 0) = 0 THEN
        INSERT INTO postpone_jobs (queue, task, args, priority, lock, queueing_lock, scheduled_at)
        VALUES (postpone_defer.queue, postpone_defer.task,
                coalesce(postpone_defer.args, 'null'::jsonb),
                coalesce(postpone_defer.priority, 0),
                postpone_defer.lock, postpone_defer.queueing_lock, v_at)
        RETURNING id INTO new_id;
        RETURN new_id;
    END IF;
    v_deps := coalesce(postpone_defer.after, '{}') || coalesce(postpone_defer.after_finished, '{}');
    v_any := array_fill(false, ARRAY[coalesce(cardinality(postpone_defer.after), 0)])
             || array_fill(true, ARRAY[coalesce(cardinality(postpone_defer.after_finished), 0)]);
    SELECT x INTO new_id
      FROM postpone_defer_jobs(
               ARRAY[postpone_defer.queue], ARRAY[postpone_defer.task],
               ARRAY[coalesce(postpone_defer.args, 'null'::jsonb)],
               ARRAY[coalesce(postpone_defer.priority, 0)],
               ARRAY[postpone_defer.lock], ARRAY[postpone_defer.queueing_lock], ARRAY[v_at],
               ARRAY[NULL::integer], ARRAY[NULL::jsonb], ARRAY[NULL::jsonb],
               array_fill(1, ARRAY[cardinality(v_deps)]), v_deps, v_any) AS x;
    RETURN new_id;
END
$$;
