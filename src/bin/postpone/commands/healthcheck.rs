//! `postpone healthcheck`: exit 0 when the database answers within `--timeout` and its
//! schema is the one this postpone supports, and (when asked) enough workers are alive and
//! no due job has waited too long; 1 otherwise; 8 for a schema newer than this postpone.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use crate::context::{json, CliError, Context, Exit};
use crate::output;
use crate::parse;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Unhealthy with fewer live workers than this (of --queue, if given).
    #[arg(long, value_name = "N")]
    pub min_workers: Option<u32>,
    /// Lengthen every worker's lease to at least this: a worker is alive until its last
    /// heartbeat is older than its own stalled_after, or than this when longer. Defaults to
    /// each worker's own.
    #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
    pub stale_after: Option<Duration>,
    /// Unhealthy when a due job has waited longer than this (in --queue, if given).
    #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
    pub max_lag: Option<Duration>,
    /// Apply --min-workers and --max-lag to this queue only.
    #[arg(long)]
    pub queue: Option<String>,
}

#[derive(Serialize)]
struct Health {
    healthy: bool,
    database: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_version: Option<i32>,
    supported_version: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live_workers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn run(ctx: &Context, a: &HealthArgs, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    let mut h = Health {
        healthy: false,
        database: ctx.database.clone(),
        schema_version: None,
        supported_version: None,
        live_workers: None,
        lag_secs: None,
        error: None,
    };
    let mut code = Exit::Unhealthy;
    let mut problems: Vec<String> = Vec::new();
    match check(ctx, a, &mut h, &mut problems) {
        Ok(()) => {}
        Err(CliError::Failed(exit, msg)) => {
            if exit == Exit::SchemaNewer {
                code = Exit::SchemaNewer;
            }
            problems.push(msg);
        }
        Err(e) => return Err(e),
    }
    h.healthy = problems.is_empty();
    if !h.healthy {
        h.error = Some(problems.join("; "));
    }
    if ctx.json {
        json(out, &h)?;
    } else if let Some(e) = &h.error {
        writeln!(out, "unhealthy: {}", output::clean(e))?;
    } else {
        let mut extra = String::new();
        if let Some(n) = h.live_workers {
            extra.push_str(&format!(", {n} live worker(s)"));
        }
        if a.max_lag.is_some() {
            match h.lag_secs {
                Some(s) => extra.push_str(&format!(
                    ", lag {}",
                    output::age(Duration::from_secs_f64(s))
                )),
                None => extra.push_str(", no due job waiting"),
            }
        }
        writeln!(
            out,
            "ok: database answers, schema version {}{extra}",
            h.schema_version.unwrap_or(0)
        )?;
    }
    Ok(if h.healthy {
        ExitCode::SUCCESS
    } else {
        code.into()
    })
}

fn check(
    ctx: &Context,
    a: &HealthArgs,
    h: &mut Health,
    problems: &mut Vec<String>,
) -> Result<(), CliError> {
    let app = ctx.connect_unchecked()?;
    let admin = app.admin();
    let state = admin.schema_state()?;
    h.supported_version = Some(state.supported);
    h.schema_version = Some(state.require_current()?);
    if let Some(min) = a.min_workers {
        let live = admin
            .workers_stale_after(a.stale_after.unwrap_or_default())?
            .iter()
            .filter(|w| !w.stale)
            .filter(|w| match (&a.queue, &w.queues) {
                (Some(q), Some(qs)) => qs.contains(q),
                _ => true,
            })
            .count() as u64;
        h.live_workers = Some(live);
        if live < u64::from(min) {
            problems.push(format!(
                "{live} live worker(s) (heartbeat within their lease{}), fewer than --min-workers {min}",
                a.stale_after
                    .map(|d| format!(" or {}", output::age(d)))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(max) = a.max_lag {
        let lag = admin
            .counts()?
            .iter()
            .filter(|c| a.queue.as_ref().is_none_or(|q| &c.queue == q))
            .filter_map(|c| c.oldest_todo_age)
            .max();
        h.lag_secs = lag.map(|d| d.as_secs_f64().min(1e18));
        if let Some(l) = lag {
            if l > max {
                problems.push(format!(
                    "a due job has waited {}, longer than --max-lag {}",
                    output::age(l),
                    output::age(max)
                ));
            }
        }
    }
    Ok(())
}
