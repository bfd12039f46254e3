//! `postpone prune`: delete finished jobs older than an age, in batches.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use postpone::{App, JobStatus, Retention};
use serde::Serialize;

use crate::context::{json, CliError, Context};
use crate::parse;

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Age past which finished jobs are deleted (7d, 12h...).
    #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
    pub older_than: Duration,
    /// Only these statuses (repeat or comma-separate; default: every finished one).
    #[arg(long, value_parser = parse::finished_status, value_delimiter = ',',
          value_name = "STATUS")]
    pub status: Vec<JobStatus>,
    /// Count the jobs it would delete, and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(ctx: &Context, app: &App, a: &PruneArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let r = Retention::new(a.older_than).statuses(a.status.iter().copied());
    if a.dry_run {
        #[derive(Serialize)]
        struct DryRun {
            dry_run: bool,
            jobs: u64,
        }
        let n = app.admin().prune_count(&r)?;
        if ctx.json {
            json(
                out,
                &DryRun {
                    dry_run: true,
                    jobs: n,
                },
            )?;
        } else {
            writeln!(out, "dry run: {n} job(s) would be deleted")?;
        }
        return Ok(());
    }
    let report = app.admin().prune(&r)?;
    if ctx.json {
        json(out, &report)?;
    } else {
        writeln!(out, "{report}")?;
    }
    Ok(())
}
