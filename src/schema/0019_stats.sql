-- postpone schema, version 19: a bounded history of finished jobs, for the dashboard's
-- charts (throughput per queue and outcome, wait before start), kept in the database.
--
-- postpone_stats holds, per minute (for the last 2 hours) and per hour (for the last 8
-- days), queue, outcome and shard, how many jobs finished and a histogram of how long they
-- waited between being due and starting (started_at - scheduled_at of their last attempt):
-- 24 buckets w0..w23, w0 under a millisecond, wb from 2^(b-1) to 2^b ms, w23 from about 70
-- minutes on. Histograms add, so any range's p50 and p99 come from the sum of its rows (to
-- within a factor of 2). The buckets are columns, not an array, so that a statement adds
-- them with plain arithmetic (an array cost about as much again as the rest, measured).
--
-- It is written by a statement trigger on postpone_jobs: one upsert per statement that
-- finishes jobs, whatever their number (never a statement per job), nothing but a look at
-- the statement's rows for other statements (a claim, a heartbeat). A statement that
-- deletes running jobs (a worker finishing with `DeleteJobs::Always`) counts them as
-- succeeded. The shard (the backend's pid modulo 4) keeps workers that finish jobs of one
-- queue at the same moment from waiting for each other's row lock; rows are upserted in
-- key order, so two statements never lock two rows in opposite orders. The first statement
-- of a new hour prunes what is past its span, so the table holds at most (120 + 192) x 4
-- rows per queue and outcome.
--
-- Every statement here can run again on a schema that has it (a record of this migration
-- deleted by hand, say). Nothing here can fail the statement it rides on: infinite or missing times give no wait
-- (the job is counted, its wait is not), and the arithmetic is bounded.

CREATE TABLE IF NOT EXISTS postpone_stats (
    span     text        NOT NULL CHECK (span IN ('minute', 'hour')),
    at       timestamptz NOT NULL,
    queue    text        NOT NULL,
    outcome  text        NOT NULL,
    shard    smallint    NOT NULL,
    jobs     bigint      NOT NULL,
    w0      integer     NOT NULL DEFAULT 0,
    w1      integer     NOT NULL DEFAULT 0,
    w2      integer     NOT NULL DEFAULT 0,
    w3      integer     NOT NULL DEFAULT 0,
    w4      integer     NOT NULL DEFAULT 0,
    w5      integer     NOT NULL DEFAULT 0,
    w6      integer     NOT NULL DEFAULT 0,
    w7      integer     NOT NULL DEFAULT 0,
    w8      integer     NOT NULL DEFAULT 0,
    w9      integer     NOT NULL DEFAULT 0,
    w10     integer     NOT NULL DEFAULT 0,
    w11     integer     NOT NULL DEFAULT 0,
    w12     integer     NOT NULL DEFAULT 0,
    w13     integer     NOT NULL DEFAULT 0,
    w14     integer     NOT NULL DEFAULT 0,
    w15     integer     NOT NULL DEFAULT 0,
    w16     integer     NOT NULL DEFAULT 0,
    w17     integer     NOT NULL DEFAULT 0,
    w18     integer     NOT NULL DEFAULT 0,
    w19     integer     NOT NULL DEFAULT 0,
    w20     integer     NOT NULL DEFAULT 0,
    w21     integer     NOT NULL DEFAULT 0,
    w22     integer     NOT NULL DEFAULT 0,
    w23     integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (span, at, queue, outcome, shard)
);

CREATE OR REPLACE FUNCTION postpone_stats_record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    new_hours integer;
BEGIN
    -- The finished jobs of this statement, counted per queue and outcome, upserted into
    -- this minute's and this hour's rows (in key order). A job's wait (ms) is NULL when it
    -- did not start or a time is infinite; its bucket is b for 2^(b-1) to 2^b ms.
    IF TG_OP = 'UPDATE' THEN
        -- A claim, a heartbeat, a retry: no row reached a final status. Nothing to write.
        IF NOT EXISTS (SELECT 1 FROM postpone_stats_new n
                        WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')) THEN
            RETURN NULL;
        END IF;
        WITH x AS MATERIALIZED (
            SELECT n.queue, n.status AS outcome,
                   CASE WHEN w.ms IS NULL THEN NULL
                        WHEN w.ms < 1 THEN 0
                        WHEN w.ms >= 4194304 THEN 23
                        ELSE least(23, 1 + floor(ln(w.ms) / ln(2))::integer) END AS b
              FROM postpone_stats_new n JOIN postpone_stats_old o ON o.id = n.id
             CROSS JOIN LATERAL (SELECT CASE WHEN isfinite(n.started_at) AND isfinite(n.scheduled_at)
                                             THEN greatest(0, (date_part('epoch', n.started_at)
                                                               - date_part('epoch', n.scheduled_at)) * 1000)
                                        END AS ms) w
             WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
               AND o.status IN ('todo', 'doing')
        ), g AS (
            SELECT x.queue, x.outcome, count(*) AS jobs,
                   count(*) FILTER (WHERE x.b = 0)::integer AS w0,
                   count(*) FILTER (WHERE x.b = 1)::integer AS w1,
                   count(*) FILTER (WHERE x.b = 2)::integer AS w2,
                   count(*) FILTER (WHERE x.b = 3)::integer AS w3,
                   count(*) FILTER (WHERE x.b = 4)::integer AS w4,
                   count(*) FILTER (WHERE x.b = 5)::integer AS w5,
                   count(*) FILTER (WHERE x.b = 6)::integer AS w6,
                   count(*) FILTER (WHERE x.b = 7)::integer AS w7,
                   count(*) FILTER (WHERE x.b = 8)::integer AS w8,
                   count(*) FILTER (WHERE x.b = 9)::integer AS w9,
                   count(*) FILTER (WHERE x.b = 10)::integer AS w10,
                   count(*) FILTER (WHERE x.b = 11)::integer AS w11,
                   count(*) FILTER (WHERE x.b = 12)::integer AS w12,
                   count(*) FILTER (WHERE x.b = 13)::integer AS w13,
                   count(*) FILTER (WHERE x.b = 14)::integer AS w14,
                   count(*) FILTER (WHERE x.b = 15)::integer AS w15,
                   count(*) FILTER (WHERE x.b = 16)::integer AS w16,
                   count(*) FILTER (WHERE x.b = 17)::integer AS w17,
                   count(*) FILTER (WHERE x.b = 18)::integer AS w18,
                   count(*) FILTER (WHERE x.b = 19)::integer AS w19,
                   count(*) FILTER (WHERE x.b = 20)::integer AS w20,
                   count(*) FILTER (WHERE x.b = 21)::integer AS w21,
                   count(*) FILTER (WHERE x.b = 22)::integer AS w22,
                   count(*) FILTER (WHERE x.b = 23)::integer AS w23
              FROM x GROUP BY x.queue, x.outcome
        ), up AS (
            INSERT INTO postpone_stats AS s (span, at, queue, outcome, shard, jobs, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23)
            SELECT sp.span, date_trunc(sp.span, now()), g.queue, g.outcome,
                   (pg_backend_pid() % 4)::smallint, g.jobs, g.w0, g.w1, g.w2, g.w3, g.w4, g.w5, g.w6, g.w7, g.w8, g.w9, g.w10, g.w11, g.w12, g.w13, g.w14, g.w15, g.w16, g.w17, g.w18, g.w19, g.w20, g.w21, g.w22, g.w23
              FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
             ORDER BY 1, 3, 4
            ON CONFLICT (span, at, queue, outcome, shard) DO UPDATE
               SET jobs = s.jobs + EXCLUDED.jobs,
                   w0 = s.w0 + EXCLUDED.w0,
                   w1 = s.w1 + EXCLUDED.w1,
                   w2 = s.w2 + EXCLUDED.w2,
                   w3 = s.w3 + EXCLUDED.w3,
                   w4 = s.w4 + EXCLUDED.w4,
                   w5 = s.w5 + EXCLUDED.w5,
                   w6 = s.w6 + EXCLUDED.w6,
                   w7 = s.w7 + EXCLUDED.w7,
                   w8 = s.w8 + EXCLUDED.w8,
                   w9 = s.w9 + EXCLUDED.w9,
                   w10 = s.w10 + EXCLUDED.w10,
                   w11 = s.w11 + EXCLUDED.w11,
                   w12 = s.w12 + EXCLUDED.w12,
                   w13 = s.w13 + EXCLUDED.w13,
                   w14 = s.w14 + EXCLUDED.w14,
                   w15 = s.w15 + EXCLUDED.w15,
                   w16 = s.w16 + EXCLUDED.w16,
                   w17 = s.w17 + EXCLUDED.w17,
                   w18 = s.w18 + EXCLUDED.w18,
                   w19 = s.w19 + EXCLUDED.w19,
                   w20 = s.w20 + EXCLUDED.w20,
                   w21 = s.w21 + EXCLUDED.w21,
                   w22 = s.w22 + EXCLUDED.w22,
                   w23 = s.w23 + EXCLUDED.w23
            RETURNING s.span, (s.xmax = 0) AS fresh
        )
        SELECT count(*) FILTER (WHERE up.span = 'hour' AND up.fresh) INTO new_hours FROM up;
    ELSE
        IF NOT EXISTS (SELECT 1 FROM postpone_stats_old o WHERE o.status = 'doing') THEN
            RETURN NULL;
        END IF;
        WITH x AS MATERIALIZED (
            SELECT o.queue, 'succeeded'::text AS outcome,
                   CASE WHEN w.ms IS NULL THEN NULL
                        WHEN w.ms < 1 THEN 0
                        WHEN w.ms >= 4194304 THEN 23
                        ELSE least(23, 1 + floor(ln(w.ms) / ln(2))::integer) END AS b
              FROM postpone_stats_old o
             CROSS JOIN LATERAL (SELECT CASE WHEN isfinite(o.started_at) AND isfinite(o.scheduled_at)
                                             THEN greatest(0, (date_part('epoch', o.started_at)
                                                               - date_part('epoch', o.scheduled_at)) * 1000)
                                        END AS ms) w
             WHERE o.status = 'doing'
        ), g AS (
            SELECT x.queue, x.outcome, count(*) AS jobs,
                   count(*) FILTER (WHERE x.b = 0)::integer AS w0,
                   count(*) FILTER (WHERE x.b = 1)::integer AS w1,
                   count(*) FILTER (WHERE x.b = 2)::integer AS w2,
                   count(*) FILTER (WHERE x.b = 3)::integer AS w3,
                   count(*) FILTER (WHERE x.b = 4)::integer AS w4,
                   count(*) FILTER (WHERE x.b = 5)::integer AS w5,
                   count(*) FILTER (WHERE x.b = 6)::integer AS w6,
                   count(*) FILTER (WHERE x.b = 7)::integer AS w7,
                   count(*) FILTER (WHERE x.b = 8)::integer AS w8,
                   count(*) FILTER (WHERE x.b = 9)::integer AS w9,
                   count(*) FILTER (WHERE x.b = 10)::integer AS w10,
                   count(*) FILTER (WHERE x.b = 11)::integer AS w11,
                   count(*) FILTER (WHERE x.b = 12)::integer AS w12,
                   count(*) FILTER (WHERE x.b = 13)::integer AS w13,
                   count(*) FILTER (WHERE x.b = 14)::integer AS w14,
                   count(*) FILTER (WHERE x.b = 15)::integer AS w15,
                   count(*) FILTER (WHERE x.b = 16)::integer AS w16,
                   count(*) FILTER (WHERE x.b = 17)::integer AS w17,
                   count(*) FILTER (WHERE x.b = 18)::integer AS w18,
                   count(*) FILTER (WHERE x.b = 19)::integer AS w19,
                   count(*) FILTER (WHERE x.b = 20)::integer AS w20,
                   count(*) FILTER (WHERE x.b = 21)::integer AS w21,
                   count(*) FILTER (WHERE x.b = 22)::integer AS w22,
                   count(*) FILTER (WHERE x.b = 23)::integer AS w23
              FROM x GROUP BY x.queue, x.outcome
        ), up AS (
            INSERT INTO postpone_stats AS s (span, at, queue, outcome, shard, jobs, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23)
            SELECT sp.span, date_trunc(sp.span, now()), g.queue, g.outcome,
                   (pg_backend_pid() % 4)::smallint, g.jobs, g.w0, g.w1, g.w2, g.w3, g.w4, g.w5, g.w6, g.w7, g.w8, g.w9, g.w10, g.w11, g.w12, g.w13, g.w14, g.w15, g.w16, g.w17, g.w18, g.w19, g.w20, g.w21, g.w22, g.w23
              FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
             ORDER BY 1, 3, 4
            ON CONFLICT (span, at, queue, outcome, shard) DO UPDATE
               SET jobs = s.jobs + EXCLUDED.jobs,
                   w0 = s.w0 + EXCLUDED.w0,
                   w1 = s.w1 + EXCLUDED.w1,
                   w2 = s.w2 + EXCLUDED.w2,
                   w3 = s.w3 + EXCLUDED.w3,
                   w4 = s.w4 + EXCLUDED.w4,
                   w5 = s.w5 + EXCLUDED.w5,
                   w6 = s.w6 + EXCLUDED.w6,
                   w7 = s.w7 + EXCLUDED.w7,
                   w8 = s.w8 + EXCLUDED.w8,
                   w9 = s.w9 + EXCLUDED.w9,
                   w10 = s.w10 + EXCLUDED.w10,
                   w11 = s.w11 + EXCLUDED.w11,
                   w12 = s.w12 + EXCLUDED.w12,
                   w13 = s.w13 + EXCLUDED.w13,
                   w14 = s.w14 + EXCLUDED.w14,
                   w15 = s.w15 + EXCLUDED.w15,
                   w16 = s.w16 + EXCLUDED.w16,
                   w17 = s.w17 + EXCLUDED.w17,
                   w18 = s.w18 + EXCLUDED.w18,
                   w19 = s.w19 + EXCLUDED.w19,
                   w20 = s.w20 + EXCLUDED.w20,
                   w21 = s.w21 + EXCLUDED.w21,
                   w22 = s.w22 + EXCLUDED.w22,
                   w23 = s.w23 + EXCLUDED.w23
            RETURNING s.span, (s.xmax = 0) AS fresh
        )
        SELECT count(*) FILTER (WHERE up.span = 'hour' AND up.fresh) INTO new_hours FROM up;
    END IF;
    IF new_hours > 0 THEN
        DELETE FROM postpone_stats
         WHERE (span = 'minute' AND at < now() - interval '2 hours')
            OR (span = 'hour' AND at < now() - interval '8 days');
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS postpone_jobs_stats ON postpone_jobs;
CREATE TRIGGER postpone_jobs_stats AFTER UPDATE ON postpone_jobs
    REFERENCING OLD TABLE AS postpone_stats_old NEW TABLE AS postpone_stats_new
    FOR EACH STATEMENT EXECUTE FUNCTION postpone_stats_record();

DROP TRIGGER IF EXISTS postpone_jobs_stats_delete ON postpone_jobs;
CREATE TRIGGER postpone_jobs_stats_delete AFTER DELETE ON postpone_jobs
    REFERENCING OLD TABLE AS postpone_stats_old
    FOR EACH STATEMENT EXECUTE FUNCTION postpone_stats_record();

-- The dashboard's lists of failed, cancelled and aborted jobs (newest first, with or without
-- a queue, an error text...) walk this instead of the whole table. Only jobs that end badly
-- get an entry: the success path writes nothing to it.
CREATE INDEX IF NOT EXISTS postpone_jobs_failed_idx ON postpone_jobs (id)
    WHERE status IN ('failed', 'cancelled', 'aborted');
