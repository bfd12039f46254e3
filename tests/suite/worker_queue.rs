//! Queue semantics of a worker against the real PostgreSQL: priority and FIFO order,
//! scheduling, locks, queueing locks, queue filters, unknown tasks, bad arguments, panics,
//! retries and their timing, the task error actions, task timeouts, deletion of finished
//! jobs, `only_registered_tasks`, the LISTEN wake-up latency, and a claim's jobs running on
//! every thread at once.

use crate::support;
use crate::worker_util;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded};
use postpone::{DeleteJobs, ErrorKind, Job, JobId, RetryStrategy, TaskError, Tasks, WorkerHandle};
use serde::Deserialize;
use support::{wait_until, TestDb};
use worker_util::*;

const SHUTDOWN: Duration = Duration::from_secs(5);

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(SHUTDOWN);
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

/// Seconds since the epoch of each entry of job `id`'s errors array, per the database clock.
fn error_times(db: &TestDb, id: JobId) -> Vec<f64> {
    db.client()
        .query_one(
            "SELECT coalesce(array_agg(extract(epoch FROM (e->>'at')::timestamptz)::float8 \
                                       ORDER BY n), '{}') \
               FROM postpone_jobs, jsonb_array_elements(errors) WITH ORDINALITY AS x(e, n) \
              WHERE id = $1",
            &[&id.0],
        )
        .expect("reading error times")
        .get(0)
}

#[test]
fn higher_priority_first_then_fifo() {
    let (db, app) = setup();
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Tasks::new();
    let seen = order.clone();
    tasks.register("record", move |job: &Job| {
        let name: String = job.args()?;
        seen.lock().unwrap().push(name);
        Ok(())
    });
    // Deferred before the worker starts, in this order.
    for (prio, name) in [
        (0, "a0"),
        (5, "b0"),
        (0, "a1"),
        (10, "c0"),
        (5, "b1"),
        (-1, "z0"),
        (10, "c1"),
        (0, "a2"),
    ] {
        app.job("record").priority(prio).defer(name).unwrap();
    }
    let handle = fast_worker(&app, tasks)
        .concurrency(1)
        .prefetch(0)
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || order
        .lock()
        .unwrap()
        .len()
        == 8));
    stop(handle);
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        ["c0", "c1", "b0", "b1", "a0", "a1", "a2", "z0"],
        "run order"
    );
    drop(db);
}

/// Within a priority, jobs run in the order they became due (a job scheduled for an earlier
/// time, or rescued, goes before one deferred for now), then in defer order.
#[test]
fn within_a_priority_the_earliest_due_runs_first() {
    let (db, app) = setup();
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Tasks::new();
    let seen = order.clone();
    tasks.register("record", move |job: &Job| {
        let name: String = job.args()?;
        seen.lock().unwrap().push(name);
        Ok(())
    });
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    app.defer("record", "now-1").unwrap();
    app.job("record")
        .schedule_at(hour_ago)
        .defer("an-hour-ago")
        .unwrap();
    app.defer("record", "now-2").unwrap();
    app.job("record")
        .priority(1)
        .schedule_at(hour_ago + Duration::from_secs(60))
        .defer("urgent")
        .unwrap();
    let handle = fast_worker(&app, tasks)
        .concurrency(1)
        .prefetch(0)
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || order
        .lock()
        .unwrap()
        .len()
        == 4));
    stop(handle);
    assert_eq!(
        *order.lock().unwrap(),
        ["urgent", "an-hour-ago", "now-1", "now-2"]
    );
    drop(db);
}

#[test]
fn scheduled_jobs_run_only_when_due() {
    let (db, app) = setup();
    let (tx, rx) = unbounded::<(String, Instant)>();
    let mut tasks = Tasks::new();
    tasks.register("when", move |job: &Job| {
        let name: String = job.args()?;
        tx.send((name, Instant::now())).unwrap();
        Ok(())
    });
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let t0 = Instant::now();
    let later = app
        .job("when")
        .schedule_in(Duration::from_secs(1))
        .defer("later")
        .unwrap();
    app.defer("when", "now").unwrap();

    let (name, at) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(name, "now", "the due job runs first");
    assert!(at - t0 < Duration::from_secs(1), "{:?}", at - t0);
    // Not run yet, not even claimed.
    let row = job_row(&mut db.client(), later).unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("todo", 0));

    let (name, at) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(name, "later");
    let waited = at - t0;
    report_figure("schedule_in(1 s) started after", waited);
    assert!(
        waited >= Duration::from_millis(990),
        "a job scheduled in 1 s started after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2500),
        "a job scheduled in 1 s started only after {waited:?} (poll interval 100 ms)"
    );
    wait_status(&db, later, "succeeded", Duration::from_secs(5));
    stop(handle);
}

#[test]
fn jobs_sharing_a_lock_never_overlap_and_run_in_defer_order() {
    let (db, app) = setup();
    let order = Arc::new(Mutex::new(Vec::<u32>::new()));
    let active = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let free_active = Arc::new(AtomicUsize::new(0));
    let free_max = Arc::new(AtomicUsize::new(0));
    let mut tasks = Tasks::new();
    {
        let (order, active, overlaps) = (order.clone(), active.clone(), overlaps.clone());
        tasks.register("locked", move |job: &Job| {
            let n: u32 = job.args()?;
            if active.fetch_add(1, Ordering::SeqCst) > 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            order.lock().unwrap().push(n);
            thread::sleep(Duration::from_millis(100));
            active.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        });
    }
    {
        let (free_active, free_max) = (free_active.clone(), free_max.clone());
        tasks.register("free", move |_job: &Job| {
            let now = free_active.fetch_add(1, Ordering::SeqCst) + 1;
            free_max.fetch_max(now, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(300));
            free_active.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        });
    }
    let mut ids = Vec::new();
    for n in 0..6u32 {
        ids.push(app.job("locked").lock("L").defer(&n).unwrap());
        // Interleave lock-free jobs, so free threads are available to a wrongly claimed job.
        if n < 4 {
            ids.push(app.defer("free", &n).unwrap());
        }
    }
    let handle = fast_worker(&app, tasks).concurrency(4).spawn().unwrap();
    for id in &ids {
        wait_status(&db, *id, "succeeded", Duration::from_secs(20));
    }
    stop(handle);
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "jobs of one lock overlapped"
    );
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5], "lock order");
    assert!(
        free_max.load(Ordering::SeqCst) >= 2,
        "the worker never ran two jobs at once, so the lock test proves nothing"
    );
}

#[test]
fn queueing_lock_is_free_again_once_its_job_leaves_todo() {
    let (db, app) = setup();
    let (started_tx, started_rx) = unbounded::<i64>();
    let (release_tx, release_rx) = unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks.register("ql", move |job: &Job| {
        let block: bool = job.args()?;
        started_tx.send(job.id().0).unwrap();
        if block {
            release_rx
                .recv_timeout(Duration::from_secs(20))
                .map_err(|_| TaskError::fail("never released"))?;
        }
        Ok(())
    });
    let first = app.job("ql").queueing_lock("q1").defer(&true).unwrap();
    let e = app
        .job("ql")
        .queueing_lock("q1")
        .defer(&false)
        .expect_err("a second todo job with the same queueing lock");
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");
    assert!(e.is_already_enqueued());

    // One thread, no prefetch: the second job stays todo while the first runs.
    let handle = fast_worker(&app, tasks)
        .concurrency(1)
        .prefetch(0)
        .spawn()
        .unwrap();
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        first.0
    );
    let second = app
        .job("ql")
        .queueing_lock("q1")
        .defer(&false)
        .expect("the lock is free once the first job runs");
    let e = app
        .job("ql")
        .queueing_lock("q1")
        .defer(&false)
        .expect_err("the second job holds the lock while it is todo");
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");

    release_tx.send(()).unwrap();
    wait_status(&db, first, "succeeded", Duration::from_secs(5));
    wait_status(&db, second, "succeeded", Duration::from_secs(5));
    stop(handle);
}

#[test]
fn a_worker_serves_only_its_queues() {
    let (db, app) = setup();
    let queues = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Tasks::new();
    let seen = queues.clone();
    tasks.register("q", move |job: &Job| {
        seen.lock().unwrap().push(job.queue().to_owned());
        Ok(())
    });
    let other = app.job("q").queue("b").defer(&()).unwrap();
    let mine = app.job("q").queue("a").defer(&()).unwrap();
    let handle = fast_worker(&app, tasks).queues(["a"]).spawn().unwrap();
    wait_status(&db, mine, "succeeded", Duration::from_secs(5));
    // More polls and a notification for "b" go by; its job is never touched.
    let another_b = app.job("q").queue("b").defer(&()).unwrap();
    let mine2 = app.job("q").queue("a").defer(&()).unwrap();
    wait_status(&db, mine2, "succeeded", Duration::from_secs(5));
    stop(handle);
    let mut client = db.client();
    for id in [other, another_b] {
        let row = job_row(&mut client, id).unwrap();
        assert_eq!(
            (row.status.as_str(), row.attempts, row.worker_id),
            ("todo", 0, None),
            "job of queue b: {row:?}"
        );
    }
    assert_eq!(*queues.lock().unwrap(), vec!["a", "a"]);
}

#[test]
fn with_only_registered_tasks_off_a_job_of_an_unknown_task_fails_with_an_error_naming_it() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.register("known", |_job: &Job| Ok(()));
    let id = app.defer("no_such_task", &1).unwrap();
    let handle = fast_worker(&app, tasks)
        .only_registered_tasks(false)
        .spawn()
        .unwrap();
    let row = wait_status(&db, id, "failed", Duration::from_secs(5));
    stop(handle);
    assert_eq!(row.attempts, 1);
    let errors = row.error_texts();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("\"no_such_task\"") && errors[0].contains("not registered"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].contains("known"),
        "lists the known tasks: {}",
        errors[0]
    );
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Point {
    x: i64,
    y: i64,
}

#[test]
fn arguments_that_do_not_deserialize_fail_the_job_naming_task_and_type() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    tasks
        .register("plot", |job: &Job| {
            let _p: Point = job.args()?;
            Ok(())
        })
        // Bad arguments do not get better: no retry, whatever the strategy.
        .retry(RetryStrategy::fixed(Duration::from_millis(10), 3));
    let bad = app.defer("plot", "not a point").unwrap();
    let good = app
        .defer("plot", &serde_json::json!({"x": 1, "y": 2}))
        .unwrap();
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let row = wait_status(&db, bad, "failed", Duration::from_secs(5));
    wait_status(&db, good, "succeeded", Duration::from_secs(5));
    stop(handle);
    assert_eq!(row.attempts, 1, "no retry for bad arguments");
    let e = &row.error_texts()[0];
    assert!(e.contains("\"plot\""), "names the task: {e}");
    assert!(e.contains("Point"), "names the type: {e}");
}

#[test]
fn a_panicking_task_fails_its_job_and_the_thread_runs_the_next() {
    let (db, app) = setup();
    let threads = Arc::new(Mutex::new(Vec::<(String, ThreadId)>::new()));
    let mut tasks = Tasks::new();
    {
        let threads = threads.clone();
        tasks.register("boom", move |job: &Job| {
            threads
                .lock()
                .unwrap()
                .push(("boom".into(), thread::current().id()));
            let n: u32 = job.args()?;
            panic!("kaboom {n}");
        });
    }
    {
        let threads = threads.clone();
        tasks.register("fine", move |_job: &Job| {
            threads
                .lock()
                .unwrap()
                .push(("fine".into(), thread::current().id()));
            Ok(())
        });
    }
    let boom = app.defer("boom", &42).unwrap();
    let fine = app.defer("fine", &()).unwrap();
    let boom2 = app.defer("boom", &43).unwrap();
    let fine2 = app.defer("fine", &()).unwrap();
    let handle = fast_worker(&app, tasks)
        .concurrency(1)
        .prefetch(0)
        .spawn()
        .unwrap();
    let row = wait_status(&db, boom, "failed", Duration::from_secs(5));
    wait_status(&db, fine, "succeeded", Duration::from_secs(5));
    let row2 = wait_status(&db, boom2, "failed", Duration::from_secs(5));
    wait_status(&db, fine2, "succeeded", Duration::from_secs(5));
    let stats = handle.stats();
    stop(handle);
    assert!(
        row.error_texts()[0].contains("kaboom 42"),
        "{:?}",
        row.errors
    );
    assert!(row2.error_texts()[0].contains("kaboom 43"));
    let threads = threads.lock().unwrap();
    let names: Vec<&str> = threads.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["boom", "fine", "boom", "fine"]);
    let ids: HashSet<ThreadId> = threads.iter().map(|(_, t)| *t).collect();
    assert_eq!(ids.len(), 1, "one executor thread ran every job");
    assert_eq!((stats.failed, stats.succeeded), (2, 2));
}

#[test]
fn fixed_retries_run_every_attempt_after_the_delay() {
    let (db, app) = setup();
    let starts = Arc::new(Mutex::new(Vec::<(u32, Instant)>::new()));
    let mut tasks = Tasks::new();
    {
        let starts = starts.clone();
        tasks
            .register("flaky", move |job: &Job| {
                starts
                    .lock()
                    .unwrap()
                    .push((job.attempts(), Instant::now()));
                Err(std::io::Error::other(format!("flake {}", job.attempts())).into())
            })
            .retry(RetryStrategy::fixed(Duration::from_millis(200), 3));
    }
    let id = app.defer("flaky", &()).unwrap();
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let row = wait_status(&db, id, "failed", Duration::from_secs(10));
    let stats = handle.stats();
    stop(handle);
    assert_eq!(row.attempts, 3);
    assert_eq!(row.error_texts(), ["flake 1", "flake 2", "flake 3"]);
    let attempts: Vec<i64> = row
        .errors
        .iter()
        .map(|e| e["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!((stats.retried, stats.failed), (2, 1));

    // The database's own record of each failure: at least 200 ms apart.
    let at = error_times(&db, id);
    assert_eq!(at.len(), 3);
    for w in at.windows(2) {
        let gap = w[1] - w[0];
        assert!(gap >= 0.2, "failures recorded {gap:.3} s apart: {at:?}");
        assert!(gap < 1.5, "retry came {gap:.3} s later (poll 100 ms)");
    }
    // And as the task saw its starts.
    let starts = starts.lock().unwrap();
    assert_eq!(
        starts.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    for w in starts.windows(2) {
        let gap = w[1].1 - w[0].1;
        report_figure("fixed(200 ms) retry gap between starts", gap);
        assert!(gap >= Duration::from_millis(200), "{gap:?}");
        assert!(gap < Duration::from_millis(1500), "{gap:?}");
    }
}

#[test]
fn task_errors_retry_in_cancel_and_fail() {
    let (db, app) = setup();
    let starts = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let mut tasks = Tasks::new();
    let strategy = RetryStrategy::fixed(Duration::from_secs(5), 3);
    {
        let starts = starts.clone();
        tasks
            .register("later", move |job: &Job| {
                starts.lock().unwrap().push(Instant::now());
                if job.attempts() == 1 {
                    Err(TaskError::retry_in(
                        "busy, later",
                        Duration::from_millis(300),
                    ))
                } else {
                    Ok(())
                }
            })
            .retry(strategy.clone());
    }
    tasks
        .register("cancel", |_job: &Job| Err(TaskError::cancel("not needed")))
        .retry(strategy.clone());
    tasks
        .register("fail", |_job: &Job| Err(TaskError::fail("bad input")))
        .retry(strategy.clone());
    // The default strategy allows one attempt: an explicit retry fails the job.
    tasks.register("once", |_job: &Job| Err(TaskError::retry("again")));
    let later = app.defer("later", &()).unwrap();
    let cancel = app.defer("cancel", &()).unwrap();
    let fail = app.defer("fail", &()).unwrap();
    let once = app.defer("once", &()).unwrap();
    let handle = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();

    let row = wait_status(&db, later, "succeeded", Duration::from_secs(4));
    assert_eq!(row.attempts, 2);
    assert_eq!(row.error_texts(), ["busy, later"]);
    let starts = starts.lock().unwrap().clone();
    let gap = starts[1] - starts[0];
    assert!(
        gap >= Duration::from_millis(300) && gap < Duration::from_secs(3),
        "retry_in(300 ms) came after {gap:?} (the strategy's own delay is 5 s)"
    );

    let row = wait_status(&db, cancel, "cancelled", Duration::from_secs(5));
    assert_eq!(
        (row.attempts, row.error_texts()),
        (1, vec!["not needed".into()])
    );
    let row = wait_status(&db, fail, "failed", Duration::from_secs(5));
    assert_eq!(
        (row.attempts, row.error_texts()),
        (1, vec!["bad input".into()])
    );
    let row = wait_status(&db, once, "failed", Duration::from_secs(5));
    assert_eq!(row.attempts, 1);
    assert!(
        row.error_texts()[0].starts_with("again") && row.error_texts()[0].contains("last"),
        "{:?}",
        row.errors
    );
    stop(handle);
}

#[test]
fn a_task_timeout_makes_should_abort_true() {
    let (db, app) = setup();
    let (tx, rx) = unbounded::<(Duration, bool)>();
    let mut tasks = Tasks::new();
    tasks
        .register("slow", move |job: &Job| {
            let t0 = Instant::now();
            assert!(!job.should_abort(), "should_abort is false at the start");
            while !job.should_abort() && t0.elapsed() < Duration::from_secs(10) {
                thread::sleep(Duration::from_millis(5));
            }
            tx.send((t0.elapsed(), job.abort_requested())).unwrap();
            if job.should_abort() {
                Err(TaskError::fail("gave up: timed out"))
            } else {
                Ok(())
            }
        })
        .timeout(Duration::from_millis(300));
    let id = app.defer("slow", &()).unwrap();
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let (ran, requested) = rx.recv_timeout(Duration::from_secs(12)).unwrap();
    report_figure("should_abort() after a 300 ms task timeout", ran);
    assert!(ran >= Duration::from_millis(300), "{ran:?}");
    assert!(ran < Duration::from_millis(1500), "{ran:?}");
    assert!(!requested, "a timeout is not an abort request");
    let row = wait_status(&db, id, "failed", Duration::from_secs(5));
    assert_eq!(row.error_texts(), ["gave up: timed out"]);
    stop(handle);
}

fn ok_and_bad_tasks() -> Tasks {
    let mut tasks = Tasks::new();
    tasks.register("ok", |_job: &Job| Ok(()));
    tasks.register("bad", |_job: &Job| Err(TaskError::fail("no")));
    tasks
}

#[test]
fn delete_successful_keeps_only_unsuccessful_rows() {
    let (db, app) = setup();
    let ok = app.defer("ok", &()).unwrap();
    let bad = app.defer("bad", &()).unwrap();
    let handle = fast_worker(&app, ok_and_bad_tasks())
        .delete_finished(DeleteJobs::Successful)
        .spawn()
        .unwrap();
    wait_status(&db, bad, "failed", Duration::from_secs(5));
    let mut client = db.client();
    assert!(wait_until(Duration::from_secs(5), || job_row(
        &mut client,
        ok
    )
    .is_none()));
    let stats = handle.stats();
    stop(handle);
    assert_eq!((stats.succeeded, stats.failed), (1, 1));
    assert_eq!(all_jobs(&mut client).len(), 1);
}

#[test]
fn delete_always_removes_every_finished_row() {
    let (db, app) = setup();
    app.defer("ok", &()).unwrap();
    app.defer("bad", &()).unwrap();
    let handle = fast_worker(&app, ok_and_bad_tasks())
        .delete_finished(DeleteJobs::Always)
        .spawn()
        .unwrap();
    let mut client = db.client();
    assert!(wait_until(Duration::from_secs(5), || {
        let s = handle.stats();
        s.succeeded == 1 && s.failed == 1 && all_jobs(&mut client).is_empty()
    }));
    stop(handle);
}

#[test]
fn by_default_jobs_of_unknown_tasks_are_left_waiting() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.register("known", |_job: &Job| Ok(()));
    let stranger = app.defer("stranger", &()).unwrap();
    let known = app.defer("known", &()).unwrap();
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    wait_status(&db, known, "succeeded", Duration::from_secs(5));
    let known2 = app.defer("known", &()).unwrap();
    wait_status(&db, known2, "succeeded", Duration::from_secs(5));
    stop(handle);
    let row = job_row(&mut db.client(), stranger).unwrap();
    assert_eq!(
        (row.status.as_str(), row.attempts, row.worker_id),
        ("todo", 0, None),
        "{row:?}"
    );
}

#[test]
fn listen_wakes_an_idle_worker_well_before_the_poll_interval() {
    let (db, app) = setup();
    let (tx, rx) = unbounded::<Instant>();
    let mut tasks = Tasks::new();
    tasks.register("ping", move |_job: &Job| {
        tx.send(Instant::now()).unwrap();
        Ok(())
    });
    let handle = fast_worker(&app, tasks)
        .poll_interval(Duration::from_secs(10))
        .listen_ping_interval(Duration::from_secs(30))
        .spawn()
        .unwrap();
    // The listener is parked in LISTEN, the fetcher idle for 10 s.
    assert!(wait_until(Duration::from_secs(5), || listening_backends(
        &db
    ) == 1));
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let t0 = Instant::now();
        let id = app.defer("ping", &()).unwrap();
        let started = rx.recv_timeout(Duration::from_secs(12)).unwrap();
        let latency = started - t0;
        report_figure("LISTEN wake-up, defer to start (poll 10 s)", latency);
        worst = worst.max(latency);
        wait_status(&db, id, "succeeded", Duration::from_secs(5));
    }
    stop(handle);
    assert!(
        worst < Duration::from_secs(1),
        "a deferred job waited {worst:?} to start on an idle listening worker"
    );
}

#[test]
fn without_listen_polling_still_runs_jobs() {
    let (db, app) = setup();
    let (tx, rx) = bounded::<Instant>(4);
    let mut tasks = Tasks::new();
    tasks.register("ping", move |_job: &Job| {
        tx.send(Instant::now()).unwrap();
        Ok(())
    });
    let handle = fast_worker(&app, tasks)
        .listen(false)
        .poll_interval(Duration::from_millis(300))
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let id = app.defer("ping", &()).unwrap();
    let started = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    report_figure("listen(false), defer to start (poll 300 ms)", started - t0);
    assert!(started - t0 < Duration::from_secs(2));
    wait_status(&db, id, "succeeded", Duration::from_secs(5));
    assert_eq!(listening_backends(&db), 0, "listen(false) must not LISTEN");
    stop(handle);
}

/// Requests the abort of a running job the way the schema documents it: the flag on the row
/// and an `abort:<id>` notification (there is no public abort call yet).
fn request_abort(db: &TestDb, id: JobId, notify: bool) {
    let mut client = db.client();
    client
        .execute(
            "UPDATE postpone_jobs SET abort_requested = true WHERE id = $1",
            &[&id.0],
        )
        .unwrap();
    if notify {
        client
            .execute(
                "SELECT pg_notify('postpone', 'abort:' || $1::bigint)",
                &[&id.0],
            )
            .unwrap();
    }
}

type AbortSeen = (i64, bool, Instant);

fn abort_tasks() -> (
    Tasks,
    crossbeam_channel::Receiver<i64>,
    crossbeam_channel::Receiver<AbortSeen>,
) {
    let (started_tx, started_rx) = unbounded::<i64>();
    let (saw_tx, saw_rx) = unbounded::<AbortSeen>();
    let mut tasks = Tasks::new();
    tasks.register("long", move |job: &Job| {
        started_tx.send(job.id().0).unwrap();
        let t0 = Instant::now();
        while !job.should_abort() && t0.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(5));
        }
        saw_tx
            .send((job.id().0, job.abort_requested(), Instant::now()))
            .unwrap();
        Err(TaskError::fail("stopped on request"))
    });
    (tasks, started_rx, saw_rx)
}

#[test]
fn an_abort_request_reaches_the_running_task_by_notification_or_by_polling() {
    let (db, app) = setup();
    for (listen, within) in [
        (true, Duration::from_millis(500)),
        (false, Duration::from_secs(3)),
    ] {
        let (tasks, started, saw) = abort_tasks();
        let handle = fast_worker(&app, tasks).listen(listen).spawn().unwrap();
        let id = app.defer("long", &()).unwrap();
        assert_eq!(started.recv_timeout(Duration::from_secs(5)).unwrap(), id.0);
        let t0 = Instant::now();
        // With listen(false) nothing is notified: the beat's abort poll must find it.
        request_abort(&db, id, listen);
        let (seen, requested, at) = saw.recv_timeout(Duration::from_secs(12)).unwrap();
        let took = at - t0;
        report_figure(
            &format!("abort request seen by the task (listen {listen})"),
            took,
        );
        assert_eq!(seen, id.0);
        assert!(requested, "abort_requested() is true");
        assert!(took < within, "{took:?}");
        let row = wait_status(&db, id, "aborted", Duration::from_secs(5));
        assert!(
            row.error_texts()[0].contains("aborted on request"),
            "{:?}",
            row.errors
        );
        let report = handle.shutdown(SHUTDOWN);
        assert!(report.is_clean(), "{report}");
    }
}

#[test]
fn two_workers_on_one_queue_never_run_a_job_twice_nor_overlap_a_lock() {
    let (db, app) = setup();
    let runs = Arc::new(Mutex::new(Vec::<i64>::new()));
    let lock_order = Arc::new(Mutex::new(Vec::<u32>::new()));
    let active = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let make_tasks = || {
        let mut tasks = Tasks::new();
        let r = runs.clone();
        tasks.register("plain", move |job: &Job| {
            r.lock().unwrap().push(job.id().0);
            thread::sleep(Duration::from_millis(2));
            Ok(())
        });
        let (r, order, active, overlaps) = (
            runs.clone(),
            lock_order.clone(),
            active.clone(),
            overlaps.clone(),
        );
        tasks.register("locked", move |job: &Job| {
            r.lock().unwrap().push(job.id().0);
            if active.fetch_add(1, Ordering::SeqCst) > 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            order.lock().unwrap().push(job.args()?);
            thread::sleep(Duration::from_millis(10));
            active.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        });
        tasks
    };
    let w1 = fast_worker(&app, make_tasks())
        .concurrency(2)
        .spawn()
        .unwrap();
    let w2 = fast_worker(&app, make_tasks())
        .concurrency(2)
        .spawn()
        .unwrap();
    let mut jobs = Vec::new();
    for i in 0..300u32 {
        jobs.push(if i % 10 == 0 {
            postpone::NewJob::new("locked", &(i / 10))
                .unwrap()
                .lock("L")
        } else {
            postpone::NewJob::new("plain", &i).unwrap()
        });
    }
    app.defer_batch(&jobs).unwrap();
    let mut client = db.client();
    assert!(wait_until(Duration::from_secs(30), || all_jobs(
        &mut client
    )
    .iter()
    .all(|r| r.status == "succeeded")));
    let (s1, s2) = (w1.stats(), w2.stats());
    stop(w1);
    stop(w2);
    let runs = runs.lock().unwrap();
    let distinct: HashSet<i64> = runs.iter().copied().collect();
    assert_eq!(runs.len(), 300, "runs");
    assert_eq!(distinct.len(), 300, "every job ran exactly once");
    assert!(
        s1.claimed > 0 && s2.claimed > 0,
        "both worked: {s1:?} {s2:?}"
    );
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "a lock's jobs overlapped"
    );
    assert_eq!(*lock_order.lock().unwrap(), (0..30).collect::<Vec<u32>>());
}

/// The fetcher claims again as soon as the executors have started every job it claimed, not
/// only once the completer has recorded their outcomes: with the first recording held up for
/// 3 s (a trigger sleeps in it), a worker of one thread and a prefetch of 10 starts its second
/// batch of 11 jobs at once. Before, the fetcher waited for the completer's wake-up, and the
/// second batch started after the 3 s.
#[test]
fn the_next_claim_does_not_wait_for_the_last_outcomes_to_be_recorded() {
    let (db, app) = setup();
    db.client()
        .batch_execute(
            "CREATE TABLE slow_once (x int);
             INSERT INTO slow_once VALUES (1);
             CREATE FUNCTION slow_first_recording() RETURNS trigger LANGUAGE plpgsql AS $$
             DECLARE v int;
             BEGIN
                 DELETE FROM slow_once RETURNING x INTO v;
                 IF v IS NOT NULL THEN
                     PERFORM pg_sleep(3);
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER slow_first_recording BEFORE UPDATE ON postpone_jobs
                 FOR EACH ROW WHEN (OLD.status = 'doing' AND NEW.status = 'succeeded')
                 EXECUTE FUNCTION slow_first_recording();",
        )
        .unwrap();
    let batch: Vec<postpone::NewJob> = (0..40)
        .map(|i| postpone::NewJob::new("count", &i).unwrap())
        .collect();
    app.defer_batch(&batch).unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Tasks::new();
    let seen = started.clone();
    tasks.register("count", move |_: &Job| {
        seen.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let t0 = Instant::now();
    let handle = fast_worker(&app, tasks)
        .concurrency(1)
        .prefetch(10)
        .outcomes_ride_claims(false)
        .spawn()
        .unwrap();
    let second_batch = wait_until(Duration::from_secs(2), || {
        started.load(Ordering::SeqCst) >= 22
    });
    let after = t0.elapsed();
    let n = started.load(Ordering::SeqCst);
    assert!(
        second_batch,
        "{n} jobs started in {after:?} while the first recording was held up: the fetcher \
         waited for the completer"
    );
    // Everything is recorded once the trigger's sleep is over.
    assert!(wait_until(Duration::from_secs(20), || {
        db.client()
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 40
    }));
    stop(handle);
}

/// Jobs handed out together reach every thread at once, however the hand-off wakes them:
/// eight jobs that each wait until all eight have started can only succeed if eight threads
/// run them side by side.
#[test]
fn a_claim_of_long_jobs_runs_on_every_thread_at_once() {
    let (db, app) = setup();
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Tasks::new();
    {
        let started = started.clone();
        tasks.register("together", move |_job: &Job| {
            started.fetch_add(1, Ordering::SeqCst);
            if wait_until(Duration::from_secs(5), || {
                started.load(Ordering::SeqCst) >= 8
            }) {
                Ok(())
            } else {
                Err(TaskError::fail(format!(
                    "only {} of 8 jobs started together",
                    started.load(Ordering::SeqCst)
                )))
            }
        });
    }
    // Deferred in one statement before the worker starts, so that its first claim takes all.
    let jobs: Vec<_> = (0..8)
        .map(|_| postpone::NewJob::new("together", &()).unwrap())
        .collect();
    let ids = app.defer_batch(&jobs).unwrap();
    let handle = fast_worker(&app, tasks).concurrency(8).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        let s = handle.stats();
        s.succeeded + s.failed == 8
    }));
    let stats = handle.stats();
    stop(handle);
    assert_eq!(
        stats.failed, 0,
        "a job waited for a thread while others slept"
    );
    let mut client = db.client();
    for id in ids {
        assert_eq!(job_row(&mut client, id).unwrap().status, "succeeded");
    }
}
