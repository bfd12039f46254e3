//! The dashboard's own reads (the admin API serves the rest): the throughput of the last
//! hour, a keyset page of jobs, the periodic schedules' instants. Every statement runs on a
//! connection of the App's pool, so under its `pool_timeout` and `io_timeout`.

use std::time::SystemTime;

use postgres::types::ToSql;

use super::html::Minute;
use crate::conn::Connection;
use crate::error::Result;

/// Jobs finished per minute over the last 60 minutes (index 59 is the current minute);
/// served by the partial index on `finished_at`.
const THROUGHPUT: &str = "
SELECT (59 - floor(extract(epoch FROM date_trunc('minute', now()) - date_trunc('minute', finished_at)) / 60))::int,
       count(*) FILTER (WHERE status = 'succeeded'),
       count(*) FILTER (WHERE status <> 'succeeded')
  FROM postpone_jobs
 WHERE status IN ('succeeded', 'failed', 'cancelled', 'aborted')
   AND finished_at > date_trunc('minute', now()) - interval '59 minutes'
   -- A time after this minute (written by hand: 'infinity' cannot be subtracted, the year
   -- 9999 is too many minutes for an int) is no part of the last hour.
   AND finished_at < date_trunc('minute', now()) + interval '1 minute'
 GROUP BY 1";

pub(crate) fn throughput(conn: &mut Connection) -> Result<Vec<Minute>> {
    let rows = conn.query_named("reading the last hour's throughput", THROUGHPUT, &[])?;
    let mut minutes = vec![Minute::default(); 60];
    for r in rows {
        let i: i32 = r.get(0);
        if let Some(m) = usize::try_from(i).ok().and_then(|i| minutes.get_mut(i)) {
            m.succeeded = r.get::<_, i64>(1).max(0) as u64;
            m.failed = r.get::<_, i64>(2).max(0) as u64;
        }
    }
    Ok(minutes)
}

/// Which jobs the jobs page lists, and where the page starts.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobQuery {
    pub(crate) queue: Option<String>,
    pub(crate) task: Option<String>,
    pub(crate) status: Option<String>,
    pub(crate) lock: Option<String>,
    /// Jobs older than this id (the next page).
    pub(crate) before: Option<i64>,
    /// Jobs newer than this id (the previous page).
    pub(crate) after: Option<i64>,
}

/// A row of the jobs page.
#[derive(Clone, Debug)]
pub(crate) struct JobRow {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) task: String,
    pub(crate) status: String,
    pub(crate) priority: i32,
    pub(crate) lock: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) scheduled_at: SystemTime,
    pub(crate) finished_at: Option<SystemTime>,
    /// The first 120 characters of the arguments' JSON text.
    pub(crate) args: String,
}

/// Up to `limit` jobs, newest first, and whether more lie beyond the page in the direction
/// it was read. Keyset pagination on the primary key: each page costs the same however
/// deep it is. Only the filters given appear in the statement (no `$n IS NULL OR` forms),
/// so the planner sees each one.
pub(crate) fn jobs(conn: &mut Connection, q: &JobQuery, limit: i64) -> Result<(Vec<JobRow>, bool)> {
    let mut sql = String::from(
        "SELECT id, queue, task, status, priority, lock, attempts, scheduled_at, finished_at, \
         left(args::text, 120) FROM postpone_jobs WHERE true",
    );
    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
    for (column, value) in [
        ("queue", &q.queue),
        ("task", &q.task),
        ("status", &q.status),
        ("lock", &q.lock),
    ] {
        if let Some(v) = value {
            params.push(v);
            sql.push_str(&format!(" AND {column} = ${}", params.len()));
        }
    }
    let ascending = q.after.is_some() && q.before.is_none();
    if let Some(b) = &q.before {
        params.push(b);
        sql.push_str(&format!(" AND id < ${}", params.len()));
    } else if let Some(a) = &q.after {
        params.push(a);
        sql.push_str(&format!(" AND id > ${}", params.len()));
    }
    let fetch = limit + 1;
    params.push(&fetch);
    sql.push_str(&format!(
        " ORDER BY id {} LIMIT ${}",
        if ascending { "ASC" } else { "DESC" },
        params.len()
    ));
    let rows = conn.query_named("listing jobs", sql.as_str(), &params)?;
    let more = rows.len() as i64 > limit;
    let mut jobs: Vec<JobRow> = rows
        .iter()
        .take(limit as usize)
        .map(|r| JobRow {
            id: r.get(0),
            queue: r.get(1),
            task: r.get(2),
            status: r.get(3),
            priority: r.get(4),
            lock: r.get(5),
            attempts: r.get(6),
            scheduled_at: r.get(7),
            finished_at: r.get(8),
            args: r.get(9),
        })
        .collect();
    if ascending {
        jobs.reverse();
    }
    Ok((jobs, more))
}

/// A periodic schedule as its recorded instants show it.
#[derive(Clone, Debug)]
pub(crate) struct PeriodicRow {
    pub(crate) task: String,
    pub(crate) periodic_id: String,
    pub(crate) last: SystemTime,
    /// The instant before the last, if any: its distance to the last gives the expected next.
    pub(crate) previous: Option<SystemTime>,
    pub(crate) instants: i64,
    pub(crate) last_job: Option<i64>,
    /// The last job's status (none if it was skipped, or deleted since).
    pub(crate) last_status: Option<String>,
}

const PERIODIC: &str = "
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

pub(crate) fn periodic(conn: &mut Connection) -> Result<Vec<PeriodicRow>> {
    let rows = conn.query_named("listing periodic schedules", PERIODIC, &[])?;
    Ok(rows
        .iter()
        .map(|r| PeriodicRow {
            task: r.get(0),
            periodic_id: r.get(1),
            last: r.get(2),
            instants: r.get(3),
            previous: r.get(4),
            last_job: r.get(5),
            last_status: r.get(6),
        })
        .collect())
}
