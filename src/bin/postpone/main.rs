//! `postpone`: the command-line tool to run postpone's admin API against a database.
//!
//! Parses the arguments (clap), calls `App::admin` (or `migrate`, `defer`), prints an
//! aligned table for people or JSON with `--json`, and exits: 0 on success, 2 on any error
//! (`error: ...` on stderr; clap's usage errors too). `healthcheck` exits 1 when the
//! database cannot be reached within `--timeout` or its schema is missing or outdated.
//! Every round-trip has the `--timeout` deadline; nothing here can hang or panic on input.

mod commands;
mod context;
mod output;
mod parse;

use std::ffi::OsString;
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use postpone::{JobId, JobStatus};

use commands::defer::DeferArgs;
use commands::jobs::JobsArgs;
use context::{CliError, Context};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Administer postpone job queues in PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "postpone", version, max_term_width = 100)]
struct Cli {
    /// The database (URL or key=value string).
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, global = true,
          hide_env_values = true, value_name = "URL")]
    database_url: String,

    /// Print JSON instead of tables (for scripts).
    #[arg(long, global = true)]
    json: bool,

    /// Deadline of connecting and of every round-trip (30s, 2m...).
    #[arg(long, global = true, default_value = "10s", value_parser = parse::duration,
          value_name = "DURATION")]
    timeout: Duration,

    /// Log what the library does to stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install or upgrade the schema (idempotent; safe from many processes at once).
    Migrate,
    /// Defer a job of TASK with JSON arguments.
    Defer(DeferArgs),
    /// List jobs, newest first.
    Jobs(JobsArgs),
    /// Show one job with its attempts and errors.
    Job {
        /// The job id.
        #[arg(value_parser = parse::job_id)]
        id: JobId,
    },
    /// Put a failed, cancelled or aborted job back in its queue.
    Retry {
        /// The job id.
        #[arg(value_parser = parse::job_id)]
        id: JobId,
    },
    /// Cancel a waiting (todo) job.
    Cancel {
        /// The job id.
        #[arg(value_parser = parse::job_id)]
        id: JobId,
        /// Delete the job instead of keeping it as cancelled.
        #[arg(long)]
        delete: bool,
    },
    /// Abort a running job (its task sees should_abort()); a waiting job is cancelled.
    Abort {
        /// The job id.
        #[arg(value_parser = parse::job_id)]
        id: JobId,
    },
    /// Jobs per queue and status.
    Stats,
    /// Registered workers and the age of their heartbeat.
    Workers,
    /// Delete finished jobs older than a given age, in batches.
    Prune {
        /// Age past which finished jobs are deleted (7d, 12h...).
        #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
        older_than: Duration,
        /// Only these statuses (repeat or comma-separate; default: every finished one).
        #[arg(long, value_parser = parse::finished_status, value_delimiter = ',',
              value_name = "STATUS")]
        status: Vec<JobStatus>,
    },
    /// Exit 0 if the database answers within --timeout and its schema is current, else 1.
    Healthcheck,
}

fn main() -> ExitCode {
    let mut stdout = io::stdout().lock();
    let res = run(std::env::args_os(), &mut stdout);
    let _ = stdout.flush();
    match res {
        Ok(code) => code,
        Err(CliError::Usage(e)) => {
            eprint!("{}", e.render());
            ExitCode::from(2)
        }
        Err(CliError::Failed(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        // The reader went away (`postpone jobs | head`): nothing left to say.
        Err(CliError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(CliError::Output(e)) => {
            eprintln!("error: writing the output: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the tool with `args` (the first is the program name), writing results to `out`.
fn run<I, T>(args: I, out: &mut dyn Write) -> Result<ExitCode, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
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
    let ctx = Context {
        database_url: cli.database_url,
        json: cli.json,
        timeout: cli.timeout,
    };
    if let Command::Healthcheck = cli.command {
        return commands::healthcheck::run(&ctx, out);
    }
    let app = ctx.connect()?;
    match cli.command {
        Command::Migrate => commands::migrate::run(&ctx, &app, out)?,
        Command::Defer(a) => commands::defer::run(&ctx, &app, &a, out)?,
        Command::Jobs(a) => commands::jobs::run(&ctx, &app, &a, out)?,
        Command::Job { id } => commands::job::run(&ctx, &app, id, out)?,
        Command::Retry { id } => commands::retry::run(&ctx, &app, id, out)?,
        Command::Cancel { id, delete } => commands::cancel::run(&ctx, &app, id, delete, out)?,
        Command::Abort { id } => commands::abort::run(&ctx, &app, id, out)?,
        Command::Stats => commands::stats::run(&ctx, &app, out)?,
        Command::Workers => commands::workers::run(&ctx, &app, out)?,
        Command::Prune { older_than, status } => {
            commands::prune::run(&ctx, &app, older_than, &status, out)?
        }
        Command::Healthcheck => unreachable!("handled above"),
    }
    Ok(ExitCode::SUCCESS)
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
        let res = run(full, &mut out);
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
            &["frobnicate"],
            &["--timeout", "soon", "stats"],
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
