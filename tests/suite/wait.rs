//! Job output and progress, and waiting for a job's result: the output is recorded with the
//! success only; `App::wait` is woken by the completion notification, falls back on polling
//! when notifications are lost, times out naming the status, and fails within `io_timeout`
//! on a half-open link.

use crate::support;
use crate::worker_util;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use postpone::{App, ErrorKind, Job, JobId, JobStatus, RetryStrategy, TaskError, Tasks};
use serde_json::json;
use support::*;
use worker_util::*;

const SHUTDOWN: Duration = Duration::from_secs(10);

fn stop(handle: postpone::WorkerHandle) {
    let report = handle.shutdown(SHUTDOWN);
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

#[test]
fn the_output_is_recorded_with_the_success_and_wait_returns_it() {
    let (_db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.register("square", |job: &Job| -> Result<(), TaskError> {
        let n: i64 = job.args()?;
        job.set_progress(&json!({"step": "computing"}))?;
        job.set_output(&json!("replaced"))?;
        job.set_output(&(n * n))?;
        Ok(())
    });
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let result = app
        .job("square")
        .defer_and_wait(&7, Duration::from_secs(20))
        .unwrap();
    assert_eq!(result.status, JobStatus::Succeeded);
    assert!(result.succeeded());
    assert_eq!(result.output_as::<i64>().unwrap(), 49);
    assert_eq!(result.progress, Some(json!({"step": "computing"})));
    assert!(result.progress_at.is_some());
    assert_eq!(result.last_error, None);
    assert_eq!(result.failure(), None);
    // The admin API shows both.
    let detail = app.admin().job(result.id).unwrap();
    assert_eq!(detail.output, Some(json!(49)));
    assert_eq!(detail.progress, Some(json!({"step": "computing"})));
    assert!(detail.progress_at.is_some());
    stop(handle);
}

#[test]
fn only_the_attempt_that_succeeds_records_an_output() {
    let (_db, app) = setup();
    let mut tasks = Tasks::new();
    tasks
        .register("flaky", |job: &Job| -> Result<(), TaskError> {
            job.set_output(&format!("attempt {}", job.attempts()))?;
            if job.attempts() == 1 {
                return Err(TaskError::retry("first attempt fails"));
            }
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 2));
    tasks.register("fails", |job: &Job| -> Result<(), TaskError> {
        job.set_output(&"never stored")?;
        Err(TaskError::fail("no luck"))
    });
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let flaky = app.defer("flaky", &()).unwrap();
    let fails = app.defer("fails", &()).unwrap();
    let r = app.wait(flaky, Duration::from_secs(20)).unwrap();
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.output, Some(json!("attempt 2")));
    let r = app.wait(fails, Duration::from_secs(20)).unwrap();
    assert_eq!(r.status, JobStatus::Failed);
    assert_eq!(r.output, None, "a failed attempt records no output");
    assert_eq!(r.last_error.as_deref(), Some("no luck"));
    assert_eq!(r.failure(), Some("no luck"));
    let e = r.output_as::<String>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState);
    assert!(e.to_string().contains("it is failed (no luck)"), "{e}");
    stop(handle);
}

/// `JobResult.error` held the error of an earlier attempt on a job that then succeeded,
/// and read as the job's error. `last_error` names it for what it is; `failure()` is the
/// error of a job that did not succeed; `error` keeps its old value while deprecated.
#[test]
fn a_job_that_succeeded_after_a_failed_attempt_has_a_last_error_but_no_failure() {
    let (_db, app) = setup();
    let mut tasks = Tasks::new();
    tasks
        .register("flaky", |job: &Job| -> Result<(), TaskError> {
            if job.attempts() == 1 {
                return Err(TaskError::retry("first attempt fails"));
            }
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 2));
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let id = app.defer("flaky", &()).unwrap();
    let r = app.wait(id, Duration::from_secs(20)).unwrap();
    assert!(r.succeeded(), "{r:?}");
    assert_eq!(r.last_error.as_deref(), Some("first attempt fails"));
    assert_eq!(r.failure(), None, "a succeeded job has no failure");
    #[allow(deprecated)]
    let old = r.error.clone();
    assert_eq!(old, r.last_error, "the deprecated name keeps its value");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["last_error"], "first attempt fails");
    stop(handle);
}

#[test]
fn oversized_output_and_progress_are_refused_with_clear_errors() {
    let (_db, app) = setup();
    let (tx, rx) = mpsc::channel::<(String, String)>();
    let tx = std::sync::Mutex::new(tx);
    let mut tasks = Tasks::new();
    tasks.register("big", move |job: &Job| -> Result<(), TaskError> {
        let huge = "x".repeat(postpone::MAX_OUTPUT_BYTES);
        let e1 = job.set_output(&huge).unwrap_err();
        let e2 = job
            .set_progress(&"y".repeat(postpone::MAX_PROGRESS_BYTES))
            .unwrap_err();
        assert_eq!(e1.kind(), ErrorKind::InvalidInput);
        assert_eq!(e2.kind(), ErrorKind::InvalidInput);
        tx.lock()
            .unwrap()
            .send((e1.to_string(), e2.to_string()))
            .unwrap();
        job.set_output(&"small")?;
        Ok(())
    });
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let r = app
        .job("big")
        .defer_and_wait(&(), Duration::from_secs(20))
        .unwrap();
    let (e1, e2) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        e1.contains(
            "recording the job output: it is 1048578 bytes of JSON, more than the 1048576 allowed"
        ),
        "{e1}"
    );
    assert!(e2.contains("recording the job progress"), "{e2}");
    assert!(e2.contains("more than the 65536 allowed"), "{e2}");
    assert_eq!(r.output, Some(json!("small")));
    assert_eq!(r.progress, None);
    stop(handle);
}

/// Waits until a backend of this database has run the waiter's read and sits idle: the
/// waiter is then inside its notification wait.
fn waiter_is_waiting(db: &TestDb) -> bool {
    let mut c = db.client();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state = 'idle' AND query LIKE '%output, progress, progress_at, errors FROM postpone_jobs%'",
            &[],
        )
        .unwrap()
        .get(0);
    n > 0
}

fn finish_by_hand(db: &TestDb, id: JobId) {
    db.client()
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded', output = '\"by hand\"', finished_at = now() WHERE id = $1",
            &[&id.get()],
        )
        .unwrap();
}

fn app_polling_every(db: &TestDb, poll: Duration) -> App {
    App::builder(db.url())
        .pool_size(2)
        .wait_poll_interval(poll)
        .io_timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

#[test]
fn wait_is_woken_by_the_completion_notification() {
    let (db, app) = setup();
    // Reads every 5 minutes at most: only the notification can end the wait in time.
    let waiter_app = app_polling_every(&db, Duration::from_secs(300));
    let id = app.defer("later", &()).unwrap();
    let waiter = thread::spawn(move || waiter_app.wait(id, Duration::from_secs(120)));
    assert!(wait_until(Duration::from_secs(10), || waiter_is_waiting(
        &db
    )));
    let t = Instant::now();
    finish_by_hand(&db, id);
    let r = waiter.join().unwrap().unwrap();
    report_figure("wait woken by the completion notification", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.output, Some(json!("by hand")));
}

#[test]
fn wait_polls_when_the_notification_is_lost() {
    let (db, app) = setup();
    db.client()
        .batch_execute("ALTER TABLE postpone_jobs DISABLE TRIGGER postpone_jobs_done")
        .unwrap();
    let waiter_app = app_polling_every(&db, Duration::from_millis(200));
    let id = app.defer("later", &()).unwrap();
    let waiter = thread::spawn(move || waiter_app.wait(id, Duration::from_secs(120)));
    assert!(wait_until(Duration::from_secs(10), || waiter_is_waiting(
        &db
    )));
    finish_by_hand(&db, id);
    let t = Instant::now();
    let r = waiter.join().unwrap().unwrap();
    report_figure(
        "wait without notification, polling every 200 ms",
        t.elapsed(),
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(r.status, JobStatus::Succeeded);
}

#[test]
fn a_job_deleted_when_it_finishes_is_reported_as_such() {
    let (_db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.register("quick", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
    let handle = fast_worker(&app, tasks)
        .delete_finished(postpone::DeleteJobs::Always)
        .spawn()
        .unwrap();
    let e = app
        .job("quick")
        .defer_and_wait(&(), Duration::from_secs(20))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(
        e.to_string()
            .contains("no such job (or it was deleted when it finished"),
        "{e}"
    );
    stop(handle);
}

#[test]
fn wait_times_out_naming_the_status_and_refuses_unknown_jobs() {
    let (_db, app) = setup();
    let id = app.defer("nobody_runs_this", &()).unwrap();
    let t = Instant::now();
    let e = app.wait(id, Duration::from_millis(300)).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(
        e.to_string()
            .contains(&format!("waiting for job {id}: still todo after")),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("without a running worker that serves its queue and registers its task"),
        "a job nobody takes says where to look: {e}"
    );
    let e = app
        .wait(JobId(id.get() + 1000), Duration::from_secs(5))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("there is no such job"), "{e}");
    // The state now, finished or not.
    let now = app.job_result(id).unwrap();
    assert_eq!(now.status, JobStatus::Todo);
    assert_eq!(
        app.job_result(JobId(id.get() + 1000)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn a_half_open_link_during_a_wait_is_an_error_within_io_timeout() {
    let (db, app) = setup();
    let proxy = FaultProxy::start(&db.server_addr());
    let io_timeout = Duration::from_secs(2);
    let via_proxy = App::builder(db.url_via(&proxy))
        .pool_size(2)
        .io_timeout(io_timeout)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let id = app.defer("nobody_runs_this", &()).unwrap();
    let waiter = thread::spawn(move || {
        let r = via_proxy.wait(id, Duration::from_secs(120));
        (r, Instant::now())
    });
    assert!(wait_until(Duration::from_secs(10), || waiter_is_waiting(
        &db
    )));
    let stranded = Instant::now();
    proxy.strand_all();
    let (r, ended) = waiter.join().unwrap();
    let took = ended - stranded;
    report_figure(
        "wait on a half-open link, io_timeout 2 s, failed after",
        took,
    );
    let e = r.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Closed),
        "{e}"
    );
    assert!(
        e.to_string().contains(&format!("waiting for job {id}")),
        "{e}"
    );
    assert!(
        took <= io_timeout + Duration::from_millis(700),
        "the wait noticed the half-open link after {took:?} (io_timeout {io_timeout:?})"
    );
}

/// The notifications of `postpone_done` that arrive within `within` on a listening client.
fn done_payloads(listener: &mut postgres::Client, within: Duration) -> Vec<String> {
    use postgres::fallible_iterator::FallibleIterator;
    listener
        .notifications()
        .timeout_iter(within)
        .iterator()
        .map(|n| n.unwrap().payload().to_owned())
        .collect()
}

#[test]
fn completions_notify_only_the_jobs_someone_waits_for() {
    let (db, app) = setup();
    let mut listener = db.client();
    listener.batch_execute("LISTEN postpone_done").unwrap();
    // Nobody waits: finishing a job sends nothing (such a notification would serialise the
    // commits of every completer on the server).
    let alone = app.defer("later", &()).unwrap();
    finish_by_hand(&db, alone);
    assert_eq!(
        done_payloads(&mut listener, Duration::from_millis(500)),
        Vec::<String>::new()
    );

    // One job waited for, one not, finished by one statement: only the first is named.
    let waited = app.defer("later", &()).unwrap();
    let other = app.defer("later", &()).unwrap();
    let waiter_app = app_polling_every(&db, Duration::from_secs(300));
    let waiter = thread::spawn(move || waiter_app.wait(waited, Duration::from_secs(120)));
    assert!(wait_until(Duration::from_secs(10), || waiter_is_waiting(
        &db
    )));
    db.client()
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = ANY($1)",
            &[&vec![waited.get(), other.get()]],
        )
        .unwrap();
    assert_eq!(waiter.join().unwrap().unwrap().status, JobStatus::Succeeded);
    assert_eq!(
        done_payloads(&mut listener, Duration::from_millis(500)),
        vec![waited.get().to_string()]
    );
    // The waiter removed its registration when it returned.
    let left: i64 = db
        .client()
        .query_one("SELECT count(*) FROM postpone_waiters", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}
