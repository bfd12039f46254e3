//! The workers page: heartbeats, claimed jobs, stalled workers marked.

use super::*;

pub(super) fn workers(st: &State) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let ws = st.admin.workers()?;
    cost.queries += 1;
    let body = html! {
        h1 { "Workers" }
        @if ws.is_empty() {
            p.dim { "No worker is registered." }
        } @else {
            p.dim { "Marked stalled: no heartbeat for more than " (age(st.stalled_after)) "." }
            div.scroll { table #workers {
                tr { th.n { "Id" } th { "Name" } th { "Host" } th.n { "Pid" } th { "Queues" }
                     th.n { "Concurrency" } th.n { "Heartbeat age" } th.n { "Claimed" } th { "Started" } }
                @for w in &ws {
                    @let stalled = w.heartbeat_age > st.stalled_after;
                    tr.stalled[stalled] {
                        td.n { (w.id) }
                        td { (Shown(&w.name)) }
                        td { (Shown(&w.host)) }
                        td.n { (w.pid) }
                        td {
                            @match &w.queues {
                                None => span.dim { "all" },
                                Some(q) => (Shown(&q.join(", "))),
                            }
                        }
                        td.n { (w.concurrency) }
                        td.n {
                            (age(w.heartbeat_age))
                            @if stalled { " " strong.err { "stalled" } }
                        }
                        td.n { (w.claimed) }
                        td { (Time(w.started_at)) }
                    }
                }
            } }
        }
        (cost.footer())
    };
    Ok(st.page(200, "Workers", "Workers", Some(10), body))
}
