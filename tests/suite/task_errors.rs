//! The errors people write in tasks registered with `tasks.register(..)`: `Err("text".into())`,
//! `?` on a `Box<dyn Error + Send + Sync>`, on an `anyhow::Error` and on an ordinary error
//! compile, and a worker retries each per the task's `RetryStrategy`, recording each
//! attempt's message with its causes; when the strategy's attempts run out the job fails.

use crate::worker_util;

use std::error::Error;
use std::time::Duration;

use anyhow::Context;
use postpone::{Job, JobStatus, RetryStrategy, TaskError, Tasks};
use worker_util::*;

/// Fails with `e` on the first two attempts, then succeeds.
fn twice<E>(job: &Job, e: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
    if job.attempts() < 3 {
        e()
    } else {
        Ok(())
    }
}

fn lookup(id: i64) -> Result<(), Box<dyn Error + Send + Sync>> {
    let cause = std::io::Error::other("connection refused");
    Err(format!("looking up user {id}: {cause}").into())
}

fn fetch(url: &str) -> anyhow::Result<()> {
    Err(anyhow::anyhow!("connection refused")).with_context(|| format!("fetching {url}"))
}

fn tasks() -> Tasks {
    let strategy = RetryStrategy::fixed(Duration::from_millis(50), 3);
    let mut tasks = Tasks::new();
    tasks
        .register("text", |job: &Job| -> Result<(), TaskError> {
            if job.attempts() < 3 {
                return Err("the mail server said no".into());
            }
            Ok(())
        })
        .retry(strategy.clone());
    tasks
        .register("string", |job: &Job| -> Result<(), TaskError> {
            if job.attempts() < 3 {
                return Err(format!("attempt {} said no", job.attempts()).into());
            }
            Ok(())
        })
        .retry(strategy.clone());
    tasks
        .register("boxed", |job: &Job| -> Result<(), TaskError> {
            let id: i64 = job.args()?;
            twice(job, || lookup(id))?;
            Ok(())
        })
        .retry(strategy.clone());
    tasks
        .register("anyhow", |job: &Job| -> Result<(), TaskError> {
            twice(job, || fetch("http://127.0.0.1:9/"))?;
            Ok(())
        })
        .retry(strategy.clone());
    tasks
        .register("io", |job: &Job| -> Result<(), TaskError> {
            twice(job, || Err(std::io::Error::other("disk full")))?;
            Ok(())
        })
        .retry(strategy);
    tasks
        .register("always", |_job: &Job| -> Result<(), TaskError> {
            fetch("http://127.0.0.1:9/")?;
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::from_millis(50), 2));
    tasks
}

#[test]
fn the_errors_tasks_write_are_retried_per_the_strategy() {
    let (db, app) = setup();
    let handle = fast_worker(&app, tasks()).concurrency(2).spawn().unwrap();
    let cases = [
        ("text", vec!["the mail server said no"; 2]),
        ("string", vec!["attempt 1 said no", "attempt 2 said no"]),
        ("boxed", vec!["looking up user 7: connection refused"; 2]),
        (
            "anyhow",
            vec!["fetching http://127.0.0.1:9/: connection refused"; 2],
        ),
        ("io", vec!["disk full"; 2]),
    ];
    let ids: Vec<_> = cases
        .iter()
        .map(|(task, _)| app.defer(task, &7).unwrap())
        .collect();
    let always = app.defer("always", &()).unwrap();
    let mut client = db.client();
    for ((task, errors), id) in cases.iter().zip(&ids) {
        let result = app.wait(*id, Duration::from_secs(30)).unwrap();
        assert_eq!(result.status, JobStatus::Succeeded, "{task}: {result:?}");
        let row = job_row(&mut client, *id).unwrap();
        assert_eq!(row.attempts, 3, "{task}: {row:?}");
        assert_eq!(row.error_texts(), *errors, "{task}: {row:?}");
    }
    // The strategy's two attempts spent: failed for good, each attempt's error kept.
    let result = app.wait(always, Duration::from_secs(30)).unwrap();
    assert_eq!(result.status, JobStatus::Failed, "{result:?}");
    let row = job_row(&mut client, always).unwrap();
    assert_eq!(row.attempts, 2, "{row:?}");
    assert_eq!(
        row.error_texts(),
        vec!["fetching http://127.0.0.1:9/: connection refused"; 2]
    );
    let report = handle.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "unclean shutdown: {report}");
}
