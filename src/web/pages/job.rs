//! One job's page: arguments, output, progress, timeline, attempts and actions.

use super::*;

pub(super) fn job(
    st: &State,
    id: JobId,
    problem: Option<&str>,
    done: Option<&str>,
) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let preview = st.admin.job_preview(id, PREVIEW_CHARS)?;
    cost.queries += 1;
    let d = &preview.detail;
    let j = &d.job;
    // Only a job of a batch pays for its batch's progress.
    let batch = match d.batch_id {
        Some(b) => {
            cost.queries += 1;
            Some(st.admin.batch(b)?)
        }
        None => None,
    };
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
    // Held by a worker but not started: it waits, like any other (see queries::RUNNING).
    let held = s == JobStatus::Doing && !queries::is_running("doing", j.started_at);
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
    let body = html! {
        div #job-live data-live="job" {
        h1 {
            "Job " (j.id) " "
            small {
                @if held {
                    span.status.s-waiting title="held by a worker, not started yet" { "waiting" }
                } @else {
                    (status(j.status.as_str()))
                }
            }
        }
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
            @if let Some(at) = j.expires_at {
                tr { th { "Expires" } td {
                    (Time(at))
                    @if j.expired { " " span.err { "expired: not started by then" } }
                } }
            }
            tr { th { "Periodic" } td {
                @if let (Some(pid), Some(at)) = (&d.periodic_id, d.periodic_instant) {
                    "instant " (Time(at))
                    @if !pid.is_empty() { " (id " (Shown(pid)) ")" }
                }
            } }
            @if !d.tags.is_empty() {
                tr { th { "Tags" } td #tags {
                    @for t in &d.tags {
                        a.tag href={ (st.link("/jobs")) "?tag=" (url_enc(t)) } { (Shown(t)) }
                        " "
                    }
                    @if preview.tags_total > d.tags.len() as u64 {
                        span.dim #tags-cut { "(" (d.tags.len()) " of " (preview.tags_total) " shown)" }
                    }
                } }
            }
            @if !d.dependencies.is_empty() {
                tr { th { "Runs after" } td #dependencies {
                    @for (i, x) in d.dependencies.iter().enumerate() {
                        @if i > 0 { ", " }
                        a href=(st.link(&format!("/jobs/{}", x.id))) { "job " (x.id) }
                        " (" (x.status.map_or("deleted", |s| s.as_str()))
                        @if x.any_outcome { ", any outcome will do" }
                        ")"
                    }
                    @if j.waiting_for_dependencies { br; span.dim { "waiting for them" } }
                } }
            }
            @if !d.dependents.is_empty() {
                tr { th { "Dependents" } td #dependents {
                    @for (i, x) in d.dependents.iter().enumerate() {
                        @if i > 0 { ", " }
                        a href=(st.link(&format!("/jobs/{x}"))) { "job " (x) }
                    }
                } }
            }
            @if let Some(b) = &batch {
                tr { th { "Batch" } td #batch {
                    a href=(st.link(&format!("/batches/{}", b.id))) { "batch " (b.id) }
                    ": " (super::batch::summary(b))
                    @if b.on_complete.as_ref().is_some_and(|c| c.id == j.id) { br; span.dim { "this job is its on_complete callback" } }
                    @if b.on_success.as_ref().is_some_and(|c| c.id == j.id) { br; span.dim { "this job is its on_success callback" } }
                } }
            }
            @if let Some(w) = j.workflow_id {
                tr { th { "Workflow" } td #workflow {
                    a href=(st.link(&format!("/workflows/{w}"))) { "workflow " (w) }
                } }
            }
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
        (value_block(st, j.id, "args", &preview.args))
        @if let Some(output) = &preview.output {
            h2 { "Output" }
            (value_block(st, j.id, "output", output))
        }
        @if let Some(progress) = &preview.progress {
            h2 #progress-heading {
                "Progress"
                @if let Some(at) = d.progress_at {
                    " " small { "(at " (Time(at)) ")" }
                }
            }
            (value_block(st, j.id, "progress", progress))
        }
        (timeline(d))
        h2 { "Attempts with errors" }
        @if d.errors.is_empty() {
            p.dim { "None." }
        } @else {
            @if preview.errors_total > d.errors.len() as u64 {
                p.dim { "The last " (d.errors.len()) " of " (preview.errors_total) " shown." }
            }
            div.scroll { table #errors {
                tr { th { "Attempt" } th { "When" } th { "Error" } }
                @for e in &d.errors {
                    tr {
                        td.n { (e.attempt) } td { (opt_time(e.at)) }
                        td {
                            pre { (Shown(e.message())) }
                            @if let Some(bt) = e.backtrace() {
                                details.backtrace {
                                    summary { "Backtrace" }
                                    pre { (Shown(bt)) }
                                }
                            }
                        }
                    }
                }
            } }
        }
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
    if j.scheduled_at > j.created_at && !j.waiting_for_dependencies {
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

/// Characters of a job's arguments, output and progress a page reads.
const PREVIEW_CHARS: usize = 64 * 1024;
/// Bytes of pretty-printed JSON a page shows of one value, at most.
const SHOWN_MAX: usize = 256 * 1024;
/// Levels of nesting that indent: deeper ones are printed at this depth's indentation, so a
/// deeply nested value cannot make the page grow with the square of its depth.
const MAX_INDENT: usize = 24;

/// One value of a job, pretty-printed and cut to a budget proportional to its size (at
/// most [`SHOWN_MAX`]), with a download of its raw JSON when it is cut.
fn value_block(st: &State, id: JobId, name: &str, v: &crate::admin::JsonPrefix) -> Markup {
    let budget = (4 * v.text.len() + 4096).min(SHOWN_MAX);
    let (pretty, cut) = pretty_json(&v.text, budget);
    let whole = v.is_whole() && !cut;
    html! {
        pre id=(name) { (Shown(&pretty)) @if !whole { "\n…" } }
        @if !whole {
            p.cut id={ (name) "-cut" } {
                "Cut: " (size(pretty.len().min(v.text.len()) as u64)) " of " (size(v.bytes)) " shown. "
                a href=(st.link(&format!("/jobs/{id}/{name}.json"))) download {
                    "Download the raw JSON (" (size(v.bytes)) ")"
                }
            }
        }
    }
}

/// Bytes for people: `900 B`, `12.3 KiB`, `4.0 MiB`.
fn size(n: u64) -> String {
    if n < 1024 {
        format!("{n} B")
    } else if n < 1024 * 1024 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
    }
}

/// `GET /jobs/ID/args.json` (and `output.json`, `progress.json`): the value's raw JSON
/// text, streamed a chunk at a time, so a request holds one chunk whatever the value
/// weighs. When a download slot is free (a quarter of the App's pool, see
/// [`DownloadSlot`]) it reads through a cursor: the server turns the value into text once
/// and the download holds one pooled connection until its body is sent or its response
/// deadline cuts it off (an 11 MB value: about 0.6 s). Otherwise each chunk is a
/// round-trip of its own, holding no connection between chunks, but each makes the server
/// turn the whole value into text again: the same 11 MB value did not fit in a 10-s
/// response deadline that way.
pub(super) fn download(st: &State, id: JobId, file: &str) -> Result<Response, Error> {
    use crate::admin::preview::{JobValue, ValueCursor, ValueReader};
    let which = match file {
        "args.json" => JobValue::Args,
        "output.json" => JobValue::Output,
        "progress.json" => JobValue::Progress,
        _ => return Err(Error::new(ErrorKind::NotFound, "no such page")),
    };
    let missing = || {
        Error::new(
            ErrorKind::NotFound,
            format!("job {id} has no {}", file.trim_end_matches(".json")),
        )
    };
    let headers = vec![
        ("Content-Type", "application/json".to_owned()),
        (
            "Content-Disposition",
            format!("attachment; filename=\"job-{id}-{file}\""),
        ),
    ];
    let stream = |len: u64, next: super::super::http::NextChunk| Response {
        status: 200,
        headers: headers.clone(),
        body: super::super::http::Body::Stream { len, next },
    };
    if let Some(slot) = DownloadSlot::take(st) {
        let Some(mut cursor) = ValueCursor::open(st.app.connection()?, id, which)? else {
            return Err(missing());
        };
        let len = cursor.len();
        return Ok(stream(
            len,
            Box::new(move || {
                // The slot is given back when the body ends or is dropped unfinished.
                let _held = &slot;
                cursor.next().map_err(std::io::Error::other)
            }),
        ));
    }
    let mut reader = ValueReader::new(id, which);
    let first = {
        let mut conn = st.app.connection()?;
        reader.start(&mut conn)?
    };
    let Some(first) = first else {
        return Err(missing());
    };
    let len = reader.len().unwrap_or(first.len() as u64);
    let app = st.app.clone();
    let mut first = Some(first);
    Ok(stream(
        len,
        Box::new(move || {
            if let Some(f) = first.take() {
                return Ok(Some(f));
            }
            let mut conn = app.connection().map_err(std::io::Error::other)?;
            reader.next(&mut conn).map_err(std::io::Error::other)
        }),
    ))
}

/// One of the dashboard's downloads that may hold a pooled connection for the whole of
/// their body: a quarter of the App's pool (at least one when the pool has two or more),
/// so pages keep connections of their own beside downloads. Given back when dropped.
pub(super) struct DownloadSlot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl DownloadSlot {
    /// A free slot, or `None` when every slot is taken (or the pool is too small to lend).
    pub(super) fn take(st: &State) -> Option<DownloadSlot> {
        use std::sync::atomic::Ordering;
        let size = st.app.inner.pool.size();
        let limit = if size >= 2 { (size / 4).max(1) } else { 0 };
        st.downloads
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| DownloadSlot(st.downloads.clone()))
    }
}

impl Drop for DownloadSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Indents JSON text two spaces a level (up to [`MAX_INDENT`] levels), keeping every
/// value's text as stored (numbers too large for a float stay exact), and stops once the
/// output reaches `max` bytes; the flag says whether it stopped there.
pub(super) fn pretty_json(text: &str, max: usize) -> (String, bool) {
    let mut out = String::with_capacity(text.len().min(max) + 64);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth.min(MAX_INDENT) {
            out.push_str("  ");
        }
    };
    while let Some(c) = chars.next() {
        if out.len() >= max {
            return (out, true);
        }
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
    (out, false)
}

#[cfg(test)]
mod pretty_tests {
    use super::{pretty_json, MAX_INDENT};

    fn pretty(s: &str) -> String {
        let (out, cut) = pretty_json(s, usize::MAX);
        assert!(!cut);
        out
    }

    #[test]
    fn pretty_json_indents_and_keeps_numbers_and_strings_exact() {
        assert_eq!(
            pretty(r#"{"a": [1, 18446744073709551616], "b": {"s": "x, {y}: \"z\""}, "e": []}"#),
            "{\n  \"a\": [\n    1,\n    18446744073709551616\n  ],\n  \"b\": {\n    \"s\": \"x, {y}: \\\"z\\\"\"\n  },\n  \"e\": []\n}"
        );
        assert_eq!(pretty("null"), "null");
    }

    #[test]
    fn deep_nesting_indents_no_further_than_the_cap_and_output_stops_at_its_budget() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        let whole = pretty(&deep);
        let widest = whole.lines().map(str::len).max().unwrap();
        // The deepest line: the capped indentation and an empty array.
        assert_eq!(widest, 2 * MAX_INDENT + 2, "indentation grows past the cap");
        // Linear in the input: at most (2 * MAX_INDENT + 2) bytes per character.
        assert!(whole.len() <= deep.len() * (2 * MAX_INDENT + 2));
        let (cut, was_cut) = pretty_json(&deep, 50_000);
        assert!(was_cut);
        assert!(cut.len() < 50_000 + 2 * MAX_INDENT + 2, "{}", cut.len());
    }
}
