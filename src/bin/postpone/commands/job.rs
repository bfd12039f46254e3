//! `postpone job`: one job with its attempts and errors.
//!
//! Whatever the job holds, memory stays bounded: the text form shows the first 4 KiB of its
//! arguments, output and progress (saying how large each is); `--json` writes them whole,
//! streamed from the database a chunk at a time into the document.

use std::io::Write;

use postpone::{App, JobId, JobValue, JsonPrefix};

use crate::context::{json, CliError, Context};
use crate::output;

/// Characters of each large value the text form shows.
const SHOWN: usize = 4096;

/// A value's text, or its start with a note saying how much was left out.
fn shown(v: &JsonPrefix, id: JobId) -> String {
    if v.is_whole() {
        v.text.clone()
    } else {
        format!(
            "{}... (cut: the first {} of {} bytes; `postpone job {id} --json` prints it whole)",
            v.text,
            v.text.len(),
            v.bytes
        )
    }
}

/// An output or progress report written compactly (`{"done":3}`) when it is whole.
fn compact(v: &JsonPrefix, id: JobId) -> String {
    match serde_json::from_str::<serde_json::Value>(&v.text) {
        Ok(parsed) if v.is_whole() => parsed.to_string(),
        _ => shown(v, id),
    }
}

/// The `--json` document, with each large value written whole from the database in
/// chunks where a placeholder stands in the serialized detail.
fn write_json(app: &App, id: JobId, out: &mut dyn Write) -> Result<(), CliError> {
    let p = app.admin().job_preview(id, SHOWN)?;
    let mut d = p.detail;
    // A NUL cannot be stored in any text of a job, so these cannot occur elsewhere.
    let token = |name: &str| format!("\\u0000{name}\\u0000");
    d.job.args = serde_json::value::RawValue::from_string(format!("\"{}\"", token("args")))
        .map_err(|e| CliError::Output(std::io::Error::other(e)))?;
    let mut values = vec![("args", JobValue::Args)];
    if p.output.is_some() {
        d.output = Some(serde_json::Value::String("\0output\0".to_owned()));
        values.push(("output", JobValue::Output));
    }
    if p.progress.is_some() {
        d.progress = Some(serde_json::Value::String("\0progress\0".to_owned()));
        values.push(("progress", JobValue::Progress));
    }
    let mut doc = Vec::new();
    json(&mut doc, &d)?;
    let mut doc = String::from_utf8_lossy(&doc).into_owned();
    for (name, which) in values {
        let t = format!("\"{}\"", token(name));
        let Some(at) = doc.find(&t) else { continue };
        out.write_all(&doc.as_bytes()[..at])?;
        if app.admin().write_value(id, which, out)? == 0 {
            out.write_all(b"null")?;
        }
        doc = doc[at + t.len()..].to_owned();
    }
    out.write_all(doc.as_bytes())?;
    Ok(())
}

pub fn run(ctx: &Context, app: &App, id: JobId, out: &mut dyn Write) -> Result<(), CliError> {
    if ctx.json {
        return write_json(app, id, out);
    }
    let p = app.admin().job_preview(id, SHOWN)?;
    let d = &p.detail;
    let j = &d.job;
    let worker = match (&d.worker_name, j.worker_id) {
        (Some(n), Some(w)) => format!("{n} (id {w})"),
        (None, Some(w)) => format!("id {w} (gone)"),
        _ => "-".to_owned(),
    };
    let periodic = match (&d.periodic_id, d.periodic_instant) {
        (Some(pid), Some(at)) if pid.is_empty() => format!("instant {} UTC", output::time(at)),
        (Some(pid), Some(at)) => format!("id {pid:?}, instant {} UTC", output::time(at)),
        _ => "-".to_owned(),
    };
    // Shown only when set: snoozes, the job's own attempt limit, tags, metadata.
    let mut extra: Vec<(&str, String)> = Vec::new();
    if d.snoozes > 0 {
        extra.push(("snoozes", d.snoozes.to_string()));
    }
    if let Some(n) = d.max_attempts {
        extra.push(("max attempts", n.to_string()));
    }
    if !d.tags.is_empty() {
        extra.push(("tags", d.tags.join(", ")));
    }
    if let Some(m) = &d.meta {
        extra.push(("meta", m.to_string()));
    }
    if let Some(at) = j.expires_at {
        let note = if j.expired {
            " (expired: not started by then)"
        } else {
            ""
        };
        extra.push(("expires (UTC)", format!("{}{note}", output::time(at))));
    }
    if let Some(b) = d.blocked_by {
        extra.push(("waits for", format!("job {b} (its lock)")));
    }
    if !d.dependencies.is_empty() {
        let list = d
            .dependencies
            .iter()
            .map(|x| {
                let st = x.status.map_or("deleted", |s| s.as_str());
                let needs = if x.any_outcome { ", any outcome" } else { "" };
                format!("{} ({st}{needs})", x.id)
            })
            .collect::<Vec<_>>()
            .join(", ");
        let waits = if j.waiting_for_dependencies {
            " (waiting for them)"
        } else {
            ""
        };
        extra.push(("runs after", format!("jobs {list}{waits}")));
    }
    if let Some(b) = d.batch_id {
        extra.push((
            "batch",
            format!("{b} (`postpone batch {b}` shows its progress)"),
        ));
    }
    if !d.dependents.is_empty() {
        let list = d
            .dependents
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        extra.push(("dependents", format!("jobs {list}")));
    }
    let fields = [
        ("id", j.id.to_string()),
        ("task", j.task.clone()),
        ("queue", j.queue.clone()),
        ("status", j.status.to_string()),
        ("attempts", j.attempts.to_string()),
        ("priority", j.priority.to_string()),
        ("lock", output::opt(j.lock.as_deref())),
        ("queueing lock", output::opt(j.queueing_lock.as_deref())),
        ("args", shown(&p.args, id)),
        ("created (UTC)", output::time(j.created_at)),
        (
            "scheduled (UTC)",
            if j.waiting_for_dependencies {
                "after dependencies".to_owned()
            } else {
                output::time(j.scheduled_at)
            },
        ),
        ("started (UTC)", output::opt_time(j.started_at)),
        ("finished (UTC)", output::opt_time(j.finished_at)),
        ("duration", output::opt_age(j.duration())),
        ("worker", worker),
        (
            "abort requested",
            if j.abort_requested { "yes" } else { "no" }.to_owned(),
        ),
        ("periodic", periodic),
        (
            "output",
            p.output
                .as_ref()
                .map_or_else(|| "-".to_owned(), |v| compact(v, id)),
        ),
        (
            "progress",
            match (&p.progress, d.progress_at) {
                (Some(v), Some(at)) => {
                    format!("{} (at {} UTC)", compact(v, id), output::time(at))
                }
                (Some(v), None) => compact(v, id),
                _ => "-".to_owned(),
            },
        ),
    ];
    let (head, tail) = fields.split_at(5);
    for (k, v) in head.iter().chain(extra.iter()).chain(tail) {
        writeln!(out, "{:<17}{}", format!("{k}:"), output::clean(v))?;
    }
    if d.errors.is_empty() {
        writeln!(out, "{:<17}none", "errors:")?;
    } else {
        writeln!(out, "errors:")?;
        for e in &d.errors {
            writeln!(
                out,
                "  attempt {} at {}: {}",
                e.attempt,
                output::opt_time(e.at),
                output::clean(&e.error)
            )?;
        }
    }
    Ok(())
}
