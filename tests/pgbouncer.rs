//! Through a real PgBouncer (Debian's package, started by the test on a spare port with a
//! generated config; skipped, with the reason printed, where it is not installed):
//!
//! - three worker processes (this test binary, started again as `child_pgbouncer_worker`)
//!   run every job exactly once, in session pooling, in transaction pooling
//!   (`pooler_mode=transaction`: unnamed statements, polling instead of LISTEN), and directly
//!   for comparison; each process's shutdown is bounded and clean. The jobs/s of each run and
//!   the connections each process holds are printed (`MEASURED`).
//! - what cannot work through a transaction pooler is refused with an error that says so.
//! - PgBouncer's server side stranded (the fault proxy between PgBouncer and PostgreSQL):
//!   our `io_timeout` still ends every call, and shutdown stays bounded.

mod support;
mod worker_util;

use std::process::Command;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{App, ErrorKind, Job, NewJob, Tasks, Worker};
use support::{skip, wait_until, ChildProc, FaultProxy, NewConns, PgBouncer, PoolMode, TestDb};
use worker_util::*;

const CHILD_URL: &str = "POSTPONE_PGB_CHILD_URL";
const CHILD_LISTEN: &str = "POSTPONE_PGB_CHILD_LISTEN";
const PROCESSES: usize = 3;
const JOBS: usize = 300;

/// The worker process: runs task `mark` (which records its run in table `ran` through its
/// own App's pool) until its stdin closes, then shuts down and prints its report.
#[test]
#[ignore = "child process of the pgbouncer tests"]
fn child_pgbouncer_worker() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let listen = std::env::var(CHILD_LISTEN).is_ok_and(|v| v == "1");
    let app = App::builder(&url)
        .pool_size(1)
        .io_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut tasks = Tasks::new();
    let recorder = app.clone();
    tasks.register("mark", move |job: &Job| {
        let mut conn = recorder.connection()?;
        conn.execute(
            "INSERT INTO ran (job_id, pid) VALUES ($1, $2)",
            &[&job.id().get(), &(std::process::id() as i32)],
        )?;
        Ok(())
    });
    let handle = Worker::builder(&app, tasks)
        .concurrency(2)
        .listen(listen)
        .poll_interval(Duration::from_millis(50))
        .heartbeat_interval(Duration::from_millis(500))
        .stalled_after(Duration::from_secs(10))
        .spawn()
        .unwrap();
    println!("CHILD_READY");
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
    let report = handle.shutdown(Duration::from_secs(5));
    println!(
        "CHILD_REPORT clean={} elapsed_ms={} {report}",
        report.is_clean(),
        report.elapsed().as_millis()
    );
}

fn start_worker(url: &str, listen: bool) -> ChildProc {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_pgbouncer_worker",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_URL, url)
    .env(CHILD_LISTEN, if listen { "1" } else { "0" });
    ChildProc::spawn(cmd)
}

/// Connections each worker process holds on the server (by application_name), direct only.
fn connections_by_process(db: &TestDb, names: &[String]) -> Vec<i64> {
    let mut c = db.client();
    names
        .iter()
        .map(|n| {
            c.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND application_name = $1",
                &[n],
            )
            .unwrap()
            .get(0)
        })
        .collect()
}

/// Runs JOBS jobs with PROCESSES worker processes on `url` (`extra` appended to the query
/// string), checks each ran exactly once and every process stopped cleanly and in time;
/// returns jobs/s.
fn run_processes(label: &str, db: &TestDb, url: &str, listen: bool) -> f64 {
    let sep = if url.contains('?') { '&' } else { '?' };
    let names: Vec<String> = (0..PROCESSES).map(|i| format!("pgb-{label}-{i}")).collect();
    let procs: Vec<ChildProc> = names
        .iter()
        .map(|n| start_worker(&format!("{url}{sep}application_name={n}"), listen))
        .collect();
    for p in &procs {
        p.wait_line("CHILD_READY", Duration::from_secs(30));
    }
    let app = App::builder(url)
        .pool_size(2)
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|i| NewJob::new("mark", &serde_json::json!({ "i": i })).unwrap())
        .collect();
    let started = Instant::now();
    for chunk in jobs.chunks(50) {
        app.defer_batch(chunk).unwrap();
    }
    let mut client = db.client();
    let all_done = wait_until(Duration::from_secs(60), || {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
                &[],
            )
            .unwrap()
            .get(0);
        n == JOBS as i64
    });
    let elapsed = started.elapsed();
    assert!(all_done, "{label}: not every job succeeded within 60 s");
    let rate = JOBS as f64 / elapsed.as_secs_f64();
    println!(
        "MEASURED {label}: {JOBS} jobs by {PROCESSES} worker processes (2 threads each) in {:.0} ms: {rate:.0} jobs/s",
        elapsed.as_secs_f64() * 1000.0
    );
    if label.starts_with("direct") {
        let per = connections_by_process(db, &names);
        println!("MEASURED direct: server connections per worker process (listen on, App pool_size 1): {per:?}");
        assert!(per.iter().all(|&n| n > 0), "{per:?}");
    }
    for p in procs {
        let report = p.stop("CHILD_REPORT", Duration::from_secs(15));
        assert!(report.contains("clean=true"), "{label}: {report}");
        let ms: u64 = report
            .split("elapsed_ms=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(u64::MAX);
        assert!(ms <= 5100, "{label}: shutdown(5s) took {ms} ms: {report}");
    }
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT job_id), count(DISTINCT pid) FROM ran",
            &[],
        )
        .unwrap();
    let (runs, distinct, pids): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(distinct, JOBS as i64, "{label}: jobs lost");
    assert_eq!(
        runs,
        JOBS as i64,
        "{label}: {} job runs too many",
        runs - distinct
    );
    assert!(pids >= 2, "{label}: only {pids} process(es) ran jobs");
    let open: i64 = client
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status <> 'succeeded' OR attempts <> 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "{label}");
    rate
}

fn fresh_db() -> TestDb {
    let (db, _app) = setup();
    db.client()
        .batch_execute("CREATE TABLE ran (job_id bigint NOT NULL, pid int NOT NULL)")
        .unwrap();
    db
}

#[test]
fn worker_processes_through_pgbouncer_in_both_modes_and_directly() {
    if let Some(reason) = PgBouncer::skip_reason() {
        skip(&reason);
        return;
    }
    let db = fresh_db();
    let direct = run_processes("direct", &db, &db.url(), true);

    let db = fresh_db();
    let session = PgBouncer::start(&db.server_addr(), PoolMode::Session, 20);
    let via_session = run_processes("session", &db, &session.url(db.name()), true);
    drop(session);

    let db = fresh_db();
    let transaction = PgBouncer::start(&db.server_addr(), PoolMode::Transaction, 4);
    let url = format!("{}?pooler_mode=transaction", transaction.url(db.name()));
    let via_transaction = run_processes("transaction", &db, &url, false);
    let pools = transaction.show("POOLS");
    println!("pgbouncer (transaction) pools after the run: {pools:?}");
    drop(transaction);

    // Direct once more, last: the first run also pays for starting up.
    let db = fresh_db();
    let direct_again = run_processes("direct-again", &db, &db.url(), true);
    println!(
        "MEASURED jobs/s: direct {direct:.0} (first) / {direct_again:.0} (last), pgbouncer \
         session {via_session:.0}, pgbouncer transaction {via_transaction:.0} (short runs on a \
         shared, loaded machine)"
    );
}

#[test]
fn what_needs_a_session_is_refused_through_a_transaction_pooler() {
    if let Some(reason) = PgBouncer::skip_reason() {
        skip(&reason);
        return;
    }
    let (db, _direct) = setup();
    let bouncer = PgBouncer::start(&db.server_addr(), PoolMode::Transaction, 2);
    let url = format!("{}?pooler_mode=transaction", bouncer.url(db.name()));
    let app = app_at(&url, Duration::from_secs(5));

    let mut tasks = Tasks::new();
    tasks.register("noop", |_job: &Job| Ok(()));
    let e = Worker::builder(&app, tasks).spawn().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains(".listen(false)"), "{e}");
    let mut conn = app.connection().unwrap();
    let e = conn.listen("anything").unwrap_err();
    assert!(e.to_string().contains("pooler_mode=transaction"), "{e}");
    let e = conn.prepare("SELECT 1").unwrap_err();
    assert!(e.to_string().contains("prepared statement"), "{e}");
    // A caller's own statements with parameters still work (each inside a transaction).
    for i in 0..20i64 {
        let row = conn.query_one("SELECT $1::bigint + 1", &[&i]).unwrap();
        assert_eq!(row.get::<_, i64>(0), i + 1);
    }
    drop(conn);
    // The library's own statements go unnamed: defer, admin reads, a polling worker.
    let id = app.defer("noop", &()).unwrap();
    let mut tasks = Tasks::new();
    tasks.register("noop", |_job: &Job| Ok(()));
    let worker = fast_worker(&app, tasks).listen(false).spawn().unwrap();
    wait_status(&db, id, "succeeded", Duration::from_secs(10));
    let report = worker.shutdown(Duration::from_secs(3));
    assert!(report.is_clean(), "{report}");
    // A listener connected directly (listen_via) wakes a worker whose App goes through the
    // pooler: with a 30 s poll interval, only a notification can start the job promptly.
    let (ran_tx, ran_rx) = unbounded::<i64>();
    let mut tasks = Tasks::new();
    tasks.register("noop", move |job: &Job| {
        ran_tx.send(job.id().get()).unwrap();
        Ok(())
    });
    let direct = app_at(&db.url(), Duration::from_secs(5));
    let worker = fast_worker(&app, tasks)
        .listen_via(&direct)
        .poll_interval(Duration::from_secs(30))
        .spawn()
        .unwrap();
    assert!(listening_backends(&db) >= 1);
    // The first job may be found by the fetcher's claim at start; after it the fetcher waits
    // for news for up to 30 s, so the second one is started by the notification alone.
    let first = app.defer("noop", &()).unwrap();
    assert_eq!(
        ran_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        first.get()
    );
    let started = Instant::now();
    let second = app.defer("noop", &()).unwrap();
    assert_eq!(
        ran_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        second.get()
    );
    report_figure(
        "pooler_mode=transaction, listen_via a direct App: defer to start",
        started.elapsed(),
    );
    let report = worker.shutdown(Duration::from_secs(3));
    assert!(report.is_clean(), "{report}");
    // The admin API's calls on one job run each statement in a transaction of its own
    // under a lock timeout: they work through the pooler, and one whose job another
    // session holds gives up with the reason.
    let admin = app.admin();
    let later = || app.job("noop").schedule_in(Duration::from_secs(3600));
    let (a, b) = (later().defer(&1).unwrap(), later().defer(&2).unwrap());
    admin.set_priority(a, 3).unwrap();
    assert_eq!(admin.abort(a).unwrap(), postpone::AbortOutcome::Cancelled);
    admin.retry(a).unwrap();
    admin.cancel(a).unwrap();
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM postpone_jobs WHERE id = $1 FOR UPDATE",
        &[&b.get()],
    )
    .unwrap();
    let e = admin.cancel(b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    tx.rollback().unwrap();
    admin.cancel(b).unwrap();
    drop(bouncer);
}

#[test]
fn a_stranded_pgbouncer_server_side_is_caught_by_our_deadlines() {
    if let Some(reason) = PgBouncer::skip_reason() {
        skip(&reason);
        return;
    }
    let (db, direct) = setup();
    let proxy = FaultProxy::start(&db.server_addr());
    let bouncer = PgBouncer::start(
        &format!("127.0.0.1:{}", proxy.port()),
        PoolMode::Transaction,
        4,
    );
    let url = format!("{}?pooler_mode=transaction", bouncer.url(db.name()));
    let app = app_at(&url, Duration::from_secs(1));
    let (ran_tx, ran_rx) = unbounded::<i64>();
    let mut tasks = Tasks::new();
    tasks.register("noop", move |job: &Job| {
        ran_tx.send(job.id().get()).unwrap();
        Ok(())
    });
    let worker = fast_worker(&app, tasks).listen(false).spawn().unwrap();
    let id = app.defer("noop", &()).unwrap();
    assert_eq!(
        ran_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        id.get()
    );

    // PgBouncer's links to PostgreSQL go half-open; new ones hang too.
    proxy.strand_all();
    proxy.set_new_conns(NewConns::Strand);
    let started = Instant::now();
    let e = app.defer("noop", &()).unwrap_err();
    let took = started.elapsed();
    report_figure("pgbouncer stranded: defer fails after", took);
    assert!(
        took < Duration::from_secs(4),
        "defer through a stranded pgbouncer took {took:?}: {e}"
    );
    assert!(e.is_timeout() || e.kind() == ErrorKind::Timeout, "{e}");

    // The worker is still stoppable within its timeout.
    let report = worker.shutdown(Duration::from_secs(2));
    assert!(
        report.elapsed() < Duration::from_millis(2100),
        "shutdown(2s) took {:?}: {report}",
        report.elapsed()
    );
    assert!(report.abandoned_threads().is_empty(), "{report}");

    // Healed, the same App defers again (PgBouncer opens new server connections).
    proxy.set_new_conns(NewConns::Forward);
    let mut last = None;
    let healed = wait_until(Duration::from_secs(20), || match app.defer("noop", &()) {
        Ok(_) => true,
        Err(e) => {
            last = Some(e);
            false
        }
    });
    assert!(healed, "no defer after healing: {last:?}");
    drop(direct);
}

/// The helper the chaos run restarts PgBouncer with: stopped and started again on its port,
/// or pointed at another upstream with RELOAD, it forwards again each time.
#[test]
fn a_restarted_or_repointed_pgbouncer_forwards_again() {
    if let Some(reason) = PgBouncer::skip_reason() {
        skip(&reason);
        return;
    }
    let db = fresh_db();
    let proxy = FaultProxy::start(&db.server_addr());
    let mut bouncer = PgBouncer::start(&db.server_addr(), PoolMode::Session, 2);
    let port_seen = |bouncer: &PgBouncer| -> i32 {
        let mut c = postgres::Client::connect(
            &format!("{}?connect_timeout=5", bouncer.url(db.name())),
            postgres::NoTls,
        )
        .unwrap_or_else(|e| panic!("through pgbouncer: {e}\n{}", bouncer.log()));
        c.query_one("SELECT inet_client_port()", &[])
            .unwrap()
            .get(0)
    };
    port_seen(&bouncer);
    for _ in 0..5 {
        bouncer.stop();
        assert!(!bouncer.running());
        bouncer.start_again();
        port_seen(&bouncer);
    }
    // Through the proxy, then directly again: the proxy counts the server links it carried.
    bouncer
        .set_upstream(&format!("127.0.0.1:{}", proxy.port()))
        .unwrap();
    port_seen(&bouncer);
    assert!(proxy.accepted() >= 1, "{}", bouncer.log());
    let before = proxy.accepted();
    bouncer.set_upstream(&db.server_addr()).unwrap();
    // A session pool keeps its server link while a client holds it; a new client after the
    // reload gets one to the new upstream.
    bouncer.stop();
    bouncer.start_again();
    port_seen(&bouncer);
    assert_eq!(proxy.accepted(), before, "{}", bouncer.log());
}
