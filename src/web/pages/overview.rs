//! The overview page: per-queue counts, pauses, limits (concurrency, key, rate) and why due
//! jobs wait, and the last hour as a chart.

use super::*;

pub(super) fn overview(st: &State, req: &Request) -> Result<Response, Error> {
    use crate::web::charts::{self, Range};
    let range = match req.param("range") {
        None => Range::Hour,
        Some(r) => Range::from_name(r).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("unknown range {r:?}: use hour, day or week"),
            )
        })?,
    };
    let queue = req.param("queue");
    let mut cost = Cost::new();
    let (data, fresh) = st.overview_data()?;
    if fresh {
        // Counts (with the pauses and the three kinds of limits they show: 5), throughput,
        // workers, pauses.
        cost.queries += 7;
    }
    let history = {
        let mut conn = st.app.connection()?;
        charts::history(&mut conn, range, queue)?
    };
    cost.queries += 2;
    let (counts, workers) = (&data.counts, &data.workers);
    // Past its own lease, lengthened to the dashboard's threshold.
    let stalled = workers
        .iter()
        .filter(|w| w.stale && w.heartbeat_age > st.stalled_after)
        .count();

    // A pause button (or resume) for a queue, or for every queue with `None`.
    let flow_button = |queue: Option<&str>, paused: bool| -> Markup {
        let (action, label) = if paused {
            ("resume", "Resume")
        } else {
            ("pause", "Pause")
        };
        html! {
            @if !st.read_only {
                form.inline method="post" action=(st.link(&format!("/queues/{action}"))) {
                    @if let Some(q) = queue {
                        input type="hidden" name="queue" value=(q);
                    }
                    input type="hidden" name="csrf" value=(st.csrf);
                    @if queue.is_none() {
                        button name="go" value="1" id={ (action) "-all" } { (label) " every queue" }
                    } @else {
                        button name="go" value="1" { (label) }
                    }
                }
            }
        }
    };
    let jobs = st.link("/jobs");
    let link = |q: &str, s: &str, n: u64| -> Markup {
        html! {
            @if n == 0 {
                td.n.dim { "0" }
            } @else {
                td.n { a href={ (jobs) "?queue=" (url_enc(q)) "&status=" (s) } { (n) } }
            }
        }
    };
    let body = html! {
        h1 { "Overview" }
        div #overview-live data-live="overview" {
        h2 { "Queues" }
        @if let Some(at) = data.pauses.all {
            p.err {
                "Every queue is paused (since " (crate::admin::rfc3339(at)) " UTC): no job starts. "
                (flow_button(None, true))
            }
        } @else {
            p { (flow_button(None, false)) }
        }
        @if counts.is_empty() {
            p.dim { "No jobs yet." }
        } @else {
            div.scroll { table #queues {
                tr { th { "Queue" } th.n { "Due" } th.n { "Scheduled" } th.n { "Running" }
                     th.n { "Succeeded" } th.n { "Failed" } th.n { "Cancelled" } th.n { "Aborted" }
                     th { "Oldest due job waits" } th { "Limits" } th { "Due jobs wait for" } th { "Flow" } }
                @for c in counts.iter() {
                    @let own = data.pauses.queues.iter().any(|p| p.queue.as_deref() == Some(c.queue.as_str()));
                    tr {
                        td { a href={ (jobs) "?queue=" (url_enc(&c.queue)) } { (Shown(&c.queue)) } }
                        (link(&c.queue, "todo", c.todo))
                        (link(&c.queue, "todo", c.scheduled))
                        (link(&c.queue, "doing", c.doing))
                        (link(&c.queue, "succeeded", c.succeeded))
                        (link(&c.queue, "failed", c.failed))
                        @if c.expired > 0 {
                            // Of the cancelled ones, those not started by their deadline.
                            td.n {
                                a href={ (jobs) "?queue=" (url_enc(&c.queue)) "&status=cancelled" } { (c.cancelled) }
                                " " span.dim title="not started by their deadline" { "(" (c.expired) " expired)" }
                            }
                        } @else {
                            (link(&c.queue, "cancelled", c.cancelled))
                        }
                        (link(&c.queue, "aborted", c.aborted))
                        td.n { (c.oldest_todo_age.map(age).unwrap_or_else(|| "–".to_owned())) }
                        td.limits { (limits_cell(c)) }
                        td.why { (why_cell(c)) }
                        td {
                            // Its own pause can be lifted here; the pause of all, above.
                            @if c.paused { span.err { "paused" } " " }
                            @if data.pauses.all.is_none() || own {
                                (flow_button(Some(&c.queue), own))
                            }
                        }
                    }
                }
            } }
            @if data.more_queues {
                p.dim #queues-cut {
                    "More queues have jobs: only the first " (OVERVIEW_QUEUES)
                    " by name (and every paused one) are listed here. "
                    a href=(jobs) { "The jobs list" } " filters by queue; "
                    code { "postpone stats" } " lists them all."
                }
            }
        }
        h2 #history {
            "Finished jobs"
            @if let Some(q) = queue { " of queue " (Shown(q)) }
            " · "
            @for (i, r) in Range::ALL.into_iter().enumerate() {
                @if i > 0 { " " }
                @if r == range {
                    strong { "last " (r.name()) }
                } @else {
                    a href={ (st.link("/")) "?range=" (r.name())
                             @if let Some(q) = queue { "&queue=" (url_enc(q)) } "#history" } { "last " (r.name()) }
                }
            }
        }
        div.charts {
            div.chart { h3 { "Per outcome" } (charts::by_outcome(range, &history)) }
            @if queue.is_none() {
                div.chart { h3 { "Per queue" } (charts::by_queue(range, &history)) }
            }
            div.chart { h3 { "Wait before start" } (charts::waits(range, &history)) }
        }
        h2 { "Workers" }
        p {
            a href=(st.link("/workers")) { (workers.len()) " registered" }
            @if stalled > 0 { ", " span.err { (stalled) " stalled" } }
        }
        }
        (cost.footer())
        @if !fresh {
            p.dim { "(figures shared with a request of the last 5 s)" }
        }
    };
    // A table large enough to make the figures slow is reloaded less often.
    let refresh = if data.took > Duration::from_millis(500) {
        30
    } else {
        10
    };
    Ok(st.page(200, "Overview", "Overview", Some(refresh), body))
}

/// Names of unknown tasks a queue's row shows.
const UNKNOWN_SHOWN: usize = 5;

/// The queue's limits, one per line: concurrency, per key, rate.
fn limits_cell(c: &crate::QueueCounts) -> Markup {
    let mut parts = Vec::new();
    if let Some(n) = c.max_running {
        parts.push(format!("at most {n} running"));
    }
    if let (Some(n), Some(arg)) = (c.max_per_key, c.key_arg.as_deref()) {
        parts.push(format!("at most {n} running per {arg}"));
    }
    if let (Some(n), Some(per)) = (c.max_starts, c.rate_period) {
        let starts = if n == 1 { "start" } else { "starts" };
        parts.push(format!("at most {n} {starts} per {}", age(per)));
    }
    lines(parts)
}

/// One line per part; a dim dash when there is none.
fn lines(parts: Vec<String>) -> Markup {
    html! {
        @if parts.is_empty() {
            (dash())
        }
        @for (i, p) in parts.iter().enumerate() {
            @if i > 0 { br; }
            (Shown(p))
        }
    }
}

/// Why the queue's due jobs do not all run now, with the detail of each reason.
fn why_cell(c: &crate::QueueCounts) -> Markup {
    let parts: Vec<String> = c
        .waiting_reasons()
        .into_iter()
        .map(|r| match r {
            "key limit reached" => format!("key limit reached ({} waiting)", c.key_held),
            "lock held" => format!("lock held ({} waiting)", c.lock_held),
            "unknown task" => {
                // A few names: a queue can hold jobs of any number of tasks.
                let more = c.unknown_tasks.len().saturating_sub(UNKNOWN_SHOWN);
                format!(
                    "no worker knows task {}{}",
                    c.unknown_tasks
                        .iter()
                        .take(UNKNOWN_SHOWN)
                        .map(|t| format!("{t:?}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                )
            }
            "rate limited" => match c.next_start_in {
                Some(d) => format!("rate limited (next start in {})", age(d)),
                None => r.to_owned(),
            },
            _ => r.to_owned(),
        })
        .collect();
    html! {
        @if parts.is_empty() && c.waiting_for_dependencies == 0 {
            (dash())
        }
        @for (i, p) in parts.iter().enumerate() {
            @if i > 0 { br; }
            span.err.why { (Shown(p)) }
        }
        @if c.waiting_for_dependencies > 0 {
            @if !parts.is_empty() { br; }
            span.dim.why { (c.waiting_for_dependencies) " after their dependencies" }
        }
    }
}
