//! Concurrency limits per queue against the real PostgreSQL with several workers: a limit
//! is never exceeded, as the tasks themselves record (3 workers x 4 threads on a queue
//! limited to 2); clearing it lets the jobs run in parallel; other queues are not held back;
//! a cut-off worker's slot comes back through the rescue; bad input is a clear error, from
//! the admin API and from `postpone limit`.

use crate::support;
use crate::worker_util;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{ErrorKind, Job, Tasks, WorkerHandle};
use support::{wait_until, FaultProxy, NewConns};
use worker_util::*;

const SHUTDOWN: Duration = Duration::from_secs(5);

/// (queue, start, end) of each run, in seconds since the test's start.
type Runs = Arc<Mutex<Vec<(String, f64, f64)>>>;

/// A task "work" that sleeps `args` milliseconds and records when it ran.
fn recording(runs: &Runs, base: Instant) -> Tasks {
    let runs = runs.clone();
    let mut tasks = Tasks::new();
    tasks.register("work", move |job: &Job| {
        let ms: u64 = job.args()?;
        let start = base.elapsed().as_secs_f64();
        thread::sleep(Duration::from_millis(ms));
        let end = base.elapsed().as_secs_f64();
        runs.lock()
            .unwrap()
            .push((job.queue().to_owned(), start, end));
        Ok(())
    });
    tasks
}

/// The most runs of `queue` that overlapped at any time.
fn max_overlap(runs: &Runs, queue: &str) -> usize {
    let mut events: Vec<(f64, i32)> = Vec::new();
    for (q, s, e) in runs.lock().unwrap().iter() {
        if q == queue {
            events.push((*s, 1));
            events.push((*e, -1));
        }
    }
    // At equal times an end comes before a start (-1 sorts first).
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        max = max.max(now);
    }
    max as usize
}

fn ran(runs: &Runs, queue: &str) -> usize {
    runs.lock().unwrap().iter().filter(|r| r.0 == queue).count()
}

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(SHUTDOWN);
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

#[test]
fn max_overlap_counts_overlapping_intervals() {
    let runs: Runs = Arc::default();
    runs.lock().unwrap().extend([
        ("q".to_owned(), 0.0, 1.0),
        ("q".to_owned(), 0.5, 2.0),
        ("q".to_owned(), 1.0, 3.0),
        ("q".to_owned(), 1.5, 1.6),
        ("r".to_owned(), 0.0, 9.0),
    ]);
    assert_eq!(max_overlap(&runs, "q"), 3);
    assert_eq!(max_overlap(&runs, "r"), 1);
}

#[test]
fn a_queue_limit_is_never_exceeded_by_many_workers_and_clearing_it_runs_jobs_in_parallel() {
    let (db, app) = setup();
    let admin = app.admin();
    assert_eq!(admin.set_queue_limit("lim", Some(2)).unwrap(), None);
    let limits = admin.queue_limits().unwrap();
    assert_eq!(limits.len(), 1);
    assert_eq!(
        (limits[0].queue.as_str(), limits[0].max_running),
        ("lim", 2)
    );
    assert_eq!(limits[0].running, 0);

    let base = Instant::now();
    let runs: Runs = Arc::default();
    let workers: Vec<WorkerHandle> = (0..3)
        .map(|i| {
            fast_worker(&app, recording(&runs, base))
                .name(format!("w{i}"))
                .concurrency(4)
                .spawn()
                .unwrap()
        })
        .collect();
    for _ in 0..16 {
        app.job("work").queue("lim").defer(&150u64).unwrap();
    }
    // Jobs of another queue are not held back by the limit of "lim".
    for _ in 0..8 {
        app.job("work").queue("free").defer(&600u64).unwrap();
    }
    let mut client = db.client();
    let mut seen_doing = 0i64;
    assert!(
        wait_until(Duration::from_secs(40), || {
            let doing: i64 = client
                .query_one(
                    "SELECT count(*) FROM postpone_jobs WHERE queue = 'lim' AND status = 'doing'",
                    &[],
                )
                .unwrap()
                .get(0);
            assert!(
                doing <= 2,
                "{doing} jobs of a queue limited to 2 are running"
            );
            seen_doing = seen_doing.max(doing);
            ran(&runs, "lim") == 16 && ran(&runs, "free") == 8
        }),
        "every job ran: lim {} free {}",
        ran(&runs, "lim"),
        ran(&runs, "free")
    );
    let limited = max_overlap(&runs, "lim");
    println!(
        "  limit 2: at most {limited} runs overlapped (rows seen doing at once: {seen_doing})"
    );
    assert!(limited <= 2, "{limited} runs overlapped under a limit of 2");
    assert!(limited >= 1);
    let free = max_overlap(&runs, "free");
    assert!(free > 2, "the unlimited queue ran only {free} jobs at once");

    // Clearing the limit: the jobs run in parallel (12 threads, 12 jobs of 600 ms).
    assert_eq!(admin.set_queue_limit("lim", None).unwrap(), Some(2));
    assert_eq!(
        admin.set_queue_limit("lim", None).unwrap(),
        None,
        "no limit left"
    );
    assert!(admin.queue_limits().unwrap().is_empty());
    runs.lock().unwrap().clear();
    for _ in 0..12 {
        app.job("work").queue("lim").defer(&600u64).unwrap();
    }
    assert!(wait_until(Duration::from_secs(30), || ran(&runs, "lim") == 12));
    let unlimited = max_overlap(&runs, "lim");
    println!("  no limit: {unlimited} runs overlapped");
    assert!(
        unlimited > 2,
        "only {unlimited} ran at once without a limit"
    );
    for w in workers {
        stop(w);
    }
}

#[test]
fn a_cut_off_workers_slot_comes_back_through_the_rescue() {
    let (db, direct) = setup();
    direct.admin().set_queue_limit("one", Some(1)).unwrap();
    let proxy = FaultProxy::start(&db.server_addr());
    let app_a = app_at(&db.url_via(&proxy), Duration::from_secs(1));

    // Worker A takes the queue's one slot with a job that blocks until released.
    let (started_tx, started_rx) = unbounded::<i64>();
    let (release_tx, release_rx) = unbounded::<()>();
    let mut tasks_a = Tasks::new();
    tasks_a.register("work", move |job: &Job| {
        started_tx.send(job.id().get()).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        Ok(())
    });
    let a = fast_worker(&app_a, tasks_a)
        .name("worker-a")
        .concurrency(1)
        .spawn()
        .unwrap();
    let first = direct.job("work").queue("one").defer(&0u64).unwrap();
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        first.get()
    );

    // Worker B, idle with 4 threads, must not start the second job while A holds the slot.
    let base = Instant::now();
    let runs: Runs = Arc::default();
    let b = fast_worker(&direct, recording(&runs, base))
        .name("worker-b")
        .concurrency(4)
        .stalled_after(Duration::from_secs(1))
        .spawn()
        .unwrap();
    let second = direct.job("work").queue("one").defer(&0u64).unwrap();
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(ran(&runs, "one"), 0, "B started a job past the limit");
    let lim = &direct.admin().queue_limits().unwrap()[0];
    assert!(lim.is_reached() && lim.running == 1, "{lim:?}");

    // A is cut off: once its heartbeat is older than stalled_after, its job is requeued
    // and the slot is free again: B runs both jobs, one at a time.
    proxy.strand_all();
    proxy.set_new_conns(NewConns::Strand);
    assert!(
        wait_until(Duration::from_secs(15), || ran(&runs, "one") == 2),
        "B ran {} of the 2 jobs after A was cut off",
        ran(&runs, "one")
    );
    assert_eq!(max_overlap(&runs, "one"), 1);
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
fn bad_limits_are_clear_errors_and_a_queue_without_jobs_can_be_limited() {
    let (db, app) = setup();
    let admin = app.admin();
    for n in [0, -1, i64::from(i32::MAX) + 1] {
        let e = admin.set_queue_limit("q", Some(n)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{n}: {e}");
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
    for q in ["", "a\0b", &"x".repeat(300)] {
        let e = admin.set_queue_limit(q, Some(1)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{q:?}: {e}");
        let e = admin.set_queue_limit(q, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{q:?}: {e}");
    }
    assert!(
        admin.queue_limits().unwrap().is_empty(),
        "nothing was stored"
    );
    // A queue that has no job yet, and changing a limit.
    assert_eq!(admin.set_queue_limit("empty", Some(3)).unwrap(), None);
    assert_eq!(admin.set_queue_limit("empty", Some(5)).unwrap(), Some(3));
    assert_eq!(admin.queue_limits().unwrap()[0].max_running, 5);
    // The table refuses what the API refuses, for SQL written by hand.
    let e = db
        .client()
        .execute(
            "INSERT INTO postpone_queue_limits (queue, max_running) VALUES ('z', 0)",
            &[],
        )
        .unwrap_err();
    assert_eq!(
        e.as_db_error().and_then(|d| d.constraint()),
        Some("postpone_queue_limits_positive"),
        "{e:?}"
    );

    // The command line.
    let cli = |args: &[&str]| {
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
    };
    let (code, out, err) = cli(&["limit", "cli", "4"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("at most 4"), "{out}");
    let (code, out, _) = cli(&["--json", "limit"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cli", "empty"], "{out}");
    assert_eq!(v[0]["max_running"], 4);
    assert_eq!(v[0]["running"], 0);
    for bad in ["0", "-2"] {
        let (code, out, err) = cli(&["limit", "cli", bad]);
        assert_eq!(code, Some(2), "{bad}: {out}{err}");
        assert!(err.contains("at least 1"), "{err}");
    }
    let (code, out, _) = cli(&["limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("cleared (before: 4)"), "{out}");
    let (code, out, _) = cli(&["limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("had no limit"), "{out}");
}

/// Many claims at the same instant (8 connections behind a barrier, 20 rounds) on a queue
/// limited to 2: together they never claim more than 2 jobs. Without the claim's lock, each
/// would count 0 running jobs and take 2.
#[test]
fn simultaneous_claims_never_take_more_than_the_limit() {
    let (db, app) = setup();
    app.admin().set_queue_limit("lim", Some(2)).unwrap();
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'lim', 'work', '0' FROM generate_series(1, 100)",
    )
    .unwrap();
    let worker: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat) VALUES ('sql', now()) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    const CLAIMERS: usize = 8;
    let mut clients: Vec<postgres::Client> = (0..CLAIMERS).map(|_| db.client()).collect();
    for round in 0..20 {
        c.execute(
            "UPDATE postpone_jobs SET status = 'todo', worker_id = NULL WHERE status = 'doing'",
            &[],
        )
        .unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(CLAIMERS));
        let claimed: usize = thread::scope(|s| {
            let handles: Vec<_> = clients
                .iter_mut()
                .map(|cl| {
                    let barrier = barrier.clone();
                    s.spawn(move || {
                        barrier.wait();
                        cl.query(
                            "SELECT id FROM postpone_claim($1, 10, ARRAY['lim'], NULL)",
                            &[&worker],
                        )
                        .unwrap()
                        .len()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            claimed, 2,
            "round {round}: {claimed} jobs claimed under a limit of 2"
        );
    }
    // Every queue (NULL) finds the limited queue too.
    c.execute(
        "UPDATE postpone_jobs SET status = 'todo', worker_id = NULL WHERE status = 'doing'",
        &[],
    )
    .unwrap();
    let n = c
        .query(
            "SELECT id FROM postpone_claim($1, 10, NULL, NULL)",
            &[&worker],
        )
        .unwrap()
        .len();
    assert_eq!(n, 2);
}

/// `Admin::stats` and `postpone stats` say why due jobs are not running: a paused queue, a
/// concurrency limit reached, jobs held by their lock.
#[test]
fn stats_say_why_due_jobs_wait() {
    let (db, app) = setup();
    let admin = app.admin();
    let mut c = db.client();
    let worker: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat) VALUES ('sql', now()) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    admin.set_queue_limit("lim", Some(1)).unwrap();
    admin.set_queue_limit("roomy", Some(5)).unwrap();
    for _ in 0..3 {
        app.job("t").queue("lim").defer(&()).unwrap();
        app.job("t").queue("roomy").defer(&()).unwrap();
        app.job("t").queue("locked").lock("k").defer(&()).unwrap();
    }
    app.job("t").queue("locked").defer(&()).unwrap();
    let claimed = c
        .query(
            "SELECT queue FROM postpone_claim($1, 10, ARRAY['lim', 'roomy', 'locked'], NULL)",
            &[&worker],
        )
        .unwrap();
    // lim: 1 (its limit), roomy: 3, locked: the first job of lock k and the one without.
    assert_eq!(claimed.len(), 6, "{claimed:?}");
    admin.pause("p").unwrap();

    let stats = admin.counts().unwrap();
    let get = |q: &str| stats.iter().find(|s| s.queue == q).unwrap().clone();
    let lim = get("lim");
    assert_eq!((lim.todo, lim.doing, lim.max_running), (2, 1, Some(1)));
    assert!(
        lim.limit_reached && !lim.paused && lim.lock_held == 0,
        "{lim:?}"
    );
    let roomy = get("roomy");
    assert_eq!((roomy.doing, roomy.max_running), (3, Some(5)));
    assert!(!roomy.limit_reached, "{roomy:?}");
    let locked = get("locked");
    assert_eq!((locked.todo, locked.doing, locked.lock_held), (2, 2, 2));
    assert!(!locked.limit_reached && locked.max_running.is_none());
    assert!(get("p").paused);

    let cli = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_postpone"))
            .env_remove("DATABASE_URL")
            .arg("--database-url")
            .arg(db.url())
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = cli(&["stats"]);
    assert!(
        out.contains("-- limit reached: lim (1 running of at most 1; postpone limit)"),
        "{out}"
    );
    assert!(!out.contains("limit reached: roomy"), "{out}");
    assert!(out.contains("-- lock held: locked (2 due jobs"), "{out}");
    assert!(out.contains("-- paused: p"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&cli(&["--json", "stats"])).unwrap();
    let lim = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["queue"] == "lim")
        .unwrap();
    assert_eq!(lim["limit_reached"], true);
    assert_eq!(lim["max_running"], 1);
    assert_eq!(lim["lock_held"], 0);
}
