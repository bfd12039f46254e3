//! `postpone defer`: defer one job.

use std::io::Write;
use std::time::{Duration, SystemTime};

use clap::Args;
use postpone::App;
use serde_json::value::RawValue;

use super::changed::Changed;
use crate::context::{json, CliError, Context};
use crate::{output, parse};

#[derive(Debug, Args)]
pub struct DeferArgs {
    /// The task name.
    pub task: String,
    /// Its arguments as JSON (default: null).
    #[arg(value_name = "JSON")]
    pub args: Option<String>,
    /// The queue (default: "default").
    #[arg(long)]
    pub queue: Option<String>,
    /// At most one job of this lock runs at a time.
    #[arg(long)]
    pub lock: Option<String>,
    /// At most one job of this queueing lock waits at a time.
    #[arg(long)]
    pub queueing_lock: Option<String>,
    /// Higher runs first (default: 0).
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Run no sooner than this from now (30s, 10m, 2h...).
    #[arg(long = "in", value_parser = parse::duration, value_name = "DURATION",
          conflicts_with = "at")]
    pub delay: Option<Duration>,
    /// Run no sooner than this time (RFC 3339: 2030-01-02T03:04:05Z).
    #[arg(long, value_parser = parse::time, value_name = "TIME")]
    pub at: Option<SystemTime>,
    /// A tag for operators (repeat for several; `postpone jobs --tag` filters on them).
    #[arg(long, value_name = "TAG")]
    pub tag: Vec<String>,
    /// Metadata for operators, a JSON object.
    #[arg(long, value_name = "JSON")]
    pub meta: Option<String>,
    /// Run only once this job has succeeded (repeat for several).
    #[arg(long, value_name = "ID")]
    pub after: Vec<i64>,
    /// Run only once this job has finished, whatever its outcome (repeat for several).
    #[arg(long, value_name = "ID")]
    pub after_finished: Vec<i64>,
    /// Never start it later than this from now (10m, 2h...): not started by then, it ends
    /// cancelled as expired.
    #[arg(long, value_parser = parse::duration, value_name = "DURATION",
          conflicts_with = "expires_at")]
    pub expires_in: Option<Duration>,
    /// Never start it after this time (RFC 3339): not started by then, it ends cancelled as
    /// expired.
    #[arg(long, value_parser = parse::time, value_name = "TIME")]
    pub expires_at: Option<SystemTime>,
}

pub fn run(ctx: &Context, app: &App, a: &DeferArgs, out: &mut dyn Write) -> Result<(), CliError> {
    // Kept as written: stored as this text, numbers of any size or precision exactly.
    let text = a.args.as_deref().unwrap_or("null");
    let args: Box<RawValue> = serde_json::from_str(text).map_err(|e| {
        CliError::usage(format!(
            "invalid JSON arguments {}: {e}",
            output::clean(&output::cut(text, 60))
        ))
    })?;
    let mut b = app.job(&a.task);
    if let Some(q) = &a.queue {
        b = b.queue(q);
    }
    if let Some(l) = &a.lock {
        b = b.lock(l);
    }
    if let Some(l) = &a.queueing_lock {
        b = b.queueing_lock(l);
    }
    if let Some(p) = a.priority {
        b = b.priority(p);
    }
    if let Some(d) = a.delay {
        b = b.schedule_in(d);
    }
    if let Some(t) = a.at {
        b = b.schedule_at(t);
    }
    if let Some(d) = a.expires_in {
        b = b.expires_in(d);
    }
    if let Some(t) = a.expires_at {
        b = b.expires_at(t);
    }
    if !a.tag.is_empty() {
        b = b.tags(&a.tag);
    }
    let ids = |v: &[i64]| {
        v.iter()
            .map(|&i| postpone::JobId::from(i))
            .collect::<Vec<_>>()
    };
    if !a.after.is_empty() {
        b = b.after(&ids(&a.after));
    }
    if !a.after_finished.is_empty() {
        b = b.after_finished(&ids(&a.after_finished));
    }
    if let Some(text) = &a.meta {
        let meta: Box<RawValue> = serde_json::from_str(text).map_err(|e| {
            CliError::usage(format!(
                "invalid JSON metadata {}: {e}",
                output::clean(&output::cut(text, 60))
            ))
        })?;
        b = b.meta(&meta);
    }
    let id = b.defer(&args)?;
    if ctx.json {
        json(out, &Changed::new(id, "todo"))?;
    } else {
        writeln!(out, "deferred job {id} ({})", output::clean(&a.task))?;
    }
    Ok(())
}
