//! `postpone jobs`: list jobs, one page at a time, saying when more match.

use std::io::Write;

use clap::Args;
use postpone::{App, JobSort};
use serde::Serialize;

use super::select::Select;
use crate::context::{json, CliError, Context};
use crate::output::{self, Table};

#[derive(Debug, Args)]
pub struct JobsArgs {
    #[command(flatten)]
    pub select: Select,
    /// Order by id (deferral order), scheduled, finished (finished jobs only) or priority.
    #[arg(long, default_value = "id", value_parser = parse_sort, value_name = "KEY")]
    pub sort: JobSort,
    /// Ascending (default: descending for id, ascending for the others).
    #[arg(long, conflicts_with = "desc")]
    pub asc: bool,
    /// Descending.
    #[arg(long)]
    pub desc: bool,
    /// At most this many jobs per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    /// Start after this cursor (printed when a listing is cut).
    #[arg(long, value_name = "CURSOR", conflicts_with = "all")]
    pub after: Option<String>,
    /// Every matching job, page after page (the limit is the page size).
    #[arg(long)]
    pub all: bool,
}

fn parse_sort(s: &str) -> Result<JobSort, String> {
    JobSort::from_name(s)
        .ok_or_else(|| format!("unknown sort key {s:?}: use id, scheduled, finished or priority"))
}

/// The JSON answer: the page, and whether it was cut.
#[derive(Serialize)]
struct Listing<'a> {
    jobs: &'a [postpone::JobInfo],
    /// More jobs match: pass it to `--after` for the next page.
    next_cursor: Option<&'a str>,
}

pub fn run(ctx: &Context, app: &App, a: &JobsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let descending = if a.asc {
        false
    } else if a.desc {
        true
    } else {
        a.sort == JobSort::Id
    };
    let mut f = a
        .select
        .filter(None)
        .sort(a.sort, descending)
        .limit(a.limit);
    if let Some(c) = &a.after {
        f = f.after(c);
    }
    let admin = app.admin();
    if a.all && ctx.json {
        // A stream of pages as one JSON array, without holding every job in memory.
        write!(out, "{{\n  \"jobs\": [")?;
        let mut first = true;
        loop {
            let page = admin.job_page(&f)?;
            for j in &page.jobs {
                writeln!(out, "{}", if first { "" } else { "," })?;
                first = false;
                json_inline(out, j)?;
            }
            match page.next_cursor {
                Some(c) => f = f.after(c),
                None => break,
            }
        }
        writeln!(out, "\n  ],\n  \"next_cursor\": null\n}}")?;
        return Ok(());
    }
    let mut page = admin.job_page(&f)?;
    if ctx.json {
        return json(
            out,
            &Listing {
                jobs: &page.jobs,
                next_cursor: page.next_cursor.as_deref(),
            },
        );
    }
    // With --all, every page goes into one table (aligned); otherwise one page and, when
    // more match, the cursor of the next.
    let mut all = std::mem::take(&mut page.jobs);
    if a.all {
        while let Some(c) = page.next_cursor.take() {
            f = f.after(c);
            page = admin.job_page(&f)?;
            all.append(&mut page.jobs);
        }
    }
    if all.is_empty() {
        writeln!(out, "no jobs")?;
        return Ok(());
    }
    table(&all, out)?;
    if let Some(c) = page.next_cursor {
        writeln!(
            out,
            "-- {} job(s) shown; more match: add --after {c} (or --all)",
            all.len()
        )?;
    }
    Ok(())
}

fn json_inline(out: &mut dyn Write, j: &postpone::JobInfo) -> Result<(), CliError> {
    let text = serde_json::to_string(j).map_err(|e| CliError::usage(e.to_string()))?;
    write!(out, "    {text}")?;
    Ok(())
}

fn table(jobs: &[postpone::JobInfo], out: &mut dyn Write) -> Result<(), CliError> {
    // The deadline column only when a listed job has one.
    let expiring = jobs.iter().any(|j| j.expires_at.is_some());
    let mut head = vec![
        "ID",
        "STATUS",
        "QUEUE",
        "TASK",
        "ATTEMPTS",
        "PRIORITY",
        "SCHEDULED (UTC)",
    ];
    if expiring {
        head.push("EXPIRES (UTC)");
    }
    head.extend(["FINISHED (UTC)", "DURATION", "LOCK", "LAST ERROR", "ARGS"]);
    let mut t = Table::new(&head);
    for j in jobs {
        let mut row = vec![
            j.id.to_string(),
            j.status.to_string(),
            j.queue.clone(),
            j.task.clone(),
            j.attempts.to_string(),
            j.priority.to_string(),
            if j.waiting_for_dependencies {
                "after dependencies".to_owned()
            } else {
                output::time(j.scheduled_at)
            },
        ];
        if expiring {
            row.push(match j.expires_at {
                Some(at) if j.expired => format!("{} (expired)", output::time(at)),
                Some(at) => output::time(at),
                None => "-".to_owned(),
            });
        }
        row.extend([
            output::opt_time(j.finished_at),
            output::opt_age(j.duration()),
            output::opt(j.lock.as_deref()),
            output::cut(&output::clean(j.last_error.as_deref().unwrap_or("-")), 40),
            output::cut(&output::clean(j.args.get()), 40),
        ]);
        t.row(row);
    }
    t.write(out)?;
    Ok(())
}
