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

    let mut b = String::from("<h1>Jobs</h1>");
    // Filters (GET: the address is the state; works without script).
    b.push_str("<form class=filters method=get action=\"/jobs\">");
    for (name, v) in [("queue", &q.queue), ("task", &q.task), ("lock", &q.lock)] {
        let _ = write!(
            b,
            "<label>{name} <input name={name} value=\"{}\" size=14></label>",
            esc(v.as_deref().unwrap_or(""))
        );
    }
    b.push_str("<label>status <select name=status><option value=\"\">any</option>");
    for s in [
        "todo",
        "doing",
        "succeeded",
        "failed",
        "cancelled",
        "aborted",
    ] {
        let sel = if q.status.as_deref() == Some(s) {
            " selected"
        } else {
            ""
        };
        let _ = write!(b, "<option{sel}>{s}</option>");
    }
    b.push_str("</select></label><button>Filter</button> <a href=\"/jobs\">clear</a></form>");
    b.push_str(
        "<form class=filters method=get action=\"/jobs\"><label>Jump to job \
         <input name=id size=10 inputmode=numeric></label><button>Go</button></form>",
    );

    let filters: String = [
        ("queue", &q.queue),
        ("task", &q.task),
        ("status", &q.status),
        ("lock", &q.lock),
    ]
    .iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}&amp;", url_enc(v))))
    .collect();
    let (has_newer, has_older) = if q.after.is_some() && q.before.is_none() {
        (more, !rows.is_empty())
    } else {
        (q.before.is_some(), more)
    };
    let mut nav = String::from("<nav class=pages>");
    if has_newer {
        let _ = write!(nav, "<a href=\"/jobs?{filters}\">« newest</a>");
        if let Some(first) = rows.first() {
            let _ = write!(
                nav,
                "<a href=\"/jobs?{filters}after={}\">‹ newer</a>",
                first.id
            );
        }
    }
    if has_older {
        if let Some(last) = rows.last() {
            let _ = write!(
                nav,
                "<a href=\"/jobs?{filters}before={}\">older ›</a>",
                last.id
            );
        }
    }
    nav.push_str("</nav>");

    if rows.is_empty() {
        b.push_str("<p class=dim>No jobs match.</p>");
    } else {
        b.push_str(&nav);
        b.push_str(
            "<table><tr><th>Id</th><th>Queue</th><th>Task</th><th>Status</th><th>Priority</th>\
             <th>Attempts</th><th>Lock</th><th>Scheduled</th><th>Finished</th><th>Arguments</th></tr>",
        );
        for j in &rows {
            let _ = write!(
                b,
                "<tr><td><a href=\"/jobs/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td>\
                 <td class=n>{}</td><td class=n>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&j.queue),
                esc(&j.task),
                status(&j.status),
                j.priority,
                j.attempts,
                esc(j.lock.as_deref().unwrap_or("")),
                time(j.scheduled_at),
                opt_time(j.finished_at),
                esc(&j.args),
                id = j.id,
            );
        }
        b.push_str("</table>");
        b.push_str(&nav);
    }
    b.push_str(&cost.footer());
    Ok(Response::html(
        200,
        page("Jobs", "Jobs", None, st.read_only, &b),
    ))
}
