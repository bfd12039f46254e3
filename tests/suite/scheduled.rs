//! Scheduled jobs start at their time, not at the next poll: an idle worker sleeps until the
//! next job is due (the claim tells it when), a job deferred for an earlier time moves that
//! wait earlier (its `at:` notification), and neither other queues, paused queues nor jobs
//! the worker cannot take make it spin. Every worker here polls every 30 s, so a job that
//! starts within a second of its time was not found by polling. Margins are wide (the machine is shared):
//! the 10 ms goal is measured by `cargo bench --bench throughput -- --only scheduled`.

use crate::support;
use crate::worker_util;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use postpone::{App, Job, JobId, Tasks, WorkerBuilder, WorkerHandle};
use support::{wait_until, TestDb};
use worker_util::*;

const POLL: Duration = Duration::from_secs(30);
/// How late a job may start, by the database's clock (claim time minus scheduled time).
const MARGIN_S: f64 = 0.5;

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

/// Tasks `work` (records the job id) and `other`.
fn tasks(ran: &Arc<Mutex<Vec<JobId>>>) -> Tasks {
    let mut t = Tasks::new();
    let seen = ran.clone();
    t.register("work", move |job: &Job| {
        seen.lock().unwrap().push(job.id());
        Ok(())
    });
    t
}

fn slow_poller(app: &App, tasks: Tasks) -> WorkerBuilder {
    fast_worker(app, tasks).poll_interval(POLL).concurrency(2)
}

fn defer_in(app: &App, queue: &str, task: &str, ms: u64) -> JobId {
    app.job(task)
        .queue(queue)
        .schedule_in(Duration::from_millis(ms))
        .defer(&())
        .unwrap()
}

/// Seconds from each job's scheduled time to its start, by the database's clock. A job that
/// ran has its start written within moments (with its outcome, for a short one): waits up
/// to 5 s for every start to be there.
fn lateness(db: &TestDb, ids: &[JobId]) -> Vec<f64> {
    let ids: Vec<i64> = ids.iter().map(|i| i.0).collect();
    let read = || -> Vec<Option<f64>> {
        db.client()
            .query(
                "SELECT extract(epoch FROM started_at - scheduled_at)::float8 FROM postpone_jobs
                  WHERE id = ANY($1) ORDER BY id",
                &[&ids],
            )
            .unwrap()
            .iter()
            .map(|r| r.get::<_, Option<f64>>(0))
            .collect()
    };
    wait_until(Duration::from_secs(5), || {
        read().iter().all(Option::is_some)
    });
    read()
        .into_iter()
        .map(|l| l.expect("the job started"))
        .collect()
}

fn all_ran(ran: &Arc<Mutex<Vec<JobId>>>, ids: &[JobId]) -> bool {
    let ran = ran.lock().unwrap();
    ids.iter().all(|i| ran.contains(i))
}

fn assert_on_time(db: &TestDb, ids: &[JobId]) {
    let late = lateness(db, ids);
    for (id, l) in ids.iter().zip(&late) {
        assert!(
            (0.0..MARGIN_S).contains(l),
            "job {id:?} started {l:.3} s after its time (all: {late:?})"
        );
    }
}

#[test]
fn jobs_deferred_for_later_wake_an_idle_listening_worker_at_their_time() {
    let (db, app) = setup();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let handle = slow_poller(&app, tasks(&ran)).spawn().unwrap();
    // Let it settle in its idle wait (nothing due: it waits for the poll, 30 s away).
    std::thread::sleep(Duration::from_millis(300));
    // Deferred latest first, so each one is earlier than what the worker waits for.
    let ids: Vec<JobId> = [900, 600, 300]
        .iter()
        .map(|&ms| defer_in(&app, "default", "work", ms))
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || all_ran(&ran, &ids)),
        "jobs did not start within 5 s (poll is 30 s): {:?}",
        handle.stats()
    );
    assert_on_time(&db, &ids);
    stop(handle);
}

#[test]
fn without_listen_the_claim_says_when_the_next_job_is_due() {
    let (db, app) = setup();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let ids: Vec<JobId> = [700, 1000, 1300]
        .iter()
        .map(|&ms| defer_in(&app, "default", "work", ms))
        .collect();
    let handle = slow_poller(&app, tasks(&ran))
        .listen(false)
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || all_ran(&ran, &ids)),
        "jobs did not start within 5 s (poll is 30 s, no LISTEN): {:?}",
        handle.stats()
    );
    assert_on_time(&db, &ids);
    stop(handle);
}

#[test]
fn an_idle_worker_waiting_for_a_job_hardly_claims() {
    let (db, app) = setup();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let id = defer_in(&app, "default", "work", 2500);
    let handle = slow_poller(&app, tasks(&ran)).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let idle = handle.stats().claims;
    // The first claim, plus a few for wakes of the listener's (re)connection.
    assert!(idle <= 4, "{idle} claims in 1.5 s of waiting");
    assert!(wait_until(Duration::from_secs(5), || all_ran(&ran, &[id])));
    assert_on_time(&db, &[id]);
    assert!(handle.stats().claims <= idle + 3, "{:?}", handle.stats());
    stop(handle);
}

#[test]
fn a_paused_queue_s_scheduled_jobs_neither_wake_nor_delay_the_worker() {
    let (db, app) = setup();
    let ran = Arc::new(Mutex::new(Vec::new()));
    app.admin().pause("held").unwrap();
    // Jobs of the paused queue come due every 20 ms for a second, before the job of ours.
    for i in 0..50 {
        defer_in(&app, "held", "work", 200 + i * 20);
    }
    let id = defer_in(&app, "default", "work", 1500);
    let handle = slow_poller(&app, tasks(&ran)).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(5), || all_ran(&ran, &[id])));
    assert_on_time(&db, &[id]);
    let claims = handle.stats().claims;
    assert!(
        claims <= 8,
        "{claims} claims: the paused queue's jobs woke the worker"
    );
    assert_eq!(
        ran.lock().unwrap().len(),
        1,
        "a job of the paused queue ran"
    );
    stop(handle);
}

#[test]
fn jobs_the_worker_cannot_take_do_not_make_it_spin() {
    let (db, app) = setup();
    let ran = Arc::new(Mutex::new(Vec::new()));
    // Due every 10 ms for a second, of a task this worker does not run.
    for i in 0..100 {
        defer_in(&app, "default", "other", 100 + i * 10);
    }
    let id = defer_in(&app, "default", "work", 1500);
    let handle = slow_poller(&app, tasks(&ran))
        .only_registered_tasks(true)
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || all_ran(&ran, &[id])));
    let claims = handle.stats().claims;
    assert!(
        claims < 40,
        "{claims} claims for 100 jobs it cannot take: the worker spun"
    );
    assert_on_time(&db, &[id]);
    stop(handle);
}

#[test]
fn a_worker_of_given_queues_waits_only_for_their_jobs() {
    let (db, app) = setup();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let handle = slow_poller(&app, tasks(&ran))
        .queues(["mine", "also"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Another queue's jobs, due every 10 ms for a second, announced as they are deferred.
    for i in 0..100 {
        defer_in(&app, "theirs", "work", 100 + i * 10);
    }
    let ids = [
        defer_in(&app, "also", "work", 1200),
        defer_in(&app, "mine", "work", 900),
    ];
    assert!(wait_until(Duration::from_secs(5), || all_ran(&ran, &ids)));
    assert_on_time(&db, &ids);
    let claims = handle.stats().claims;
    assert!(
        claims <= 10,
        "{claims} claims: another queue's jobs woke the worker"
    );
    assert_eq!(ran.lock().unwrap().len(), 2, "a job of another queue ran");
    stop(handle);
}

#[test]
fn a_rate_limited_queue_is_claimed_again_when_its_next_start_is_allowed() {
    let (db, app) = setup();
    app.admin()
        .set_rate_limit("r", 1, Duration::from_secs(1))
        .unwrap();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let w = slow_poller(&app, tasks(&ran)).spawn().unwrap();
    let ids: Vec<JobId> = (0..3)
        .map(|_| app.job("work").queue("r").defer(&()).unwrap())
        .collect();
    // One start per second: the second and third start about 1 s and 2 s after the first,
    // because the claim told the worker when the limit allows the next start (its poll
    // would have waited 30 s, and no notification is sent when a start becomes allowed).
    assert!(
        wait_until(Duration::from_secs(10), || ran.lock().unwrap().len() == 3),
        "{} of 3 ran",
        ran.lock().unwrap().len()
    );
    stop(w);
    let starts: Vec<f64> = db
        .client()
        .query(
            "SELECT extract(epoch FROM started_at)::float8 FROM postpone_jobs
              WHERE id = ANY($1) ORDER BY started_at",
            &[&ids.iter().map(|i| i.0).collect::<Vec<_>>()],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for pair in starts.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= 0.9, "two starts {gap:.3} s apart under 1 per second");
        assert!(gap < 3.0, "the next start came {gap:.3} s later");
    }
}
