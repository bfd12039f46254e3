//! `postpone workers`: registered workers.

use postpone::App;

use crate::output::{self, Table};
use std::io::Write;

use crate::context::{json, CliError, Context};

pub fn run(ctx: &Context, app: &App, out: &mut dyn Write) -> Result<(), CliError> {
    let list = app.admin().workers()?;
    if ctx.json {
        return json(out, &list);
    }
    if list.is_empty() {
        writeln!(out, "no workers")?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "ID",
        "NAME",
        "HOST",
        "PID",
        "QUEUES",
        "THREADS",
        "RUNNING",
        "HEARTBEAT AGE",
        "STARTED (UTC)",
    ]);
    for w in &list {
        t.row(vec![
            w.id.to_string(),
            w.name.clone(),
            w.host.clone(),
            w.pid.to_string(),
            w.queues
                .as_ref()
                .map_or_else(|| "all".to_owned(), |q| q.join(",")),
            w.concurrency.to_string(),
            w.running.to_string(),
            output::age(w.heartbeat_age),
            output::time(w.started_at),
        ]);
    }
    t.write(out)?;
    Ok(())
}
