//! The schema: `App::migrate` on fresh databases, twice and concurrently; the schema check
//! every other call makes; and the objects the migration creates.

use crate::support;

use std::sync::{Arc, Barrier};
use std::thread;

use postpone::{App, ErrorKind};
use support::*;

fn app(db: &TestDb) -> App {
    App::builder(db.url())
        .pool_size(2)
        .build()
        .expect("build the app")
}

/// The migrations applied: from `first` to the latest, in increasing order (their numbers
/// may have gaps).
fn assert_applied(applied: &[i32], first: i32) {
    assert_eq!(applied.first(), Some(&first), "{applied:?}");
    assert_eq!(
        applied.last(),
        Some(&postpone::SCHEMA_VERSION),
        "{applied:?}"
    );
    assert!(applied.windows(2).all(|w| w[0] < w[1]), "{applied:?}");
}

#[test]
fn migrate_applies_once_then_nothing() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    assert_eq!(app.schema_version().unwrap(), None);
    assert_applied(&app.migrate().unwrap(), 1);
    assert_eq!(
        app.schema_version().unwrap(),
        Some(postpone::SCHEMA_VERSION)
    );
    assert_eq!(app.migrate().unwrap(), Vec::<i32>::new());
    // A new App (a second process) finds nothing to do either.
    assert_eq!(self::app(&db).migrate().unwrap(), Vec::<i32>::new());
    let rows = db
        .client()
        .query("SELECT version, name FROM postpone_migrations", &[])
        .unwrap();
    let mut applied: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    applied.sort();
    assert_eq!(
        applied.last().map(|a| a.0),
        Some(postpone::SCHEMA_VERSION),
        "{applied:?}"
    );
    assert_eq!(applied[0], (1, "init".to_owned()));
    assert_eq!(applied[1], (2, "integrity".to_owned()));
    app.defer("after_migrate", &1).unwrap();
}

#[test]
fn concurrent_migrations_install_the_schema_once() {
    init_logging();
    let db = TestDb::new();
    let url = db.url();
    const N: usize = 8;
    let barrier = Arc::new(Barrier::new(N));
    let handles: Vec<_> = (0..N)
        .map(|_| {
            let url = url.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let app = App::builder(url).pool_size(1).build()?;
                barrier.wait();
                app.migrate()
            })
        })
        .collect();
    let results: Vec<postpone::Result<Vec<i32>>> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut applied = Vec::new();
    for r in results {
        match r {
            Ok(v) => applied.extend(v),
            Err(e) => panic!("a concurrent migrate failed: {e}"),
        }
    }
    assert_applied(&applied, 1);
    assert!(
        applied.windows(2).all(|w| w[0] < w[1]),
        "exactly one caller applies each migration"
    );
    let mut client = db.client();
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM postpone_migrations WHERE version = 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'postpone_jobs'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(tables, 1);
}

#[test]
fn calls_before_migrate_fail_with_schema_missing() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mut errors = vec![
        ("defer", app.defer("t", &1).unwrap_err()),
        (
            "job().defer",
            app.job("t").queue("q").defer(&1).unwrap_err(),
        ),
        (
            "defer_batch",
            app.defer_batch(&[postpone::NewJob::new("t", &1).unwrap()])
                .unwrap_err(),
        ),
    ];
    match app.connection() {
        Ok(_) => panic!("app.connection() worked without the schema"),
        Err(e) => errors.push(("connection", e)),
    }
    for (what, e) in &errors {
        assert_eq!(e.kind(), ErrorKind::SchemaMissing, "{what}: {e}");
        let text = e.to_string();
        assert!(text.contains("run `postpone migrate`"), "{what}: {text}");
        assert!(text.contains("schema not installed"), "{what}: {text}");
    }
    // In the caller's own transaction too (no App check there: the server's answer is
    // turned into the same kind and advice).
    let mut client = db.client();
    let mut tx = client.transaction().unwrap();
    let e = app.job("t").defer_in(&mut tx, &1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaMissing, "{e}");
    assert!(e.to_string().contains("run `postpone migrate`"), "{e}");
    drop(tx);
    // Nothing was created by those calls.
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'postpone%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    // And after migrate the same App works.
    app.migrate().unwrap();
    app.defer("t", &1).unwrap();
}

#[test]
fn an_older_schema_fails_with_schema_outdated_and_a_missing_row_with_schema_missing() {
    init_logging();
    let db = TestDb::new();
    app(&db).migrate().unwrap();
    let mut client = db.client();

    client
        .batch_execute(
            "DELETE FROM postpone_migrations WHERE version <> 1;
             UPDATE postpone_migrations SET version = 0",
        )
        .unwrap();
    let fresh = app(&db);
    let e = fresh.defer("t", &1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaOutdated, "{e}");
    let text = e.to_string();
    assert!(text.contains("older than this library"), "{text}");
    assert!(text.contains("run `postpone migrate`"), "{text}");
    assert_eq!(fresh.schema_version().unwrap(), Some(0));
    assert_eq!(
        fresh.connection().unwrap_err().kind(),
        ErrorKind::SchemaOutdated
    );

    client
        .execute("DELETE FROM postpone_migrations", &[])
        .unwrap();
    let fresh = app(&db);
    let e = fresh.defer("t", &1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaMissing, "{e}");
    assert!(e.to_string().contains("run `postpone migrate`"), "{e}");
    assert_eq!(fresh.schema_version().unwrap(), None);

    // Nothing was inserted by the refused calls.
    let n: i64 = client
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[test]
fn a_newer_schema_is_accepted() {
    init_logging();
    let db = TestDb::new();
    app(&db).migrate().unwrap();
    db.client()
        .execute(
            "INSERT INTO postpone_migrations (version, name) VALUES (999, 'from the future')",
            &[],
        )
        .unwrap();
    let fresh = app(&db);
    fresh.defer("t", &1).unwrap();
    assert_eq!(fresh.schema_version().unwrap(), Some(999));
}

#[test]
fn schema_objects_exist() {
    init_logging();
    let db = TestDb::new();
    app(&db).migrate().unwrap();
    let mut c = db.client();

    for table in [
        "postpone_jobs",
        "postpone_workers",
        "postpone_periodic",
        "postpone_migrations",
    ] {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1",
                &[&table],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "table {table}");
    }

    let columns: Vec<String> = c
        .query(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_name = 'postpone_jobs' ORDER BY ordinal_position",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for col in [
        "id",
        "queue",
        "task",
        "args",
        "status",
        "priority",
        "lock",
        "queueing_lock",
        "scheduled_at",
        "attempts",
        "worker_id",
        "abort_requested",
        "errors",
        "created_at",
        "started_at",
        "finished_at",
    ] {
        assert!(
            columns.iter().any(|c| c == col),
            "column {col} in {columns:?}"
        );
    }
    let args_type: String = c
        .query_one(
            "SELECT data_type::text FROM information_schema.columns \
             WHERE table_name = 'postpone_jobs' AND column_name = 'args'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(args_type, "json");

    // The partial unique indexes behind the lock promises.
    for (index, column, status) in [
        ("postpone_jobs_lock_doing_idx", "lock", "doing"),
        ("postpone_jobs_queueing_lock_idx", "queueing_lock", "todo"),
    ] {
        let row = c
            .query_one(
                "SELECT i.indisunique, pg_get_indexdef(i.indexrelid), \
                        pg_get_expr(i.indpred, i.indrelid) \
                   FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid \
                  WHERE x.relname = $1",
                &[&index],
            )
            .unwrap_or_else(|e| panic!("index {index}: {e}"));
        assert!(row.get::<_, bool>(0), "{index} is unique");
        let def: String = row.get(1);
        assert!(def.contains(&format!("({column})")), "{index}: {def}");
        let predicate: Option<String> = row.get(2);
        let predicate = predicate.unwrap_or_else(|| panic!("{index} is not partial"));
        assert!(
            predicate.contains(&format!("'{status}'")),
            "{index}: {predicate}"
        );
    }

    // The notification trigger, per statement, on insert.
    let row = c
        .query_one(
            "SELECT t.tgenabled::text, pg_get_triggerdef(t.oid) FROM pg_trigger t \
             WHERE t.tgrelid = 'postpone_jobs'::regclass AND NOT t.tgisinternal \
               AND t.tgname = 'postpone_jobs_notify'",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "O", "trigger enabled");
    let def: String = row.get(1);
    assert!(def.contains("AFTER INSERT"), "{def}");
    assert!(def.contains("FOR EACH STATEMENT"), "{def}");

    // The database itself enforces the promises, whoever writes the rows.
    let insert = "INSERT INTO postpone_jobs (queue, task, args, status, lock, queueing_lock) \
                  VALUES ('q', 't', '{}', $1, $2, $3)";
    let none: Option<&str> = None;
    c.execute(insert, &[&"doing", &Some("L"), &none]).unwrap();
    let e = c
        .execute(insert, &[&"doing", &Some("L"), &none])
        .unwrap_err();
    assert_eq!(e.code().map(|s| s.code()), Some("23505"), "{e}");
    c.execute(insert, &[&"todo", &Some("L"), &none]).unwrap(); // waiting behind it is fine
    c.execute(insert, &[&"todo", &none, &Some("Q")]).unwrap();
    let e = c
        .execute(insert, &[&"todo", &none, &Some("Q")])
        .unwrap_err();
    assert_eq!(e.code().map(|s| s.code()), Some("23505"), "{e}");
    c.execute(insert, &[&"doing", &none, &Some("Q")]).unwrap(); // one todo + one doing is fine
    let e = c.execute(insert, &[&"nonsense", &none, &none]).unwrap_err();
    assert_eq!(
        e.code().map(|s| s.code()),
        Some("23514"),
        "status check: {e}"
    );
    let e = c
        .execute(
            "INSERT INTO postpone_jobs (queue, task, args) VALUES ('q', '', '{}')",
            &[],
        )
        .unwrap_err();
    assert_eq!(e.code().map(|s| s.code()), Some("23514"), "empty task: {e}");
}

/// A database installed by version 1, holding jobs in every status (and a dead worker's job
/// whose queueing lock is taken meanwhile), upgrades to the current version in place, and a worker of
/// this version then takes it over: due jobs run, the dead worker's job is resolved, finished
/// jobs are left alone.
#[test]
fn a_version_1_database_with_jobs_in_every_status_upgrades_in_place() {
    use postpone::{JobStatus, Tasks, Worker};
    use std::time::Duration;
    init_logging();
    let db = TestDb::new();
    let mut client = db.client();
    client
        .batch_execute(include_str!("../../src/schema/0001_init.sql"))
        .unwrap();
    client
        .batch_execute(
            "CREATE TABLE postpone_migrations (
                 version integer PRIMARY KEY, name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now());
             INSERT INTO postpone_migrations (version, name) VALUES (1, 'init');
             INSERT INTO postpone_workers (id, name, last_heartbeat)
                  VALUES (900, 'old-v1-worker', now() - interval '1 hour');
             INSERT INTO postpone_jobs (queue, task, args, status) VALUES
                  ('default', 'work', '1', 'todo'),
                  ('default', 'work', '2', 'succeeded'),
                  ('default', 'work', '3', 'failed'),
                  ('default', 'work', '4', 'cancelled'),
                  ('default', 'work', '5', 'aborted');
             -- A dead v1 worker's job whose queueing lock now has a waiting job, and one
             -- whose abort was requested.
             INSERT INTO postpone_jobs (queue, task, args, status, worker_id, attempts,
                                        queueing_lock, started_at)
                  VALUES ('default', 'work', '6', 'doing', 900, 1, 'q6', now());
             INSERT INTO postpone_jobs (queue, task, args, status, queueing_lock, scheduled_at)
                  VALUES ('default', 'work', '7', 'todo', 'q6', now() + interval '1 hour');
             INSERT INTO postpone_jobs (queue, task, args, status, worker_id, attempts,
                                        abort_requested, started_at)
                  VALUES ('default', 'work', '8', 'doing', 900, 1, true, now());",
        )
        .unwrap();
    let app = app(&db);
    assert_applied(&app.migrate().unwrap(), 2);
    assert_eq!(
        app.schema_version().unwrap(),
        Some(postpone::SCHEMA_VERSION)
    );

    let mut tasks = Tasks::new();
    tasks.register("work", |_job: &postpone::Job| Ok(()));
    let w = Worker::builder(&app, tasks)
        .heartbeat_interval(Duration::from_millis(100))
        .stalled_after(Duration::from_secs(1))
        .spawn()
        .unwrap();
    let status_of = |client: &mut postgres::Client, arg: i32| -> String {
        client
            .query_one(
                "SELECT status FROM postpone_jobs WHERE args::jsonb = to_jsonb($1::int)",
                &[&arg],
            )
            .unwrap()
            .get(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let settled = status_of(&mut client, 1) == "succeeded"
            && status_of(&mut client, 6) != "doing"
            && status_of(&mut client, 8) != "doing";
        if settled || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    let got: Vec<String> = (1..=8).map(|a| status_of(&mut client, a)).collect();
    assert_eq!(
        got,
        [
            "succeeded", // due: ran
            "succeeded", // finished: untouched
            "failed",
            "cancelled",
            "aborted",
            "cancelled", // superseded by the waiting job of its queueing lock
            "todo",      // that waiting job, due in an hour, does the work
            "aborted",   // its abort was requested: not run again
        ]
    );
    assert_eq!(
        app.admin().job(postpone::JobId(1)).unwrap().job.status,
        JobStatus::Succeeded
    );
}

#[test]
fn a_version_4_database_with_jobs_in_every_status_upgrades_to_5_while_an_old_worker_runs() {
    init_logging();
    let db = TestDb::new();
    // The "old worker": a connection that speaks the version 4 statements.
    let mut old = db.client();
    for sql in [
        include_str!("../../src/schema/0001_init.sql"),
        include_str!("../../src/schema/0002_integrity.sql"),
        include_str!("../../src/schema/0003_claim.sql"),
        include_str!("../../src/schema/0004_results.sql"),
    ] {
        old.batch_execute(sql).unwrap();
    }
    old.batch_execute(
        "CREATE TABLE postpone_migrations (
             version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO postpone_migrations (version, name)
              VALUES (1, 'init'), (2, 'integrity'), (3, 'claim'), (4, 'results');
         INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES (900, 'old-v4', now());
         INSERT INTO postpone_jobs (queue, task, args, status, priority) VALUES
              ('default', 'work', '1', 'todo', 10),
              ('default', 'work', '2', 'todo', 0),
              ('default', 'work', '3', 'succeeded', 0),
              ('default', 'work', '4', 'failed', 0),
              ('default', 'work', '5', 'cancelled', 0),
              ('default', 'work', '6', 'aborted', 0),
              ('other', 'work', '7', 'todo', 0);
         INSERT INTO postpone_jobs (queue, task, args, status, scheduled_at)
              VALUES ('default', 'work', '8', 'todo', now() + interval '1 hour');",
    )
    .unwrap();
    let claim = |c: &mut postgres::Client, queues: Option<&[&str]>| -> Vec<i64> {
        let queues: Option<Vec<String>> = queues.map(|q| q.iter().map(|s| s.to_string()).collect());
        let mut ids: Vec<i64> = c
            .query(
                "SELECT id FROM postpone_claim(900, 10, $1::text[], NULL)",
                &[&queues],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        ids.sort();
        ids
    };
    // The old worker is running job 1 when the upgrade happens.
    let running: i64 = old
        .query_one("SELECT id FROM postpone_claim(900, 1, NULL, NULL)", &[])
        .unwrap()
        .get(0);
    assert_eq!(running, 1);

    let app = app(&db);
    assert_applied(&app.migrate().unwrap(), 5);

    // The old worker records its outcome as version 4 did, and keeps claiming; it obeys a
    // pause (it calls the same function), of one queue or of all.
    let done = old
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now()
              WHERE id = $1 AND status = 'doing' AND worker_id = 900",
            &[&running],
        )
        .unwrap();
    assert_eq!(done, 1);
    assert!(app.admin().pause("default").unwrap());
    assert_eq!(claim(&mut old, Some(&["default"])), Vec::<i64>::new());
    assert_eq!(claim(&mut old, None), vec![7], "only the queue not paused");
    assert!(app.admin().pause_all().unwrap());
    app.job("work").queue("other").defer(&9).unwrap();
    assert_eq!(claim(&mut old, None), Vec::<i64>::new());
    assert_eq!(app.admin().resume_all().unwrap(), 2);
    assert_eq!(claim(&mut old, None), vec![2, 9]);

    let statuses: Vec<String> = old
        .query("SELECT status FROM postpone_jobs ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        statuses,
        [
            "succeeded", // run by the old worker across the upgrade
            "doing",     // claimed after the resume
            "succeeded",
            "failed",
            "cancelled",
            "aborted",
            "doing", // claimed while "default" was paused
            "todo",  // due in an hour
            "doing", // deferred while all was paused, claimed after
        ]
    );
}
