//! Least privilege against the real server: each part of a deployment (worker, producer,
//! dashboard reader, migrator) runs under a role of its own that holds exactly what
//! `postpone grants ROLE --for PART` printed, does its whole job, and is refused the rest.
//! Every role is made for its test and dropped after it (support/role.rs).

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use postpone::{
    App, DeleteJobs, GrantsFor, Job, JobId, NewJob, Retention, RetryStrategy, TaskError, Tasks,
    Unique, UniqueStates, Vacuum, Worker,
};
use serde_json::json;
use support::*;

// --- what the tests share -------------------------------------------------------------

/// Every log line of this test binary, for the tests that check what a worker said.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}", r.level(), r.args());
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }
    fn flush(&self) {}
}

fn captured() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(c).expect("the only logger of this binary");
        log::set_max_level(log::LevelFilter::Info);
        c
    })
}

fn lines_with(needle: &str) -> Vec<String> {
    captured()
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

/// An App on `url` with a small pool.
fn app_at(url: &str) -> App {
    App::builder(url)
        .pool_size(3)
        .io_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_else(|e| panic!("an App on {url}: {e}"))
}

/// The schema installed by the server's own user, the database owner (the migrator of
/// most tests).
fn owner_app(db: &TestDb) -> App {
    let app = app_at(&db.url());
    app.migrate().expect("migrate");
    app
}

/// Runs what `grants` prints for `role` as `part`, as `app`'s user.
fn grant(app: &App, role: &TestRole, part: GrantsFor) {
    let sql = app.admin().grants(role.name(), part).expect("grants");
    assert!(!sql.contains("-- left out"), "{sql}");
    app.connection()
        .unwrap()
        .batch_execute(&sql)
        .unwrap_or_else(|e| panic!("running the grants for {part}: {e}\n{sql}"));
}

/// The SQLSTATE of `sql` run as a plain client, or `None` when it succeeded.
fn sqlstate_of(c: &mut postgres::Client, sql: &str) -> Option<String> {
    match c.batch_execute(sql) {
        Ok(()) => None,
        Err(e) => Some(
            e.code()
                .map_or_else(|| format!("no sqlstate: {e}"), |s| s.code().to_string()),
        ),
    }
}

fn assert_denied(c: &mut postgres::Client, sql: &str) {
    assert_eq!(
        sqlstate_of(c, sql).as_deref(),
        Some("42501"),
        "expected insufficient_privilege for {sql}"
    );
}

fn status_of(app: &App, id: JobId) -> String {
    app.connection()
        .unwrap()
        .query_one(
            "SELECT status FROM postpone_jobs WHERE id = $1",
            &[&id.get()],
        )
        .map(|r| r.get(0))
        .unwrap_or_else(|_| "gone".into())
}

/// Every postpone object of the installed schema, as the test itself reads the
/// catalogue: `(kind, name)`, kind being `table`, `view`, `sequence`, `identity sequence`,
/// `index`, `function`, `trigger function`, `definer function`, `type`, or
/// `relation <relkind>` / `routine <prokind>` for anything else.
fn postpone_objects(c: &mut postgres::Client) -> Vec<(String, String)> {
    c.query(
        r"
WITH ns AS (SELECT relnamespace AS oid FROM pg_class WHERE oid = 'postpone_migrations'::regclass)
SELECT CASE WHEN c.relkind IN ('r', 'p') THEN 'table'
            WHEN c.relkind IN ('v', 'm') THEN 'view'
            WHEN c.relkind IN ('i', 'I') THEN 'index'
            WHEN c.relkind = 'S' AND EXISTS (
                SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                   AND d.objid = c.oid AND d.deptype = 'i') THEN 'identity sequence'
            WHEN c.relkind = 'S' THEN 'sequence'
            ELSE 'relation ' || c.relkind::text END, c.relname::text
  FROM pg_class c, ns WHERE c.relnamespace = ns.oid AND c.relname LIKE 'postpone\_%'
UNION ALL
SELECT CASE WHEN p.prosecdef THEN 'definer function'
            WHEN p.prorettype = 'trigger'::regtype THEN 'trigger function'
            WHEN p.prokind = 'f' THEN 'function'
            ELSE 'routine ' || p.prokind::text END, p.proname::text
  FROM pg_proc p, ns WHERE p.pronamespace = ns.oid AND p.proname LIKE 'postpone\_%'
UNION ALL
SELECT 'type', t.typname::text
  FROM pg_type t, ns WHERE t.typnamespace = ns.oid AND t.typname LIKE 'postpone\_%' AND t.typrelid = 0
ORDER BY 2",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The objects no part's grants name, except those that need no grant of their own
/// (indexes, identity sequences and trigger functions follow their table).
fn uncovered(app: &App, db: &TestDb) -> Vec<(String, String)> {
    let mut granted = String::new();
    for part in [GrantsFor::Worker, GrantsFor::Producer, GrantsFor::Reader] {
        let sql = app.admin().grants("coverage_probe", part).unwrap();
        // Only the statements count, not the comments.
        for line in sql.lines().filter(|l| l.starts_with("GRANT")) {
            granted.push_str(line);
            granted.push('\n');
        }
    }
    postpone_objects(&mut db.client())
        .into_iter()
        .filter(|(kind, name)| {
            let implied = matches!(
                kind.as_str(),
                "index" | "identity sequence" | "trigger function"
            );
            !implied && !granted.contains(&format!("\"{name}\""))
        })
        .collect()
}

// --- coverage: every object is some part's ----------------------------------------------

#[test]
fn every_postpone_object_of_the_installed_schema_is_covered_by_a_rule() {
    let db = TestDb::new();
    let app = owner_app(&db);
    let all = postpone_objects(&mut db.client());
    // The check reads the real catalogue, not an empty list.
    for expected in [
        ("table", "postpone_jobs"),
        ("function", "postpone_defer"),
        ("identity sequence", "postpone_jobs_id_seq"),
        ("trigger function", "postpone_notify_jobs"),
    ] {
        assert!(
            all.iter()
                .any(|(k, n)| (k.as_str(), n.as_str()) == expected),
            "{expected:?} not in {all:?}"
        );
    }
    assert!(all.len() > 40, "{all:?}");
    assert_eq!(
        uncovered(&app, &db),
        vec![],
        "objects no part's rule covers"
    );
    for part in GrantsFor::ALL {
        let sql = app.admin().grants("coverage_probe", part).unwrap();
        assert!(!sql.contains("-- left out"), "{part}: {sql}");
    }
}

#[test]
fn an_object_a_later_migration_adds_is_covered_by_the_rules_or_named_by_the_check() {
    let db = TestDb::new();
    let app = owner_app(&db);
    // What later migrations add: a table of worker state, a table of operator settings, a
    // function that reads.
    app.connection()
        .unwrap()
        .batch_execute(
            "CREATE TABLE postpone_future_things (id bigint GENERATED ALWAYS AS IDENTITY, note text);
             CREATE TABLE postpone_future_limits (queue text PRIMARY KEY, n int);
             CREATE FUNCTION postpone_future_count() RETURNS bigint LANGUAGE sql STABLE
                 AS 'SELECT count(*) FROM postpone_future_things'",
        )
        .unwrap();
    let worker = app.admin().grants("w", GrantsFor::Worker).unwrap();
    assert!(worker.contains(
        r#"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."postpone_future_things" TO "w";"#
    ));
    assert!(worker.contains(r#"GRANT SELECT ON TABLE "public"."postpone_future_limits" TO "w";"#));
    let reader = app.admin().grants("r", GrantsFor::Reader).unwrap();
    assert!(
        reader.contains(r#"GRANT EXECUTE ON FUNCTION "public"."postpone_future_count"() TO "r";"#)
    );
    assert_eq!(uncovered(&app, &db), vec![]);

    // Objects no rule may guess at: a type, and a function that runs with its owner's
    // privileges. The check names them, and the grants leave them out and say so.
    app.connection()
        .unwrap()
        .batch_execute(
            "CREATE TYPE postpone_mood AS ENUM ('calm');
             CREATE FUNCTION postpone_sudo() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'",
        )
        .unwrap();
    assert_eq!(
        uncovered(&app, &db),
        vec![
            ("type".to_string(), "postpone_mood".to_string()),
            ("definer function".to_string(), "postpone_sudo".to_string()),
        ]
    );
    let worker = app.admin().grants("w", GrantsFor::Worker).unwrap();
    let (_, tail) = worker.split_once("COMMIT;\n").unwrap();
    assert!(
        tail.contains(r#"-- left out: type (typtype e) TYPE "public"."postpone_mood""#),
        "{tail}"
    );
    assert!(tail.contains(r#"-- left out: SECURITY DEFINER function (prokind f) FUNCTION "public"."postpone_sudo"()"#), "{tail}");
}

// --- the worker -----------------------------------------------------------------------

#[test]
fn a_worker_role_runs_every_part_of_a_worker_without_ddl_or_ownership() {
    captured();
    let db = TestDb::new();
    let owner = owner_app(&db);
    let wrole = TestRole::new(&db, "w");
    let prole = TestRole::new(&db, "p");
    grant(&owner, &wrole, GrantsFor::Worker);
    grant(&owner, &prole, GrantsFor::Producer);
    let wapp = app_at(&wrole.url(&db));
    let papp = app_at(&prole.url(&db));
    // Programs call migrate at start: on a current schema it finds nothing to do, whatever
    // the role.
    assert_eq!(wapp.migrate().unwrap(), Vec::<i32>::new());
    assert_eq!(papp.migrate().unwrap(), Vec::<i32>::new());

    // A worker that died an hour ago holding a job: the rescue (as the worker role)
    // requeues it.
    let rescued: i64 = owner
        .connection()
        .unwrap()
        .query_one(
            "WITH w AS (INSERT INTO postpone_workers (id, name, last_heartbeat)
                        VALUES (900, 'ghost', now() - interval '1 hour'))
             INSERT INTO postpone_jobs (queue, task, args, status, attempts, worker_id, started_at)
             VALUES ('default', 'ok', '{\"rescued\": true}', 'doing', 1, 900, now() - interval '1 hour')
             RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);

    let follow_ups = Arc::new(AtomicUsize::new(0));
    let flaky_failed = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = crossbeam_channel::bounded::<JobId>(1);
    let mut tasks = Tasks::new();
    tasks.register("ok", |job: &Job| -> Result<(), TaskError> {
        job.set_progress(&json!({"half": true}))
            .map_err(TaskError::retry)?;
        job.set_output(&json!({"done": job.id().get()}))
            .map_err(TaskError::retry)?;
        // A follow-up deferred by the task, through the worker's App.
        job.app()
            .defer("follow", &json!({"after": job.id().get()}))
            .map_err(TaskError::retry)?;
        Ok(())
    });
    let f = follow_ups.clone();
    tasks.register("follow", move |_: &Job| -> Result<(), TaskError> {
        f.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let ff = flaky_failed.clone();
    tasks
        .register("flaky", move |_: &Job| -> Result<(), TaskError> {
            if ff.swap(true, Ordering::SeqCst) {
                Ok(())
            } else {
                Err(TaskError::retry_in("first attempt fails", Duration::ZERO))
            }
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 3));
    tasks.register("slow", move |job: &Job| -> Result<(), TaskError> {
        let _ = started_tx.send(job.id());
        while !job.should_abort() {
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(TaskError::retry("interrupted"))
    });
    tasks.register("tick", |_: &Job| -> Result<(), TaskError> { Ok(()) });
    tasks.periodic("tick", "* * * * * *");

    let name = format!("least-privilege-{}", wrole.name());
    let worker = Worker::builder(&wapp, tasks)
        .name(name.clone())
        .concurrency(3)
        .poll_interval(Duration::from_millis(500))
        .heartbeat_interval(Duration::from_millis(200))
        .stalled_after(Duration::from_secs(2))
        .vacuum(
            Vacuum::default()
                .dead_rows(0)
                .live_fraction(0.0)
                .check_every(Duration::from_millis(100)),
        )
        .shutdown_graceful_timeout(Duration::from_secs(2))
        .spawn()
        .expect("a worker under the worker role");

    let ok = papp.defer("ok", &json!({"n": 1})).unwrap();
    let flaky = papp.defer("flaky", &json!(null)).unwrap();
    let slow = papp
        .job("slow")
        .lock("one-at-a-time")
        .defer(&json!(null))
        .unwrap();
    let done = |id: JobId| status_of(&owner, id) == "succeeded";
    assert!(
        wait_until(Duration::from_secs(30), || {
            done(ok)
                && done(flaky)
                && done(JobId::from(rescued))
                && follow_ups.load(Ordering::SeqCst) >= 2
        }),
        "jobs: ok {}, flaky {}, rescued {}, follow-ups {}",
        status_of(&owner, ok),
        status_of(&owner, flaky),
        status_of(&owner, JobId::from(rescued)),
        follow_ups.load(Ordering::SeqCst)
    );
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(20)).ok(),
        Some(slow),
        "the slow job never started"
    );
    let mut c = owner.connection().unwrap();
    // Waiting for a result (LISTEN, a row in postpone_waiters) works under the role too.
    let result = wapp.wait(ok, Duration::from_secs(10)).unwrap();
    assert_eq!(result.status, postpone::JobStatus::Succeeded);
    assert_eq!(result.output, Some(json!({"done": ok.get()})));
    let flaky_attempts: i32 = c
        .query_one(
            "SELECT attempts FROM postpone_jobs WHERE id = $1",
            &[&flaky.get()],
        )
        .unwrap()
        .get(0);
    assert_eq!(flaky_attempts, 2);
    // Periodic instants recorded and run; heartbeats moving.
    assert!(
        wait_until(Duration::from_secs(20), || {
            c.query_one(
                "SELECT count(*) FROM postpone_jobs j JOIN postpone_periodic p ON p.job_id = j.id
                  WHERE j.status = 'succeeded'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
                >= 2
        }),
        "no periodic tick ran under the worker role"
    );
    assert!(
        wait_until(Duration::from_secs(10), || {
            c.query_one(
                "SELECT coalesce(bool_or(last_heartbeat > started_at + interval '300 ms'), false)
                   FROM postpone_workers WHERE name = $1",
                &[&name],
            )
            .unwrap()
            .get::<_, bool>(0)
        }),
        "no heartbeat recorded under the worker role"
    );
    // The vacuum needs ownership: one clear line, once.
    let said = format!(
        "worker {name}: not vacuuming postpone_jobs: role {} does not own it",
        wrole.name()
    );
    assert!(
        wait_until(Duration::from_secs(20), || !lines_with(&said).is_empty()),
        "the worker never said why it does not vacuum"
    );

    let report = worker.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
    assert_eq!(lines_with(&said).len(), 1, "{:?}", lines_with(&said));
    assert_eq!(
        status_of(&owner, slow),
        "todo",
        "the interrupted job goes back to its queue"
    );
    let rows: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_workers WHERE name = $1",
            &[&name],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "the worker's row is deleted at shutdown");

    // Retention deletes finished jobs under the same role.
    let mut idle = Tasks::new();
    idle.register("unused", |_: &Job| -> Result<(), TaskError> { Ok(()) });
    let pruner = Worker::builder(&wapp, idle)
        .queues(["nothing-here"])
        .vacuum(Vacuum::off())
        .delete_finished(DeleteJobs::Never)
        .retention(Retention::new(Duration::from_millis(1)).interval(Duration::from_millis(200)))
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || {
            c.query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
                == 0
        }),
        "retention deleted nothing under the worker role"
    );
    assert!(pruner.shutdown(Duration::from_secs(10)).is_clean());

    // On an older schema, its migrate is refused with the remedy.
    let mut oc = owner.connection().unwrap();
    // (The record of the latest migration taken away, then put back: migrations are not
    // written to run twice.)
    oc.batch_execute(
        "CREATE TEMP TABLE latest AS SELECT * FROM postpone_migrations
          WHERE version = (SELECT max(version) FROM postpone_migrations);
         DELETE FROM postpone_migrations WHERE version = (SELECT version FROM latest)",
    )
    .unwrap();
    let e = wapp.migrate().unwrap_err();
    assert_eq!(e.sqlstate(), Some("42501"), "{e}");
    assert!(
        e.to_string().starts_with(
            "migrating the schema: this role may not change postpone's objects (run migrate as the role that owns them; see docs/roles.md): applying migration"
        ),
        "{e}"
    );
    oc.batch_execute("INSERT INTO postpone_migrations SELECT * FROM latest; DROP TABLE latest")
        .unwrap();
    assert_eq!(owner.migrate().unwrap(), Vec::<i32>::new());

    // And nothing else: no DDL, no settings, no ownership.
    let mut w = wrole.client(&db);
    for sql in [
        "CREATE TABLE postpone_mine (id int)",
        "CREATE FUNCTION postpone_mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "ALTER TABLE postpone_jobs ADD COLUMN mine int",
        "CREATE INDEX ON postpone_jobs (task)",
        "DROP TABLE postpone_workers",
        "TRUNCATE postpone_jobs",
        "INSERT INTO postpone_paused_queues (queue) VALUES ('q')",
        "INSERT INTO postpone_queue_limits (queue, max_running) VALUES ('q', 1)",
        "DELETE FROM postpone_rate_limits",
        "DELETE FROM postpone_migrations",
        "CREATE OR REPLACE FUNCTION postpone_wake(q text) RETURNS void LANGUAGE sql AS 'SELECT'",
    ] {
        assert_denied(&mut w, sql);
    }
    let owned: i64 = w
        .query_one(
            "SELECT (SELECT count(*) FROM pg_class WHERE relowner = current_user::regrole)
                  + (SELECT count(*) FROM pg_proc WHERE proowner = current_user::regrole)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(owned, 0);
}

// --- the producer ---------------------------------------------------------------------

#[test]
fn a_producer_role_defers_every_way_and_sees_no_arguments() {
    let db = TestDb::new();
    let owner = owner_app(&db);
    let prole = TestRole::new(&db, "p");
    grant(&owner, &prole, GrantsFor::Producer);
    let papp = app_at(&prole.url(&db));

    let mut ids = vec![
        papp.defer("t", &json!({"secret": "s3"})).unwrap(),
        papp.job("t")
            .queue("q")
            .priority(5)
            .lock("l")
            .queueing_lock("ql")
            .schedule_in(Duration::from_secs(60))
            .defer(&json!(1))
            .unwrap(),
    ];
    ids.extend(
        papp.defer_batch(&[
            NewJob::new("t", &json!(2)).unwrap(),
            NewJob::new("t", &json!(3)).unwrap(),
        ])
        .unwrap(),
    );
    // A second waiting job of a queueing lock: refused, by name.
    let e = papp
        .job("t")
        .queueing_lock("ql")
        .defer(&json!(4))
        .unwrap_err();
    assert_eq!(e.kind(), postpone::ErrorKind::AlreadyEnqueued, "{e}");
    // Unique jobs of every scope: the holder is found without reading its arguments.
    for states in [
        UniqueStates::Waiting,
        UniqueStates::WaitingOrRunning,
        UniqueStates::WaitingRunningOrSucceeded,
    ] {
        let unique = Unique::by_args().states(states);
        let args = json!({"u": format!("{states:?}")});
        let first = papp.job("t").unique(unique).defer_unique(&args).unwrap();
        let again = papp.job("t").unique(unique).defer_unique(&args).unwrap();
        assert!(!first.is_duplicate(), "{states:?}");
        assert!(again.is_duplicate(), "{states:?}");
        assert_eq!(first.id(), again.id(), "{states:?}");
        ids.push(first.id());
    }
    // Inside the producer's own transaction, and through the SQL function.
    let mut c = prole.client(&db);
    let mut tx = c.transaction().unwrap();
    ids.push(papp.job("t").defer_in(&mut tx, &json!(5)).unwrap());
    tx.commit().unwrap();
    let from_sql: i64 = c
        .query_one(
            "SELECT postpone_defer('t', '{\"via\": \"sql\"}', queue => 'q', schedule_in => interval '1 minute')",
            &[],
        )
        .unwrap()
        .get(0);
    ids.push(JobId::from(from_sql));
    // With dependencies, from Rust and from SQL: the producer locks and flags the jobs it
    // names, and reads nothing else of them.
    ids.push(
        papp.job("t")
            .after(&[ids[0]])
            .after_finished(&[ids[1]])
            .defer(&json!(6))
            .unwrap(),
    );
    ids.extend(
        papp.defer_batch(&[NewJob::new("t", &json!(7)).unwrap().after(&[ids[2]])])
            .unwrap(),
    );
    let after_sql: i64 = c
        .query_one(
            "SELECT postpone_defer('t', after => ARRAY[$1]::bigint[])",
            &[&ids[3].get()],
        )
        .unwrap()
        .get(0);
    ids.push(JobId::from(after_sql));
    for id in &ids {
        assert_eq!(status_of(&owner, *id), "todo", "job {id}");
    }
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len());

    // Defers only: no reading of arguments, no changing or claiming jobs.
    for sql in [
        "SELECT args FROM postpone_jobs",
        "SELECT * FROM postpone_jobs",
        "UPDATE postpone_jobs SET priority = 9",
        "DELETE FROM postpone_jobs",
        "SELECT * FROM postpone_workers",
        "INSERT INTO postpone_workers (name) VALUES ('fake')",
        "SELECT * FROM postpone_claim_jobs(1, 10, NULL, NULL)",
        "INSERT INTO postpone_paused_queues (queue) VALUES ('q')",
        "CREATE TABLE postpone_mine (id int)",
    ] {
        assert_denied(&mut c, sql);
    }
}

#[test]
fn a_producer_role_creates_batches_and_a_worker_role_adds_to_them() {
    let db = TestDb::new();
    let owner = owner_app(&db);
    let prole = TestRole::new(&db, "p");
    let wrole = TestRole::new(&db, "w");
    grant(&owner, &prole, GrantsFor::Producer);
    grant(&owner, &wrole, GrantsFor::Worker);
    let papp = app_at(&prole.url(&db));
    let wapp = app_at(&wrole.url(&db));
    let batch = papp
        .batch()
        .on_complete(NewJob::new("report", &json!(0)).unwrap())
        .on_success(NewJob::new("notify", &json!(0)).unwrap())
        .defer(&[
            NewJob::new("t", &json!(1)).unwrap(),
            NewJob::new("t", &json!(2)).unwrap(),
        ])
        .unwrap();
    // Inside the producer's own transaction too.
    let mut c = prole.client(&db);
    let mut tx = c.transaction().unwrap();
    let second = papp
        .batch()
        .defer_in(&mut tx, &[NewJob::new("t", &json!(3)).unwrap()])
        .unwrap();
    tx.commit().unwrap();
    // A worker adds to a batch (as its jobs do); the callbacks wait for the new job too.
    let added = wapp
        .add_to_batch(batch.id, &[NewJob::new("t", &json!(4)).unwrap()])
        .unwrap();
    let p = wapp.admin().batch(batch.id).unwrap();
    assert_eq!((p.total, p.waiting), (3, 3));
    assert_eq!(p.on_complete.unwrap().describe(), "waiting for the batch");
    assert_eq!(owner.admin().batch(second.id).unwrap().total, 1);
    assert_eq!(
        owner.admin().job(added[0]).unwrap().batch_id,
        Some(batch.id)
    );
    // A producer does not count the callbacks' waits: its add is refused by the server
    // (and inserts nothing).
    let e = papp
        .add_to_batch(batch.id, &[NewJob::new("t", &json!(5)).unwrap()])
        .unwrap_err();
    assert_eq!(e.sqlstate(), Some("42501"), "{e}");
    assert_eq!(owner.admin().batch(batch.id).unwrap().total, 3);
}

// --- the reader: the dashboard and the CLI ---------------------------------------------

fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn http_post(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn postpone_cli(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_postpone"))
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("PGHOST")
        .env_remove("PGUSER")
        .env_remove("PGDATABASE")
        .output()
        .expect("running postpone")
}

#[test]
fn a_reader_role_serves_the_read_only_dashboard_and_changes_nothing() {
    let db = TestDb::new();
    let owner = owner_app(&db);
    let rrole = TestRole::new(&db, "r");
    grant(&owner, &rrole, GrantsFor::Reader);
    // Something to show: a finished job, a waiting one, a worker, a periodic instant.
    let mut tasks = Tasks::new();
    tasks.register("ok", |_: &Job| -> Result<(), TaskError> { Ok(()) });
    let done = owner.defer("ok", &json!({"shown": true})).unwrap();
    let waiting = owner
        .job("ok")
        .schedule_in(Duration::from_secs(3600))
        .defer(&json!(null))
        .unwrap();
    let worker = Worker::builder(&owner, tasks).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(20), || status_of(
        &owner, done
    ) == "succeeded"));
    owner
        .connection()
        .unwrap()
        .batch_execute(
            "INSERT INTO postpone_periodic (task, instant) VALUES ('ok', now());
             INSERT INTO postpone_queue_limits (queue, max_running) VALUES ('default', 4)",
        )
        .unwrap();

    let rurl = rrole.url(&db);
    let rapp = app_at(&rurl);
    let dash = postpone::Dashboard::new(&rapp)
        .listen("127.0.0.1:0")
        .unwrap()
        .read_only(true)
        .spawn()
        .expect("the dashboard under the reader role");
    for path in [
        "/".to_string(),
        "/jobs".into(),
        "/jobs?status=succeeded".into(),
        format!("/jobs/{done}"),
        format!("/jobs/{waiting}"),
        "/workers".into(),
        "/periodic".into(),
        "/health".into(),
    ] {
        let (status, page) = http_get(dash.addr(), &path);
        assert_eq!(status, 200, "{path}: {page}");
        assert!(!page.contains("permission denied"), "{path}: {page}");
    }
    dash.shutdown();

    // Started without read_only(true), it finds the role cannot change jobs, says so once,
    // and serves read-only all the same.
    captured();
    let dash = postpone::Dashboard::new(&rapp)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .unwrap();
    let said = format!(
        "dashboard: role {} may not change jobs (no UPDATE on postpone_jobs): serving read-only",
        rrole.name()
    );
    assert_eq!(lines_with(&said).len(), 1, "{:?}", lines_with("dashboard"));
    let (status, page) = http_get(dash.addr(), &format!("/jobs/{waiting}"));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("read-only"), "{page}");
    let (status, answer) = http_post(dash.addr(), &format!("/jobs/{waiting}/cancel"));
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("the dashboard is read-only"), "{answer}");
    dash.shutdown();

    // The CLI's reading commands work; its changes are refused with exit code 6.
    for args in [
        &["stats"][..],
        &["jobs", "--status", "todo"],
        &["job", &done.to_string()],
        &["workers"],
        &["limit"],
        &["healthcheck"],
    ] {
        let o = postpone_cli(&rurl, args);
        assert!(
            o.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    for args in [
        &["cancel", &waiting.to_string()][..],
        &["pause", "default"],
        &["defer", "ok", "{}"],
        &["delete", &waiting.to_string()],
    ] {
        let o = postpone_cli(&rurl, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(6), "{args:?}: {err}");
        assert!(err.contains("permission denied"), "{args:?}: {err}");
    }
    assert_eq!(status_of(&owner, waiting), "todo");
    assert!(worker.shutdown(Duration::from_secs(10)).is_clean());
}

// --- the command line and the migrator ------------------------------------------------

#[test]
fn a_migrator_installs_the_schema_and_the_printed_grants_run_as_it() {
    let db = TestDb::new();
    let mrole = TestRole::new(&db, "m");
    let wrole = TestRole::new(&db, "w");
    // On an empty database the migrator needs only to create in the schema.
    db.client()
        .batch_execute(&format!(
            "GRANT CREATE ON SCHEMA public TO {}",
            quote_ident(mrole.name())
        ))
        .unwrap();
    let murl = mrole.url(&db);
    let o = postpone_cli(&murl, &["migrate"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // `postpone grants ROLE --for worker` prints SQL the migrator can run as it is.
    let o = postpone_cli(&murl, &["grants", wrole.name(), "--for", "worker"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sql = String::from_utf8(o.stdout).unwrap();
    mrole.client(&db).batch_execute(&sql).unwrap();
    let mut w = wrole.client(&db);
    let can: bool = w
        .query_one(
            "SELECT has_table_privilege('postpone_jobs', 'UPDATE')
                AND NOT has_table_privilege('postpone_queue_limits', 'UPDATE')
                AND has_function_privilege('postpone_claim_jobs(bigint, integer, text[], text[])', 'EXECUTE')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(can, "{sql}");
    // Twice is the same as once.
    mrole.client(&db).batch_execute(&sql).unwrap();

    // `--for migrator` hands a schema installed by someone else to the migrator: every
    // object is then its own, and the next migration could run as it.
    let db2 = TestDb::new();
    owner_app(&db2);
    let m2 = TestRole::new(&db2, "m2");
    let o = postpone_cli(&db2.url(), &["grants", m2.name(), "--for", "migrator"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    db2.client()
        .batch_execute(&String::from_utf8(o.stdout).unwrap())
        .unwrap();
    let mut m = m2.client(&db2);
    let not_owned: i64 = m
        .query_one(
            "SELECT (SELECT count(*) FROM pg_class WHERE relname LIKE 'postpone\\_%'
                        AND relnamespace = 'public'::regnamespace AND relowner <> current_user::regrole)
                  + (SELECT count(*) FROM pg_proc WHERE proname LIKE 'postpone\\_%'
                        AND proowner <> current_user::regrole)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(not_owned, 0);
    m.batch_execute("BEGIN; ALTER TABLE postpone_jobs ADD COLUMN later int; ROLLBACK")
        .unwrap();

    // A role name that is not one, and a database without the schema, are told apart.
    let o = postpone_cli(&murl, &["grants", "", "--for", "reader"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("role name \"\": must not be empty"));
    let empty = TestDb::new();
    let o = postpone_cli(&empty.url(), &["grants", "r", "--for", "reader"]);
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
