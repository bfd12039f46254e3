//! `roundtrip`: what one call costs on the caller's thread, without the commit's fsync.
//!
//! - `roundtrip_us`: `query_one("SELECT 1")` on one checked-out connection, from a plain
//!   thread, `--n-roundtrip` (5,000) times: mean, p50 and p99 in microseconds;
//! - `defer_nosync`: `app.defer` one by one, `--n-roundtrip` times, on a database of its own
//!   with `synchronous_commit = off` (so the figure is the library's and the round-trip's,
//!   not the disk's): jobs per second;
//! - `roundtrip_async` (only when named in `--only`): the first figure again from the thread
//!   driving a current-thread tokio runtime, and from `spawn_blocking` on it (calls made on a
//!   thread with a tokio context are driven on a helper thread: see `src/conn/runtime.rs`).

use std::time::{Duration, Instant};

use postpone::App;

use crate::common::BenchDb;
use crate::Results;

/// Times `n` `SELECT 1` round-trips on one of `app`'s connections, on the calling thread,
/// after 200 unmeasured ones; returns the sorted microseconds.
fn time_selects(app: &App, n: usize) -> Vec<f64> {
    let mut conn = app.connection().unwrap();
    for _ in 0..200 {
        conn.query_one("SELECT 1", &[]).unwrap();
    }
    let mut us = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        conn.query_one("SELECT 1", &[]).unwrap();
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    us
}

fn report(what: &str, rep: usize, us: &[f64], r: &mut Results) {
    let pct = |p: f64| us[((us.len() as f64 - 1.0) * p).round() as usize];
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    println!(
        "{{\"what\": \"{what}\", \"rep\": {rep}, \"n\": {}, \"mean\": {mean:.1}, \"p50\": {:.1}, \"p99\": {:.1}}}",
        us.len(),
        pct(0.5),
        pct(0.99)
    );
    r.0.entry(format!("{what}_mean")).or_default().push(mean);
    r.0.entry(format!("{what}_p50")).or_default().push(pct(0.5));
    r.0.entry(format!("{what}_p99"))
        .or_default()
        .push(pct(0.99));
}

pub fn plain(app: &App, n: usize, repeats: usize, r: &mut Results) {
    let db = BenchDb::create("postpone_bench_nosync");
    {
        let mut admin = postgres::Client::connect(&db.url(), postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {} SET synchronous_commit = off",
                db.name
            ))
            .unwrap();
    }
    let nosync = App::builder(db.url()).pool_size(4).build().unwrap();
    nosync.migrate().unwrap();
    for rep in 0..repeats {
        report("roundtrip_us", rep, &time_selects(app, n), r);
        for _ in 0..200 {
            nosync.defer("noop", &()).unwrap();
        }
        let t = Instant::now();
        for _ in 0..n {
            nosync.defer("noop", &()).unwrap();
        }
        r.record(
            "defer_nosync",
            rep,
            n,
            t.elapsed().as_secs_f64(),
            "jobs_per_s",
        );
        let mut c = nosync.connection().unwrap();
        c.set_io_timeout(Duration::from_secs(600));
        c.batch_execute("TRUNCATE postpone_jobs").unwrap();
    }
}

pub fn in_runtime(app: &App, n: usize, repeats: usize, r: &mut Results) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for rep in 0..repeats {
        let us = rt.block_on(async { time_selects(app, n) });
        report("roundtrip_in_runtime_us", rep, &us, r);
        let app2 = app.clone();
        let us = rt
            .block_on(
                async move { tokio::task::spawn_blocking(move || time_selects(&app2, n)).await },
            )
            .unwrap();
        report("roundtrip_spawn_blocking_us", rep, &us, r);
    }
}
