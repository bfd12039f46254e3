//! Recovery from connection loss (DESIGN.md promises 2, 3 and 4) against the real PostgreSQL:
//! a worker whose every link goes half-open consumes the queue again within io_timeout plus
//! backoff, without a restart; `pg_terminate_backend` on its backends, over and over, while
//! it works through 1,000 jobs loses none; a worker whose connections are all reset, again
//! and again, keeps every thread working. Figures are printed (`--nocapture`).

mod support;
mod worker_util;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{Job, NewJob, Tasks, WorkerHandle};
use support::{wait_until, FaultProxy, TestDb};
use worker_util::*;

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(Duration::from_secs(5));
    println!("  shutdown: {report}");
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

/// Counts of job rows by status.
fn status_counts(db: &TestDb) -> HashMap<String, i64> {
    db.client()
        .query(
            "SELECT status, count(*) FROM postpone_jobs GROUP BY status",
            &[],
        )
        .expect("counting jobs")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn a_stranded_worker_consumes_the_queue_again_without_a_restart() {
    let (db, direct) = setup();
    let proxy = FaultProxy::start(&db.server_addr());
    let io_timeout = Duration::from_secs(1);
    let app = app_at(&db.url_via(&proxy), io_timeout);
    let (tx, rx) = unbounded::<Instant>();
    let mut tasks = Tasks::new();
    tasks.register("ping", move |_job: &Job| {
        tx.send(Instant::now()).unwrap();
        Ok(())
    });
    let handle = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    // A first job, so every thread has its connection.
    let warm = direct.defer("ping", &()).unwrap();
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    wait_status(&db, warm, "succeeded", Duration::from_secs(5));
    let before = handle.stats();
    let stranded = proxy.live_connections();
    // The fetcher's, and the one the beat (which listens) and the completer share.
    assert!(stranded >= 2, "the worker's links go through the proxy");

    let t_strand = Instant::now();
    proxy.strand_all();
    let t_defer = Instant::now();
    let id = direct.defer("ping", &()).unwrap();
    let started = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the job runs after the strand");
    let since_defer = started - t_defer;
    report_figure(
        "recovery after strand_all (io_timeout 1 s), strand to job start",
        started - t_strand,
    );
    report_figure(
        "recovery after strand_all (io_timeout 1 s), defer to job start",
        since_defer,
    );
    // io_timeout + the first backoff step (about 100 ms) + a poll, with a wide margin.
    assert!(
        since_defer < io_timeout + Duration::from_millis(1500),
        "the job started {since_defer:?} after it was deferred"
    );
    wait_status(&db, id, "succeeded", Duration::from_secs(5));
    let after = handle.stats();
    assert!(after.db_errors > before.db_errors, "{after:?}");
    assert!(
        after.connections_opened > before.connections_opened,
        "it reconnected: {after:?}"
    );
    // Every stranded link of the worker was given up (closed), none kept. (The App's own
    // pool links through the proxy sit idle: nothing has tried them yet.)
    assert!(
        wait_until(Duration::from_secs(5), || proxy.peer_closed_stranded()
            >= stranded - app.open_sockets()),
        "{} of {stranded} stranded links closed",
        proxy.peer_closed_stranded()
    );
    stop(handle);
}

#[test]
fn terminating_backends_repeatedly_loses_no_job() {
    const JOBS: usize = 1000;
    let (db, app) = setup();
    let runs = Arc::new(Mutex::new(HashMap::<i64, u32>::new()));
    let mut tasks = Tasks::new();
    {
        let runs = runs.clone();
        tasks.register("work", move |job: &Job| {
            *runs.lock().unwrap().entry(job.id().0).or_default() += 1;
            thread::sleep(Duration::from_millis(15));
            Ok(())
        });
    }
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|i| NewJob::new("work", &i).unwrap())
        .collect();
    let ids = app.defer_batch(&jobs).unwrap();
    assert_eq!(ids.len(), JOBS);
    let worker_app = app_at(&db.url(), Duration::from_secs(2));
    let handle = fast_worker(&worker_app, tasks)
        .concurrency(4)
        .spawn()
        .unwrap();

    // Kill every backend of the database every 150 ms until every job has finished.
    let t0 = Instant::now();
    let mut kills = 0;
    let mut rounds = 0;
    let finished = loop {
        thread::sleep(Duration::from_millis(150));
        kills += db.terminate_backends();
        rounds += 1;
        let counts = status_counts(&db);
        let done: i64 = counts
            .iter()
            .filter(|(s, _)| !matches!(s.as_str(), "todo" | "doing"))
            .map(|(_, n)| n)
            .sum();
        if done == JOBS as i64 || t0.elapsed() > Duration::from_secs(45) {
            break counts;
        }
    };
    let took = t0.elapsed();
    let stats = handle.stats();
    stop(handle);
    report_figure("1,000 jobs under pg_terminate_backend every 150 ms", took);
    println!("  {rounds} rounds, {kills} backends terminated, worker stats {stats:?}");
    assert_eq!(
        finished.get("succeeded").copied(),
        Some(JOBS as i64),
        "every job succeeded: {finished:?}"
    );
    assert!(kills >= 10, "only {kills} backends were terminated");
    assert!(stats.db_errors > 0, "the worker saw the kills: {stats:?}");
    let rows = all_jobs(&mut db.client());
    assert_eq!(rows.len(), JOBS, "no job lost");
    let runs = runs.lock().unwrap();
    let never_ran: Vec<i64> = rows
        .iter()
        .filter(|r| !runs.contains_key(&r.id))
        .map(|r| r.id)
        .collect();
    assert!(
        never_ran.is_empty(),
        "succeeded without running: {never_ran:?}"
    );
    let twice = runs.values().filter(|n| **n > 1).count();
    let retried = rows.iter().filter(|r| r.attempts > 1).count();
    println!("  at-least-once: {twice} job(s) ran more than once, {retried} with attempts > 1");
    // One live worker: nobody rescues its jobs, so nothing should run twice.
    assert_eq!(twice, 0, "a job ran twice although its worker never died");
}

#[test]
fn a_worker_whose_connections_are_all_reset_keeps_every_thread_working() {
    let (db, direct) = setup();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), Duration::from_secs(1));
    let (tx, rx) = unbounded::<Instant>();
    let runs = Arc::new(Mutex::new(HashMap::<i64, u32>::new()));
    let mut tasks = Tasks::new();
    {
        let runs = runs.clone();
        tasks.register("work", move |job: &Job| {
            *runs.lock().unwrap().entry(job.id().0).or_default() += 1;
            thread::sleep(Duration::from_millis(3));
            let _ = tx.send(Instant::now());
            Ok(())
        });
    }
    // Polls only every 2 s: a job that starts sooner was announced by the listener.
    let handle = fast_worker(&app, tasks)
        .concurrency(2)
        .poll_interval(Duration::from_secs(2))
        .spawn()
        .unwrap();
    let jobs: Vec<NewJob> = (0..300).map(|i| NewJob::new("work", &i).unwrap()).collect();
    direct.defer_batch(&jobs).unwrap();
    // Reset every link five times while the jobs flow.
    for _ in 0..5 {
        thread::sleep(Duration::from_millis(150));
        proxy.reset_all();
    }
    let stats = handle.stats();
    assert!(stats.db_errors > 0, "{stats:?}");
    println!("  after 5 resets: {stats:?}");

    // Every job ends succeeded: none is left claimed by a lost reply.
    let mut client = db.client();
    let all_done = wait_until(Duration::from_secs(20), || {
        status_counts(&db).get("succeeded").copied() == Some(300)
    });
    assert!(all_done, "jobs by status: {:?}", status_counts(&db));
    // Claims whose reply was lost were given back with their attempt; no job ran twice.
    let rows = all_jobs(&mut client);
    let reclaimed: Vec<&JobRow> = rows.iter().filter(|r| r.attempts != 1).collect();
    assert!(reclaimed.is_empty(), "attempts other than 1: {reclaimed:?}");
    let twice = runs.lock().unwrap().values().filter(|n| **n > 1).count();
    assert_eq!(twice, 0, "jobs that ran twice");

    // The heartbeat goes on.
    let beat = |c: &mut postgres::Client| -> f64 {
        c.query_one(
            "SELECT extract(epoch FROM last_heartbeat)::float8 FROM postpone_workers",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let b0 = beat(&mut client);
    assert!(wait_until(Duration::from_secs(5), || beat(&mut client) > b0));
    // The listener is back, and announces new jobs well before the 2 s poll.
    assert!(wait_until(Duration::from_secs(5), || listening_backends(
        &db
    ) == 1));
    while rx.try_recv().is_ok() {}
    for _ in 0..3 {
        let t0 = Instant::now();
        let id = direct.defer("work", &()).unwrap();
        let started = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        report_figure("after 5 resets, defer to start (poll 2 s)", started - t0);
        assert!(started - t0 < Duration::from_millis(1000));
        wait_status(&db, id, "succeeded", Duration::from_secs(5));
    }
    stop(handle);
}

/// The two flood tests take turns: the server's queue of notifications is one for the whole
/// cluster, and every listening session reads past the entries of other databases too, so
/// a flood in one test's database slows the listeners of the other.
static FLOODS: Mutex<()> = Mutex::new(());

/// Sends notifications on the workers' channel from a session of its own, `per_txn` at a
/// time (each payload the SQL expression `payload` of `g`, 1 to `per_txn`: distinct, since
/// a transaction folds identical notifications into one), for `lasting`; returns how many.
fn flood(url: String, payload: &str, per_txn: i32, lasting: Duration) -> thread::JoinHandle<u64> {
    let sql = format!(
        "SELECT count(pg_notify('postpone', {payload})) FROM generate_series(1, $1::int) g"
    );
    thread::spawn(move || {
        let mut f = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < lasting {
            let n: i64 = f.query_one(&sql, &[&per_txn]).unwrap().get(0);
            sent += n as u64;
        }
        sent
    })
}

/// Any role that can connect can NOTIFY on the workers' channel: a flood of notifications
/// (here bursts of 500,000 per transaction for 4 s, payloads that mean nothing to postpone)
/// must not stop the heartbeat. The beat thread hears notifications on its own connection,
/// and drained whatever had arrived before going back to its duties: while the flood
/// lasted, no heartbeat was sent, the worker's lease ran out (its executors may not start
/// jobs then) and other workers would have presumed it dead.
#[test]
fn a_flood_of_notifications_does_not_stop_the_heartbeat() {
    let _turn = FLOODS.lock().unwrap_or_else(|e| e.into_inner());
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let mut c = db.client();
    assert!(wait_until(Duration::from_secs(5), || worker_rows(&mut c) == 1));
    let flooding = Duration::from_secs(4);
    let flood = flood(db.url(), "'flood:' || g", 500_000, flooding);
    let start = Instant::now();
    let mut worst = 0.0f64;
    let mut deferred = None;
    let mut done_after = None;
    while start.elapsed() < flooding + Duration::from_secs(1) {
        let age: f64 = c
            .query_one(
                "SELECT coalesce(max(extract(epoch FROM now() - last_heartbeat))::float8, 99)
                   FROM postpone_workers",
                &[],
            )
            .unwrap()
            .get(0);
        worst = worst.max(age);
        match deferred {
            None if start.elapsed() > Duration::from_secs(1) => {
                deferred = Some((app.defer("ok", &1).unwrap(), Instant::now()));
            }
            Some((id, at))
                if done_after.is_none() && job_row(&mut c, id).unwrap().status == "succeeded" =>
            {
                done_after = Some(at.elapsed());
            }
            _ => {}
        }
        thread::sleep(Duration::from_millis(50));
    }
    let sent = flood.join().unwrap();
    println!(
        "  {sent} notifications sent; the heartbeat's oldest age seen: {worst:.2} s; \
         a job deferred during the flood succeeded after {done_after:?}"
    );
    assert!(
        worst < 1.0,
        "the heartbeat was {worst:.2} s old at worst, past stalled_after (1 s)"
    );
    assert!(
        done_after.is_some_and(|d| d < Duration::from_secs(2)),
        "a job deferred during the flood succeeded after {done_after:?}"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    stop(w);
}

/// The same flood on a worker whose notifications come through a listener of its own
/// (`listen_via`): the listener read every notification the server had queued for it
/// before it looked whether the worker was stopping, so a shutdown right after 3 million
/// waited 4.1 s and severed its socket. The listener now stops listening for a while after
/// more than 10,000 at once, as the beat does (the server drops what it queued), and the
/// fetcher polls meanwhile. The flood must not make the fetcher claim at every
/// notification either.
#[test]
fn a_flood_of_notifications_on_a_dedicated_listener_does_not_hold_up_a_shutdown() {
    let _turn = FLOODS.lock().unwrap_or_else(|e| e.into_inner());
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let w = fast_worker(&app, tasks).listen_via(&app).spawn().unwrap();
    let mut c = db.client();
    assert!(wait_until(Duration::from_secs(5), || worker_rows(&mut c) == 1));
    let commits = |c: &mut postgres::Client| -> i64 {
        c.query_one(
            "SELECT pg_stat_clear_snapshot()::text || '', xact_commit
               FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .unwrap()
        .get(1)
    };
    let flooding = Duration::from_secs(3);
    let url = db.url();
    let before = commits(&mut c);
    let flood = flood(url, "'job:q' || g", 200_000, flooding);
    let sent = flood.join().unwrap();
    // The server's statistics reach the view within a second or so.
    thread::sleep(Duration::from_millis(1500));
    let during = commits(&mut c) - before;
    let id = app.defer("ok", &1).unwrap();
    wait_status(&db, id, "succeeded", Duration::from_secs(10));
    println!(
        "  {sent} notifications sent; {during} transactions committed in the database meanwhile"
    );
    assert!(
        during < 1500,
        "{during} transactions in {flooding:?} of flood: the fetcher claimed at every notification"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    let report = w.shutdown(Duration::from_secs(5));
    println!("  shutdown: {report}");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.sockets_severed(), 0, "{report}");
    assert!(report.elapsed() < Duration::from_secs(1), "{report}");
}
