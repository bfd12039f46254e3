//! `postpone job`: one job with its attempts and errors.
//!
//! What it prints is bounded whatever the job holds, unless `--full` asks for everything:
//! the text form shows the first 4 KiB of its arguments, output and progress (saying how
//! large each is); `--json` writes each of them whole up to 1 MiB (1,048,576 characters of
//! JSON text), and a larger one as `null`, its size and first 4 KiB under `"cut"`. Errors are
//! those of the last 50 attempts, each cut to 16 KiB, and tags the first 64, each cut to 255
//! characters (what `Admin::job_preview` reads; `"cut"` says how many there are). With
//! `--full`, each value is written whole, streamed from the database 256 KiB at a time: the
//! output is as large as the job, the memory is not.

use std::collections::BTreeMap;
use std::io::{self, Write};

use postpone::{App, JobId, JobValue, JsonPrefix};
use serde::Serialize;

use crate::context::{json, CliError, Context};
use crate::output;

/// Characters of each large value the text form shows (and `--json` in `"cut"`).
const SHOWN: usize = 4096;
/// Characters of each value `--json` writes whole; a longer one is cut.
const JSON_WHOLE: usize = 1024 * 1024;

/// A value's text, or its start with a note saying how much was left out.
fn shown(v: &JsonPrefix, id: JobId, json: bool) -> String {
    if v.is_whole() {
        v.text.clone()
    } else {
        let json = if json { " --json" } else { "" };
        format!(
            "{}... (cut: the first {} of {} bytes; `postpone job {id}{json} --full` prints it whole)",
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
        _ => shown(v, id, false),
    }
}

/// The start of text `s`, at most `max` bytes, cut at a character boundary.
fn start(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The `--json` document: the job's detail, and what was cut (absent when nothing was).
#[derive(Serialize)]
struct Doc<'a> {
    #[serde(flatten)]
    detail: &'a postpone::JobDetail,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    cut: BTreeMap<&'static str, serde_json::Value>,
}

/// The `--json` document. Each value is written where a placeholder stands in the
/// serialized detail: its text as stored when it is whole (numbers stay exact), `null` when
/// it was cut, or (`full`) the whole value from the database in chunks.
fn write_json(app: &App, id: JobId, full: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let p = app
        .admin()
        .job_preview(id, if full { SHOWN } else { JSON_WHOLE })?;
    let mut d = p.detail;
    // A NUL cannot be stored in any text of a job, so these cannot occur elsewhere.
    let token = |name: &str| format!("\\u0000{name}\\u0000");
    d.job.args = serde_json::value::RawValue::from_string(format!("\"{}\"", token("args")))
        .map_err(|e| CliError::Output(io::Error::other(e)))?;
    let mut values = vec![("args", JobValue::Args, &p.args)];
    if let Some(o) = &p.output {
        d.output = Some(serde_json::Value::String("\0output\0".to_owned()));
        values.push(("output", JobValue::Output, o));
    }
    if let Some(g) = &p.progress {
        d.progress = Some(serde_json::Value::String("\0progress\0".to_owned()));
        values.push(("progress", JobValue::Progress, g));
    }
    // What was left out: a value's size and start, or how many tags there are.
    let mut cut = BTreeMap::new();
    if !full {
        for (name, _, v) in &values {
            if !v.is_whole() {
                let start = start(&v.text, SHOWN);
                cut.insert(*name, serde_json::json!({"bytes": v.bytes, "start": start}));
            }
        }
    }
    if p.errors_total > d.errors.len() as u64 {
        cut.insert(
            "errors",
            serde_json::json!({"shown": d.errors.len(), "total": p.errors_total}),
        );
    }
    if p.tags_total > d.tags.len() as u64 {
        cut.insert(
            "tags",
            serde_json::json!({"shown": d.tags.len(), "total": p.tags_total}),
        );
    }
    let mut doc = Vec::new();
    json(&mut doc, &Doc { detail: &d, cut })?;
    let doc = String::from_utf8_lossy(&doc);
    let mut rest: &str = &doc;
    for (name, which, v) in values {
        let t = format!("\"{}\"", token(name));
        let Some(at) = rest.find(&t) else { continue };
        out.write_all(&rest.as_bytes()[..at])?;
        if full {
            if app.admin().write_value(id, which, out)? == 0 {
                out.write_all(b"null")?;
            }
        } else if v.is_whole() {
            out.write_all(v.text.as_bytes())?;
        } else {
            out.write_all(b"null")?;
        }
        rest = &rest[at + t.len()..];
    }
    out.write_all(rest.as_bytes())?;
    Ok(())
}

/// A line's value in the text form: text, or a value streamed whole (`--full`) followed
/// by a note.
enum Field {
    Text(String),
    Whole(JobValue, String),
}

/// Writes one value of the job whole, made safe for a terminal chunk by chunk.
fn write_whole(app: &App, id: JobId, which: JobValue, out: &mut dyn Write) -> Result<(), CliError> {
    let mut clean = Clean {
        out,
        pending: Vec::new(),
    };
    if app.admin().write_value(id, which, &mut clean)? == 0 {
        clean.out.write_all(b"-")?;
    }
    clean.finish()?;
    Ok(())
}

/// Escapes control characters of UTF-8 text written to it in pieces that may split a
/// character (chunks of a value), as [`output::clean`] does for a whole text.
struct Clean<'a> {
    out: &'a mut dyn Write,
    /// The start of a character split by the end of the last piece.
    pending: Vec<u8>,
}

impl Clean<'_> {
    fn finish(&mut self) -> io::Result<()> {
        let rest = std::mem::take(&mut self.pending);
        self.out
            .write_all(output::clean(&String::from_utf8_lossy(&rest)).as_bytes())
    }
}

impl Write for Clean<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // Not a split character: invalid bytes, written as replacement characters.
            Err(e) if e.error_len().is_some() => self.pending.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.out.write_all(output::clean(&text).as_bytes())?;
        self.pending.drain(..valid);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

pub fn run(
    ctx: &Context,
    app: &App,
    id: JobId,
    full: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if ctx.json {
        return write_json(app, id, full, out);
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
        let more = if p.tags_total > d.tags.len() as u64 {
            format!(" (the first {} of {})", d.tags.len(), p.tags_total)
        } else {
            String::new()
        };
        extra.push(("tags", d.tags.join(", ") + &more));
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
    if let Some(w) = j.workflow_id {
        extra.push((
            "workflow",
            format!("{w} (`postpone workflow {w}` shows its jobs)"),
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
    // A value cut here is written whole with --full.
    let value = |v: &JsonPrefix, which: JobValue, text: String, note: String| -> Field {
        if full && !v.is_whole() {
            Field::Whole(which, note)
        } else {
            Field::Text(text + &note)
        }
    };
    let progress_at = d
        .progress_at
        .map(|at| format!(" (at {} UTC)", output::time(at)))
        .unwrap_or_default();
    let fields = [
        ("id", Field::Text(j.id.to_string())),
        ("task", Field::Text(j.task.clone())),
        ("queue", Field::Text(j.queue.clone())),
        ("status", Field::Text(j.status.to_string())),
        ("attempts", Field::Text(j.attempts.to_string())),
        ("priority", Field::Text(j.priority.to_string())),
        ("lock", Field::Text(output::opt(j.lock.as_deref()))),
        (
            "queueing lock",
            Field::Text(output::opt(j.queueing_lock.as_deref())),
        ),
        (
            "args",
            value(
                &p.args,
                JobValue::Args,
                shown(&p.args, id, false),
                String::new(),
            ),
        ),
        ("created (UTC)", Field::Text(output::time(j.created_at))),
        (
            "scheduled (UTC)",
            Field::Text(if j.waiting_for_dependencies {
                "after dependencies".to_owned()
            } else {
                output::time(j.scheduled_at)
            }),
        ),
        ("started (UTC)", Field::Text(output::opt_time(j.started_at))),
        (
            "finished (UTC)",
            Field::Text(output::opt_time(j.finished_at)),
        ),
        ("duration", Field::Text(output::opt_age(j.duration()))),
        ("worker", Field::Text(worker)),
        (
            "abort requested",
            Field::Text(if j.abort_requested { "yes" } else { "no" }.to_owned()),
        ),
        ("periodic", Field::Text(periodic)),
        (
            "output",
            match &p.output {
                Some(v) => value(v, JobValue::Output, compact(v, id), String::new()),
                None => Field::Text("-".to_owned()),
            },
        ),
        (
            "progress",
            match &p.progress {
                Some(v) => value(v, JobValue::Progress, compact(v, id), progress_at),
                None => Field::Text("-".to_owned()),
            },
        ),
    ];
    let extra = extra.into_iter().map(|(k, v)| (k, Field::Text(v)));
    let mut fields = fields.into_iter();
    let head: Vec<_> = fields.by_ref().take(5).collect();
    for (k, v) in head.into_iter().chain(extra).chain(fields) {
        write!(out, "{:<17}", format!("{k}:"))?;
        match v {
            Field::Text(t) => writeln!(out, "{}", output::clean(&t))?,
            Field::Whole(which, note) => {
                write_whole(app, id, which, out)?;
                writeln!(out, "{}", output::clean(&note))?;
            }
        }
    }
    if d.errors.is_empty() {
        writeln!(out, "{:<17}none", "errors:")?;
    } else {
        writeln!(out, "errors:")?;
        if p.errors_total > d.errors.len() as u64 {
            writeln!(
                out,
                "  (the last {} of {} attempts with errors)",
                d.errors.len(),
                p.errors_total
            )?;
        }
        for e in &d.errors {
            writeln!(
                out,
                "  attempt {} at {}: {}",
                e.attempt,
                output::opt_time(e.at),
                output::clean(e.message())
            )?;
            // A panic's backtrace: its lines with --full, else how to see them.
            match e.backtrace() {
                Some(bt) if full => {
                    writeln!(out, "    backtrace:")?;
                    for line in bt.lines() {
                        writeln!(out, "    {}", output::clean(line))?;
                    }
                }
                Some(bt) => writeln!(
                    out,
                    "    (a backtrace of {} lines: `postpone job {id} --full` prints it)",
                    bt.lines().count()
                )?,
                None => {}
            }
        }
    }
    Ok(())
}
