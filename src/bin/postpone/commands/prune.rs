//! `postpone prune`: delete finished jobs older than an age, in batches.

use std::io::Write;
use std::time::Duration;

use postpone::{App, JobStatus, Retention};

use crate::context::{json, CliError, Context};

pub fn run(
    ctx: &Context,
    app: &App,
    older_than: Duration,
    status: &[JobStatus],
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let r = Retention::new(older_than).statuses(status.iter().copied());
    let report = app.admin().prune(&r)?;
    if ctx.json {
        json(out, &report)?;
    } else {
        writeln!(out, "{report}")?;
    }
    Ok(())
}
