//! `postpone retry`: put a failed, cancelled or aborted job back in its queue.

use std::io::Write;

use postpone::{App, JobId};

use super::changed::Changed;
use crate::context::{json, CliError, Context};

pub fn run(ctx: &Context, app: &App, id: JobId, out: &mut dyn Write) -> Result<(), CliError> {
    app.admin().retry(id)?;
    if ctx.json {
        json(out, &Changed::new(id, "todo"))?;
    } else {
        writeln!(out, "job {id} is waiting again (todo)")?;
    }
    Ok(())
}
