//! Real deployments (DESIGN.md promises 11 and 4): workers with different settings and
//! versions side by side. A worker is presumed dead only when its own lease has ended (its
//! last heartbeat plus the `stalled_after` it recorded), never by another worker's or an
//! operator's shorter threshold; rows of workers older than schema 22 (no lease recorded)
//! are judged by the longest one.

mod support;
mod worker_util;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::unbounded;
use postpone::{App, Job, JobId, Tasks, Worker, WorkerHandle};
use support::TestDb;
use worker_util::*;

/// A task "slow" that sleeps for `run`, counting its starts and saying when it starts.
fn slow_task(
    run: Duration,
) -> (
    Tasks,
    Arc<AtomicUsize>,
    crossbeam_channel::Receiver<(i64, u32)>,
) {
    let starts = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = unbounded();
    let mut tasks = Tasks::new();
    let s = starts.clone();
    tasks.register("slow", move |job: &Job| {
        s.fetch_add(1, Ordering::SeqCst);
        let _ = tx.send((job.id().0, job.attempts()));
        std::thread::sleep(run);
        Ok(())
    });
    (tasks, starts, rx)
}

/// Worker A with every lease setting at its default (heartbeat 10 s, stalled_after 30 s).
fn default_worker(app: &App, tasks: Tasks) -> WorkerHandle {
    Worker::builder(app, tasks)
        .name("a-defaults")
        .drop_timeout(Duration::from_secs(3))
        .spawn()
        .expect("spawning worker A")
}

/// Defers the 7 s job and waits until worker A has started it.
fn job_running_on_a(app: &App, rx: &crossbeam_channel::Receiver<(i64, u32)>) -> JobId {
    let id = app.defer("slow", &()).unwrap();
    let (started, attempt) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("worker A starts the job");
    assert_eq!((started, attempt), (id.0, 1));
    id
}

fn assert_ran_once(db: &TestDb, id: JobId, starts: &AtomicUsize) {
    let row = wait_status(db, id, "succeeded", Duration::from_secs(20));
    assert_eq!(
        starts.load(Ordering::SeqCst),
        1,
        "the job started once: {row:?}"
    );
    assert_eq!(row.attempts, 1, "it succeeded at attempt 1: {row:?}");
    assert!(row.errors.is_empty(), "nothing was requeued: {row:?}");
}

#[test]
fn a_worker_with_a_shorter_stalled_after_never_presumes_a_healthy_one_dead() {
    let (db, app) = setup();
    let (tasks_a, starts, rx) = slow_task(Duration::from_secs(7));
    let a = default_worker(&app, tasks_a);
    let id = job_running_on_a(&app, &rx);
    // Worker B, valid on its own: heartbeat 300 ms, stalled_after 3 s; it rescues every
    // 300 ms, and knows the task (a rescued job would run there as attempt 2).
    let mut tasks_b = Tasks::new();
    let s = starts.clone();
    tasks_b.register("slow", move |_job: &Job| {
        s.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let b = Worker::builder(&app, tasks_b)
        .name("b-short")
        .heartbeat_interval(Duration::from_millis(300))
        .stalled_after(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(100))
        .drop_timeout(Duration::from_secs(3))
        .spawn()
        .unwrap();
    assert_ran_once(&db, id, &starts);
    // Both rows are there, each with its own lease.
    let ws = app.admin().workers().unwrap();
    let leases: Vec<(String, Option<Duration>, bool)> = ws
        .iter()
        .map(|w| (w.name.clone(), w.stalled_after, w.stale))
        .collect();
    assert_eq!(
        leases,
        [
            (
                "a-defaults".to_owned(),
                Some(Duration::from_secs(30)),
                false
            ),
            ("b-short".to_owned(), Some(Duration::from_secs(3)), false)
        ]
    );
    assert_eq!(
        ws.iter().map(|w| w.heartbeat_interval).collect::<Vec<_>>(),
        [
            Some(Duration::from_secs(10)),
            Some(Duration::from_millis(300))
        ]
    );
    assert!(b.shutdown(Duration::from_secs(5)).is_clean());
    assert!(a.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn an_operators_shorter_after_never_requeues_a_healthy_workers_job() {
    let (db, app) = setup();
    let (tasks_a, starts, rx) = slow_task(Duration::from_secs(7));
    let a = default_worker(&app, tasks_a);
    let id = job_running_on_a(&app, &rx);
    // Past a second without a heartbeat (A beats every 10 s), an operator asks for the
    // jobs of workers silent for 1 s, again and again while the job runs.
    let mut requeued = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        let o = Command::new(env!("CARGO_BIN_EXE_postpone"))
            .env_remove("RUST_LOG")
            .args(["--database-url", &db.url(), "--timeout", "5s"])
            .args(["stalled", "--requeue", "--after", "1s"])
            .output()
            .expect("running postpone stalled");
        assert!(o.status.success(), "{o:?}");
        requeued.push(String::from_utf8_lossy(&o.stdout).trim().to_owned());
    }
    assert_eq!(requeued, ["0 stalled job(s) requeued"; 3]);
    assert_eq!(
        app.admin().stalled_jobs(Duration::from_secs(1)).unwrap(),
        []
    );
    assert_ran_once(&db, id, &starts);
    assert!(a.shutdown(Duration::from_secs(5)).is_clean());
}

/// Inserts a worker row (as a test would by hand: `lease` NULL is a worker older than schema
/// 22) holding one running job; returns (worker id, job id).
fn ghost(db: &TestDb, heartbeat_age: &str, lease_ms: Option<i64>) -> (i64, JobId) {
    let mut c = db.client();
    let w: i64 = c
        .query_one(
            &format!(
                "INSERT INTO postpone_workers (name, last_heartbeat, stalled_after_ms)
                 VALUES ('ghost', now() - interval '{heartbeat_age}', $1) RETURNING id"
            ),
            &[&lease_ms],
        )
        .unwrap()
        .get(0);
    let j: i64 = c
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args, status, worker_id, attempts, started_at)
             VALUES ('default', 'quick', 'null', 'doing', $1, 1, now()) RETURNING id",
            &[&w],
        )
        .unwrap()
        .get(0);
    (w, JobId(j))
}

fn quick_worker(app: &App) -> WorkerHandle {
    let mut tasks = Tasks::new();
    tasks.register("quick", |_job: &Job| Ok(()));
    fast_worker(app, tasks).spawn().unwrap()
}

#[test]
fn a_dead_workers_own_short_lease_is_honoured_by_a_rescuer_with_a_longer_one() {
    let (db, app) = setup();
    // Silent for 3 s, with a lease of 1 s: dead, though the rescuer's own setting is 10 s.
    let (_, id) = ghost(&db, "3 seconds", Some(1000));
    let mut tasks = Tasks::new();
    tasks.register("quick", |_job: &Job| Ok(()));
    let w = fast_worker(&app, tasks)
        .heartbeat_interval(Duration::from_secs(1))
        .stalled_after(Duration::from_secs(10))
        .spawn()
        .unwrap();
    let row = wait_status(&db, id, "succeeded", Duration::from_secs(10));
    assert_eq!(row.attempts, 2, "{row:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn a_worker_older_than_leases_is_judged_by_the_longest_one() {
    let (db, app) = setup();
    // Rows without a recorded lease (workers older than schema 22): silent for 5 s, which is
    // past the rescuer's 1 s but not past the 30 s floor; and silent for an hour.
    let (old_alive, alive_job) = ghost(&db, "5 seconds", None);
    let (_, dead_job) = ghost(&db, "1 hour", None);
    let w = quick_worker(&app);
    let row = wait_status(&db, dead_job, "succeeded", Duration::from_secs(10));
    assert_eq!(row.attempts, 2, "{row:?}");
    // Several rescues have run since (every 200 ms): the young one is untouched.
    std::thread::sleep(Duration::from_millis(600));
    let row = job_row(&mut db.client(), alive_job).unwrap();
    assert_eq!(
        (row.status.as_str(), row.worker_id),
        ("doing", Some(old_alive)),
        "{row:?}"
    );
    let info = app.admin().workers().unwrap();
    let old = info.iter().find(|i| i.id == old_alive).unwrap();
    assert_eq!((old.stalled_after, old.stale), (None, false), "{old:?}");
    // The longest lease a registered worker records counts too: one of 60 s keeps an old
    // row 40 s silent alive, and an operator's --after lengthens it further.
    db.client()
        .batch_execute(&format!(
            "UPDATE postpone_workers SET last_heartbeat = now() - interval '40 s' WHERE id = {old_alive};
             INSERT INTO postpone_workers (name, stalled_after_ms) VALUES ('long', 60000);"
        ))
        .unwrap();
    assert_eq!(app.admin().stalled_jobs(Duration::ZERO).unwrap(), []);
    db.client()
        .batch_execute("DELETE FROM postpone_workers WHERE name = 'long'")
        .unwrap();
    assert_eq!(
        app.admin()
            .requeue_stalled(Duration::from_secs(120), true)
            .unwrap()
            .jobs,
        0,
        "--after 120s lengthens the lease past 40 s"
    );
    let row = wait_status(&db, alive_job, "succeeded", Duration::from_secs(10));
    assert_eq!(row.attempts, 2, "{row:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn an_operators_longer_after_lengthens_a_lease() {
    let (db, app) = setup();
    let (_, id) = ghost(&db, "5 seconds", Some(1000));
    let admin = app.admin();
    assert_eq!(admin.stalled_jobs(Duration::ZERO).unwrap().len(), 1);
    assert_eq!(admin.stalled_jobs(Duration::from_secs(2)).unwrap().len(), 1);
    assert_eq!(admin.stalled_jobs(Duration::from_secs(60)).unwrap(), []);
    assert_eq!(
        admin
            .requeue_stalled(Duration::from_secs(60), false)
            .unwrap()
            .jobs,
        0
    );
    assert_eq!(
        admin
            .forget_workers(Duration::from_secs(60), false)
            .unwrap()
            .workers,
        0
    );
    assert!(admin.workers().unwrap()[0].stale);
    assert!(!admin.workers_stale_after(Duration::from_secs(60)).unwrap()[0].stale);
    assert_eq!(
        admin.requeue_stalled(Duration::ZERO, false).unwrap().jobs,
        1
    );
    let row = job_row(&mut db.client(), id).unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("todo", 1), "{row:?}");
}
