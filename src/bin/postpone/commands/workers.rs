//! `postpone workers`: registered workers, their heartbeat (stale past `--stale-after`)
//! and the jobs they have claimed.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use postpone::App;

use crate::context::{json, CliError, Context};
use crate::output::{self, Table};
use crate::parse;

#[derive(Debug, Args)]
pub struct WorkersArgs {
    /// A heartbeat older than this is stale (use the workers' stalled_after).
    #[arg(long, default_value = "30s", value_parser = parse::duration, value_name = "DURATION")]
    pub stale_after: Duration,
}

pub fn run(ctx: &Context, app: &App, a: &WorkersArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let list = app.admin().workers_stale_after(a.stale_after)?;
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
        "CLAIMED",
        "HEARTBEAT AGE",
        "STATE",
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
            w.claimed.to_string(),
            output::age(w.heartbeat_age),
            if w.stale { "STALE" } else { "live" }.to_owned(),
            output::time(w.started_at),
        ]);
    }
    t.write(out)?;
    writeln!(
        out,
        "-- CLAIMED: jobs doing under the worker; at most THREADS of them run, the rest wait in its queue"
    )?;
    Ok(())
}
