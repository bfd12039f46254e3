//! The jobs page: filters (status, queue, task, lock, tag, error text, arguments
//! containment, time range), a capped count of matches, keyset pages, and bulk retry,
//! cancel and delete of every matching job through the admin API (a dry run first, whose
//! count is shown before the operator confirms).

use std::time::Duration;

use super::*;
use crate::admin::{BulkAction, JobFilter};

/// Matches counted at most: a count over millions of rows costs what this many do.
const COUNT_CAP: i64 = 10_000;

/// The filter fields of the jobs page as the operator typed them: kept as text to fill the
/// form again and to build links, read into a [`JobFilter`] by [`JobsForm::filter`].
#[derive(Clone, Debug, Default)]
pub(super) struct JobsForm {
    status: String,
    queue: String,
    task: String,
    lock: String,
    tag: String,
    error: String,
    args: String,
    since: String,
    from: String,
    to: String,
}

/// The presets of the time range, on the time jobs were deferred.
const SINCE: &[(&str, &str, u64)] = &[
    ("15m", "last 15 minutes", 15 * 60),
    ("1h", "last hour", 3600),
    ("24h", "last 24 hours", 86_400),
    ("7d", "last 7 days", 7 * 86_400),
    ("30d", "last 30 days", 30 * 86_400),
];

impl JobsForm {
    /// The fields among `pairs` (a query or a form body); others are ignored.
    pub(super) fn from_pairs(pairs: &[(String, String)]) -> JobsForm {
        let mut f = JobsForm::default();
        for (k, v) in pairs {
            let v = v.trim().to_owned();
            match k.as_str() {
                "status" => f.status = v,
                "queue" => f.queue = v,
                "task" => f.task = v,
                "lock" => f.lock = v,
                "tag" => f.tag = v,
                "error" => f.error = v,
                "args" => f.args = v,
                "since" => f.since = v,
                "from" => f.from = v,
                "to" => f.to = v,
                _ => {}
            }
        }
        f
    }

    fn fields(&self) -> [(&'static str, &str); 10] {
        [
            ("status", &self.status),
            ("queue", &self.queue),
            ("task", &self.task),
            ("lock", &self.lock),
            ("tag", &self.tag),
            ("error", &self.error),
            ("args", &self.args),
            ("since", &self.since),
            ("from", &self.from),
            ("to", &self.to),
        ]
    }

    /// The fields set, as `name=value&` pairs for a link.
    pub(super) fn query(&self) -> String {
        self.fields()
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}&", url_enc(v)))
            .collect()
    }

    /// The fields set, as hidden inputs of a form.
    fn hidden(&self) -> Markup {
        html! {
            @for (k, v) in self.fields() {
                @if !v.is_empty() {
                    input type="hidden" name=(k) value=(v);
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.fields().iter().all(|(_, v)| v.is_empty())
    }

    /// The filter these fields describe; a value that cannot be read is an `InvalidInput`
    /// error naming the field.
    pub(super) fn filter(&self, now: SystemTime) -> Result<JobFilter, Error> {
        let bad = |what: String| Error::new(ErrorKind::InvalidInput, what);
        let mut f = JobFilter::new();
        if !self.status.is_empty() {
            for s in self
                .status
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
            {
                f = f.status(s.parse::<JobStatus>().map_err(|e| bad(e.to_string()))?);
            }
        }
        if !self.queue.is_empty() {
            f = f.queue(&self.queue);
        }
        if !self.task.is_empty() {
            f = f.task(&self.task);
        }
        if !self.lock.is_empty() {
            f = f.lock(&self.lock);
        }
        for t in self.tag.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            f = f.tag(t);
        }
        if !self.error.is_empty() {
            f = f.error_contains(&self.error);
        }
        if !self.args.is_empty() {
            let v: serde_json::Value = serde_json::from_str(&self.args).map_err(|e| {
                bad(format!(
                    "arguments filter: {e}; write JSON, e.g. {{\"user\": 42}} matches every job \
                     whose arguments hold the key user with the value 42"
                ))
            })?;
            f = f.args_contain(v);
        }
        if !self.since.is_empty() {
            let (_, _, secs) = SINCE
                .iter()
                .find(|(k, _, _)| *k == self.since)
                .ok_or_else(|| bad(format!("unknown time range {:?}", self.since)))?;
            f = f.created_after(now - Duration::from_secs(*secs));
        }
        if !self.from.is_empty() {
            f = f.created_after(parse_utc("from", &self.from)?);
        }
        if !self.to.is_empty() {
            f = f.created_before(parse_utc("to", &self.to)?);
        }
        f.validate()?;
        Ok(f)
    }
}

/// `2024-05-01`, `2024-05-01T12:00` (what a browser's date-time input sends),
/// `2024-05-01 12:00:00`, all in UTC, or RFC 3339 with its own offset.
fn parse_utc(what: &str, s: &str) -> Result<SystemTime, Error> {
    use chrono::{DateTime, NaiveDate, NaiveDateTime};
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(SystemTime::from(t));
    }
    let naive = [
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S",
    ]
    .iter()
    .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
    .or_else(|| {
        NaiveDate::parse_from_str(s, "%Y-%m-%d")
            .ok()
            .and_then(|d| d.and_hms_opt(0, 0, 0))
    });
    match naive {
        Some(t) => Ok(SystemTime::from(t.and_utc())),
        None => Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{what} time {s:?}: write 2024-05-01 or 2024-05-01T12:00 (UTC)"),
        )),
    }
}

/// A cursor parameter (`before`, `after`): a job id.
fn cursor(req: &Request, name: &str) -> Result<Option<i64>, Error> {
    req.param(name)
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                Error::new(ErrorKind::InvalidInput, format!("bad {name} cursor {v:?}"))
            })
        })
        .transpose()
}

/// The actions of the bulk form: name, button label, past tense.
const BULK: &[(&str, &str, &str)] = &[
    ("retry", "Retry", "retried"),
    ("cancel", "Cancel", "cancelled"),
    ("delete", "Delete", "deleted"),
];

fn bulk_action(name: &str) -> Option<BulkAction> {
    match name {
        "retry" => Some(BulkAction::Retry),
        "cancel" => Some(BulkAction::Cancel),
        "delete" => Some(BulkAction::Delete),
        _ => None,
    }
}

pub(super) fn jobs(st: &State, req: &Request) -> Result<Response, Error> {
    if let Some(id) = req.param("id") {
        let id = parse_id(id)?;
        return Ok(Response::redirect(st.link(&format!("/jobs/{id}"))));
    }
    let form = JobsForm::from_pairs(&req.query);
    let filter = form.filter(SystemTime::now())?;
    let (before, after) = (cursor(req, "before")?, cursor(req, "after")?);
    let mut cost = Cost::new();
    let (rows, more, count) = {
        let mut conn = st.app.connection()?;
        let (rows, more) = queries::jobs(&mut conn, &filter, before, after, PAGE)?;
        // The first page of a listing counts its matches; the others need not.
        let count = if before.is_none() && after.is_none() {
            cost.queries += 1;
            Some(queries::count(&mut conn, &filter, COUNT_CAP)?)
        } else {
            None
        };
        (rows, more, count)
    };
    cost.queries += 1;

    let filters = form.query();
    let (has_newer, has_older) = if after.is_some() && before.is_none() {
        (more, !rows.is_empty())
    } else {
        (before.is_some(), more)
    };
    let here = st.link("/jobs");
    let nav = html! {
        nav.pages {
            @if has_newer {
                a href={ (here) "?" (filters) } { "« newest" }
                @if let Some(first) = rows.first() {
                    a href={ (here) "?" (filters) "after=" (first.id) } { "‹ newer" }
                }
            }
            @if has_older {
                @if let Some(last) = rows.last() {
                    a href={ (here) "?" (filters) "before=" (last.id) } { "older ›" }
                }
            }
        }
    };
    let done = bulk_done(req);
    let body = html! {
        h1 { "Jobs" }
        @if let Some(d) = done { p.flash #bulk-done { (d) } }
        (filter_form(st, &form))
        div #jobs-live data-live="jobs" {
        div.bar {
            @if let Some(n) = count {
                span #count {
                    @if n > COUNT_CAP { "more than " (COUNT_CAP) " jobs match" }
                    @else if n == 1 { "1 job matches" }
                    @else { (n) " jobs match" }
                }
            }
            @if !st.read_only && !form.is_empty() && !rows.is_empty() {
                (bulk_form(st, &form))
            }
        }
        div {
            @if rows.is_empty() {
                p.dim { "No jobs match." }
            } @else {
                (nav)
                (jobs_table(st, &rows))
                (nav)
            }
        }
        }
        (cost.footer())
    };
    Ok(st.page(200, "Jobs", "Jobs", None, body))
}

/// The flash after a bulk action: the action's fixed words and the counts as numbers, so a
/// crafted link cannot make the page say anything else.
fn bulk_done(req: &Request) -> Option<String> {
    let action = req.param("bulk")?;
    let (_, _, past) = BULK.iter().find(|(k, _, _)| *k == action)?;
    let n = |k: &str| {
        req.param(k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(format!(
        "{} job(s) {past}; {} skipped (their status did not allow it, or they changed meanwhile).",
        n("changed"),
        n("skipped")
    ))
}

fn filter_form(st: &State, form: &JobsForm) -> Markup {
    let here = st.link("/jobs");
    html! {
        form.filters method="get" action=(here) aria-label="Filter jobs" {
            label { "Status"
                select name="status" {
                    option value="" { "any" }
                    @for s in ["todo", "doing", "succeeded", "failed", "cancelled", "aborted"] {
                        option selected[form.status == s] { (s) }
                    }
                    option value="failed,cancelled,aborted"
                        selected[form.status == "failed,cancelled,aborted"] { "failed, cancelled or aborted" }
                }
            }
            label { "Queue" input name="queue" value=(form.queue) size="12"; }
            label { "Task" input name="task" value=(form.task) size="14"; }
            label { "Tag" input name="tag" value=(form.tag) size="10"; }
            label { "Error contains" input name="error" value=(form.error) size="16"; }
            label { "Arguments contain (JSON)"
                input name="args" value=(form.args) size="18" placeholder="{\"user\": 42}";
            }
            label { "Deferred"
                select name="since" {
                    option value="" { "any time" }
                    @for (k, label, _) in SINCE {
                        option value=(k) selected[form.since == *k] { (label) }
                    }
                }
            }
            label { "From (UTC)" input type="datetime-local" name="from" value=(form.from); }
            label { "To (UTC)" input type="datetime-local" name="to" value=(form.to); }
            @if !form.lock.is_empty() {
                label { "Lock" input name="lock" value=(form.lock) size="12"; }
            }
            div { button.primary { "Filter" } " " a href=(here) { "clear" } }
        }
        form.filters method="get" action=(here) aria-label="Jump to a job" {
            label { "Jump to job" input name="id" size="10" inputmode="numeric"; }
            div { button { "Go" } }
        }
    }
}

fn bulk_form(st: &State, form: &JobsForm) -> Markup {
    html! {
        form.inline method="post" action=(st.link("/jobs/bulk")) {
            (form.hidden())
            input type="hidden" name="csrf" value=(st.csrf);
            "Every matching job: "
            @for (k, label, _) in BULK {
                button name="action" value=(k) id={ "bulk-" (k) } { (label) "…" } " "
            }
        }
    }
}

fn jobs_table(st: &State, rows: &[queries::JobRow]) -> Markup {
    let here = st.link("/jobs");
    html! {
        div.scroll { table #jobs {
            tr { th.n { "Id" } th { "Status" } th { "Task" } th { "Queue" } th.n { "Attempts" }
                 th { "Deferred" } th { "Finished" } th.n { "Duration" } th { "Tags" }
                 th { "Last error" } th { "Arguments" } }
            @for j in rows {
                @let waiting = j.status == "doing" && !queries::is_running(&j.status, j.started_at);
                tr {
                    td.n { a href=(st.link(&format!("/jobs/{}", j.id))) { (j.id) } }
                    td {
                        @if waiting { span.status.s-waiting title="held by a worker, not started" { "waiting" } }
                        @else { (status(&j.status)) }
                    }
                    td {
                        (Shown(&j.task))
                        @if let Some(l) = &j.lock { br; span.dim { "lock " (Shown(l)) } }
                    }
                    td {
                        (Shown(&j.queue))
                        @if j.priority != 0 { " " span.dim { "priority " (j.priority) } }
                    }
                    td.n { (j.attempts) }
                    td {
                        (Time(j.created_at))
                        @if j.after_dependencies {
                            br; span.dim.after-deps { "after its dependencies" }
                        } @else if j.scheduled_at > j.created_at && j.started_at.is_none() {
                            br; span.dim { "due " (Time(j.scheduled_at)) }
                        }
                    }
                    td { (opt_time(j.finished_at)) }
                    td.n {
                        @if let Some(s) = j.running_for {
                            span.dim { "running " } (age(crate::admin::info::secs(s).unwrap_or_default()))
                        } @else if let (Some(a), Some(b)) = (j.started_at, j.finished_at) {
                            @match b.duration_since(a) {
                                Ok(d) => (age(d)),
                                Err(_) => (dash()),
                            }
                        } @else { (dash()) }
                    }
                    td {
                        @for t in &j.tags {
                            a.tag href={ (here) "?tag=" (url_enc(t)) } { (Shown(t)) }
                        }
                        @if j.tags_total as usize > j.tags.len() {
                            " " span.dim { "+" (j.tags_total as usize - j.tags.len()) " more" }
                        }
                    }
                    td.err {
                        @if let Some(e) = &j.last_error {
                            // The message: a panic's backtrace is on the job's page.
                            code { (Shown(e.split(crate::admin::info::BACKTRACE_MARK).next().unwrap_or(e))) }
                        }
                    }
                    td { code { (Shown(&j.args)) } }
                }
            }
        } }
    }
}

/// `POST /jobs/bulk`: without `confirm`, a dry run whose counts are shown with a button to
/// confirm; with it, the action on every matching job, then the list with what was done.
pub(super) fn bulk(st: &State, req: &Request) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let pairs = req.form();
    let value = |k: &str| {
        pairs
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    let Some(action) = value("action").and_then(bulk_action) else {
        return Ok(Response::text(
            400,
            "bulk: no such action; use retry, cancel or delete\n",
        ));
    };
    let form = JobsForm::from_pairs(&pairs);
    let filter = form.filter(SystemTime::now())?;
    let (_, label, past) = BULK
        .iter()
        .find(|(k, _, _)| *k == action.as_str())
        .copied()
        .unwrap_or(("", "", ""));
    if value("confirm") == Some("1") {
        let r = st.admin.bulk(action, &filter, false)?;
        return Ok(Response::redirect(format!(
            "{}?{}bulk={}&changed={}&skipped={}",
            st.link("/jobs"),
            form.query(),
            action.as_str(),
            r.changed,
            r.skipped
        )));
    }
    let mut cost = Cost::new();
    let plan = st.admin.bulk(action, &filter, true)?;
    cost.queries += 1;
    let body = html! {
        h1 { (label) " matching jobs?" }
        p #plan {
            (plan.matched) " job(s) match the filter now; "
            strong { (plan.changed) " would be " (past) }
            ", " (plan.skipped) " skipped ("
            (action.rule()) ")."
        }
        p.dim { "Jobs that change status meanwhile are checked again and skipped if the rule no longer allows them." }
        @if plan.changed > 0 {
            form.inline method="post" action=(st.link("/jobs/bulk")) {
                (form.hidden())
                input type="hidden" name="csrf" value=(st.csrf);
                input type="hidden" name="action" value=(action.as_str());
                input type="hidden" name="confirm" value="1";
                button.primary.danger[action == BulkAction::Delete] #confirm {
                    (label) " " (plan.changed) " job(s)"
                }
            }
            " "
        }
        a href={ (st.link("/jobs")) "?" (form.query()) } { "Back to the list" }
        (cost.footer())
    };
    Ok(st.page(200, &format!("{label} jobs"), "Jobs", None, body))
}
