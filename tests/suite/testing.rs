//! The test helpers for users (`postpone::testing`, feature `test-util`), used the way a
//! program's own tests would use them: take a mark, call the code under test, assert what it
//! deferred, then run those jobs in the test's thread with the real task code.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use postpone::testing::Mark;
use postpone::{App, Job, JobStatus, RetryStrategy, TaskError, Tasks};
use serde_json::json;
use support::*;

/// The code under test: records an order and, in the same transaction, defers its shipping
/// and a reminder a day later.
fn place_order(
    app: &App,
    client: &mut postgres::Client,
    order: i32,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut tx = client.transaction()?;
    tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&order])?;
    app.job("ship")
        .queue("shipping")
        .lock(format!("order:{order}"))
        .defer_in(&mut tx, &json!({ "order": order }))?;
    app.job("remind")
        .schedule_in(Duration::from_secs(86_400))
        .defer_in(&mut tx, &json!({ "order": order }))?;
    tx.commit()?;
    Ok(())
}

fn setup() -> (TestDb, App, postgres::Client) {
    init_logging();
    let db = TestDb::new();
    let app = App::builder(db.url()).pool_size(2).build().unwrap();
    app.migrate().unwrap();
    let mut client = db.client();
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, shipped bool NOT NULL DEFAULT false)",
        )
        .unwrap();
    (db, app, client)
}

#[test]
fn assert_what_the_code_deferred() {
    let (_db, app, mut client) = setup();
    app.defer("ship", &json!({"order": 0})).unwrap(); // before the mark: not seen
    let mark = Mark::new(&app).unwrap();
    place_order(&app, &mut client, 7).unwrap();

    let deferred = mark.deferred().unwrap();
    assert_eq!(deferred.len(), 2);
    let ship = deferred.assert_one("ship", &json!({"order": 7}));
    assert_eq!(ship.queue, "shipping");
    assert_eq!(ship.lock.as_deref(), Some("order:7"));
    assert_eq!(ship.status, JobStatus::Todo);
    assert_eq!(ship.args_as::<serde_json::Value>().unwrap()["order"], 7);
    let remind = deferred.assert_one("remind", &json!({"order": 7}));
    let due_in = remind.due_in(SystemTime::now());
    assert!(due_in > Duration::from_secs(86_000), "{due_in:?}");
    deferred.assert_none("refund");

    // The assertions fail with a list of what was deferred.
    let caught = std::panic::catch_unwind(|| {
        deferred.assert_one("ship", &json!({"order": 8}));
    })
    .unwrap_err();
    let text = caught.downcast_ref::<String>().unwrap();
    assert!(text.contains("expected one job of task \"ship\""), "{text}");
    assert!(
        text.contains("ship {\"order\":7} on \"shipping\""),
        "{text}"
    );
}

#[test]
fn run_the_deferred_jobs_synchronously_with_the_real_tasks() {
    let (db, app, mut client) = setup();
    let mark = Mark::new(&app).unwrap();
    place_order(&app, &mut client, 1).unwrap();

    let flaky_runs = Arc::new(AtomicU32::new(0));
    let mut tasks = Tasks::new();
    tasks.register("ship", |job: &Job| -> Result<(), TaskError> {
        let order: i32 = job.args::<serde_json::Value>()?["order"]
            .as_i64()
            .unwrap_or_default() as i32;
        let mut conn = job.app().connection()?;
        conn.execute("UPDATE orders SET shipped = true WHERE id = $1", &[&order])?;
        // A job deferred by a job is run by the same call.
        job.app().defer("notify", &json!({ "order": order }))?;
        job.set_output(&"shipped")?;
        Ok(())
    });
    let runs = flaky_runs.clone();
    tasks
        .register("notify", move |_job: &Job| -> Result<(), TaskError> {
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(TaskError::retry("mail server busy"));
            }
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 3));
    tasks.register("remind", |_job: &Job| -> Result<(), TaskError> {
        panic!("reminders are broken")
    });

    let ran = mark.run(&tasks).unwrap();
    let summary: Vec<(&str, u32, JobStatus)> = ran
        .iter()
        .map(|r| (r.task.as_str(), r.attempt, r.status))
        .collect();
    // The reminder is scheduled tomorrow: not run. The retry with no delay runs at once.
    assert_eq!(
        summary,
        vec![
            ("ship", 1, JobStatus::Succeeded),
            ("notify", 1, JobStatus::Todo),
            ("notify", 2, JobStatus::Succeeded),
        ]
    );
    assert_eq!(ran[0].output, Some(json!("shipped")));
    assert_eq!(ran[1].error.as_deref(), Some("mail server busy"));
    let shipped: bool = db
        .client()
        .query_one("SELECT shipped FROM orders WHERE id = 1", &[])
        .unwrap()
        .get(0);
    assert!(shipped);
    // Outcomes are on the jobs, as a worker records them.
    let r = app.job_result(ran[0].id).unwrap();
    assert_eq!(
        (r.status, r.output),
        (JobStatus::Succeeded, Some(json!("shipped")))
    );

    // Scheduled jobs run on request; a panic fails the job with its message.
    let ran = mark.run_scheduled_too(&tasks).unwrap();
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].task, "remind");
    assert_eq!(ran[0].status, JobStatus::Failed);
    assert_eq!(
        ran[0].error.as_deref(),
        Some("task panicked: reminders are broken")
    );

    // A task the registry lacks fails its job, naming it.
    app.defer("unknown", &()).unwrap();
    let ran = mark.run(&tasks).unwrap();
    assert_eq!(ran[0].status, JobStatus::Failed);
    assert!(ran[0]
        .error
        .as_deref()
        .unwrap()
        .contains("task \"unknown\" is not registered"));
    assert!(mark.run(&tasks).unwrap().is_empty(), "nothing left to run");
}

#[test]
fn a_snooze_in_mark_run_gives_the_attempt_back_as_a_worker_does() {
    let (_db, app, _client) = setup();
    let mark = Mark::new(&app).unwrap();
    let id = app.defer("nap", &0).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let mut tasks = Tasks::new();
    let n = runs.clone();
    // The default strategy allows one attempt: had the snooze used it, the job would fail.
    tasks.register("nap", move |_job: &Job| -> Result<(), TaskError> {
        if n.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(TaskError::snooze(Duration::ZERO));
        }
        Ok(())
    });
    let ran = mark.run(&tasks).unwrap();
    let summary: Vec<(u32, JobStatus)> = ran.iter().map(|r| (r.attempt, r.status)).collect();
    assert_eq!(
        summary,
        vec![(1, JobStatus::Todo), (1, JobStatus::Succeeded)]
    );
    assert_eq!(ran[0].error, None, "a snooze is not an error");
    let d = app.admin().job(id).unwrap();
    assert_eq!((d.snoozes, d.job.attempts), (1, 1));
}

/// `Mark::run` records an outcome the way a worker does: an abort requested while the task
/// ran wins over the success it returned (the job ends `aborted`, its output not kept), and
/// a dependent of a job that ends failed is cancelled.
#[test]
fn mark_run_records_outcomes_as_a_worker_does() {
    let (_db, app, _client) = setup();
    let mark = Mark::new(&app).unwrap();
    let aborted = app.defer("self_abort", &json!(null)).unwrap();
    let failing = app.defer("fail", &json!(null)).unwrap();
    let dependent = app
        .job("never")
        .after(&[failing])
        .defer(&json!(null))
        .unwrap();
    let mut tasks = Tasks::new();
    let admin_app = app.clone();
    tasks.register("self_abort", move |job: &Job| -> Result<(), TaskError> {
        admin_app.admin().abort(job.id()).unwrap();
        job.set_output(&"kept?")?;
        Ok(())
    });
    tasks.register("fail", |_job: &Job| -> Result<(), TaskError> {
        Err(TaskError::fail("no"))
    });
    tasks.register("never", |_job: &Job| -> Result<(), TaskError> {
        panic!("a dependent of a failed job ran")
    });
    let ran = mark.run(&tasks).unwrap();
    let of = |id| ran.iter().find(|r| r.id == id).map(|r| r.status);
    assert_eq!(of(aborted), Some(JobStatus::Aborted), "{ran:?}");
    assert_eq!(of(failing), Some(JobStatus::Failed), "{ran:?}");
    assert_eq!(of(dependent), None, "{ran:?}");
    let result = app.job_result(aborted).unwrap();
    assert_eq!(result.status, JobStatus::Aborted);
    assert_eq!(result.output, None);
    let dep = app.admin().job(dependent).unwrap();
    assert_eq!(dep.job.status, JobStatus::Cancelled);
}

/// The names renamed in issue 36 still compile, deprecated: `postpone::Executor` (now
/// `DeferClient`) and `testing::Deferred` (now `DeferredJob`).
#[test]
#[allow(deprecated)]
fn the_former_names_of_renamed_items_still_work() {
    fn defer_with<C: postpone::Executor + ?Sized>(app: &App, client: &mut C) -> postpone::JobId {
        app.job("place_order")
            .defer_in(client, &json!({"n": 1}))
            .unwrap()
    }
    let (_db, app, _client) = setup();
    let mark = Mark::new(&app).unwrap();
    let mut conn = app.connection().unwrap();
    let id = defer_with(&app, &mut conn);
    let jobs = mark.deferred().unwrap();
    let first: &postpone::testing::Deferred = &jobs[0];
    assert_eq!(first.id, id);
}
