//! Periodic tasks: cron schedules in a time zone, run on start, and the scheduled instant
//! handed to the task.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --example periodic
//! ```
//!
//! Runs for about 5 seconds: the every-2-seconds schedule fires a few times, the daily
//! report runs once at start, then the worker shuts down and prints its report.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postpone::{App, Job, TaskError, Tasks, Worker};

fn instant_text(t: Option<SystemTime>) -> String {
    match t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) {
        Some(d) => format!("{} s after the epoch", d.as_secs()),
        None => "none".to_owned(),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let app = App::connect(&url)?;
    app.migrate()?;

    let mut tasks = Tasks::new();
    tasks.register("daily_report", |job: &Job| -> Result<(), TaskError> {
        // The instant the job was deferred for, even if it runs late or is retried.
        let period = job.periodic_instant()?;
        println!("daily report for the period at {}", instant_text(period));
        Ok(())
    });
    tasks.register("tick", |job: &Job| -> Result<(), TaskError> {
        println!("tick for {}", instant_text(job.periodic_instant()?));
        Ok(())
    });

    // 08:00 on weekdays, Paris time (daylight saving handled), and once at every start.
    tasks
        .periodic("daily_report", "0 8 * * MON-FRI")
        .time_zone("Europe/Paris")
        .run_on_start(true);
    // Every 2 seconds (6 fields: seconds first), in UTC. The first run starts at the next
    // instant; a later run catches up what it missed since the last one, within a short
    // window (the default 10 minutes would be hundreds of instants for a schedule this fast).
    tasks
        .periodic("tick", "*/2 * * * * *")
        .catch_up(Duration::from_secs(2));

    let handle = Worker::builder(&app, tasks).spawn()?;
    std::thread::sleep(Duration::from_secs(5));
    println!("{}", handle.shutdown(Duration::from_secs(5)));
    Ok(())
}
