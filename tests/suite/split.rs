//! Claims of large jobs in two halves on two connections (`WorkerBuilder::split_large_claims`):
//! every job still runs once and ends `succeeded`, with the second connection cut in the
//! middle too; small jobs, large jobs that come a few at a time, and a worker told not to,
//! claim on one connection.

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use postpone::{App, JobId, NewJob};
use worker_util::*;

/// `n` jobs of task `ok` whose arguments hold `kib` KiB of text beside their number.
fn defer_sized(app: &App, n: usize, kib: usize) -> Vec<JobId> {
    let pad = "x".repeat(kib * 1024);
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("ok", &serde_json::json!({ "i": i, "pad": pad })).unwrap())
        .collect();
    jobs.chunks(100)
        .flat_map(|c| app.defer_batch(c).unwrap())
        .collect()
}

fn succeeded(db: &support::TestDb) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
            &[],
        )
        .unwrap()
        .get(0)
}

fn wait_succeeded(db: &support::TestDb, n: usize) {
    let done = support::wait_until(Duration::from_secs(60), || succeeded(db) == n as i64);
    assert!(done, "{} of {n} jobs succeeded after 60 s", succeeded(db));
}

fn assert_ran_once(runs: &Mutex<HashMap<i64, usize>>, ids: &[JobId]) {
    let runs = runs.lock().unwrap();
    for id in ids {
        assert_eq!(runs.get(&id.0), Some(&1), "job {id} ran once");
    }
}

/// Drains `n` jobs of `kib` KiB with a worker of 4 threads and a byte budget of `budget`
/// (`configure` adds to its builder), each job once; returns its counters.
fn drain(
    n: usize,
    kib: usize,
    budget: usize,
    configure: impl FnOnce(postpone::WorkerBuilder) -> postpone::WorkerBuilder,
) -> postpone::WorkerStats {
    let (db, app) = setup();
    let ids = defer_sized(&app, n, kib);
    let (tasks, runs) = counting_tasks();
    let w = configure(
        fast_worker(&app, tasks)
            .concurrency(4)
            .prefetch_bytes(budget),
    )
    .spawn()
    .unwrap();
    wait_succeeded(&db, ids.len());
    assert_ran_once(&runs, &ids);
    let stats = stats_once_recorded(&w, ids.len() as u64);
    w.shutdown(Duration::from_secs(5));
    stats
}

#[test]
fn large_jobs_are_claimed_in_two_halves_and_each_runs_once() {
    // A budget of 64 jobs of 64 KiB a claim: several claims, each asking for more than 32.
    let stats = drain(400, 64, 4 << 20, |b| b);
    assert!(stats.claims_split > 0, "no claim went in two: {stats:?}");
    assert!(stats.claims >= 2 * stats.claims_split, "{stats:?}");
    assert_eq!(stats.succeeded, 400, "{stats:?}");
}

#[test]
fn small_jobs_a_trickle_and_a_worker_told_not_to_claim_on_one_connection() {
    // Large jobs, split_large_claims(false).
    let stats = drain(200, 64, 4 << 20, |b| b.split_large_claims(false));
    assert_eq!(stats.claims_split, 0, "{stats:?}");

    // Large jobs that come a few at a time: each claim finds fewer than it asks for.
    let (db, app) = setup();
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks).concurrency(4).spawn().unwrap();
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.extend(defer_sized(&app, 3, 64));
        std::thread::sleep(Duration::from_millis(30));
    }
    wait_succeeded(&db, ids.len());
    assert_ran_once(&runs, &ids);
    let stats = stats_once_recorded(&w, ids.len() as u64);
    assert!(stats.claims > 2, "{stats:?}");
    assert_eq!(stats.claims_split, 0, "{stats:?}");
    w.shutdown(Duration::from_secs(5));

    // Small jobs (1 KiB): below the mean size that splits.
    let stats = drain(2000, 1, 256 << 10, |b| b);
    assert!(stats.claims > 2, "{stats:?}");
    assert_eq!(stats.claims_split, 0, "{stats:?}");
}

/// Every connection reset while claims go in two, again and again: no job is lost, none
/// runs twice (the worker is never presumed dead), and every one ends `succeeded`.
#[test]
fn resets_in_the_middle_of_split_claims_lose_no_job() {
    let (db, direct) = setup();
    let proxy = support::FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), Duration::from_secs(2));
    let ids = defer_sized(&direct, 600, 64);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .prefetch_bytes(4 << 20)
        .stalled_after(Duration::from_secs(30))
        .spawn()
        .unwrap();
    let split = support::wait_until(Duration::from_secs(30), || w.stats().claims_split > 0);
    assert!(split, "no claim went in two: {:?}", w.stats());
    let mut resets = 0;
    while succeeded(&db) < ids.len() as i64 && resets < 5 {
        proxy.reset_all();
        resets += 1;
        std::thread::sleep(Duration::from_millis(150));
    }
    wait_succeeded(&db, ids.len());
    assert_ran_once(&runs, &ids);
    let doing: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status <> 'succeeded'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(doing, 0);
    w.shutdown(Duration::from_secs(5));
}

/// A shutdown while claims go in two returns in time, and leaves every job either done once
/// or waiting: none held for the stopped worker.
#[test]
fn a_shutdown_among_split_claims_returns_in_time_and_holds_no_job() {
    let (db, app) = setup();
    let ids = defer_sized(&app, 2000, 64);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .prefetch_bytes(4 << 20)
        .spawn()
        .unwrap();
    let split = support::wait_until(Duration::from_secs(30), || w.stats().claims_split > 0);
    assert!(split, "no claim went in two: {:?}", w.stats());
    let report = w.shutdown(Duration::from_secs(2));
    assert!(report.elapsed() < Duration::from_secs(3), "{report}");
    assert!(report.is_clean(), "{report}");
    let mut c = db.client();
    let by_status: Vec<(String, i64)> = c
        .query(
            "SELECT status, count(*) FROM postpone_jobs GROUP BY status ORDER BY status",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let count = |s: &str| {
        by_status
            .iter()
            .find(|(k, _)| k == s)
            .map_or(0, |(_, n)| *n)
    };
    assert_eq!(count("doing"), 0, "{by_status:?}");
    assert_eq!(
        count("succeeded") + count("todo"),
        ids.len() as i64,
        "{by_status:?}"
    );
    let runs = runs.lock().unwrap();
    assert!(runs.values().all(|&n| n == 1), "a job ran twice");
    assert_eq!(runs.len() as i64, count("succeeded"), "{by_status:?}");
}

/// Every connection goes half-open while claims go in two (no reply ever comes, no reset):
/// the worker's deadlines end the stuck round-trips, it connects again and drains the rest,
/// each job once, and a shutdown afterwards returns in time.
#[test]
fn half_open_connections_during_split_claims_lose_no_job() {
    let (db, direct) = setup();
    let proxy = support::FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), Duration::from_secs(1));
    let ids = defer_sized(&direct, 600, 64);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .prefetch_bytes(4 << 20)
        .stalled_after(Duration::from_secs(30))
        .spawn()
        .unwrap();
    let split = support::wait_until(Duration::from_secs(30), || w.stats().claims_split > 0);
    assert!(split, "no claim went in two: {:?}", w.stats());
    proxy.strand_all();
    wait_succeeded(&db, ids.len());
    assert_ran_once(&runs, &ids);
    let report = w.shutdown(Duration::from_secs(2));
    assert!(report.elapsed() < Duration::from_secs(3), "{report}");
}
