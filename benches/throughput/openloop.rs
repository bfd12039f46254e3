//! Latency under load (`--only openloop`) and scheduled-start lateness (`--only scheduled`).
//!
//! ```sh
//! cargo bench --bench throughput -- --only openloop --rates 200,500 --seconds 10
//! cargo bench --bench throughput -- --only openloop --load 0.5,0.9 --csv /tmp/ol.csv
//! cargo bench --bench throughput -- --only scheduled --sched-rate 50 --seconds 10
//! ```
//!
//! - `openloop`: for each rate (jobs/s; `--rates R1,R2`, or `--load F1,F2` as fractions of a
//!   capacity measured first: the jobs/s carried while the senders defer flat out, one job per
//!   `defer`, and the worker consumes; `--capacity-seconds`, 3), an open-loop
//!   generator defers no-op jobs one at a time by a clock (job i is due to be sent at
//!   `t0 + i / rate`, whatever happened to the others) from `--senders` threads (4), for
//!   `--seconds` (10), while a worker of `--concurrency` threads (the first value; 4) consumes.
//!   Latency is from the instant a job was due to be sent to its task starting, both read on
//!   this process's clock, so a sender that falls behind adds its lag to the figures; each
//!   rate also reports how many sends started over 5 ms late and the largest lag; a sender
//!   stops at the end of the run even when behind (`sent` < `planned`). Prints a
//!   table of p50, p90, p99, p99.9 and max; `--csv PATH` writes
//!   `system,rate,p50_ms,p90_ms,p99_ms,p999_ms` (`--system`, default `postpone`).
//! - `scheduled`: `--sched-rate` (50) jobs/s deferred for 100 to 1,000 ms later, for
//!   `--seconds`, to a worker with the default poll interval (or `--poll-ms`); lateness is
//!   the claim time minus the scheduled time, both on the database's clock (`started_at -
//!   scheduled_at`). Also prints the claims per job (from `pg_stat_user_functions`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postpone::{App, Job, TaskError, Tasks, Worker, WorkerHandle};

/// A send that starts this late counts as behind.
const BEHIND_US: i64 = 5_000;

struct Opts {
    rates: Vec<f64>,
    load: Vec<f64>,
    seconds: f64,
    concurrency: usize,
    senders: usize,
    csv: Option<String>,
    system: String,
    capacity_seconds: f64,
    sched_rate: f64,
    poll: Option<Duration>,
}

fn opts() -> Opts {
    let mut o = Opts {
        rates: Vec::new(),
        load: Vec::new(),
        seconds: 10.0,
        concurrency: 4,
        senders: 4,
        csv: None,
        system: "postpone".into(),
        capacity_seconds: 3.0,
        sched_rate: 50.0,
        poll: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let list = |v: &str, what: &str| -> Vec<f64> {
        v.split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{what} wants numbers: {v}"))
            })
            .collect()
    };
    for w in argv.windows(2) {
        let v = w[1].as_str();
        match w[0].as_str() {
            "--rates" => o.rates = list(v, "--rates"),
            "--load" => o.load = list(v, "--load"),
            "--seconds" => o.seconds = v.parse().expect("--seconds S"),
            "--concurrency" => o.concurrency = list(v, "--concurrency")[0] as usize,
            "--senders" => o.senders = v.parse().expect("--senders N"),
            "--csv" => o.csv = Some(v.to_owned()),
            "--system" => o.system = v.to_owned(),
            "--capacity-seconds" => o.capacity_seconds = v.parse().expect("--capacity-seconds S"),
            "--sched-rate" => o.sched_rate = v.parse().expect("--sched-rate R"),
            "--poll-ms" => o.poll = Some(Duration::from_millis(v.parse().expect("--poll-ms MS"))),
            _ => {}
        }
    }
    o
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn sleep_until_us(t: i64) {
    let d = t - now_us();
    if d > 0 {
        thread::sleep(Duration::from_micros(d as u64));
    }
}

fn truncate(app: &App) {
    let mut c = app.connection().unwrap();
    c.set_io_timeout(Duration::from_secs(120));
    c.batch_execute("TRUNCATE postpone_jobs, postpone_workers")
        .unwrap();
}

fn stop(h: WorkerHandle) {
    let report = h.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
}

/// p50, p90, p99, p99.9 and max of `v` (sorted here).
fn percentiles(v: &mut [f64]) -> [f64; 5] {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return [f64::NAN; 5];
    }
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    [p(0.5), p(0.9), p(0.99), p(0.999), v[v.len() - 1]]
}

/// Jobs per second the whole system carries when the senders defer as fast as they can (one
/// job per `defer`, as in the open-loop runs) while the worker consumes: the lower of what
/// the senders can insert and what the worker can drain. Measured over `--capacity-seconds`
/// (3) after a second of warm-up.
fn capacity(app: &App, o: &Opts) -> f64 {
    truncate(app);
    let mut t = Tasks::new();
    t.register("ol", |_: &Job| Ok(()));
    let h = Worker::builder(app, t)
        .concurrency(o.concurrency)
        .spawn()
        .unwrap();
    let stop_at = Instant::now() + Duration::from_secs_f64(1.0 + o.capacity_seconds);
    let senders: Vec<_> = (0..o.senders.max(1))
        .map(|_| {
            let app = app.clone();
            thread::spawn(move || {
                while Instant::now() < stop_at {
                    app.defer("ol", &0i64).unwrap();
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(1));
    let (t1, n1) = (Instant::now(), h.stats().recorded);
    for s in senders {
        s.join().unwrap();
    }
    let rate = (h.stats().recorded - n1) as f64 / t1.elapsed().as_secs_f64();
    stop(h);
    rate
}

struct Row {
    /// Percentiles of the `defer` calls' own duration.
    defer_ms: [f64; 5],
    rate: f64,
    planned: u64,
    sent: u64,
    behind: u64,
    max_lag_ms: f64,
    pct: [f64; 5],
}

/// One open-loop run at `rate` jobs/s.
fn openloop_at(app: &App, o: &Opts, rate: f64) -> Row {
    truncate(app);
    let lat = Arc::new(Mutex::new(Vec::<f64>::new()));
    let mut t = Tasks::new();
    let seen = lat.clone();
    t.register("ol", move |job: &Job| -> Result<(), TaskError> {
        let due: i64 = job.args()?;
        seen.lock().unwrap().push((now_us() - due) as f64 / 1000.0);
        Ok(())
    });
    let h = Worker::builder(app, t)
        .concurrency(o.concurrency)
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    let n = (rate * o.seconds).round() as i64;
    let t0 = now_us() + 50_000;
    let end = t0 + (o.seconds * 1e6) as i64;
    let behind = Arc::new(AtomicU64::new(0));
    let max_lag = Arc::new(AtomicU64::new(0));
    let k = o.senders.max(1);
    let calls = Arc::new(Mutex::new(Vec::<f64>::new()));
    let senders: Vec<_> = (0..k)
        .map(|j| {
            let (app, behind, max_lag, calls) =
                (app.clone(), behind.clone(), max_lag.clone(), calls.clone());
            thread::spawn(move || {
                let mut i = j as i64;
                let mut sent = 0u64;
                // Stops at the end of the run even when behind.
                while i < n && now_us() < end {
                    let due = t0 + (i as f64 * 1e6 / rate) as i64;
                    sleep_until_us(due);
                    let lag = now_us() - due;
                    if lag > BEHIND_US {
                        behind.fetch_add(1, Ordering::Relaxed);
                    }
                    max_lag.fetch_max(lag.max(0) as u64, Ordering::Relaxed);
                    let call = Instant::now();
                    app.defer("ol", &due).unwrap();
                    calls
                        .lock()
                        .unwrap()
                        .push(call.elapsed().as_secs_f64() * 1000.0);
                    sent += 1;
                    i += k as i64;
                }
                sent
            })
        })
        .collect();
    let sent: u64 = senders.into_iter().map(|s| s.join().unwrap()).sum();
    let start = Instant::now();
    while (lat.lock().unwrap().len() as u64) < sent && start.elapsed() < Duration::from_secs(20) {
        thread::sleep(Duration::from_millis(5));
    }
    stop(h);
    let mut v = lat.lock().unwrap().clone();
    let mut calls = calls.lock().unwrap().clone();
    Row {
        defer_ms: percentiles(&mut calls),
        rate,
        planned: n as u64,
        sent,
        behind: behind.load(Ordering::Relaxed),
        max_lag_ms: max_lag.load(Ordering::Relaxed) as f64 / 1000.0,
        pct: percentiles(&mut v),
    }
}

fn openloop(app: &App, o: &Opts) {
    let mut rates = o.rates.clone();
    if !o.load.is_empty() {
        let cap = capacity(app, o);
        println!(
            "{{\"what\": \"openloop_capacity\", \"concurrency\": {}, \"jobs_per_s\": {cap:.1}}}",
            o.concurrency
        );
        rates.extend(o.load.iter().map(|f| (f * cap).round()));
    }
    if rates.is_empty() {
        rates = vec![100.0, 500.0];
    }
    let mut rows = Vec::new();
    for &r in &rates {
        let row = openloop_at(app, o, r);
        println!(
            "{{\"what\": \"openloop\", \"rate\": {r:.0}, \"planned\": {}, \"sent\": {}, \"behind\": {}, \"max_lag_ms\": {:.1}, \"p50_ms\": {:.2}, \"p90_ms\": {:.2}, \"p99_ms\": {:.2}, \"p999_ms\": {:.2}, \"max_ms\": {:.2}, \"defer_call_p50_ms\": {:.2}, \"defer_call_p99_ms\": {:.2}}}",
            row.planned, row.sent, row.behind, row.max_lag_ms, row.pct[0], row.pct[1], row.pct[2], row.pct[3], row.pct[4], row.defer_ms[0], row.defer_ms[2]
        );
        rows.push(row);
    }
    println!(
        "\nopen loop, defer-to-start latency (ms), worker concurrency {}, {} senders, {} s per rate",
        o.concurrency, o.senders, o.seconds
    );
    println!(
        "{:>8} {:>7} {:>7} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "rate/s", "planned", "sent", "behind", "max_lag", "p50", "p90", "p99", "p99.9", "max"
    );
    for r in &rows {
        println!(
            "{:>8.0} {:>7} {:>7} {:>7} {:>9.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            r.rate,
            r.planned,
            r.sent,
            r.behind,
            r.max_lag_ms,
            r.pct[0],
            r.pct[1],
            r.pct[2],
            r.pct[3],
            r.pct[4]
        );
    }
    if let Some(path) = &o.csv {
        let mut s = String::from("system,rate,p50_ms,p90_ms,p99_ms,p999_ms\n");
        for r in &rows {
            s.push_str(&format!(
                "{},{:.0},{:.3},{:.3},{:.3},{:.3}\n",
                o.system, r.rate, r.pct[0], r.pct[1], r.pct[2], r.pct[3]
            ));
        }
        std::fs::write(path, s).unwrap_or_else(|e| panic!("writing {path}: {e}"));
        println!("wrote {path}");
    }
}

/// Jobs deferred for 100 to 1,000 ms later; lateness of their start on the database clock.
fn scheduled(app: &App, db_name: &str, o: &Opts) {
    truncate(app);
    let mut c = app.connection().unwrap();
    // Counts the claims (calls of postpone_claim) of the connections opened from now on.
    let tracked = c
        .batch_execute(&format!(
            "ALTER DATABASE {db_name} SET track_functions = 'pl'"
        ))
        .is_ok();
    let mut t = Tasks::new();
    t.register("sched", |_: &Job| Ok(()));
    let mut b = Worker::builder(app, t).concurrency(o.concurrency);
    if let Some(p) = o.poll {
        b = b.poll_interval(p);
    }
    let h = b.spawn().unwrap();
    thread::sleep(Duration::from_millis(300));
    let n = (o.sched_rate * o.seconds).round() as i64;
    let t0 = now_us();
    for i in 0..n {
        sleep_until_us(t0 + (i as f64 * 1e6 / o.sched_rate) as i64);
        let ahead = 100 + (i * 137) % 900;
        app.job("sched")
            .schedule_in(Duration::from_millis(ahead as u64))
            .defer(&())
            .unwrap();
    }
    let start = Instant::now();
    while h.stats().recorded < n as u64 && start.elapsed() < Duration::from_secs(60) {
        thread::sleep(Duration::from_millis(5));
    }
    let recorded = h.stats().recorded;
    stop(h);
    let mut late: Vec<f64> = c
        .query(
            "SELECT extract(epoch FROM started_at - scheduled_at)::float8 * 1000
               FROM postpone_jobs WHERE task = 'sched' AND started_at IS NOT NULL",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let claims: Option<i64> = if tracked {
        // The worker's backends flushed their counts when they exited.
        thread::sleep(Duration::from_millis(200));
        let _ = c.batch_execute("SELECT pg_stat_clear_snapshot()");
        c.query(
            "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'postpone_claim'",
            &[],
        )
        .ok()
        .and_then(|rows| rows.first().map(|r| r.get(0)))
    } else {
        None
    };
    let p = percentiles(&mut late);
    let poll = o
        .poll
        .map_or("default".into(), |p| format!("{} ms", p.as_millis()));
    println!(
        "{{\"what\": \"scheduled_lateness_ms\", \"rate\": {}, \"n\": {n}, \"started\": {recorded}, \"poll\": \"{poll}\", \"claims\": {}, \"p50\": {:.2}, \"p90\": {:.2}, \"p99\": {:.2}, \"p999\": {:.2}, \"max\": {:.2}}}",
        o.sched_rate,
        claims.map_or("null".into(), |c| c.to_string()),
        p[0], p[1], p[2], p[3], p[4]
    );
    println!(
        "\nscheduled jobs (100-1000 ms ahead, {}/s for {} s, poll {poll}): start - scheduled_at (ms, database clock)",
        o.sched_rate, o.seconds
    );
    println!(
        "{:>6} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "jobs", "claims", "p50", "p90", "p99", "p99.9", "max"
    );
    println!(
        "{:>6} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
        n,
        claims.map_or("?".into(), |c| c.to_string()),
        p[0],
        p[1],
        p[2],
        p[3],
        p[4]
    );
}

/// Runs the modes named in `only` on the bench database `db_name` at `url`.
pub fn run(url: &str, db_name: &str, only: &[String]) {
    let o = opts();
    let app = App::builder(url)
        .pool_size(o.senders.max(1) as u32 + 2)
        .build()
        .unwrap();
    if only.iter().any(|w| w == "openloop") {
        openloop(&app, &o);
    }
    if only.iter().any(|w| w == "scheduled") {
        scheduled(&app, db_name, &o);
    }
}
