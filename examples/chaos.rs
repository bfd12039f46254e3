//! The chaos checker of issue 9, for as long as asked: worker processes under random faults
//! and hostile tasks, then a drain and the checker (rules in `tests/chaos_support/check.rs`).
//!
//! ```sh
//! cargo run --example chaos -- --seconds 300 --seed 7 --workers 4
//! ```
//!
//! Options: `--seconds N` (faults and defers, default 30), `--seed S` (default: from the
//! clock, printed), `--workers W` (default 3), `--concurrency C` (threads per worker, 2),
//! `--rate R` (jobs deferred per second, 10), `--drain N` (after the run, wait for every job
//! to end while something progresses at least every N seconds, default 30), `--exclude a,b`
//! (faults or task kinds to leave out), `--logs DIR` (the worker processes' logs),
//! `--verbose` (print each fault and the drain's progress), and
//! `--restart-cmd CMD`: also restart the server now and then by running `sh -c CMD` (for
//! example `"pg_ctlcluster 15 main restart"`). Never use it on a server that other programs
//! or tests share: every connection to it is cut. Without it no server restart is injected.
//!
//! `--own-server`: the jobs live on a PostgreSQL cluster the run creates (initdb on a spare
//! port, removed at the end), and the server's own faults join the mix: fast and immediate
//! restarts, a failover to a streaming standby (the URLs list both hosts), a PgBouncer
//! restart (slot 0 goes through PgBouncer in transaction pooling, slot 1 in session pooling),
//! every connection slot taken, the database made read-only, a low `statement_timeout` and
//! `lock_timeout`. With it: `--replication sync|async|none` (default sync: a commit is
//! acknowledged once the standby has it; async: a failover may lose what was acknowledged
//! last, which the checker counts apart), `--no-pgbouncer`, `--max-connections N` (80).
//! See docs/reliability.md.
//!
//! ```sh
//! cargo run --example chaos -- --own-server --seconds 1800 --seed 11 --workers 4
//! ```
//!
//! Server: env `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432`); each run
//! creates and drops its own database there (the jobs', or with `--own-server` the execution
//! log's only). Exit status: 0 without violations, 1 with, 2 on bad arguments or when a
//! server of our own cannot be built here. The worker processes are this program, re-invoked
//! with env `CHAOS_CHILD_URL`.

#[path = "../tests/chaos_support/mod.rs"]
mod chaos_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chaos_support::server::{OwnServer, Replication, Server};
use chaos_support::{child, Config, Fault, Mix};

fn main() -> ExitCode {
    if child::main_from_env() {
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let child_cmd: chaos_support::run::ChildCommand = Arc::new(move || Command::new(&exe));
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(1);
    let mut cfg = Config::new(seed, child_cmd);
    cfg.run_for = Duration::from_secs(30);
    cfg.drain_timeout = Duration::from_secs(30);
    let mut exclude = String::new();
    let mut own: Option<OwnServer> = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--verbose" => {
                cfg.verbose = true;
                continue;
            }
            "--own-server" => {
                own.get_or_insert_with(OwnServer::default);
                continue;
            }
            "--no-pgbouncer" => {
                own.get_or_insert_with(OwnServer::default).bouncers = false;
                continue;
            }
            _ => {}
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| -> Result<u64, String> {
            v.parse()
                .map_err(|e| format!("{flag} {v:?}: not a number: {e}"))
        };
        match flag.as_str() {
            "--seconds" => cfg.run_for = Duration::from_secs(num(&value)?),
            "--seed" => cfg.seed = num(&value)?,
            "--workers" => cfg.workers = num(&value)?.max(1) as usize,
            "--concurrency" => cfg.concurrency = num(&value)?.max(1) as usize,
            "--rate" => cfg.jobs_per_sec = num(&value)?.max(1) as u32,
            "--drain" => cfg.drain_timeout = Duration::from_secs(num(&value)?),
            "--exclude" => exclude = value,
            "--logs" => cfg.child_logs = Some(value.into()),
            "--restart-cmd" => cfg.restart_cmd = Some(value),
            "--replication" => {
                own.get_or_insert_with(OwnServer::default).replication = Replication::parse(&value)?
            }
            "--max-connections" => {
                own.get_or_insert_with(OwnServer::default).max_connections =
                    num(&value)?.max(10) as u32
            }
            other => {
                return Err(format!(
                    "unknown option {other} (see the header of examples/chaos.rs)"
                ))
            }
        }
    }
    let mut mix = Mix::default().excluding(&exclude)?;
    if cfg.restart_cmd.is_some() {
        mix = mix.with_fault(Fault::Restart, 1);
    }
    if let Some(own) = &own {
        if let Some(reason) = Server::skip_reason(Some(own)) {
            return Err(format!("--own-server: {reason}"));
        }
        mix = mix.with_own_server(own);
    }
    cfg.mix = mix;
    cfg.own = own;
    println!(
        "chaos: seed {}, {} s, {} workers x {} threads, {} jobs/s, {}; {}",
        cfg.seed,
        cfg.run_for.as_secs(),
        cfg.workers,
        cfg.concurrency,
        cfg.jobs_per_sec,
        match &cfg.own {
            None => "the shared server".to_owned(),
            Some(o) => format!(
                "a server of our own ({} replication, {}, max_connections {})",
                o.replication.name(),
                if o.bouncers {
                    "pgbouncer"
                } else {
                    "no pgbouncer"
                },
                o.max_connections
            ),
        },
        cfg.mix.enabled()
    );
    let report = chaos_support::run(&cfg);
    println!("{report}");
    Ok(report.violations.is_empty())
}
