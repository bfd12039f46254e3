-- postpone schema, version 24: batches.
--
-- A batch is a group of jobs with up to two callbacks, each a job of its own: `on_complete`
-- runs once every job of the batch has finished, whatever its outcome; `on_success` once
-- every one has succeeded (it ends `cancelled`, with an error naming the job, as soon as one
-- ends failed, cancelled or aborted). A callback is a dependent of version 23: it waits
-- (`after_finished` for on_complete, `after` for on_success) on every job of the batch, and
-- the dependency triggers release or cancel it in the statement that records the last
-- outcome. Nothing else runs on a job's claim or finish.
--
-- * `postpone_jobs.batch_id`: the batch of a job (and of its callbacks), NULL for every job
--   outside one. Nullable without a default: adding it rewrites nothing. Its index is
--   partial, so jobs outside a batch have no entry in it, and it names no column a claim or
--   a finish changes (their updates stay HOT as before).
-- * `postpone_batches`: one row per batch: how many jobs were ever added (so a job deleted
--   by retention or `DeleteJobs` still counts), and its callbacks' ids.
-- * Adding jobs to a batch that runs (postpone_batch_join) locks the batch's row, then the
--   waits of its callbacks that still wait (postpone_deps_waiting, in id order, as
--   postpone_deps_settle does), adds an edge from each to every new job and counts them in.
--   A batch job finishing meanwhile either settled first (its count is read after it
--   committed; a callback it released is no longer waiting, and the add is refused if the
--   batch has nothing left running) or waits for the add to commit and reads its count.
--
-- postpone_deps_settle (of version 23) finds the edges of the finished jobs through the index
-- on dep_id whatever plan PostgreSQL caches for it: a fan-in of thousands of jobs scanned
-- every edge for each outcome before.
--
-- Only additions: a column without a default, an index, a table and a function; and
-- postpone_deps_settle redefined.

ALTER TABLE postpone_jobs ADD COLUMN IF NOT EXISTS batch_id bigint;
-- The jobs of a batch (its progress, one index scan); no entry for other jobs.
CREATE INDEX IF NOT EXISTS postpone_jobs_batch_idx ON postpone_jobs (batch_id)
    WHERE batch_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS postpone_batches (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Jobs added, ever (callbacks not counted).
    total       bigint      NOT NULL DEFAULT 0,
    on_complete bigint,
    on_success  bigint
);

-- Adds jobs `p_ids` (inserted by the caller in this transaction) to batch `p_batch`: they
-- get its id, the callbacks still waiting wait for them too, and the batch's total counts
-- them. A job among them that is already final (inserted `cancelled` because a dependency
-- of its own had ended badly) counts at once, as a dependency that finished.
--
-- Refused (object_not_in_prerequisite_state, nothing changed) when the batch is finished:
-- no callback of it waits and no job of it is still to run, so nothing would wait for the
-- new jobs. From inside a running job of the batch this never happens: the callbacks wait
-- for that job. An unknown batch raises foreign_key_violation (constraint
-- postpone_batches_batch).
CREATE OR REPLACE FUNCTION postpone_batch_join(p_batch bigint, p_ids bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[] := ARRAY(SELECT DISTINCT x FROM unnest(p_ids) AS x WHERE x IS NOT NULL);
    v_n integer;
    v_complete bigint;
    v_success bigint;
    v_callbacks bigint[];
    v_waiting bigint[];
    v_final bigint[];
    v_final_status text[];
    v_why text;
BEGIN
    v_n := cardinality(v_ids);
    SELECT b.on_complete, b.on_success INTO v_complete, v_success
      FROM postpone_batches b WHERE b.id = p_batch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'batch % does not exist', p_batch
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'postpone_batches_batch',
                  HINT = 'name a batch id returned by a batch defer';
    END IF;
    v_callbacks := array_remove(ARRAY[v_complete, v_success], NULL);

    -- The callbacks still waiting, locked as postpone_deps_settle locks them.
    v_waiting := ARRAY(SELECT w.job_id FROM postpone_deps_waiting w
                        WHERE w.job_id = ANY(v_callbacks) ORDER BY w.job_id FOR UPDATE);

    IF cardinality(v_waiting) = 0 AND NOT EXISTS (
        SELECT 1 FROM postpone_jobs j
         WHERE j.batch_id = p_batch AND j.status IN ('todo', 'doing')
           AND j.id <> ALL(v_callbacks) AND j.id <> ALL(v_ids)) THEN
        SELECT string_agg(format('%s job %s is %s',
                                 CASE WHEN j.id = v_complete THEN 'on_complete' ELSE 'on_success' END,
                                 j.id,
                                 CASE WHEN j.status = 'doing' AND j.started_at IS NULL THEN 'todo'
                                      ELSE j.status END), ', ' ORDER BY j.id)
          INTO v_why
          FROM postpone_jobs j WHERE j.id = ANY(v_callbacks);
        RAISE EXCEPTION 'batch % is finished: every job of it has finished%; nothing would wait for new jobs',
            p_batch, CASE WHEN v_why IS NULL THEN '' ELSE ' and its callbacks were released (' || v_why || ')' END
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'add jobs to a batch from one of its running jobs, or before its last job ends; or start a new batch';
    END IF;

    UPDATE postpone_jobs j
       SET batch_id = p_batch,
           has_dependents = j.has_dependents OR cardinality(v_waiting) > 0
     WHERE j.id = ANY(v_ids);

    IF cardinality(v_waiting) > 0 AND v_n > 0 THEN
        INSERT INTO postpone_deps (job_id, dep_id, any_outcome)
        SELECT w, d, w IS NOT DISTINCT FROM v_complete
          FROM unnest(v_waiting) AS w, unnest(v_ids) AS d
        ON CONFLICT DO NOTHING;
        UPDATE postpone_deps_waiting SET pending = pending + v_n
         WHERE job_id = ANY(v_waiting);
        -- Jobs final already (inserted cancelled) count now.
        SELECT array_agg(j.id ORDER BY j.id), array_agg(j.status ORDER BY j.id)
          INTO v_final, v_final_status
          FROM postpone_jobs j
         WHERE j.id = ANY(v_ids) AND j.status NOT IN ('todo', 'doing');
        IF v_final IS NOT NULL THEN
            PERFORM postpone_deps_settle(v_final, v_final_status);
        END IF;
    END IF;

    UPDATE postpone_batches SET total = total + v_n WHERE id = p_batch;
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
        -- Found through the index on dep_id whatever the plan: a join with unnest() got a
        -- generic plan that scanned every edge for each outcome (a batch of 10,000 jobs
        -- then never finished in 10 minutes).
        WITH e AS (
            UPDATE postpone_deps d
               SET outcome = v_outcomes[array_position(v_ids, d.dep_id)]
             WHERE d.dep_id = ANY(v_ids) AND d.outcome IS NULL
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
