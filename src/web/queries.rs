//! The dashboard's own reads (the admin API serves the rest): a keyset page of jobs and its
//! count, the jobs workers hold, the periodic schedules' instants. Every statement runs on a
//! connection of the App's pool, so under its `pool_timeout` and `io_timeout`.

use std::time::SystemTime;

use crate::admin::filter::{JobFilter, Query};
use crate::conn::Connection;
use crate::error::Result;
use crate::store;

/// The one place the dashboard tells a running job from a held one: a job is *running*
/// when it is `doing` and started (`started_at` set); a `doing` job not started yet is
/// held by a worker that has not begun it, and waits like any other.
pub(crate) const RUNNING: &str = "j.status = 'doing' AND j.started_at IS NOT NULL";

/// Whether a job of this status and start time runs (see [`RUNNING`]).
pub(crate) fn is_running(status: &str, started_at: Option<SystemTime>) -> bool {
    status == "doing" && started_at.is_some()
}

/// Characters of a job's arguments a list shows.
const ARGS_PREVIEW: i64 = 120;
/// Characters of a job's last error a list shows.
const ERROR_PREVIEW: i64 = 300;
/// Tags of a job a list shows, and characters of each.
const TAGS_PREVIEW: i64 = 8;
const TAG_PREVIEW: i64 = 64;

/// A row of the jobs page: every value cut to a few hundred characters, so a page of 50
/// costs the same whatever the jobs hold.
#[derive(Clone, Debug)]
pub(crate) struct JobRow {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) task: String,
    pub(crate) status: String,
    pub(crate) priority: i32,
    pub(crate) lock: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) created_at: SystemTime,
    pub(crate) scheduled_at: SystemTime,
    pub(crate) started_at: Option<SystemTime>,
    pub(crate) finished_at: Option<SystemTime>,
    /// The first 120 characters of the arguments' JSON text.
    pub(crate) args: String,
    /// Its first 8 tags, each cut to 64 characters.
    pub(crate) tags: Vec<String>,
    /// How many tags it has.
    pub(crate) tags_total: i32,
    /// The first 300 characters of the last recorded error.
    pub(crate) last_error: Option<String>,
    /// How long ago it started, by the database's clock, while it runs.
    pub(crate) running_for: Option<f64>,
    /// Waiting for the jobs it was deferred to run after.
    pub(crate) after_dependencies: bool,
}

/// Up to `limit` jobs that `filter` selects (its conditions only: the dashboard pages by
/// id itself), newest first, and whether more lie beyond the page in the direction it was
/// read. Keyset pagination on the primary key: each page costs the same however deep it
/// is. `before`: jobs older than this id (the next page); `after`: newer (the previous).
pub(crate) fn jobs(
    conn: &mut Connection,
    filter: &JobFilter,
    before: Option<i64>,
    after: Option<i64>,
    limit: i64,
) -> Result<(Vec<JobRow>, bool)> {
    filter.validate()?;
    filter.with_args_fallback(|filter| jobs_once(conn, filter, before, after, limit))
}

fn jobs_once(
    conn: &mut Connection,
    filter: &JobFilter,
    before: Option<i64>,
    after: Option<i64>,
    limit: i64,
) -> Result<(Vec<JobRow>, bool)> {
    let mut q = Query::default();
    let mut cond = filter.conditions(&mut q);
    let ascending = after.is_some() && before.is_none();
    if let Some(b) = before {
        cond.push_str(&format!(" AND j.id < {}::bigint", q.bind(b)));
    } else if let Some(a) = after {
        cond.push_str(&format!(" AND j.id > {}::bigint", q.bind(a)));
    }
    let lim = q.bind(limit + 1);
    let sql = format!(
        "SELECT j.id, j.queue, j.task, j.status, j.priority, j.lock, j.attempts, j.created_at,
                j.scheduled_at, j.started_at, j.finished_at, left(j.args::text, {ARGS_PREVIEW}),
                ARRAY(SELECT left(t, {TAG_PREVIEW}) FROM unnest(j.tags[1:{TAGS_PREVIEW}]) AS t
                       WHERE t IS NOT NULL),
                CASE WHEN jsonb_typeof(j.errors) = 'array'
                     THEN left(j.errors -> -1 ->> 'error', {ERROR_PREVIEW}) END,
                CASE WHEN {RUNNING} AND isfinite(j.started_at)
                     THEN date_part('epoch', now()) - date_part('epoch', j.started_at) END,
                (j.has_dependencies AND j.status = 'todo' AND j.scheduled_at = 'infinity'),
                coalesce(cardinality(j.tags), 0)
           FROM postpone_jobs j
          WHERE {cond}
          ORDER BY j.id {} LIMIT {lim}",
        if ascending { "ASC" } else { "DESC" },
    );
    let rows = conn.query_named("listing jobs", sql.as_str(), &q.params())?;
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
            created_at: r.get(7),
            scheduled_at: r.get(8),
            started_at: r.get(9),
            finished_at: r.get(10),
            args: r.get(11),
            tags: r.get(12),
            last_error: r.get(13),
            running_for: r.get(14),
            after_dependencies: r.get(15),
            tags_total: r.get(16),
        })
        .collect();
    if ascending {
        jobs.reverse();
    }
    Ok((jobs, more))
}

/// How many jobs `filter` selects, counting no further than `cap` (so that a count over
/// millions of rows costs what `cap` rows do); `cap + 1` means "more than `cap`".
pub(crate) fn count(conn: &mut Connection, filter: &JobFilter, cap: i64) -> Result<i64> {
    filter.validate()?;
    filter.with_args_fallback(|filter| {
        let mut q = Query::default();
        let cond = filter.conditions(&mut q);
        let lim = q.bind(cap + 1);
        let sql = format!(
            "SELECT count(*) FROM (SELECT 1 FROM postpone_jobs j WHERE {cond} LIMIT {lim}) s"
        );
        let rows = conn.query_named("counting jobs", sql.as_str(), &q.params())?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0)))
    })
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

pub(crate) fn periodic(conn: &mut Connection) -> Result<Vec<PeriodicRow>> {
    let rows = conn.query_named("listing periodic schedules", store::PERIODIC_INSTANTS, &[])?;
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

/// A job a worker holds, for the workers page.
#[derive(Clone, Debug)]
pub(crate) struct HeldJob {
    pub(crate) worker_id: i64,
    pub(crate) id: i64,
    pub(crate) task: String,
    /// Seconds since it started, by the database's clock; `None` while it waits (held, not
    /// started: see [`RUNNING`]).
    pub(crate) running_for: Option<f64>,
}

/// Jobs held by workers (`doing`), running ones first, at most `limit`: served by the
/// partial index on `doing` jobs.
pub(crate) fn held_jobs(conn: &mut Connection, limit: i64) -> Result<Vec<HeldJob>> {
    let sql = format!(
        "SELECT j.worker_id, j.id, j.task,
                CASE WHEN {RUNNING} AND isfinite(j.started_at)
                     THEN greatest(0, date_part('epoch', now()) - date_part('epoch', j.started_at)) END
           FROM postpone_jobs j
          WHERE j.status = 'doing' AND j.worker_id IS NOT NULL
          ORDER BY j.worker_id, ({RUNNING}) DESC, j.started_at, j.id
          LIMIT $1"
    );
    let rows = conn.query_named("listing held jobs", sql.as_str(), &[&limit])?;
    Ok(rows
        .iter()
        .map(|r| HeldJob {
            worker_id: r.get(0),
            id: r.get(1),
            task: r.get(2),
            running_for: r.get(3),
        })
        .collect())
}
