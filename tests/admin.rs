//! The admin API end to end against PostgreSQL: cancel, abort (with and without NOTIFY),
//! retry, listing and counts, workers and stalled jobs, retention (admin call and worker
//! option), and the job hook's view of an abort.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded};
use postpone::{
    AbortOutcome, App, BulkAction, ErrorKind, Job, JobEvent, JobEventKind, JobFilter, JobId,
    JobSort, JobStatus, Retention, StatsBy, TaskError, Tasks, Worker, WorkerHandle,
};
use serde_json::json;
use support::*;

const DAY: Duration = Duration::from_secs(86_400);

fn app(db: &TestDb) -> App {
    let app = App::builder(db.url())
        .pool_size(3)
        .io_timeout(Duration::from_secs(5))
        .build()
        .expect("app");
    app.migrate().expect("migrate");
    app
}

fn spawn(app: &App, tasks: Tasks, listen: bool) -> postpone::WorkerBuilder {
    Worker::builder(app, tasks)
        .concurrency(2)
        .poll_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(200))
        .stalled_after(Duration::from_secs(2))
        .listen(listen)
}

fn stop(h: WorkerHandle) {
    let r = h.shutdown(Duration::from_secs(5));
    assert!(r.is_clean(), "{r}");
}

fn status(app: &App, id: JobId) -> JobStatus {
    app.admin().job(id).expect("job").job.status
}

#[test]
fn cancel_retry_and_their_errors() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();

    // A waiting job is cancelled, and stays so.
    let later = app
        .job("work")
        .schedule_in(Duration::from_secs(3600))
        .defer(&json!({"n": 1}))
        .unwrap();
    admin.cancel(later).unwrap();
    let d = admin.job(later).unwrap();
    assert_eq!(d.job.status, JobStatus::Cancelled);
    assert!(d.job.finished_at.is_some());
    let e = admin.cancel(later).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    assert!(e.to_string().contains("it is cancelled"), "{e}");

    // Missing ids are NotFound for every operation.
    let missing = JobId(987_654);
    for e in [
        admin.cancel(missing).unwrap_err(),
        admin.cancel_and_delete(missing).unwrap_err(),
        admin.retry(missing).unwrap_err(),
        admin.abort(missing).unwrap_err(),
        admin.job(missing).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert_eq!(e.to_string(), "job 987654 not found");
    }

    // Cancel and delete removes the row.
    let doomed = app.job("work").schedule_in(DAY).defer(&1).unwrap();
    admin.cancel_and_delete(doomed).unwrap();
    assert_eq!(admin.job(doomed).unwrap_err().kind(), ErrorKind::NotFound);

    // A waiting job cannot be retried.
    let waiting = app.job("work").schedule_in(DAY).defer(&2).unwrap();
    let e = admin.retry(waiting).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState);
    assert!(e.to_string().contains("it is todo"), "{e}");

    // The cancelled job is retried: it runs, with its attempts counted from zero.
    let (ran_tx, ran_rx) = unbounded();
    let mut tasks = Tasks::new();
    tasks.register("work", move |job: &Job| -> Result<(), TaskError> {
        let _ = ran_tx.send((job.id(), job.attempts()));
        Ok(())
    });
    let h = spawn(&app, tasks, true).spawn().unwrap();
    admin.retry(later).unwrap();
    let (id, attempt) = ran_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("retried job ran");
    assert_eq!((id, attempt), (later, 1));
    assert!(wait_until(Duration::from_secs(5), || status(&app, later)
        == JobStatus::Succeeded));
    // A succeeded job cannot be retried, cancelled or aborted.
    for e in [
        admin.retry(later).unwrap_err(),
        admin.cancel(later).unwrap_err(),
        admin.abort(later).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
        assert!(e.to_string().contains("it is succeeded"), "{e}");
    }
    stop(h);
}

/// A running job is aborted: its task sees `should_abort()` quickly, returns Ok, and the
/// job still ends `aborted`; the hook saw it start and end aborted.
fn abort_running_job(listen: bool) -> Duration {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();
    let (started_tx, started_rx) = bounded(1);
    let (seen_tx, seen_rx) = bounded(1);
    let mut tasks = Tasks::new();
    tasks.register("long", move |job: &Job| -> Result<(), TaskError> {
        let _ = started_tx.send(job.id());
        let deadline = Instant::now() + Duration::from_secs(15);
        while !job.should_abort() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = seen_tx.send((Instant::now(), job.abort_requested()));
        Ok(())
    });
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let h = spawn(&app, tasks, listen)
        .hook(move |e: &JobEvent<'_>| {
            ev.lock()
                .unwrap()
                .push((e.kind, e.job_id, e.duration, e.worker.to_owned()));
        })
        .spawn()
        .unwrap();
    let id = app.defer("long", &json!(null)).unwrap();
    assert_eq!(started_rx.recv_timeout(Duration::from_secs(5)), Ok(id));
    // Running for the table once its start is written (5 ms after the task began, later on
    // a loaded machine): until then it is held, and a cancel may still stop it.
    assert!(wait_until(Duration::from_secs(30), || status(&app, id)
        == JobStatus::Doing));

    // Cannot cancel a running job: abort it.
    let e = admin.cancel(id).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState);
    assert!(e.to_string().contains("it is doing"), "{e}");
    let asked = Instant::now();
    assert_eq!(admin.abort(id).unwrap(), AbortOutcome::Requested);
    let (seen, requested) = seen_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the task saw should_abort()");
    let latency = seen.duration_since(asked);
    assert!(requested, "job.abort_requested() is true");
    assert!(wait_until(Duration::from_secs(5), || status(&app, id)
        == JobStatus::Aborted));
    let d = admin.job(id).unwrap();
    assert!(d.job.abort_requested);
    assert!(
        d.errors
            .iter()
            .any(|e| e.error.contains("aborted on request")),
        "{:?}",
        d.errors
    );
    stop(h);
    let events = events.lock().unwrap();
    let kinds: Vec<JobEventKind> = events.iter().map(|e| e.0).collect();
    assert_eq!(kinds, vec![JobEventKind::Started, JobEventKind::Aborted]);
    assert!(events.iter().all(|e| e.1 == id && !e.3.is_empty()));
    assert!(events[1].2 >= latency.min(Duration::from_millis(1)));

    // A waiting job asked to abort is cancelled.
    let waiting = app.job("long").schedule_in(DAY).defer(&0).unwrap();
    assert_eq!(admin.abort(waiting).unwrap(), AbortOutcome::Cancelled);
    assert_eq!(status(&app, waiting), JobStatus::Cancelled);
    latency
}

#[test]
fn abort_reaches_the_task_by_notify() {
    let latency = abort_running_job(true);
    assert!(latency < Duration::from_millis(500), "{latency:?}");
}

#[test]
fn abort_reaches_the_task_by_polling_when_notify_is_off() {
    let latency = abort_running_job(false);
    assert!(latency < Duration::from_secs(1), "{latency:?}");
}

#[test]
fn listing_counts_workers_and_stalled_jobs() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();
    assert!(admin.jobs(&JobFilter::new()).unwrap().is_empty());
    assert!(admin.counts().unwrap().is_empty());

    let a1 = app
        .job("mail")
        .queue("emails")
        .lock("u1")
        .defer(&json!({"to": "a"}))
        .unwrap();
    let a2 = app
        .job("mail")
        .queue("emails")
        .queueing_lock("welcome")
        .schedule_in(DAY)
        .defer(&json!({"to": "b"}))
        .unwrap();
    let b1 = app
        .job("resize")
        .queue("images")
        .priority(5)
        .defer(&[1, 2])
        .unwrap();
    admin.cancel(b1).unwrap();

    let all = admin.jobs(&JobFilter::new()).unwrap();
    assert_eq!(
        all.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![b1, a2, a1]
    );
    let ids = |f: JobFilter| -> Vec<JobId> {
        admin.jobs(&f).unwrap().into_iter().map(|j| j.id).collect()
    };
    assert_eq!(ids(JobFilter::new().queue("emails")), vec![a2, a1]);
    assert_eq!(ids(JobFilter::new().task("resize")), vec![b1]);
    assert_eq!(ids(JobFilter::new().status(JobStatus::Cancelled)), vec![b1]);
    assert_eq!(
        ids(JobFilter::new()
            .status(JobStatus::Cancelled)
            .status(JobStatus::Todo)),
        vec![b1, a2, a1]
    );
    assert_eq!(ids(JobFilter::new().lock("u1")), vec![a1]);
    assert_eq!(ids(JobFilter::new().queueing_lock("welcome")), vec![a2]);
    assert_eq!(ids(JobFilter::new().id(a2)), vec![a2]);
    assert_eq!(ids(JobFilter::new().limit(1)), vec![b1]);
    assert_eq!(ids(JobFilter::new().queue("emails").task("resize")), vec![]);
    let e = admin.jobs(&JobFilter::new().limit(0)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let j = &admin.jobs(&JobFilter::new().id(b1)).unwrap()[0];
    assert_eq!(
        (j.queue.as_str(), j.task.as_str(), j.priority, j.args.get()),
        ("images", "resize", 5, "[1,2]")
    );

    let counts = admin.counts().unwrap();
    assert_eq!(counts.len(), 2);
    assert_eq!(counts[0].queue, "emails");
    assert_eq!((counts[0].todo, counts[0].scheduled), (1, 1));
    assert!(counts[0].oldest_todo_age.is_some());
    assert_eq!(counts[1].queue, "images");
    assert_eq!((counts[1].todo, counts[1].cancelled), (0, 1));
    assert_eq!(counts[1].oldest_todo_age, None);

    // A job held by a worker whose heartbeat is old is stalled; a fresh one is not.
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES (900, 'ghost', now() - interval '1 hour');
         UPDATE postpone_jobs SET status = 'doing', worker_id = 900, attempts = 1, started_at = now() WHERE queue = 'emails' AND lock = 'u1';",
    )
    .unwrap();
    let stalled = admin.stalled_jobs(Duration::from_secs(60)).unwrap();
    assert_eq!(stalled.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a1]);
    assert!(admin
        .stalled_jobs(Duration::from_secs(7200))
        .unwrap()
        .is_empty());
    let workers = admin.workers().unwrap();
    assert_eq!(workers.len(), 1);
    assert_eq!((workers[0].name.as_str(), workers[0].claimed), ("ghost", 1));
    assert!(workers[0].stale);
    assert!(workers[0].heartbeat_age >= Duration::from_secs(3500));
    let d = admin.job(a1).unwrap();
    assert_eq!(d.worker_name.as_deref(), Some("ghost"));
    c.batch_execute("DELETE FROM postpone_workers; UPDATE postpone_jobs SET status = 'todo', worker_id = NULL, attempts = 0 WHERE id = (SELECT min(id) FROM postpone_jobs)").unwrap();

    // A live worker shows up with a fresh heartbeat; its failing job records its error.
    let mut tasks = Tasks::new();
    tasks.register("mail", |_job: &Job| -> Result<(), TaskError> {
        Err(TaskError::fail("smtp said no"))
    });
    let h = spawn(&app, tasks, true)
        .name("mailer-1")
        .queues(["emails"])
        .spawn()
        .unwrap();
    let workers = admin.workers().unwrap();
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].name, "mailer-1");
    assert_eq!(
        workers[0].queues.as_deref(),
        Some(&["emails".to_owned()][..])
    );
    assert!(workers[0].heartbeat_age < Duration::from_secs(5));
    assert!(wait_until(Duration::from_secs(5), || status(&app, a1)
        == JobStatus::Failed));
    let d = admin.job(a1).unwrap();
    assert_eq!(d.job.attempts, 1);
    assert_eq!(d.errors.len(), 1);
    assert_eq!(d.errors[0].attempt, 1);
    assert_eq!(d.errors[0].error, "smtp said no");
    assert!(d.errors[0].at.is_some());
    stop(h);
    assert!(admin.workers().unwrap().is_empty());
}

#[test]
fn prune_deletes_old_finished_jobs_in_batches() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
         SELECT 'q', 'old', 'null', 'succeeded', now() - interval '10 days' FROM generate_series(1, 2500);
         INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
         SELECT 'q', 'old', 'null', 'failed', now() - interval '10 days' FROM generate_series(1, 10);
         INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
         SELECT 'q', 'recent', 'null', 'succeeded', now() - interval '1 hour' FROM generate_series(1, 5);
         INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
         SELECT 'q', 'waiting', 'null', now() - interval '30 days' FROM generate_series(1, 3);
         INSERT INTO postpone_periodic (task, instant)
         SELECT 'p', now() - interval '8 days' - g * interval '1 minute' FROM generate_series(1, 4) g;
         INSERT INTO postpone_periodic (task, instant)
         SELECT 'p', now() - g * interval '1 minute' FROM generate_series(1, 2) g;",
    )
    .unwrap();
    let count = |c: &mut postgres::Client, status: &str| -> i64 {
        c.query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = $1",
            &[&status],
        )
        .unwrap()
        .get(0)
    };

    let e = admin
        .prune(&Retention::new(DAY).statuses([JobStatus::Doing]))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");

    let r = admin
        .prune(
            &Retention::new(7 * DAY)
                .statuses([JobStatus::Succeeded])
                .batch_size(1000),
        )
        .unwrap();
    assert_eq!((r.jobs_deleted, r.periodic_deleted), (2500, 4));
    assert_eq!(count(&mut c, "succeeded"), 5);
    assert_eq!(count(&mut c, "failed"), 10);

    let r = admin.prune(&Retention::new(7 * DAY)).unwrap();
    assert_eq!((r.jobs_deleted, r.periodic_deleted), (10, 0));
    assert_eq!(count(&mut c, "failed"), 0);
    assert_eq!(count(&mut c, "succeeded"), 5);
    assert_eq!(count(&mut c, "todo"), 3, "waiting jobs are never pruned");
    // Records of recent periodic instants are kept even with a tiny age.
    let r = admin.prune(&Retention::new(Duration::ZERO)).unwrap();
    assert_eq!((r.jobs_deleted, r.periodic_deleted), (5, 0));

    // The worker option prunes on its interval.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
         SELECT 'q', 'old', 'null', 'cancelled', now() - interval '2 days' FROM generate_series(1, 30);",
    )
    .unwrap();
    let mut tasks = Tasks::new();
    tasks.register("other", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
    let h = spawn(&app, tasks, true)
        .only_registered_tasks(true)
        .retention(
            Retention::new(DAY)
                .interval(Duration::from_millis(100))
                .batch_size(7),
        )
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || count(
        &mut c,
        "cancelled"
    ) == 0));
    assert_eq!(count(&mut c, "todo"), 3);
    stop(h);

    // A bad retention is refused when the worker is built.
    let mut tasks = Tasks::new();
    tasks.register("other", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
    let e = spawn(&app, tasks, true)
        .retention(Retention::new(DAY).statuses([JobStatus::Todo]))
        .spawn()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(
        e.to_string().contains("invalid retention status todo"),
        "{e}"
    );
}

#[test]
fn check_schema_tells_missing_from_current() {
    let db = TestDb::new();
    let app = App::connect(&db.url()).unwrap();
    let e = app.admin().check_schema().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaMissing, "{e}");
    app.migrate().unwrap();
    assert_eq!(
        app.admin().check_schema().unwrap(),
        postpone::SCHEMA_VERSION
    );
    let st = app.admin().schema_state().unwrap();
    assert_eq!(
        (st.installed, st.supported, st.unrecorded_tables),
        (
            Some(postpone::SCHEMA_VERSION),
            postpone::SCHEMA_VERSION,
            false
        )
    );
}

/// Rolling upgrade: a newer schema is refused by the admin API (with both versions) while
/// the library keeps deferring and working on it.
#[test]
fn a_newer_schema_is_refused_by_admin_but_not_by_the_library() {
    let db = TestDb::new();
    let app = app(&db);
    let next = postpone::SCHEMA_VERSION + 1;
    db.client()
        .execute(
            "INSERT INTO postpone_migrations (version, name) VALUES ($1, 'next')",
            &[&next],
        )
        .unwrap();
    let admin = app.admin();
    let e = admin.check_schema().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaNewer, "{e}");
    assert!(
        e.to_string().contains(&format!(
            "version {next}, newer than this postpone (version {})",
            postpone::SCHEMA_VERSION
        )),
        "{e}"
    );
    let e = admin.migrate(Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaNewer, "{e}");
    assert_eq!(
        admin.migration_sql().unwrap_err().kind(),
        ErrorKind::SchemaNewer
    );
    let fresh = App::connect(&db.url()).unwrap();
    let id = fresh.defer("still_works", &json!(1)).unwrap();
    assert_eq!(fresh.admin().job(id).unwrap().job.task, "still_works");
}

#[test]
fn migrate_gives_up_after_its_timeout_behind_the_migration_lock() {
    let db = TestDb::new();
    let app = App::connect(&db.url()).unwrap();
    let mut holder = db.client();
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&0x706f_7374_706f_6e65_i64])
        .unwrap();
    let t = Instant::now();
    let e = app.admin().migrate(Duration::from_millis(500)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains("gave up after 500ms"), "{e}");
    drop(holder);
    // The pooled connection's timeouts were reset: a slow statement is not cut at 500 ms.
    let r = app.admin().migrate(Duration::from_secs(5)).unwrap();
    // Every migration from the first to the latest, in order (numbers may have gaps).
    assert_eq!(r.version, postpone::SCHEMA_VERSION);
    assert_eq!(r.applied.first(), Some(&1), "{:?}", r.applied);
    assert_eq!(
        r.applied.last(),
        Some(&postpone::SCHEMA_VERSION),
        "{:?}",
        r.applied
    );
    assert!(r.applied.windows(2).all(|w| w[0] < w[1]), "{:?}", r.applied);
    let mut conn = app.connection().unwrap();
    conn.batch_execute("SELECT pg_sleep(0.8)").unwrap();
}

/// Keyset pages: rows inserted while paging never shift or repeat the pages.
#[test]
fn pages_neither_repeat_nor_skip_while_jobs_are_inserted() {
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();
    for i in 0..25 {
        app.job("t").priority(i % 3).defer(&json!(i)).unwrap();
    }
    for (sort, desc) in [
        (JobSort::Id, true),
        (JobSort::Priority, true),
        (JobSort::Scheduled, false),
    ] {
        let mut f = JobFilter::new().sort(sort, desc).limit(4);
        let mut seen = Vec::new();
        loop {
            let page = admin.job_page(&f).unwrap();
            assert!(page.jobs.len() <= 4);
            seen.extend(page.jobs.iter().map(|j| j.id.get()));
            // Newer jobs arrive meanwhile; they sort outside the walked range for id desc.
            app.job("late")
                .priority(-1)
                .schedule_in(Duration::from_secs(3600))
                .defer(&json!(0))
                .unwrap();
            match page.next_cursor {
                Some(c) => f = f.after(c),
                None => break,
            }
        }
        let mut uniq = seen.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(
            uniq.len(),
            seen.len(),
            "{sort:?}: a job was listed twice: {seen:?}"
        );
        assert!((1..=25).all(|id| seen.contains(&id)), "{sort:?}: {seen:?}");
    }
}

/// A bulk retry ends, and retries each job at most once, even while a worker fails the
/// retried jobs again as fast as it can.
#[test]
fn bulk_retry_ends_while_a_worker_fails_jobs_again() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
             SELECT 'q', 'flaky', 'null', 'failed', now() FROM generate_series(1, 3000)",
        )
        .unwrap();
    let mut tasks = Tasks::new();
    tasks.register("flaky", |_job: &Job| -> Result<(), TaskError> {
        Err(TaskError::fail("again"))
    });
    let h = spawn(&app, tasks, true).concurrency(4).spawn().unwrap();
    let admin = app.admin();
    let f = JobFilter::new().status(JobStatus::Failed).task("flaky");
    let plan = admin.bulk(BulkAction::Retry, &f, true).unwrap();
    assert_eq!((plan.matched, plan.changed), (3000, 3000));
    let r = admin.bulk(BulkAction::Retry, &f, false).unwrap();
    assert_eq!(r.matched, 3000);
    assert!(r.changed <= 3000 && r.changed > 0, "{r:?}");
    let mut c = db.client();
    assert!(wait_until(Duration::from_secs(10), || {
        c.query_one(
            "SELECT count(*) FROM postpone_jobs WHERE errors IS NOT NULL",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
            > 0
    }));
    stop(h);
    // Each job was retried at most once: it failed (and recorded "again") at most once.
    let (max, total): (i32, i64) = {
        let r = db
            .client()
            .query_one(
                "SELECT max(jsonb_array_length(coalesce(errors, '[]'))),
                        sum(jsonb_array_length(coalesce(errors, '[]')))::bigint
                   FROM postpone_jobs",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(max <= 1, "a job was retried twice: {max} errors");
    assert!(total > 0, "the worker failed no retried job");
    let e = admin
        .bulk(BulkAction::Delete, &JobFilter::new().limit(5), false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("refusing to touch every job"), "{e}");
}

#[test]
fn stats_by_task_over_a_window_with_percentiles() {
    let db = TestDb::new();
    let app = app(&db);
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, started_at, finished_at)
             SELECT 'q', 'a', 'null', CASE WHEN i <= 90 THEN 'succeeded' ELSE 'failed' END,
                    now() - i * interval '1 s', now()
               FROM generate_series(1, 100) i;
             INSERT INTO postpone_jobs (queue, task, args, status, started_at, finished_at)
             VALUES ('q', 'a', 'null', 'failed', now() - interval '2 days 1 s',
                     now() - interval '2 days')",
        )
        .unwrap();
    let s = app
        .admin()
        .stats(StatsBy::Task, Some(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].queue.as_str(), s[0].succeeded, s[0].failed),
        ("a", 90, 10)
    );
    assert!((s[0].failure_rate.unwrap() - 0.1).abs() < 1e-9);
    let p50 = s[0].run_time_p50.unwrap().as_secs_f64();
    let p99 = s[0].run_time_p99.unwrap().as_secs_f64();
    assert!((p50 - 50.5).abs() < 0.5, "{p50}");
    assert!((p99 - 99.0).abs() < 0.5, "{p99}");
    let all = app.admin().stats(StatsBy::Queue, None).unwrap();
    assert_eq!(all[0].failed, 11);
}

/// An abort recorded while the job waits in the worker's prefetch queue (claimed, not
/// started) is not lost, and the job never starts: it ends aborted without running.
#[test]
fn abort_of_a_prefetched_job_ends_it_without_running_it() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let (release_tx, release_rx) = bounded::<()>(0);
    let (started_tx, started_rx) = unbounded::<JobId>();
    let (first_look_tx, first_look_rx) = unbounded::<bool>();
    let mut tasks = Tasks::new();
    let started = started_tx.clone();
    tasks.register("block", move |job: &Job| -> Result<(), TaskError> {
        started.send(job.id()).unwrap();
        release_rx.recv_timeout(Duration::from_secs(10)).ok();
        Ok(())
    });
    tasks.register("look", move |job: &Job| -> Result<(), TaskError> {
        first_look_tx.send(job.should_abort()).unwrap();
        Ok(())
    });
    let blocker = app.defer("block", &0).unwrap();
    let waiting = app.job("look").priority(-1).defer(&0).unwrap();
    // One thread, one job held ahead: "look" is claimed while "block" runs.
    let h = spawn(&app, tasks, true)
        .concurrency(1)
        .prefetch(1)
        .poll_interval(Duration::from_secs(10))
        .spawn()
        .unwrap();
    assert_eq!(started_rx.recv_timeout(Duration::from_secs(5)), Ok(blocker));
    // Held: claimed (`doing` in the table) but not started, so every view shows it waiting.
    assert!(
        wait_until(Duration::from_secs(5), || db
            .client()
            .query_one(
                "SELECT status = 'doing' AND started_at IS NULL FROM postpone_jobs WHERE id = $1",
                &[&waiting.get()],
            )
            .unwrap()
            .get::<_, bool>(0)),
        "the second job is claimed ahead"
    );
    assert_eq!(status(&app, waiting), JobStatus::Todo);
    assert_eq!(app.admin().abort(waiting).unwrap(), AbortOutcome::Requested);
    // Give the notification time to arrive while the job still waits.
    std::thread::sleep(Duration::from_millis(200));
    release_tx.send(()).unwrap();
    assert!(wait_until(Duration::from_secs(5), || status(&app, waiting)
        == JobStatus::Aborted));
    stop(h);
    assert!(
        first_look_rx.try_recv().is_err(),
        "the task of a job aborted before it started must never run"
    );
    let detail = app.admin().job(waiting).unwrap();
    assert!(
        detail
            .errors
            .iter()
            .any(|e| e.error.contains("aborted on request before it started")),
        "{:?}",
        detail.errors
    );
    assert_eq!(detail.job.attempts, 0, "it never started: no attempt used");
}
