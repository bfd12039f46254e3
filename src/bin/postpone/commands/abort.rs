//! `postpone abort`: ask a running job to stop; a waiting job is cancelled.

use std::io::Write;

use postpone::{AbortOutcome, App, JobId};

use super::changed::Changed;
use crate::context::{json, CliError, Context};

pub fn run(ctx: &Context, app: &App, id: JobId, out: &mut dyn Write) -> Result<(), CliError> {
    let outcome = app.admin().abort(id)?;
    if ctx.json {
        let status = match outcome {
            AbortOutcome::Requested => "doing",
            _ => "cancelled",
        };
        let mut c = Changed::new(id, status);
        c.abort = Some(outcome);
        json(out, &c)?;
    } else {
        match outcome {
            AbortOutcome::Requested => writeln!(
                out,
                "job {id}: abort requested; a running task sees should_abort(), and the job ends aborted (without running, if no thread has started it yet)"
            )?,
            _ => writeln!(out, "job {id} was waiting: cancelled")?,
        }
    }
    Ok(())
}
