//! `postpone stalled`: running jobs whose worker's lease has ended (its own stalled_after,
//! lengthened by `--after`, never shortened) or whose worker is gone; requeue or fail them,
//! and forget dead workers.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use postpone::{App, StalledReport};
use serde::Serialize;

use crate::context::{json, CliError, Context};
use crate::output::{self, Table};
use crate::parse;

#[derive(Debug, Args)]
pub struct StalledArgs {
    /// Lengthen every worker's lease to at least this. A worker is dead once its last
    /// heartbeat is older than its own stalled_after (recorded when it registered); --after
    /// can lengthen that, never shorten it. Defaults to each worker's own.
    #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
    pub after: Option<Duration>,
    /// Put the stalled jobs back to todo (their attempt stays counted).
    #[arg(long, conflicts_with = "fail")]
    pub requeue: bool,
    /// End the stalled jobs as failed.
    #[arg(long)]
    pub fail: bool,
    /// Delete the rows of workers whose lease has ended.
    #[arg(long)]
    pub forget_workers: bool,
    /// Count what would change, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Serialize)]
struct Report {
    dry_run: bool,
    jobs: u64,
    workers: u64,
}

pub fn run(ctx: &Context, app: &App, a: &StalledArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let admin = app.admin();
    let after = a.after.unwrap_or_default();
    if !(a.requeue || a.fail || a.forget_workers) {
        if a.dry_run {
            return Err(CliError::usage(
                "--dry-run goes with --requeue, --fail or --forget-workers",
            ));
        }
        let list = admin.stalled_jobs(after)?;
        if ctx.json {
            return json(out, &list);
        }
        if list.is_empty() {
            writeln!(out, "no stalled jobs")?;
            return Ok(());
        }
        let mut t = Table::new(&["ID", "QUEUE", "TASK", "ATTEMPTS", "WORKER", "STARTED (UTC)"]);
        for j in &list {
            t.row(vec![
                j.id.to_string(),
                j.queue.clone(),
                j.task.clone(),
                j.attempts.to_string(),
                j.worker_id
                    .map_or_else(|| "-".to_owned(), |w| w.to_string()),
                output::opt_time(j.started_at),
            ]);
        }
        t.write(out)?;
        return Ok(());
    }
    let mut r = Report {
        dry_run: a.dry_run,
        jobs: 0,
        workers: 0,
    };
    let add = |r: &mut Report, s: StalledReport| {
        r.jobs += s.jobs;
        r.workers += s.workers;
    };
    if a.requeue {
        add(&mut r, admin.requeue_stalled(after, a.dry_run)?);
    } else if a.fail {
        add(&mut r, admin.fail_stalled(after, a.dry_run)?);
    }
    if a.forget_workers {
        add(&mut r, admin.forget_workers(after, a.dry_run)?);
    }
    if ctx.json {
        return json(out, &r);
    }
    let verb = if a.requeue {
        "requeued"
    } else if a.fail {
        "failed"
    } else {
        ""
    };
    let would = if a.dry_run { "would be " } else { "" };
    let mut parts = Vec::new();
    if !verb.is_empty() {
        parts.push(format!("{} stalled job(s) {would}{verb}", r.jobs));
    }
    if a.forget_workers {
        parts.push(format!("{} dead worker(s) {would}forgotten", r.workers));
    }
    let prefix = if a.dry_run { "dry run: " } else { "" };
    writeln!(out, "{prefix}{}", parts.join("; "))?;
    Ok(())
}
