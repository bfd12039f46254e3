-- postpone schema, version 39: a heartbeat at the end of time ends no statement.
--
-- postpone_lease_end added the lease (capped at 100 years) to the last heartbeat. A worker
-- row whose heartbeat was written by hand within 100 years of PostgreSQL's last time
-- (294276 AD) made that addition "timestamp out of range": the rescue's one DELETE of dead
-- workers failed for every row, so no dead worker's job was requeued any more, and the
-- workers listing and the stalled-jobs views failed with it. Such a lease now never ends
-- ('infinity'), which is what the addition meant.
--
-- Every statement here can run again on a schema that has it.

CREATE OR REPLACE FUNCTION postpone_lease_end(p_last_heartbeat timestamptz,
                                              p_stalled_after_ms bigint,
                                              p_unknown_ms bigint, p_at_least_ms bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_last_heartbeat > '294176-01-01 00:00:00+00'::timestamptz
                THEN 'infinity'::timestamptz
                ELSE p_last_heartbeat
                     + least(greatest(coalesce(p_stalled_after_ms,
                                               greatest(p_unknown_ms, 30000,
                                                        (SELECT max(w.stalled_after_ms)
                                                           FROM postpone_workers w))),
                                      p_at_least_ms, 0),
                             3155760000000) * interval '1 millisecond' END
$$;
