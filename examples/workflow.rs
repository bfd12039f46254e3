//! A workflow: a nightly import as one graph of jobs. `fetch` runs first; two `parse` steps
//! run once it has succeeded; `report` runs once both have; `cleanup` runs once everything
//! has finished, whatever the outcome. The first run's `parse right` fails, so `report` is
//! cancelled without running; the operator's retry of the workflow runs the failed part
//! again, in order, and everything succeeds.
//!
//! ```sh
//! cargo run --example workflow -- postgres://postgres@127.0.0.1/postgres
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postpone::{App, Job, NewJob, Step, TaskError, Tasks, Worker};

fn tasks(broken: Arc<AtomicBool>) -> Tasks {
    let mut tasks = Tasks::new();
    tasks.register("fetch", |job: &Job| -> Result<(), TaskError> {
        let url: String = job.args()?;
        println!("fetch {url} (workflow {:?})", job.workflow_id()?);
        job.set_output(&"nightly.csv")?;
        Ok(())
    });
    tasks.register("parse", move |job: &Job| -> Result<(), TaskError> {
        let half: String = job.args()?;
        if half == "right" && broken.swap(false, Ordering::SeqCst) {
            return Err(TaskError::fail("the right half is malformed"));
        }
        println!("parse {half}");
        Ok(())
    });
    tasks.register("report", |job: &Job| -> Result<(), TaskError> {
        println!(
            "report after jobs {:?}",
            job.dependency_outputs()?
                .iter()
                .map(|d| d.id)
                .collect::<Vec<_>>()
        );
        Ok(())
    });
    tasks.register("cleanup", |_job: &Job| -> Result<(), TaskError> {
        println!("cleanup");
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

    let mut wf = app.workflow("nightly import");
    let fetch = wf
        .step(NewJob::new("fetch", &"https://example.com/nightly.csv")?)
        .name("fetch")
        .add();
    let left = wf
        .step(NewJob::new("parse", &"left")?)
        .after([&fetch])
        .add();
    let right = wf
        .step(NewJob::new("parse", &"right")?)
        .after([&fetch])
        .add();
    let report = wf
        .step(NewJob::new("report", &())?)
        .name("report")
        .after([&left, &right])
        .add();
    // Named steps can be referred to by name, also before they are added.
    wf.step(NewJob::new("cleanup", &())?)
        .after_finished([&Step::named("fetch"), &left, &right, &report])
        .add();
    let run = wf.insert()?;
    println!("workflow {} inserted: jobs {:?}", run.id, run.jobs);

    let broken = Arc::new(AtomicBool::new(true));
    let worker = Worker::builder(&app, tasks(broken))
        .concurrency(2)
        .spawn()?;
    let report = run.job(&report).expect("a step of the workflow");
    let first = app.wait(report, Duration::from_secs(30))?;
    println!("first run: report {:?}", first.status);

    let admin = app.admin();
    let wait_finished = || -> postpone::Result<postpone::WorkflowInfo> {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let info = admin.workflow(run.id)?;
            if info.is_finished() || std::time::Instant::now() > until {
                return Ok(info);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let info = wait_finished()?;
    println!(
        "{}: {} ({} failed, {} cancelled)",
        info.name,
        info.describe(),
        info.failed,
        info.cancelled
    );
    for job in &info.jobs {
        println!(
            "  job {} {:<7} {:<26} after {:?}",
            job.id,
            job.task.as_deref().unwrap_or("?"),
            job.describe(),
            job.after
        );
    }

    // Retry the failed part: the parse that failed and the report it cancelled (also
    // `postpone workflow retry ID`, or the dashboard's button).
    let retry = admin.retry_workflow(run.id)?;
    println!("retried jobs {:?}", retry.retried);
    let second = app.wait(report, Duration::from_secs(30))?;
    println!("second run: report {:?}", second.status);
    let info = wait_finished()?;
    println!("{}: {}", info.name, info.describe());

    let shutdown = worker.shutdown(Duration::from_secs(10));
    println!("{shutdown}");
    Ok(())
}
