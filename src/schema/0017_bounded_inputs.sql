-- postpone schema, version 17: two values written by hand no longer break what reads them.
--
-- * A rate limit whose period is longer than the database can subtract from now() (say,
--   interval '10000 years', inserted by SQL written by hand; the library's API refuses more
--   than 100 years) made every claim of every worker fail with "timestamp out of range":
--   the claim prunes and counts each rate-limited queue's starts of the last period, queue
--   by queue, whatever queue the worker serves. Such a period is now cut to the API's
--   bound, and a check keeps any other from being stored. 36,525 days is the library's
--   `MAX_DELAY` (100 years and 25 leap days).
--
-- * A job inserted with a time in PostgreSQL's last years (from about the year 294,247 to
--   294,276) made its insert fail with "bigint out of range": the insert trigger tells the
--   workers when it is due in microseconds since 1970, and a bigint holds no more. That time
--   is now capped at 9e18 µs (about the year 287,000), as the claim caps it (a worker waits
--   for such a job no differently: it polls long before).

LOCK TABLE postpone_rate_limits IN SHARE ROW EXCLUSIVE MODE;

UPDATE postpone_rate_limits SET period = interval '36525 days'
 WHERE period > interval '36525 days';

ALTER TABLE postpone_rate_limits
    DROP CONSTRAINT postpone_rate_limits_period,
    ADD CONSTRAINT postpone_rate_limits_period
        CHECK (period > interval '0' AND period <= interval '36525 days');

CREATE OR REPLACE FUNCTION postpone_wake_at(q text, at timestamptz) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify('postpone',
                     'at:' || least(floor(extract(epoch FROM at) * 1000000),
                                    9000000000000000000)::bigint::text || ':'
                     || CASE WHEN octet_length(q) <= 1000 THEN q ELSE '*' END)
$$;
