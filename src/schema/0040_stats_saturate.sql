-- postpone schema, version 40: the statistics never fail the recording of outcomes.
--
-- postpone_stats_record (version 35) adds each statement's finished jobs to the rows of this
-- minute and this hour. A row at the top of its counters (written by hand: a restore, a tool
-- that sums rows) made that addition "integer out of range" ("bigint out of range" for
-- `jobs`), which failed the statement that recorded the outcomes: the worker then failed,
-- one by one, every job of that queue whose task had succeeded, for the rest of the hour.
-- The counters now stop at their top instead. The rows written are otherwise the same.
--
-- Every statement here can run again on a schema that has it.

CREATE OR REPLACE FUNCTION postpone_stats_record()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
        WITH x AS (
                SELECT n.queue, n.status AS outcome,
                       CASE WHEN w.ms IS NULL THEN NULL
                            WHEN w.ms < 1 THEN 0
                            WHEN w.ms >= 4194304 THEN 23
                            ELSE least(23, 1 + floor(ln(w.ms) / ln(2))::integer) END AS b
                  FROM postpone_stats_new n JOIN postpone_stats_old o ON o.id = n.id
                 CROSS JOIN LATERAL (SELECT CASE WHEN isfinite(n.started_at) AND isfinite(n.scheduled_at)
                                                 THEN greatest(0, date_part('epoch', n.started_at
                                                                              - n.scheduled_at) * 1000)
                                            END AS ms) w
                 WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'aborted')
                   AND o.status IN ('todo', 'doing')
            ), y AS (
                SELECT x.queue, x.outcome, x.b, count(*) AS n
                  FROM x GROUP BY x.queue, x.outcome, x.b
            ), g AS (
                SELECT y.queue, y.outcome, sum(y.n)::bigint AS jobs,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 0), 0)::integer AS w0,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 1), 0)::integer AS w1,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 2), 0)::integer AS w2,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 3), 0)::integer AS w3,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 4), 0)::integer AS w4,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 5), 0)::integer AS w5,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 6), 0)::integer AS w6,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 7), 0)::integer AS w7,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 8), 0)::integer AS w8,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 9), 0)::integer AS w9,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 10), 0)::integer AS w10,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 11), 0)::integer AS w11,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 12), 0)::integer AS w12,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 13), 0)::integer AS w13,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 14), 0)::integer AS w14,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 15), 0)::integer AS w15,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 16), 0)::integer AS w16,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 17), 0)::integer AS w17,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 18), 0)::integer AS w18,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 19), 0)::integer AS w19,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 20), 0)::integer AS w20,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 21), 0)::integer AS w21,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 22), 0)::integer AS w22,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 23), 0)::integer AS w23
                  FROM y GROUP BY y.queue, y.outcome
            )
            SELECT sp.span, date_trunc(sp.span, now()) AS at, g.*
              FROM g CROSS JOIN (VALUES ('hour'), ('minute')) AS sp(span)
             ORDER BY 1, g.queue, g.outcome;
    ELSE
        IF NOT EXISTS (SELECT 1 FROM postpone_stats_old o WHERE o.status = 'doing') THEN
            RETURN NULL;
        END IF;
        OPEN v_rows FOR
        WITH x AS (
                SELECT o.queue, 'succeeded'::text AS outcome,
                       CASE WHEN w.ms IS NULL THEN NULL
                            WHEN w.ms < 1 THEN 0
                            WHEN w.ms >= 4194304 THEN 23
                            ELSE least(23, 1 + floor(ln(w.ms) / ln(2))::integer) END AS b
                  FROM postpone_stats_old o
                 CROSS JOIN LATERAL (SELECT CASE WHEN isfinite(o.started_at) AND isfinite(o.scheduled_at)
                                                 THEN greatest(0, date_part('epoch', o.started_at
                                                                              - o.scheduled_at) * 1000)
                                            END AS ms) w
                 WHERE o.status = 'doing'
            ), y AS (
                SELECT x.queue, x.outcome, x.b, count(*) AS n
                  FROM x GROUP BY x.queue, x.outcome, x.b
            ), g AS (
                SELECT y.queue, y.outcome, sum(y.n)::bigint AS jobs,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 0), 0)::integer AS w0,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 1), 0)::integer AS w1,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 2), 0)::integer AS w2,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 3), 0)::integer AS w3,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 4), 0)::integer AS w4,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 5), 0)::integer AS w5,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 6), 0)::integer AS w6,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 7), 0)::integer AS w7,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 8), 0)::integer AS w8,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 9), 0)::integer AS w9,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 10), 0)::integer AS w10,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 11), 0)::integer AS w11,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 12), 0)::integer AS w12,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 13), 0)::integer AS w13,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 14), 0)::integer AS w14,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 15), 0)::integer AS w15,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 16), 0)::integer AS w16,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 17), 0)::integer AS w17,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 18), 0)::integer AS w18,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 19), 0)::integer AS w19,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 20), 0)::integer AS w20,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 21), 0)::integer AS w21,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 22), 0)::integer AS w22,
                       coalesce(sum(y.n) FILTER (WHERE y.b = 23), 0)::integer AS w23
                  FROM y GROUP BY y.queue, y.outcome
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
           SET jobs = CASE WHEN s.jobs > 9223372036854775807 - r.jobs
                               THEN 9223372036854775807 ELSE s.jobs + r.jobs END,
                   w0 = least(s.w0::bigint + r.w0, 2147483647)::integer,
                   w1 = least(s.w1::bigint + r.w1, 2147483647)::integer,
                   w2 = least(s.w2::bigint + r.w2, 2147483647)::integer,
                   w3 = least(s.w3::bigint + r.w3, 2147483647)::integer,
                   w4 = least(s.w4::bigint + r.w4, 2147483647)::integer,
                   w5 = least(s.w5::bigint + r.w5, 2147483647)::integer,
                   w6 = least(s.w6::bigint + r.w6, 2147483647)::integer,
                   w7 = least(s.w7::bigint + r.w7, 2147483647)::integer,
                   w8 = least(s.w8::bigint + r.w8, 2147483647)::integer,
                   w9 = least(s.w9::bigint + r.w9, 2147483647)::integer,
                   w10 = least(s.w10::bigint + r.w10, 2147483647)::integer,
                   w11 = least(s.w11::bigint + r.w11, 2147483647)::integer,
                   w12 = least(s.w12::bigint + r.w12, 2147483647)::integer,
                   w13 = least(s.w13::bigint + r.w13, 2147483647)::integer,
                   w14 = least(s.w14::bigint + r.w14, 2147483647)::integer,
                   w15 = least(s.w15::bigint + r.w15, 2147483647)::integer,
                   w16 = least(s.w16::bigint + r.w16, 2147483647)::integer,
                   w17 = least(s.w17::bigint + r.w17, 2147483647)::integer,
                   w18 = least(s.w18::bigint + r.w18, 2147483647)::integer,
                   w19 = least(s.w19::bigint + r.w19, 2147483647)::integer,
                   w20 = least(s.w20::bigint + r.w20, 2147483647)::integer,
                   w21 = least(s.w21::bigint + r.w21, 2147483647)::integer,
                   w22 = least(s.w22::bigint + r.w22, 2147483647)::integer,
                   w23 = least(s.w23::bigint + r.w23, 2147483647)::integer
         WHERE s.span = r.span AND s.at = r.at AND s.queue = r.queue
           AND s.outcome = r.outcome AND s.shard = v_shard;
        IF NOT FOUND THEN
            INSERT INTO postpone_stats AS s (span, at, queue, outcome, shard, jobs, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23)
            VALUES (r.span, r.at, r.queue, r.outcome, v_shard, r.jobs, r.w0, r.w1, r.w2, r.w3, r.w4, r.w5, r.w6, r.w7, r.w8, r.w9, r.w10, r.w11, r.w12, r.w13, r.w14, r.w15, r.w16, r.w17, r.w18, r.w19, r.w20, r.w21, r.w22, r.w23)
            ON CONFLICT (span, at, queue, outcome, shard) DO UPDATE
               SET jobs = CASE WHEN s.jobs > 9223372036854775807 - EXCLUDED.jobs
                               THEN 9223372036854775807 ELSE s.jobs + EXCLUDED.jobs END,
                   w0 = least(s.w0::bigint + EXCLUDED.w0, 2147483647)::integer,
                   w1 = least(s.w1::bigint + EXCLUDED.w1, 2147483647)::integer,
                   w2 = least(s.w2::bigint + EXCLUDED.w2, 2147483647)::integer,
                   w3 = least(s.w3::bigint + EXCLUDED.w3, 2147483647)::integer,
                   w4 = least(s.w4::bigint + EXCLUDED.w4, 2147483647)::integer,
                   w5 = least(s.w5::bigint + EXCLUDED.w5, 2147483647)::integer,
                   w6 = least(s.w6::bigint + EXCLUDED.w6, 2147483647)::integer,
                   w7 = least(s.w7::bigint + EXCLUDED.w7, 2147483647)::integer,
                   w8 = least(s.w8::bigint + EXCLUDED.w8, 2147483647)::integer,
                   w9 = least(s.w9::bigint + EXCLUDED.w9, 2147483647)::integer,
                   w10 = least(s.w10::bigint + EXCLUDED.w10, 2147483647)::integer,
                   w11 = least(s.w11::bigint + EXCLUDED.w11, 2147483647)::integer,
                   w12 = least(s.w12::bigint + EXCLUDED.w12, 2147483647)::integer,
                   w13 = least(s.w13::bigint + EXCLUDED.w13, 2147483647)::integer,
                   w14 = least(s.w14::bigint + EXCLUDED.w14, 2147483647)::integer,
                   w15 = least(s.w15::bigint + EXCLUDED.w15, 2147483647)::integer,
                   w16 = least(s.w16::bigint + EXCLUDED.w16, 2147483647)::integer,
                   w17 = least(s.w17::bigint + EXCLUDED.w17, 2147483647)::integer,
                   w18 = least(s.w18::bigint + EXCLUDED.w18, 2147483647)::integer,
                   w19 = least(s.w19::bigint + EXCLUDED.w19, 2147483647)::integer,
                   w20 = least(s.w20::bigint + EXCLUDED.w20, 2147483647)::integer,
                   w21 = least(s.w21::bigint + EXCLUDED.w21, 2147483647)::integer,
                   w22 = least(s.w22::bigint + EXCLUDED.w22, 2147483647)::integer,
                   w23 = least(s.w23::bigint + EXCLUDED.w23, 2147483647)::integer
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
$function$;
