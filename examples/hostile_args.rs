//! A worker's peak memory under large arguments after small ones (issue 44): 4,000 tiny jobs
//! run first, then 150 jobs of 1 MiB of arguments are committed at once; the worker (4
//! threads, default settings) runs them all. Prints the process's peak RSS (VmHWM of
//! /proc/self/status) after the tiny jobs and at the end.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres hostile_args   # a database of its own: its jobs are deleted
//! DATABASE_URL=postgres://postgres@127.0.0.1/hostile_args cargo run --release --example hostile_args
//! ```

use std::time::{Duration, Instant};

use postpone::{App, Job, TaskError, Tasks, Worker};

/// Peak resident memory of this process in KiB (Linux), or 0.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn wait_drained(app: &App, client: &mut postgres::Client, what: &str) {
    let started = Instant::now();
    loop {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status IN ('todo', 'doing')",
                &[],
            )
            .expect("counting jobs")
            .get(0);
        if n == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{what}: {n} jobs left after 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = app;
    println!(
        "{what}: drained in {:.1} s, peak RSS {:.1} MiB",
        started.elapsed().as_secs_f64(),
        peak_rss_kib() as f64 / 1024.0
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/hostile_args".to_owned());
    let app = App::connect(&url)?;
    app.migrate()?;
    let mut client = postgres::Client::connect(&url, postgres::NoTls)?;
    client.batch_execute("DELETE FROM postpone_jobs")?;

    let mut tasks = Tasks::new();
    tasks.register("tiny", |_: &Job| -> Result<(), TaskError> { Ok(()) });
    tasks.register("big", |job: &Job| -> Result<(), TaskError> {
        // A task that reads its arguments, as a real one would.
        let v: serde_json::Value = job.args()?;
        std::hint::black_box(&v);
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    });
    let handle = Worker::builder(&app, tasks).concurrency(4).spawn()?;
    println!("start: peak RSS {:.1} MiB", peak_rss_kib() as f64 / 1024.0);

    client.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'default', 'tiny', jsonb_build_object('n', g) FROM generate_series(1, 4000) g",
    )?;
    wait_drained(&app, &mut client, "4,000 tiny jobs");
    // 1 MiB of text that pglz cannot compress much: what the worker holds is the text.
    client.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'default', 'big',
                to_jsonb((SELECT string_agg(md5(random()::text || g || i), '')
                            FROM generate_series(1, 32768) i))
           FROM generate_series(1, 150) g",
    )?;
    wait_drained(&app, &mut client, "150 jobs of 1 MiB");
    let report = handle.shutdown(Duration::from_secs(10));
    println!("{report}");
    Ok(())
}
