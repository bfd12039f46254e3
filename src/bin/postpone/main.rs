//! `postpone`: the command-line tool to run postpone's admin API against a database.
//!
//! `main.rs` parses the arguments (clap) and dispatches to one module per command under
//! `commands/`; each writes to a `&mut dyn Write` (tables for people, JSON with `--json`).
//! Exit codes are documented in docs/cli.md and listed in [`context::Exit`]: 0 success,
//! 1 unhealthy (healthcheck), 2 usage, 3 not found, 4 wrong state, 5 database unreachable,
//! 6 permission denied, 7 schema missing or older, 8 schema newer than this postpone,
//! 9 database missing (the server answered that the database named does not exist).
//! Errors print `error: ...` on stderr, or a JSON object there under `--json`. Every
//! round-trip has the `--timeout` deadline; nothing here can hang or panic on input.

mod commands;
mod context;
mod database;
mod output;
mod parse;

use std::ffi::OsString;
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Parser, Subcommand};
use postpone::JobId;

use commands::bulk::{CancelArgs, Op, PriorityArgs, RescheduleArgs, Target};
use commands::defer::DeferArgs;
use commands::healthcheck::HealthArgs;
use commands::jobs::JobsArgs;
use commands::migrate::MigrateArgs;
use commands::pause::PauseArgs;
use commands::prune::PruneArgs;
use commands::stalled::StalledArgs;
use commands::stats::StatsArgs;
use commands::workers::WorkersArgs;
use commands::workflow::WorkflowArgs;
use context::{CliError, Context};

/// Administer postpone job queues in PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "postpone", version, max_term_width = 100)]
struct Cli {
    /// The database, URL or key=value (default: libpq's PG* variables, see docs/cli.md)
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        hide_env_values = true,
        value_name = "URL",
        help_heading = "Global options"
    )]
    database_url: Option<String>,

    /// The PostgreSQL schema of postpone's objects (default: wherever the search_path finds them)
    #[arg(
        long,
        env = "POSTPONE_SCHEMA",
        global = true,
        hide_env_values = true,
        value_name = "NAME",
        help_heading = "Global options"
    )]
    schema: Option<String>,

    /// Print JSON instead of tables (for scripts); errors too, on stderr
    #[arg(long, global = true, help_heading = "Global options")]
    json: bool,

    /// Deadline of connecting, of each round-trip, of migrate's lock wait
    #[arg(long, global = true, default_value = "10s", value_parser = parse::duration,
          value_name = "DURATION", help_heading = "Global options")]
    timeout: Duration,

    /// Say which database is used, and log what the library does, on stderr
    #[arg(short, long, global = true, action = clap::ArgAction::Count,
          help_heading = "Global options")]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install or upgrade the schema (idempotent; safe from many processes at once).
    Migrate(MigrateArgs),
    /// Defer a job of TASK with JSON arguments (kept exactly as written).
    Defer(DeferArgs),
    /// List jobs, newest first, a page at a time (says when more match).
    Jobs(JobsArgs),
    /// Show one job with its attempts and errors (large values cut unless --full).
    Job {
        /// The job id.
        #[arg(value_parser = parse::job_id)]
        id: JobId,
        /// Print its arguments, output and progress whole, however large (streamed from the
        /// database); without it, the text shows 4 KiB of each and --json values up to 1 MiB
        #[arg(long)]
        full: bool,
    },
    /// Show the progress of one batch: its jobs by state and its callbacks.
    Batch {
        /// The batch id.
        #[arg(value_parser = parse::batch_id)]
        id: postpone::BatchId,
    },
    /// Show one workflow (its jobs, their states and dependencies), or cancel or retry it.
    #[command(override_usage = "postpone workflow <ID>\n       \
                                postpone workflow cancel <ID>\n       \
                                postpone workflow retry <ID>")]
    Workflow(WorkflowArgs),
    /// Put failed, cancelled or aborted jobs back in their queue (one id, or a selection).
    Retry(Target),
    /// Cancel waiting (todo) jobs (one id, or a selection).
    Cancel(CancelArgs),
    /// Delete jobs that are not running (one id, or a selection).
    Delete(Target),
    /// Abort a running job (its task sees should_abort()); a waiting job is cancelled.
    Abort {
        /// The job id.
        #[arg(value_parser = parse::job_id)]
        id: JobId,
    },
    /// Make waiting jobs due at another time (one id, or a selection).
    Reschedule(RescheduleArgs),
    /// Give waiting jobs another priority (one id, or a selection).
    #[command(override_usage = "postpone priority <ID> <N>\n       \
                                postpone priority <ID> --to <N>\n       \
                                postpone priority [SELECTION OPTIONS] --to <N>")]
    Priority(PriorityArgs),
    /// Jobs per queue (or task) and status, failure rate, run times, lag.
    Stats(StatsArgs),
    /// Registered workers: their queues, heartbeat, lease and running jobs (--json: tasks too).
    Workers(WorkersArgs),
    /// Running jobs whose worker is silent or gone; requeue or fail them.
    Stalled(StalledArgs),
    /// Delete finished jobs older than a given age, in batches.
    Prune(PruneArgs),
    /// Exit 0 if the database answers, its schema is current (and workers, lag are fine).
    Healthcheck(HealthArgs),
    /// Print the SQL that gives a database role what a worker, producer, reader or migrator needs.
    Grants(commands::grants::GrantsArgs),
    /// Serve the web dashboard (auth from POSTPONE_DASHBOARD_TOKEN or _USER/_PASSWORD).
    Dashboard(commands::dashboard::DashboardArgs),
    /// Stop every worker from starting a queue's jobs (or every queue's); running jobs finish.
    Pause(PauseArgs),
    /// Let workers start a paused queue's jobs again (or every queue's), at once.
    Resume(PauseArgs),
    /// Set, clear or list the most jobs of a queue that run at once on all workers together.
    Limit(commands::limit::LimitArgs),
    /// Set, clear or list the most jobs of a queue that start per period on all workers.
    RateLimit(commands::rate_limit::RateLimitArgs),
    /// Set, clear or list the most running jobs per key (an argument field) of a queue.
    KeyLimit(commands::rate_limit::KeyLimitArgs),
    /// List the periodic schedules stored in the database, with their last and next instants.
    Schedules,
    /// Add, pause, resume or remove a periodic schedule stored in the database.
    Schedule {
        #[command(subcommand)]
        command: commands::schedule::ScheduleCommand,
    },
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let json_errors = args.iter().skip(1).any(|a| a == "--json");
    let mut stdout = io::stdout().lock();
    let res = run(args, &mut stdout, &|k| std::env::var(k).ok());
    let res = match (res, stdout.flush()) {
        (Ok(_), Err(e)) => Err(CliError::Output(e)),
        (res, _) => res,
    };
    res.unwrap_or_else(|e| e.report(json_errors))
}

/// Runs the tool with `args` (the first is the program name), writing results to `out`;
/// `env` reads the environment (libpq's variables).
fn run<I, T>(
    args: I,
    out: &mut dyn Write,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ExitCode, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
                write!(out, "{}", e.render())?;
                return Ok(ExitCode::SUCCESS);
            }
            return Err(CliError::Usage(e));
        }
    };
    init_logging(cli.verbose);
    let from_flag = args.iter().any(|a| {
        a.to_str()
            .is_some_and(|s| s == "--database-url" || s.starts_with("--database-url="))
    });
    let (database_url, source) = database::resolve(cli.database_url, from_flag, env);
    let ctx = Context {
        database: database::describe(&database_url),
        database_url,
        source,
        schema: cli.schema,
        json: cli.json,
        timeout: cli.timeout,
        verbose: cli.verbose > 0,
    };
    match cli.command {
        Command::Healthcheck(a) => return commands::healthcheck::run(&ctx, &a, out),
        Command::Dashboard(a) => return commands::dashboard::run(&ctx, &a, out),
        Command::Migrate(a) => {
            commands::migrate::run(&ctx, &a, out)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Grants(a) => {
            commands::grants::run(&ctx, &a, out)?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let app = ctx.connect()?;
    match cli.command {
        Command::Defer(a) => commands::defer::run(&ctx, &app, &a, out)?,
        Command::Jobs(a) => commands::jobs::run(&ctx, &app, &a, out)?,
        Command::Job { id, full } => commands::job::run(&ctx, &app, id, full, out)?,
        Command::Batch { id } => commands::batch::run(&ctx, &app, id, out)?,
        Command::Workflow(a) => commands::workflow::run(&ctx, &app, &a, out)?,
        Command::Retry(t) => commands::bulk::run(&ctx, &app, Op::Retry, &t, out)?,
        Command::Cancel(a) => {
            let op = Op::Cancel { delete: a.delete };
            commands::bulk::run(&ctx, &app, op, &a.target, out)?
        }
        Command::Delete(t) => commands::bulk::run(&ctx, &app, Op::Delete, &t, out)?,
        Command::Abort { id } => commands::abort::run(&ctx, &app, id, out)?,
        Command::Reschedule(a) => {
            let at = match (a.at, a.delay) {
                (Some(t), _) => t,
                (None, Some(d)) => SystemTime::now() + d,
                (None, None) => SystemTime::now(),
            };
            commands::bulk::run(&ctx, &app, Op::Reschedule(at), &a.target, out)?
        }
        Command::Priority(a) => {
            let to = a.new_priority()?;
            commands::bulk::run(&ctx, &app, Op::Priority(to), &a.target, out)?
        }
        Command::Stats(a) => commands::stats::run(&ctx, &app, &a, out)?,
        Command::Workers(a) => commands::workers::run(&ctx, &app, &a, out)?,
        Command::Stalled(a) => commands::stalled::run(&ctx, &app, &a, out)?,
        Command::Prune(a) => commands::prune::run(&ctx, &app, &a, out)?,
        Command::Pause(a) => commands::pause::pause(&ctx, &app, &a, out)?,
        Command::Resume(a) => commands::pause::resume(&ctx, &app, &a, out)?,
        Command::Limit(a) => commands::limit::run(&ctx, &app, &a, out)?,
        Command::RateLimit(a) => commands::rate_limit::run_rate(&ctx, &app, &a, out)?,
        Command::KeyLimit(a) => commands::rate_limit::run_key(&ctx, &app, &a, out)?,
        Command::Schedules => commands::schedule::list(&ctx, &app, out)?,
        Command::Schedule { command } => commands::schedule::run(&ctx, &app, &command, out)?,
        Command::Healthcheck(_)
        | Command::Migrate(_)
        | Command::Grants(_)
        | Command::Dashboard(_) => {
            unreachable!("handled above")
        }
    }
    log_peak_memory();
    Ok(ExitCode::SUCCESS)
}

/// Logs (at `-v`) this process's peak resident memory, where the system tells it (Linux's
/// `/proc/self/status`): what a command cost, and what tests read to hold it bounded.
fn log_peak_memory() {
    if !log::log_enabled!(log::Level::Info) {
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(kb) = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .map(str::trim)
    {
        log::info!("peak memory of this process: {kb} (VmHWM)");
    }
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => log::LevelFilter::Off,
        1 => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    };
    let mut b = env_logger::Builder::new();
    b.filter_level(level);
    if verbose == 0 {
        // RUST_LOG still works when -v is not given.
        b.parse_default_env();
    }
    let _ = b.try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> (Result<ExitCode, CliError>, String) {
        let mut out = Vec::new();
        let mut full = vec!["postpone"];
        full.extend_from_slice(args);
        let res = run(full, &mut out, &|_| None);
        (res, String::from_utf8(out).unwrap())
    }

    #[test]
    fn help_and_version_go_to_out() {
        let (res, out) = run_args(&["--help"]);
        assert!(res.is_ok());
        for cmd in [
            "migrate",
            "defer",
            "jobs",
            "job",
            "retry",
            "cancel",
            "abort",
            "stats",
            "workers",
            "prune",
            "healthcheck",
            "delete",
            "reschedule",
            "priority",
            "stalled",
            "pause",
            "resume",
            "limit",
            "rate-limit",
            "key-limit",
            "grants",
        ] {
            assert!(out.contains(cmd), "{cmd} missing from help:\n{out}");
        }
        let (res, out) = run_args(&["--version"]);
        assert!(res.is_ok());
        assert!(out.starts_with("postpone "), "{out}");
    }

    #[test]
    fn usage_errors_are_reported_without_connecting() {
        for args in [
            &["jobs", "--status", "done"][..],
            &["jobs", "--limit", "0"],
            &["job", "abc"],
            &["defer"],
            &["defer", "t", "--in", "10x"],
            &["defer", "t", "--in", "1m", "--at", "2030-01-01T00:00:00Z"],
            &["prune"],
            &["prune", "--older-than", "7d", "--status", "todo"],
            &["jobs", "--sort", "age"],
            &["jobs", "--asc", "--desc"],
            &["reschedule", "1"],
            &["priority", "1"],
            &["stats", "--by", "worker"],
            &["migrate", "--all"],
            &["frobnicate"],
            &["--timeout", "soon", "stats"],
            &["pause"],
            &["resume"],
            &["pause", "q", "--all"],
            &["limit", "q"],
            &["limit", "q", "3", "--clear"],
            &["limit", "--clear"],
            &["limit", "q", "many"],
            &["rate-limit", "q"],
            &["rate-limit", "q", "5"],
            &["rate-limit", "q", "5", "0x"],
            &["rate-limit", "q", "5", "1s", "--clear"],
            &["key-limit", "q", "2"],
            &["key-limit", "q", "--by", "user"],
            &["key-limit", "q", "2", "--by", "user", "--clear"],
            &["grants", "w"],
            &["grants", "w", "--for", "admin"],
            &["grants", "--for", "worker"],
        ] {
            let (res, _) = run_args(args);
            match res {
                Err(CliError::Usage(e)) => {
                    assert!(e.to_string().starts_with("error:"), "{args:?}: {e}")
                }
                other => panic!("{args:?}: expected a usage error, got {other:?}"),
            }
        }
    }
}
