//! Claimed is not started (DESIGN promise 10), against the real PostgreSQL: a job a worker
//! holds but has not started is waiting in every view and for every control (pause, abort,
//! cancel, shutdown), without running and without using an attempt; and a worker never
//! holds such a job while another worker with free threads could run it.

use crate::support;
use crate::worker_util;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postpone::{App, Job, JobId, JobStatus, Tasks, WorkerHandle};
use support::wait_until;
use worker_util::*;

const SHUTDOWN: Duration = Duration::from_secs(5);

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(SHUTDOWN);
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

/// Tasks: `fast` (counts its runs, by job id), and `block` (runs until told to stop, or
/// 20 s; counts how many are running).
struct Probe {
    fast_runs: Arc<Mutex<Vec<(i64, Instant)>>>,
    blocking: Arc<AtomicUsize>,
}

fn tasks() -> (Tasks, Probe) {
    let fast_runs = Arc::new(Mutex::new(Vec::new()));
    let blocking = Arc::new(AtomicUsize::new(0));
    let mut tasks = Tasks::new();
    let runs = fast_runs.clone();
    tasks.register("fast", move |job: &Job| {
        runs.lock().unwrap().push((job.id().get(), Instant::now()));
        Ok(())
    });
    let b = blocking.clone();
    tasks.register("block", move |job: &Job| {
        b.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(20);
        while !job.should_abort() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        b.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    });
    (
        tasks,
        Probe {
            fast_runs,
            blocking,
        },
    )
}

/// Ids of the jobs held now: claimed (`doing`, a worker's) and not started.
fn held_now(db: &support::TestDb) -> Vec<i64> {
    db.client()
        .query(
            "SELECT id FROM postpone_jobs WHERE status = 'doing' AND started_at IS NULL ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// One `block` job then `fast` ones, a worker of one thread that holds ten jobs ahead, and
/// the moment its thread is in `block` with the fast jobs held.
fn one_thread_holding(app: &App, db: &support::TestDb, fast: usize) -> (WorkerHandle, Probe) {
    app.defer("block", &()).unwrap();
    for _ in 0..fast {
        app.defer("fast", &()).unwrap();
    }
    let (tasks, probe) = tasks();
    let handle = fast_worker(app, tasks)
        .concurrency(1)
        .prefetch(10)
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || probe
            .blocking
            .load(Ordering::SeqCst)
            == 1),
        "the blocking job never started"
    );
    assert!(
        !held_now(db).is_empty(),
        "the worker held no job behind its busy thread (the test needs one)"
    );
    (handle, probe)
}

#[test]
fn fast_jobs_do_not_wait_behind_a_busy_worker_while_another_is_idle() {
    let (db, app) = setup();
    // 400 fast jobs, two long ones, then 60 fast ones, deferred in that order.
    for _ in 0..400 {
        app.defer("fast", &()).unwrap();
    }
    app.defer("block", &()).unwrap();
    app.defer("block", &()).unwrap();
    let mut late = Vec::new();
    for _ in 0..60 {
        late.push(app.defer("fast", &()).unwrap().get());
    }
    let (tasks_a, probe_a) = tasks();
    let a = fast_worker(&app, tasks_a).concurrency(2).spawn().unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || probe_a
            .blocking
            .load(Ordering::SeqCst)
            == 2),
        "worker A never had both threads in the long jobs"
    );
    let (tasks_b, probe_b) = tasks();
    let b = fast_worker(&app, tasks_b).concurrency(4).spawn().unwrap();
    let done = |probe: &Probe| -> usize {
        let runs = probe.fast_runs.lock().unwrap();
        late.iter()
            .filter(|id| runs.iter().any(|(r, _)| r == *id))
            .count()
    };
    let all_ran = wait_until(Duration::from_secs(5), || {
        done(&probe_a) + done(&probe_b) == late.len()
    });
    let held = held_now(&db);
    stop(b);
    stop(a);
    assert!(
        all_ran,
        "5 s after an idle worker started, {} of the 60 fast jobs had run ({} held unstarted: {held:?})",
        done(&probe_a) + done(&probe_b),
        held.len()
    );
}

#[test]
fn no_job_of_a_paused_queue_starts_after_pause_returns() {
    let (_db, app) = setup();
    let mut tasks = Tasks::new();
    let starts = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let s = starts.clone();
    tasks.register("short", move |_job: &Job| {
        s.lock().unwrap().push(Instant::now());
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    });
    let jobs: Vec<postpone::NewJob> = (0..3000)
        .map(|_| postpone::NewJob::new("short", &()).unwrap())
        .collect();
    app.defer_batch(&jobs).unwrap();
    let handle = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(20), || starts
        .lock()
        .unwrap()
        .len()
        >= 200));
    app.admin().pause("default").unwrap();
    let paused = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let late = starts
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t > paused)
        .count();
    let ran = starts.lock().unwrap().len();
    stop(handle);
    assert_eq!(late, 0, "jobs started after pause() returned ({ran} ran)");
    assert!(
        ran < 3000,
        "the queue drained before the pause: the test proves nothing"
    );
}

#[test]
fn an_abort_reaches_a_held_job_at_once_without_an_attempt() {
    let (db, app) = setup();
    let (handle, probe) = one_thread_holding(&app, &db, 5);
    let target = JobId::from(held_now(&db)[0]);
    let asked = Instant::now();
    app.admin().abort(target).unwrap();
    let ended = wait_until(Duration::from_secs(2), || {
        let s = app.admin().job(target).unwrap().job.status;
        s == JobStatus::Aborted || s == JobStatus::Cancelled
    });
    let took = asked.elapsed();
    let job = app.admin().job(target).unwrap().job;
    let ran = probe
        .fast_runs
        .lock()
        .unwrap()
        .iter()
        .any(|(id, _)| *id == target.get());
    stop(handle);
    assert!(ended, "the held job did not end within 2 s of its abort");
    assert!(!ran, "the aborted job ran");
    assert_eq!(job.attempts, 0, "an unstarted job used an attempt: {job:?}");
    report_figure("abort of a held job", took);
}

#[test]
fn a_held_job_can_be_cancelled_and_never_runs() {
    let (db, app) = setup();
    let (handle, probe) = one_thread_holding(&app, &db, 5);
    let target = JobId::from(held_now(&db)[0]);
    app.admin().cancel(target).unwrap();
    let job = app.admin().job(target).unwrap().job;
    assert_eq!(job.status, JobStatus::Cancelled, "{job:?}");
    assert_eq!(job.attempts, 0, "{job:?}");
    // Let the worker go on: the job stays cancelled and never runs.
    std::thread::sleep(Duration::from_millis(300));
    let ran = probe
        .fast_runs
        .lock()
        .unwrap()
        .iter()
        .any(|(id, _)| *id == target.get());
    stop(handle);
    assert!(!ran, "the cancelled job ran");
    assert_eq!(
        app.admin().job(target).unwrap().job.status,
        JobStatus::Cancelled
    );
}

#[test]
fn views_show_held_jobs_as_waiting_and_running_ones_as_running() {
    let (db, app) = setup();
    let (handle, _probe) = one_thread_holding(&app, &db, 5);
    let target = JobId::from(held_now(&db)[0]);
    let counts = app.admin().counts().unwrap();
    let q = counts.iter().find(|c| c.queue == "default").unwrap();
    let info = app.admin().job(target).unwrap().job;
    let workers = app.admin().workers().unwrap();
    stop(handle);
    assert_eq!(q.doing, 1, "only the blocking job runs: {q:?}");
    assert_eq!(q.todo, 5, "the held jobs wait: {q:?}");
    assert_eq!(info.status, JobStatus::Todo, "{info:?}");
    assert_eq!(info.attempts, 0, "{info:?}");
    assert_eq!(info.started_at, None, "{info:?}");
    assert_eq!(workers.len(), 1);
}

#[test]
fn a_shutdown_gives_held_jobs_back_without_using_an_attempt() {
    let (db, app) = setup();
    let (handle, probe) = one_thread_holding(&app, &db, 5);
    let held = held_now(&db);
    stop(handle);
    let ran = probe.fast_runs.lock().unwrap().len();
    let mut client = db.client();
    for id in held {
        let row = job_row(&mut client, JobId::from(id)).unwrap();
        if row.status == "todo" {
            assert_eq!(row.attempts, 0, "{row:?}");
        } else {
            assert_eq!(row.status, "succeeded", "{row:?} ({ran} fast jobs ran)");
        }
    }
}

#[test]
fn a_held_job_that_runs_shows_its_start_soon() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.register("slowish", |_job: &Job| {
        std::thread::sleep(Duration::from_millis(600));
        Ok(())
    });
    let id = app.defer("slowish", &()).unwrap();
    let handle = fast_worker(&app, tasks).concurrency(1).spawn().unwrap();
    let shown = wait_until(Duration::from_secs(5), || {
        app.admin().job(id).unwrap().job.status == JobStatus::Doing
    });
    let row: (Option<std::time::SystemTime>, i32) = {
        let r = db
            .client()
            .query_one(
                "SELECT started_at, attempts FROM postpone_jobs WHERE id = $1",
                &[&id.get()],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let done = wait_until(Duration::from_secs(5), || {
        app.admin().job(id).unwrap().job.status == JobStatus::Succeeded
    });
    let info = app.admin().job(id).unwrap().job;
    stop(handle);
    assert!(shown, "the running job never showed as running");
    assert!(row.0.is_some(), "running without a start time");
    assert_eq!(row.1, 1);
    assert!(done);
    let ran = info
        .duration()
        .expect("a finished job that ran has a duration");
    assert!(ran >= Duration::from_millis(500), "ran for {ran:?}");
}

#[test]
fn held_jobs_wait_no_longer_than_the_hold_limit_when_no_other_worker_is_free() {
    // One worker, its only thread stuck: the held jobs go back to the queue (todo, no
    // attempt used) rather than waiting in its memory.
    let (db, app) = setup();
    let (handle, _probe) = one_thread_holding(&app, &db, 5);
    let gone = wait_until(Duration::from_secs(3), || held_now(&db).is_empty());
    let mut client = db.client();
    let todo = all_jobs(&mut client)
        .into_iter()
        .filter(|j| j.task == "fast" && j.status == "todo")
        .collect::<Vec<_>>();
    stop(handle);
    assert!(gone, "held jobs still held 3 s later: {:?}", held_now(&db));
    assert_eq!(todo.len(), 5, "{todo:?}");
    assert!(todo.iter().all(|j| j.attempts == 0), "{todo:?}");
}
