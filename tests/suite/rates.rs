//! Key limits and rate limits per queue (schema version 8) against the real PostgreSQL with
//! several workers: a key limit of N is never exceeded per key, and a rate limit of N starts
//! per period never either, as the tasks themselves record in a side table (on their own
//! connection, by the database's clock); a cut-off worker's key slot comes back through the
//! rescue. (tests/suite/rates_admin.rs: simultaneous claims, stats, bad input, figures.)

use crate::support;
use crate::worker_util;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{Job, Tasks, WorkerHandle};
use support::{wait_until, FaultProxy, NewConns, TestDb};
use worker_util::*;

const SHUTDOWN: Duration = Duration::from_secs(5);

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(SHUTDOWN);
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

/// Creates the side table the tasks write to: one row per run, its start and end by the
/// database's clock.
fn side_table(db: &TestDb) {
    db.client()
        .batch_execute(
            "CREATE TABLE runs (job bigint NOT NULL, queue text NOT NULL, key text,
                                started timestamptz NOT NULL, ended timestamptz)",
        )
        .unwrap();
}

/// A task "work" that records its start and end in the side table on a connection of its
/// own (one per worker), sleeping `args.ms` milliseconds in between; `args.user` is its key.
fn recording(db: &TestDb) -> Tasks {
    let conn = Arc::new(Mutex::new(db.client()));
    let mut tasks = Tasks::new();
    tasks.register("work", move |job: &Job| {
        let args: serde_json::Value = job.args()?;
        let key = args.get("user").map(|u| u.to_string());
        let ms = args["ms"].as_u64().unwrap_or(0);
        let id = job.id().get();
        conn.lock()
            .unwrap()
            .execute(
                "INSERT INTO runs (job, queue, key, started) VALUES ($1, $2, $3, clock_timestamp())",
                &[&id, &job.queue(), &key],
            )
            .unwrap();
        thread::sleep(Duration::from_millis(ms));
        conn.lock()
            .unwrap()
            .execute(
                "UPDATE runs SET ended = clock_timestamp() WHERE job = $1 AND ended IS NULL",
                &[&id],
            )
            .unwrap();
        Ok(())
    });
    tasks
}

/// The most runs of `queue` that overlapped, per key (`per_key`) or in all.
fn max_overlap(db: &TestDb, queue: &str, per_key: bool) -> i64 {
    db.client()
        .query_one(
            "SELECT coalesce(max(n), 0) FROM (
                 SELECT (SELECT count(*) FROM runs b
                          WHERE b.queue = a.queue
                            AND (NOT $2 OR b.key IS NOT DISTINCT FROM a.key)
                            AND b.started <= a.started AND b.ended > a.started) AS n
                   FROM runs a WHERE a.queue = $1) s",
            &[&queue, &per_key],
        )
        .unwrap()
        .get(0)
}

fn finished_runs(db: &TestDb, queue: &str) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM runs WHERE queue = $1 AND ended IS NOT NULL",
            &[&queue],
        )
        .unwrap()
        .get(0)
}

fn spawn_workers(db: &TestDb, app: &postpone::App, n: usize) -> Vec<WorkerHandle> {
    (0..n)
        .map(|i| {
            fast_worker(app, recording(db))
                .name(format!("w{i}"))
                .concurrency(4)
                .spawn()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_key_limit_is_never_exceeded_by_many_workers() {
    let (db, app) = setup();
    let admin = app.admin();
    assert_eq!(admin.set_key_limit("k", "user", 2).unwrap(), None);
    side_table(&db);
    let workers = spawn_workers(&db, &app, 3);
    // 3 users x 6 jobs, and 4 jobs without the key field (they share one key).
    for n in 0..6 {
        for user in ["a", "b", "c"] {
            app.job("work")
                .queue("k")
                .defer(&serde_json::json!({"user": user, "ms": 150, "n": n}))
                .unwrap();
        }
    }
    for _ in 0..4 {
        app.job("work")
            .queue("k")
            .defer(&serde_json::json!({"ms": 150}))
            .unwrap();
    }
    let mut client = db.client();
    assert!(
        wait_until(Duration::from_secs(60), || {
            let most: i64 = client
                .query_one(
                    "SELECT coalesce(max(n), 0) FROM (
                         SELECT count(*) AS n FROM postpone_jobs
                          WHERE queue = 'k' AND status = 'doing' GROUP BY (args -> 'user')::text) s",
                    &[],
                )
                .unwrap()
                .get(0);
            assert!(
                most <= 2,
                "{most} jobs of one key are running under a limit of 2"
            );
            finished_runs(&db, "k") == 22
        }),
        "ran {} of 22 jobs",
        finished_runs(&db, "k")
    );
    let per_key = max_overlap(&db, "k", true);
    let all = max_overlap(&db, "k", false);
    println!("  key limit 2: at most {per_key} runs of one key overlapped, {all} in all");
    assert!(per_key <= 2, "{per_key} runs of one key overlapped");
    assert!(all > 2, "only {all} jobs of the queue ran at once");
    assert!(admin.clear_key_limit("k").unwrap());
    assert!(!admin.clear_key_limit("k").unwrap());
    for w in workers {
        stop(w);
    }
}

#[test]
fn a_rate_limit_is_never_exceeded_by_many_workers() {
    let (db, app) = setup();
    let admin = app.admin();
    const N: usize = 3;
    let period = Duration::from_secs(1);
    assert_eq!(admin.set_rate_limit("r", N as i64, period).unwrap(), None);
    side_table(&db);
    let workers = spawn_workers(&db, &app, 3);
    let started = Instant::now();
    for _ in 0..12 {
        app.job("work")
            .queue("r")
            .defer(&serde_json::json!({"ms": 10}))
            .unwrap();
    }
    // Another queue is not held back.
    for _ in 0..12 {
        app.job("work")
            .queue("free")
            .defer(&serde_json::json!({"ms": 10}))
            .unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || finished_runs(
        &db, "free"
    ) == 12));
    let free_done = started.elapsed();
    assert!(
        wait_until(Duration::from_secs(60), || finished_runs(&db, "r") == 12),
        "ran {} of 12 rate-limited jobs",
        finished_runs(&db, "r")
    );
    let elapsed = started.elapsed();
    println!(
        "  rate 3/s: 12 jobs in {elapsed:?} (the unlimited queue's 12 in {free_done:?}), measured on a loaded machine"
    );
    // 12 starts at 3 per second: the last batch starts 3 s after the first at the soonest.
    assert!(elapsed >= Duration::from_millis(2900), "{elapsed:?}");
    // By the claim's time (the jobs' started_at) and by the tasks' own records: N+1
    // successive starts never fall within one period. The tasks' records lag the claim by
    // a few milliseconds each, hence the margin.
    let mut client = db.client();
    for (what, sql, margin) in [
        (
            "started_at",
            "SELECT extract(epoch FROM started_at)::float8 FROM postpone_jobs
              WHERE queue = 'r' ORDER BY started_at",
            0.05,
        ),
        (
            "task records",
            "SELECT extract(epoch FROM started)::float8 FROM runs
              WHERE queue = 'r' ORDER BY started",
            0.25,
        ),
    ] {
        let t: Vec<f64> = client
            .query(sql, &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(t.len(), 12);
        for i in 0..t.len() - N {
            let gap = t[i + N] - t[i];
            assert!(
                gap >= period.as_secs_f64() - margin,
                "{what}: starts {i}..={} within {gap:.3} s: {t:?}",
                i + N
            );
        }
    }
    let limits = admin.rate_limits().unwrap();
    assert_eq!(limits.len(), 1);
    assert_eq!((limits[0].max_starts, limits[0].period), (N as i32, period));
    assert!(admin.clear_rate_limit("r").unwrap());
    assert!(admin.rate_limits().unwrap().is_empty());
    for w in workers {
        stop(w);
    }
}

#[test]
fn a_cut_off_workers_key_slot_comes_back_through_the_rescue() {
    let (db, direct) = setup();
    direct.admin().set_key_limit("one", "user", 1).unwrap();
    side_table(&db);
    let proxy = FaultProxy::start(&db.server_addr());
    let app_a = app_at(&db.url_via(&proxy), Duration::from_secs(1));

    // Worker A takes user 7's one slot with a job that blocks until released.
    let (started_tx, started_rx) = unbounded::<i64>();
    let (release_tx, release_rx) = unbounded::<()>();
    let mut tasks_a = Tasks::new();
    tasks_a.register("work", move |job: &Job| {
        started_tx.send(job.id().get()).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        Ok(())
    });
    // (No prefetch: A holds no job beyond the one it runs.)
    let a = fast_worker(&app_a, tasks_a)
        .name("worker-a")
        .concurrency(1)
        .prefetch(0)
        .spawn()
        .unwrap();
    let args = serde_json::json!({"user": 7, "ms": 0});
    let first = direct.job("work").queue("one").defer(&args).unwrap();
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        first.get()
    );

    // Worker B, idle with 4 threads, must not start user 7's second job while A holds the
    // slot; user 8's job runs.
    let b = fast_worker(&direct, recording(&db))
        .name("worker-b")
        .concurrency(4)
        .stalled_after(Duration::from_secs(1))
        .spawn()
        .unwrap();
    let second = direct.job("work").queue("one").defer(&args).unwrap();
    let other = direct
        .job("work")
        .queue("one")
        .defer(&serde_json::json!({"user": 8, "ms": 0}))
        .unwrap();
    wait_status(&db, other, "succeeded", Duration::from_secs(5));
    thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        finished_runs(&db, "one"),
        1,
        "B started a job past the key limit"
    );
    let k = &direct.admin().key_limits().unwrap()[0];
    assert_eq!((k.running, k.keys_at_limit, k.held), (1, 1, 1), "{k:?}");

    // A is cut off: once its heartbeat is older than stalled_after, its job is requeued
    // and the key's slot is free again: B runs both of user 7's jobs, one at a time.
    proxy.strand_all();
    proxy.set_new_conns(NewConns::Strand);
    assert!(
        wait_until(Duration::from_secs(15), || finished_runs(&db, "one") == 3),
        "B ran {} of the 3 jobs after A was cut off",
        finished_runs(&db, "one")
    );
    assert_eq!(max_overlap(&db, "one", true), 1);
    for id in [first, second] {
        let row = wait_status(&db, id, "succeeded", Duration::from_secs(5));
        assert_eq!(row.worker_id, Some(b.worker_id()), "{row:?}");
    }
    stop(b);
    proxy.set_new_conns(NewConns::Forward);
    release_tx.send(()).unwrap();
    drop(a.shutdown(SHUTDOWN));
}

/// A worker whose queue is rate limited does not spin on the claim: it comes back at its
/// poll interval (the backstop, 100 ms here), as counted by PostgreSQL's function statistics.
#[test]
fn a_rate_limited_worker_polls_and_does_not_spin() {
    let (db, admin_app) = setup();
    admin_app
        .admin()
        .set_rate_limit("r", 1, Duration::from_secs(60))
        .unwrap();
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET track_functions = 'pl'",
            db.name()
        ))
        .unwrap();
    side_table(&db);
    for _ in 0..5 {
        admin_app
            .job("work")
            .queue("r")
            .defer(&serde_json::json!({"ms": 0}))
            .unwrap();
    }
    // A fresh App: its sessions start with track_functions on.
    let app = app_at(&db.url(), Duration::from_secs(5));
    let w = fast_worker(&app, recording(&db))
        .concurrency(4)
        .spawn()
        .unwrap();
    let run = Duration::from_secs(3);
    thread::sleep(run);
    stop(w);
    drop(app);
    assert_eq!(finished_runs(&db, "r"), 1, "one start per minute");
    let mut c = db.client();
    let mut calls = 0i64;
    // The worker's sessions report their statistics when they end.
    wait_until(Duration::from_secs(5), || {
        calls = c
            .query_one(
                "SELECT pg_stat_clear_snapshot()::text,
                        coalesce((SELECT sum(calls) FROM pg_stat_user_functions
                                   WHERE funcname = 'postpone_claim_batch'), 0)::bigint",
                &[],
            )
            .unwrap()
            .get(1);
        calls > 0
    });
    println!("  {calls} claims in {run:?} while rate limited (poll interval 100 ms)");
    assert!(calls >= 3, "the worker stopped polling: {calls} claims");
    assert!(calls < 150, "the worker spun: {calls} claims in {run:?}");
}
