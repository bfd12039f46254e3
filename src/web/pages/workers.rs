//! The workers page: heartbeats, what each worker runs now (and holds without having
//! started it), stalled workers marked, and the operator's remedies for them (requeue
//! their jobs, forget their rows) through the admin API, each count shown before the click.

use super::*;

/// Held jobs listed at most, over all workers.
const HELD_SHOWN: i64 = 500;

pub(super) fn workers(st: &State, done: Option<&str>) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let ws = st.admin.workers_stale_after(st.stalled_after)?;
    let held = {
        let mut conn = st.app.connection()?;
        queries::held_jobs(&mut conn, HELD_SHOWN)?
    };
    cost.queries += 2;
    let stalled = ws.iter().filter(|w| w.stale).count();
    // What a requeue and a forget would touch now (dry runs).
    let (requeue, forget) = if stalled > 0 && !st.read_only {
        cost.queries += 2;
        (
            st.admin.requeue_stalled(st.stalled_after, true)?.jobs,
            st.admin.forget_workers(st.stalled_after, true)?.workers,
        )
    } else {
        (0, 0)
    };
    // Fixed texts only, numbers parsed: a crafted link says nothing else.
    let done_text = done.and_then(|d| {
        let (what, n) = d.split_once('-')?;
        let n: u64 = n.parse().ok()?;
        match what {
            "requeued" => Some(format!("{n} stalled job(s) requeued.")),
            "forgotten" => Some(format!("{n} stalled worker(s) forgotten.")),
            _ => None,
        }
    });
    let action = |path: &str, id: &str, label: String| -> Markup {
        html! {
            form.inline method="post" action=(st.link(path)) {
                input type="hidden" name="csrf" value=(st.csrf);
                button name="go" value="1" id=(id) { (label) }
            }
            " "
        }
    };
    let body = html! {
        h1 { "Workers" }
        @if let Some(t) = done_text { p.flash { (t) } }
        div #workers-live data-live="workers" {
        @if ws.is_empty() {
            p.dim { "No worker is registered." }
        } @else {
            p.dim {
                "Marked stalled: no heartbeat for longer than its lease (its own stalled_after"
                @if !st.stalled_after.is_zero() { ", at least " (age(st.stalled_after)) }
                "). Running: started by a thread; waiting: held by the worker, not started yet."
            }
            @if requeue > 0 || forget > 0 {
                p.bar {
                    @if requeue > 0 {
                        (action("/workers/requeue", "requeue-stalled",
                                format!("Requeue the {requeue} job(s) of stalled workers")))
                    }
                    @if forget > 0 {
                        (action("/workers/forget", "forget-stalled",
                                format!("Forget the {forget} stalled worker(s)")))
                    }
                }
            }
            div.scroll { table #workers {
                tr { th.n { "Id" } th { "Name" } th { "Host" } th.n { "Pid" } th { "Queues" }
                     th.n { "Threads" } th.n { "Heartbeat age" } th.n { "Lease" }
                     th { "Running now" }
                     th.n { "Waiting" } th { "Started" } }
                @for w in &ws {
                    @let mine: Vec<&queries::HeldJob> = held.iter().filter(|h| h.worker_id == w.id).collect();
                    @let running: Vec<&&queries::HeldJob> = mine.iter().filter(|h| h.running_for.is_some()).collect();
                    @let waiting = w.claimed.saturating_sub(running.len() as u64);
                    tr.stalled[w.stale] {
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
                            @if w.stale { " " strong.err { "stalled" } }
                        }
                        td.n {
                            @match w.stalled_after {
                                Some(d) => (age(d)),
                                None => span.dim title="a worker older than schema 22: judged by the longest lease" { "unrecorded" },
                            }
                        }
                        td.running {
                            @if running.is_empty() { (dash()) }
                            @for h in &running {
                                a href=(st.link(&format!("/jobs/{}", h.id))) { (h.id) }
                                " " (Shown(&h.task)) " "
                                span.dim { "for " (age(crate::admin::info::secs(h.running_for.unwrap_or(0.0)).unwrap_or_default())) }
                                br;
                            }
                        }
                        td.n { (waiting) }
                        td { (Time(w.started_at)) }
                    }
                }
            } }
        }
        }
        (cost.footer())
    };
    Ok(st.page(200, "Workers", "Workers", Some(10), body))
}

/// `POST /workers/requeue` and `/workers/forget`: the admin API's remedies for workers
/// whose lease has ended (lengthened to the dashboard's `stalled_after`).
pub(super) fn act_workers(st: &State, req: &Request, action: &str) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let done = match action {
        "requeue" => format!(
            "requeued-{}",
            st.admin.requeue_stalled(st.stalled_after, false)?.jobs
        ),
        "forget" => format!(
            "forgotten-{}",
            st.admin.forget_workers(st.stalled_after, false)?.workers
        ),
        _ => return Ok(Response::text(404, "no such action\n")),
    };
    Ok(Response::redirect(
        st.link(&format!("/workers?done={done}")),
    ))
}
