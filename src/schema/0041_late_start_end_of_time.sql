-- postpone schema, version 41: a deadline in the last second of time fails no statement.
--
-- postpone_started_late (version 25) compared a held job's start with its deadline plus a
-- second. A deadline within a second of PostgreSQL's last time (294276 AD; `postpone_defer`
-- takes any finite time) made that addition "timestamp out of range", which failed the
-- statement recording the job's outcome (its worker then failed the job, although its task
-- had succeeded) and the batch of starts written with it. The second is now taken off the
-- start instead, which cannot leave the range; a deadline that is not finite (written by
-- hand) is never started late.
--
-- Every statement here can run again on a schema that has it.

CREATE OR REPLACE FUNCTION postpone_started_late(p_expires_at timestamptz,
                                                 p_started_at timestamptz, p_ran_us bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p_started_at IS NULL AND p_ran_us IS NOT NULL AND isfinite(p_expires_at)
                    AND now() - least(greatest(p_ran_us, 0), 3155760000000000)
                                * interval '1 microsecond' - interval '1 second'
                        > p_expires_at, false)
$$;
