-- postpone schema, version 31: less WAL for the statistics of a statement's outcomes.
--
-- Every statement that ends jobs adds them to two rows of postpone_stats (this minute's
-- and this hour's, per queue, outcome and shard). It did so with INSERT ... ON CONFLICT DO
-- UPDATE, which locks the row it finds before updating it: a LOCK record (54 bytes) and
-- the update's record (a HOT update, about 130 bytes) for each row. A worker that records
-- outcomes one at a time paid 362 bytes of WAL a job for them, 17% of all it wrote
-- (benches/wal.py, 20-ms jobs at concurrency 1; docs/wal.md). postpone_stats_record now
-- adds to a row that is there with a plain UPDATE (no lock record), and inserts the rows
-- not there yet with the same INSERT ... ON CONFLICT as before (a row another session
-- inserted meanwhile is added to). Rows are written in the same key order as before, so
-- two statements that write the same rows take their locks in the same order. The counts,
-- the buckets and the clean-up of old rows are unchanged.
--
-- Only a function redefinition; it can run again.

CREATE OR REPLACE FUNCTION postpone_stats_record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    new_hours integer := 0;
    v_rows refcursor;
    r record;
    v_shard smallint := (pg_backend_pid() % 4)::smallint;
    v_fresh boolean;
BEGIN
    -- The finished jobs of this statement, counted per queue and outcome, added to this
    -- minute's and this hour's rows (in key order). A job's wait (ms) is NULL when it did
    -- not start or a time is infinite; its bucket is b for 2^(b-1) to 2^b ms.
    IF TG_OP = 'UPDATE' THEN
        -- A claim, a heartbeat, a retry: no row reached a final status. Nothing to write.
        IF NOT EXISTS (SELECT 1 FROM postpone_stats_new n
                        WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')) THEN
            RETURN NULL;
        END IF;
        OPEN v_rows FOR
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
            )
            SELECT sp.span, date_trunc(sp.span, now()) AS at, g.*
              FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
             ORDER BY 1, g.queue, g.outcome;
    ELSE
        IF NOT EXISTS (SELECT 1 FROM postpone_stats_old o WHERE o.status = 'doing') THEN
            RETURN NULL;
        END IF;
        OPEN v_rows FOR
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
            )
            SELECT sp.span, date_trunc(sp.span, now()) AS at, g.*
              FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
             ORDER BY 1, g.queue, g.outcome;
    END IF;
    -- A row of this minute or hour is added to by a plain UPDATE: an INSERT ... ON
    -- CONFLICT DO UPDATE locks the row it finds first, one more WAL record (54 bytes) per
    -- row, twice per statement that records outcomes. The INSERT is for a row not there
    -- yet (and for one another session inserted meanwhile).
    LOOP
        FETCH v_rows INTO r;
        EXIT WHEN NOT FOUND;
        UPDATE postpone_stats s
           SET jobs = s.jobs + r.jobs,
                   w0 = s.w0 + r.w0,
                   w1 = s.w1 + r.w1,
                   w2 = s.w2 + r.w2,
                   w3 = s.w3 + r.w3,
                   w4 = s.w4 + r.w4,
                   w5 = s.w5 + r.w5,
                   w6 = s.w6 + r.w6,
                   w7 = s.w7 + r.w7,
                   w8 = s.w8 + r.w8,
                   w9 = s.w9 + r.w9,
                   w10 = s.w10 + r.w10,
                   w11 = s.w11 + r.w11,
                   w12 = s.w12 + r.w12,
                   w13 = s.w13 + r.w13,
                   w14 = s.w14 + r.w14,
                   w15 = s.w15 + r.w15,
                   w16 = s.w16 + r.w16,
                   w17 = s.w17 + r.w17,
                   w18 = s.w18 + r.w18,
                   w19 = s.w19 + r.w19,
                   w20 = s.w20 + r.w20,
                   w21 = s.w21 + r.w21,
                   w22 = s.w22 + r.w22,
                   w23 = s.w23 + r.w23
         WHERE s.span = r.span AND s.at = r.at AND s.queue = r.queue
           AND s.outcome = r.outcome AND s.shard = v_shard;
        IF NOT FOUND THEN
            INSERT INTO postpone_stats AS s (span, at, queue, outcome, shard, jobs, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23)
            VALUES (r.span, r.at, r.queue, r.outcome, v_shard, r.jobs, r.w0, r.w1, r.w2, r.w3, r.w4, r.w5, r.w6, r.w7, r.w8, r.w9, r.w10, r.w11, r.w12, r.w13, r.w14, r.w15, r.w16, r.w17, r.w18, r.w19, r.w20, r.w21, r.w22, r.w23)
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
            RETURNING (s.xmax = 0) INTO v_fresh;
            IF v_fresh AND r.span = 'hour' THEN
                new_hours := new_hours + 1;
            END IF;
        END IF;
    END LOOP;
    CLOSE v_rows;
    IF new_hours > 0 THEN
        DELETE FROM postpone_stats
         WHERE (span = 'minute' AND at < now() - interval '2 hours')
            OR (span = 'hour' AND at < now() - interval '8 days');
    END IF;
    RETURN NULL;
END
$$;
