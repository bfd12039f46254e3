//! The workers page: heartbeats, claimed jobs, stalled workers marked.

use super::*;

pub(super) fn workers(st: &State) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let ws = st.admin.workers()?;
    cost.queries += 1;
    let mut b = String::from("<h1>Workers</h1>");
    if ws.is_empty() {
        b.push_str("<p class=dim>No worker is registered.</p>");
    } else {
        let _ = write!(
            b,
            "<p class=dim>Marked stalled: no heartbeat for more than {}.</p>\
             <table><tr><th>Id</th><th>Name</th><th>Host</th><th>Pid</th><th>Queues</th>\
             <th>Concurrency</th><th>Heartbeat age</th><th>Claimed</th><th>Started</th></tr>",
            age(st.stalled_after)
        );
        for w in &ws {
            let stalled = w.heartbeat_age > st.stalled_after;
            let queues = match &w.queues {
                None => "<span class=dim>all</span>".to_owned(),
                Some(q) => q.iter().map(|q| esc(q)).collect::<Vec<_>>().join(", "),
            };
            let _ = write!(
                b,
                "<tr{}><td class=n>{}</td><td>{}</td><td>{}</td><td class=n>{}</td><td>{queues}</td>\
                 <td class=n>{}</td><td class=n>{}{}</td><td class=n>{}</td><td>{}</td></tr>",
                if stalled { " class=stalled" } else { "" },
                w.id,
                esc(&w.name),
                esc(&w.host),
                w.pid,
                w.concurrency,
                age(w.heartbeat_age),
                if stalled { " <strong class=err>stalled</strong>" } else { "" },
                w.claimed,
                time(w.started_at),
            );
        }
        b.push_str("</table>");
    }
    b.push_str(&cost.footer());
    Ok(Response::html(
        200,
        page("Workers", "Workers", Some(10), st.read_only, &b),
    ))
}
