-- postpone schema, version 43: one job of the expiry sweep cannot hold up the others.
--
-- postpone_expire (version 25) ends, in one statement, the waiting jobs whose deadline has
-- passed. Their rows are taken with SKIP LOCKED, but ending a job others wait for settles its
-- dependents in the same statement (postpone_deps_trigger), and a dependent held by another
-- session (an operator's open transaction) made the statement wait for it: the workers'
-- sweep waited until its io_timeout severed the connection, at every sweep (that job comes
-- first each time), so no other job expired, and the heartbeat and the outcomes, which share
-- the worker's connection, waited behind it. The sweep now waits at most 100 ms for a lock;
-- when a batch meets one it cannot get, its jobs are ended one at a time, each in a block of
-- its own, and those that need a held row are left for a later sweep.
--
-- Every statement here can run again on a schema that has it.

CREATE OR REPLACE FUNCTION postpone_expire(p_limit integer, p_from timestamptz)
RETURNS TABLE (ended integer, reached timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET lock_timeout = '100ms'
AS $$
DECLARE
    v_ended integer := 0;
    v_reached timestamptz;
    v_id bigint;
    v_at timestamptz;
BEGIN
    BEGIN
        WITH x AS (
            SELECT j.ctid AS t
              FROM postpone_jobs j
             WHERE j.status = 'todo' AND j.expires_at IS NOT NULL AND j.expires_at <= now()
               AND j.expires_at >= coalesce(p_from, '-infinity')
             ORDER BY j.expires_at
             LIMIT greatest(p_limit, 0)
               FOR UPDATE SKIP LOCKED
        ), done AS (
            UPDATE postpone_jobs j
               SET status = 'cancelled', finished_at = now(), expired = true,
                   errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                       'attempt', j.attempts, 'at', now(),
                       'error', postpone_expiry_text(j.expires_at, NULL)))
              FROM x
             WHERE j.ctid = x.t AND j.status = 'todo'
            RETURNING j.expires_at
        )
        SELECT count(*)::integer, max(done.expires_at) INTO v_ended, v_reached FROM done;
    EXCEPTION WHEN lock_not_available THEN
        v_ended := 0;
        v_reached := NULL;
        FOR v_id, v_at IN
            SELECT j.id, j.expires_at
              FROM postpone_jobs j
             WHERE j.status = 'todo' AND j.expires_at IS NOT NULL AND j.expires_at <= now()
               AND j.expires_at >= coalesce(p_from, '-infinity')
             ORDER BY j.expires_at
             LIMIT greatest(p_limit, 0)
               FOR UPDATE SKIP LOCKED
        LOOP
            BEGIN
                UPDATE postpone_jobs j
                   SET status = 'cancelled', finished_at = now(), expired = true,
                       errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                           'attempt', j.attempts, 'at', now(),
                           'error', postpone_expiry_text(j.expires_at, NULL)))
                 WHERE j.id = v_id AND j.status = 'todo';
                IF FOUND THEN
                    v_ended := v_ended + 1;
                    v_reached := greatest(v_reached, v_at);
                END IF;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END LOOP;
    END;
    RETURN QUERY SELECT v_ended, v_reached;
END
$$;
