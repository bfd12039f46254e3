//! Metrics through the `metrics` facade, exported in Prometheus's text format.
//!
//! ```sh
//! cargo run --example metrics --features metrics   # DATABASE_URL overrides the default
//! ```
//!
//! It installs `metrics-exporter-prometheus` as the recorder (a program would serve
//! `handle.render()` on its `/metrics` endpoint, or let the exporter's own listener do it),
//! defers jobs that succeed, retry and fail, runs a worker until they are done, and prints
//! the `postpone_*` figures the library recorded: job counters, run-time and queue-wait
//! histograms, the queue gauges of the beat thread, and the connection-layer counters.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use postpone::{App, Job, RetryStrategy, TaskError, Tasks, Worker};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&[0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0])?
        .install_recorder()?;
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let app = App::builder(&url)
        .io_timeout(Duration::from_secs(5))
        .build()?;
    app.migrate()?;

    let queue = "metrics-example";
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(app.job("resize").queue(queue).defer(&json!({ "n": n }))?);
    }
    ids.push(app.job("flaky").queue(queue).defer(&json!({}))?);
    ids.push(app.job("broken").queue(queue).defer(&json!({}))?);
    // Not due for a minute: the beat thread's gauges count it as scheduled.
    app.job("resize")
        .queue(queue)
        .schedule_in(Duration::from_secs(60))
        .defer(&json!({ "n": "later" }))?;

    let mut tasks = Tasks::new();
    tasks.register("resize", |_job: &Job| -> Result<(), TaskError> {
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    });
    tasks
        .register("flaky", |job: &Job| -> Result<(), TaskError> {
            match job.attempts() {
                1 => Err(TaskError::retry("first attempt fails on purpose")),
                _ => Ok(()),
            }
        })
        .retry(RetryStrategy::fixed(Duration::from_millis(100), 3));
    tasks.register("broken", |_job: &Job| -> Result<(), TaskError> {
        Err(TaskError::fail("this task always fails"))
    });

    let handle = Worker::builder(&app, tasks)
        .concurrency(4)
        .queues([queue])
        .heartbeat_interval(Duration::from_millis(500))
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
    // One more beat, so that the gauges show the queue after the run.
    std::thread::sleep(Duration::from_millis(700));
    let report = handle.shutdown(Duration::from_secs(5));
    println!("worker {report}\n");

    // Leave the database as we found it (the scheduled job included).
    conn.execute("DELETE FROM postpone_jobs WHERE queue = $1", &[&queue])?;

    for line in prometheus.render().lines() {
        let interesting = line.starts_with("postpone_")
            && !line.contains("_bucket{")
            && !line.contains("quantile=");
        if interesting {
            println!("{line}");
        }
    }
    Ok(())
}
