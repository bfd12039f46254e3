//! Integrity (DESIGN.md promises 7, 8 and 9) against the real PostgreSQL: no input, outcome or
//! collision wedges the recording of outcomes, the rescue of dead workers' jobs or a
//! shutdown's cleanup; a notification is only a hint; abort requests survive every way back
//! to the queue; an outcome is recorded only for the attempt that produced it; a worker whose
//! outcomes cannot be recorded stops claiming.
//!
//! Each test reproduces one defect of the integrity issue: it failed before the fix.

use crate::support;
use crate::worker_util;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{ErrorKind, Job, JobId, RetryStrategy, TaskError, Tasks};
use support::{wait_until, FaultProxy, NewConns};
use worker_util::*;

/// After a hostile outcome, the worker still records the outcomes of ordinary jobs.
fn assert_still_recording(db: &support::TestDb, app: &postpone::App) {
    let ids: Vec<JobId> = (0..5).map(|i| app.defer("ok", &i).unwrap()).collect();
    for id in ids {
        wait_status(db, id, "succeeded", Duration::from_secs(10));
    }
}

#[test]
fn a_retry_whose_queueing_lock_is_taken_is_superseded_and_recording_goes_on() {
    let (db, app) = setup();
    let (started_tx, started_rx) = unbounded::<()>();
    let (release_tx, release_rx) = unbounded::<()>();
    let mut tasks = Tasks::new();
    ok_task(&mut tasks);
    tasks
        .register("flaky", move |_job: &Job| {
            started_tx.send(()).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(10));
            Err(TaskError::retry("try again"))
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 5));
    let first = app
        .job("flaky")
        .queueing_lock("only-one")
        .defer(&1)
        .unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    // While it runs, a second job of the same queueing lock waits (due later, so it stays).
    let second = app
        .job("flaky")
        .queueing_lock("only-one")
        .schedule_in(Duration::from_secs(3600))
        .defer(&2)
        .unwrap();
    release_tx.send(()).unwrap();
    let row = wait_status(&db, first, "cancelled", Duration::from_secs(10));
    let texts = row.error_texts();
    assert!(texts.iter().any(|e| e == "try again"), "{texts:?}");
    assert!(
        texts.iter().any(|e| e.contains(&format!(
            "not requeued: job {second} already waits with the same queueing lock"
        ))),
        "{texts:?}"
    );
    assert_still_recording(&db, &app);
    let mut client = db.client();
    assert_eq!(job_row(&mut client, second).unwrap().status, "todo");
    let report = w.shutdown(Duration::from_secs(5));
    assert!(
        report.is_clean() && report.cleanup_error().is_none(),
        "{report}"
    );
    assert_eq!(worker_rows(&mut client), 0, "the worker row was retired");
}

/// A job whose attempt count is already the largest integer (written by other means than
/// this library) once made every claim fail on `attempts + 1`, again at each try, since it
/// stayed first in line: nothing behind it ran. Its count now stops there, and the worker
/// fails it as past its attempts.
#[test]
fn a_job_at_the_largest_attempt_count_does_not_stop_the_claims() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let bad: i64 = db
        .client()
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args, priority, attempts)
             VALUES ('default', 'ok', 'null', 10, 2147483647) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let row = wait_status(&db, JobId(bad), "failed", Duration::from_secs(10));
    assert_eq!(row.attempts, 2147483647);
    assert!(
        row.error_texts()[0].contains("giving up"),
        "{:?}",
        row.errors
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the job ran");
    assert_still_recording(&db, &app);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// A job scheduled for '-infinity' (only SQL written by hand can store it) is first in line
/// and due; the claim's `now() - scheduled_at` (the time it waited) was an error for it, so
/// every claim failed and nothing ran. It runs now, like any due job.
#[test]
fn a_job_scheduled_for_minus_infinity_does_not_stop_the_claims() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let odd: i64 = db
        .client()
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
             VALUES ('default', 'ok', 'null', '-infinity') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    wait_status(&db, JobId(odd), "succeeded", Duration::from_secs(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_still_recording(&db, &app);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn a_job_scheduled_at_the_end_of_time_does_not_stop_the_claims() {
    // The latest time PostgreSQL can store lies past the largest number of microseconds since
    // 1970 that a bigint holds. A job moved there by hand (no insert trigger runs for an
    // UPDATE) is the queue's next due job, and the claim converts that time to microseconds
    // whenever it takes fewer jobs than it asked for.
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let far = app.defer("ok", &()).unwrap();
    db.client()
        .execute(
            "UPDATE postpone_jobs SET scheduled_at = '294276-12-31 23:59:59+00' WHERE id = $1",
            &[&far.0],
        )
        .unwrap();
    let due = app.defer("ok", &()).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    wait_status(&db, due, "succeeded", Duration::from_secs(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let later = app.defer("ok", &()).unwrap();
    wait_status(&db, later, "succeeded", Duration::from_secs(10));
    let row = job_row(&mut db.client(), far).unwrap();
    assert_eq!(row.status, "todo", "the far job is not due");
    assert_still_recording(&db, &app);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn a_nul_in_an_error_text_is_recorded_in_a_safe_form() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    ok_task(&mut tasks);
    tasks.register("nul", |_job: &Job| Err(TaskError::fail("bad\0byte")));
    tasks.register("nul_panic", |_job: &Job| -> Result<(), TaskError> {
        panic!("panic with a \0 in it")
    });
    let a = app.defer("nul", &()).unwrap();
    let b = app.defer("nul_panic", &()).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let row = wait_status(&db, a, "failed", Duration::from_secs(10));
    assert_eq!(row.error_texts(), vec!["bad\u{FFFD}byte".to_owned()]);
    let row = wait_status(&db, b, "failed", Duration::from_secs(10));
    assert!(
        row.error_texts()[0].contains("panic with a \u{FFFD} in it"),
        "{:?}",
        row.errors
    );
    assert_still_recording(&db, &app);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn a_retry_delay_past_what_the_database_can_store_is_clamped() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    ok_task(&mut tasks);
    tasks
        .register("forever", |_job: &Job| {
            Err(TaskError::retry_in("see you never", Duration::MAX))
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 3));
    // A fixed strategy's cap defaults to Duration::MAX: a delay of Duration::MAX is legal.
    tasks
        .register("huge_fixed", |_job: &Job| {
            Err(std::io::Error::other("later").into())
        })
        .retry(RetryStrategy::fixed(Duration::MAX, 3));
    let a = app.defer("forever", &()).unwrap();
    let b = app.defer("huge_fixed", &()).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let mut client = db.client();
    for id in [a, b] {
        assert!(
            wait_until(Duration::from_secs(10), || {
                client
                    .query_one(
                        "SELECT status = 'todo' AND scheduled_at > now() + interval '99 years'
                           FROM postpone_jobs WHERE id = $1",
                        &[&id.0],
                    )
                    .unwrap()
                    .get::<_, bool>(0)
            }),
            "job {id} is scheduled 100 years ahead"
        );
    }
    assert_still_recording(&db, &app);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// An outcome that the database refuses (here a trigger of the user's) is isolated: every
/// other outcome of its batch is recorded, and the refused job ends failed with the reason.
#[test]
fn an_outcome_the_database_refuses_is_isolated_from_its_batch() {
    let (db, app) = setup();
    let mut client = db.client();
    client
        .batch_execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.status = 'succeeded' AND NEW.args::jsonb = '\"poison\"'::jsonb THEN
                     RAISE EXCEPTION 'this job may not succeed';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_poison BEFORE UPDATE ON postpone_jobs
                 FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
        )
        .unwrap();
    let mut tasks = Tasks::new();
    ok_task(&mut tasks);
    let mut ids: Vec<JobId> = (0..40).map(|i| app.defer("ok", &i).unwrap()).collect();
    let poison = app.defer("ok", &"poison").unwrap();
    ids.extend((40..80).map(|i| app.defer("ok", &i).unwrap()));
    let w = fast_worker(&app, tasks).concurrency(4).spawn().unwrap();
    for id in &ids {
        wait_status(&db, *id, "succeeded", Duration::from_secs(10));
    }
    let row = wait_status(&db, poison, "failed", Duration::from_secs(10));
    assert!(
        row.error_texts()[0].contains("could not be recorded")
            && row.error_texts()[0].contains("this job may not succeed"),
        "{:?}",
        row.errors
    );
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// Rescue must not be one statement that one job can fail: a dead worker's job whose
/// queueing lock has a waiting job, and a queue name too long for a notification payload,
/// do not stop the rescue of another dead worker's job.
#[test]
fn one_dead_workers_collision_does_not_stop_the_rescue_of_others() {
    let (db, app) = setup();
    let mut client = db.client();
    let long_queue = "q".repeat(9000);
    client
        .execute(
            "INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES
                 (901, 'ghost-1', now() - interval '1 hour'),
                 (902, 'ghost-2', now() - interval '1 hour')",
            &[],
        )
        .unwrap();
    let ids: Vec<i64> = client
        .query(
            "INSERT INTO postpone_jobs (queue, task, args, status, worker_id, attempts,
                                        queueing_lock, lock, started_at, scheduled_at) VALUES
                 ('default', 'ok', '1', 'doing', 901, 1, 'same', 'same', now(), now()),
                 ('default', 'ok', '2', 'todo', NULL, 0, 'same', 'same', now(),
                  now() + interval '1 hour'),
                 ('default', 'ok', '3', 'doing', 902, 1, NULL, NULL, now(), now()),
                 ($1, 'ok', '4', 'doing', 902, 1, NULL, NULL, now(), now())
             RETURNING id",
            &[&long_queue],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let row = wait_status(&db, JobId(ids[2]), "succeeded", Duration::from_secs(10));
    assert!(row.error_texts()[0].contains("ghost-2"), "{:?}", row.errors);
    let row = wait_status(&db, JobId(ids[0]), "cancelled", Duration::from_secs(10));
    assert!(
        row.error_texts()
            .iter()
            .any(|e| e.contains(&format!("job {} already waits", ids[1]))),
        "{:?}",
        row.errors
    );
    // The job in the long-named queue went back to todo (the worker serves every queue).
    wait_status(&db, JobId(ids[3]), "succeeded", Duration::from_secs(10));
    assert_eq!(worker_rows(&mut client), 1, "both ghosts removed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// Anyone who can connect can send `NOTIFY postpone, 'abort:<id>'`: it must not abort a job
/// whose abort was never recorded.
#[test]
fn a_bare_notify_aborts_nothing() {
    let (db, app) = setup();
    let (started_tx, started_rx) = unbounded::<()>();
    let (release_tx, release_rx) = unbounded::<()>();
    let saw_abort = Arc::new(AtomicUsize::new(0));
    let saw = saw_abort.clone();
    let mut tasks = Tasks::new();
    tasks.register("victim", move |job: &Job| {
        started_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(10));
        if job.should_abort() {
            saw.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    });
    let id = app.defer("victim", &()).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let mut client = db.client();
    client
        .batch_execute(&format!("NOTIFY postpone, 'abort:{id}'"))
        .unwrap();
    // Time for the notification and for two abort polls.
    std::thread::sleep(Duration::from_millis(1200));
    release_tx.send(()).unwrap();
    wait_status(&db, id, "succeeded", Duration::from_secs(10));
    assert_eq!(
        saw_abort.load(Ordering::SeqCst),
        0,
        "should_abort() stayed false"
    );
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// An abort recorded while a job runs survives its way back to the queue: a retry (the task
/// failed before the worker read the flag) ends the job aborted instead of running it again.
#[test]
fn an_abort_request_survives_a_retry() {
    let (db, app) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let mut tasks = Tasks::new();
    tasks
        .register("self_abort", move |job: &Job| {
            r.fetch_add(1, Ordering::SeqCst);
            // The abort is recorded in the table (no notification), then the task fails at
            // once, before any poll can raise the flag here.
            let mut conn = job.app().connection().map_err(TaskError::fail)?;
            conn.execute(
                "UPDATE postpone_jobs SET abort_requested = true WHERE id = $1",
                &[&job.id().0],
            )
            .map_err(TaskError::fail)?;
            Err(TaskError::retry("failing right after the abort request"))
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 5));
    let id = app.defer("self_abort", &()).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let row = wait_status(&db, id, "aborted", Duration::from_secs(10));
    assert!(
        row.error_texts()
            .iter()
            .any(|e| e.contains("aborted on request: not run again")),
        "{:?}",
        row.errors
    );
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never ran again");
}

/// A running job whose abort is requested, still running when its worker stops (its task
/// ignores should_abort), is not put back in the queue by the retire: it ends aborted.
#[test]
fn an_abort_request_survives_a_shutdown() {
    let (db, app) = setup();
    let (started_tx, started_rx) = unbounded::<()>();
    let (release_tx, release_rx) = unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks.register("stubborn", move |_job: &Job| {
        started_tx.send(()).unwrap();
        // Ignores should_abort: outlives the shutdown until the test lets it go.
        let _ = release_rx.recv_timeout(Duration::from_secs(20));
        Ok(())
    });
    let id = app.defer("stubborn", &()).unwrap();
    let w = fast_worker(&app, tasks).listen(false).spawn().unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    // Recorded without a notification, and the worker stops before its poll matters.
    db.client()
        .execute(
            "UPDATE postpone_jobs SET abort_requested = true WHERE id = $1",
            &[&id.0],
        )
        .unwrap();
    // 3 s leave the cleanup a reserve of 600 ms (a fifth): enough on a loaded machine to
    // connect and retire the job (600 ms, with 120 ms, was not always).
    let report = w.shutdown(Duration::from_secs(3));
    assert_eq!(report.abandoned_jobs(), &[id], "{report}");
    assert_eq!(report.cleanup_error(), None, "{report}");
    let mut client = db.client();
    let row = job_row(&mut client, id).unwrap();
    assert_eq!(row.status, "aborted", "{row:?}; {report}");
    // The abandoned thread ends; its late success changes nothing.
    release_tx.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let row = job_row(&mut client, id).unwrap();
    assert_eq!(row.status, "aborted", "{row:?}");
}

/// During a shutdown, a task that says its failure stands (`even_on_shutdown`) is obeyed;
/// any other answer gives the job back to the queue (tests/suite/deploy.rs covers each).
#[test]
fn an_explicit_fail_during_shutdown_is_not_turned_into_a_requeue() {
    let (db, app) = setup();
    let (started_tx, started_rx) = unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks.register("careful", move |job: &Job| {
        started_tx.send(()).unwrap();
        while !job.should_abort() {
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(TaskError::fail("gave up cleanly").even_on_shutdown())
    });
    let id = app.defer("careful", &()).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let report = w.shutdown(Duration::from_secs(2));
    assert!(report.is_clean(), "{report}");
    let mut client = db.client();
    let row = job_row(&mut client, id).unwrap();
    assert_eq!(row.status, "failed", "{row:?}");
    assert_eq!(row.error_texts(), vec!["gave up cleanly".to_owned()]);
}

/// Backpressure: while outcomes cannot be recorded (a trigger of the user's makes each
/// recording wait on a lock the test holds), the worker stops claiming at its capacity
/// instead of running the whole queue with nothing recorded.
#[test]
fn a_worker_whose_outcomes_wait_stops_claiming() {
    let (db, app) = setup();
    let mut client = db.client();
    client
        .batch_execute(
            "CREATE FUNCTION slow_finish() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.status = 'succeeded' THEN
                     PERFORM pg_advisory_xact_lock_shared(4242);
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER slow_finish BEFORE UPDATE ON postpone_jobs
                 FOR EACH ROW EXECUTE FUNCTION slow_finish();",
        )
        .unwrap();
    let mut blocker = db.client();
    let mut tx = blocker.transaction().unwrap();
    tx.execute("SELECT pg_advisory_xact_lock(4242)", &[])
        .unwrap();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let ids: Vec<JobId> = (0..50).map(|i| app.defer("ok", &i).unwrap()).collect();
    let app_w = app_at(&db.url(), Duration::from_secs(30));
    let w = fast_worker(&app_w, tasks)
        .concurrency(2)
        .prefetch(2)
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || runs
        .load(Ordering::SeqCst)
        >= 4));
    std::thread::sleep(Duration::from_millis(800));
    let ran = runs.load(Ordering::SeqCst);
    let doing: i64 = client
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'doing'",
            &[],
        )
        .unwrap()
        .get(0);
    // Capacity 4 (2 threads, prefetch 2): at most 4 waiting or running, plus at most 4
    // finished whose outcomes wait for the completer (so that claims overlap its commits).
    assert!(ran <= 8, "{ran} jobs ran while none could be recorded");
    assert!(
        doing <= 8,
        "{doing} jobs claimed while none could be recorded"
    );
    tx.rollback().unwrap();
    for id in ids {
        wait_status(&db, id, "succeeded", Duration::from_secs(20));
    }
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// The shutdown's cleanup never overruns the timeout, however many round-trips it needs and
/// however long each may take (here every one waits on a lock the test holds).
#[test]
fn the_shutdown_cleanup_stays_within_the_timeout() {
    let (db, app) = setup();
    let mut client = db.client();
    client
        .batch_execute(
            "CREATE FUNCTION stuck_update() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.status <> 'doing' THEN
                     PERFORM pg_advisory_xact_lock_shared(4343);
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER stuck_update BEFORE UPDATE ON postpone_jobs
                 FOR EACH ROW EXECUTE FUNCTION stuck_update();",
        )
        .unwrap();
    let mut blocker = db.client();
    let mut tx = blocker.transaction().unwrap();
    tx.execute("SELECT pg_advisory_xact_lock(4343)", &[])
        .unwrap();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    for i in 0..20 {
        app.defer("ok", &i).unwrap();
    }
    // A long io_timeout: only the shutdown's own deadline can bound the cleanup.
    let app_w = app_at(&db.url(), Duration::from_secs(20));
    let w = fast_worker(&app_w, tasks).concurrency(2).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(5), || runs
        .load(Ordering::SeqCst)
        >= 2));
    let t = Instant::now();
    let report = w.shutdown(Duration::from_secs(2));
    let took = t.elapsed();
    report_figure("shutdown(2 s) with every cleanup round-trip stuck", took);
    assert!(took < Duration::from_millis(2600), "{took:?}: {report}");
    assert!(report.cleanup_error().is_some(), "{report}");
    tx.rollback().unwrap();
}

#[test]
fn defer_refuses_what_the_database_cannot_hold() {
    let (_db, app) = setup();
    let long = "x".repeat(300);
    let e = app.job("t").queue(&long).defer(&()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        e.to_string().contains("queue name is 300 bytes long"),
        "{e}"
    );
    let e = app.defer(&long, &()).unwrap_err();
    assert!(e.to_string().contains("task name is 300 bytes long"), "{e}");
    let e = app.job("t").lock("l".repeat(3000)).defer(&()).unwrap_err();
    assert!(e.to_string().contains("at most 1024"), "{e}");
    let e = app
        .job("t")
        .schedule_in(Duration::MAX)
        .defer(&())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("100 years"), "{e}");
    // And what it can hold still goes in.
    app.job("t")
        .queue("q".repeat(255))
        .lock("l".repeat(1024))
        .schedule_in(Duration::from_secs(99 * 365 * 24 * 3600))
        .defer(&())
        .unwrap();
}

/// A worker presumed dead (cut off from the database longer than `stalled_after`) must not
/// start, once it is back, the jobs it had claimed ahead (prefetched) and that were rescued
/// meanwhile; its late outcome must not overwrite the new attempt's; the job it was running
/// runs again elsewhere, but the recorded outcome is the new attempt's.
#[test]
fn a_worker_presumed_dead_starts_none_of_its_rescued_jobs() {
    let (db, direct) = setup();
    let proxy = FaultProxy::start(&db.server_addr());
    let app_a = app_at(&db.url_via(&proxy), Duration::from_secs(1));
    let (runs_tx, runs_rx) = unbounded::<(&'static str, i64)>();
    let (release_tx, release_rx) = unbounded::<()>();
    let (started_tx, started_rx) = unbounded::<()>();
    let mut tasks_a = Tasks::new();
    let runs = runs_tx.clone();
    tasks_a.register("block", move |job: &Job| {
        runs.send(("A", job.id().0)).unwrap();
        started_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        Err(TaskError::fail("late outcome from A"))
    });
    let runs = runs_tx.clone();
    tasks_a.register("next", move |job: &Job| {
        runs.send(("A", job.id().0)).unwrap();
        Ok(())
    });
    let block = direct.defer("block", &()).unwrap();
    let next = direct.job("next").priority(-1).defer(&()).unwrap();
    let a = fast_worker(&app_a, tasks_a)
        .name("worker-a")
        .concurrency(1)
        .prefetch(1)
        .spawn()
        .unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let mut client = db.client();
    assert!(wait_until(Duration::from_secs(5), || {
        job_row(&mut client, next).unwrap().status == "doing"
    }));
    // Cut A off: B presumes it dead and takes both jobs.
    proxy.strand_all();
    proxy.set_new_conns(NewConns::Strand);
    let mut tasks_b = Tasks::new();
    let runs = runs_tx.clone();
    tasks_b.register("block", move |job: &Job| {
        runs.send(("B", job.id().0)).unwrap();
        Ok(())
    });
    let runs = runs_tx.clone();
    tasks_b.register("next", move |job: &Job| {
        runs.send(("B", job.id().0)).unwrap();
        Ok(())
    });
    let b = fast_worker(&direct, tasks_b)
        .name("worker-b")
        .spawn()
        .unwrap();
    let b_id = b.worker_id();
    wait_status(&db, block, "succeeded", Duration::from_secs(10));
    wait_status(&db, next, "succeeded", Duration::from_secs(10));
    // Stop B so that nothing else can claim, heal A, and let its task end.
    assert!(b.shutdown(Duration::from_secs(5)).is_clean());
    proxy.set_new_conns(NewConns::Forward);
    let a_old = a.worker_id();
    release_tx.send(()).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || a.worker_id() != a_old),
        "A takes a new identity once it finds itself presumed dead"
    );
    // Give A every chance to start what it held.
    std::thread::sleep(Duration::from_millis(1000));
    let report = a.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    drop(runs_tx);
    let runs: Vec<(&str, i64)> = runs_rx.try_iter().collect();
    let runs_of = |id: JobId| runs.iter().filter(|(_, j)| *j == id.0).count();
    assert_eq!(runs_of(next), 1, "the prefetched job ran once: {runs:?}");
    assert_eq!(runs_of(block), 2, "A's job ran again on B: {runs:?}");
    for id in [block, next] {
        let row = job_row(&mut client, id).unwrap();
        assert_eq!(row.status, "succeeded", "{row:?}");
        assert_eq!(row.worker_id, Some(b_id), "{row:?}");
        assert!(
            !row.error_texts().iter().any(|e| e.contains("late outcome")),
            "{row:?}"
        );
    }
}

/// A task blocked in a query through `job.app()` is reached by its worker's sever at the
/// hard deadline: the thread unwinds and is joined, instead of being abandoned while its job
/// is requeued and runs again elsewhere.
#[test]
fn a_task_blocked_in_a_query_through_its_app_is_severed_at_the_hard_deadline() {
    let (db, _app) = setup();
    // A long io_timeout: only the sever can end the query in time.
    let app = app_at(&db.url(), Duration::from_secs(30));
    let (started_tx, started_rx) = unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks.register("sleepy", move |job: &Job| {
        started_tx.send(()).unwrap();
        let mut conn = job.app().connection().map_err(TaskError::fail)?;
        conn.batch_execute("SELECT pg_sleep(20)")
            .map_err(TaskError::retry)?;
        Ok(())
    });
    let id = app.defer("sleepy", &()).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let report = w.shutdown(Duration::from_secs(1));
    let took = t.elapsed();
    assert!(report.is_clean(), "{report}");
    assert!(report.sockets_severed() >= 1, "{report}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    let mut client = db.client();
    assert_eq!(job_row(&mut client, id).unwrap().status, "todo");
}

/// A pooled connection is never handed out carrying its last user's session state: a
/// transaction left open by a raw BEGIN, or a LISTEN (whose unread notifications would
/// pile up).
#[test]
fn a_pooled_connection_is_not_reused_inside_a_raw_transaction_or_while_listening() {
    let (db, _app) = setup();
    let app = postpone::App::builder(db.url())
        .pool_size(1)
        .build()
        .unwrap();
    {
        let mut conn = app.connection().unwrap();
        conn.batch_execute("BEGIN; CREATE TABLE left_open (x int)")
            .unwrap();
    }
    {
        let mut conn = app.connection().unwrap();
        // SAVEPOINT fails outside a transaction block.
        let e = conn.batch_execute("SAVEPOINT probe").unwrap_err();
        assert_eq!(e.sqlstate(), Some("25P01"), "{e}");
        let gone: bool = conn
            .query_one("SELECT to_regclass('left_open') IS NULL", &[])
            .unwrap()
            .get(0);
        assert!(gone, "the previous user's transaction was rolled back");
        conn.batch_execute("LISTEN somewhere").unwrap();
    }
    let mut client = db.client();
    for _ in 0..100 {
        client.batch_execute("NOTIFY somewhere, 'x'").unwrap();
    }
    let mut conn = app.connection().unwrap();
    let n: i64 = conn
        .query_one("SELECT count(*) FROM pg_listening_channels()", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    // And a transaction the library knows about, started with `execute`, too.
    conn.execute("BEGIN", &[]).unwrap();
    drop(conn);
    let mut conn = app.connection().unwrap();
    let e = conn.batch_execute("SAVEPOINT probe").unwrap_err();
    assert_eq!(e.sqlstate(), Some("25P01"), "{e}");
}

/// A way back to the queue that the database refuses for one job (a trigger of the user's)
/// fails that job with the reason, and every other job of the same statement is requeued.
#[test]
fn a_requeue_the_database_refuses_fails_that_job_alone() {
    let (db, app) = setup();
    let mut client = db.client();
    client
        .batch_execute(
            "CREATE FUNCTION refuse_requeue() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.status = 'todo' AND OLD.status = 'doing'
                    AND NEW.args::jsonb = '\"poison\"'::jsonb THEN
                     RAISE EXCEPTION 'this job may not be retried';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_requeue BEFORE UPDATE ON postpone_jobs
                 FOR EACH ROW EXECUTE FUNCTION refuse_requeue();",
        )
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let mut tasks = Tasks::new();
    tasks
        .register("twice", move |job: &Job| {
            r.fetch_add(1, Ordering::SeqCst);
            if job.attempts() == 1 {
                Err(TaskError::retry("once more"))
            } else {
                Ok(())
            }
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 3));
    let good: Vec<JobId> = (0..10).map(|i| app.defer("twice", &i).unwrap()).collect();
    let poison = app.defer("twice", &"poison").unwrap();
    let w = fast_worker(&app, tasks).concurrency(4).spawn().unwrap();
    for id in &good {
        let row = wait_status(&db, *id, "succeeded", Duration::from_secs(10));
        assert_eq!(row.attempts, 2);
    }
    let row = wait_status(&db, poison, "failed", Duration::from_secs(10));
    assert!(
        row.error_texts()
            .iter()
            .any(|e| e.contains("could not be put back in the queue: this job may not be retried")),
        "{:?}",
        row.errors
    );
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// An abort recorded while a job runs wins over the task's success even when the worker
/// never saw the request (here the task returns at once, before any poll): the table is the
/// truth. Found by the chaos checker (seed 9001), with the worker's links refused.
#[test]
fn an_abort_recorded_while_running_wins_over_an_unseen_success() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.register("quick", |job: &Job| {
        let mut conn = job.app().connection().map_err(TaskError::fail)?;
        conn.execute(
            "UPDATE postpone_jobs SET abort_requested = true WHERE id = $1",
            &[&job.id().0],
        )
        .map_err(TaskError::fail)?;
        Ok(())
    });
    let kept = app.defer("quick", &1).unwrap();
    let w = fast_worker(&app, tasks)
        .delete_finished(postpone::DeleteJobs::Always)
        .spawn()
        .unwrap();
    // Even a worker that deletes finished jobs keeps this one, aborted.
    let row = wait_status(&db, kept, "aborted", Duration::from_secs(10));
    assert!(
        row.error_texts()
            .iter()
            .any(|e| e.contains("aborted on request while it ran (its task ended succeeded")),
        "{:?}",
        row.errors
    );
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}
