//! Typed tasks: a `Task` with its argument type registered with `tasks.add`, deferred with
//! `app.enqueue(&args)` (no string name), next to closures registered by name.

use crate::worker_util;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postpone::{ErrorKind, Job, JobStatus, NewJob, Task, TaskArgs, TaskError, Tasks};
use serde::{Deserialize, Serialize};
use worker_util::*;

#[derive(Serialize, Deserialize)]
struct AddArgs {
    a: i64,
    b: i64,
}

impl TaskArgs for AddArgs {
    const TASK: &'static str = "add";
}

/// A task with state of its own (here a counter shared with the test).
struct Add {
    runs: Arc<AtomicU64>,
}

impl Task for Add {
    type Args = AddArgs;
    fn run(&self, job: &Job, args: AddArgs) -> Result<(), TaskError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        job.set_output(&(args.a + args.b))?;
        Ok(())
    }
}

#[test]
fn typed_tasks_are_added_and_enqueued_without_a_string_name() {
    let (db, _setup_app) = setup();
    let runs = Arc::new(AtomicU64::new(0));
    let mut tasks = Tasks::new();
    tasks
        .add(Add { runs: runs.clone() })
        .queue("math")
        .priority(3);
    // The closure registration works alongside.
    tasks.register("echo", |job: &Job| -> Result<(), TaskError> {
        let s: String = job.args()?;
        job.set_output(&s)?;
        Ok(())
    });
    assert_eq!(tasks.names(), vec!["add", "echo"]);
    let app = postpone::App::builder(db.url())
        .pool_size(2)
        .task_defaults(&tasks)
        .build()
        .unwrap();
    let handle = fast_worker(&app, tasks).spawn().unwrap();

    let id = app.enqueue(&AddArgs { a: 2, b: 3 }).unwrap();
    // The task's defaults apply to a typed defer too.
    let row = job_row(&mut db.client(), id).unwrap();
    assert_eq!((row.task.as_str(), row.queue.as_str()), ("add", "math"));
    let r = app.wait(id, Duration::from_secs(20)).unwrap();
    assert_eq!(r.output_as::<i64>().unwrap(), 5);

    // With options, and in a batch.
    let r = app
        .job_of::<AddArgs>()
        .priority(9)
        .defer_and_wait(&AddArgs { a: 10, b: 20 }, Duration::from_secs(20))
        .unwrap();
    assert_eq!(r.output_as::<i64>().unwrap(), 30);
    let ids = app
        .defer_batch(&[
            NewJob::of(&AddArgs { a: 1, b: 1 }).unwrap(),
            NewJob::new("echo", &"hi").unwrap(),
        ])
        .unwrap();
    let r = app
        .enqueue_and_wait(&AddArgs { a: 4, b: 4 }, Duration::from_secs(20))
        .unwrap();
    assert_eq!(r.output_as::<i64>().unwrap(), 8);
    assert_eq!(
        app.wait(ids[0], Duration::from_secs(20))
            .unwrap()
            .output_as::<i64>()
            .unwrap(),
        2
    );
    assert_eq!(
        app.wait(ids[1], Duration::from_secs(20))
            .unwrap()
            .output_as::<String>()
            .unwrap(),
        "hi"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    let report = handle.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
}

#[test]
fn arguments_that_do_not_fit_the_type_fail_the_job_naming_task_and_type() {
    let (_db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.add(Add {
        runs: Arc::new(AtomicU64::new(0)),
    });
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let id = app.defer("add", &serde_json::json!({"a": "two"})).unwrap();
    let r = app.wait(id, Duration::from_secs(20)).unwrap();
    assert_eq!(r.status, JobStatus::Failed);
    let error = r.failure().unwrap().to_owned();
    assert!(error.contains("arguments of task \"add\""), "{error}");
    assert!(error.contains("AddArgs"), "{error}");
    let report = handle.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
}

#[derive(Serialize, Deserialize)]
struct Mismatched;

impl TaskArgs for Mismatched {
    const TASK: &'static str = "one_name";
}

struct Renamed;

impl Task for Renamed {
    type Args = Mismatched;
    const NAME: &'static str = "another_name";
    fn run(&self, _job: &Job, _args: Mismatched) -> Result<(), TaskError> {
        Ok(())
    }
}

#[test]
fn a_task_whose_name_differs_from_its_arguments_task_is_refused_at_spawn() {
    let (_db, app) = setup();
    let mut tasks = Tasks::new();
    tasks.add(Renamed);
    let e = fast_worker(&app, tasks).spawn().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    let text = e.to_string();
    assert!(text.contains("typed task \"another_name\""), "{text}");
    assert!(text.contains("\"one_name\""), "{text}");
}
