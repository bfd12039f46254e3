//! `postpone cancel`: cancel (or delete) a waiting job.

use std::io::Write;

use postpone::{App, JobId};

use super::changed::Changed;
use crate::context::{json, CliError, Context};

pub fn run(
    ctx: &Context,
    app: &App,
    id: JobId,
    delete: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let admin = app.admin();
    if delete {
        admin.cancel_and_delete(id)?;
    } else {
        admin.cancel(id)?;
    }
    if ctx.json {
        let mut c = Changed::new(id, "cancelled");
        c.deleted = Some(delete);
        json(out, &c)?;
    } else if delete {
        writeln!(out, "job {id} cancelled and deleted")?;
    } else {
        writeln!(out, "job {id} cancelled")?;
    }
    Ok(())
}
