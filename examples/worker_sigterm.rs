//! A worker process as it runs under systemd, Kubernetes or a shell: it works until it gets
//! SIGTERM (or SIGINT, Ctrl-C), then shuts down within a bounded time and prints its report.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --example worker_sigterm &
//! kill -TERM %1
//! ```
//!
//! The shutdown stops claiming jobs, lets running ones finish until the graceful deadline
//! (then `job.should_abort()` turns true), severs every socket at the hard deadline, requeues
//! what did not finish, and returns within the timeout whatever the database does. Set the
//! timeout below the supervisor's own kill delay (systemd's `TimeoutStopSec`, Kubernetes'
//! `terminationGracePeriodSeconds`) so the report is always printed.

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use postpone::{App, Job, TaskError, Tasks, Worker};

/// Well under the usual 30 s of supervisors.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run() {
        Ok(clean) => {
            if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let app = App::connect(&url)?;
    app.migrate()?;

    let mut tasks = Tasks::new();
    tasks.register("slow", |job: &Job| -> Result<(), TaskError> {
        // A long task that returns early when the shutdown passes its graceful deadline.
        for step in 0..100 {
            if job.should_abort() {
                return Err(TaskError::retry(format!("interrupted at step {step}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });

    // SIGTERM and SIGINT both end up here (ctrlc's `termination` feature).
    let (stop_tx, stop_rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })?;

    let handle = Worker::builder(&app, tasks)
        .name("sigterm-example")
        .concurrency(2)
        .spawn()?;
    if std::env::var_os("EXAMPLE_DEFER").is_some() {
        app.defer("slow", &())?;
    }
    println!(
        "worker running (pid {}); send SIGTERM to stop",
        std::process::id()
    );
    // Blocks until a signal comes (or the handler is dropped).
    let _ = stop_rx.recv();
    println!("stopping (at most {SHUTDOWN_TIMEOUT:?})...");
    let report = handle.shutdown(SHUTDOWN_TIMEOUT);
    println!("{report}");
    Ok(report.is_clean())
}
