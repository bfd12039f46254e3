//! `postpone`: the command-line tool to run postpone's admin API against a database.
//!
//! Parses the arguments (clap), calls `App::admin` (or `migrate`, `defer`), prints an
//! aligned table for people or JSON with `--json`, and exits: 0 on success, 2 on any error
//! (`error: ...` on stderr; clap's usage errors too). `healthcheck` exits 1 when the
//! database cannot be reached within `--timeout` or its schema is missing or outdated.
//! Every round-trip has the `--timeout` deadline; nothing here can hang or panic on input.

mod dashboard;
mod output;
mod parse;

use std::ffi::OsString;
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use postpone::{App, JobFilter, JobId, JobStatus, Retention};
use serde::Serialize;

use output::Table;

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
    /// Serve the web dashboard (auth from POSTPONE_DASHBOARD_TOKEN or _USER/_PASSWORD).
    Dashboard(dashboard::DashboardArgs),
}

#[derive(Debug, Args)]
struct DeferArgs {
    /// The task name.
    task: String,
    /// Its arguments as JSON (default: null).
    #[arg(value_name = "JSON")]
    args: Option<String>,
    /// The queue (default: "default").
    #[arg(long)]
    queue: Option<String>,
    /// At most one job of this lock runs at a time.
    #[arg(long)]
    lock: Option<String>,
    /// At most one job of this queueing lock waits at a time.
    #[arg(long)]
    queueing_lock: Option<String>,
    /// Higher runs first (default: 0).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// Run no sooner than this from now (30s, 10m, 2h...).
    #[arg(long = "in", value_parser = parse::duration, value_name = "DURATION",
          conflicts_with = "at")]
    delay: Option<Duration>,
    /// Run no sooner than this time (RFC 3339: 2030-01-02T03:04:05Z).
    #[arg(long, value_parser = parse::time, value_name = "TIME")]
    at: Option<SystemTime>,
}

#[derive(Debug, Args)]
struct JobsArgs {
    /// Only these statuses (repeat or comma-separate).
    #[arg(long, value_parser = parse::status, value_delimiter = ',', value_name = "STATUS")]
    status: Vec<JobStatus>,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only this task.
    #[arg(long)]
    task: Option<String>,
    /// Only this lock.
    #[arg(long)]
    lock: Option<String>,
    /// Only this queueing lock.
    #[arg(long)]
    queueing_lock: Option<String>,
    /// At most this many jobs.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
}

/// Why the tool stopped.
#[derive(Debug)]
enum CliError {
    /// Bad arguments: clap's message (it starts with `error:` and shows the usage).
    Usage(clap::Error),
    /// A failed operation.
    Failed(String),
    /// Writing the output failed (a closed pipe, say).
    Output(io::Error),
}

impl From<postpone::Error> for CliError {
    fn from(e: postpone::Error) -> CliError {
        CliError::Failed(e.to_string())
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> CliError {
        CliError::Output(e)
    }
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
    if let Command::Healthcheck = cli.command {
        return healthcheck(&cli, out);
    }
    if let Command::Dashboard(a) = &cli.command {
        return dashboard::run(&cli.database_url, cli.timeout, a, out);
    }
    let app = connect(&cli)?;
    match &cli.command {
        Command::Migrate => migrate(&cli, &app, out)?,
        Command::Defer(a) => defer(&cli, &app, a, out)?,
        Command::Jobs(a) => jobs(&cli, &app, a, out)?,
        Command::Job { id } => job(&cli, &app, *id, out)?,
        Command::Retry { id } => {
            app.admin().retry(*id)?;
            if cli.json {
                json(out, &Changed::new(*id, "todo"))?;
            } else {
                writeln!(out, "job {id} is waiting again (todo)")?;
            }
        }
        Command::Cancel { id, delete } => {
            let admin = app.admin();
            if *delete {
                admin.cancel_and_delete(*id)?;
            } else {
                admin.cancel(*id)?;
            }
            if cli.json {
                let mut c = Changed::new(*id, "cancelled");
                c.deleted = Some(*delete);
                json(out, &c)?;
            } else if *delete {
                writeln!(out, "job {id} cancelled and deleted")?;
            } else {
                writeln!(out, "job {id} cancelled")?;
            }
        }
        Command::Abort { id } => {
            let outcome = app.admin().abort(*id)?;
            if cli.json {
                let status = match outcome {
                    postpone::AbortOutcome::Requested => "doing",
                    _ => "cancelled",
                };
                let mut c = Changed::new(*id, status);
                c.abort = Some(outcome);
                json(out, &c)?;
            } else {
                match outcome {
                    postpone::AbortOutcome::Requested => writeln!(
                        out,
                        "job {id}: abort requested; its task sees should_abort() and the job ends aborted"
                    )?,
                    _ => writeln!(out, "job {id} was waiting: cancelled")?,
                }
            }
        }
        Command::Stats => stats(&cli, &app, out)?,
        Command::Workers => workers(&cli, &app, out)?,
        Command::Prune { older_than, status } => {
            let r = Retention::new(*older_than).statuses(status.iter().copied());
            let report = app.admin().prune(&r)?;
            if cli.json {
                json(out, &report)?;
            } else {
                writeln!(out, "{report}")?;
            }
        }
        Command::Healthcheck | Command::Dashboard(_) => unreachable!("handled above"),
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

fn connect(cli: &Cli) -> Result<App, postpone::Error> {
    App::builder(cli.database_url.clone())
        .pool_size(2)
        .connect_timeout(cli.timeout)
        .io_timeout(cli.timeout)
        .pool_timeout(cli.timeout + Duration::from_secs(1))
        .build()
}

fn json<T: Serialize + ?Sized>(out: &mut dyn Write, value: &T) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value)
        .map_err(|e| CliError::Output(io::Error::other(e)))?;
    writeln!(out)?;
    Ok(())
}

/// The JSON answer of retry, cancel and abort.
#[derive(Serialize)]
struct Changed {
    id: JobId,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    abort: Option<postpone::AbortOutcome>,
}

impl Changed {
    fn new(id: JobId, status: &'static str) -> Changed {
        Changed {
            id,
            status,
            deleted: None,
            abort: None,
        }
    }
}

fn migrate(cli: &Cli, app: &App, out: &mut dyn Write) -> Result<(), CliError> {
    let applied = app.migrate()?;
    let version = app.schema_version()?.unwrap_or(0);
    if cli.json {
        #[derive(Serialize)]
        struct Migrated {
            applied: Vec<i32>,
            version: i32,
        }
        json(out, &Migrated { applied, version })?;
    } else if applied.is_empty() {
        writeln!(out, "schema is up to date (version {version})")?;
    } else {
        let list: Vec<String> = applied.iter().map(i32::to_string).collect();
        writeln!(
            out,
            "applied migration(s) {}; schema is at version {version}",
            list.join(", ")
        )?;
    }
    Ok(())
}

fn defer(cli: &Cli, app: &App, a: &DeferArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let args: serde_json::Value = match &a.args {
        None => serde_json::Value::Null,
        Some(text) => serde_json::from_str(text).map_err(|e| {
            CliError::Failed(format!(
                "invalid JSON arguments {}: {e}",
                output::cut(text, 60)
            ))
        })?,
    };
    let mut b = app.job(&a.task);
    if let Some(q) = &a.queue {
        b = b.queue(q);
    }
    if let Some(l) = &a.lock {
        b = b.lock(l);
    }
    if let Some(l) = &a.queueing_lock {
        b = b.queueing_lock(l);
    }
    if let Some(p) = a.priority {
        b = b.priority(p);
    }
    if let Some(d) = a.delay {
        b = b.schedule_in(d);
    }
    if let Some(t) = a.at {
        b = b.schedule_at(t);
    }
    let id = b.defer(&args)?;
    if cli.json {
        json(out, &Changed::new(id, "todo"))?;
    } else {
        writeln!(out, "deferred job {id} ({})", a.task)?;
    }
    Ok(())
}

fn jobs(cli: &Cli, app: &App, a: &JobsArgs, out: &mut dyn Write) -> Result<(), CliError> {
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
    if cli.json {
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

fn job(cli: &Cli, app: &App, id: JobId, out: &mut dyn Write) -> Result<(), CliError> {
    let d = app.admin().job(id)?;
    if cli.json {
        return json(out, &d);
    }
    let j = &d.job;
    let worker = match (&d.worker_name, j.worker_id) {
        (Some(n), Some(w)) => format!("{n} (id {w})"),
        (None, Some(w)) => format!("id {w} (gone)"),
        _ => "-".to_owned(),
    };
    let periodic = match (&d.periodic_id, d.periodic_instant) {
        (Some(pid), Some(at)) if pid.is_empty() => format!("instant {} UTC", output::time(at)),
        (Some(pid), Some(at)) => format!("id {pid:?}, instant {} UTC", output::time(at)),
        _ => "-".to_owned(),
    };
    let fields = [
        ("id", j.id.to_string()),
        ("task", j.task.clone()),
        ("queue", j.queue.clone()),
        ("status", j.status.to_string()),
        ("attempts", j.attempts.to_string()),
        ("priority", j.priority.to_string()),
        ("lock", output::opt(j.lock.as_deref())),
        ("queueing lock", output::opt(j.queueing_lock.as_deref())),
        ("args", j.args.to_string()),
        ("created (UTC)", output::time(j.created_at)),
        ("scheduled (UTC)", output::time(j.scheduled_at)),
        ("started (UTC)", output::opt_time(j.started_at)),
        ("finished (UTC)", output::opt_time(j.finished_at)),
        ("worker", worker),
        (
            "abort requested",
            if j.abort_requested { "yes" } else { "no" }.to_owned(),
        ),
        ("periodic", periodic),
    ];
    for (k, v) in fields {
        writeln!(out, "{:<17}{v}", format!("{k}:"))?;
    }
    if d.errors.is_empty() {
        writeln!(out, "{:<17}none", "errors:")?;
    } else {
        writeln!(out, "errors:")?;
        for e in &d.errors {
            writeln!(
                out,
                "  attempt {} at {}: {}",
                e.attempt,
                output::opt_time(e.at),
                e.error
            )?;
        }
    }
    Ok(())
}

fn stats(cli: &Cli, app: &App, out: &mut dyn Write) -> Result<(), CliError> {
    let counts = app.admin().counts()?;
    if cli.json {
        return json(out, &counts);
    }
    if counts.is_empty() {
        writeln!(out, "no jobs")?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "QUEUE",
        "TODO",
        "SCHEDULED",
        "DOING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "ABORTED",
        "OLDEST TODO",
    ]);
    for c in &counts {
        t.row(vec![
            c.queue.clone(),
            c.todo.to_string(),
            c.scheduled.to_string(),
            c.doing.to_string(),
            c.succeeded.to_string(),
            c.failed.to_string(),
            c.cancelled.to_string(),
            c.aborted.to_string(),
            c.oldest_todo_age
                .map_or_else(|| "-".to_owned(), output::age),
        ]);
    }
    t.write(out)?;
    Ok(())
}

fn workers(cli: &Cli, app: &App, out: &mut dyn Write) -> Result<(), CliError> {
    let list = app.admin().workers()?;
    if cli.json {
        return json(out, &list);
    }
    if list.is_empty() {
        writeln!(out, "no workers")?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "ID",
        "NAME",
        "HOST",
        "PID",
        "QUEUES",
        "THREADS",
        "RUNNING",
        "HEARTBEAT AGE",
        "STARTED (UTC)",
    ]);
    for w in &list {
        t.row(vec![
            w.id.to_string(),
            w.name.clone(),
            w.host.clone(),
            w.pid.to_string(),
            w.queues
                .as_ref()
                .map_or_else(|| "all".to_owned(), |q| q.join(",")),
            w.concurrency.to_string(),
            w.running.to_string(),
            output::age(w.heartbeat_age),
            output::time(w.started_at),
        ]);
    }
    t.write(out)?;
    Ok(())
}

fn healthcheck(cli: &Cli, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    #[derive(Serialize)]
    struct Health {
        healthy: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        schema_version: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    }
    let res = connect(cli).and_then(|app| app.admin().check_schema());
    let health = match res {
        Ok(v) => Health {
            healthy: true,
            schema_version: Some(v),
            error: None,
        },
        Err(e) => Health {
            healthy: false,
            schema_version: None,
            error: Some(e.to_string()),
        },
    };
    if cli.json {
        json(out, &health)?;
    } else if let Some(e) = &health.error {
        writeln!(out, "unhealthy: {e}")?;
    } else {
        writeln!(
            out,
            "ok: database answers, schema version {}",
            health.schema_version.unwrap_or(0)
        )?;
    }
    Ok(if health.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
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
