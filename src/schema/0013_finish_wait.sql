-- postpone schema, version 13: the recording of outcomes waits at most 200 ms for a job row
-- another session holds locked.
--
-- A worker records the outcomes of finished jobs in batches (postpone_finish). When one of
-- those rows was locked by another session (an operator's transaction left open in psql, a
-- trigger of the application's own taking the row), the whole statement waited for it, and
-- every outcome of the batch, and every batch after it, waited too: the worker's jobs stayed
-- `doing` until the other transaction ended. With a lock timeout the statement fails with
-- lock_not_available (55P03) instead; the worker splits the batch until the locked row is
-- alone, records the others, and tries that one again later (100 ms, doubling to 5 s).
--
-- The setting is the function's own, for the duration of the call: it replaces whatever
-- lock_timeout the session has while the function runs, and the session's own returns after.
-- The claim takes no row another session holds (SKIP LOCKED) and needs none.

ALTER FUNCTION postpone_finish(bigint[], bigint[], integer[], text[], text[], jsonb[])
    SET lock_timeout = '200ms';
