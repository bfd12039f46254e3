//! Latency under load (`--only openloop`) and scheduled-start lateness (`--only scheduled`).
//!
//! ```sh
//! cargo bench --bench throughput -- --only openloop --rates 200,500 --seconds 10
//! cargo bench --bench throughput -- --only openloop --load 0.5,0.9 --csv /tmp/ol.csv
//! cargo bench --bench throughput -- --only scheduled --sched-rate 50 --seconds 10
//! ```
//!
//! - `openloop`: for each rate (jobs/s; `--rates R1,R2`, or `--load F1,F2` as fractions of a
//!   capacity measured first: the jobs/s carried while `--capacity-senders` threads (4) defer
//!   flat out, one job per `defer`, and the worker consumes; `--capacity-seconds`, 3), an
//!   open-loop generator defers no-op jobs one at a time by a clock (job i is due to be sent
//!   at `t0 + i / rate`, whatever happened to the others) from `--senders` threads (16), for
//!   `--seconds` (10), while a worker of `--concurrency` threads (the first value; 4) consumes.
//!   Each job goes to whichever sender is free first (a shared counter), so one slow `defer`
//!   delays only its own job while another sender is free; the senders are many so that the
//!   generator, not only the system, is open: with 4 senders striding over the jobs (until
//!   2026-12-03), a send waited for its sender's previous one, which at 1,356 jobs/s took
//!   1-2 ms of WAL flush, and the generator's own queue made most of the tail.
//!   Latency is from the instant a job was due to be sent to its task starting, both read on
//!   this process's clock, so a sender that falls behind adds its lag to the figures; each
//!   rate also reports how many sends started over 5 ms late and the largest lag; a sender
//!   stops at the end of the run even when behind (`sent` < `planned`). Prints a
//!   table of p50, p90, p99, p99.9 and max; `--csv PATH` writes
//!   `system,rate,p50_ms,p90_ms,p99_ms,p999_ms` (`--system`, default `postpone`).
//!   `--breakdown` splits each job's time into its parts (send, wait for a claim, hand-over);
//!   `--no-vacuum` turns the worker's own vacuum off, to see what it costs the tail.
//!   `--table-options OPTS` sets storage parameters on `postpone_jobs` first (as in `soak`).
//! - `scheduled`: `--sched-rate` (50) jobs/s deferred for 100 to 1,000 ms later, for
//!   `--seconds`, to a worker with the default poll interval (or `--poll-ms`); lateness is
//!   the claim time minus the scheduled time, both on the database's clock (`started_at -
//!   scheduled_at`). Also prints the claims per job (from `pg_stat_user_functions`).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postpone::{App, Job, TaskError, Tasks, Vacuum, Worker, WorkerHandle};

/// A send that starts this late counts as behind.
const BEHIND_US: i64 = 5_000;

/// The flags of the open-loop modes (`openloop`, `scheduled`, `soak`); each mode picks its
/// own defaults for the optional ones.
pub struct Opts {
    pub rates: Vec<f64>,
    pub load: Vec<f64>,
    pub seconds: Option<f64>,
    pub interval: Option<f64>,
    pub concurrency: usize,
    pub senders: usize,
    /// The threads deferring flat out while the capacity is measured.
    pub capacity_senders: usize,
    pub csv: Option<String>,
    system: String,
    capacity_seconds: f64,
    sched_rate: f64,
    poll: Option<Duration>,
    /// `soak`: finished jobs older than this are deleted by the worker's retention.
    pub retain: Duration,
    /// `soak`: how often the worker prunes.
    pub prune_every: Duration,
    /// `soak` and `openloop`: the worker leaves vacuuming to autovacuum (`Vacuum::off()`).
    pub no_vacuum: bool,
    /// `soak`: storage parameters set on `postpone_jobs` before the run, e.g. `fillfactor=80`.
    pub table_options: Option<String>,
    /// `openloop`: where the time of each job went (due -> insert -> claim -> task).
    pub breakdown: bool,
}

pub fn opts() -> Opts {
    let mut o = Opts {
        rates: Vec::new(),
        load: Vec::new(),
        seconds: None,
        interval: None,
        concurrency: 4,
        senders: 16,
        capacity_senders: 4,
        csv: None,
        system: "postpone".into(),
        capacity_seconds: 3.0,
        sched_rate: 50.0,
        poll: None,
        retain: Duration::from_secs(60),
        prune_every: Duration::from_secs(10),
        no_vacuum: false,
        table_options: None,
        breakdown: false,
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
            "--seconds" => o.seconds = Some(v.parse().expect("--seconds S")),
            "--interval" => o.interval = Some(v.parse().expect("--interval S")),
            "--concurrency" => o.concurrency = list(v, "--concurrency")[0] as usize,
            "--senders" => o.senders = v.parse().expect("--senders N"),
            "--capacity-senders" => o.capacity_senders = v.parse().expect("--capacity-senders N"),
            "--csv" => o.csv = Some(v.to_owned()),
            "--system" => o.system = v.to_owned(),
            "--capacity-seconds" => o.capacity_seconds = v.parse().expect("--capacity-seconds S"),
            "--sched-rate" => o.sched_rate = v.parse().expect("--sched-rate R"),
            "--poll-ms" => o.poll = Some(Duration::from_millis(v.parse().expect("--poll-ms MS"))),
            "--retain" => o.retain = Duration::from_secs_f64(v.parse().expect("--retain S")),
            "--prune-every" => {
                o.prune_every = Duration::from_secs_f64(v.parse().expect("--prune-every S"))
            }
            "--table-options" => o.table_options = Some(v.to_owned()),
            _ => {}
        }
    }
    o.no_vacuum = argv.iter().any(|a| a == "--no-vacuum");
    o.breakdown = argv.iter().any(|a| a == "--breakdown");
    o
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

pub fn sleep_until_us(t: i64) {
    let d = t - now_us();
    if d > 0 {
        thread::sleep(Duration::from_micros(d as u64));
    }
}

/// `--table-options`: storage parameters set on `postpone_jobs` before the run, e.g.
/// `autovacuum_vacuum_cost_delay=2` (the `soak` and `openloop` modes).
pub fn apply_table_options(app: &App, o: &Opts) {
    if let Some(t) = &o.table_options {
        let mut c = app.connection().unwrap();
        c.set_io_timeout(Duration::from_secs(600));
        c.batch_execute(&format!("ALTER TABLE postpone_jobs SET ({t})"))
            .unwrap_or_else(|e| panic!("--table-options {t}: {e}"));
    }
}

pub fn truncate(app: &App) {
    let mut c = app.connection().unwrap();
    c.set_io_timeout(Duration::from_secs(120));
    c.batch_execute("TRUNCATE postpone_jobs, postpone_workers")
        .unwrap();
}

pub fn stop(h: WorkerHandle) {
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

/// Jobs per second the whole system carries when `--capacity-senders` threads defer as fast
/// as they can (one job per `defer`, as in the open-loop runs) while the worker consumes:
/// the lower of what the senders can insert and what the worker can drain. Measured over
/// `--capacity-seconds` (3) after a second of warm-up.
pub fn capacity(app: &App, o: &Opts) -> f64 {
    truncate(app);
    let mut t = Tasks::new();
    t.register(OL_TASK, |_: &Job| Ok(()));
    let h = Worker::builder(app, t)
        .outcomes_ride_claims(crate::common::ride())
        .vacuum(if o.no_vacuum {
            Vacuum::off()
        } else {
            Vacuum::default()
        })
        .concurrency(o.concurrency)
        .spawn()
        .unwrap();
    let stop_at = Instant::now() + Duration::from_secs_f64(1.0 + o.capacity_seconds);
    let senders: Vec<_> = (0..o.capacity_senders.max(1))
        .map(|_| {
            let app = app.clone();
            thread::spawn(move || {
                while Instant::now() < stop_at {
                    app.defer(OL_TASK, &0i64).unwrap();
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

/// The task the open-loop generator defers: a no-op whose args are the instant (µs, this
/// process's clock) it was due to be sent.
pub const OL_TASK: &str = "ol";

/// Start latencies recorded by the [`OL_TASK`] task: µs from the instant a job was due to be
/// sent to its task starting (saturating at `u32::MAX`, over an hour). Shared by the
/// worker's threads and whoever reads them: [`take`](Self::take) empties it, so that a
/// reader taking it once per interval gets the jobs started in that interval.
#[derive(Clone, Default)]
pub struct Latencies(Arc<Mutex<Vec<u32>>>, Arc<Mutex<Vec<(i64, i64)>>>);

impl Latencies {
    /// A registry with the [`OL_TASK`] task recording here.
    pub fn tasks(&self) -> Tasks {
        let (seen, starts) = (self.0.clone(), self.1.clone());
        let mut t = Tasks::new();
        t.register(OL_TASK, move |job: &Job| -> Result<(), TaskError> {
            let due: i64 = job.args()?;
            let now = now_us();
            let us = (now - due).clamp(0, u32::MAX as i64) as u32;
            seen.lock().unwrap().push(us);
            starts.lock().unwrap().push((job.id().0, now));
            Ok(())
        });
        t
    }

    /// Latencies recorded and not taken yet.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The latencies recorded since the last take.
    pub fn take(&self) -> Vec<u32> {
        self.1.lock().unwrap().clear();
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    /// (job id, µs on this process's clock its task started), since the last take.
    fn starts(&self) -> Vec<(i64, i64)> {
        self.1.lock().unwrap().clone()
    }
}

/// p50, p90, p99, p99.9 and max, in ms, of latencies in µs.
pub fn percentiles_ms(mut v: Vec<u32>) -> [f64; 5] {
    v.sort_unstable();
    if v.is_empty() {
        return [f64::NAN; 5];
    }
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0;
    [p(0.5), p(0.9), p(0.99), p(0.999), p(1.0)]
}

/// The clock of an open-loop run: job `i` is due to be sent at `t0 + i / rate` (µs on this
/// process's clock) whatever happened to the others; sending stops after `n` jobs or at
/// `end`, whichever comes first (even when behind).
#[derive(Clone, Copy)]
pub struct Schedule {
    pub rate: f64,
    pub t0: i64,
    pub end: i64,
    pub n: i64,
}

impl Schedule {
    /// `rate` jobs/s for `seconds`, from 50 ms from now.
    pub fn starting_soon(rate: f64, seconds: f64) -> Schedule {
        let t0 = now_us() + 50_000;
        Schedule {
            rate,
            t0,
            end: t0 + (seconds * 1e6) as i64,
            n: (rate * seconds).round() as i64,
        }
    }
}

/// What the senders count as they go; readers may sample it while they run.
#[derive(Default)]
pub struct SendCounters {
    /// Jobs deferred.
    pub sent: AtomicU64,
    /// Sends that started over `BEHIND_US` (5 ms) after their due instant.
    pub behind: AtomicU64,
    /// The largest lag (µs) of a send's start behind its due instant; a reader may swap it
    /// to 0 to get the largest of each interval.
    pub max_lag_us: AtomicU64,
}

/// Starts `senders` threads that defer [`OL_TASK`] jobs one at a time (`app.defer`) by the
/// clock of `s`, each taking the next job not yet taken (a shared counter) and waiting for
/// its due instant. When `calls` is given, each `defer` call's own duration (ms) is pushed
/// there. Join the threads to wait for the end.
pub fn spawn_senders(
    app: &App,
    s: Schedule,
    senders: usize,
    counters: &Arc<SendCounters>,
    calls: Option<Arc<Mutex<Vec<f64>>>>,
) -> Vec<thread::JoinHandle<()>> {
    let next = Arc::new(AtomicI64::new(0));
    (0..senders.max(1))
        .map(|_| {
            let (app, counters, calls) = (app.clone(), counters.clone(), calls.clone());
            let next = next.clone();
            thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= s.n || now_us() >= s.end {
                    break;
                }
                let due = s.t0 + (i as f64 * 1e6 / s.rate) as i64;
                sleep_until_us(due);
                let lag = now_us() - due;
                if lag > BEHIND_US {
                    counters.behind.fetch_add(1, Ordering::Relaxed);
                }
                counters
                    .max_lag_us
                    .fetch_max(lag.max(0) as u64, Ordering::Relaxed);
                let call = Instant::now();
                app.defer(OL_TASK, &due).unwrap();
                if let Some(calls) = &calls {
                    calls
                        .lock()
                        .unwrap()
                        .push(call.elapsed().as_secs_f64() * 1000.0);
                }
                counters.sent.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect()
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
    let lat = Latencies::default();
    let h = Worker::builder(app, lat.tasks())
        .outcomes_ride_claims(crate::common::ride())
        .vacuum(if o.no_vacuum {
            Vacuum::off()
        } else {
            Vacuum::default()
        })
        .concurrency(o.concurrency)
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    let s = Schedule::starting_soon(rate, o.seconds.unwrap_or(10.0));
    let counters = Arc::new(SendCounters::default());
    let calls = Arc::new(Mutex::new(Vec::<f64>::new()));
    for t in spawn_senders(app, s, o.senders, &counters, Some(calls.clone())) {
        t.join().unwrap();
    }
    let sent = counters.sent.load(Ordering::Relaxed);
    let start = Instant::now();
    while (lat.len() as u64) < sent && start.elapsed() < Duration::from_secs(20) {
        thread::sleep(Duration::from_millis(5));
    }
    let st = h.stats();
    stop(h);
    println!(
        "  worker: {} claims for {} jobs; {} of {} outcomes recorded with a claim",
        st.claims, st.claimed, st.outcomes_on_claims, st.recorded
    );
    if o.breakdown {
        breakdown(app, &lat.starts());
    }
    let mut calls = calls.lock().unwrap().clone();
    Row {
        defer_ms: percentiles(&mut calls),
        rate,
        planned: s.n as u64,
        sent,
        behind: counters.behind.load(Ordering::Relaxed),
        max_lag_ms: counters.max_lag_us.load(Ordering::Relaxed) as f64 / 1000.0,
        pct: percentiles_ms(lat.take()),
    }
}

/// Where each job's defer-to-start time went, from timestamps on one clock (this process and
/// the database server share the machine's): the send's lag and trip to the server (due ->
/// `created_at`, the insert's transaction start), the wait for a claim (-> `started_at`, the
/// claim's transaction start), and the claim's own time with the hand-over to an executor
/// (-> the task's start). Percentiles of each part, in ms; the jobs must be kept.
fn breakdown(app: &App, starts: &[(i64, i64)]) {
    let mut c = app.connection().unwrap();
    let rows = c
        .query(
            "SELECT id, (args #>> '{}')::bigint, \
                    (extract(epoch FROM created_at) * 1e6)::bigint, \
                    (extract(epoch FROM started_at) * 1e6)::bigint \
               FROM postpone_jobs WHERE started_at IS NOT NULL",
            &[],
        )
        .unwrap();
    let db: std::collections::HashMap<i64, (i64, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    let (mut send, mut wait, mut claim) = (Vec::new(), Vec::new(), Vec::new());
    for (id, start) in starts {
        if let Some(&(due, created, started)) = db.get(id) {
            let us = |d: i64| d.clamp(0, u32::MAX as i64) as u32;
            send.push(us(created - due));
            wait.push(us(started - created));
            claim.push(us(start - started));
        }
    }
    println!(
        "  breakdown of {} jobs (ms):   p50      p90      p99    p99.9      max",
        send.len()
    );
    for (name, v) in [
        ("due -> insert", send),
        ("insert -> claim", wait),
        ("claim -> task", claim),
    ] {
        let p = percentiles_ms(v);
        println!(
            "  {name:<24} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            p[0], p[1], p[2], p[3], p[4]
        );
    }
}

fn openloop(app: &App, o: &Opts) {
    apply_table_options(app, o);
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
        o.concurrency,
        o.senders,
        o.seconds.unwrap_or(10.0)
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
    let mut b = Worker::builder(app, t)
        .outcomes_ride_claims(crate::common::ride())
        .vacuum(if o.no_vacuum {
            Vacuum::off()
        } else {
            Vacuum::default()
        })
        .concurrency(o.concurrency);
    if let Some(p) = o.poll {
        b = b.poll_interval(p);
    }
    let h = b.spawn().unwrap();
    thread::sleep(Duration::from_millis(300));
    let seconds = o.seconds.unwrap_or(10.0);
    let n = (o.sched_rate * seconds).round() as i64;
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
        o.sched_rate, seconds
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
        .pool_size(o.senders.max(o.capacity_senders).max(1) as u32 + 2)
        .build()
        .unwrap();
    if only.iter().any(|w| w == "openloop") {
        openloop(&app, &o);
    }
    if only.iter().any(|w| w == "scheduled") {
        scheduled(&app, db_name, &o);
    }
}
