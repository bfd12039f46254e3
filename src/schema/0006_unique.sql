-- postpone schema, version 6: unique jobs beyond the queueing lock.
--
-- A unique job carries a key computed at defer time (postpone_unique_key) from its task, its
-- arguments (as jsonb text, so key order does not matter), optionally its queue, and
-- optionally the period bucket of its scheduled time. The first letters of the key name the
-- states in which it blocks a duplicate:
--   'r:'  waiting or running: unique among `todo` and `doing` jobs;
--   's:'  waiting, running or succeeded: unique among `todo`, `doing` and `succeeded` jobs.
-- Waiting-only keys ('w:') are stored in `queueing_lock` instead: that is exactly the
-- queueing lock's promise, and postpone_requeue already supersedes a requeued job whose
-- queueing lock is taken.
--
-- Why a requeue cannot fail on these indexes: every way back to `todo` is postpone_requeue.
-- From `doing` (retry, release, rescue, retire) a job stays inside both predicates. From a
-- finished state (an operator's retry) it may enter one; a collision there is caught by
-- postpone_requeue for that job alone and reported as 'collision', the job left as it was.
--
-- Only additions: a nullable column (no rewrite) and indexes. Workers of version 5 keep
-- working (they never read the column).

ALTER TABLE postpone_jobs ADD COLUMN unique_key text;

CREATE UNIQUE INDEX postpone_jobs_unique_active_idx ON postpone_jobs (unique_key)
    WHERE status IN ('todo', 'doing') AND unique_key IS NOT NULL;
CREATE UNIQUE INDEX postpone_jobs_unique_succeeded_idx ON postpone_jobs (unique_key)
    WHERE status IN ('todo', 'doing', 'succeeded') AND unique_key LIKE 's:%';

-- The key of a unique job: NULL when p_scope is NULL. p_queue is NULL unless the queue is
-- part of the key; p_period_us NULL unless a period is (then the bucket of p_at is).
CREATE FUNCTION postpone_unique_key(p_scope text, p_task text, p_queue text, p_args jsonb,
                                    p_period_us bigint, p_at timestamptz)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_scope IS NULL THEN NULL ELSE
        p_scope || ':' || md5(concat_ws(E'\x1f', p_task,
            CASE WHEN p_queue IS NULL THEN '*' ELSE 'q=' || p_queue END,
            p_args::text,
            CASE WHEN p_period_us IS NULL THEN '*' ELSE
                p_period_us::text || '@'
                || floor(extract(epoch FROM p_at) * 1000000 / p_period_us)::text END))
    END
$$;
