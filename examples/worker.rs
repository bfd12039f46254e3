//! A small worker program: three tasks, a periodic schedule and retention.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --example worker
//! ```
//!
//! It runs until its standard input closes (Ctrl-D), then shuts down within 10 s.

use std::io::Read;
use std::time::Duration;

use postpone::{
    App, Job, JobEvent, JobEventKind, Retention, RetryStrategy, TaskError, Tasks, Worker,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Email {
    to: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let app = App::connect(&url)?;
    app.migrate()?;

    let mut tasks = Tasks::new();
    tasks
        .register("send_email", |job: &Job| -> Result<(), TaskError> {
            let email: Email = job.args()?;
            if email.to.ends_with("@invalid") {
                return Err(TaskError::fail(format!("no such domain: {}", email.to)));
            }
            println!("job {}: mail sent to {}", job.id(), email.to);
            Ok(())
        })
        .retry(RetryStrategy::exponential(Duration::from_secs(1), 3));
    tasks.register("resize", |job: &Job| -> Result<(), TaskError> {
        // A long task that stops when asked to (abort, shutdown, timeout).
        for _ in 0..600 {
            if job.should_abort() {
                return Err(TaskError::fail("stopped early"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });
    tasks.register("cleanup", |job: &Job| -> Result<(), TaskError> {
        println!("job {}: cleanup {}", job.id(), job.args_json());
        Ok(())
    });
    tasks
        .periodic("cleanup", "*/15 * * * *")
        .args(&serde_json::json!({"table": "sessions"}));

    let handle = Worker::builder(&app, tasks)
        .name("example-worker")
        .concurrency(2)
        .retention(Retention::new(Duration::from_secs(7 * 24 * 3600)))
        .hook(|e: &JobEvent<'_>| {
            if e.kind != JobEventKind::Started {
                println!(
                    "hook: job {} ({}) {:?} after {:?}",
                    e.job_id, e.task, e.kind, e.duration
                );
            }
        })
        .spawn()?;
    println!("worker running; close stdin (Ctrl-D) to stop");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    println!("{}", handle.shutdown(Duration::from_secs(10)));
    Ok(())
}
