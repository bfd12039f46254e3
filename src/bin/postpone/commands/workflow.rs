//! `postpone workflow`: one workflow (its jobs with their states and the jobs each runs
//! after), or `postpone workflow cancel|retry ID` on the whole of it.

use std::io::Write;

use clap::{Args, Subcommand};
use postpone::{App, JobId, WorkflowId, WorkflowInfo};
use serde::Serialize;

use crate::context::{json, CliError, Context};
use crate::output::{self, Table};
use crate::parse;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct WorkflowArgs {
    #[command(subcommand)]
    pub action: Option<WorkflowAction>,
    /// The workflow id
    #[arg(value_parser = parse::workflow_id, required = true)]
    pub id: Option<WorkflowId>,
}

#[derive(Debug, Subcommand)]
pub enum WorkflowAction {
    /// Cancel every waiting job of the workflow, and ask its running ones to abort.
    Cancel {
        /// The workflow id
        #[arg(value_parser = parse::workflow_id)]
        id: WorkflowId,
    },
    /// Put its failed, cancelled and aborted jobs back to wait, each for the jobs it runs
    /// after (retried with it, or succeeded before).
    Retry {
        /// The workflow id
        #[arg(value_parser = parse::workflow_id)]
        id: WorkflowId,
    },
}

pub fn run(
    ctx: &Context,
    app: &App,
    a: &WorkflowArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match (&a.action, a.id) {
        (Some(WorkflowAction::Cancel { id }), _) => cancel(ctx, app, *id, out),
        (Some(WorkflowAction::Retry { id }), _) => retry(ctx, app, *id, out),
        (None, Some(id)) => show(ctx, app, id, out),
        (None, None) => Err(CliError::usage(
            "postpone workflow needs a workflow id (or cancel ID, retry ID)",
        )),
    }
}

fn ids(list: &[JobId]) -> String {
    if list.is_empty() {
        return "-".to_owned();
    }
    list.iter()
        .map(|j| j.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn show(ctx: &Context, app: &App, id: WorkflowId, out: &mut dyn Write) -> Result<(), CliError> {
    let w: WorkflowInfo = app.admin().workflow(id)?;
    if ctx.json {
        return json(out, &w);
    }
    let fields = [
        ("workflow", format!("{} {:?}", w.id, w.name)),
        ("created (UTC)", output::time(w.created_at)),
        ("state", w.describe().to_owned()),
        (
            "finished",
            format!("{} of {} ({} pending)", w.finished(), w.total, w.pending()),
        ),
        ("waiting", w.waiting.to_string()),
        ("running", w.running.to_string()),
        ("succeeded", w.succeeded.to_string()),
        ("failed", w.failed.to_string()),
        ("cancelled", w.cancelled.to_string()),
        ("aborted", w.aborted.to_string()),
        ("deleted", w.deleted.to_string()),
    ];
    for (k, v) in fields {
        writeln!(out, "{:<15}{}", format!("{k}:"), output::clean(&v))?;
    }
    writeln!(out)?;
    let mut t = Table::new(&[
        "ID",
        "STEP",
        "TASK",
        "QUEUE",
        "STATE",
        "AFTER",
        "AFTER FINISHED",
        "LAST ERROR",
    ]);
    for j in &w.jobs {
        t.row(vec![
            j.id.to_string(),
            output::opt(j.step.as_deref()),
            output::opt(j.task.as_deref()),
            output::opt(j.queue.as_deref()),
            j.describe().to_owned(),
            ids(&j.after),
            ids(&j.after_finished),
            output::cut(&output::opt(j.last_error.as_deref()), 60),
        ]);
    }
    t.write(out)?;
    if (w.jobs.len() as u64) < w.total {
        writeln!(
            out,
            "({} more jobs not listed: the first {} by id are)",
            w.total - w.jobs.len() as u64,
            w.jobs.len()
        )?;
    }
    Ok(())
}

#[derive(Serialize)]
struct Cancelled {
    workflow: WorkflowId,
    cancelled: u64,
    aborting: u64,
}

fn cancel(ctx: &Context, app: &App, id: WorkflowId, out: &mut dyn Write) -> Result<(), CliError> {
    let done = app.admin().cancel_workflow(id)?;
    if ctx.json {
        return json(
            out,
            &Cancelled {
                workflow: id,
                cancelled: done.cancelled,
                aborting: done.aborting,
            },
        );
    }
    writeln!(
        out,
        "workflow {id}: {} waiting jobs cancelled, {} running jobs asked to abort",
        done.cancelled, done.aborting
    )?;
    Ok(())
}

#[derive(Serialize)]
struct Refused {
    id: JobId,
    reason: String,
}

#[derive(Serialize)]
struct Retried {
    workflow: WorkflowId,
    retried: Vec<JobId>,
    refused: Vec<Refused>,
}

fn retry(ctx: &Context, app: &App, id: WorkflowId, out: &mut dyn Write) -> Result<(), CliError> {
    let done = app.admin().retry_workflow(id)?;
    if ctx.json {
        return json(
            out,
            &Retried {
                workflow: id,
                retried: done.retried.clone(),
                refused: done
                    .refused
                    .iter()
                    .map(|(id, reason)| Refused {
                        id: *id,
                        reason: reason.clone(),
                    })
                    .collect(),
            },
        );
    }
    writeln!(
        out,
        "workflow {id}: {} jobs back to waiting ({})",
        done.retried.len(),
        ids(&done.retried)
    )?;
    for (job, why) in &done.refused {
        writeln!(out, "job {job} not retried: {}", output::clean(why))?;
    }
    Ok(())
}
