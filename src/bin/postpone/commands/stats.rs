//! `postpone stats`: jobs per queue and status.

use postpone::App;

use crate::output::{self, Table};
use std::io::Write;

use crate::context::{json, CliError, Context};

pub fn run(ctx: &Context, app: &App, out: &mut dyn Write) -> Result<(), CliError> {
    let counts = app.admin().counts()?;
    if ctx.json {
        return json(out, &counts);
    }
    if counts.is_empty() {
        writeln!(out, "no jobs")?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "QUEUE",
        "TODO",
        "SCHEDULED",
        "DOING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "ABORTED",
        "OLDEST TODO",
    ]);
    for c in &counts {
        t.row(vec![
            c.queue.clone(),
            c.todo.to_string(),
            c.scheduled.to_string(),
            c.doing.to_string(),
            c.succeeded.to_string(),
            c.failed.to_string(),
            c.cancelled.to_string(),
            c.aborted.to_string(),
            c.oldest_todo_age
                .map_or_else(|| "-".to_owned(), output::age),
        ]);
    }
    t.write(out)?;
    Ok(())
}
