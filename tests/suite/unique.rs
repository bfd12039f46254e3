//! Unique jobs against the real PostgreSQL: one job under 16 concurrent inserters,
//! duplicates report the job that covers them, period buckets, state sets, batches, and a
//! unique job's retry, rescue and operator retry never fail on its key.

use crate::support;
use crate::worker_util;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::unbounded;
use postpone::{
    Deferred, ErrorKind, Job, JobId, NewJob, RetryStrategy, TaskError, Tasks, Unique, UniqueStates,
};
use serde_json::json;
use worker_util::*;

fn count(db: &support::TestDb, task: &str) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE task = $1",
            &[&task],
        )
        .unwrap()
        .get(0)
}

fn set_status(db: &support::TestDb, id: JobId, status: &str) {
    let n = db
        .client()
        .execute(
            "UPDATE postpone_jobs SET status = $2,
                    finished_at = CASE WHEN $2 IN ('todo', 'doing') THEN NULL ELSE now() END,
                    started_at = CASE WHEN $2 = 'todo' THEN NULL ELSE now() END
              WHERE id = $1",
            &[&id.get(), &status],
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn sixteen_concurrent_inserters_insert_one_job_and_the_others_get_its_id() {
    let (db, _app) = setup();
    let url = db.url();
    let n = 16;
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let url = url.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let app = app_at(&url, Duration::from_secs(10));
                // Key order differs between threads: the key is the JSON value.
                let args = if i % 2 == 0 {
                    json!({"a": 1, "b": [1, 2]})
                } else {
                    json!({"b": [1, 2], "a": 1})
                };
                // Warm the pool so that the inserts start together.
                drop(app.connection().unwrap());
                barrier.wait();
                let t = Instant::now();
                let d = app
                    .job("sync")
                    .unique(Unique::by_args())
                    .defer_unique(&args)
                    .unwrap();
                (d, t.elapsed())
            })
        })
        .collect();
    let results: Vec<(Deferred, Duration)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let inserted: Vec<JobId> = results
        .iter()
        .filter(|r| !r.0.is_duplicate())
        .map(|r| r.0.id())
        .collect();
    assert_eq!(inserted.len(), 1, "one insert: {results:?}");
    for (d, _) in &results {
        assert_eq!(
            d.id(),
            inserted[0],
            "every duplicate names the job: {results:?}"
        );
    }
    assert_eq!(count(&db, "sync"), 1);
    let slowest = results.iter().map(|r| r.1).max().unwrap();
    report_figure("slowest of 16 concurrent defer_unique", slowest);
}

#[test]
fn duplicates_report_the_job_that_covers_them() {
    let (db, app) = setup();
    let u = Unique::by_args();
    let first = app
        .job("mail")
        .unique(u)
        .defer_unique(&json!({"to": 1}))
        .unwrap();
    assert!(matches!(first, Deferred::Inserted(_)));
    let again = app
        .job("mail")
        .unique(u)
        .defer_unique(&json!({"to": 1}))
        .unwrap();
    assert_eq!(again, Deferred::Duplicate(first.id()));
    // Another queue is still a duplicate unless the queue is part of the key.
    let other_queue = app
        .job("mail")
        .queue("q2")
        .unique(u)
        .defer_unique(&json!({"to": 1}))
        .unwrap();
    assert_eq!(other_queue, Deferred::Duplicate(first.id()));
    let by_queue = app
        .job("mail")
        .queue("q2")
        .unique(u.by_queue())
        .defer_unique(&json!({"to": 1}))
        .unwrap();
    assert!(!by_queue.is_duplicate(), "{by_queue:?}");
    // Other arguments, another task: not duplicates.
    assert!(!app
        .job("mail")
        .unique(u)
        .defer_unique(&json!({"to": 2}))
        .unwrap()
        .is_duplicate());
    assert!(!app
        .job("post")
        .unique(u)
        .defer_unique(&json!({"to": 1}))
        .unwrap()
        .is_duplicate());
    // `defer` reports a duplicate as AlreadyEnqueued naming the job.
    let e = app
        .job("mail")
        .unique(u)
        .defer(&json!({"to": 1}))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued);
    assert!(e.to_string().contains(&first.id().to_string()), "{e}");
    // So does defer_in, inside the caller's transaction.
    let mut conn = app.connection().unwrap();
    let e = app
        .job("mail")
        .unique(u)
        .defer_in(&mut conn, &json!({"to": 1}))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued);
    assert_eq!(count(&db, "mail"), 3);
    // A job without `unique` is never refused for its arguments.
    assert!(!app
        .job("mail")
        .defer_unique(&json!({"to": 1}))
        .unwrap()
        .is_duplicate());
    assert_eq!(count(&db, "mail"), 4);
}

#[test]
fn one_job_per_period_bucket() {
    let (db, app) = setup();
    let hour = 3600u64;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // An hour that starts two days from now.
    let start = UNIX_EPOCH + Duration::from_secs((now / hour + 48) * hour);
    let u = Unique::by_args().period(Duration::from_secs(hour));
    let at = |secs: u64| start + Duration::from_secs(secs);
    let a = app
        .job("hourly")
        .unique(u)
        .schedule_at(at(0))
        .defer_unique(&7)
        .unwrap();
    let b = app
        .job("hourly")
        .unique(u)
        .schedule_at(at(3599))
        .defer_unique(&7)
        .unwrap();
    let c = app
        .job("hourly")
        .unique(u)
        .schedule_at(at(3600))
        .defer_unique(&7)
        .unwrap();
    let d = app
        .job("hourly")
        .unique(u)
        .schedule_at(at(5000))
        .defer_unique(&7)
        .unwrap();
    assert!(!a.is_duplicate());
    assert_eq!(b, Deferred::Duplicate(a.id()), "same hour");
    assert!(!c.is_duplicate(), "the next hour is another key");
    assert_eq!(d, Deferred::Duplicate(c.id()));
    assert_eq!(count(&db, "hourly"), 2);
    // Without a period, the same jobs are one key for all time.
    let e = app
        .job("hourly")
        .unique(Unique::by_args())
        .schedule_at(at(0))
        .defer_unique(&7)
        .unwrap();
    let f = app
        .job("hourly")
        .unique(Unique::by_args())
        .schedule_at(at(9000))
        .defer_unique(&7)
        .unwrap();
    assert!(!e.is_duplicate());
    assert_eq!(f, Deferred::Duplicate(e.id()));
}

#[test]
fn state_sets_decide_what_blocks() {
    let (db, app) = setup();
    let defer = |states: UniqueStates| {
        app.job("s")
            .unique(Unique::by_args().states(states))
            .defer_unique(&format!("{states:?}"))
            .unwrap()
    };
    // Waiting only: a running job does not block.
    let w = defer(UniqueStates::Waiting);
    assert_eq!(defer(UniqueStates::Waiting), Deferred::Duplicate(w.id()));
    set_status(&db, w.id(), "doing");
    let w2 = defer(UniqueStates::Waiting);
    assert!(!w2.is_duplicate(), "a running job does not block Waiting");

    // Waiting or running: a running job blocks, a finished one does not.
    let r = defer(UniqueStates::WaitingOrRunning);
    set_status(&db, r.id(), "doing");
    assert_eq!(
        defer(UniqueStates::WaitingOrRunning),
        Deferred::Duplicate(r.id())
    );
    set_status(&db, r.id(), "succeeded");
    let r2 = defer(UniqueStates::WaitingOrRunning);
    assert!(
        !r2.is_duplicate(),
        "a finished job does not block WaitingOrRunning"
    );

    // Also succeeded: a succeeded job blocks; a failed one does not.
    let s = defer(UniqueStates::WaitingRunningOrSucceeded);
    set_status(&db, s.id(), "succeeded");
    assert_eq!(
        defer(UniqueStates::WaitingRunningOrSucceeded),
        Deferred::Duplicate(s.id())
    );
    db.client()
        .execute("DELETE FROM postpone_jobs WHERE id = $1", &[&s.id().get()])
        .unwrap();
    let s2 = defer(UniqueStates::WaitingRunningOrSucceeded);
    assert!(!s2.is_duplicate(), "a deleted job frees its key");
    set_status(&db, s2.id(), "failed");
    assert!(!defer(UniqueStates::WaitingRunningOrSucceeded).is_duplicate());
}

#[test]
fn batch_defer_reports_which_entries_were_duplicates() {
    let (db, app) = setup();
    let u = Unique::by_args();
    let existing = app.job("b").unique(u).defer_unique(&0).unwrap();
    let jobs = vec![
        NewJob::new("b", &1).unwrap().unique(u),
        NewJob::new("b", &0).unwrap().unique(u),
        NewJob::new("b", &1).unwrap().unique(u),
        NewJob::new("b", &1).unwrap(),
    ];
    let done = app.defer_batch_unique(&jobs).unwrap();
    assert_eq!(done.len(), 4);
    assert!(!done[0].is_duplicate());
    assert_eq!(done[1], Deferred::Duplicate(existing.id()));
    assert_eq!(
        done[2],
        Deferred::Duplicate(done[0].id()),
        "within the batch"
    );
    assert!(!done[3].is_duplicate(), "not unique");
    assert_eq!(count(&db, "b"), 3);
    // defer_batch refuses unique jobs rather than ignore them.
    let e = app.defer_batch(&jobs).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("defer_batch_unique"), "{e}");
    assert_eq!(count(&db, "b"), 3);
    // A bad entry fails the batch, naming it, and inserts nothing.
    let bad = vec![
        NewJob::new("b", &5).unwrap().unique(u),
        NewJob::new("b", &6)
            .unwrap()
            .unique(u.period(Duration::ZERO)),
    ];
    let e = app.defer_batch_unique(&bad).unwrap_err();
    assert!(e.to_string().contains("job 1 of the batch"), "{e}");
    assert_eq!(count(&db, "b"), 3);
}

#[test]
fn bad_input_is_a_clear_error() {
    let (db, app) = setup();
    let e = app
        .job("x")
        .unique(Unique::by_args().period(Duration::ZERO))
        .defer_unique(&1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("unique period"), "{e}");
    let e = app
        .job("x")
        .queueing_lock("l")
        .unique(Unique::by_args().states(UniqueStates::Waiting))
        .defer(&1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("queueing_lock"), "{e}");
    assert_eq!(count(&db, "x"), 0);
}

/// A unique job that retries while a duplicate is deferred: never fails on its key.
#[test]
fn a_retrying_unique_job_never_fails_on_its_key() {
    let (db, app) = setup();
    let (started_tx, started_rx) = unbounded::<u32>();
    let (go_tx, go_rx) = unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks
        .register("flaky", move |job: &Job| {
            started_tx.send(job.attempts()).unwrap();
            go_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            if job.attempts() < 3 {
                Err(TaskError::retry("not yet"))
            } else {
                Ok(())
            }
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 5));
    // One job at a time: the duplicate deferred below waits while the first one runs.
    let handle = fast_worker(&app, tasks).concurrency(1).spawn().unwrap();

    // Waiting or running: the running job blocks the duplicate, and its retries go back
    // to the queue.
    let u = Unique::by_args();
    let id = app.job("flaky").unique(u).defer_unique(&"r").unwrap().id();
    for attempt in 1..=3 {
        assert_eq!(
            started_rx.recv_timeout(Duration::from_secs(20)).unwrap(),
            attempt
        );
        assert_eq!(
            app.job("flaky").unique(u).defer_unique(&"r").unwrap(),
            Deferred::Duplicate(id),
            "attempt {attempt}"
        );
        go_tx.send(()).unwrap();
    }
    let row = wait_status(&db, id, "succeeded", Duration::from_secs(20));
    assert_eq!(row.attempts, 3);

    // Waiting only: while it runs a duplicate is inserted; its retry is then superseded by
    // that waiting job (cancelled, naming it), never an error.
    let w = Unique::by_args().states(UniqueStates::Waiting);
    let first = app.job("flaky").unique(w).defer_unique(&"w").unwrap().id();
    assert_eq!(started_rx.recv_timeout(Duration::from_secs(20)).unwrap(), 1);
    // Scheduled later, so that the worker cannot claim it ahead: it waits (`todo`) when the
    // first one retries.
    let second = app
        .job("flaky")
        .unique(w)
        .schedule_in(Duration::from_secs(600))
        .defer_unique(&"w")
        .unwrap();
    assert!(
        !second.is_duplicate(),
        "a running job does not block Waiting"
    );
    go_tx.send(()).unwrap();
    let row = wait_status(&db, first, "cancelled", Duration::from_secs(20));
    assert!(
        row.error_texts()
            .iter()
            .any(|e| e.contains(&second.id().to_string())),
        "{row:?}"
    );
    assert_eq!(
        job_row(&mut db.client(), second.id()).unwrap().status,
        "todo"
    );
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
}

/// The rescue of a dead worker's unique job, and an operator's retry that collides, both go
/// through postpone_requeue: neither fails.
#[test]
fn rescue_and_operator_retry_of_unique_jobs_never_fail() {
    let (db, app) = setup();
    let mut c = db.client();
    for states in [
        UniqueStates::WaitingOrRunning,
        UniqueStates::WaitingRunningOrSucceeded,
    ] {
        let u = Unique::by_args().states(states);
        let args = format!("{states:?}");
        let id = app.job("r").unique(u).defer_unique(&args).unwrap().id();
        // A dead worker holds it.
        let worker: i64 = c
            .query_one(
                "INSERT INTO postpone_workers (name, last_heartbeat)
                 VALUES ('dead', now() - interval '1 hour') RETURNING id",
                &[],
            )
            .unwrap()
            .get(0);
        c.execute(
            "UPDATE postpone_jobs SET status = 'doing', worker_id = $2, attempts = 1,
                    started_at = now() - interval '1 hour' WHERE id = $1",
            &[&id.get(), &worker],
        )
        .unwrap();
        let row = c
            .query_one("SELECT ids, outcomes FROM postpone_rescue(1000, 0)", &[])
            .unwrap();
        let ids: Vec<i64> = row.get(0);
        let outcomes: Vec<String> = row.get(1);
        assert_eq!((ids, outcomes), (vec![id.get()], vec!["todo".to_owned()]));
        assert_eq!(
            app.job("r").unique(u).defer_unique(&args).unwrap(),
            Deferred::Duplicate(id)
        );

        // The job fails; a duplicate is deferred; the operator's retry collides and
        // leaves the failed job as it was, without an error from the statement.
        set_status(&db, id, "failed");
        let other = app.job("r").unique(u).defer_unique(&args).unwrap();
        assert!(!other.is_duplicate());
        let outcome: String = c
            .query_one(
                "SELECT outcome FROM postpone_requeue(ARRAY[$1::bigint], '{}', '{}', '{}',
                                                      '{}', '{}', true)",
                &[&id.get()],
            )
            .unwrap()
            .get(0);
        assert_eq!(outcome, "collision");
        assert_eq!(job_row(&mut c, id).unwrap().status, "failed");
    }
}

#[test]
fn unique_jobs_with_a_queueing_lock_and_inside_a_transaction() {
    let (db, app) = setup();
    let u = Unique::by_args();
    // A taken queueing lock is still AlreadyEnqueued, naming the waiting job.
    let holder = app.job("q").queueing_lock("l").defer(&0).unwrap();
    let e = app
        .job("q")
        .queueing_lock("l")
        .unique(u)
        .defer_unique(&1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued);
    assert!(e.to_string().contains(&holder.to_string()), "{e}");
    // Inside a transaction: its own uncommitted job covers the duplicate; a rollback
    // leaves nothing, so the key is free again.
    let mut conn = app.connection().unwrap();
    let mut tx = conn.transaction().unwrap();
    let a = app.job("q").unique(u).defer_unique_in(&mut tx, &2).unwrap();
    let b = app.job("q").unique(u).defer_unique_in(&mut tx, &2).unwrap();
    assert!(!a.is_duplicate());
    assert_eq!(b, Deferred::Duplicate(a.id()));
    drop(tx);
    assert!(!app
        .job("q")
        .unique(u)
        .defer_unique(&2)
        .unwrap()
        .is_duplicate());
    assert_eq!(count(&db, "q"), 2);
}

/// Figures: a plain defer, a unique one inserted, and a duplicate reported (sequential, one
/// connection), each 200 times.
#[test]
fn cost_of_a_unique_defer_and_of_a_duplicate() {
    let (db, app) = setup();
    let n = 200;
    let t = Instant::now();
    for i in 0..n {
        app.job("plain").defer(&i).unwrap();
    }
    report_figure("200 plain defers", t.elapsed());
    let t = Instant::now();
    let ids: Vec<JobId> = (0..n)
        .map(|i| {
            let d = app
                .job("u")
                .unique(Unique::by_args())
                .defer_unique(&i)
                .unwrap();
            assert!(!d.is_duplicate());
            d.id()
        })
        .collect();
    report_figure("200 unique defers inserted", t.elapsed());
    let t = Instant::now();
    for i in 0..n {
        let d = app
            .job("u")
            .unique(Unique::by_args())
            .defer_unique(&i)
            .unwrap();
        assert_eq!(d, Deferred::Duplicate(ids[i as usize]));
    }
    report_figure("200 duplicates reported", t.elapsed());
    assert_eq!(count(&db, "u"), n as i64);
}
