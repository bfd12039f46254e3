//! `postpone pause` and `postpone resume`: stop and restart the claiming of a queue's jobs
//! (or of every queue's) on every worker; running jobs finish.

use std::io::Write;

use clap::Args;
use postpone::App;
use serde::Serialize;

use super::seen::Seen;
use crate::context::{json, CliError, Context};

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The queue.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub queue: Option<String>,
    /// Every queue (`resume --all` lifts every pause: that of all queues and each queue's).
    #[arg(long)]
    pub all: bool,
}

#[derive(Serialize)]
struct Done<'a> {
    /// The queue, or null for every queue.
    queue: Option<&'a str>,
    paused: bool,
    /// Whether this call changed anything.
    changed: bool,
    /// Whether a job or worker ever used the queue (null: could not tell); absent for
    /// every queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_seen: Option<Option<bool>>,
}

pub fn pause(ctx: &Context, app: &App, a: &PauseArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let admin = app.admin();
    let queue = a.queue.as_deref().filter(|_| !a.all);
    let changed = match queue {
        Some(q) => admin.pause(q)?,
        None => admin.pause_all()?,
    };
    let seen = queue.map(|q| Seen::look(app, q));
    if ctx.json {
        return json(
            out,
            &Done {
                queue,
                paused: true,
                changed,
                queue_seen: seen.as_ref().map(Seen::json),
            },
        );
    }
    let what = queue.map_or_else(|| "every queue".to_owned(), |q| format!("queue {q}"));
    if changed {
        writeln!(
            out,
            "{what} paused: no worker starts its jobs until resumed; running jobs finish"
        )?;
    } else {
        writeln!(out, "{what} was already paused")?;
    }
    if let (Some(q), Some(seen)) = (queue, &seen) {
        seen.note(out, q)?;
    }
    Ok(())
}

pub fn resume(
    ctx: &Context,
    app: &App,
    a: &PauseArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let admin = app.admin();
    let queue = a.queue.as_deref().filter(|_| !a.all);
    let changed = match queue {
        Some(q) => admin.resume(q)?,
        None => admin.resume_all()? > 0,
    };
    // A queue resumed on its own stays held by a pause of every queue.
    let still = match queue {
        Some(q) => admin.paused()?.is_paused(q),
        None => false,
    };
    let seen = queue.map(|q| Seen::look(app, q));
    if ctx.json {
        return json(
            out,
            &Done {
                queue,
                paused: still,
                changed,
                queue_seen: seen.as_ref().map(Seen::json),
            },
        );
    }
    let what = queue.map_or_else(|| "every queue".to_owned(), |q| format!("queue {q}"));
    match (changed, still) {
        (_, true) => writeln!(
            out,
            "{what} is still paused: every queue is (postpone resume --all lifts that)"
        )?,
        (true, false) => writeln!(out, "{what} resumed; its workers were woken")?,
        (false, false) => writeln!(out, "{what} was not paused")?,
    }
    if let (Some(q), Some(seen)) = (queue, &seen) {
        seen.note(out, q)?;
    }
    Ok(())
}
