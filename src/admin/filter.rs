//! Which jobs an admin call is about: [`JobFilter`] (typed conditions, every one set must
//! match), the order of a listing ([`JobSort`]) and keyset paging ([`JobPage`], whose
//! `next_cursor` is handed back with [`JobFilter::after`]).
//!
//! The same filter selects the jobs of a listing and of a bulk operation
//! ([`Admin::bulk`](crate::Admin::bulk)), so "what I saw" and "what I changed" agree. The
//! statement is built here with numbered parameters; no value is ever spliced into SQL.
//!
//! A cursor names the sort key and the last row of a page (`id:desc:1234:1234`): the next
//! page starts strictly after it, so rows inserted or deleted meanwhile neither repeat nor
//! shift the pages. A cursor made for another sort is refused.

use std::time::SystemTime;

use postgres::types::ToSql;
use serde::Serialize;

use super::info::JobInfo;
use crate::error::{Error, Result};
use crate::job::{JobId, JobStatus};
use crate::store::JOB_COLUMNS;

/// Rows a listing returns unless the filter sets a limit.
pub(crate) const DEFAULT_LIMIT: u32 = 100;

/// Which jobs a listing or a bulk operation is about: every condition set must match.
///
/// ```no_run
/// use std::time::{Duration, SystemTime};
/// use postpone::{JobFilter, JobSort, JobStatus};
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let day_ago = SystemTime::now() - Duration::from_secs(86_400);
/// let mut filter = JobFilter::new()
///     .status(JobStatus::Failed)
///     .finished_after(day_ago)
///     .error_contains("timeout")
///     .sort(JobSort::Finished, true)
///     .limit(100);
/// loop {
///     let page = app.admin().job_page(&filter)?;
///     for job in &page.jobs {
///         println!("{} {}", job.id, job.last_error.as_deref().unwrap_or(""));
///     }
///     match page.next_cursor {
///         Some(c) => filter = filter.after(c),
///         None => break,
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct JobFilter {
    pub(crate) ids: Vec<JobId>,
    pub(crate) queue: Option<String>,
    pub(crate) task: Option<String>,
    pub(crate) statuses: Vec<JobStatus>,
    pub(crate) lock: Option<String>,
    pub(crate) queueing_lock: Option<String>,
    pub(crate) created_after: Option<SystemTime>,
    pub(crate) created_before: Option<SystemTime>,
    pub(crate) finished_after: Option<SystemTime>,
    pub(crate) finished_before: Option<SystemTime>,
    pub(crate) error_contains: Option<String>,
    pub(crate) tags: Vec<String>,
    pub(crate) batch: Option<crate::BatchId>,
    pub(crate) workflow: Option<crate::WorkflowId>,
    pub(crate) args_contain: Option<serde_json::Value>,
    /// The argument condition reads each row's arguments apart, so that one PostgreSQL's
    /// jsonb cannot read fails no statement (see [`JobFilter::with_args_fallback`]).
    pub(crate) args_apart: bool,
    pub(crate) sort: JobSort,
    pub(crate) descending: Option<bool>,
    pub(crate) after: Option<String>,
    pub(crate) limit: Option<u32>,
}

/// The order of a listing; ties are broken by id. See [`JobFilter::sort`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobSort {
    /// By id, that is in the order jobs were deferred. The default (newest first).
    #[default]
    Id,
    /// By the time the job is due.
    Scheduled,
    /// By the time the job finished; only finished jobs are listed.
    Finished,
    /// By priority.
    Priority,
}

impl JobSort {
    /// Its name in cursors and on the command line: `id`, `scheduled`, `finished`, `priority`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobSort::Id => "id",
            JobSort::Scheduled => "scheduled",
            JobSort::Finished => "finished",
            JobSort::Priority => "priority",
        }
    }

    /// The sort with this name.
    pub fn from_name(name: &str) -> Option<JobSort> {
        [
            JobSort::Id,
            JobSort::Scheduled,
            JobSort::Finished,
            JobSort::Priority,
        ]
        .into_iter()
        .find(|s| s.as_str().eq_ignore_ascii_case(name.trim()))
    }

    /// The SQL of the key, and of its type for the cursor's value.
    fn key(self) -> (&'static str, &'static str) {
        match self {
            JobSort::Id => ("j.id", "bigint"),
            JobSort::Scheduled => ("j.scheduled_at", "timestamptz"),
            JobSort::Finished => ("j.finished_at", "timestamptz"),
            JobSort::Priority => ("j.priority", "integer"),
        }
    }

    /// The key as text that reads back exactly as its type, whatever the session's settings
    /// (`YYYY` drops the era: a time before the year 1 gets ` BC`, or it would read back
    /// as a time after Christ).
    fn key_text(self) -> String {
        let (col, ty) = self.key();
        if ty == "timestamptz" {
            format!(
                "CASE WHEN isfinite({col}) THEN to_char({col} AT TIME ZONE 'UTC', \
                 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') \
                 || CASE WHEN {col} < '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END \
                 ELSE {col}::text END"
            )
        } else {
            format!("{col}::text")
        }
    }
}

/// One page of a listing; from [`Admin::job_page`](crate::Admin::job_page).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct JobPage {
    /// The jobs of this page, in the filter's order.
    pub jobs: Vec<JobInfo>,
    /// Set when more jobs match: pass it to [`JobFilter::after`] for the next page.
    pub next_cursor: Option<String>,
}

impl JobFilter {
    /// Every job (up to the limit).
    pub fn new() -> JobFilter {
        JobFilter::default()
    }

    /// Only the job with this id; call it again to accept several.
    pub fn id(mut self, id: JobId) -> JobFilter {
        if !self.ids.contains(&id) {
            self.ids.push(id);
        }
        self
    }

    /// Only jobs of this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> JobFilter {
        self.queue = Some(queue.into());
        self
    }

    /// Only jobs of this task.
    pub fn task(mut self, task: impl Into<String>) -> JobFilter {
        self.task = Some(task.into());
        self
    }

    /// Only jobs with this status; call it again to accept several.
    pub fn status(mut self, status: JobStatus) -> JobFilter {
        if !self.statuses.contains(&status) {
            self.statuses.push(status);
        }
        self
    }

    /// Only jobs with this lock.
    pub fn lock(mut self, lock: impl Into<String>) -> JobFilter {
        self.lock = Some(lock.into());
        self
    }

    /// Only jobs with this queueing lock.
    pub fn queueing_lock(mut self, lock: impl Into<String>) -> JobFilter {
        self.queueing_lock = Some(lock.into());
        self
    }

    /// Only jobs deferred at or after `t`. Like the other times of a filter, `t` must lie in
    /// the years 1 to 9999: outside them, the listing is an
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) error.
    pub fn created_after(mut self, t: SystemTime) -> JobFilter {
        self.created_after = Some(t);
        self
    }

    /// Only jobs deferred before `t`.
    pub fn created_before(mut self, t: SystemTime) -> JobFilter {
        self.created_before = Some(t);
        self
    }

    /// Only jobs that finished at or after `t`.
    pub fn finished_after(mut self, t: SystemTime) -> JobFilter {
        self.finished_after = Some(t);
        self
    }

    /// Only jobs that finished before `t`.
    pub fn finished_before(mut self, t: SystemTime) -> JobFilter {
        self.finished_before = Some(t);
        self
    }

    /// Only jobs one of whose recorded errors contains `text` (ignoring case).
    pub fn error_contains(mut self, text: impl Into<String>) -> JobFilter {
        self.error_contains = Some(text.into());
        self
    }

    /// Only jobs deferred with this tag ([`NewJob::tags`](crate::NewJob::tags)); call it
    /// again to require several.
    pub fn tag(mut self, tag: impl Into<String>) -> JobFilter {
        let tag = tag.into();
        if !self.tags.contains(&tag) {
            self.tags.push(tag);
        }
        self
    }

    /// Only the jobs of this batch ([`App::batch`](crate::App::batch)), its callbacks
    /// included.
    pub fn batch(mut self, batch: crate::BatchId) -> JobFilter {
        self.batch = Some(batch);
        self
    }

    /// Only the jobs of this workflow ([`App::workflow`](crate::App::workflow)).
    pub fn workflow(mut self, workflow: crate::WorkflowId) -> JobFilter {
        self.workflow = Some(workflow);
        self
    }

    /// Only jobs whose arguments contain `value`, as PostgreSQL's `jsonb @>` reads it: an
    /// object matches when it holds these keys with these values (recursively), an array
    /// when it holds these elements. `json!({"user": 42})` matches `{"user": 42, "x": 1}`.
    /// No index serves it: combine it with a status, queue or task on a large table.
    /// Arguments PostgreSQL's jsonb cannot read (stored by a raw `INSERT`; the library
    /// refuses them at the defer) never match.
    pub fn args_contain(mut self, value: serde_json::Value) -> JobFilter {
        self.args_contain = Some(value);
        self
    }

    /// The order of a listing, descending or not. Defaults to [`JobSort::Id`], descending
    /// (newest first); other sorts default to ascending.
    pub fn sort(mut self, sort: JobSort, descending: bool) -> JobFilter {
        self.sort = sort;
        self.descending = Some(descending);
        self
    }

    /// Starts the listing after the row a previous page's
    /// [`next_cursor`](JobPage::next_cursor) names. Bulk operations ignore it.
    pub fn after(mut self, cursor: impl Into<String>) -> JobFilter {
        self.after = Some(cursor.into());
        self
    }

    /// At most this many jobs per page (at least 1). Defaults to 100. Bulk operations
    /// ignore it: they reach every matching job.
    pub fn limit(mut self, limit: u32) -> JobFilter {
        self.limit = Some(limit);
        self
    }

    /// True when no condition is set (every job matches).
    pub fn is_unfiltered(&self) -> bool {
        self.ids.is_empty()
            && self.queue.is_none()
            && self.task.is_none()
            && self.statuses.is_empty()
            && self.lock.is_none()
            && self.queueing_lock.is_none()
            && self.created_after.is_none()
            && self.created_before.is_none()
            && self.finished_after.is_none()
            && self.finished_before.is_none()
            && self.error_contains.is_none()
            && self.tags.is_empty()
            && self.batch.is_none()
            && self.workflow.is_none()
            && self.args_contain.is_none()
    }

    fn descending(&self) -> bool {
        self.descending.unwrap_or(self.sort == JobSort::Id)
    }

    /// The conditions as SQL over `postpone_jobs j`, their values appended to `q`.
    pub(crate) fn conditions(&self, q: &mut Query) -> String {
        let mut c: Vec<String> = vec!["true".to_owned()];
        if !self.ids.is_empty() {
            let ids: Vec<i64> = self.ids.iter().map(|i| i.0).collect();
            c.push(format!("j.id = ANY({}::bigint[])", q.bind(ids)));
        }
        if let Some(v) = &self.queue {
            c.push(format!("j.queue = {}::text", q.bind(v.clone())));
        }
        if let Some(v) = &self.task {
            c.push(format!("j.task = {}::text", q.bind(v.clone())));
        }
        if !self.statuses.is_empty() {
            let s: Vec<String> = self
                .statuses
                .iter()
                .map(|s| s.as_str().to_owned())
                .collect();
            // A job a worker holds but has not started is waiting (`todo`), not running.
            let todo = s.iter().any(|s| s == "todo");
            let p = q.bind(s);
            c.push(format!(
                "((j.status = ANY({p}::text[]) \
                   AND (j.status <> 'doing' OR j.started_at IS NOT NULL)){})",
                if todo {
                    " OR (j.status = 'doing' AND j.started_at IS NULL)"
                } else {
                    ""
                }
            ));
        }
        if let Some(v) = &self.lock {
            c.push(format!("j.lock = {}::text", q.bind(v.clone())));
        }
        if let Some(v) = &self.queueing_lock {
            c.push(format!("j.queueing_lock = {}::text", q.bind(v.clone())));
        }
        if let Some(t) = self.created_after {
            c.push(format!("j.created_at >= {}::timestamptz", q.bind(t)));
        }
        if let Some(t) = self.created_before {
            c.push(format!("j.created_at < {}::timestamptz", q.bind(t)));
        }
        if let Some(t) = self.finished_after {
            c.push(format!("j.finished_at >= {}::timestamptz", q.bind(t)));
        }
        if let Some(t) = self.finished_before {
            c.push(format!("j.finished_at < {}::timestamptz", q.bind(t)));
        }
        if let Some(text) = &self.error_contains {
            c.push(format!(
                "jsonb_typeof(j.errors) = 'array' AND EXISTS (
                   SELECT 1 FROM jsonb_array_elements(j.errors) e
                    WHERE strpos(lower(coalesce(e ->> 'error', '')), lower({}::text)) > 0)",
                q.bind(text.clone())
            ));
        }
        if !self.tags.is_empty() {
            c.push(format!("j.tags @> {}::text[]", q.bind(self.tags.clone())));
        }
        if let Some(b) = self.batch {
            c.push(format!("j.batch_id = {}::bigint", q.bind(b.0)));
        }
        if let Some(w) = self.workflow {
            c.push(format!(
                "j.id IN (SELECT wf.job_id FROM postpone_workflow_jobs wf WHERE wf.workflow_id = {}::bigint)",
                q.bind(w.0)
            ));
        }
        if let Some(v) = &self.args_contain {
            // The plain cast reads a row three times as fast as `postpone_args_jsonb`, whose
            // exception block costs a subtransaction a row (300,000 rows: 113 against 352
            // ms); the callers run the statement again with the latter when a row fails the
            // cast (`with_args_fallback`).
            let read = if self.args_apart {
                "postpone_args_jsonb(j.args)"
            } else {
                "j.args::jsonb"
            };
            c.push(format!("{read} @> {}::jsonb", q.bind(v.clone())));
        }
        c.join("\n   AND ")
    }

    /// Runs `run` with this filter and, when it failed because a row's arguments are text
    /// PostgreSQL's jsonb cannot read (a number beyond `numeric`'s range, an escape it
    /// refuses, stored by a raw `INSERT`: the library's defers refuse them), once more with
    /// a filter that reads each row's arguments apart, where such a row matches nothing.
    pub(crate) fn with_args_fallback<T>(
        &self,
        mut run: impl FnMut(&JobFilter) -> Result<T>,
    ) -> Result<T> {
        match run(self) {
            Err(e)
                if self.args_contain.is_some()
                    && !self.args_apart
                    && e.sqlstate().is_some_and(jsonb_cannot_read) =>
            {
                log::debug!("job filter: a row's arguments failed jsonb's input ({e}); reading each row apart");
                let apart = JobFilter {
                    args_apart: true,
                    ..self.clone()
                };
                run(&apart)
            }
            r => r,
        }
    }

    /// Checks the values the conditions compare with stored ones: no NUL in a text, and
    /// times in the years 1 to 9999 (see [`limits::check_time`](crate::limits::check_time)).
    pub(crate) fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("queue filter", &self.queue),
            ("task filter", &self.task),
            ("lock filter", &self.lock),
            ("queueing lock filter", &self.queueing_lock),
            ("error text filter", &self.error_contains),
        ] {
            if let Some(v) = v {
                crate::limits::check_no_nul(what, v)?;
            }
        }
        for t in &self.tags {
            crate::limits::check_no_nul("tag filter", t)?;
        }
        if let Some(v) = &self.args_contain {
            check_json_no_nul(v)?;
        }
        for (what, t) in [
            ("created_after time", self.created_after),
            ("created_before time", self.created_before),
            ("finished_after time", self.finished_after),
            ("finished_before time", self.finished_before),
        ] {
            if let Some(t) = t {
                crate::limits::check_time(what, t)?;
            }
        }
        Ok(())
    }

    /// The listing statement: one row more than the limit, to know if another page exists.
    pub(crate) fn list_sql(&self, q: &mut Query) -> Result<(String, usize)> {
        self.validate()?;
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if limit == 0 {
            return Err(Error::invalid("invalid limit 0: use 1 or more"));
        }
        let mut cond = self.conditions(q);
        let (key, ty) = self.sort.key();
        let desc = self.descending();
        if self.sort == JobSort::Finished {
            cond.push_str("\n   AND j.finished_at IS NOT NULL");
        }
        if let Some(cursor) = &self.after {
            let (value, id) = self.parse_cursor(cursor)?;
            let v = q.bind(value);
            let i = q.bind(id);
            let op = if desc { "<" } else { ">" };
            cond.push_str(&format!(
                "\n   AND ({key}, j.id) {op} ({v}::text::{ty}, {i}::bigint)"
            ));
        }
        let dir = if desc { "DESC" } else { "ASC" };
        let lim = q.bind(i64::from(limit) + 1);
        let sql = format!(
            "SELECT {JOB_COLUMNS}, {key_text}\n  FROM postpone_jobs j\n WHERE {cond}\n \
             ORDER BY {key} {dir}, j.id {dir}\n LIMIT {lim}",
            key_text = self.sort.key_text()
        );
        Ok((sql, limit as usize))
    }

    /// The cursor of a row whose sort key reads as `key`.
    pub(crate) fn cursor(&self, key: &str, id: JobId) -> String {
        let dir = if self.descending() { "desc" } else { "asc" };
        format!("{}:{dir}:{}:{key}", self.sort.as_str(), id.0)
    }

    fn parse_cursor(&self, cursor: &str) -> Result<(String, i64)> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "invalid cursor {cursor:?}: {why} (pass the next_cursor of the previous page, with the same sort)"
            ))
        };
        let mut parts = cursor.splitn(4, ':');
        let (Some(sort), Some(dir), Some(id), Some(key)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("malformed"));
        };
        let want_dir = if self.descending() { "desc" } else { "asc" };
        if sort != self.sort.as_str() || dir != want_dir {
            return Err(bad(&format!(
                "it was made for sort {sort} {dir}, this listing is sorted {} {want_dir}",
                self.sort.as_str()
            )));
        }
        let id: i64 = id.parse().map_err(|_| bad("malformed id"))?;
        let key_ok = match self.sort {
            JobSort::Id => key.parse::<i64>().is_ok(),
            JobSort::Priority => key.parse::<i32>().is_ok(),
            JobSort::Scheduled | JobSort::Finished => cursor_time_ok(key),
        };
        if !key_ok {
            return Err(bad("malformed key"));
        }
        Ok((key.to_owned(), id))
    }
}

/// jsonb cannot hold a NUL (`\u0000`) in a string or a key: such a filter could match
/// nothing, and PostgreSQL would refuse it with a less clear error.
/// SQLSTATEs of jsonb's input refusing text that json's accepted: a number out of range
/// (22003), an escape it cannot store (22P05, 22P02), a string or document too large (54000),
/// nested too deep (54001).
fn jsonb_cannot_read(code: &str) -> bool {
    matches!(code, "22003" | "22P02" | "22P05" | "54000" | "54001")
}

fn check_json_no_nul(v: &serde_json::Value) -> Result<()> {
    match v {
        serde_json::Value::String(s) => crate::limits::check_no_nul("arguments filter", s),
        serde_json::Value::Array(items) => items.iter().try_for_each(check_json_no_nul),
        serde_json::Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            crate::limits::check_no_nul("arguments filter", k)?;
            check_json_no_nul(v)
        }),
        _ => Ok(()),
    }
}

/// Whether `key` reads as the cursor of a time sort writes it (see `JobSort::key_text`):
/// RFC 3339 in UTC to the microsecond, ` BC` after a time before the year 1, or
/// `infinity` / `-infinity`.
fn cursor_time_ok(key: &str) -> bool {
    if key == "infinity" || key == "-infinity" {
        return true;
    }
    let (date, time) = match key.strip_suffix(" BC").unwrap_or(key).split_once('T') {
        Some(parts) => parts,
        None => return false,
    };
    // The year may have more than four digits (PostgreSQL counts to 294276).
    let mut d = date.rsplitn(3, '-');
    let (Some(day), Some(month), Some(year)) = (d.next(), d.next(), d.next()) else {
        return false;
    };
    let digits = |s: &str, n: std::ops::RangeInclusive<usize>| {
        n.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
    };
    let Some(clock) = time.strip_suffix('Z') else {
        return false;
    };
    let (hms, micros) = clock.split_once('.').unwrap_or((clock, "0"));
    let mut t = hms.split(':');
    let (Some(h), Some(m), Some(sec), None) = (t.next(), t.next(), t.next(), t.next()) else {
        return false;
    };
    let within = |s: &str, max: u32| s.parse::<u32>().is_ok_and(|v| v <= max);
    digits(year, 4..=6)
        && digits(month, 2..=2)
        && digits(day, 2..=2)
        && digits(h, 2..=2)
        && digits(m, 2..=2)
        && digits(sec, 2..=2)
        && digits(micros, 1..=6)
        && (1..=12).contains(&month.parse::<u32>().unwrap_or(0))
        && (1..=31).contains(&day.parse::<u32>().unwrap_or(0))
        && within(h, 23)
        && within(m, 59)
        && within(sec, 59)
}

/// A statement's parameters, numbered as they are bound.
#[derive(Default)]
pub(crate) struct Query {
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Query {
    /// Adds a parameter; returns its placeholder (`$3`).
    pub(crate) fn bind<T: ToSql + Sync + Send + 'static>(&mut self, v: T) -> String {
        self.params.push(Box::new(v));
        format!("${}", self.params.len())
    }

    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_cursor_keys_are_read_as_key_text_writes_them() {
        for ok in [
            "2024-05-01T12:00:00.123456Z",
            "0001-01-01T00:00:00.000000Z",
            "4713-11-24T00:00:00.000000Z BC",
            "294276-12-31T23:59:59.000000Z",
            "infinity",
            "-infinity",
        ] {
            assert!(cursor_time_ok(ok), "{ok}");
        }
        for bad in [
            "not a time",
            "",
            "2024-05-01",
            "2024-05-01T12:00:00.123456",
            "2024-13-01T12:00:00.000000Z",
            "2024-05-01T24:00:00.000000Z",
            "2024-05-01T12:00:00.1234567Z",
            "2024-05-01T12:00:00.000000Z AD",
            "-2024-05-01T12:00:00.000000Z",
        ] {
            assert!(!cursor_time_ok(bad), "{bad}");
        }
    }

    #[test]
    fn the_argument_condition_casts_unless_told_to_read_rows_apart() {
        let f = JobFilter::new().args_contain(serde_json::json!({"u": 1}));
        let cast = f.conditions(&mut Query::default());
        assert!(cast.contains("j.args::jsonb @> $1::jsonb"), "{cast}");
        let apart = JobFilter {
            args_apart: true,
            ..f.clone()
        }
        .conditions(&mut Query::default());
        assert!(
            apart.contains("postpone_args_jsonb(j.args) @> $1::jsonb"),
            "{apart}"
        );
        // A failure of another kind is not run again; one of jsonb's input is, once.
        let mut runs = Vec::new();
        let e = f
            .with_args_fallback(|g| -> Result<()> {
                runs.push(g.args_apart);
                Err(crate::Error::invalid("no"))
            })
            .unwrap_err();
        assert_eq!(e.sqlstate(), None);
        assert_eq!(runs, vec![false]);
        assert!(jsonb_cannot_read("22003") && !jsonb_cannot_read("55P03"));
    }

    #[test]
    fn filter_collects_distinct_statuses_and_ids() {
        let f = JobFilter::new()
            .status(JobStatus::Failed)
            .status(JobStatus::Failed)
            .status(JobStatus::Todo)
            .id(JobId(3))
            .id(JobId(3))
            .limit(5);
        assert_eq!(f.statuses, vec![JobStatus::Failed, JobStatus::Todo]);
        assert_eq!(f.ids, vec![JobId(3)]);
        assert_eq!(f.limit, Some(5));
        assert!(!f.is_unfiltered());
        assert!(JobFilter::new().limit(3).is_unfiltered());
    }

    #[test]
    fn cursors_round_trip_and_refuse_another_sort() {
        let f = JobFilter::new().sort(JobSort::Scheduled, false);
        let c = f.cursor("2030-01-02T03:04:05.000000Z", JobId(7));
        assert_eq!(c, "scheduled:asc:7:2030-01-02T03:04:05.000000Z");
        assert_eq!(
            f.parse_cursor(&c).unwrap(),
            ("2030-01-02T03:04:05.000000Z".to_owned(), 7)
        );
        let e = JobFilter::new().parse_cursor(&c).unwrap_err();
        assert!(e.to_string().contains("made for sort scheduled asc"), "{e}");
        assert!(JobFilter::new().parse_cursor("junk").is_err());
        assert!(JobFilter::new().parse_cursor("id:desc:x:1").is_err());
        assert_eq!(JobSort::from_name("FINISHED"), Some(JobSort::Finished));
        assert_eq!(JobSort::from_name("age"), None);
    }

    #[test]
    fn values_are_bound_never_spliced() {
        let f = JobFilter::new()
            .queue("x'; DROP TABLE postpone_jobs; --")
            .error_contains("%_")
            .after("id:desc:10:10");
        let mut q = Query::default();
        let (sql, limit) = f.list_sql(&mut q).unwrap();
        assert!(!sql.contains("DROP"), "{sql}");
        assert_eq!(limit, 100);
        assert_eq!(q.params().len(), 5);
        assert!(
            sql.contains("(j.id, j.id) < ($3::text::bigint, $4::bigint)"),
            "{sql}"
        );
    }
}
