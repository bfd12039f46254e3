//! `postpone rate-limit` and `postpone key-limit`: set, clear or list the rate limits (at
//! most N starts per period of a queue) and the key limits (at most N running jobs per value
//! of an argument field) of queues, across every worker.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use postpone::App;
use serde::Serialize;

use super::seen::Seen;
use crate::context::{json, CliError, Context};
use crate::output;
use crate::parse;

#[derive(Debug, Args)]
pub struct RateLimitArgs {
    /// The queue (none: list every rate limit).
    #[arg(requires = "action")]
    pub queue: Option<String>,
    /// At most this many of the queue's jobs start per PERIOD, cluster-wide (at least 1).
    #[arg(allow_negative_numbers = true, group = "action", requires = "per")]
    pub max_starts: Option<i64>,
    /// The sliding window: 500ms, 1s, 1m, 1h... (at least 1ms).
    #[arg(value_parser = parse::duration, value_name = "PERIOD")]
    pub per: Option<Duration>,
    /// Lift the queue's rate limit.
    #[arg(long, group = "action", requires = "queue", conflicts_with = "per")]
    pub clear: bool,
}

#[derive(Debug, Args)]
pub struct KeyLimitArgs {
    /// The queue (none: list every key limit).
    #[arg(requires = "action")]
    pub queue: Option<String>,
    /// At most this many of the queue's jobs with one key run at once, cluster-wide.
    #[arg(allow_negative_numbers = true, group = "action", requires = "by")]
    pub max_per_key: Option<i64>,
    /// The top-level field of the jobs' JSON arguments that is their key.
    #[arg(long, value_name = "FIELD")]
    pub by: Option<String>,
    /// Lift the queue's key limit.
    #[arg(long, group = "action", requires = "queue", conflicts_with = "by")]
    pub clear: bool,
}

#[derive(Serialize)]
struct Done<'a> {
    queue: &'a str,
    /// Whether a limit was lifted (`--clear`) or set.
    cleared: bool,
    /// Whether a job or worker ever used the queue (null: could not tell).
    queue_seen: Option<bool>,
}

pub fn run_rate(
    ctx: &Context,
    app: &App,
    a: &RateLimitArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let admin = app.admin();
    let Some(queue) = a.queue.as_deref() else {
        let limits = admin.rate_limits()?;
        if ctx.json {
            return json(out, &limits);
        }
        if limits.is_empty() {
            writeln!(out, "no queue has a rate limit")?;
        }
        for l in &limits {
            let state = match l.next_start_in {
                Some(d) => format!("  (reached; next start in {})", output::age(d)),
                None => String::new(),
            };
            writeln!(
                out,
                "{}: {} started in the last {} of at most {}{state}",
                output::clean(&l.queue),
                l.recent_starts,
                output::age(l.period),
                l.max_starts
            )?;
        }
        return Ok(());
    };
    if a.clear {
        let cleared = admin.clear_rate_limit(queue)?;
        return done(ctx, app, out, queue, true, || {
            if cleared {
                format!("queue {queue}: rate limit cleared")
            } else {
                format!("queue {queue} had no rate limit")
            }
        });
    }
    let (Some(n), Some(per)) = (a.max_starts, a.per) else {
        return Err(CliError::usage(
            "error: rate-limit needs QUEUE MAX_STARTS PERIOD (or QUEUE --clear)",
        ));
    };
    let previous = admin.set_rate_limit(queue, n, per)?;
    done(ctx, app, out, queue, false, || {
        let before = previous.map_or_else(|| "none".to_owned(), |p| format!("{p} starts"));
        format!(
            "queue {queue}: at most {n} starts per {} across every worker (before: {before})",
            output::age(per)
        )
    })
}

pub fn run_key(
    ctx: &Context,
    app: &App,
    a: &KeyLimitArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let admin = app.admin();
    let Some(queue) = a.queue.as_deref() else {
        let limits = admin.key_limits()?;
        if ctx.json {
            return json(out, &limits);
        }
        if limits.is_empty() {
            writeln!(out, "no queue has a key limit")?;
        }
        for l in &limits {
            writeln!(
                out,
                "{}: at most {} running per {}; {} running, {} keys at the limit, {} due jobs held",
                output::clean(&l.queue),
                l.max_per_key,
                output::clean(&l.key_arg),
                l.running,
                l.keys_at_limit,
                l.held
            )?;
        }
        return Ok(());
    };
    if a.clear {
        let cleared = admin.clear_key_limit(queue)?;
        return done(ctx, app, out, queue, true, || {
            if cleared {
                format!("queue {queue}: key limit cleared")
            } else {
                format!("queue {queue} had no key limit")
            }
        });
    }
    let (Some(n), Some(by)) = (a.max_per_key, a.by.as_deref()) else {
        return Err(CliError::usage(
            "error: key-limit needs QUEUE MAX_PER_KEY --by FIELD (or QUEUE --clear)",
        ));
    };
    let previous = admin.set_key_limit(queue, by, n)?;
    done(ctx, app, out, queue, false, || {
        let before = previous.map_or_else(
            || "none".to_owned(),
            |(p, arg)| format!("{p} per {}", output::clean(&arg)),
        );
        format!(
            "queue {queue}: at most {n} running jobs per value of argument {} across every worker (before: {before})",
            output::clean(by)
        )
    })
}

/// Answers a set or a clear, with the note of a queue never seen.
fn done(
    ctx: &Context,
    app: &App,
    out: &mut dyn Write,
    queue: &str,
    cleared: bool,
    text: impl FnOnce() -> String,
) -> Result<(), CliError> {
    let seen = Seen::look(app, queue);
    if ctx.json {
        return json(
            out,
            &Done {
                queue,
                cleared,
                queue_seen: seen.json(),
            },
        );
    }
    writeln!(out, "{}", output::clean(&text()))?;
    seen.note(out, queue)?;
    Ok(())
}
