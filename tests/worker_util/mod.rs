//! Helpers shared by the worker integration tests (worker_queue, worker_shutdown,
//! worker_recovery, worker_rescue): an App on a fresh database, a worker builder with the
//! short intervals the tests use, and a reader of job rows.
//!
//! Each test file includes this with `mod worker_util;` next to `mod support;` and uses part
//! of it, hence the blanket `dead_code` allowance.
#![allow(dead_code)]

use std::time::Duration;

use postgres::Client;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use postpone::{App, Job, JobId, Tasks, Worker, WorkerBuilder, WorkerHandle, WorkerStats};

use crate::support::{wait_until, TestDb};

/// An App on `url` with a small pool (max_connections is shared by every test) and the
/// given `io_timeout`.
pub fn app_at(url: &str, io_timeout: Duration) -> App {
    App::builder(url)
        .pool_size(2)
        .io_timeout(io_timeout)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_else(|e| panic!("building an App on {url}: {e}"))
}

/// A fresh database with the schema installed, and a direct App on it.
pub fn setup() -> (TestDb, App) {
    crate::support::init_logging();
    let db = TestDb::new();
    let app = app_at(&db.url(), Duration::from_secs(5));
    app.migrate().expect("migrate");
    (db, app)
}

/// The worker's counters once it has counted `recorded` outcomes (waiting up to 10 s).
///
/// A batch's jobs show their new status as soon as its statement commits, a moment before
/// the worker reads the reply and counts them: a test that saw every job finish in the
/// table reads the counters through this, not straight away. Past 10 s it returns what they
/// say then, for the test's own assertion to report.
pub fn stats_once_recorded(w: &WorkerHandle, recorded: u64) -> WorkerStats {
    wait_until(Duration::from_secs(10), || w.stats().recorded >= recorded);
    w.stats()
}

/// A worker builder with the tests' short intervals: poll 100 ms, heartbeat 200 ms,
/// stalled after 1 s, listen pings every 500 ms, reconnect backoff capped at 500 ms, and a
/// 3 s drop timeout (a failing test drops its handle without shutdown).
pub fn fast_worker(app: &App, tasks: Tasks) -> WorkerBuilder {
    Worker::builder(app, tasks)
        .drop_timeout(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(200))
        .stalled_after(Duration::from_secs(1))
        .listen_ping_interval(Duration::from_millis(500))
        .reconnect_backoff_max(Duration::from_millis(500))
}

/// A job's row, as the tests look at it.
#[derive(Clone, Debug)]
pub struct JobRow {
    pub id: i64,
    pub task: String,
    pub queue: String,
    pub status: String,
    pub attempts: i32,
    pub worker_id: Option<i64>,
    /// The `errors` array (empty when NULL).
    pub errors: Vec<serde_json::Value>,
}

impl JobRow {
    /// The `error` texts of the errors array, in order.
    pub fn error_texts(&self) -> Vec<String> {
        self.errors
            .iter()
            .map(|e| e["error"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

const ROW_SQL: &str = "SELECT id, task, queue, status, attempts, worker_id, errors \
                       FROM postpone_jobs";

fn to_row(r: &postgres::Row) -> JobRow {
    let errors: Option<serde_json::Value> = r.get(6);
    JobRow {
        id: r.get(0),
        task: r.get(1),
        queue: r.get(2),
        status: r.get(3),
        attempts: r.get(4),
        worker_id: r.get(5),
        errors: match errors {
            Some(serde_json::Value::Array(v)) => v,
            Some(other) => panic!("errors is not an array: {other}"),
            None => Vec::new(),
        },
    }
}

/// The row of job `id`, or None if it was deleted.
pub fn job_row(client: &mut Client, id: JobId) -> Option<JobRow> {
    client
        .query_opt(&format!("{ROW_SQL} WHERE id = $1"), &[&id.0])
        .expect("reading a job row")
        .as_ref()
        .map(to_row)
}

/// Every job row, by id.
pub fn all_jobs(client: &mut Client) -> Vec<JobRow> {
    client
        .query(&format!("{ROW_SQL} ORDER BY id"), &[])
        .expect("reading job rows")
        .iter()
        .map(to_row)
        .collect()
}

/// Waits (up to `timeout`) until job `id` has `status`; returns its row, or panics with the
/// row as it is.
pub fn wait_status(db: &TestDb, id: JobId, status: &str, timeout: Duration) -> JobRow {
    let mut client = db.client();
    let mut last = None;
    let ok = wait_until(timeout, || {
        last = job_row(&mut client, id);
        last.as_ref().is_some_and(|r| r.status == status)
    });
    assert!(
        ok,
        "job {id} did not reach status {status} within {timeout:?}; it is {last:?}"
    );
    last.expect("checked above")
}

/// Number of rows of `postpone_workers`.
pub fn worker_rows(client: &mut Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM postpone_workers", &[])
        .expect("counting workers")
        .get(0)
}

/// Unit of measured figures, printed so that `--nocapture` runs show them.
pub fn report_figure(what: &str, d: Duration) {
    println!("MEASURED {what}: {:.1} ms", d.as_secs_f64() * 1000.0);
}

/// Backends of this database that are parked in LISTEN.
pub fn listening_backends(db: &TestDb) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
              WHERE datname = current_database() AND pid <> pg_backend_pid() \
                AND query ILIKE 'LISTEN%' AND state = 'idle'",
            &[],
        )
        .expect("reading pg_stat_activity")
        .get(0)
}

/// Registers a task "ok" that succeeds and counts its runs.
pub fn ok_task(tasks: &mut Tasks) -> Arc<AtomicUsize> {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    tasks.register("ok", move |_job: &Job| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    runs
}

/// Runs `f`, turning a panic into a test failure that names `what` and quotes the panic.
pub fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => panic!(
            "{what} panicked: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        ),
    }
}

/// A task "ok" that counts its runs per job id.
pub fn counting_tasks() -> (
    Tasks,
    Arc<std::sync::Mutex<std::collections::HashMap<i64, usize>>>,
) {
    slow_counting_tasks(Duration::ZERO)
}

/// Like [`counting_tasks`], each run of `ok` taking `each` (so that claims' jobs are
/// still running, or waiting, when something happens to the worker's connections).
pub fn slow_counting_tasks(
    each: Duration,
) -> (
    Tasks,
    Arc<std::sync::Mutex<std::collections::HashMap<i64, usize>>>,
) {
    let runs: Arc<std::sync::Mutex<std::collections::HashMap<i64, usize>>> = Arc::default();
    let r = runs.clone();
    let mut tasks = Tasks::new();
    tasks.register("ok", move |job: &Job| {
        *r.lock().unwrap().entry(job.id().0).or_default() += 1;
        if !each.is_zero() {
            std::thread::sleep(each);
        }
        Ok(())
    });
    (tasks, runs)
}
