-- postpone schema, version 34: large values are compressed with lz4 where the server has it.
--
-- PostgreSQL compresses a value of more than about 2 KiB before it stores it out of line,
-- with pglz unless told otherwise. pglz is slow: a job's 64 KiB of arguments cost about
-- 1.1 ms of server CPU to compress at the defer (three quarters of the insert's time), and
-- arguments that do not compress by a quarter (hex or base64 text, already compressed data)
-- pay it for nothing, since pglz gives up only after reading the whole value. lz4 compresses
-- the same values in a fraction of that (64 inserts of 64 KiB, psql, this machine's server:
-- 111 ms -> 41 ms for hex text, 103 ms -> 58 ms for ordinary JSON records) and decompresses
-- them about 2.5 times faster at the claim, for values about 2% larger.
--
-- The columns that carry what users write: a job's arguments, output, progress, errors and
-- meta, and a stored schedule's arguments. Values already stored keep their compression
-- (PostgreSQL reads both); new and rewritten values use lz4. A server built without lz4
-- (or older than PostgreSQL 14, which has no per-column compression) keeps pglz: nothing
-- changes there. SET COMPRESSION changes only the column's description: the table is not
-- rewritten, and the lock it takes is held for a moment.

DO $$
BEGIN
    IF current_setting('server_version_num')::integer >= 140000
       AND EXISTS (SELECT 1 FROM pg_settings
                    WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))
    THEN
        EXECUTE 'ALTER TABLE postpone_jobs
                     ALTER COLUMN args SET COMPRESSION lz4,
                     ALTER COLUMN output SET COMPRESSION lz4,
                     ALTER COLUMN progress SET COMPRESSION lz4,
                     ALTER COLUMN errors SET COMPRESSION lz4,
                     ALTER COLUMN meta SET COMPRESSION lz4';
        EXECUTE 'ALTER TABLE postpone_schedules ALTER COLUMN args SET COMPRESSION lz4';
    END IF;
END
$$;
