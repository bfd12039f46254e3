//! The `tracing` feature against PostgreSQL: what a task emits through `tracing` carries
//! the span of its job (id, task, queue, attempt).

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use postpone::{App, Job, RetryStrategy, TaskError, Tasks, Worker};
use serde_json::json;
use support::*;

/// A writer into a shared buffer, for the subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn task_events_carry_their_job_span() {
    init_logging();
    let out = Captured::default();
    let writer = out.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_target(false)
        .init();
    let db = TestDb::new();
    let app = App::builder(db.url())
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    app.migrate().unwrap();
    let id = app.job("traced").queue("tq").defer(&json!({})).unwrap();
    let mut tasks = Tasks::new();
    tasks
        .register("traced", |job: &Job| -> Result<(), TaskError> {
            tracing::info!("inside the task");
            if job.attempts() == 1 {
                return Err(TaskError::retry("once more"));
            }
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 3));
    let handle = Worker::builder(&app, tasks).queues(["tq"]).spawn().unwrap();
    let text = || String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
    let want = |attempt: u32| {
        format!(
            "postpone_job{{job_id={} task=traced queue=tq attempt={attempt}}}: inside the task",
            id.get()
        )
    };
    let seen = wait_until(Duration::from_secs(20), || {
        let t = text();
        t.contains(&want(1)) && t.contains(&want(2))
    });
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(seen, "no span on the task's events:\n{}", text());
    assert!(report.is_clean(), "{report}");
}
