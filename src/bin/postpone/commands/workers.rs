//! `postpone workers`: registered workers, their heartbeat and lease (stale once their own
//! `stalled_after` has passed since it, or `--stale-after` when longer) and the jobs they
//! have claimed.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use postpone::App;

use crate::context::{json, CliError, Context};
use crate::output::{self, Table};
use crate::parse;

#[derive(Debug, Args)]
pub struct WorkersArgs {
    /// Lengthen every worker's lease to at least this. A worker is stale once its last
    /// heartbeat is older than its own stalled_after (recorded when it registered); this can
    /// lengthen that, never shorten it. Defaults to each worker's own.
    #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
    pub stale_after: Option<Duration>,
}

pub fn run(ctx: &Context, app: &App, a: &WorkersArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let list = app
        .admin()
        .workers_stale_after(a.stale_after.unwrap_or_default())?;
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
        "LEASE",
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
            w.running.to_string(),
            output::age(w.heartbeat_age),
            w.stalled_after.map_or_else(|| "-".to_owned(), output::age),
            if w.stale { "STALE" } else { "live" }.to_owned(),
            output::time(w.started_at),
        ]);
    }
    t.write(out)?;
    writeln!(
        out,
        "-- RUNNING: jobs the worker has started and not finished (jobs it claimed and holds unstarted count as waiting)"
    )?;
    writeln!(
        out,
        "-- LEASE: the worker's own stalled_after (STALE once its heartbeat is older); - for a worker older than schema 22, judged by the longest lease"
    )?;
    Ok(())
}
