//! Jobs that expire (schema version 25): a job not started by its deadline never runs. It
//! ends `cancelled` with `expired` set and an error saying when, whether it waited in the
//! table (the workers' sweep), was held by a worker that had no thread for it, or was
//! retried or snoozed past its deadline; a job that started in time runs to its end. The
//! entry points (defer, batch, SQL, dependents) and their bad inputs.

use crate::support;
use crate::worker_util;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use postpone::{ErrorKind, Job, JobId, NewJob, RetryStrategy, TaskError, Tasks};
use support::{wait_until, TestDb};
use worker_util::*;

/// The started ids, shared by every worker thread.
type Started = Arc<Mutex<HashSet<i64>>>;

/// Task "slow" (sleeps the milliseconds its argument says) and "quick", both recording
/// their starts.
fn tasks(started: &Started) -> Tasks {
    let mut tasks = Tasks::new();
    let s = started.clone();
    tasks.register("slow", move |job: &Job| {
        s.lock().unwrap().insert(job.id().0);
        let ms: u64 = job.args()?;
        thread::sleep(Duration::from_millis(ms));
        Ok(())
    });
    let s = started.clone();
    tasks.register("quick", move |job: &Job| {
        s.lock().unwrap().insert(job.id().0);
        Ok(())
    });
    tasks
}

/// (status, expired, error texts, attempts, claimed) of job `id`.
fn expiry_row(db: &TestDb, id: JobId) -> (String, bool, Vec<String>, i32, bool) {
    let row = db
        .client()
        .query_one(
            "SELECT status, expired, coalesce(errors, '[]'::jsonb), attempts, claimed_at IS NOT NULL
               FROM postpone_jobs WHERE id = $1",
            &[&id.0],
        )
        .expect("reading a job");
    let errors: serde_json::Value = row.get(2);
    let texts = errors
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["error"].as_str().unwrap_or_default().to_owned())
        .collect();
    (row.get(0), row.get(1), texts, row.get(3), row.get(4))
}

fn assert_expired(db: &TestDb, id: JobId) {
    let (status, expired, errors, _, _) = expiry_row(db, id);
    assert_eq!(status, "cancelled", "job {id}: {errors:?}");
    assert!(
        expired,
        "job {id} is cancelled but not marked expired: {errors:?}"
    );
    assert!(
        errors
            .last()
            .is_some_and(|e| e.starts_with("expired") && e.contains("UTC")),
        "job {id}: the last error should say it expired and when: {errors:?}"
    );
}

fn count_status(db: &TestDb, ids: &[JobId], status: &str) -> i64 {
    let ids: Vec<i64> = ids.iter().map(|i| i.0).collect();
    db.client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1) AND status = $2",
            &[&ids, &status],
        )
        .unwrap()
        .get(0)
}

#[test]
fn jobs_that_expire_while_the_queue_is_behind_never_start() {
    let (db, app) = setup();
    let started: Started = Arc::default();
    // 30 jobs of 150 ms ahead of them on 3 threads: 1.5 s of work before they could start.
    let mut slow = Vec::new();
    for _ in 0..30 {
        slow.push(app.job("slow").defer(&150u64).unwrap());
    }
    let mut expiring = Vec::new();
    for _ in 0..20 {
        expiring.push(
            app.job("quick")
                .expires_in(Duration::from_millis(600))
                .defer(&())
                .unwrap(),
        );
    }
    let workers: Vec<_> = (0..3)
        .map(|_| {
            fast_worker(&app, tasks(&started))
                .concurrency(1)
                .spawn()
                .unwrap()
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(30), || {
            count_status(&db, &slow, "succeeded") == 30
                && count_status(&db, &expiring, "cancelled") == 20
        }),
        "the queue did not drain: {:?}",
        all_jobs(&mut db.client())
    );
    let started = started.lock().unwrap().clone();
    for id in &expiring {
        assert!(!started.contains(&id.0), "expired job {id} started");
        assert_expired(&db, *id);
    }
    let mut expired = 0;
    for w in workers {
        expired += w.stats().expired;
        assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    }
    assert_eq!(expired, 20, "the workers count what they expired");
}

#[test]
fn a_job_started_just_before_its_deadline_finishes_normally() {
    let (db, app) = setup();
    let started: Started = Arc::default();
    let w = fast_worker(&app, tasks(&started)).spawn().unwrap();
    // Idle worker: it starts within a few ms of the job being due, 2 s before the deadline
    // (a margin for a loaded machine), and runs 1 s past it.
    let id = app
        .job("slow")
        .schedule_in(Duration::from_millis(300))
        .expires_in(Duration::from_millis(2300))
        .defer(&3000u64)
        .unwrap();
    let row = wait_status(&db, id, "succeeded", Duration::from_secs(10));
    assert!(row.errors.is_empty(), "{row:?}");
    let (_, expired, _, attempts, _) = expiry_row(&db, id);
    assert!(!expired);
    assert_eq!(attempts, 1);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn a_retry_or_snooze_past_the_deadline_expires_instead_of_running() {
    let (db, app) = setup();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Tasks::new();
    let r = runs.clone();
    tasks
        .register("retry", move |job: &Job| {
            r.lock().unwrap().push(job.id().0);
            Err(TaskError::retry_in(
                "the server was busy",
                Duration::from_secs(5),
            ))
        })
        .retry(RetryStrategy::fixed(Duration::from_secs(5), 5));
    let r = runs.clone();
    tasks.register("snooze", move |job: &Job| {
        r.lock().unwrap().push(job.id().0);
        Err(TaskError::snooze(Duration::from_secs(5)))
    });
    let r = runs.clone();
    tasks
        .register("retry_soon", move |job: &Job| {
            r.lock().unwrap().push(job.id().0);
            if job.attempts() == 1 {
                Err(TaskError::retry_in("once more", Duration::from_millis(50)))
            } else {
                Ok(())
            }
        })
        .retry(RetryStrategy::fixed(Duration::from_millis(50), 5));
    let w = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    let retry = app
        .job("retry")
        .expires_in(Duration::from_secs(2))
        .defer(&())
        .unwrap();
    let snooze = app
        .job("snooze")
        .expires_in(Duration::from_secs(2))
        .defer(&())
        .unwrap();
    // A retry due before the deadline runs.
    let soon = app
        .job("retry_soon")
        .expires_in(Duration::from_secs(30))
        .defer(&())
        .unwrap();
    wait_status(&db, retry, "cancelled", Duration::from_secs(10));
    wait_status(&db, snooze, "cancelled", Duration::from_secs(10));
    wait_status(&db, soon, "succeeded", Duration::from_secs(10));
    for id in [retry, snooze] {
        assert_expired(&db, id);
        let (_, _, errors, _, _) = expiry_row(&db, id);
        assert!(
            errors
                .last()
                .unwrap()
                .contains("would come after its deadline"),
            "{errors:?}"
        );
        let n = runs.lock().unwrap().iter().filter(|r| **r == id.0).count();
        assert_eq!(n, 1, "job {id} ran {n} times");
    }
    let (_, errors, ..) = {
        let (_, e, t, ..) = expiry_row(&db, retry);
        (e, t, ())
    };
    assert!(
        errors.iter().any(|e| e.contains("the server was busy")),
        "the task's own error is kept: {errors:?}"
    );
    assert!(stats_once_recorded(&w, 4).expired >= 2);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn a_held_job_past_its_deadline_never_runs() {
    let (db, app) = setup();
    let started: Started = Arc::default();
    let w = fast_worker(&app, tasks(&started))
        .concurrency(1)
        .prefetch(4)
        .spawn()
        .unwrap();
    // One thread and two due jobs: the claim that the defer's notification brings takes both
    // (the prefetch), the thread runs the first for 1.5 s, and the second, held meanwhile,
    // reaches its deadline before the worker would give it back (500 ms after the claim).
    // On a loaded machine the claim may come after the deadline (the job is then never
    // claimed: the sweep ends it): tried again, up to 5 times, until a worker held it.
    let mut held = 0;
    for _ in 0..5 {
        let ids = app
            .defer_batch(&[
                NewJob::new("slow", &1500u64).unwrap(),
                NewJob::new("quick", &())
                    .unwrap()
                    .expires_in(Duration::from_millis(400)),
            ])
            .unwrap();
        let (blocker, id) = (ids[0], ids[1]);
        wait_status(&db, id, "cancelled", Duration::from_secs(10));
        assert_expired(&db, id);
        wait_status(&db, blocker, "succeeded", Duration::from_secs(10));
        assert!(!started.lock().unwrap().contains(&id.0), "job {id} ran");
        let (_, _, _, attempts, claimed) = expiry_row(&db, id);
        // Ended by the worker that held it (a job given back and swept has no worker).
        let row = job_row(&mut db.client(), id).unwrap();
        if claimed && row.worker_id.is_some() {
            assert_eq!(attempts, 0, "an attempt that never started is given back");
            held += 1;
            break;
        }
    }
    assert_eq!(held, 1, "no try had the job held by the worker");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn the_database_refuses_a_start_past_the_deadline() {
    let (db, app) = setup();
    let id = app
        .job("quick")
        .expires_in(Duration::from_secs(60))
        .defer(&())
        .unwrap();
    let mut c = db.client();
    let worker: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name, host, pid, queues, concurrency)
             VALUES ('test', 'h', 1, NULL, 1) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let claimed = c
        .query(
            "SELECT id, attempts, expires_in FROM postpone_claim_jobs($1, 10, NULL, NULL, 0)",
            &[&worker],
        )
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let attempt: i32 = claimed[0].get(1);
    let left: f64 = claimed[0].get(2);
    assert!(left > 50.0 && left <= 60.0, "{left}");
    // The deadline passes while the job is held: a start written 2 s after it (more than
    // the second allowed for an outcome's way) is refused; the outcome is recorded as
    // expired.
    c.execute(
        "UPDATE postpone_jobs SET expires_at = now() - interval '2 seconds' WHERE id = $1",
        &[&id.0],
    )
    .unwrap();
    let written = c
        .query(
            "SELECT * FROM postpone_start(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY[$3::int], ARRAY[0::bigint])",
            &[&id.0, &worker, &attempt],
        )
        .unwrap();
    assert!(written.is_empty(), "a late start was written");
    let done = c
        .query(
            "SELECT * FROM postpone_finish(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY[$3::int],
                 ARRAY['succeeded'], ARRAY[NULL::text], ARRAY['1'::jsonb], ARRAY[1000::bigint])",
            &[&id.0, &worker, &attempt],
        )
        .unwrap();
    assert_eq!(done.len(), 1);
    assert_expired(&db, id);
    let (.., errors, _, _) = expiry_row(&db, id);
    assert!(errors.last().unwrap().contains("not kept"), "{errors:?}");
    let output: Option<serde_json::Value> = c
        .query_one("SELECT output FROM postpone_jobs WHERE id = $1", &[&id.0])
        .unwrap()
        .get(0);
    assert_eq!(output, None);
    drop(app);
}

#[test]
fn batches_sql_and_dependents_expire_too() {
    let (db, app) = setup();
    let started: Started = Arc::default();
    let batch = app
        .defer_batch(&[
            NewJob::new("quick", &())
                .unwrap()
                .expires_in(Duration::from_millis(300)),
            NewJob::new("quick", &())
                .unwrap()
                .expires_at(SystemTime::now() + Duration::from_millis(300)),
            NewJob::new("quick", &()).unwrap(),
        ])
        .unwrap();
    let mut c = db.client();
    let sql: i64 = c
        .query_one(
            "SELECT postpone_defer('quick', expires_in => interval '300 milliseconds')",
            &[],
        )
        .unwrap()
        .get(0);
    let sql_at: i64 = c
        .query_one(
            "SELECT postpone_defer('quick', 'null', 'default', 0, NULL, NULL, NULL, NULL,
                                   expires_at => now() + interval '300 milliseconds')",
            &[],
        )
        .unwrap()
        .get(0);
    // A dependent that expires while its dependency has not finished, and one that waits
    // for it: cancelled in turn, by the rules of a cancelled dependency.
    let blocker = app
        .job("slow")
        .schedule_in(Duration::from_secs(2))
        .defer(&10u64)
        .unwrap();
    let dependent = app
        .job("quick")
        .after(&[blocker])
        .expires_in(Duration::from_millis(300))
        .defer(&())
        .unwrap();
    let next = app.job("quick").after(&[dependent]).defer(&()).unwrap();
    let deadline = Instant::now() + Duration::from_millis(300);
    // Workers start once every deadline has passed.
    thread::sleep(deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(100));
    let w = fast_worker(&app, tasks(&started)).spawn().unwrap();
    let expiring = [
        batch[0],
        batch[1],
        JobId::from(sql),
        JobId::from(sql_at),
        dependent,
    ];
    for id in expiring {
        wait_status(&db, id, "cancelled", Duration::from_secs(10));
        assert_expired(&db, id);
        assert!(!started.lock().unwrap().contains(&id.0));
    }
    wait_status(&db, batch[2], "succeeded", Duration::from_secs(10));
    // The admin API: the deadline, the flag, and the count.
    let admin = app.admin();
    let d = admin.job(batch[0]).unwrap();
    assert!(d.job.expired && d.job.expires_at.is_some(), "{d:?}");
    let d = admin.job(batch[2]).unwrap();
    assert!(!d.job.expired && d.job.expires_at.is_none(), "{d:?}");
    let counts = admin.counts().unwrap();
    let c = counts.iter().find(|c| c.queue == "default").unwrap();
    assert!(c.expired >= 5 && c.cancelled >= c.expired, "{c:?}");
    let row = wait_status(&db, next, "cancelled", Duration::from_secs(10));
    assert!(
        row.error_texts()
            .iter()
            .any(|e| e.contains(&format!("job {dependent}"))),
        "{row:?}"
    );
    wait_status(&db, blocker, "succeeded", Duration::from_secs(10));
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

#[test]
fn bad_expiries_are_refused_with_a_clear_error() {
    let (db, app) = setup();
    let now = SystemTime::now();
    let year = Duration::from_secs(365 * 24 * 3600);
    let cases: Vec<(&str, postpone::Result<JobId>)> = vec![
        (
            "zero",
            app.job("quick").expires_in(Duration::ZERO).defer(&()),
        ),
        (
            "in the past",
            app.job("quick")
                .expires_at(now - Duration::from_secs(1))
                .defer(&()),
        ),
        (
            "before its schedule",
            app.job("quick")
                .schedule_in(Duration::from_secs(7200))
                .expires_in(Duration::from_secs(3600))
                .defer(&()),
        ),
        (
            "before its scheduled time",
            app.job("quick")
                .schedule_at(now + Duration::from_secs(7200))
                .expires_at(now + Duration::from_secs(3600))
                .defer(&()),
        ),
        (
            "too far",
            app.job("quick").expires_in(200 * year).defer(&()),
        ),
        (
            "past the year 9999",
            app.job("quick").expires_at(now + 9000 * year).defer(&()),
        ),
    ];
    for (what, res) in cases {
        let e = res.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
        assert!(e.to_string().contains("expiry"), "{what}: {e}");
    }
    let batch = app.defer_batch(&[NewJob::new("quick", &())
        .unwrap()
        .expires_in(Duration::ZERO)]);
    assert_eq!(batch.unwrap_err().kind(), ErrorKind::InvalidInput);

    let mut c = db.client();
    for (sql, says) in [
        (
            "SELECT postpone_defer('quick', expires_in => interval '-1 minute')",
            "must be positive",
        ),
        (
            "SELECT postpone_defer('quick', expires_at => now() - interval '1 minute')",
            "must come after the job's scheduled time",
        ),
        (
            "SELECT postpone_defer('quick', schedule_in => interval '2 hours', expires_in => interval '1 hour')",
            "must come after the job's scheduled time",
        ),
        (
            "SELECT postpone_defer('quick', expires_in => interval '1 hour', expires_at => now() + interval '1 hour')",
            "not both",
        ),
        (
            "SELECT postpone_defer('quick', expires_in => interval '300000 years')",
            "past what a timestamp can hold",
        ),
        (
            "SELECT postpone_defer('quick', expires_at => 'infinity')",
            "finite",
        ),
    ] {
        let e = c.query_one(sql, &[]).expect_err(sql);
        let db_error = e.as_db_error().expect("a database error");
        assert!(db_error.message().contains(says), "{sql}: {db_error}");
        assert_eq!(db_error.code().code(), "22023", "{sql}");
    }
    let n: i64 = c
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing was inserted");
}

/// The scaled-down backlog: 50,000 expired jobs due before the live ones (first in the
/// claim's order) delay the drain only until the sweep has ended them, and none of them
/// runs. The bound is wide (the machine is shared); the figures and the 1,000,000-job
/// version are `cargo bench --bench scale -- --only empty,expired` (docs/performance-log.md:
/// with a million, the drain waits for the sweep).
#[test]
fn a_backlog_of_expired_jobs_ahead_delays_the_drain_only_until_swept() {
    let (db, app) = setup();
    let mut c = db.client();
    let drain = |db: &TestDb| -> Duration {
        let started: Started = Arc::default();
        let t = Instant::now();
        let w = fast_worker(&app, tasks(&started))
            .concurrency(4)
            .spawn()
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(120), || {
                db.client()
                    .query_one(
                        "SELECT count(*) FROM postpone_jobs WHERE expires_at IS NULL AND status = 'todo'",
                        &[],
                    )
                    .unwrap()
                    .get::<_, i64>(0)
                    == 0
            }),
            "the due jobs were not drained"
        );
        let took = t.elapsed();
        assert!(w.shutdown(Duration::from_secs(5)).is_clean());
        took
    };
    let live = "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
                SELECT 'default', 'quick', 'null', now() FROM generate_series(1, 2000)";
    c.batch_execute(live).unwrap();
    let empty = drain(&db);
    // Expired jobs of the same task, due an hour before the live ones: first in the
    // claim's order.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, scheduled_at, expires_at)
         SELECT 'default', 'quick', 'null', now() - interval '1 hour', now() - interval '1 minute'
           FROM generate_series(1, 50000);
         ANALYZE postpone_jobs;",
    )
    .unwrap();
    c.batch_execute(live).unwrap();
    let backlog = drain(&db);
    report_figure("drain of 2,000 jobs, empty table", empty);
    report_figure("drain of 2,000 jobs beside 50,000 expired ones", backlog);
    assert!(
        backlog < empty * 10 + Duration::from_secs(5),
        "{backlog:?} against {empty:?}"
    );
    let ran: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE expires_at IS NOT NULL AND status <> 'todo'
                AND NOT (status = 'cancelled' AND expired)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ran, 0, "an expired job was claimed");
}
