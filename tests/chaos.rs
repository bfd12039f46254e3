//! The chaos checker of issue 9, in CI: a few seeds, each a short run of three worker
//! processes under random faults and hostile tasks, judged by the checker (see
//! `tests/chaos_support/check.rs` for the rules). A violation fails the test with the seed,
//! the counts and the history of the violating jobs; reproduce one with
//! `CHAOS_SEEDS=<seed> cargo test --test chaos -- --nocapture`, or longer with
//! `cargo run --example chaos -- --seed <seed> --seconds 60`.
//!
//! Env: `CHAOS_SEEDS` (comma-separated seeds), `CHAOS_EXCLUDE` (faults or task kinds to leave
//! out, comma-separated, replacing the default exclusions), `CHAOS_CHILD_LOGS` (a directory
//! for the worker processes' logs), `CHAOS_VERBOSE=1` (print each fault).
//!
//! `chaos_server_faults_hold_every_promise` runs one short seed on a server of the test's
//! own (initdb on a spare port, a synchronous standby, PgBouncer in front of two slots) with
//! the server's faults beside those: restarts, a failover, PgBouncer restarts, exhausted
//! connections, read-only and low timeouts (skipped, saying why, where initdb or PgBouncer
//! cannot run). `CHAOS_SERVER_SEED` picks its seed. Longer:
//! `cargo run --example chaos -- --own-server --seconds 600`.
//!
//! The worker processes are this test binary, re-invoked as the ignored test
//! `chaos_worker_child` with env `CHAOS_CHILD_URL`. The two runs take turns (the machine
//! has few cores and both are timing-sensitive).

mod chaos_support;
mod support;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos_support::server::{OwnServer, Server};
use chaos_support::{child, Config, Fault, Mix};

/// Seeds run in CI (about 20 s each on a loaded machine).
const SEEDS: [u64; 3] = [1, 2, 3];

/// Faults and task kinds left out of the CI mix because the code still breaks on them (each
/// an open item of issue 9). Empty when everything holds.
const KNOWN_BROKEN: &str = "";

#[test]
#[ignore = "worker process of the chaos test (started by chaos_seeds_hold_every_promise)"]
fn chaos_worker_child() {
    child::main_from_env();
}

/// One chaos run at a time.
static TURN: Mutex<()> = Mutex::new(());

/// The command that starts a worker process: this test binary, as `chaos_worker_child`.
fn child_command() -> chaos_support::run::ChildCommand {
    let exe = std::env::current_exe().expect("the test binary's path");
    Arc::new(move || {
        let mut c = Command::new(&exe);
        c.args([
            "chaos_worker_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        c
    })
}

#[test]
fn chaos_server_faults_hold_every_promise() {
    let own = OwnServer::default();
    if let Some(reason) = Server::skip_reason(Some(&own)) {
        support::skip(&reason);
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let seed = std::env::var("CHAOS_SERVER_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1);
    let exclude = std::env::var("CHAOS_EXCLUDE").unwrap_or_else(|_| KNOWN_BROKEN.to_owned());
    let mut mix = Mix::default()
        .excluding(&exclude)
        .unwrap_or_else(|e| panic!("CHAOS_EXCLUDE: {e}"))
        .with_own_server(&own);
    // The server's faults twice as often as in a long run: each kind shows up in 12 s.
    for (f, w) in &mut mix.faults {
        if f.is_server() && *w > 0 {
            *w = 2;
        }
    }
    let mut cfg = Config::new(seed, child_command());
    cfg.run_for = Duration::from_secs(12);
    cfg.mix = mix;
    cfg.own = Some(own);
    cfg.child_logs = std::env::var_os("CHAOS_CHILD_LOGS").map(Into::into);
    cfg.verbose = std::env::var("CHAOS_VERBOSE").is_ok_and(|v| v == "1");
    let report = chaos_support::run(&cfg);
    println!("{}", report.summary());
    let server_faults: usize = report
        .faults
        .iter()
        .filter(|(f, _)| f.is_server() && **f != Fault::BouncerCrash)
        .map(|(_, n)| n)
        .sum();
    assert!(
        report.executions > 0 && report.jobs > 0 && server_faults > 0,
        "seed {seed}: nothing ran or no server fault was injected, the run proves nothing:\n{report}"
    );
    assert!(
        report.violations.is_empty(),
        "seed {seed}: {} violations (reproduce: CHAOS_SERVER_SEED={seed} cargo test --test chaos \
         chaos_server -- --nocapture)\n{report}",
        report.violations.len()
    );
}

#[test]
fn chaos_seeds_hold_every_promise() {
    let seeds: Vec<u64> = match std::env::var("CHAOS_SEEDS") {
        Ok(s) if !s.trim().is_empty() => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .expect("CHAOS_SEEDS: comma-separated numbers")
            })
            .collect(),
        _ => SEEDS.to_vec(),
    };
    let exclude = std::env::var("CHAOS_EXCLUDE").unwrap_or_else(|_| KNOWN_BROKEN.to_owned());
    let mix = Mix::default()
        .excluding(&exclude)
        .unwrap_or_else(|e| panic!("CHAOS_EXCLUDE: {e}"));
    let child_cmd = child_command();
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    for seed in seeds {
        let mut cfg = Config::new(seed, child_cmd.clone());
        cfg.mix = mix.clone();
        cfg.child_logs = std::env::var_os("CHAOS_CHILD_LOGS").map(Into::into);
        cfg.verbose = std::env::var("CHAOS_VERBOSE").is_ok_and(|v| v == "1");
        let report = chaos_support::run(&cfg);
        println!("{}", report.summary());
        assert!(
            report.executions > 0 && report.jobs > 0,
            "seed {seed}: nothing ran, the run proves nothing:\n{report}"
        );
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {} violations (reproduce: CHAOS_SEEDS={seed} cargo test --test chaos -- --nocapture)\n{report}",
            report.violations.len()
        );
    }
}

/// The checker itself, on a made-up run: each rule fires on the history that breaks it, and
/// stays quiet on the histories the promises allow (a rescue after a pause, a parked job).
#[test]
fn the_checker_flags_each_broken_rule_and_only_those() {
    use chaos_support::check::{judge, Exec, JobRow};
    use chaos_support::run::{AbortEvent, FaultEvent, Proc, Record};
    use chaos_support::server::Replication;
    use chaos_support::Fault;
    use postpone::AbortOutcome;

    let ms = |t: i64| t * 1000;
    let job = |id: i64, task: &str, status: &str, attempts: i32| JobRow {
        id,
        seq: Some(id),
        task: task.to_owned(),
        status: status.to_owned(),
        attempts,
        lock: None,
        queueing_lock: None,
        parked: false,
        scheduled_in_s: 0.0,
        errors: String::new(),
    };
    let exec = |job: i64, attempt: i32, pid: u32, from: i64, to: Option<i64>, outcome: &str| Exec {
        job,
        seq: Some(job),
        attempt,
        pid,
        slot: (pid / 100 - 1) as usize,
        lock: None,
        start: ms(from),
        end: to.map(ms),
        outcome: Some(outcome.to_owned()),
        abort_seen: outcome == "aborted",
    };
    let proc = |slot: usize, pid: u32, died: Option<i64>, killed: bool| Proc {
        slot,
        pid,
        spawned: 0,
        ready: Some(0),
        worker_id: Some(i64::from(pid)),
        died: died.map(ms),
        killed,
        report: Some("true clean".to_owned()),
    };
    let mut rec = Record {
        procs: vec![
            proc(0, 100, Some(9000), false),
            proc(1, 200, Some(9000), false),
            proc(2, 300, Some(9000), false),
        ],
        ..Record::default()
    };
    rec.procs.push(Proc {
        report: None,
        ..proc(3, 400, Some(3000), false)
    });
    rec.procs.push(Proc {
        report: Some("false stopped in 8s; cleanup failed: ...".to_owned()),
        ..proc(4, 500, Some(9000), false)
    });
    // Slot 2 (pid 300) is paused from 100 ms to 2.5 s.
    rec.faults.push(FaultEvent {
        fault: Fault::Stop,
        slot: Some(2),
        pid: Some(300),
        from: ms(100),
        to: ms(2500),
        note: "SIGSTOP".to_owned(),
    });
    rec.aborts.push(AbortEvent {
        job: 8,
        before: ms(900),
        after: ms(1000),
        outcome: Ok(AbortOutcome::Cancelled),
        attempts_before: Some(0),
        attempts_after: Some(0),
    });
    let mut parked = job(11, "chaos_huge_delay", "todo", 1);
    parked.parked = true;
    let mut parked_ok = job(12, "chaos_ok", "todo", 1);
    parked_ok.parked = true;
    // A rescue that found a successor waiting under its queueing lock: cancelled.
    let mut collided = job(13, "chaos_qlock_collide", "cancelled", 1);
    collided.queueing_lock = Some("ql13".to_owned());
    // The same for a job whose worker died before it logged a start (no execution), with
    // the rescue's note; and one cancelled without a logged execution and without the note.
    let mut superseded = job(18, "chaos_ok", "cancelled", 1);
    superseded.queueing_lock = Some("ql17".to_owned());
    superseded.errors = "[{\"error\": \"not requeued: job 17 already waits with the same \
                         queueing lock and does this work\"}]"
        .to_owned();
    let mut unexplained = job(19, "chaos_ok", "cancelled", 1);
    unexplained.queueing_lock = Some("ql19".to_owned());
    let jobs = vec![
        collided,
        superseded,
        unexplained,
        job(1, "chaos_ok", "doing", 1),
        job(2, "chaos_ok", "succeeded", 2),
        job(3, "chaos_ok", "succeeded", 2),
        job(4, "chaos_ok", "succeeded", 2),
        job(5, "chaos_ok", "failed", 1),
        job(6, "chaos_ok", "succeeded", 1),
        job(7, "chaos_ok", "succeeded", 1),
        job(8, "chaos_ok", "succeeded", 1),
        job(9, "chaos_ok", "aborted", 1),
        job(10, "chaos_ok", "succeeded", 1),
        job(14, "chaos_ok", "succeeded", 1),
        job(15, "chaos_ok", "succeeded", 1),
        parked,
        parked_ok,
    ];
    // Acknowledged defers: job 6's is there, job 16's is not.
    rec.acks = vec![(6, 6, ms(0)), (16, 16, ms(0))];
    let mut execs = vec![
        exec(1, 1, 100, 0, Some(100), "ok"),
        // Two live attempts at once, on undisturbed workers.
        exec(2, 1, 100, 0, Some(3000), "ok"),
        exec(2, 2, 200, 1000, Some(1500), "ok"),
        // The same, but the first one's worker was paused: it was rescued.
        exec(3, 1, 300, 0, Some(3000), "ok"),
        exec(3, 2, 100, 2200, Some(2300), "ok"),
        // Attempt 1 started after attempt 2 had.
        exec(4, 2, 200, 1000, Some(1100), "ok"),
        exec(4, 1, 100, 2000, Some(2100), "ok"),
        exec(5, 1, 100, 0, Some(100), "ok"),
        exec(8, 1, 200, 2000, Some(2100), "ok"),
        exec(9, 1, 100, 0, Some(100), "aborted"),
        exec(10, 1, 200, 0, Some(100), "ok"),
        exec(11, 1, 200, 0, Some(100), "retry_huge"),
        exec(12, 1, 200, 0, Some(100), "ok"),
        exec(13, 1, 400, 0, None, "-"),
        // One attempt started twice by undisturbed workers.
        exec(14, 1, 100, 0, Some(100), "ok"),
        exec(14, 1, 200, 200, Some(300), "ok"),
        // The same after its first worker was paused (its start may be lost with it).
        exec(15, 1, 300, 0, Some(2000), "ok"),
        exec(15, 1, 100, 2600, Some(2700), "ok"),
    ];
    let mut a = exec(6, 1, 100, 0, Some(1000), "ok");
    a.lock = Some("lk".to_owned());
    let mut b = exec(7, 1, 200, 500, Some(600), "ok");
    b.lock = Some("lk".to_owned());
    execs.extend([a, b]);
    execs.sort_by_key(|e| e.start);

    let cfg = Config::new(0, Arc::new(|| Command::new("true")));
    let report = judge(&cfg, &rec, &jobs, &execs);
    let got: Vec<(i64, &str)> = report.violations.iter().map(|v| (v.job, v.rule)).collect();
    for want in [
        (1, "final"),
        (2, "overlap"),
        (4, "stale_start"),
        (5, "outcome"),
        (7, "lock"),
        (8, "abort"),
        (9, "abort"),
        (12, "final"),
        (14, "twice"),
        (16, "lost"),
        (19, "outcome"),
        (0, "process"),
        (0, "shutdown"),
    ] {
        assert!(got.contains(&want), "{want:?} not flagged:\n{report}");
    }
    for quiet in [3, 6, 10, 11, 13, 15, 18] {
        assert!(
            !got.iter().any(|(j, _)| *j == quiet),
            "job {quiet} flagged:\n{report}"
        );
    }

    // With asynchronous replication, a failover at 5 s whose standby had everything up to
    // 4 s may take back what was acknowledged between: job 16's loss (at 4.5 s) is allowed,
    // job 17's (at 3 s) is not; with synchronous replication neither is.
    rec.acks = vec![(16, 16, ms(4500)), (17, 17, ms(3000))];
    rec.failovers = vec![chaos_support::server::Failover {
        stop: ms(5000),
        safe: Some(ms(4000)),
    }];
    for (replication, allowed, flagged) in [
        (Replication::Async, vec![16], vec![17]),
        (Replication::Sync, vec![], vec![16, 17]),
    ] {
        rec.replication = Some(replication);
        let report = judge(&cfg, &rec, &jobs, &execs);
        let lost: Vec<i64> = report
            .violations
            .iter()
            .filter(|v| v.rule == "lost")
            .map(|v| v.job)
            .collect();
        assert_eq!(lost, flagged, "{replication:?}:\n{report}");
        assert_eq!(
            report.lost_async,
            allowed.len(),
            "{replication:?}:\n{report}"
        );
    }
}
