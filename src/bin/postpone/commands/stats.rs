//! `postpone stats`: jobs per queue or task and status; failure rate and run-time
//! percentiles over a window; the lag of the oldest due job; due jobs no running worker
//! knows the task of.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use postpone::{App, StatsBy};

use crate::context::{json, CliError, Context};
use crate::output::{self, Table};
use crate::parse;

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// One row per queue or per task.
    #[arg(long, default_value = "queue", value_parser = parse_by, value_name = "queue|task")]
    pub by: StatsBy,
    /// Count finished jobs (and their run times) of this window only (1h, 1d...).
    #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
    pub window: Option<Duration>,
    /// Report the due jobs whose task no running worker knows once they have waited this
    /// long (a rolling deploy that brings the workers knowing a new task takes a while).
    #[arg(long, default_value = "15m", value_parser = parse::duration, value_name = "DURATION")]
    pub unknown_after: Duration,
}

fn parse_by(s: &str) -> Result<StatsBy, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "queue" => Ok(StatsBy::Queue),
        "task" => Ok(StatsBy::Task),
        _ => Err(format!("unknown grouping {s:?}: use queue or task")),
    }
}

pub fn run(ctx: &Context, app: &App, a: &StatsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let mut rows = app.admin().stats(a.by, a.window)?;
    let unknown = app.admin().unknown_tasks(a.unknown_after)?;
    for c in &mut rows {
        c.unknown_tasks = unknown
            .iter()
            .filter(|u| match a.by {
                StatsBy::Task => u.task == c.queue,
                _ => u.queue == c.queue,
            })
            .map(|u| u.task.clone())
            .collect();
        c.unknown_tasks.dedup();
    }
    if ctx.json {
        return json(out, &rows);
    }
    if rows.is_empty() {
        writeln!(out, "no jobs")?;
        return paused_footer(app, a, out);
    }
    let first = if a.by == StatsBy::Task {
        "TASK"
    } else {
        "QUEUE"
    };
    let mut t = Table::new(&[
        first,
        "TODO",
        "SCHEDULED",
        "DOING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "ABORTED",
        "FAIL%",
        "P50",
        "P95",
        "P99",
        "OLDEST TODO",
    ]);
    for c in &rows {
        t.row(vec![
            c.queue.clone(),
            c.todo.to_string(),
            c.scheduled.to_string(),
            c.doing.to_string(),
            c.succeeded.to_string(),
            c.failed.to_string(),
            c.cancelled.to_string(),
            c.aborted.to_string(),
            c.failure_rate
                .map_or_else(|| "-".to_owned(), |r| format!("{:.1}", r * 100.0)),
            output::opt_age(c.run_time_p50),
            output::opt_age(c.run_time_p95),
            output::opt_age(c.run_time_p99),
            output::opt_age(c.oldest_todo_age),
        ]);
    }
    t.write(out)?;
    paused_footer(app, a, out)?;
    held_footer(&rows, out)?;
    for c in &rows {
        if c.expired > 0 {
            writeln!(
                out,
                "-- expired: {} ({} of its CANCELLED job(s) were not started by their deadline)",
                output::clean(&c.queue),
                c.expired
            )?;
        }
    }
    for c in &rows {
        if c.waiting_for_dependencies > 0 {
            writeln!(
                out,
                "-- waiting for dependencies: {} ({} job(s), counted in neither TODO nor SCHEDULED)",
                output::clean(&c.queue),
                c.waiting_for_dependencies
            )?;
        }
    }
    for u in &unknown {
        writeln!(out, "-- {}", output::clean(&u.to_string()))?;
    }
    if let Some(w) = a.window {
        writeln!(
            out,
            "-- finished counts and run times: the last {}",
            output::age(w)
        )?;
    }
    Ok(())
}

/// Says which queues' due jobs are held back by a concurrency limit, a key limit, a rate
/// limit or by their locks.
fn held_footer(rows: &[postpone::QueueCounts], out: &mut dyn Write) -> Result<(), CliError> {
    for c in rows {
        if let (true, Some(max)) = (c.limit_reached, c.max_running) {
            writeln!(
                out,
                "-- limit reached: {} ({} running of at most {max}; postpone limit)",
                output::clean(&c.queue),
                c.doing
            )?;
        }
    }
    for c in rows.iter().filter(|c| c.key_held > 0) {
        writeln!(
            out,
            "-- key limit reached: {} ({} due jobs wait: their {} has {} running, the most per key; postpone key-limit)",
            output::clean(&c.queue),
            c.key_held,
            output::clean(c.key_arg.as_deref().unwrap_or("key")),
            c.max_per_key.unwrap_or_default()
        )?;
    }
    for c in rows.iter().filter(|c| c.rate_limited) {
        writeln!(
            out,
            "-- rate limited: {} (at most {} starts per {}; next start in {}; postpone rate-limit)",
            output::clean(&c.queue),
            c.max_starts.unwrap_or_default(),
            output::opt_age(c.rate_period),
            output::opt_age(c.next_start_in)
        )?;
    }
    for c in rows.iter().filter(|c| c.lock_held > 0) {
        writeln!(
            out,
            "-- lock held: {} ({} due jobs wait for a job with the same lock)",
            output::clean(&c.queue),
            c.lock_held
        )?;
    }
    Ok(())
}

/// Says which queues are paused (per queue only), under the table.
fn paused_footer(app: &App, a: &StatsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if a.by != StatsBy::Queue {
        return Ok(());
    }
    let pauses = app.admin().paused()?;
    if pauses.all.is_some() {
        writeln!(out, "-- paused: every queue (postpone resume --all)")?;
    } else if !pauses.queues.is_empty() {
        let names: Vec<&str> = pauses
            .queues
            .iter()
            .filter_map(|p| p.queue.as_deref())
            .collect();
        writeln!(
            out,
            "-- paused: {} (postpone resume QUEUE)",
            output::clean(&names.join(", "))
        )?;
    }
    Ok(())
}
