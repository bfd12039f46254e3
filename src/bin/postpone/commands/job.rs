//! `postpone job`: one job with its attempts and errors.

use std::io::Write;

use postpone::{App, JobId};

use crate::context::{json, CliError, Context};
use crate::output;

pub fn run(ctx: &Context, app: &App, id: JobId, out: &mut dyn Write) -> Result<(), CliError> {
    let d = app.admin().job(id)?;
    if ctx.json {
        return json(out, &d);
    }
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
    if let Some(b) = d.blocked_by {
        extra.push(("waits for", format!("job {b} (its lock)")));
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
        ("args", j.args.get().to_owned()),
        ("created (UTC)", output::time(j.created_at)),
        ("scheduled (UTC)", output::time(j.scheduled_at)),
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
            d.output
                .as_ref()
                .map_or_else(|| "-".to_owned(), |v| v.to_string()),
        ),
        (
            "progress",
            match (&d.progress, d.progress_at) {
                (Some(p), Some(at)) => format!("{p} (at {} UTC)", output::time(at)),
                (Some(p), None) => p.to_string(),
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
