//! Deferring from SQL: `postpone_defer(...)` installed by the migrations, called from a
//! trigger on a user table inside the user's transaction, with named optional parameters;
//! listening workers are woken as by a defer from Rust.

use crate::support;
use crate::worker_util;

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use postpone::{Job, JobId, TaskError, Tasks};
use serde_json::json;
use support::*;
use worker_util::*;

const TRIGGER: &str = "
CREATE TABLE signups (id serial PRIMARY KEY, email text NOT NULL);
CREATE FUNCTION signups_welcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM postpone_defer('welcome', jsonb_build_object('email', NEW.email),
                           queue => 'emails', queueing_lock => 'welcome:' || NEW.email);
    RETURN NEW;
END
$$;
CREATE TRIGGER signups_welcome AFTER INSERT ON signups
    FOR EACH ROW EXECUTE FUNCTION signups_welcome();";

#[test]
fn a_trigger_defers_inside_the_users_transaction_and_wakes_the_worker() {
    let (db, app) = setup();
    let mut c = db.client();
    c.batch_execute(TRIGGER).unwrap();

    // Rolled back: no job.
    let mut tx = c.transaction().unwrap();
    tx.execute("INSERT INTO signups (email) VALUES ('gone@x.y')", &[])
        .unwrap();
    tx.rollback().unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "a rolled-back transaction leaves no job");

    let (tx, rx) = mpsc::channel::<String>();
    let tx = Mutex::new(tx);
    let mut tasks = Tasks::new();
    tasks.register("welcome", move |job: &Job| -> Result<(), TaskError> {
        let args: serde_json::Value = job.args()?;
        tx.lock()
            .unwrap()
            .send(args["email"].as_str().unwrap_or_default().to_owned())
            .unwrap();
        Ok(())
    });
    // Polls once a minute: only the notification can start the job quickly.
    let handle = fast_worker(&app, tasks)
        .queues(["emails"])
        .poll_interval(Duration::from_secs(60))
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || listening_backends(
        &db
    ) > 0));
    let t = Instant::now();
    let mut tx = c.transaction().unwrap();
    tx.execute("INSERT INTO signups (email) VALUES ('a@b.c')", &[])
        .unwrap();
    tx.commit().unwrap();
    let got = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(got, "a@b.c");
    assert!(t.elapsed() < Duration::from_secs(20));

    // The queueing lock given by name holds: a second signup of the same address while the
    // first job waits fails the user's statement with the same unique violation a defer gets.
    handle.shutdown(Duration::from_secs(10));
    c.execute("INSERT INTO signups (email) VALUES ('d@e.f')", &[])
        .unwrap();
    let e = c
        .execute("INSERT INTO signups (email) VALUES ('d@e.f')", &[])
        .unwrap_err();
    let db_err = e.as_db_error().expect("a database error");
    assert_eq!(
        db_err.constraint(),
        Some("postpone_jobs_queueing_lock_idx"),
        "{db_err}"
    );
}

#[test]
fn every_parameter_is_optional_and_named() {
    let (db, _app) = setup();
    let mut c = db.client();
    let id: i64 = c
        .query_one("SELECT postpone_defer('plain', '{\"a\": 1}')", &[])
        .unwrap()
        .get(0);
    let full: i64 = c
        .query_one(
            "SELECT postpone_defer('full', '[1, 2]', queue => 'q', priority => 7, lock => 'L', \
             queueing_lock => 'QL', schedule_in => interval '1 hour')",
            &[],
        )
        .unwrap()
        .get(0);
    let at: i64 = c
        .query_one(
            "SELECT postpone_defer(task => 'at', scheduled_at => '2030-01-01T00:00:00Z')",
            &[],
        )
        .unwrap()
        .get(0);
    let row = |id: i64| {
        db.client()
            .query_one(
                "SELECT task, args, queue, priority, lock, queueing_lock, status, \
                 extract(epoch FROM scheduled_at - now())::float8 FROM postpone_jobs WHERE id = $1",
                &[&id],
            )
            .unwrap()
    };
    let r = row(id);
    assert_eq!(r.get::<_, String>(0), "plain");
    assert_eq!(r.get::<_, serde_json::Value>(1), json!({"a": 1}));
    assert_eq!(r.get::<_, String>(2), "default");
    assert_eq!(r.get::<_, i32>(3), 0);
    assert_eq!(r.get::<_, Option<String>>(4), None);
    assert_eq!(r.get::<_, String>(6), "todo");
    assert!(r.get::<_, f64>(7) <= 0.0);
    let r = row(full);
    assert_eq!(r.get::<_, serde_json::Value>(1), json!([1, 2]));
    assert_eq!(r.get::<_, String>(2), "q");
    assert_eq!(r.get::<_, i32>(3), 7);
    assert_eq!(r.get::<_, Option<String>>(4).as_deref(), Some("L"));
    assert_eq!(r.get::<_, Option<String>>(5).as_deref(), Some("QL"));
    let in_secs = r.get::<_, f64>(7);
    assert!((3500.0..=3600.0).contains(&in_secs), "{in_secs}");
    let r = row(at);
    assert_eq!(r.get::<_, serde_json::Value>(1), json!(null));
    assert!(r.get::<_, f64>(7) > 86400.0);

    // The admin API of the library sees them like any job.
    let app = app_at(&db.url(), Duration::from_secs(5));
    let detail = app.admin().job(JobId(full)).unwrap();
    assert_eq!(detail.job.task, "full");

    // Bad input is refused with a message that says what to do.
    for (sql, says) in [
        (
            "SELECT postpone_defer('')",
            "the task name must not be empty",
        ),
        (
            "SELECT postpone_defer('t', queue => '')",
            "the queue name must not be empty",
        ),
        (
            "SELECT postpone_defer('t', lock => '')",
            "must not be empty (leave it out instead)",
        ),
    ] {
        let e = c.query_one(sql, &[]).unwrap_err();
        let text = e.as_db_error().map(|d| d.message().to_owned()).unwrap();
        assert!(text.contains(says), "{sql}: {text}");
    }
}
