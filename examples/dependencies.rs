//! Jobs that wait for others: two downloads, a merge that runs once both have succeeded and
//! reads their outputs, and a report that runs once the merge has finished, whatever its
//! outcome. A third download fails, so the merge that needs it is cancelled without running.
//!
//! ```sh
//! cargo run --example dependencies -- postgres://postgres@127.0.0.1/postgres
//! ```

use std::time::Duration;

use postpone::{App, Job, TaskError, Tasks, Worker};

fn tasks() -> Tasks {
    let mut tasks = Tasks::new();
    tasks.register("download", |job: &Job| -> Result<(), TaskError> {
        let region: String = job.args()?;
        if region == "mars" {
            return Err(TaskError::fail("no route to mars"));
        }
        // ... download ...
        job.set_output(&format!("{region}.csv"))?;
        Ok(())
    });
    tasks.register("merge", |job: &Job| -> Result<(), TaskError> {
        // Every dependency of `after` has succeeded: their outputs are the files.
        let mut files = Vec::new();
        for dep in job.dependency_outputs()? {
            files.extend(dep.output_as::<String>()?);
        }
        println!("merging {files:?}");
        job.set_output(&files.join("+"))?;
        Ok(())
    });
    tasks.register("report", |job: &Job| -> Result<(), TaskError> {
        for dep in job.dependency_outputs()? {
            println!("report: job {} ended {:?}", dep.id, dep.status);
        }
        Ok(())
    });
    tasks
}

fn main() -> postpone::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1/postgres".to_owned());
    let app = App::connect(&url)?;
    app.migrate()?;

    let eu = app.defer("download", &"eu")?;
    let us = app.defer("download", &"us")?;
    let merged = app.job("merge").after(&[eu, us]).defer(&())?;
    let report = app.job("report").after_finished(&[merged]).defer(&())?;
    let mars = app.defer("download", &"mars")?;
    let doomed = app.job("merge").after(&[eu, mars]).defer(&())?;

    let worker = Worker::builder(&app, tasks()).concurrency(2).spawn()?;
    let done = app.wait(report, Duration::from_secs(30))?;
    println!("report: {:?}", done.status);
    let cancelled = app.wait(doomed, Duration::from_secs(30))?;
    println!(
        "the merge that needed mars: {:?} ({})",
        cancelled.status,
        cancelled.failure().unwrap_or_default()
    );
    worker.shutdown(Duration::from_secs(10));
    Ok(())
}
