//! The jobs page: filters and keyset pages.

use super::*;

pub(super) fn jobs(st: &State, req: &Request) -> Result<Response, Error> {
    if let Some(id) = req.param("id") {
        let id = parse_id(id)?;
        return Ok(Response::redirect(format!("/jobs/{id}")));
    }
    let status_filter = match req.param("status") {
        Some(s) => Some(
            s.parse::<JobStatus>()
                .map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?
                .as_str()
                .to_owned(),
        ),
        None => None,
    };
    let cursor = |name: &str| -> Result<Option<i64>, Error> {
        req.param(name)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    Error::new(ErrorKind::InvalidInput, format!("bad {name} cursor {v:?}"))
                })
            })
            .transpose()
    };
    for name in ["queue", "task", "lock"] {
        if let Some(v) = req.param(name) {
            crate::limits::check_no_nul(&format!("{name} filter"), v)?;
        }
    }
    let q = JobQuery {
        queue: req.param("queue").map(str::to_owned),
        task: req.param("task").map(str::to_owned),
        status: status_filter,
        lock: req.param("lock").map(str::to_owned),
        before: cursor("before")?,
        after: cursor("after")?,
    };
    let mut cost = Cost::new();
    let (rows, more) = {
        let mut conn = st.app.connection()?;
        queries::jobs(&mut conn, &q, PAGE)?
    };
    cost.queries += 1;

    let filters: String = [
        ("queue", &q.queue),
        ("task", &q.task),
        ("status", &q.status),
        ("lock", &q.lock),
    ]
    .iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}&", url_enc(v))))
    .collect();
    let (has_newer, has_older) = if q.after.is_some() && q.before.is_none() {
        (more, !rows.is_empty())
    } else {
        (q.before.is_some(), more)
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
    let body = html! {
        h1 { "Jobs" }
        // Filters (GET: the address is the state; works without script).
        form.filters method="get" action=(here) {
            @for (name, v) in [("queue", &q.queue), ("task", &q.task), ("lock", &q.lock)] {
                label { (name) " " input name=(name) value=(v.as_deref().unwrap_or("")) size="14"; }
            }
            label { "status "
                select name="status" {
                    option value="" { "any" }
                    @for s in ["todo", "doing", "succeeded", "failed", "cancelled", "aborted"] {
                        option selected[q.status.as_deref() == Some(s)] { (s) }
                    }
                }
            }
            button { "Filter" } " " a href=(here) { "clear" }
        }
        form.filters method="get" action=(here) {
            label { "Jump to job " input name="id" size="10" inputmode="numeric"; }
            button { "Go" }
        }
        @if rows.is_empty() {
            p.dim { "No jobs match." }
        } @else {
            (nav)
            div.scroll { table {
                tr { th { "Id" } th { "Queue" } th { "Task" } th { "Status" } th { "Priority" }
                     th { "Attempts" } th { "Lock" } th { "Scheduled" } th { "Finished" } th { "Arguments" } }
                @for j in &rows {
                    tr {
                        td { a href=(st.link(&format!("/jobs/{}", j.id))) { (j.id) } }
                        td { (Shown(&j.queue)) } td { (Shown(&j.task)) } td { (status(&j.status)) }
                        td.n { (j.priority) } td.n { (j.attempts) }
                        td { (Shown(j.lock.as_deref().unwrap_or(""))) }
                        td { (Time(j.scheduled_at)) } td { (opt_time(j.finished_at)) }
                        td { code { (Shown(&j.args)) } }
                    }
                }
            } }
            (nav)
        }
        (cost.footer())
    };
    Ok(st.page(200, "Jobs", "Jobs", None, body))
}
