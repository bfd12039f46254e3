//! `postpone jobs`: list jobs.

use clap::Args;
use postpone::{App, JobFilter, JobStatus};

use crate::output::{self, Table};
use crate::parse;
use std::io::Write;

use crate::context::{json, CliError, Context};

#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Only these statuses (repeat or comma-separate).
    #[arg(long, value_parser = parse::status, value_delimiter = ',', value_name = "STATUS")]
    pub status: Vec<JobStatus>,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this task.
    #[arg(long)]
    pub task: Option<String>,
    /// Only this lock.
    #[arg(long)]
    pub lock: Option<String>,
    /// Only this queueing lock.
    #[arg(long)]
    pub queueing_lock: Option<String>,
    /// At most this many jobs.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
}

pub fn run(ctx: &Context, app: &App, a: &JobsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let mut f = JobFilter::new().limit(a.limit);
    for s in &a.status {
        f = f.status(*s);
    }
    if let Some(q) = &a.queue {
        f = f.queue(q);
    }
    if let Some(t) = &a.task {
        f = f.task(t);
    }
    if let Some(l) = &a.lock {
        f = f.lock(l);
    }
    if let Some(l) = &a.queueing_lock {
        f = f.queueing_lock(l);
    }
    let list = app.admin().jobs(&f)?;
    if ctx.json {
        return json(out, &list);
    }
    if list.is_empty() {
        writeln!(out, "no jobs")?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "ID",
        "STATUS",
        "QUEUE",
        "TASK",
        "ATTEMPTS",
        "PRIORITY",
        "SCHEDULED (UTC)",
        "ARGS",
    ]);
    for j in &list {
        t.row(vec![
            j.id.to_string(),
            j.status.to_string(),
            j.queue.clone(),
            j.task.clone(),
            j.attempts.to_string(),
            j.priority.to_string(),
            output::time(j.scheduled_at),
            output::cut(&j.args.to_string(), 40),
        ]);
    }
    t.write(out)?;
    Ok(())
}
