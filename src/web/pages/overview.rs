//! The overview page: per-queue counts, pauses, limits (concurrency, key, rate) and why due
//! jobs wait, and the last hour as a chart.

use super::*;

pub(super) fn overview(st: &State) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let (data, fresh) = st.overview_data()?;
    if fresh {
        // Counts (with the pauses and the three kinds of limits they show: 5), throughput,
        // workers, pauses.
        cost.queries += 8;
    }
    let (counts, minutes, workers) = (&data.counts, &data.minutes, &data.workers);
    let stalled = workers
        .iter()
        .filter(|w| w.heartbeat_age > st.stalled_after)
        .count();

    let mut b = String::new();
    b.push_str("<h1>Overview</h1><h2>Queues</h2>");
    // A pause button (or resume) for a queue, or for every queue with `None`.
    let flow_button = |queue: Option<&str>, paused: bool| -> String {
        if st.read_only {
            return String::new();
        }
        let (action, label) = if paused {
            ("resume", "Resume")
        } else {
            ("pause", "Pause")
        };
        let (field, id) = match queue {
            Some(q) => (
                format!("<input type=hidden name=queue value=\"{}\">", esc(q)),
                String::new(),
            ),
            None => (String::new(), format!(" id=\"{action}-all\"")),
        };
        format!(
            "<form class=inline method=post action=\"/queues/{action}\">{field}\
             <input type=hidden name=csrf value=\"{}\">\
             <button name=go value=1{id}>{label}{}</button></form>",
            esc(&st.csrf),
            if queue.is_none() { " every queue" } else { "" }
        )
    };
    if let Some(at) = data.pauses.all {
        let _ = write!(
            b,
            "<p class=err>Every queue is paused (since {} UTC): no job starts. {}</p>",
            esc(&crate::admin::rfc3339(at)),
            flow_button(None, true)
        );
    } else {
        let _ = write!(b, "<p>{}</p>", flow_button(None, false));
    }
    if counts.is_empty() {
        b.push_str("<p class=dim>No jobs yet.</p>");
    } else {
        b.push_str(
            "<table><tr><th>Queue</th><th>Due</th><th>Scheduled</th><th>Running</th>\
             <th>Succeeded</th><th>Failed</th><th>Cancelled</th><th>Aborted</th>\
             <th>Oldest due job waits</th><th>Limits</th><th>Due jobs wait for</th>\
             <th>Flow</th></tr>",
        );
        let link = |q: &str, s: &str, n: u64| -> String {
            if n == 0 {
                "<td class=\"n dim\">0</td>".to_owned()
            } else {
                format!(
                    "<td class=n><a href=\"/jobs?queue={}&amp;status={s}\">{n}</a></td>",
                    url_enc(q)
                )
            }
        };
        for c in counts {
            let _ = write!(
                b,
                "<tr><td><a href=\"/jobs?queue={}\">{}</a></td>{}{}{}{}{}{}{}<td class=n>{}</td><td class=limits>{}</td><td class=why>{}</td><td>{}</td></tr>",
                url_enc(&c.queue),
                esc(&c.queue),
                link(&c.queue, "todo", c.todo),
                link(&c.queue, "todo", c.scheduled),
                link(&c.queue, "doing", c.doing),
                link(&c.queue, "succeeded", c.succeeded),
                link(&c.queue, "failed", c.failed),
                link(&c.queue, "cancelled", c.cancelled),
                link(&c.queue, "aborted", c.aborted),
                c.oldest_todo_age.map(age).unwrap_or_else(|| "–".to_owned()),
                limits_cell(c),
                why_cell(c),
                {
                    // Its own pause can be lifted here; the pause of all, above.
                    let own = data.pauses.queues.iter().any(|p| p.queue.as_deref() == Some(c.queue.as_str()));
                    let mark = if c.paused { "<span class=err>paused</span> " } else { "" };
                    let button = if data.pauses.all.is_some() && !own {
                        String::new()
                    } else {
                        flow_button(Some(&c.queue), own)
                    };
                    format!("{mark}{button}")
                },
            );
        }
        b.push_str("</table>");
    }
    b.push_str("<h2>Last hour</h2>");
    b.push_str(&html::throughput_svg(minutes));
    b.push_str(
        "<p class=dim>Jobs finished per minute (jobs deleted on completion are not counted).</p>",
    );
    let _ = write!(
        b,
        "<h2>Workers</h2><p><a href=\"/workers\">{} registered</a>{}</p>",
        workers.len(),
        if stalled > 0 {
            format!(", <span class=err>{stalled} stalled</span>")
        } else {
            String::new()
        }
    );
    b.push_str(&cost.footer());
    if !fresh {
        b.push_str("<p class=dim>(figures shared with a request of the last 5 s)</p>");
    }
    // A table large enough to make the figures slow is reloaded less often.
    let refresh = if data.took > Duration::from_millis(500) {
        30
    } else {
        10
    };
    Ok(Response::html(
        200,
        page("Overview", "Overview", Some(refresh), st.read_only, &b),
    ))
}

/// The queue's limits, one per line: concurrency, per key, rate.
fn limits_cell(c: &crate::QueueCounts) -> String {
    let mut parts = Vec::new();
    if let Some(n) = c.max_running {
        parts.push(format!("at most {n} running"));
    }
    if let (Some(n), Some(arg)) = (c.max_per_key, c.key_arg.as_deref()) {
        parts.push(format!("at most {n} running per {}", esc(arg)));
    }
    if let (Some(n), Some(per)) = (c.max_starts, c.rate_period) {
        let starts = if n == 1 { "start" } else { "starts" };
        parts.push(format!("at most {n} {starts} per {}", age(per)));
    }
    if parts.is_empty() {
        "<span class=dim>–</span>".to_owned()
    } else {
        parts.join("<br>")
    }
}

/// Why the queue's due jobs do not all run now, with the detail of each reason.
fn why_cell(c: &crate::QueueCounts) -> String {
    let parts: Vec<String> = c
        .waiting_reasons()
        .into_iter()
        .map(|r| match r {
            "key limit reached" => format!("key limit reached ({} waiting)", c.key_held),
            "lock held" => format!("lock held ({} waiting)", c.lock_held),
            "rate limited" => match c.next_start_in {
                Some(d) => format!("rate limited (next start in {})", age(d)),
                None => r.to_owned(),
            },
            _ => r.to_owned(),
        })
        .map(|r| format!("<span class=\"err why\">{}</span>", esc(&r)))
        .collect();
    if parts.is_empty() {
        "<span class=dim>–</span>".to_owned()
    } else {
        parts.join("<br>")
    }
}
