//! `postpone schedules` and `postpone schedule add|pause|resume|remove`: the periodic
//! schedules stored in the database, which every worker that registers their task follows
//! within a poll interval.

use std::io::Write;
use std::time::Duration;

use clap::{Args, Subcommand};
use postpone::{App, NewSchedule};
use serde::Serialize;

use crate::context::{json, CliError, Context};
use crate::output::{opt, opt_time, Table};
use crate::parse;

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Store a schedule of TASK on a cron expression (refused if (TASK, --id) exists,
    /// unless --replace).
    Add(AddArgs),
    /// Stop deferring the schedule's instants (on every worker, within a poll interval).
    Pause(KeyArgs),
    /// Defer the schedule's instants again, from now (the paused ones are not caught up).
    Resume(KeyArgs),
    /// Delete the schedule (a worker whose code has one with this task and id returns to it).
    Remove(KeyArgs),
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The task of the schedule.
    pub task: String,
    /// The schedule's id among those of the task.
    #[arg(long, default_value = "")]
    pub id: String,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The task its jobs run (only workers that register it defer them).
    pub task: String,
    /// Cron expression: 5 fields, 6 with leading seconds, or @hourly, @daily...
    pub cron: String,
    /// The schedule's id among those of the task.
    #[arg(long, default_value = "")]
    pub id: String,
    /// JSON arguments of every job.
    #[arg(long, default_value = "null", value_name = "JSON")]
    pub args: String,
    /// Queue of its jobs (default: the task's default on the worker, or "default").
    #[arg(long)]
    pub queue: Option<String>,
    /// Priority of its jobs (default: the task's default, or 0).
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Lock of its jobs.
    #[arg(long)]
    pub lock: Option<String>,
    /// Queueing lock: an instant is skipped while a job of this lock waits.
    #[arg(long)]
    pub queueing_lock: Option<String>,
    /// IANA time zone the expression is read in (default UTC), e.g. Europe/Paris.
    #[arg(long, value_name = "ZONE")]
    pub time_zone: Option<String>,
    /// How old a missed instant may be and still be deferred (at most 24h).
    #[arg(long, default_value = "10m", value_parser = parse::duration, value_name = "DURATION")]
    pub catch_up: Duration,
    /// Replace the stored schedule with this task and id, if there is one.
    #[arg(long)]
    pub replace: bool,
}

#[derive(Serialize)]
struct Done<'a> {
    task: &'a str,
    id: &'a str,
    action: &'a str,
    /// Whether this call changed anything.
    changed: bool,
}

fn who(task: &str, id: &str) -> String {
    if id.is_empty() {
        format!("schedule {task}")
    } else {
        format!("schedule {task} (id {id})")
    }
}

pub fn list(ctx: &Context, app: &App, out: &mut dyn Write) -> Result<(), CliError> {
    let all = app.admin().schedules()?;
    if ctx.json {
        return json(out, &all);
    }
    if all.is_empty() {
        writeln!(
            out,
            "no schedule is stored (schedules given in workers' code are not listed)"
        )?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "TASK",
        "ID",
        "CRON",
        "ZONE",
        "STATE",
        "LAST (UTC)",
        "NEXT (UTC)",
        "QUEUE",
        "ARGS",
    ]);
    for s in &all {
        t.row(vec![
            s.task.clone(),
            if s.id.is_empty() {
                "-".into()
            } else {
                s.id.clone()
            },
            s.cron.clone(),
            opt(s.time_zone.as_deref()),
            if s.is_paused() { "paused" } else { "active" }.into(),
            opt_time(s.last_instant),
            opt_time(s.next_instant),
            opt(s.queue.as_deref()),
            crate::output::cut(s.args.get(), 40),
        ]);
    }
    t.write(out)?;
    Ok(())
}

pub fn run(
    ctx: &Context,
    app: &App,
    cmd: &ScheduleCommand,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let admin = app.admin();
    let (key, action, changed, text) = match cmd {
        ScheduleCommand::Add(a) => {
            let args: serde_json::Value = serde_json::from_str(&a.args).map_err(|e| {
                CliError::usage(format!("--args is not valid JSON ({e}): {}", a.args))
            })?;
            let mut s = NewSchedule::new(&a.task, &a.cron)
                .id(&a.id)
                .args(&args)
                .catch_up(a.catch_up);
            if let Some(q) = &a.queue {
                s = s.queue(q);
            }
            if let Some(p) = a.priority {
                s = s.priority(p);
            }
            if let Some(l) = &a.lock {
                s = s.lock(l);
            }
            if let Some(l) = &a.queueing_lock {
                s = s.queueing_lock(l);
            }
            if let Some(z) = &a.time_zone {
                s = s.time_zone(z);
            }
            let text = if a.replace {
                if admin.set_schedule(&s)? {
                    "stored"
                } else {
                    "replaced"
                }
            } else {
                admin.create_schedule(&s)?;
                "stored"
            };
            ((&a.task, &a.id), "add", true, text)
        }
        ScheduleCommand::Pause(k) => {
            let changed = admin.pause_schedule(&k.task, &k.id)?;
            let text = if changed {
                "paused"
            } else {
                "was paused already"
            };
            ((&k.task, &k.id), "pause", changed, text)
        }
        ScheduleCommand::Resume(k) => {
            let changed = admin.resume_schedule(&k.task, &k.id)?;
            let text = if changed {
                "resumed (from now on; the paused instants are not caught up)"
            } else {
                "was not paused"
            };
            ((&k.task, &k.id), "resume", changed, text)
        }
        ScheduleCommand::Remove(k) => {
            admin.delete_schedule(&k.task, &k.id)?;
            ((&k.task, &k.id), "remove", true, "removed")
        }
    };
    if ctx.json {
        return json(
            out,
            &Done {
                task: key.0,
                id: key.1,
                action,
                changed,
            },
        );
    }
    writeln!(out, "{} {text}", who(key.0, key.1))?;
    if action == "add" {
        let s = admin.schedule(key.0, key.1)?;
        writeln!(
            out,
            "next instant: {} UTC; every worker that registers task {} follows it within a poll interval",
            opt_time(s.next_instant),
            key.0
        )?;
    }
    Ok(())
}
