//! The dashboard's own fixed reads (its filtered job lists are built in `web/queries.rs`).

pub(crate) const PERIODIC_INSTANTS: &str = "
SELECT p.task, p.periodic_id, p.instant, p.n,
       (SELECT q.instant FROM postpone_periodic q
         WHERE q.task = p.task AND q.periodic_id = p.periodic_id AND q.instant < p.instant
         ORDER BY q.instant DESC LIMIT 1),
       p.job_id, j.status
  FROM (SELECT DISTINCT ON (task, periodic_id) task, periodic_id, instant, job_id,
               count(*) OVER (PARTITION BY task, periodic_id) AS n
          FROM postpone_periodic
         ORDER BY task, periodic_id, instant DESC) p
  LEFT JOIN postpone_jobs j ON j.id = p.job_id
 ORDER BY p.task, p.periodic_id";

/// Sums of the rollup per bar, queue and outcome; `$1` the span, `$2` the bars, `$3` the
/// width of a bar in seconds, `$4` a queue or NULL.
pub(crate) const STATS_HISTORY_COUNTS: &str = "
SELECT floor(extract(epoch FROM date_trunc($1::text, now()) - s.at) / $3::bigint)::int,
       s.queue, s.outcome, sum(s.jobs)::bigint
  FROM postpone_stats s
 WHERE s.span = $1::text
   AND s.at > date_trunc($1::text, now()) - $2::int * $3::bigint * interval '1 second'
   AND s.at <= now()
   AND ($4::text IS NULL OR s.queue = $4::text)
 GROUP BY 1, 2, 3";

/// The summed wait histograms per bar: the 24 buckets' sums.
pub(crate) const STATS_HISTORY_WAITS: &str = "
SELECT floor(extract(epoch FROM date_trunc($1::text, now()) - s.at) / $3::bigint)::int,
       sum(s.w0)::bigint, sum(s.w1)::bigint, sum(s.w2)::bigint, sum(s.w3)::bigint, sum(s.w4)::bigint, sum(s.w5)::bigint, sum(s.w6)::bigint, sum(s.w7)::bigint, sum(s.w8)::bigint, sum(s.w9)::bigint, sum(s.w10)::bigint, sum(s.w11)::bigint, sum(s.w12)::bigint, sum(s.w13)::bigint, sum(s.w14)::bigint, sum(s.w15)::bigint, sum(s.w16)::bigint, sum(s.w17)::bigint, sum(s.w18)::bigint, sum(s.w19)::bigint, sum(s.w20)::bigint, sum(s.w21)::bigint, sum(s.w22)::bigint, sum(s.w23)::bigint
  FROM postpone_stats s
 WHERE s.span = $1::text
   AND s.at > date_trunc($1::text, now()) - $2::int * $3::bigint * interval '1 second'
   AND s.at <= now()
   AND ($4::text IS NULL OR s.queue = $4::text)
 GROUP BY 1";

/// Whether the session's role may update `postpone_jobs` (the dashboard's controls need it),
/// and the role's name.
pub(crate) const DASHBOARD_CAN_WRITE: &str =
    "SELECT has_table_privilege('postpone_jobs', 'UPDATE'), current_user::text";
