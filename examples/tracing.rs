//! Per-job context in logs: with the `tracing` feature every task runs inside a span named
//! `postpone_job` carrying its job id, task, queue and attempt.
//!
//! ```sh
//! cargo run --example tracing --features tracing   # DATABASE_URL overrides the default
//! ```
//!
//! The task below logs with `tracing::info!` and says nothing about which job it is running:
//! the subscriber prints the span's fields in front of each event, so every line can be
//! traced to its job. The library itself keeps logging through the `log` facade (route it
//! where you like: env_logger here, or `tracing-log` into the same subscriber).

use std::time::{Duration, Instant};

use postpone::{App, Job, RetryStrategy, TaskError, Tasks, Worker};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    tracing_subscriber::fmt().with_target(false).init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let app = App::builder(&url)
        .io_timeout(Duration::from_secs(5))
        .build()?;
    app.migrate()?;

    let queue = "tracing-example";
    let ids = [
        app.job("charge")
            .queue(queue)
            .defer(&json!({"cents": 1250}))?,
        app.job("charge")
            .queue(queue)
            .defer(&json!({"cents": -5}))?,
    ];

    let mut tasks = Tasks::new();
    tasks
        .register("charge", |job: &Job| -> Result<(), TaskError> {
            let cents: i64 = job.args::<serde_json::Value>()?["cents"]
                .as_i64()
                .unwrap_or(0);
            tracing::info!(cents, "charging the card");
            if cents < 0 && job.attempts() < 2 {
                tracing::warn!("negative amount; trying once more");
                return Err(TaskError::retry("negative amount"));
            }
            tracing::info!("charged");
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::from_millis(100), 2));

    let handle = Worker::builder(&app, tasks)
        .concurrency(1)
        .queues([queue])
        .spawn()?;
    let ids: Vec<i64> = ids.iter().map(|id| id.get()).collect();
    let started = Instant::now();
    let mut conn = app.connection()?;
    while started.elapsed() < Duration::from_secs(30) {
        let left: i64 = conn
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1) AND status IN ('todo', 'doing')",
                &[&ids],
            )?
            .get(0);
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = handle.shutdown(Duration::from_secs(5));
    println!("worker {report}");
    conn.execute("DELETE FROM postpone_jobs WHERE id = ANY($1)", &[&ids])?;
    Ok(())
}
