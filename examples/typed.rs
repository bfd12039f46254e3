//! Typed tasks: a task is a type with a name, an argument type and `run`; jobs are deferred
//! with `app.enqueue(&args)`, without a string name, and a caller can wait for the output.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --example typed
//! ```

use std::time::Duration;

use postpone::{App, Job, Task, TaskArgs, TaskError, Tasks, Worker};
use serde::{Deserialize, Serialize};

/// The arguments name their task: `app.enqueue(&Thumbnail { .. })` needs nothing else.
#[derive(Serialize, Deserialize)]
struct Thumbnail {
    width: u32,
    height: u32,
    max_side: u32,
}

impl TaskArgs for Thumbnail {
    const TASK: &'static str = "thumbnail";
}

/// The task, with state of its own (shared by every job it runs).
struct MakeThumbnail {
    quality: u8,
}

impl Task for MakeThumbnail {
    type Args = Thumbnail;

    fn run(&self, job: &Job, args: Thumbnail) -> Result<(), TaskError> {
        if args.width == 0 || args.height == 0 {
            return Err(TaskError::fail("an empty image has no thumbnail"));
        }
        let scale = f64::from(args.max_side) / f64::from(args.width.max(args.height));
        let size = (
            (f64::from(args.width) * scale).round() as u32,
            (f64::from(args.height) * scale).round() as u32,
        );
        job.set_progress(&serde_json::json!({"step": "resized"}))?;
        // Recorded with the success, in the same statement.
        job.set_output(&serde_json::json!({"size": size, "quality": self.quality}))?;
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let mut tasks = Tasks::new();
    // Its jobs go to the "images" queue unless a defer says otherwise.
    tasks.add(MakeThumbnail { quality: 80 }).queue("images");
    let app = App::builder(&url).task_defaults(&tasks).build()?;
    app.migrate()?;
    let handle = Worker::builder(&app, tasks).queues(["images"]).spawn()?;

    // Defer and wait for the result, from this process (any process could wait).
    let result = app.enqueue_and_wait(
        &Thumbnail {
            width: 4000,
            height: 3000,
            max_side: 400,
        },
        Duration::from_secs(10),
    )?;
    println!("job {} {}: {:?}", result.id, result.status, result.output);

    // Defer now, wait later; with options.
    let id = app.job_of::<Thumbnail>().priority(10).defer(&Thumbnail {
        width: 0,
        height: 0,
        max_side: 400,
    })?;
    let result = app.wait(id, Duration::from_secs(10))?;
    println!(
        "job {id} {}: {}",
        result.status,
        result.failure().unwrap_or("no error")
    );

    println!("{}", handle.shutdown(Duration::from_secs(5)));
    Ok(())
}
