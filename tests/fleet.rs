//! A fleet of worker processes on one server: what a worker costs the server in
//! connections, what it does when the server refuses new ones (a role's `CONNECTION LIMIT`,
//! the same SQLSTATE 53300 as `max_connections`), and a worker that needs no LISTEN
//! connection, and thirty worker processes on a server of PostgreSQL's default 100
//! connections. Every role is made for its test and dropped after it (support/role.rs).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use postpone::{App, ErrorKind, GrantsFor, Job, TaskError, Tasks, Vacuum, Worker};
use serde_json::json;
use support::cluster;
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
    tasks.register("count", move |job: &Job| -> Result<(), TaskError> {
        let args: serde_json::Value = job.args()?;
        if let Some(ms) = args.get("ms").and_then(serde_json::Value::as_u64) {
            std::thread::sleep(Duration::from_millis(ms));
        }
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

#[test]
fn a_worker_whose_role_may_hold_one_connection_runs_jobs_and_records_them_on_it() {
    let (db, owner, role) = setup("one-slot");
    let (tasks, ran) = counting_tasks();
    let wapp = App::builder(role.url(&db))
        .pool_size(1)
        .lazy(true)
        .build()
        .unwrap();
    let worker = Worker::builder(&wapp, tasks)
        .name("fleet-one-slot-worker")
        .concurrency(2)
        .poll_interval(Duration::from_millis(300))
        .heartbeat_interval(Duration::from_millis(300))
        .stalled_after(Duration::from_secs(30))
        .reconnect_backoff_max(Duration::from_millis(500))
        .vacuum(Vacuum::off())
        .spawn()
        .unwrap();
    // Busy first, so that the fetcher has a connection of its own.
    let batch: Vec<postpone::NewJob> = (0..200)
        .map(|_| postpone::NewJob::new("count", &json!({ "ms": 2 })).unwrap())
        .collect();
    owner.defer_batch(&batch).unwrap();
    let mut before = 0;
    assert!(wait_until(Duration::from_secs(30), || {
        before = before.max(worker.open_sockets());
        ran.load(Ordering::SeqCst) == 200
    }));
    eprintln!("at most {before} connection(s) of the worker while it ran 200 jobs");

    // One connection for the role, and every session ends: whichever thread reconnects
    // first, the worker must run and record jobs on that one connection (the fetcher
    // sleeps, or hands its connection over, and the beat claims; the completer records on
    // the beat's connection).
    set_connection_limit(&db, &role, 1);
    terminate_sessions_of(&db, &role);
    owner.defer_batch(&batch).unwrap();
    let mut most_server = 0;
    let mut most_sockets = 0;
    let ran_all = wait_until(Duration::from_secs(60), || {
        most_server = most_server.max(connections_of(&db, &role));
        most_sockets = most_sockets.max(worker.open_sockets());
        succeeded(&db) == 400
    });
    eprintln!(
        "under a limit of 1: ran {} of 400, at most {most_server} server connection(s) of the \
         role, {most_sockets} socket(s) of the worker; {:?}",
        ran.load(Ordering::SeqCst),
        worker.stats()
    );
    assert!(
        ran_all,
        "not every job ran and was recorded: {:?}",
        worker.stats()
    );
    assert!(most_server <= 1, "{most_server}");
    let warned = lines_with(&["fleet-one-slot-worker", "refused the connection"]);
    assert!(warned.len() <= 2, "one warning per episode: {warned:#?}");

    set_connection_limit(&db, &role, -1);
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

/// Succeeded jobs in `db`.
/// A fresh database with the schema, and the App that migrated it.
fn migrated_db() -> (TestDb, App) {
    captured();
    let db = TestDb::new();
    let owner = App::builder(db.url()).pool_size(2).build().unwrap();
    owner.migrate().unwrap();
    (db, owner)
}

/// An App on `db` whose connections carry `name` as their application_name, closing its
/// idle ones after 500 ms.
fn app_named(db: &TestDb, name: &str, pool_size: u32) -> App {
    App::builder(url_named(db, name))
        .pool_size(pool_size)
        .pool_idle_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

fn succeeded(db: &TestDb) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
            &[],
        )
        .unwrap()
        .get(0)
}

#[test]
fn an_idle_worker_process_holds_one_connection_and_two_while_it_drains() {
    let (db, owner) = migrated_db();
    for listen in [true, false] {
        db.client()
            .batch_execute("DELETE FROM postpone_jobs")
            .unwrap();
        let name = format!("fleet-idle-{listen}");
        let app = app_named(&db, &name, 4);
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
            .vacuum(Vacuum::off())
            .spawn()
            .unwrap();
        for _ in 0..8 {
            app.defer("defer", &json!({})).unwrap();
        }
        assert!(wait_until(Duration::from_secs(30), || ran
            .load(Ordering::SeqCst)
            == 8));
        let after_tasks = connections_named(&db, &name);
        // Idle: the pool closes its connections after pool_idle_timeout, and the fetcher,
        // whose claims found nothing that long, closes its own: the worker's lasting
        // connection (the beat's, which LISTENs, and on which the completer records) is left.
        let settled = wait_until(Duration::from_secs(20), || {
            connections_named(&db, &name) == 1
        });
        let idle = connections_named(&db, &name);
        assert!(
            settled,
            "listen({listen}): {idle} connection(s) idle, expected 1"
        );
        // A drain of tasks that use no pooled connection (1 ms each, so that the drain
        // lasts and is sampled every 10 ms): the fetcher's connection, and the one the
        // heartbeat, the listener and the completer share.
        let jobs: Vec<postpone::NewJob> = (0..3000)
            .map(|_| postpone::NewJob::new("count", &json!({ "ms": 1 })).unwrap())
            .collect();
        owner.defer_batch(&jobs).unwrap();
        let mut busy = 0;
        let mut samples = 0;
        let drained = wait_until(Duration::from_secs(60), || {
            busy = busy.max(connections_named(&db, &name));
            samples += 1;
            ran.load(Ordering::SeqCst) >= 8 + 3000
        });
        assert!(
            drained,
            "listen({listen}): ran {}",
            ran.load(Ordering::SeqCst)
        );
        eprintln!(
            "listen({listen}): {after_tasks} connection(s) just after tasks used the pool, \
             {idle} idle, at most {busy} during a drain of 3000 jobs ({samples} samples)"
        );
        assert!(
            busy <= 2,
            "listen({listen}): {busy} connections during the drain"
        );
        // Idle again, then a job deferred to the sleeping fetcher runs (claimed by the beat
        // on its connection when notified, or at its poll without LISTEN).
        assert!(wait_until(Duration::from_secs(20), || {
            connections_named(&db, &name) == 1
        }));
        app.defer("count", &json!({})).unwrap();
        assert!(wait_until(Duration::from_secs(20), || ran
            .load(Ordering::SeqCst)
            == 8 + 3000 + 1));
        // Its outcome is recorded on the same connection (8 jobs that deferred, the 8 they
        // deferred, the drain and this one): the worker's threads opened no other.
        assert!(
            wait_until(Duration::from_secs(20), || succeeded(&db)
                == 8 + 8 + 3000 + 1),
            "listen({listen}): not every outcome was recorded"
        );
        assert_eq!(
            worker.open_sockets(),
            1,
            "listen({listen}): a job now and then is claimed and recorded on one connection"
        );
        let report = worker.shutdown(Duration::from_secs(5));
        assert!(report.is_clean(), "{report}");
        drop(app);
        assert!(wait_until(Duration::from_secs(10), || {
            connections_named(&db, &name) == 0
        }));
    }
}

/// The periodic thread holds a connection only while its next instant or prune is within the
/// App's `pool_idle_timeout`: a worker whose schedule is yearly and whose retention prunes
/// hourly holds one connection when idle, the lasting one. A schedule every two seconds still
/// defers each instant, its thread connecting for each.
#[test]
fn a_periodic_thread_whose_next_instant_is_far_holds_no_connection() {
    let (db, _owner) = migrated_db();
    let name = "fleet-periodic-far";
    let app = app_named(&db, name, 2);
    // A worker whose one task `task` runs on `schedule`, with `retention` if given.
    let spawn = |task: &str, schedule: &str, retention: Option<postpone::Retention>| {
        let (mut tasks, _) = counting_tasks();
        tasks.register(task, |_: &Job| -> Result<(), TaskError> { Ok(()) });
        tasks.periodic(task, schedule);
        let mut b = Worker::builder(&app, tasks)
            .concurrency(2)
            .vacuum(Vacuum::off());
        if let Some(r) = retention {
            b = b.retention(r);
        }
        b.spawn().unwrap()
    };
    let hourly =
        postpone::Retention::new(Duration::from_secs(60)).interval(Duration::from_secs(3600));
    let worker = spawn("yearly", "0 0 1 1 *", Some(hourly));
    let settled = wait_until(Duration::from_secs(20), || {
        connections_named(&db, name) == 1 && worker.open_sockets() == 1
    });
    assert!(
        settled,
        "{} connection(s), {} socket(s) of the worker: expected 1 (the lasting connection)",
        connections_named(&db, name),
        worker.open_sockets()
    );
    let report = worker.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");

    // Every two seconds: more than pool_idle_timeout apart, so the thread connects for each.
    let worker = spawn("often", "*/2 * * * * *", None);
    let count = || db.count_jobs("often", "succeeded");
    assert!(
        wait_until(Duration::from_secs(20), || count() >= 4),
        "{} instants of a two-second schedule ran in 20 s",
        count()
    );
    // Between instants its connection is closed: one connection is seen at times.
    assert!(
        wait_until(Duration::from_secs(10), || connections_named(&db, name)
            == 1),
        "the periodic thread kept its connection between instants two seconds apart"
    );
    let report = worker.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
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

const FLEET_URL: &str = "POSTPONE_FLEET_CHILD_URL";

/// A worker process of the fleet test: 2 threads, task `count`, a pool of 1, until its stdin
/// closes; then it shuts down and prints what went wrong.
#[test]
#[ignore = "child process of the fleet test"]
fn child_fleet_worker() {
    let Ok(url) = std::env::var(FLEET_URL) else {
        return;
    };
    let app = App::builder(url).pool_size(1).lazy(true).build().unwrap();
    let (tasks, ran) = counting_tasks();
    let handle = Worker::builder(&app, tasks)
        .concurrency(2)
        .poll_interval(Duration::from_millis(500))
        .spawn()
        .unwrap();
    println!("CHILD_READY");
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
    let stats = handle.stats();
    let report = handle.shutdown(Duration::from_secs(10));
    println!(
        "CHILD_DONE db_errors={} clean={} ran={}",
        stats.db_errors,
        report.is_clean(),
        ran.load(Ordering::SeqCst)
    );
}

#[test]
fn thirty_worker_processes_fit_in_a_server_of_100_connections_with_a_producer_and_the_cli() {
    captured();
    if let Some(reason) = cluster::skip_reason() {
        skip(&reason);
        return;
    }
    let cl = Cluster::primary_with("fleet30", "max_connections = 100\n", "");
    let mut admin = cl.client("postgres");
    admin.batch_execute("CREATE DATABASE fleet").unwrap();
    // Workers, the producer and the CLI run as a role without superuser: the server's
    // reserved slots stay for the superuser (this test's own look at pg_stat_activity).
    admin.batch_execute("CREATE ROLE fleet_role LOGIN").unwrap();
    let owner = App::builder(cl.url("fleet")).pool_size(1).build().unwrap();
    owner.migrate().unwrap();
    for part in [GrantsFor::Worker, GrantsFor::Producer] {
        let sql = owner.admin().grants("fleet_role", part).unwrap();
        owner.connection().unwrap().batch_execute(&sql).unwrap();
    }
    let role_url = format!("postgres://fleet_role@127.0.0.1:{}/fleet", cl.port());
    let named = |name: &str| format!("{role_url}?application_name={name}");
    let mut observer = cl.client("fleet");
    let mut fleet_connections = || -> i64 {
        observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fleet-worker'",
                &[],
            )
            .unwrap()
            .get(0)
    };

    let t0 = Instant::now();
    let mut children: Vec<ChildProc> = (0..30)
        .map(|_| {
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.args([
                "child_fleet_worker",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FLEET_URL, named("fleet-worker"));
            ChildProc::spawn(cmd)
        })
        .collect();
    for c in &children {
        c.wait_line("CHILD_READY", Duration::from_secs(60));
    }
    let started = t0.elapsed();
    let mut most = fleet_connections();

    // A producer defers one job every few milliseconds and a batch of 100 now and then,
    // while the CLI defers a job every 250 ms: all of it must be served throughout.
    let producer = App::builder(named("fleet-producer"))
        .pool_size(1)
        .build()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(8);
    let producing = std::thread::spawn(move || {
        let (mut deferred, mut failed) = (0usize, Vec::new());
        let batch: Vec<postpone::NewJob> = (0..100)
            .map(|_| postpone::NewJob::new("count", &json!({})).unwrap())
            .collect();
        let mut i = 0;
        while Instant::now() < until {
            i += 1;
            let res = if i % 40 == 0 {
                producer.defer_batch(&batch).map(|ids| ids.len())
            } else {
                producer.defer("count", &json!({})).map(|_| 1)
            };
            match res {
                Ok(n) => deferred += n,
                Err(e) => failed.push(e.to_string()),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        (deferred, failed)
    });
    let mut by_cli = 0;
    while Instant::now() < until {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_postpone"))
            .args([
                "--database-url",
                &named("fleet-cli"),
                "defer",
                "count",
                "{}",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "postpone defer failed while the fleet ran: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        by_cli += 1;
        most = most.max(fleet_connections());
        std::thread::sleep(Duration::from_millis(250));
    }
    let (deferred, failed) = producing.join().unwrap();
    assert!(failed.is_empty(), "defers failed: {failed:#?}");
    let all = (deferred + by_cli) as i64;
    let mut c = cl.client("fleet");
    let done = wait_until(Duration::from_secs(60), || {
        most = most.max(fleet_connections());
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
                &[],
            )
            .unwrap()
            .get(0);
        n == all
    });
    assert!(done, "not every one of {all} jobs succeeded");

    for ch in &mut children {
        ch.close_stdin();
    }
    let mut ran = 0;
    for ch in children {
        let line = ch.stop("CHILD_DONE", Duration::from_secs(30));
        assert!(line.contains("db_errors=0 "), "a worker met errors: {line}");
        assert!(line.contains("clean=true"), "{line}");
        ran += line
            .rsplit("ran=")
            .next()
            .and_then(|n| n.trim().parse::<i64>().ok())
            .unwrap_or(0);
    }
    assert_eq!(ran, all, "every job ran once");
    eprintln!(
        "30 worker processes started in {started:?}; {deferred} jobs deferred by the producer, \
         {by_cli} by the CLI; the fleet held at most {most} connections"
    );
}
