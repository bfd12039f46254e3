//! Real deployments (DESIGN.md promises 11, 12 and 4): workers with different settings and
//! versions side by side, and the shutdowns of a rolling deploy.
//!
//! - Leases: a worker is presumed dead only when its own lease has ended (its last heartbeat
//!   plus the `stalled_after` it recorded), never by another worker's or an operator's
//!   shorter threshold; rows of workers older than schema 22 (no lease recorded) are judged
//!   by the longest one.
//! - Shutdowns decide nothing: a job whose task answers `should_abort` during a shutdown
//!   with any error, `fail` included, goes back to its queue with its attempt given back;
//!   `even_on_shutdown` makes an answer stand.
//! - Rolling deploys: a worker claims only the tasks it registers (the default), so a job
//!   of a new task waits for a worker that knows it instead of being failed by an old one;
//!   one that no running worker knows is reported by `stats`, the CLI and the dashboard.

use crate::support;
use crate::web_util;
use crate::worker_util;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::unbounded;
use postpone::{
    AbortReason, App, Job, JobId, NewJob, StatsBy, TaskError, Tasks, Worker, WorkerHandle,
};
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

/// A task "stoppable" that loops until `should_abort`, records the reason, then returns what
/// `answer` makes of its argument; once `done` is set it succeeds at once.
fn stoppable(
    answer: fn(&str) -> TaskError,
) -> (
    Tasks,
    Arc<std::sync::atomic::AtomicBool>,
    crossbeam_channel::Receiver<i64>,
    crossbeam_channel::Receiver<Option<AbortReason>>,
) {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (started_tx, started_rx) = unbounded();
    let (reason_tx, reason_rx) = unbounded();
    let mut tasks = Tasks::new();
    let d = done.clone();
    tasks.register("stoppable", move |job: &Job| -> Result<(), TaskError> {
        if d.load(Ordering::SeqCst) {
            return Ok(());
        }
        let _ = started_tx.send(job.id().0);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !job.should_abort() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = reason_tx.send(job.abort_reason());
        let how: String = job.args()?;
        Err(answer(&how))
    });
    (tasks, done, started_rx, reason_rx)
}

fn answer_as_told(how: &str) -> TaskError {
    match how {
        "fail" => TaskError::fail("stopped"),
        "cancel" => TaskError::cancel("stopped"),
        "fail!" => TaskError::fail("no card on file").even_on_shutdown(),
        "cancel!" => TaskError::cancel("not wanted any more").even_on_shutdown(),
        "retry" => TaskError::retry("stopped"),
        "panic" => panic!("stopped by a panic"),
        other => TaskError::new(format!("stopped ({other})")),
    }
}

fn recv_all<T>(rx: &crossbeam_channel::Receiver<T>, n: usize) -> Vec<T> {
    (0..n)
        .map(|i| {
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("only {i} of {n} arrived"))
        })
        .collect()
}

#[test]
fn a_routine_shutdown_fails_no_job_whose_task_answers_should_abort_with_fail() {
    let (db, app) = setup();
    let (tasks, _, started, reasons) = stoppable(answer_as_told);
    let w = fast_worker(&app, tasks).concurrency(8).spawn().unwrap();
    let ids: Vec<JobId> = (0..8)
        .map(|_| app.defer("stoppable", &"fail").unwrap())
        .collect();
    recv_all(&started, 8);
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (report.jobs_requeued(), report.jobs_finished()),
        (8, 0),
        "{report}"
    );
    assert_eq!(recv_all(&reasons, 8), [Some(AbortReason::Shutdown); 8]);
    let mut c = db.client();
    for &id in &ids {
        let row = job_row(&mut c, id).unwrap();
        assert_eq!(
            (row.status.as_str(), row.attempts, row.worker_id),
            ("todo", 0, None),
            "back in the queue, the attempt given back: {row:?}"
        );
        // Its history says what happened.
        let texts = row.error_texts();
        assert_eq!(texts.len(), 1, "{row:?}");
        assert!(
            texts[0].starts_with("interrupted by the shutdown of worker ")
                && texts[0]
                    .ends_with("(attempt 1 given back); the task returned: a failure (stopped)"),
            "{texts:?}"
        );
        assert_eq!(row.errors[0]["attempt"], 1, "{row:?}");
    }
    // The next worker runs them all: each succeeds at its first counted attempt.
    let (tasks, done, _, _) = stoppable(answer_as_told);
    done.store(true, Ordering::SeqCst);
    let w = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    for &id in &ids {
        let row = wait_status(&db, id, "succeeded", Duration::from_secs(10));
        assert_eq!(row.attempts, 1, "{row:?}");
    }
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn every_answer_to_a_shutdown_requeues_the_job_unless_it_says_even_on_shutdown() {
    let (db, app) = setup();
    let (tasks, _, started, reasons) = stoppable(answer_as_told);
    let w = fast_worker(&app, tasks)
        .concurrency(7)
        .shutdown_graceful_timeout(Duration::from_secs(1))
        .spawn()
        .unwrap();
    let answers = [
        "fail", "cancel", "retry", "error", "panic", "fail!", "cancel!",
    ];
    let ids: Vec<JobId> = answers
        .iter()
        .map(|a| app.defer("stoppable", a).unwrap())
        .collect();
    recv_all(&started, answers.len());
    // should_abort after 1 s, then a generous bound for the jobs to wrap up: the panicking
    // task's backtrace is printed by the default hook when RUST_BACKTRACE=1, which takes
    // seconds in a debug build on a loaded machine.
    let report = w.shutdown(Duration::from_secs(30));
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        recv_all(&reasons, answers.len()),
        [Some(AbortReason::Shutdown); 7]
    );
    let mut c = db.client();
    let got: Vec<(&str, String, i32)> = answers
        .iter()
        .zip(&ids)
        .map(|(a, &id)| {
            let row = job_row(&mut c, id).unwrap();
            (*a, row.status, row.attempts)
        })
        .collect();
    let want: Vec<(&str, String, i32)> = [
        ("fail", "todo", 0),
        ("cancel", "todo", 0),
        ("retry", "todo", 0),
        ("error", "todo", 0),
        ("panic", "todo", 0),
        ("fail!", "failed", 1),
        ("cancel!", "cancelled", 1),
    ]
    .into_iter()
    .map(|(a, s, n)| (a, s.to_owned(), n))
    .collect();
    assert_eq!(got, want);
    let row = job_row(&mut c, ids[5]).unwrap();
    assert_eq!(row.error_texts(), ["no card on file"], "{row:?}");
}

#[test]
fn an_abort_request_is_told_apart_from_a_shutdown() {
    let (db, app) = setup();
    let (tasks, _, started, reasons) = stoppable(answer_as_told);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let id = app.defer("stoppable", &"fail").unwrap();
    recv_all(&started, 1);
    app.admin().abort(id).unwrap();
    assert_eq!(recv_all(&reasons, 1), [Some(AbortReason::Requested)]);
    let row = wait_status(&db, id, "aborted", Duration::from_secs(10));
    assert_eq!(row.attempts, 1, "{row:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn an_old_worker_without_a_task_beside_a_new_one_with_it_fails_none_of_its_jobs() {
    let (db, app) = setup();
    // The old version knows "report" only; the new one knows "report" and "export".
    let ran_old = Arc::new(AtomicUsize::new(0));
    let mut old_tasks = Tasks::new();
    let r = ran_old.clone();
    old_tasks.register("report", move |_job: &Job| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let old = fast_worker(&app, old_tasks)
        .name("old")
        .concurrency(4)
        .spawn()
        .unwrap();
    let ran_new = Arc::new(AtomicUsize::new(0));
    let mut new_tasks = Tasks::new();
    new_tasks.register("report", |_job: &Job| Ok(()));
    let r = ran_new.clone();
    new_tasks.register("export", move |_job: &Job| {
        r.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    });
    let new = fast_worker(&app, new_tasks)
        .name("new")
        .concurrency(4)
        .spawn()
        .unwrap();
    let mut jobs: Vec<NewJob> = (0..100)
        .map(|i| NewJob::new("export", &i).unwrap())
        .collect();
    jobs.extend((0..20).map(|i| NewJob::new("report", &i).unwrap()));
    let ids = app.defer_batch(&jobs).unwrap();
    for &id in &ids {
        wait_status(&db, id, "succeeded", Duration::from_secs(30));
    }
    let rows = all_jobs(&mut db.client());
    let exports: Vec<&JobRow> = rows.iter().filter(|r| r.task == "export").collect();
    assert_eq!(exports.len(), 100);
    for r in &exports {
        assert_eq!(
            (r.status.as_str(), r.attempts, r.errors.len()),
            ("succeeded", 1, 0),
            "{r:?}"
        );
    }
    assert_eq!(
        ran_new.load(Ordering::SeqCst),
        100,
        "the new worker ran every export"
    );
    // Each row says which tasks its worker claims.
    let ws = app.admin().workers().unwrap();
    let tasks: Vec<(String, Option<Vec<String>>)> = ws
        .iter()
        .map(|w| (w.name.clone(), w.tasks.clone()))
        .collect();
    assert_eq!(
        tasks,
        [
            ("old".to_owned(), Some(vec!["report".to_owned()])),
            (
                "new".to_owned(),
                Some(vec!["export".to_owned(), "report".to_owned()])
            ),
        ]
    );
    assert!(old.shutdown(Duration::from_secs(5)).is_clean());
    assert!(new.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn a_job_no_running_worker_knows_is_reported_by_stats_the_cli_and_the_dashboard() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.register("known", |_job: &Job| Ok(()));
    let w = fast_worker(&app, tasks)
        .queues(["default"])
        .spawn()
        .unwrap();
    let mystery = app.defer("mystery", &()).unwrap();
    // A job of a queue no worker serves is not this problem (no worker serves it at all).
    app.job("mystery").queue("unserved").defer(&()).unwrap();
    let admin = app.admin();
    let now = admin.unknown_tasks(Duration::ZERO).unwrap();
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(
        (now[0].queue.as_str(), now[0].task.as_str(), now[0].jobs),
        ("default", "mystery", 1)
    );
    assert!(
        now[0].to_string().starts_with(
            "no worker knows task \"mystery\": 1 due job(s) of queue \"default\" wait"
        ),
        "{}",
        now[0]
    );
    // Not yet past the default 15 minutes: stats say nothing.
    assert!(admin
        .counts()
        .unwrap()
        .iter()
        .all(|c| c.unknown_tasks.is_empty()));
    db.client()
        .execute(
            "UPDATE postpone_jobs SET scheduled_at = now() - interval '20 minutes' WHERE id = $1",
            &[&mystery.0],
        )
        .unwrap();
    let counts = admin.counts().unwrap();
    let default = counts.iter().find(|c| c.queue == "default").unwrap();
    assert_eq!(default.unknown_tasks, ["mystery"]);
    assert_eq!(default.waiting_reasons(), ["unknown task"]);
    let by_task = admin.stats(StatsBy::Task, None).unwrap();
    assert_eq!(by_task[0].unknown_tasks, ["mystery"]);
    // The CLI's stats say it under the table.
    let o = Command::new(env!("CARGO_BIN_EXE_postpone"))
        .env_remove("RUST_LOG")
        .args(["--database-url", &db.url(), "--timeout", "5s", "stats"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("-- no worker knows task \"mystery\": 1 due job(s) of queue \"default\" wait, the oldest for 20m"),
        "{out}"
    );
    // The dashboard's overview says why the queue's due jobs wait.
    let dash = web_util::dashboard(&app);
    let page = web_util::get(dash.addr(), "/").body;
    assert!(
        page.contains("no worker knows task &quot;mystery&quot;"),
        "{page}"
    );
    dash.shutdown();
    // Once a worker that knows it runs, it runs (and is no longer reported).
    let mut tasks = Tasks::new();
    tasks.register("mystery", |_job: &Job| Ok(()));
    let w2 = fast_worker(&app, tasks).spawn().unwrap();
    wait_status(&db, mystery, "succeeded", Duration::from_secs(10));
    assert_eq!(admin.unknown_tasks(Duration::ZERO).unwrap(), []);
    assert!(w2.shutdown(Duration::from_secs(5)).is_clean());
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}
