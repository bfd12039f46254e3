//! The commands that change jobs: `retry`, `cancel`, `delete`, `reschedule`, `priority`.
//! Each takes one job id, or a selection (`--status failed --task x ...`) for every job it
//! matches, with `--dry-run` to count first. The selection's count is exact: no limit.

use std::io::Write;
use std::time::{Duration, SystemTime};

use clap::Args;
use postpone::{App, BulkAction, JobId, JobStatus};

use super::changed::Changed;
use super::select::Select;
use crate::context::{json, CliError, Context};
use crate::parse;

/// One job, or every job a selection matches.
#[derive(Debug, Args)]
pub struct Target {
    /// The job id (or select jobs with the flags below).
    #[arg(value_parser = parse::job_id)]
    pub id: Option<JobId>,
    #[command(flatten)]
    pub select: Select,
    /// Count the jobs it would change, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub target: Target,
    /// Delete the job(s) instead of keeping them as cancelled.
    #[arg(long)]
    pub delete: bool,
}

#[derive(Debug, Args)]
pub struct RescheduleArgs {
    #[command(flatten)]
    pub target: Target,
    /// Due this long from now (30s, 10m, 2h...).
    #[arg(long = "in", value_parser = parse::duration, value_name = "DURATION",
          conflicts_with = "at", required_unless_present = "at")]
    pub delay: Option<Duration>,
    /// Due at this time (RFC 3339).
    #[arg(long, value_parser = parse::time, value_name = "TIME")]
    pub at: Option<SystemTime>,
}

#[derive(Debug, Args)]
pub struct PriorityArgs {
    #[command(flatten)]
    pub target: Target,
    /// The new priority (higher runs first), after the job id: `priority 2 10`.
    #[arg(
        value_name = "N",
        allow_negative_numbers = true,
        conflicts_with = "to",
        required_unless_present = "to"
    )]
    pub priority: Option<i32>,
    /// The new priority (higher runs first); the one form with a selection:
    /// `priority --status todo --to 10`.
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    pub to: Option<i32>,
}

impl PriorityArgs {
    /// The new priority, given after the id or with `--to` (clap requires one of them).
    pub fn new_priority(&self) -> Result<i32, CliError> {
        self.priority
            .or(self.to)
            .ok_or_else(|| CliError::usage("give the new priority: priority ID N, or --to N"))
    }
}

/// Which of the commands.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Retry,
    Cancel { delete: bool },
    Delete,
    Reschedule(SystemTime),
    Priority(i32),
}

pub fn run(
    ctx: &Context,
    app: &App,
    op: Op,
    target: &Target,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let filtered = !target.select.filter(None).is_unfiltered();
    let admin = app.admin();
    let action = match op {
        Op::Retry => BulkAction::Retry,
        Op::Cancel { delete: false } => BulkAction::Cancel,
        // Cancel-and-delete removes waiting jobs only (the filter says todo, below).
        Op::Cancel { delete: true } | Op::Delete => BulkAction::Delete,
        Op::Reschedule(at) => BulkAction::Reschedule(at),
        Op::Priority(p) => BulkAction::Priority(p),
    };
    let mut filter = target.select.filter(target.id);
    match (target.id, filtered) {
        (Some(_), true) => {
            return Err(CliError::usage(
                "give a job id or selection flags (--status, --queue...), not both",
            ))
        }
        (None, false) => {
            return Err(CliError::usage(
                "give a job id, or select jobs with --status, --queue, --task... (see --help)",
            ))
        }
        _ => {}
    }
    if let Op::Cancel { delete: true } = op {
        if target.id.is_none()
            && !target.select.status.is_empty()
            && target.select.status != [JobStatus::Todo]
        {
            return Err(CliError::usage(
                "cancel --delete removes waiting jobs only: drop --status, or use `postpone delete`",
            ));
        }
        filter = filter.status(JobStatus::Todo);
    }
    if let (Some(id), false) = (target.id, target.dry_run) {
        return one(ctx, app, op, id, out);
    }
    let report = admin.bulk(action, &filter, target.dry_run)?;
    if ctx.json {
        json(out, &report)?;
    } else {
        writeln!(out, "{report}")?;
    }
    Ok(())
}

/// One job by id: the single-job calls, whose errors say why nothing changed.
fn one(ctx: &Context, app: &App, op: Op, id: JobId, out: &mut dyn Write) -> Result<(), CliError> {
    let admin = app.admin();
    let (status, text, deleted) = match op {
        Op::Retry => {
            admin.retry(id)?;
            ("todo", format!("job {id} is waiting again (todo)"), None)
        }
        Op::Cancel { delete: false } => {
            admin.cancel(id)?;
            ("cancelled", format!("job {id} cancelled"), Some(false))
        }
        Op::Cancel { delete: true } => {
            admin.cancel_and_delete(id)?;
            (
                "cancelled",
                format!("job {id} cancelled and deleted"),
                Some(true),
            )
        }
        Op::Delete => {
            let r = admin.bulk(
                BulkAction::Delete,
                &postpone::JobFilter::new().id(id),
                false,
            )?;
            if r.changed == 0 {
                // Say why: not found, or running.
                let d = admin.job(id)?;
                return Err(CliError::Failed(
                    crate::context::Exit::WrongState,
                    format!(
                        "cannot delete job {id}: it is {}; a running job cannot be deleted; abort it first",
                        d.job.status
                    ),
                ));
            }
            ("deleted", format!("job {id} deleted"), Some(true))
        }
        Op::Reschedule(at) => {
            admin.reschedule(id, at)?;
            (
                "todo",
                format!("job {id} is due at {} UTC", crate::output::time(at)),
                None,
            )
        }
        Op::Priority(p) => {
            admin.set_priority(id, p)?;
            ("todo", format!("job {id} has priority {p}"), None)
        }
    };
    if ctx.json {
        let mut c = Changed::new(id, status);
        c.deleted = deleted;
        json(out, &c)?;
    } else {
        writeln!(out, "{text}")?;
    }
    Ok(())
}
