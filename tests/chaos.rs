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
//! The worker processes are this test binary, re-invoked as the ignored test
//! `chaos_worker_child` with env `CHAOS_CHILD_URL`.

mod chaos_support;
mod support;

use std::process::Command;
use std::sync::Arc;

use chaos_support::{child, Config, Mix};

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
    let exe = std::env::current_exe().expect("the test binary's path");
    let child_cmd: chaos_support::run::ChildCommand = Arc::new(move || {
        let mut c = Command::new(&exe);
        c.args([
            "chaos_worker_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        c
    });
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
