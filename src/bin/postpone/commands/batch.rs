//! `postpone batch`: the progress of one batch (its jobs by state, its callbacks).

use std::io::Write;

use postpone::{App, BatchId, CallbackState};

use crate::context::{json, CliError, Context};
use crate::output;

fn callback(c: &Option<CallbackState>) -> String {
    match c {
        Some(c) => format!("job {} ({})", c.id, c.describe()),
        None => "-".to_owned(),
    }
}

pub fn run(ctx: &Context, app: &App, id: BatchId, out: &mut dyn Write) -> Result<(), CliError> {
    let p = app.admin().batch(id)?;
    if ctx.json {
        json(out, &p)?;
        return Ok(());
    }
    let state = if p.is_finished() {
        "finished"
    } else {
        "running"
    };
    let fields = [
        ("batch", p.id.to_string()),
        ("created (UTC)", output::time(p.created_at)),
        ("state", state.to_owned()),
        (
            "finished",
            format!("{} of {} ({} pending)", p.finished(), p.total, p.pending()),
        ),
        ("waiting", p.waiting.to_string()),
        ("running", p.running.to_string()),
        ("succeeded", p.succeeded.to_string()),
        ("failed", p.failed.to_string()),
        ("cancelled", p.cancelled.to_string()),
        ("aborted", p.aborted.to_string()),
        ("deleted", p.deleted.to_string()),
        ("on_complete", callback(&p.on_complete)),
        ("on_success", callback(&p.on_success)),
    ];
    for (k, v) in fields {
        writeln!(out, "{:<15}{}", format!("{k}:"), output::clean(&v))?;
    }
    Ok(())
}
