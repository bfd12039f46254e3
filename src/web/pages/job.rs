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
    let mut b = String::new();
    let _ = write!(
        b,
        "<h1>Job {} <small>{}</small></h1>",
        j.id,
        status(j.status.as_str())
    );
    if let Some(p) = problem {
        let _ = write!(b, "<p class=\"flash bad\">{}</p>", esc(p));
    }
    // Fixed texts only: a crafted link cannot make the page say anything else.
    let done_text = match done {
        Some("retried") => Some("Retried: the job is waiting again."),
        Some("cancelled") => Some("Cancelled: the job will not run."),
        Some("abort-requested") => {
            Some("Abort requested: the task is told and the job ends aborted.")
        }
        _ => None,
    };
    if let Some(t) = done_text {
        let _ = write!(b, "<p class=flash>{t}</p>");
    }

    if !st.read_only {
        b.push_str("<p>");
        let mut button = |action: &str, label: &str, enabled: bool| {
            if enabled {
                let _ = write!(
                    b,
                    "<form class=inline method=post action=\"/jobs/{}/{action}\">\
                     <input type=hidden name=csrf value=\"{}\">\
                     <button name=go value=1 id=\"{action}\">{label}</button></form> ",
                    j.id,
                    esc(&st.csrf)
                );
            }
        };
        let s = j.status;
        button(
            "retry",
            "Retry",
            matches!(
                s,
                JobStatus::Failed | JobStatus::Cancelled | JobStatus::Aborted
            ),
        );
        button("cancel", "Cancel", s == JobStatus::Todo);
        button(
            "abort",
            "Abort",
            s == JobStatus::Doing && !j.abort_requested,
        );
        b.push_str("</p>");
    }

    b.push_str("<table>");
    let mut row = |k: &str, v: String| {
        let _ = write!(b, "<tr><th>{k}</th><td>{v}</td></tr>");
    };
    row(
        "Queue",
        format!(
            "<a href=\"/jobs?queue={}\">{}</a>",
            url_enc(&j.queue),
            esc(&j.queue)
        ),
    );
    row(
        "Task",
        format!(
            "<a href=\"/jobs?task={}\">{}</a>",
            url_enc(&j.task),
            esc(&j.task)
        ),
    );
    row("Priority", j.priority.to_string());
    row("Attempts", j.attempts.to_string());
    row(
        "Lock",
        j.lock
            .as_deref()
            .map(|l| format!("<a href=\"/jobs?lock={}\">{}</a>", url_enc(l), esc(l)))
            .unwrap_or_default(),
    );
    row(
        "Queueing lock",
        esc(j.queueing_lock.as_deref().unwrap_or("")),
    );
    let worker = match (j.worker_id, &d.worker_name) {
        (Some(w), Some(name)) => format!("{} (id {w})", esc(name)),
        (Some(w), None) => format!("id {w} <span class=dim>(no longer registered)</span>"),
        (None, _) => String::new(),
    };
    row("Worker", worker);
    row(
        "Periodic",
        match (&d.periodic_id, d.periodic_instant) {
            (Some(pid), Some(at)) => format!(
                "instant {}{}",
                time(at),
                if pid.is_empty() {
                    String::new()
                } else {
                    format!(" (id {})", esc(pid))
                }
            ),
            _ => String::new(),
        },
    );
    if let Some(by) = d.blocked_by {
        row(
            "Waits for",
            format!("<a href=\"/jobs/{by}\" id=blocked-by>job {by}</a> (its lock)"),
        );
    }
    if j.abort_requested {
        row("Abort", "requested".to_owned());
    }
    b.push_str("</table>");

    let args = pretty_json(j.args.get());
    let _ = write!(b, "<h2>Arguments</h2><pre id=args>{}</pre>", esc(&args));
    if let Some(output) = &d.output {
        let text = pretty_json(&output.to_string());
        let _ = write!(b, "<h2>Output</h2><pre id=output>{}</pre>", esc(&text));
    }
    if let Some(progress) = &d.progress {
        let text = pretty_json(&progress.to_string());
        let when = d
            .progress_at
            .map(|at| format!(" <small>(at {})</small>", esc(&time(at))))
            .unwrap_or_default();
        let _ = write!(
            b,
            "<h2>Progress{when}</h2><pre id=progress>{}</pre>",
            esc(&text)
        );
    }

    // Timeline: every instant the row and its errors record, in order.
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
        events.push((t, format!("finished: {}", j.status)));
    }
    events.sort_by_key(|e| e.0);
    b.push_str(
        "<h2>Timeline</h2><table><tr><th>When</th><th>After deferral</th><th>What</th></tr>",
    );
    for (at, what) in &events {
        let since = at.duration_since(j.created_at).unwrap_or_default();
        let _ = write!(
            b,
            "<tr><td>{}</td><td class=n>+{}</td><td>{}</td></tr>",
            time(*at),
            age(since),
            esc(what)
        );
    }
    b.push_str("</table>");

    b.push_str("<h2>Attempts with errors</h2>");
    if d.errors.is_empty() {
        b.push_str("<p class=dim>None.</p>");
    } else {
        b.push_str("<table id=errors><tr><th>Attempt</th><th>When</th><th>Error</th></tr>");
        for e in &d.errors {
            let _ = write!(
                b,
                "<tr><td class=n>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
                e.attempt,
                opt_time(e.at),
                esc(&e.error)
            );
        }
        b.push_str("</table>");
    }
    b.push_str(&cost.footer());
    let active = matches!(j.status, JobStatus::Todo | JobStatus::Doing);
    Ok(Response::html(
        200,
        page(
            &format!("Job {}", j.id),
            "Jobs",
            if active { Some(5) } else { None },
            st.read_only,
            &b,
        ),
    ))
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
