//! The whole story in one program: migrate, defer jobs, work them, shut down, report.
//!
//! ```sh
//! cargo run --example quickstart      # DATABASE_URL overrides the default local server
//! ```
//!
//! It defers a handful of jobs to the `quickstart` queue, starts a worker with two threads,
//! waits until they are done (or until Ctrl-C), shuts the worker down within 5 seconds and
//! prints what happened to every job.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use postpone::{App, Job, NewJob, RetryStrategy, TaskError, Tasks, Worker};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Greeting {
    name: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());

    let app = App::builder(&url)
        .io_timeout(Duration::from_secs(5))
        .build()?;
    let applied = app.migrate()?;
    println!("schema ready (migrations applied now: {applied:?})");

    // Defer: one by one, with options, and a batch in one round-trip.
    let mut ids = vec![
        app.job("greet")
            .queue("quickstart")
            .defer(&json!({"name": "Ada"}))?,
        app.job("greet")
            .queue("quickstart")
            .priority(10)
            .defer(&json!({"name": "Grace (high priority)"}))?,
        app.job("greet")
            .queue("quickstart")
            .schedule_in(Duration::from_secs(2))
            .defer(&json!({"name": "Barbara (in 2 s)"}))?,
        app.job("flaky").queue("quickstart").defer(&json!({}))?,
    ];
    let batch: Vec<NewJob> = ["Edsger", "Donald", "Frances"]
        .iter()
        .map(|n| NewJob::new("greet", &json!({ "name": n })).map(|j| j.queue("quickstart")))
        .collect::<postpone::Result<_>>()?;
    ids.extend(app.defer_batch(&batch)?);
    println!("deferred jobs {ids:?}");

    // Tasks: plain functions of &Job.
    let mut tasks = Tasks::new();
    tasks.register("greet", |job: &Job| -> Result<(), TaskError> {
        let g: Greeting = job.args()?;
        println!("  job {}: hello, {}!", job.id(), g.name);
        Ok(())
    });
    tasks
        .register("flaky", |job: &Job| -> Result<(), TaskError> {
            if job.attempts() < 2 {
                return Err(TaskError::retry(format!(
                    "attempt {} fails on purpose",
                    job.attempts()
                )));
            }
            println!(
                "  job {}: flaky task succeeded on attempt {}",
                job.id(),
                job.attempts()
            );
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::from_millis(500), 3));

    let handle = Worker::builder(&app, tasks)
        .concurrency(2)
        .queues(["quickstart"])
        .spawn()?;
    println!("worker {} started; Ctrl-C stops it early", handle.name());

    let (stop_tx, stop_rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })?;

    // Wait until every job deferred above has finished, or Ctrl-C, or 30 s.
    let started = Instant::now();
    let mut conn = app.connection()?;
    let id_list: Vec<i64> = ids.iter().map(|id| id.get()).collect();
    loop {
        let left: i64 = conn
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1) AND status IN ('todo', 'doing')",
                &[&id_list],
            )?
            .get(0);
        if left == 0 || started.elapsed() > Duration::from_secs(30) {
            break;
        }
        if stop_rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            println!("Ctrl-C: stopping");
            break;
        }
    }

    let report = handle.shutdown(Duration::from_secs(5));
    println!("worker {report}");

    for row in conn.query(
        "SELECT id, task, status, attempts, args::text FROM postpone_jobs WHERE id = ANY($1) ORDER BY id",
        &[&id_list],
    )? {
        println!(
            "job {:>4}  {:<6} {:<10} attempts {}  args {}",
            row.get::<_, i64>(0),
            row.get::<_, String>(1),
            row.get::<_, String>(2),
            row.get::<_, i32>(3),
            row.get::<_, String>(4)
        );
    }
    Ok(())
}
