//! One job's page: arguments, output, progress, timeline, attempts and actions.

use super::*;

pub(super) fn job(
    st: &State,
    id: JobId,
    problem: Option<&str>,
    done: Option<&str>,
) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let d = st.admin.job(id)?;
    cost.queries += 1;
    let j = &d.job;
    // Fixed texts only: a crafted link cannot make the page say anything else.
    let done_text = match done {
        Some("retried") => Some("Retried: the job is waiting again."),
        Some("cancelled") => Some("Cancelled: the job will not run."),
        Some("abort-requested") => {
            Some("Abort requested: the task is told and the job ends aborted.")
        }
        _ => None,
    };
    let s = j.status;
    let button = |action: &str, label: &str, enabled: bool| -> Markup {
        html! {
            @if enabled {
                form.inline method="post" action=(st.link(&format!("/jobs/{}/{action}", j.id))) {
                    input type="hidden" name="csrf" value=(st.csrf);
                    button name="go" value="1" id=(action) { (label) }
                }
                " "
            }
        }
    };
    let worker = html! {
        @match (j.worker_id, &d.worker_name) {
            (Some(w), Some(name)) => { (Shown(name)) " (id " (w) ")" }
            (Some(w), None) => { "id " (w) " " span.dim { "(no longer registered)" } }
            (None, _) => {}
        }
    };
    let args = pretty_json(j.args.get());
    let body = html! {
        h1 { "Job " (j.id) " " small { (status(j.status.as_str())) } }
        @if let Some(p) = problem {
            p.flash.bad { (Shown(p)) }
        }
        @if let Some(t) = done_text {
            p.flash { (t) }
        }
        @if !st.read_only {
            p {
                (button("retry", "Retry", matches!(s, JobStatus::Failed | JobStatus::Cancelled | JobStatus::Aborted)))
                (button("cancel", "Cancel", s == JobStatus::Todo))
                (button("abort", "Abort", s == JobStatus::Doing && !j.abort_requested))
            }
        }
        div.scroll { table.kv {
            tr { th { "Queue" } td { a href={ (st.link("/jobs")) "?queue=" (url_enc(&j.queue)) } { (Shown(&j.queue)) } } }
            tr { th { "Task" } td { a href={ (st.link("/jobs")) "?task=" (url_enc(&j.task)) } { (Shown(&j.task)) } } }
            tr { th { "Priority" } td { (j.priority) } }
            tr { th { "Attempts" } td { (j.attempts) } }
            tr { th { "Lock" } td {
                @if let Some(l) = &j.lock {
                    a href={ (st.link("/jobs")) "?lock=" (url_enc(l)) } { (Shown(l)) }
                }
            } }
            tr { th { "Queueing lock" } td { (Shown(j.queueing_lock.as_deref().unwrap_or(""))) } }
            tr { th { "Worker" } td { (worker) } }
            tr { th { "Periodic" } td {
                @if let (Some(pid), Some(at)) = (&d.periodic_id, d.periodic_instant) {
                    "instant " (Time(at))
                    @if !pid.is_empty() { " (id " (Shown(pid)) ")" }
                }
            } }
            @if let Some(by) = d.blocked_by {
                tr { th { "Waits for" } td {
                    a href=(st.link(&format!("/jobs/{by}"))) id="blocked-by" { "job " (by) }
                    " (its lock)"
                } }
            }
            @if j.abort_requested {
                tr { th { "Abort" } td { "requested" } }
            }
        } }
        h2 { "Arguments" }
        pre #args { (Shown(&args)) }
        @if let Some(output) = &d.output {
            h2 { "Output" }
            pre #output { (Shown(&pretty_json(&output.to_string()))) }
        }
        @if let Some(progress) = &d.progress {
            h2 #progress-heading {
                "Progress"
                @if let Some(at) = d.progress_at {
                    " " small { "(at " (Time(at)) ")" }
                }
            }
            pre #progress { (Shown(&pretty_json(&progress.to_string()))) }
        }
        (timeline(&d))
        h2 { "Attempts with errors" }
        @if d.errors.is_empty() {
            p.dim { "None." }
        } @else {
            div.scroll { table #errors {
                tr { th { "Attempt" } th { "When" } th { "Error" } }
                @for e in &d.errors {
                    tr { td.n { (e.attempt) } td { (opt_time(e.at)) } td { pre { (Shown(&e.error)) } } }
                }
            } }
        }
        (cost.footer())
    };
    let active = matches!(j.status, JobStatus::Todo | JobStatus::Doing);
    Ok(st.page(
        200,
        &format!("Job {}", j.id),
        "Jobs",
        if active { Some(5) } else { None },
        body,
    ))
}

/// Every instant the row and its errors record, in order, with the time since deferral.
fn timeline(d: &crate::admin::JobDetail) -> Markup {
    let j = &d.job;
    let mut events: Vec<(SystemTime, String)> = vec![(j.created_at, "deferred".to_owned())];
    if j.scheduled_at > j.created_at {
        events.push((j.scheduled_at, "scheduled to run".to_owned()));
    }
    for e in &d.errors {
        if let Some(at) = e.at {
            events.push((at, format!("attempt {} ended with an error", e.attempt)));
        }
    }
    if let Some(t) = j.started_at {
        events.push((t, format!("attempt {} started", j.attempts)));
    }
    if let Some(t) = j.finished_at {
        let took = j
            .duration()
            .map(|d| format!(" after running {}", age(d)))
            .unwrap_or_default();
        events.push((t, format!("finished: {}{took}", j.status)));
    }
    events.sort_by_key(|e| e.0);
    html! {
        h2 { "Timeline" }
        div.scroll { table {
            tr { th { "When" } th.n { "After deferral" } th { "What" } }
            @for (at, what) in &events {
                tr {
                    td { (Time(*at)) }
                    td.n { "+" (age(at.duration_since(j.created_at).unwrap_or_default())) }
                    td { (what) }
                }
            }
        } }
    }
}

/// Indents JSON text two spaces a level, keeping every value's text as stored (numbers too
/// large for a float stay exact).
pub(super) fn pretty_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                // An empty object or array stays on one line.
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if matches!(chars.peek(), Some('}') | Some(']')) {
                    out.push(chars.next().unwrap_or(' '));
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod pretty_tests {
    use super::pretty_json;

    #[test]
    fn pretty_json_indents_and_keeps_numbers_and_strings_exact() {
        assert_eq!(
            pretty_json(r#"{"a": [1, 18446744073709551616], "b": {"s": "x, {y}: \"z\""}, "e": []}"#),
            "{\n  \"a\": [\n    1,\n    18446744073709551616\n  ],\n  \"b\": {\n    \"s\": \"x, {y}: \\\"z\\\"\"\n  },\n  \"e\": []\n}"
        );
        assert_eq!(pretty_json("null"), "null");
    }
}
