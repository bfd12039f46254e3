//! `postpone limit`: set, clear or list the concurrency limits of queues (at most N running
//! jobs of a queue across every worker).

use std::io::Write;

use clap::Args;
use postpone::App;
use serde::Serialize;

use super::seen::Seen;
use crate::context::{json, CliError, Context};

#[derive(Debug, Args)]
pub struct LimitArgs {
    /// The queue (none: list every limit).
    #[arg(requires = "action")]
    pub queue: Option<String>,
    /// At most this many of the queue's jobs run at once, cluster-wide (at least 1).
    #[arg(allow_negative_numbers = true, group = "action")]
    pub max_running: Option<i64>,
    /// Lift the queue's limit.
    #[arg(long, group = "action", requires = "queue")]
    pub clear: bool,
}

#[derive(Serialize)]
struct Done<'a> {
    queue: &'a str,
    /// The limit now (null: none).
    max_running: Option<i64>,
    /// The limit before (null: none).
    previous: Option<i32>,
    /// Whether a job or worker ever used the queue (null: could not tell).
    queue_seen: Option<bool>,
}

pub fn run(ctx: &Context, app: &App, a: &LimitArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let admin = app.admin();
    let Some(queue) = a.queue.as_deref() else {
        let limits = admin.queue_limits()?;
        if ctx.json {
            return json(out, &limits);
        }
        if limits.is_empty() {
            writeln!(out, "no queue has a concurrency limit")?;
        }
        for l in &limits {
            let state = if l.is_reached() { "  (reached)" } else { "" };
            writeln!(
                out,
                "{}: {} running of at most {}{state}",
                l.queue, l.running, l.max_running
            )?;
        }
        return Ok(());
    };
    let limit = if a.clear { None } else { a.max_running };
    let previous = admin.set_queue_limit(queue, limit)?;
    let seen = Seen::look(app, queue);
    if ctx.json {
        return json(
            out,
            &Done {
                queue,
                max_running: limit,
                previous,
                queue_seen: seen.json(),
            },
        );
    }
    let before = previous.map_or_else(|| "none".to_owned(), |p| p.to_string());
    match limit {
        Some(n) => writeln!(
            out,
            "queue {queue}: at most {n} running jobs across every worker (before: {before})"
        )?,
        None if previous.is_some() => {
            writeln!(out, "queue {queue}: limit cleared (before: {before})")?
        }
        None => writeln!(out, "queue {queue} had no limit")?,
    }
    seen.note(out, queue)?;
    Ok(())
}
