//! Key limits and rate limits per queue (schema version 8) against the real PostgreSQL with
//! several workers: a key limit of N is never exceeded per key, and a rate limit of N starts
//! per period never either, as the tasks themselves record in a side table (on their own
//! connection, by the database's clock); a cut-off worker's key slot comes back through the
//! rescue; simultaneous claims obey both limits; stats say why due jobs wait; bad input is a
//! clear error from the admin API, the tables and the command line.

mod support;
mod worker_util;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{ErrorKind, Job, Tasks, WorkerHandle};
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

fn cli(db: &TestDb, args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_postpone"))
        .env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(db.url())
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn sql_worker(c: &mut postgres::Client) -> i64 {
    c.query_one(
        "INSERT INTO postpone_workers (name, last_heartbeat) VALUES ('sql', now()) RETURNING id",
        &[],
    )
    .unwrap()
    .get(0)
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
                          WHERE queue = 'k' AND status = 'doing' GROUP BY args -> 'user') s",
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

/// Many claims at the same instant (8 connections behind a barrier): together they never
/// start more than the rate limit allows in its window, nor more than the key limit per key.
#[test]
fn simultaneous_claims_obey_rate_and_key_limits() {
    let (db, app) = setup();
    let admin = app.admin();
    admin
        .set_rate_limit("rate", 5, Duration::from_secs(3600))
        .unwrap();
    admin.set_key_limit("keyed", "u", 2).unwrap();
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'rate', 'work', '0' FROM generate_series(1, 100);
         INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'keyed', 'work', jsonb_build_object('u', i % 3) FROM generate_series(1, 90) i;",
    )
    .unwrap();
    let worker = sql_worker(&mut c);
    const CLAIMERS: usize = 8;
    let mut clients: Vec<postgres::Client> = (0..CLAIMERS).map(|_| db.client()).collect();
    let claim_all = |clients: &mut Vec<postgres::Client>, queue: &str| -> usize {
        let barrier = Arc::new(std::sync::Barrier::new(CLAIMERS));
        thread::scope(|s| {
            let handles: Vec<_> = clients
                .iter_mut()
                .map(|cl| {
                    let barrier = barrier.clone();
                    s.spawn(move || {
                        barrier.wait();
                        cl.query(
                            "SELECT id FROM postpone_claim($1, 10, ARRAY[$2], NULL)",
                            &[&worker, &queue],
                        )
                        .unwrap()
                        .len()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        })
    };
    // The rate: 5 starts in the hour, whatever the rounds; the jobs finishing changes nothing.
    let mut started = 0;
    for _ in 0..5 {
        started += claim_all(&mut clients, "rate");
        c.execute(
            "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now()
              WHERE status = 'doing'",
            &[],
        )
        .unwrap();
    }
    assert_eq!(started, 5, "{started} starts under a limit of 5 per hour");
    let r = &admin.rate_limits().unwrap()[0];
    assert_eq!(r.recent_starts, 5);
    assert!(r.is_reached(), "{r:?}");
    let wait = r.next_start_in.unwrap();
    // A start's slot comes back between one period and 1.01 periods after it.
    assert!(
        wait > Duration::from_secs(3500) && wait <= Duration::from_secs(3637),
        "{wait:?}"
    );
    // A worker of every queue (NULL) obeys it too.
    let n = c
        .query(
            "SELECT id FROM postpone_claim($1, 10, ARRAY['rate'], NULL)",
            &[&worker],
        )
        .unwrap()
        .len();
    assert_eq!(n, 0);

    // The keys: 3 keys, 2 slots each.
    for round in 0..10 {
        let n = claim_all(&mut clients, "keyed");
        let most: i64 = c
            .query_one(
                "SELECT max(n) FROM (SELECT count(*) AS n FROM postpone_jobs
                  WHERE queue = 'keyed' AND status = 'doing' GROUP BY args -> 'u') s",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 6, "round {round}: {n} claimed");
        assert_eq!(most, 2, "round {round}");
        c.execute(
            "UPDATE postpone_jobs SET status = 'todo', worker_id = NULL WHERE status = 'doing'",
            &[],
        )
        .unwrap();
    }
    let n = c
        .query(
            "SELECT id FROM postpone_claim($1, 100, NULL, NULL)",
            &[&worker],
        )
        .unwrap()
        .len();
    assert_eq!(n, 6, "a worker of every queue: 2 per key");
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

#[test]
fn bad_limits_are_clear_errors() {
    let (db, app) = setup();
    let admin = app.admin();
    let hour = Duration::from_secs(3600);
    for n in [0, -1, i64::from(i32::MAX) + 1] {
        let e = admin.set_rate_limit("q", n, hour).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{n}: {e}");
        assert!(e.to_string().contains("at least 1"), "{e}");
        let e = admin.set_key_limit("q", "user", n).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{n}: {e}");
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
    for per in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(200 * 365 * 86_400),
    ] {
        let e = admin.set_rate_limit("q", 1, per).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{per:?}: {e}");
        assert!(e.to_string().contains("at least 1 ms"), "{e}");
    }
    let long = "x".repeat(300);
    for q in ["", "a\0b", long.as_str()] {
        for e in [
            admin.set_rate_limit(q, 1, hour).unwrap_err(),
            admin.clear_rate_limit(q).unwrap_err(),
            admin.set_key_limit(q, "user", 1).unwrap_err(),
            admin.set_key_limit("q", q, 1).unwrap_err(),
            admin.clear_key_limit(q).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{q:?}: {e}");
        }
    }
    assert!(admin.rate_limits().unwrap().is_empty(), "nothing stored");
    assert!(admin.key_limits().unwrap().is_empty(), "nothing stored");
    // A queue without jobs can be limited; setting again replaces and returns the old one.
    assert_eq!(admin.set_rate_limit("empty", 3, hour).unwrap(), None);
    assert_eq!(admin.set_rate_limit("empty", 4, hour).unwrap(), Some(3));
    assert_eq!(admin.set_key_limit("empty", "a", 2).unwrap(), None);
    assert_eq!(
        admin.set_key_limit("empty", "b", 3).unwrap(),
        Some((2, "a".to_owned()))
    );
    // The tables refuse what the API refuses, for SQL written by hand.
    let mut c = db.client();
    for (sql, constraint) in [
        (
            "INSERT INTO postpone_rate_limits (queue, max_starts, period) VALUES ('z', 0, '1s')",
            "postpone_rate_limits_positive",
        ),
        (
            "INSERT INTO postpone_rate_limits (queue, max_starts, period) VALUES ('z', 1, '0s')",
            "postpone_rate_limits_period",
        ),
        (
            "INSERT INTO postpone_key_limits (queue, max_per_key, key_arg) VALUES ('z', 0, 'u')",
            "postpone_key_limits_positive",
        ),
        (
            "INSERT INTO postpone_key_limits (queue, max_per_key, key_arg) VALUES ('z', 1, '')",
            "postpone_key_limits_arg",
        ),
    ] {
        let e = c.execute(sql, &[]).unwrap_err();
        assert_eq!(
            e.as_db_error().and_then(|d| d.constraint()),
            Some(constraint),
            "{e:?}"
        );
    }

    // The command line: a note for a queue without jobs, none for one with jobs.
    let (code, out, err) = cli(&db, &["rate-limit", "cli", "10", "1m"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("at most 10 starts per 1m00s"), "{out}");
    assert!(out.contains("note: queue cli has no jobs yet"), "{out}");
    app.job("work").queue("cli").defer(&0).unwrap();
    let (code, out, _) = cli(&db, &["key-limit", "cli", "2", "--by", "user"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("at most 2 running jobs per value of argument user"),
        "{out}"
    );
    assert!(!out.contains("note:"), "{out}");
    let (code, out, _) = cli(&db, &["--json", "rate-limit"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["queue"], "cli");
    assert_eq!(v[0]["max_starts"], 10);
    assert_eq!(v[0]["period_secs"], 60.0);
    let (code, out, _) = cli(&db, &["--json", "key-limit"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["key_arg"], "user");
    for bad in [
        &["rate-limit", "cli", "0", "1s"][..],
        &["rate-limit", "cli", "-2", "1s"],
        &["rate-limit", "cli", "2", "0s"],
        &["key-limit", "cli", "0", "--by", "u"],
        &["key-limit", "cli", "1", "--by", ""],
    ] {
        let (code, out, err) = cli(&db, bad);
        assert_eq!(code, Some(2), "{bad:?}: {out}{err}");
        assert!(
            err.contains("at least 1") || err.contains("empty"),
            "{bad:?}: {err}"
        );
    }
    let (code, out, _) = cli(&db, &["rate-limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("rate limit cleared"), "{out}");
    let (code, out, _) = cli(&db, &["rate-limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("had no rate limit"), "{out}");
    let (code, out, _) = cli(&db, &["key-limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("key limit cleared"), "{out}");
}

/// `Admin::stats`, `postpone stats` and its `--json` say why due jobs are not running: a
/// key limit reached, a rate limit reached (with the other reasons of version 7).
#[test]
fn stats_say_why_due_jobs_wait() {
    let (db, app) = setup();
    let admin = app.admin();
    let mut c = db.client();
    let worker = sql_worker(&mut c);
    admin.set_key_limit("keyed", "user", 1).unwrap();
    admin
        .set_rate_limit("rated", 2, Duration::from_secs(600))
        .unwrap();
    admin.set_queue_limit("lim", Some(1)).unwrap();
    for _ in 0..3 {
        app.job("t")
            .queue("keyed")
            .defer(&serde_json::json!({"user": 1}))
            .unwrap();
        app.job("t").queue("rated").defer(&()).unwrap();
        app.job("t").queue("lim").defer(&()).unwrap();
    }
    let claimed = c
        .query(
            "SELECT queue FROM postpone_claim($1, 10, NULL, NULL)",
            &[&worker],
        )
        .unwrap();
    // keyed: 1 (one key, one slot), rated: 2 (its starts), lim: 1.
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    let stats = admin.counts().unwrap();
    let get = |q: &str| stats.iter().find(|s| s.queue == q).unwrap().clone();
    let keyed = get("keyed");
    assert_eq!((keyed.todo, keyed.doing, keyed.key_held), (2, 1, 2));
    assert_eq!(keyed.max_per_key, Some(1));
    assert_eq!(keyed.waiting_reasons(), ["key limit reached"]);
    let rated = get("rated");
    assert_eq!((rated.todo, rated.doing, rated.max_starts), (1, 2, Some(2)));
    assert!(rated.rate_limited, "{rated:?}");
    assert!(rated.next_start_in.unwrap() > Duration::from_secs(500));
    assert_eq!(rated.waiting_reasons(), ["rate limited"]);
    assert_eq!(get("lim").waiting_reasons(), ["limit reached"]);

    let (code, out, err) = cli(&db, &["stats"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("-- key limit reached: keyed (2 due jobs wait"),
        "{out}"
    );
    assert!(
        out.contains("-- rate limited: rated (at most 2 starts per 10m00s; next start in"),
        "{out}"
    );
    assert!(out.contains("-- limit reached: lim"), "{out}");
    let (code, out, _) = cli(&db, &["--json", "stats"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = |q: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|r| r["queue"] == q)
            .unwrap()
            .clone()
    };
    assert_eq!(row("keyed")["key_held"], 2);
    assert_eq!(row("keyed")["max_per_key"], 1);
    assert_eq!(row("rated")["rate_limited"], true);
    assert_eq!(row("rated")["max_starts"], 2);
    assert_eq!(row("rated")["rate_period_secs"], 600.0);
    assert!(row("rated")["next_start_in_secs"].as_f64().unwrap() > 500.0);
}

/// Figures (measured on a loaded machine; printed, not asserted): 300 claims of one job each
/// from a queue of 3,000 due jobs, on one connection: without limits, with a concurrency
/// limit, a key limit (10 keys) and rate limits whose window holds few or many logged starts.
#[test]
fn cost_of_a_claim_with_each_limit() {
    let (db, app) = setup();
    let admin = app.admin();
    let mut c = db.client();
    let worker = sql_worker(&mut c);
    let n = 300;
    let measure = |what: &str, queue: &str, c: &mut postgres::Client| {
        c.execute(
            "INSERT INTO postpone_jobs (queue, task, args)
             SELECT $1, 'work', jsonb_build_object('u', i % 10) FROM generate_series(1, 3000) i",
            &[&queue],
        )
        .unwrap();
        c.batch_execute("ANALYZE postpone_jobs").unwrap();
        let t = Instant::now();
        for _ in 0..n {
            let got = c
                .query(
                    "SELECT id FROM postpone_claim($1, 1, ARRAY[$2], NULL)",
                    &[&worker, &queue],
                )
                .unwrap();
            assert_eq!(got.len(), 1, "{what}");
            // The job finishes at once, so that the limits never hold the next claim back.
            c.execute(
                "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now()
                  WHERE status = 'doing'",
                &[],
            )
            .unwrap();
        }
        report_figure(&format!("{n} claims+finishes, {what}"), t.elapsed());
    };
    measure("no limit", "plain", &mut c);
    admin.set_queue_limit("conc", Some(5)).unwrap();
    measure("concurrency limit", "conc", &mut c);
    admin.set_key_limit("keyed", "u", 1).unwrap();
    measure("key limit", "keyed", &mut c);
    admin
        .set_rate_limit("rate", 1_000_000, Duration::from_secs(3600))
        .unwrap();
    measure("rate limit, window of up to 300 starts", "rate", &mut c);
    // 20,000 starts already in the window (in the buckets a claim would have written).
    c.execute(
        "INSERT INTO postpone_rate_starts (queue, until, starts)
         SELECT 'rate2', now() - i * interval '36 s', 200 FROM generate_series(0, 99) i",
        &[],
    )
    .unwrap();
    admin
        .set_rate_limit("rate2", 1_000_000, Duration::from_secs(3600))
        .unwrap();
    measure("rate limit, window of 20,000 starts", "rate2", &mut c);
    // The rate limit's wait, as a worker could ask for it.
    let wait: Option<f64> = c
        .query_one("SELECT postpone_rate_wait(ARRAY['rate2'])", &[])
        .unwrap()
        .get(0);
    assert_eq!(wait, Some(0.0));
    let wait: Option<f64> = c
        .query_one("SELECT postpone_rate_wait(ARRAY['plain'])", &[])
        .unwrap()
        .get(0);
    assert_eq!(wait, None, "no rate limit");
}
