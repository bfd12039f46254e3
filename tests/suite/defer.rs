//! Deferring jobs: every option lands in its column, transactional defers, batches (order,
//! one notification per queue, atomicity), the queueing-lock conflict, and clear errors for
//! every kind of bad input.

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;
use postpone::{App, ErrorKind, JobId, NewJob};
use serde::ser::Error as _;
use serde::{Serialize, Serializer};
use serde_json::{json, Value};
use support::*;

/// A fresh database with the schema, and an App on it.
fn setup() -> (TestDb, App) {
    TestDb::with_app()
}

fn count_jobs(c: &mut Client) -> i64 {
    c.query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0)
}

fn job_exists(c: &mut impl postgres::GenericClient, id: JobId) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT 1 FROM postpone_jobs WHERE id = $1)",
        &[&id.0],
    )
    .unwrap()
    .get(0)
}

#[test]
fn defer_returns_increasing_ids_and_fills_the_row() {
    let (db, app) = setup();
    let a = app.defer("send_email", &json!({"to": "a@b.c"})).unwrap();
    let b = app.defer("send_email", &json!({"to": "d@e.f"})).unwrap();
    let c = app.defer("other", &[1, 2, 3]).unwrap();
    assert!(a < b && b < c, "{a} {b} {c}");

    let mut client = db.client();
    let row = client
        .query_one(
            "SELECT queue, task, args, status, priority, lock, queueing_lock, attempts, \
                    worker_id, abort_requested, errors IS NULL, started_at IS NULL, \
                    finished_at IS NULL, scheduled_at = created_at, scheduled_at <= now() \
               FROM postpone_jobs WHERE id = $1",
            &[&a.0],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>("queue"), "default");
    assert_eq!(row.get::<_, String>("task"), "send_email");
    assert_eq!(row.get::<_, Value>("args"), json!({"to": "a@b.c"}));
    assert_eq!(row.get::<_, String>("status"), "todo");
    assert_eq!(row.get::<_, i32>("priority"), 0);
    assert_eq!(row.get::<_, Option<String>>("lock"), None);
    assert_eq!(row.get::<_, Option<String>>("queueing_lock"), None);
    assert_eq!(row.get::<_, i32>("attempts"), 0);
    assert_eq!(row.get::<_, Option<i64>>("worker_id"), None);
    assert!(!row.get::<_, bool>("abort_requested"));
    for i in 10..15 {
        assert!(row.get::<_, bool>(i), "column {i} of the check");
    }
    let args: Value = client
        .query_one("SELECT args FROM postpone_jobs WHERE id = $1", &[&c.0])
        .unwrap()
        .get(0);
    assert_eq!(args, json!([1, 2, 3]));
}

#[test]
fn every_option_lands_in_its_column() {
    let (db, app) = setup();
    let mut client = db.client();
    let select = "SELECT queue, task, args, priority, lock, queueing_lock, scheduled_at, \
                  EXTRACT(EPOCH FROM scheduled_at - created_at)::float8 AS delay, \
                  scheduled_at > now() AS future \
                  FROM postpone_jobs WHERE id = $1";

    let id = app
        .job("send_email")
        .queue("emails")
        .priority(5)
        .lock("user:42")
        .queueing_lock("welcome:42")
        .schedule_in(Duration::from_secs(60))
        .defer(&json!({"to": "a@b.c"}))
        .unwrap();
    let row = client.query_one(select, &[&id.0]).unwrap();
    assert_eq!(row.get::<_, String>("queue"), "emails");
    assert_eq!(row.get::<_, String>("task"), "send_email");
    assert_eq!(row.get::<_, Value>("args"), json!({"to": "a@b.c"}));
    assert_eq!(row.get::<_, i32>("priority"), 5);
    assert_eq!(
        row.get::<_, Option<String>>("lock").as_deref(),
        Some("user:42")
    );
    assert_eq!(
        row.get::<_, Option<String>>("queueing_lock").as_deref(),
        Some("welcome:42")
    );
    // By the server's clock: scheduled_at = the insert's now() + the delay, exactly.
    assert_eq!(row.get::<_, f64>("delay"), 60.0);
    assert!(row.get::<_, bool>("future"));

    // A sub-second delay keeps its precision; a negative priority is fine.
    let id = app
        .job("t")
        .priority(-3)
        .schedule_in(Duration::from_millis(1500))
        .defer(&1)
        .unwrap();
    let row = client.query_one(select, &[&id.0]).unwrap();
    assert_eq!(row.get::<_, f64>("delay"), 1.5);
    assert_eq!(row.get::<_, i32>("priority"), -3);

    // schedule_at: stored as given (to the microsecond PostgreSQL keeps).
    let at = SystemTime::now() + Duration::from_secs(3600);
    let id = app.job("t").schedule_at(at).defer(&1).unwrap();
    let row = client.query_one(select, &[&id.0]).unwrap();
    let stored: SystemTime = row.get("scheduled_at");
    let diff = match stored.duration_since(at) {
        Ok(d) => d,
        Err(e) => e.duration(),
    };
    assert!(
        diff < Duration::from_micros(2),
        "stored {stored:?}, given {at:?}"
    );
    assert!(row.get::<_, bool>("future"));
    // In the past: due at once.
    let past = SystemTime::now() - Duration::from_secs(3600);
    let id = app.job("t").schedule_at(past).defer(&1).unwrap();
    let row = client.query_one(select, &[&id.0]).unwrap();
    assert!(!row.get::<_, bool>("future"));
}

#[test]
fn defer_in_commits_and_rolls_back_with_the_callers_transaction() {
    let (db, app) = setup();
    let mut client = db.client();
    let mut observer = db.client();

    let mut tx = client.transaction().unwrap();
    let committed = app
        .job("t")
        .queue("tx")
        .defer_in(&mut tx, &json!({"n": 1}))
        .unwrap();
    assert!(
        !job_exists(&mut observer, committed),
        "visible before commit"
    );
    tx.commit().unwrap();
    assert!(job_exists(&mut observer, committed));

    let mut tx = client.transaction().unwrap();
    let rolled_back = app.job("t").defer_in(&mut tx, &json!({"n": 2})).unwrap();
    assert!(
        job_exists(&mut tx, rolled_back),
        "visible inside its transaction"
    );
    tx.rollback().unwrap();
    assert!(!job_exists(&mut observer, rolled_back));

    // A plain client (autocommit) works too.
    let id = app.job("t").defer_in(&mut client, &3).unwrap();
    assert!(job_exists(&mut observer, id));
    assert_eq!(count_jobs(&mut observer), 2);
}

#[test]
fn defer_on_follows_our_connections_transaction() {
    let (db, app) = setup();
    let mut observer = db.client();
    let mut conn = app.connection().unwrap();

    conn.begin().unwrap();
    let id = app.job("t").defer_on(&mut conn, &1).unwrap();
    let inside: i64 = conn
        .query_one("SELECT count(*) FROM postpone_jobs WHERE id = $1", &[&id.0])
        .unwrap()
        .get(0);
    assert_eq!(inside, 1);
    assert!(!job_exists(&mut observer, id));
    conn.rollback().unwrap();
    assert!(!job_exists(&mut observer, id));

    conn.begin().unwrap();
    let id = app.job("t").defer_on(&mut conn, &2).unwrap();
    conn.commit().unwrap();
    assert!(job_exists(&mut observer, id));

    // Outside a transaction it commits at once.
    let id = app.job("t").defer_on(&mut conn, &3).unwrap();
    assert!(job_exists(&mut observer, id));
    assert_eq!(count_jobs(&mut observer), 2);
}

/// Notifications on channel `postpone` that `listener` receives before the `sentinel`
/// payload (sent on the same channel after the calls under test committed: PostgreSQL
/// delivers notifications in commit order, so everything before it is theirs).
fn notifications_until_sentinel(listener: &mut Client, db: &TestDb) -> Vec<String> {
    db.client()
        .batch_execute("NOTIFY postpone, 'sentinel'")
        .unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let mut notifications = listener.notifications();
        let mut it = notifications.timeout_iter(Duration::from_secs(1));
        while let Some(n) = it.next().unwrap() {
            if n.payload() == "sentinel" {
                return got;
            }
            got.push(n.payload().to_owned());
        }
    }
    panic!("the sentinel notification never arrived; got {got:?}");
}

#[test]
fn defer_batch_inserts_in_order_with_one_notification_per_queue() {
    let (db, app) = setup();
    let mut listener = db.client();
    listener.batch_execute("LISTEN postpone").unwrap();

    let mut jobs: Vec<NewJob> = (0..1000)
        .map(|i| {
            let q = if i % 2 == 0 { "qa" } else { "qb" };
            NewJob::new("batch", &json!({"i": i})).unwrap().queue(q)
        })
        .collect();
    // Scheduled for later: no wake-up for its queue.
    jobs[999] = NewJob::new("batch", &json!({"i": 999}))
        .unwrap()
        .queue("qlater")
        .schedule_in(Duration::from_secs(3600));
    let started = Instant::now();
    let ids = app.defer_batch(&jobs).unwrap();
    eprintln!(
        "measured: defer_batch of 1000 jobs took {:?}",
        started.elapsed()
    );
    assert_eq!(ids.len(), 1000);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase");

    let mut client = db.client();
    let raw: Vec<i64> = ids.iter().map(|id| id.0).collect();
    let rows = client
        .query(
            "SELECT id, (args->>'i')::int, queue, task FROM postpone_jobs WHERE id = ANY($1)",
            &[&raw],
        )
        .unwrap();
    assert_eq!(rows.len(), 1000);
    let by_id: HashMap<i64, (i32, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    for (k, id) in ids.iter().enumerate() {
        let (i, queue, task) = &by_id[&id.0];
        assert_eq!(*i as usize, k, "id {id} holds the args of job {i}, not {k}");
        let expected = match k {
            999 => "qlater",
            k if k % 2 == 0 => "qa",
            _ => "qb",
        };
        assert_eq!(queue, expected);
        assert_eq!(task, "batch");
    }

    let mut got = notifications_until_sentinel(&mut listener, &db);
    got.sort();
    // The job scheduled for later announces its time instead (schema version 9).
    let later: Vec<String> = got
        .iter()
        .filter(|n| n.starts_with("at:"))
        .cloned()
        .collect();
    got.retain(|n| !n.starts_with("at:"));
    assert_eq!(
        got,
        vec!["job:qa", "job:qb"],
        "one notification per due queue"
    );
    assert!(
        later.len() == 1 && later[0].ends_with(":qlater"),
        "one notification for the queue with a job due later: {later:?}"
    );

    // Empty batch: nothing to do, no round-trip needed.
    assert!(app.defer_batch(&[]).unwrap().is_empty());
}

/// A batch sends a column that none of its jobs sets as a NULL array: every option still
/// lands in its column whether all, some or none of the batch's jobs set it, with and without
/// dependencies (the two statements a batch can take).
#[test]
fn a_batch_stores_each_option_whether_all_some_or_none_of_its_jobs_set_it() {
    let (db, app) = setup();
    let mut client = db.client();
    let at = SystemTime::now() + Duration::from_secs(3600);
    let expires = SystemTime::now() + Duration::from_secs(7200);
    let full = |n: i32| {
        NewJob::new("t", &n)
            .unwrap()
            .lock(format!("l{n}"))
            .queueing_lock(format!("q{n}"))
            .schedule_at(at)
            .max_attempts(7)
            .tags([format!("tag{n}")])
            .meta(&json!({ "n": n }))
            .expires_at(expires)
    };
    let plain = |n: i32| NewJob::new("t", &n).unwrap();
    let select = "SELECT (args #>> '{}')::int, lock, queueing_lock, scheduled_at > now() + interval '59 minutes', \
                  max_attempts, tags, meta, expires_at IS NOT NULL, \
                  EXTRACT(EPOCH FROM expires_at - created_at)::float8 \
                  FROM postpone_jobs WHERE id = $1";
    let check = |client: &mut Client, id: JobId, n: i32, set: bool| {
        let r = client.query_one(select, &[&id.0]).unwrap();
        assert_eq!(r.get::<_, i32>(0), n, "job {id}: args");
        let s = |p: &str| set.then(|| format!("{p}{n}"));
        assert_eq!(r.get::<_, Option<String>>(1), s("l"), "job {id}: lock");
        assert_eq!(
            r.get::<_, Option<String>>(2),
            s("q"),
            "job {id}: queueing lock"
        );
        assert_eq!(r.get::<_, bool>(3), set, "job {id}: scheduled_at");
        assert_eq!(
            r.get::<_, Option<i32>>(4),
            set.then_some(7),
            "job {id}: max_attempts"
        );
        assert_eq!(
            r.get::<_, Option<Vec<String>>>(5),
            s("tag").map(|t| vec![t]),
            "job {id}: tags"
        );
        assert_eq!(
            r.get::<_, Option<Value>>(6),
            set.then(|| json!({ "n": n })),
            "job {id}: meta"
        );
        assert_eq!(r.get::<_, bool>(7), set, "job {id}: expires_at");
    };

    let none = app.defer_batch(&[plain(1), plain(2), plain(3)]).unwrap();
    let some = app.defer_batch(&[plain(4), full(5), plain(6)]).unwrap();
    let all = app.defer_batch(&[full(7), full(8)]).unwrap();
    for (ids, first, set) in [
        (&none, 1, [false, false, false].as_slice()),
        (&some, 4, &[false, true, false]),
        (&all, 7, &[true, true]),
    ] {
        for (k, (&id, &set)) in ids.iter().zip(set).enumerate() {
            check(&mut client, id, first + k as i32, set);
        }
    }

    // A deadline given as a duration, set by one job of three.
    let ids = app
        .defer_batch(&[
            plain(9),
            plain(10).expires_in(Duration::from_secs(90)),
            plain(11),
        ])
        .unwrap();
    let left: Vec<Option<f64>> = ids
        .iter()
        .map(|id| client.query_one(select, &[&id.0]).unwrap().get(8))
        .collect();
    assert_eq!(left, [None, Some(90.0), None]);

    // With dependencies (postpone_defer_jobs): the same. The job they wait for has
    // succeeded, so that they are due as deferred.
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded', attempts = 1, started_at = now(), \
             finished_at = now() WHERE id = $1",
            &[&none[0].0],
        )
        .unwrap();
    let after = [none[0]];
    let ids = app
        .defer_batch(&[plain(12).after(&after), full(13).after(&after)])
        .unwrap();
    check(&mut client, ids[0], 12, false);
    check(&mut client, ids[1], 13, true);
    let ids = app
        .defer_batch(&[plain(14).after(&after), plain(15)])
        .unwrap();
    check(&mut client, ids[0], 14, false);
    check(&mut client, ids[1], 15, false);
}

#[test]
fn defer_batch_is_atomic() {
    let (db, app) = setup();
    let mut client = db.client();
    app.job("t").queueing_lock("X").defer(&0).unwrap();

    // A conflict with a job already waiting.
    let batch = vec![
        NewJob::new("t", &1).unwrap(),
        NewJob::new("t", &2).unwrap().queueing_lock("X"),
        NewJob::new("t", &3).unwrap(),
    ];
    let e = app.defer_batch(&batch).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");
    assert!(e.is_already_enqueued());
    assert!(e.to_string().contains("nothing was inserted"), "{e}");
    assert_eq!(count_jobs(&mut client), 1);

    // A conflict inside the batch itself.
    let batch = vec![
        NewJob::new("t", &1).unwrap().queueing_lock("Y"),
        NewJob::new("t", &2).unwrap().queueing_lock("Y"),
    ];
    let e = app.defer_batch(&batch).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");
    assert_eq!(count_jobs(&mut client), 1);

    // Bad input anywhere in the batch: refused before anything is sent, and says which.
    let batch = vec![NewJob::new("t", &1).unwrap(), NewJob::new("", &2).unwrap()];
    let e = app.defer_batch(&batch).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("job 1 of the batch"), "{e}");
    assert_eq!(count_jobs(&mut client), 1);

    // The batch in the caller's transaction: rolled back with it.
    let mut tx = client.transaction().unwrap();
    let ids = app
        .defer_batch_in(
            &mut tx,
            &[NewJob::new("t", &1).unwrap(), NewJob::new("t", &2).unwrap()],
        )
        .unwrap();
    assert_eq!(ids.len(), 2);
    tx.rollback().unwrap();
    assert_eq!(count_jobs(&mut client), 1);
}

#[test]
fn queueing_lock_conflict_is_typed_and_inserts_nothing() {
    let (db, app) = setup();
    let mut client = db.client();
    let first = app
        .job("welcome")
        .queueing_lock("welcome:42")
        .defer(&1)
        .unwrap();

    let e = app
        .job("welcome")
        .queueing_lock("welcome:42")
        .defer(&2)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");
    assert!(e.is_already_enqueued());
    assert_eq!(e.sqlstate(), Some("23505"));
    let text = e.to_string();
    assert!(
        text.contains("welcome:42"),
        "the message names the lock: {text}"
    );
    assert!(text.contains("nothing was inserted"), "{text}");
    assert_eq!(count_jobs(&mut client), 1);

    // Another lock, or no lock, is not affected.
    app.job("welcome")
        .queueing_lock("welcome:43")
        .defer(&3)
        .unwrap();
    app.job("welcome").defer(&4).unwrap();

    // The same conflict through the caller's transaction and through our connection.
    let mut tx = client.transaction().unwrap();
    let e = app
        .job("welcome")
        .queueing_lock("welcome:42")
        .defer_in(&mut tx, &5)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");
    drop(tx);
    let mut conn = app.connection().unwrap();
    let e = app
        .job("welcome")
        .queueing_lock("welcome:42")
        .defer_on(&mut conn, &6)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");
    drop(conn);
    assert_eq!(count_jobs(&mut client), 3);

    // Once the first job leaves `todo`, the lock is free again.
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'doing' WHERE id = $1",
            &[&first.0],
        )
        .unwrap();
    let second = app
        .job("welcome")
        .queueing_lock("welcome:42")
        .defer(&7)
        .unwrap();
    // ...but only one may wait.
    let e = app
        .job("welcome")
        .queueing_lock("welcome:42")
        .defer(&8)
        .unwrap_err();
    assert!(e.is_already_enqueued(), "{e}");
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded' WHERE id = $1",
            &[&second.0],
        )
        .unwrap();
    app.job("welcome")
        .queueing_lock("welcome:42")
        .defer(&9)
        .unwrap();
    assert_eq!(count_jobs(&mut client), 5);

    // A plain `lock` does not limit waiting jobs (only running ones).
    app.job("t").lock("L").defer(&1).unwrap();
    app.job("t").lock("L").defer(&2).unwrap();
}

/// Arguments whose `Serialize` fails.
struct Unserializable;

impl Serialize for Unserializable {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(S::Error::custom("this value refuses to serialize"))
    }
}

#[test]
fn bad_job_input_gives_clear_errors() {
    let (db, app) = setup();
    let mut client = db.client();
    let invalid = |what: &str, res: postpone::Result<JobId>, needle: &str| {
        let e = res.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
        let text = e.to_string();
        assert!(text.contains(needle), "{what}: {text:?} lacks {needle:?}");
        assert!(
            text.starts_with(|c: char| c.is_lowercase()),
            "{what}: messages start lowercase: {text}"
        );
    };
    invalid("empty task", app.defer("", &1), "task name");
    invalid("blank task", app.defer("   ", &1), "task name");
    invalid("empty queue", app.job("t").queue("").defer(&1), "queue");
    invalid("empty lock", app.job("t").lock("").defer(&1), "lock");
    invalid(
        "empty queueing lock",
        app.job("t").queueing_lock("").defer(&1),
        "queueing lock",
    );
    let mut tuple_keys: HashMap<(i32, i32), i32> = HashMap::new();
    tuple_keys.insert((1, 2), 3);
    invalid(
        "map with non-string keys",
        app.defer("t", &tuple_keys),
        "do not serialize",
    );
    invalid(
        "failing Serialize",
        app.defer("t", &Unserializable),
        "this value refuses to serialize",
    );
    invalid("NUL in args", app.defer("t", &"a\u{0}b"), "NUL");
    invalid(
        "NUL in an args key",
        app.defer("t", &json!({"a\u{0}": 1})),
        "NUL",
    );
    invalid("NUL in task", app.defer("t\u{0}", &1), "NUL");
    invalid(
        "NUL in queue",
        app.job("t").queue("q\u{0}").defer(&1),
        "NUL",
    );
    invalid("NUL in lock", app.job("t").lock("\u{0}").defer(&1), "NUL");

    // The same checks on the other paths.
    let mut tx = client.transaction().unwrap();
    invalid(
        "defer_in, empty task",
        app.job("").defer_in(&mut tx, &1),
        "task name",
    );
    invalid(
        "defer_in, bad args",
        app.job("t").defer_in(&mut tx, &Unserializable),
        "refuses",
    );
    tx.rollback().unwrap();
    let mut conn = app.connection().unwrap();
    invalid(
        "defer_on, NUL",
        app.job("t").defer_on(&mut conn, &"\u{0}"),
        "NUL",
    );
    drop(conn);
    let e = NewJob::new("t", &tuple_keys).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");

    assert_eq!(count_jobs(&mut client), 0, "nothing was inserted");
}

#[test]
fn out_of_range_schedules_are_errors_not_panics() {
    let (db, app) = setup();
    let mut client = db.client();
    let far = app
        .job("t")
        .schedule_in(Duration::from_secs(u64::MAX))
        .defer(&1);
    let e = far.expect_err("a delay past the year 294276 cannot be stored");
    eprintln!("schedule_in(u64::MAX s): {:?}: {e}", e.kind());
    assert!(!e.is_connection_lost(), "{e}");
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(400_000 * 365 * 86_400);
    let e = app.job("t").schedule_at(at).defer(&1).unwrap_err();
    eprintln!("schedule_at(year 400000): {:?}: {e}", e.kind());
    assert!(!e.is_connection_lost(), "{e}");
    assert_eq!(count_jobs(&mut client), 0);
    // The App's connections survived the refusals.
    app.defer("t", &1).unwrap();
}

#[test]
fn malformed_urls_are_config_errors() {
    init_logging();
    // The driver's detail is in the message, not only "invalid connection string".
    let e = App::connect("postgres://host:notaport/db").unwrap_err();
    assert!(e.to_string().contains("`port`"), "{e}");
    let e = App::connect("postgres://u@h/db?sslmode=sometimes").unwrap_err();
    assert!(e.to_string().contains("sslmode"), "{e}");
    for url in [
        "",
        "postgres://host:notaport/db",
        "postgres://",
        "not a url at all",
        "postgres://user@[::1/db",
        "host=a,b,c port=1,2",
        "postgres://u@h/db?connect_timeout=soon",
        "postgres://u@h/db?sslmode=sometimes",
        "mysql://u@h/db",
    ] {
        let started = Instant::now();
        let e = App::connect(url).expect_err(url);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{url}: no network needed"
        );
        assert_eq!(e.kind(), ErrorKind::Config, "{url:?}: {e}");
        let text = e.to_string();
        eprintln!("{url:?} -> {text}");
        assert!(text.starts_with("invalid "), "{url:?}: {text}");
        // Lazy Apps check the string too.
        let e = App::builder(url).lazy(true).build().expect_err(url);
        assert_eq!(e.kind(), ErrorKind::Config, "{url:?} (lazy): {e}");
    }
}

#[test]
fn an_unreachable_server_and_a_missing_database_are_told_apart() {
    init_logging();
    let started = Instant::now();
    let e = App::connect("postgres://postgres@127.0.0.1:1/postgres").unwrap_err();
    let took = started.elapsed();
    eprintln!(
        "measured: connect to a closed port -> {:?} after {took:?}: {e}",
        e.kind()
    );
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        e.to_string().contains("127.0.0.1:1"),
        "names the server: {e}"
    );

    let db = TestDb::new();
    let missing = format!("{}_missing", db.name());
    let url = db.server().url(&missing);
    let e = App::connect(&url).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DatabaseMissing, "{e}");
    assert!(e.is_database_missing() && !e.is_connection_lost(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "database \"{missing}\" does not exist; create it or check the URL"
        )),
        "names the database and the remedy: {text}"
    );
    assert!(
        !text.contains("cannot reach"),
        "the server was reached: {text}"
    );
    assert_eq!(e.sqlstate(), Some("3D000"), "{e}");
    // Through the pool of a lazy App, too.
    let lazy = App::builder(&url)
        .lazy(true)
        .pool_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let e = lazy.defer("t", &()).unwrap_err();
    assert!(e.is_database_missing(), "{e:?}");
    assert_eq!(e.sqlstate(), Some("3D000"), "{e}");

    let e = App::connect(&format!(
        "postgres://no_such_role_xyz@{}/{}",
        db.server_addr(),
        db.name()
    ))
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
    assert_eq!(e.sqlstate(), Some("28000"), "{e}");
    let text = e.to_string();
    assert!(text.contains("no_such_role_xyz"), "{text}");
    // The server answered: a refused login is not an unreachable server, and says what to check.
    assert!(!text.contains("cannot reach"), "{text}");
    assert!(
        text.starts_with("the server refused to log in to the database no_such_role_xyz@"),
        "{text}"
    );
    assert!(text.contains("check the user and password"), "{text}");
}

#[test]
fn zero_timeouts_and_pool_size_are_config_errors() {
    init_logging();
    let url = "postgres://postgres@127.0.0.1:1/postgres";
    let zero = Duration::ZERO;
    let cases = [
        ("io_timeout", App::builder(url).io_timeout(zero).build()),
        (
            "connect_timeout",
            App::builder(url).connect_timeout(zero).build(),
        ),
        ("pool_timeout", App::builder(url).pool_timeout(zero).build()),
        (
            "tcp_user_timeout",
            App::builder(url).tcp_user_timeout(zero).build(),
        ),
        ("pool_size", App::builder(url).pool_size(0).build()),
    ];
    for (name, res) in cases {
        let e = res.expect_err(name);
        assert_eq!(e.kind(), ErrorKind::Config, "{name}: {e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
}

/// Every entry point goes through the one insert builder: the task's default queue and
/// priority apply when the call gives none, and an explicit value (0 included) wins.
#[test]
fn task_defaults_apply_the_same_way_through_every_entry_point() {
    let (db, _) = setup();
    let mut tasks = postpone::Tasks::new();
    tasks
        .register("mail", |_| Ok(()))
        .queue("emails")
        .priority(5);
    let app = App::builder(db.url())
        .pool_size(2)
        .task_defaults(&tasks)
        .build()
        .unwrap();
    let mut c = db.client();
    let row = |c: &mut Client, id: JobId| -> (String, i32) {
        let r = c
            .query_one(
                "SELECT queue, priority FROM postpone_jobs WHERE id = $1",
                &[&id.0],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let plain = app.defer("mail", &1).unwrap();
    let built = app.job("mail").lock("l").defer(&2).unwrap();
    let mut tx = c.transaction().unwrap();
    let in_tx = app.job("mail").defer_in(&mut tx, &3).unwrap();
    tx.commit().unwrap();
    let batch = app
        .defer_batch(&[
            NewJob::new("mail", &4).unwrap(),
            NewJob::new("mail", &5).unwrap().priority(0).queue("other"),
            NewJob::new("other_task", &6).unwrap(),
        ])
        .unwrap();
    let explicit = app.job("mail").priority(0).queue("q").defer(&7).unwrap();
    for id in [plain, built, in_tx, batch[0]] {
        assert_eq!(row(&mut c, id), ("emails".to_owned(), 5), "job {id}");
    }
    assert_eq!(row(&mut c, batch[1]), ("other".to_owned(), 0));
    assert_eq!(row(&mut c, batch[2]), ("default".to_owned(), 0));
    assert_eq!(row(&mut c, explicit), ("q".to_owned(), 0));
    // Debug of a job being built shows its options, and of the builder never a password.
    let shown = format!("{:?}", app.job("mail").queue("x"));
    assert!(
        shown.contains("task: \"mail\"") && shown.contains("Some(\"x\")"),
        "{shown}"
    );
    let shown = format!("{:?}", App::builder("postgres://u:hunter2@h/db"));
    assert!(!shown.contains("hunter2"), "{shown}");
}

/// `defer_in` takes postpone's own connection types too (`GenericClient` is sealed upstream):
/// a job deferred in a postpone `Transaction` commits or rolls back with it.
#[test]
fn defer_in_takes_postpones_own_transaction_and_connections() {
    let db = TestDb::new();
    let app = App::connect(&db.url()).unwrap();
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    {
        let mut tx = conn.transaction().unwrap();
        app.job("rolled_back").defer_in(&mut tx, &1).unwrap();
        // Dropped without commit: rolled back.
    }
    let mut tx = conn.transaction().unwrap();
    let kept = app.job("kept").defer_in(&mut tx, &2).unwrap();
    app.defer_batch_in(&mut tx, &[postpone::NewJob::new("kept_batch", &3).unwrap()])
        .unwrap();
    tx.commit().unwrap();
    let pooled_id = app.job("pooled").defer_in(&mut conn, &4).unwrap();
    drop(conn);
    let tasks: Vec<String> = db
        .client()
        .query("SELECT task FROM postpone_jobs ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tasks, ["kept", "kept_batch", "pooled"]);
    assert!(pooled_id.get() > kept.get());
}

#[test]
fn each_defer_wakes_its_queue_once_whether_its_insert_or_a_transaction_behind_it_notifies() {
    let (db, app) = setup();
    let mut listener = db.client();
    listener.batch_execute("LISTEN postpone").unwrap();
    // A job due now, committed by defer itself: the wake-up follows in a transaction of its
    // own (schema 11), and the insert trigger stays quiet: one notification, not two.
    app.job("t").queue("now").defer(&1).unwrap();
    // Scheduled for later: the insert trigger announces its time, as before.
    app.job("t")
        .queue("later")
        .schedule_in(Duration::from_secs(3600))
        .defer(&2)
        .unwrap();
    // Inside the caller's transaction: the insert trigger notifies at the caller's commit.
    let mut conn = app.connection().unwrap();
    conn.begin().unwrap();
    app.job("t").queue("tx").defer_on(&mut conn, &3).unwrap();
    conn.commit().unwrap();
    // A queueing-lock collision inserts nothing; its wake-up is a harmless hint.
    app.job("t")
        .queue("dup")
        .queueing_lock("k")
        .defer(&4)
        .unwrap();
    let err = app
        .job("t")
        .queue("dup")
        .queueing_lock("k")
        .defer(&5)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyEnqueued, "{err}");
    let got = notifications_until_sentinel(&mut listener, &db);
    let at_later = got
        .iter()
        .filter(|p| p.starts_with("at:") && p.ends_with(":later"));
    assert_eq!(at_later.count(), 1, "{got:?}");
    let jobs: Vec<&str> = got
        .iter()
        .filter(|p| p.starts_with("job:"))
        .map(String::as_str)
        .collect();
    assert_eq!(jobs, ["job:now", "job:tx", "job:dup", "job:dup"], "{got:?}");
    // The quiet insert's setting lasted its transaction only: a job deferred on the same
    // connection inside a transaction still notifies from its insert.
    let mut conn = app.connection().unwrap();
    app.job("t").queue("same").defer_on(&mut conn, &6).unwrap();
    let setting: Option<String> = conn
        .query_one("SELECT current_setting('postpone.quiet_insert', true)", &[])
        .unwrap()
        .get(0);
    assert_ne!(setting.as_deref(), Some("on"));
    conn.begin().unwrap();
    app.job("t")
        .queue("same-tx")
        .defer_on(&mut conn, &7)
        .unwrap();
    conn.commit().unwrap();
    let got = notifications_until_sentinel(&mut listener, &db);
    assert_eq!(got, ["job:same", "job:same-tx"]);
}
