-- postpone schema, version 38: the claim plans its walk once per connection.
--
-- postpone_claim_jobs (four arguments) let PostgreSQL choose between a custom and a generic
-- plan for each of its statements. The walk (its LIMIT and bounds are variables) never got
-- the generic one: it was planned again at every claim, about 130 us of server CPU
-- (PostgreSQL 15, pg_stat_statements with track_planning, claims of one job). The function
-- now uses generic plans, as postpone_take_at and postpone_finish do. The plans are the same
-- walks: the function's settings rule out every scan but an index's, and since schema 36 a
-- named queue's walk can only be served by the index of the queues (`= ANY (ARRAY[v_q])`),
-- where before a generic plan could have read the index of every queue with a filter.

ALTER FUNCTION postpone_claim_jobs(bigint, integer, text[], text[])
    SET plan_cache_mode = force_generic_plan;
