//! A fleet of worker processes on one server: what a worker costs the server in
//! connections, what it does when the server refuses new ones (a role's `CONNECTION LIMIT`,
//! the same SQLSTATE 53300 as `max_connections`), and a worker that needs no LISTEN
//! connection. Every role is made for its test and dropped after it (support/role.rs).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use postpone::{App, ErrorKind, GrantsFor, Job, TaskError, Tasks, Vacuum, Worker};
use serde_json::json;
use support::*;

/// Every log line of this test binary at info level and above, for the tests that check
/// what a worker said.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}", r.level(), r.args());
            eprintln!("{line}");
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

/// Captured lines that contain every one of `needles`.
fn lines_with(needles: &[&str]) -> Vec<String> {
    captured()
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .cloned()
        .collect()
}

/// The schema, installed by the database owner, and a role that may run workers and defer.
fn setup(tag: &str) -> (TestDb, App, TestRole) {
    captured();
    let db = TestDb::new();
    let owner = App::builder(db.url()).pool_size(2).build().unwrap();
    owner.migrate().unwrap();
    let role = TestRole::new(&db, tag);
    for part in [GrantsFor::Worker, GrantsFor::Producer] {
        let sql = owner.admin().grants(role.name(), part).unwrap();
        owner.connection().unwrap().batch_execute(&sql).unwrap();
    }
    (db, owner, role)
}

/// Server connections of `role` right now.
fn connections_of(db: &TestDb, role: &TestRole) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
            &[&role.name()],
        )
        .unwrap()
        .get(0)
}

fn set_connection_limit(db: &TestDb, role: &TestRole, limit: i32) {
    db.client()
        .batch_execute(&format!(
            "ALTER ROLE {} CONNECTION LIMIT {limit}",
            quote_ident(role.name())
        ))
        .unwrap();
}

/// Ends every session of `role` (a server restart, as the role's threads see it).
fn terminate_sessions_of(db: &TestDb, role: &TestRole) {
    db.client()
        .execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = $1",
            &[&role.name()],
        )
        .unwrap();
}

/// Tasks with one task, `count`, that counts its runs.
fn counting_tasks() -> (Tasks, Arc<AtomicUsize>) {
    let ran = Arc::new(AtomicUsize::new(0));
    let mut tasks = Tasks::new();
    let r = ran.clone();
    tasks.register("count", move |_: &Job| -> Result<(), TaskError> {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    (tasks, ran)
}

#[test]
fn a_worker_keeps_going_while_the_server_refuses_connections_and_defers_fail_fast_naming_the_cause()
{
    let (db, owner, role) = setup("refused");
    let (tasks, ran) = counting_tasks();
    let wapp = App::builder(role.url(&db)).pool_size(1).build().unwrap();
    let name = "fleet-refused-worker".to_string();
    let worker = Worker::builder(&wapp, tasks)
        .name(name.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(300))
        .heartbeat_interval(Duration::from_millis(300))
        .stalled_after(Duration::from_secs(30))
        .reconnect_backoff_max(Duration::from_millis(500))
        .vacuum(Vacuum::off())
        .spawn()
        .unwrap();
    owner.defer("count", &json!({})).unwrap();
    assert!(wait_until(Duration::from_secs(20), || ran
        .load(Ordering::SeqCst)
        == 1));
    let held = connections_of(&db, &role);
    eprintln!("the worker holds {held} connection(s) before the refusals");

    // No new connection for the role; its sessions end: every thread must reconnect.
    set_connection_limit(&db, &role, 0);
    terminate_sessions_of(&db, &role);
    for _ in 0..3 {
        owner.defer("count", &json!({})).unwrap();
    }

    // A producer under the same role is refused, clearly, within its pool_timeout.
    let producer = App::builder(role.url(&db))
        .lazy(true)
        .pool_size(1)
        .pool_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let err = producer.defer("count", &json!({})).unwrap_err();
    let took = t0.elapsed();
    eprintln!("defer refused after {took:?}: {err}");
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    assert_eq!(err.sqlstate(), Some("53300"), "{err}");
    let text = err.to_string();
    for needle in ["refused the connection", "max_connections", "PgBouncer"] {
        assert!(text.contains(needle), "{needle:?} missing from: {text}");
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Building a (non-lazy) App is refused the same way.
    let err = App::builder(role.url(&db)).build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    assert_eq!(err.sqlstate(), Some("53300"), "{err}");

    // The worker's threads go on trying, warning once for the whole episode.
    let errors_before = worker.stats().db_errors;
    assert!(
        wait_until(Duration::from_secs(20), || worker.stats().db_errors
            >= errors_before + 10),
        "the worker's threads stopped retrying: {:?}",
        worker.stats()
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let warned = lines_with(&[&name, "refused the connection"]);
    assert_eq!(warned.len(), 1, "one warning per episode: {warned:#?}");
    assert!(warned[0].starts_with("WARN"), "{warned:?}");
    assert!(warned[0].contains("53300"), "{warned:?}");

    // Room again: the worker reconnects by itself and runs what waited.
    set_connection_limit(&db, &role, -1);
    assert!(
        wait_until(Duration::from_secs(30), || ran.load(Ordering::SeqCst) == 4),
        "ran {} of 4",
        ran.load(Ordering::SeqCst)
    );
    let recovered = lines_with(&[&name, "accepts connections again"]);
    assert_eq!(recovered.len(), 1, "{recovered:#?}");
    assert_eq!(
        lines_with(&[&name, "refused the connection"]).len(),
        1,
        "still one warning"
    );
    producer.defer("count", &json!({})).unwrap();
    assert!(wait_until(Duration::from_secs(20), || ran
        .load(Ordering::SeqCst)
        == 5));
    let report = worker.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
}

/// Server connections whose application_name is `name`.
fn connections_named(db: &TestDb, name: &str) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .unwrap()
        .get(0)
}

/// `db`'s URL with an application_name, to count a process's connections on the server.
fn url_named(db: &TestDb, name: &str) -> String {
    let url = db.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

#[test]
fn an_idle_worker_process_holds_three_connections_or_two_without_listen() {
    captured();
    let db = TestDb::new();
    let owner = App::builder(db.url()).pool_size(2).build().unwrap();
    owner.migrate().unwrap();
    for (listen, threads) in [(true, 3), (false, 2)] {
        let name = format!("fleet-idle-{listen}");
        let app = App::builder(url_named(&db, &name))
            .pool_size(4)
            .pool_idle_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let (tasks, ran) = counting_tasks();
        // The task defers through the App's pool, so that the pool has connections to close.
        let mut tasks = tasks;
        let a = app.clone();
        tasks.register("defer", move |_: &Job| -> Result<(), TaskError> {
            a.defer("count", &json!({})).map_err(TaskError::retry)?;
            Ok(())
        });
        let worker = Worker::builder(&app, tasks)
            .concurrency(4)
            .listen(listen)
            .poll_interval(Duration::from_millis(200))
            .spawn()
            .unwrap();
        for _ in 0..8 {
            app.defer("defer", &json!({})).unwrap();
        }
        assert!(wait_until(Duration::from_secs(30), || ran
            .load(Ordering::SeqCst)
            == 8));
        let busy = connections_named(&db, &name);
        // Idle: the pool and the completer close their connections after pool_idle_timeout;
        // fetch and beat keep theirs, and listen unless listen(false).
        let settled = wait_until(Duration::from_secs(20), || {
            connections_named(&db, &name) == threads
        });
        let idle = connections_named(&db, &name);
        eprintln!("listen({listen}): {busy} connection(s) just after the work, {idle} idle");
        assert!(
            settled,
            "listen({listen}): {idle} connection(s) idle, expected {threads}"
        );
        // A call after the quiet spell opens a connection again.
        app.defer("count", &json!({})).unwrap();
        assert!(wait_until(Duration::from_secs(20), || ran
            .load(Ordering::SeqCst)
            == 9));
        // Its outcome is recorded on a connection the completer opens again.
        let mut c = db.client();
        let schema_jobs = 8 + 8 + 1 + if listen { 0 } else { 17 };
        assert!(
            wait_until(Duration::from_secs(20), || {
                let n: i64 = c
                    .query_one(
                        "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                n == schema_jobs
            }),
            "listen({listen}): not every outcome was recorded"
        );
        let report = worker.shutdown(Duration::from_secs(5));
        assert!(report.is_clean(), "{report}");
        drop(app);
        assert!(wait_until(Duration::from_secs(10), || {
            connections_named(&db, &name) == 0
        }));
    }
}

#[test]
fn a_worker_without_listen_wakes_on_a_deferred_job_within_its_poll_interval() {
    captured();
    let db = TestDb::new();
    let name = "fleet-nolisten";
    let app = App::builder(url_named(&db, name))
        .pool_size(1)
        .build()
        .unwrap();
    app.migrate().unwrap();
    let ran_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let mut tasks = Tasks::new();
    let r = ran_at.clone();
    tasks.register("stamp", move |_: &Job| -> Result<(), TaskError> {
        r.lock().unwrap().push(Instant::now());
        Ok(())
    });
    let poll = Duration::from_secs(1);
    let worker = Worker::builder(&app, tasks)
        .listen(false)
        .poll_interval(poll)
        .spawn()
        .unwrap();
    let mut waits = Vec::new();
    for i in 0..5u64 {
        // Defers at different points of the poll cycle.
        std::thread::sleep(Duration::from_millis(170 * i));
        let t0 = Instant::now();
        app.defer("stamp", &json!({ "i": i })).unwrap();
        assert!(wait_until(Duration::from_secs(20), || ran_at
            .lock()
            .unwrap()
            .len()
            == i as usize + 1));
        let started = *ran_at.lock().unwrap().last().unwrap();
        waits.push(started.saturating_duration_since(t0));
    }
    eprintln!("listen(false), poll_interval {poll:?}: defer to start {waits:?}");
    let longest = waits.iter().max().copied().unwrap();
    // Within the poll interval, with a wide margin for a loaded machine.
    assert!(longest < poll + Duration::from_secs(4), "{waits:?}");
    let report = worker.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
}
