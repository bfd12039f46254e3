//! postpone called from async code: an `App`, its pooled `Connection`s and a worker's
//! `WorkerHandle` are created, used and dropped on threads that drive a tokio runtime
//! (current-thread, as `#[tokio::main(flavor = "current_thread")]` builds it, and
//! multi-threaded) without a panic; the defers land; a call made there keeps its deadline on
//! a half-open link; a handle dropped there returns at once and its worker still stops.
//!
//! Each test builds its runtime by hand, as `#[tokio::main]` expands to, so that the test
//! database (created and dropped with the sync `postgres` crate) lives outside it.

mod support;
mod worker_util;

use std::future::Future;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use postpone::{ErrorKind, Job, JobStatus, NewJob, StatsBy, TaskError, Tasks};
use support::*;
use worker_util::*;

/// Runs `body` on a current-thread runtime, as `#[tokio::main(flavor = "current_thread")]`.
fn current_thread<F: Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a current-thread runtime")
        .block_on(body)
}

/// Runs `body` on a multi-threaded runtime of two worker threads, as `#[tokio::main]`.
fn multi_thread<F: Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("building a multi-threaded runtime")
        .block_on(body)
}

fn count(db: &TestDb, sql: &str) -> i64 {
    db.client().query_one(sql, &[]).expect(sql).get(0)
}

#[test]
fn an_app_is_created_used_and_dropped_inside_a_current_thread_runtime() {
    init_logging();
    let db = TestDb::new();
    let url = db.url();
    let id = current_thread(async move {
        let app = app_at(&url, Duration::from_secs(5));
        app.migrate().unwrap();
        let id = app.defer("welcome", &"a@b.c").unwrap();
        app.defer_batch(&[NewJob::new("welcome", &"c@d.e").unwrap()])
            .unwrap();
        {
            let mut conn = app.connection().unwrap();
            let row = conn.query_one("SELECT $1::int + 1", &[&41i32]).unwrap();
            assert_eq!(row.get::<_, i32>(0), 42);
            conn.batch_execute("CREATE TABLE notes (t text)").unwrap();
            let mut tx = conn.transaction().unwrap();
            tx.execute("INSERT INTO notes VALUES ('never committed')", &[])
                .unwrap();
            // Dropped uncommitted, on the runtime's thread: no round-trip, the server
            // rolls back as the session ends.
        }
        let stats = app.admin().stats(StatsBy::Task, None).unwrap();
        assert!(format!("{stats:?}").contains("welcome"), "{stats:?}");
        drop(app);
        id
    });
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM postpone_jobs WHERE task = 'welcome'"
        ),
        2
    );
    let mut client = db.client();
    assert_eq!(job_row(&mut client, id).unwrap().status, "todo");
    assert!(wait_until(Duration::from_secs(10), || count(
        &db,
        "SELECT count(*) FROM notes"
    ) == 0));
}

#[test]
fn an_app_is_created_used_and_dropped_inside_a_multi_threaded_runtime() {
    init_logging();
    let db = TestDb::new();
    let url = db.url();
    multi_thread(async move {
        // One App made on the runtime's thread, one in spawn_blocking (the issue's
        // second crash: dropping it on the runtime's thread panicked).
        let app = app_at(&url, Duration::from_secs(5));
        app.migrate().unwrap();
        let other_url = url.clone();
        let other = tokio::task::spawn_blocking(move || {
            let other = app_at(&other_url, Duration::from_secs(5));
            other.defer("welcome", &"from spawn_blocking").unwrap();
            other
        })
        .await
        .unwrap();
        // Many tasks at once, on both worker threads, each deferring through the pool.
        let mut tasks = Vec::new();
        for i in 0..8 {
            let app = if i % 2 == 0 {
                app.clone()
            } else {
                other.clone()
            };
            tasks.push(tokio::spawn(async move {
                for j in 0..10 {
                    app.defer("welcome", &(i * 100 + j)).unwrap();
                    tokio::task::yield_now().await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // Inside a LocalSet, where tokio's block_in_place would panic.
        let local = app.clone();
        tokio::task::LocalSet::new()
            .run_until(async move {
                tokio::task::spawn_local(async move {
                    local.defer("welcome", &"from spawn_local").unwrap();
                })
                .await
                .unwrap();
            })
            .await;
        // Dropped inside a task of the runtime, and on the thread driving it.
        tokio::spawn(async move { drop(other) }).await.unwrap();
        drop(app);
    });
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM postpone_jobs WHERE task = 'welcome'"
        ),
        82
    );
}

#[test]
fn a_worker_is_spawned_used_and_shut_down_inside_a_runtime() {
    init_logging();
    let db = TestDb::new();
    let url = db.url();
    current_thread(async move {
        let app = app_at(&url, Duration::from_secs(5));
        app.migrate().unwrap();
        let mut tasks = Tasks::new();
        tasks.register("square", |job: &Job| -> Result<(), TaskError> {
            let n: i64 = job.args()?;
            job.set_output(&(n * n))?;
            Ok(())
        });
        let handle = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
        let id = app.defer("square", &12).unwrap();
        // The recommended form for a long wait: off the runtime's thread.
        let waiter = app.clone();
        let result = tokio::task::spawn_blocking(move || waiter.wait(id, Duration::from_secs(20)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(result.status, JobStatus::Succeeded);
        assert_eq!(result.output_as::<i64>().unwrap(), 144);
        // A direct call works too (it blocks this thread for the wait).
        let again = app
            .job("square")
            .defer_and_wait(&3, Duration::from_secs(20))
            .unwrap();
        assert_eq!(again.output_as::<i64>().unwrap(), 9);
        assert!(handle.open_sockets() > 0);
        let report = handle.shutdown(Duration::from_secs(10));
        assert!(report.is_clean(), "unclean shutdown: {report}");
        drop(app);
    });
    assert_eq!(worker_rows(&mut db.client()), 0);
}

#[test]
fn a_worker_handle_dropped_inside_a_runtime_returns_at_once_and_the_worker_still_stops() {
    init_logging();
    let db = TestDb::new();
    let url = db.url();
    let drop_timeout = Duration::from_secs(5);
    let (started_tx, started_rx) = mpsc::channel();
    let (id, dropped_in) = current_thread(async move {
        let app = app_at(&url, Duration::from_secs(5));
        app.migrate().unwrap();
        let mut tasks = Tasks::new();
        let started_tx = std::sync::Mutex::new(started_tx);
        tasks.register("until_told", move |job: &Job| -> Result<(), TaskError> {
            let _ = started_tx.lock().unwrap().send(());
            // Runs until the shutdown asks it to stop (its graceful deadline).
            while !job.should_abort() {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(())
        });
        let handle = fast_worker(&app, tasks)
            .drop_timeout(drop_timeout)
            .spawn()
            .unwrap();
        let id = app.defer("until_told", &()).unwrap();
        started_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the job did not start");
        // A shutdown on this thread would wait for the job until most of drop_timeout.
        let t = Instant::now();
        drop(handle);
        let dropped_in = t.elapsed();
        drop(app);
        (id, dropped_in)
    });
    report_figure(
        "WorkerHandle drop inside a runtime, a job running",
        dropped_in,
    );
    assert!(
        dropped_in < Duration::from_secs(1),
        "the drop held the runtime's thread for {dropped_in:?}"
    );
    // The shutdown goes on on a thread of its own: the job is let go and the worker row
    // deleted, within drop_timeout (and a wide margin on a loaded machine).
    let mut client = db.client();
    assert!(
        wait_until(drop_timeout + Duration::from_secs(10), || {
            worker_rows(&mut client) == 0 && job_row(&mut client, id).unwrap().status != "doing"
        }),
        "the dropped worker did not stop: {} worker row(s), job {:?}",
        worker_rows(&mut client),
        job_row(&mut client, id)
    );
}

#[test]
fn a_call_from_a_runtime_on_a_half_open_link_fails_within_io_timeout() {
    init_logging();
    let db = TestDb::new();
    {
        let app = app_at(&db.url(), Duration::from_secs(5));
        app.migrate().unwrap();
    }
    let proxy = FaultProxy::start(&db.server_addr());
    let io_timeout = Duration::from_secs(2);
    let url = db.url_via(&proxy);
    let (result, took) = current_thread(async {
        let app = app_at(&url, io_timeout);
        let mut conn = app.connection().unwrap();
        conn.query_one("SELECT 1", &[]).unwrap();
        proxy.strand_all();
        let t = Instant::now();
        let result = conn.query_one("SELECT 1", &[]);
        let took = t.elapsed();
        drop(conn);
        drop(app);
        (result, took)
    });
    report_figure(
        "round-trip from a runtime on a half-open link, io_timeout 2 s",
        took,
    );
    let e = result.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        took >= io_timeout && took <= io_timeout + Duration::from_millis(1500),
        "the call on a half-open link returned after {took:?} (io_timeout {io_timeout:?})"
    );
}
