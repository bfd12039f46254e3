//! Throughput and latency figures for postpone, printed (never asserted).
//!
//! ```sh
//! cargo bench --bench throughput                       # everything, defaults below
//! cargo bench --bench throughput -- --n-work 20000 --concurrency 1,4,16 --repeats 3
//! cargo bench --bench throughput -- --only work,latency
//! ```
//!
//! On a fresh database (`postpone_bench_<pid>`, created and dropped here) on the server named by
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`; only its host, port and
//! user are used):
//! - `defer`: defers one by one (`app.defer`), then in batches of 1,000 (`app.defer_batch`);
//! - `work`: for each concurrency, `--n-work` no-op jobs deferred beforehand, wall time from
//!   `spawn()` to the last outcome recorded in the database; each run also prints a
//!   `drain_profile_cC` line: milliseconds from the start to `spawn()` returning, to the
//!   first outcome recorded, and to a quarter, half, three quarters and all of them (where a
//!   short drain's time goes: start-up, ramp, tail); `--timeline` adds the worker's counters
//!   every 4 ms, on stderr (claims, jobs claimed and run, outcomes recorded, and how);
//! - `latency`: an idle worker with LISTEN/NOTIFY on; time from `defer` returning to the task
//!   starting, p50/p99 over `--n-latency` jobs deferred one at a time;
//! - `shutdown`: `shutdown(10 s)` of a worker with 16 idle threads;
//! - `--finished N` leaves N finished jobs in the table under every figure (the claim must
//!   stay cheap with a million finished rows);
//! - `--future N` leaves N jobs scheduled for tomorrow in the table under every figure (the
//!   claim must stay cheap however many jobs wait for a later time);
//! - `rss`: peak RSS (VmHWM) of a child process running a 16-thread worker through
//!   `--n-work` jobs;
//! - `roundtrip`: one `SELECT 1` round-trip's latency, and `app.defer` one by one without
//!   the commit's fsync; `roundtrip_async` (only when named in `--only`) the round-trip
//!   from inside a tokio runtime. See `throughput/roundtrip.rs`.
//!
//! - `steady` (only when named in `--only`): the steady state a real system lives in. A
//!   producer keeps `--pending N` (20,000) jobs waiting, deferring batches of 1,000, while a
//!   worker of the first `--concurrency` consumes, for `--seconds S` (120); every
//!   `--interval S` (10) it prints the jobs/s of the interval, the time of the claim's index
//!   walk (64 due jobs, no locks taken), the table's dead tuples and the claim index's size.
//!   `--delete` makes the worker delete finished jobs (`DeleteJobs::Always`), in the drain
//!   (`worker_c<C>_delete`) and in the steady state.
//!
//! - `openloop` and `scheduled` (only when named in `--only`): latency under an open-loop
//!   load and the lateness of scheduled jobs; see `throughput/openloop.rs` for their flags.
//!
//! - `soak` (only when named in `--only`): 20 minutes of the open-loop generator at half the
//!   measured capacity, to a worker with retention on; one line per minute (throughput,
//!   latency, rows by status, dead tuples, table and index sizes). See `throughput/soak.rs`:
//!
//!   ```sh
//!   cargo bench --bench throughput -- --only soak --load 0.5 --seconds 1200 --interval 60 --csv /tmp/soak.csv
//!   python3 benches/charts.py soak /tmp/soak.csv docs/perf-soak-retention.svg
//!   ```
//!
//! Each figure prints as a JSON line, then a summary of medians over `--repeats` runs.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "common/mod.rs"]
mod common;
use common::{median, BenchDb};
use postpone::{App, Job, NewJob, TaskError, Tasks, Worker};

#[path = "throughput/openloop.rs"]
mod openloop;
#[path = "throughput/roundtrip.rs"]
mod roundtrip;
#[path = "throughput/soak.rs"]
mod soak;

struct Args {
    n_defer: usize,
    n_work: usize,
    n_latency: usize,
    n_roundtrip: usize,
    concurrency: Vec<usize>,
    repeats: usize,
    only: Vec<String>,
    prefetch: Option<usize>,
    finished: usize,
    future: usize,
    pending: usize,
    seconds: u64,
    interval: u64,
    delete: bool,
}

const USAGE: &str = "\
cargo bench --bench throughput [-- OPTIONS]

Modes (--only a,b; none named: defer, work, latency, shutdown, rss, roundtrip):
  defer            app.defer one by one, then defer_batch in batches of 1,000
  work             drains of --n-work no-op jobs at each --concurrency
  latency          defer to task start, an idle worker listening
  shutdown         shutdown(10 s) of a worker with 16 idle threads
  rss              peak RSS of a 16-thread worker in a child process
  roundtrip        a SELECT 1 round-trip's latency; defer one by one without fsync
  roundtrip_async  the round-trip from inside a tokio runtime and from spawn_blocking
  steady           a producer keeps --pending jobs waiting while a worker consumes
  openloop, scheduled, soak   see benches/throughput/openloop.rs and soak.rs

Options:
  --n-defer N (5000)  --n-work N (20000)  --n-latency N (300)  --n-roundtrip N (5000)
  --concurrency 1,4,16  --repeats N (3)  --prefetch N  --finished N  --future N
  --pending N (20000)  --seconds S (120)  --interval S (10)  --delete  --timeline  --no-ride
";

fn parse_args() -> Args {
    let mut a = Args {
        n_defer: 5000,
        n_work: 20000,
        n_latency: 300,
        n_roundtrip: 5000,
        concurrency: vec![1, 4, 16],
        repeats: 3,
        only: Vec::new(),
        prefetch: None,
        finished: 0,
        future: 0,
        pending: 20_000,
        seconds: 120,
        interval: 10,
        delete: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let val = || argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--n-defer" => a.n_defer = val().parse().expect("--n-defer N"),
            "--n-work" => a.n_work = val().parse().expect("--n-work N"),
            "--n-latency" => a.n_latency = val().parse().expect("--n-latency N"),
            "--n-roundtrip" => a.n_roundtrip = val().parse().expect("--n-roundtrip N"),
            "--repeats" => a.repeats = val().parse().expect("--repeats N"),
            "--prefetch" => a.prefetch = Some(val().parse().expect("--prefetch N")),
            "--finished" => a.finished = val().parse().expect("--finished N"),
            "--future" => a.future = val().parse().expect("--future N"),
            "--pending" => a.pending = val().parse().expect("--pending N"),
            "--seconds" => a.seconds = val().parse().expect("--seconds S"),
            "--interval" => a.interval = val().parse().expect("--interval S"),
            "--delete" => {
                a.delete = true;
                i += 1;
                continue;
            }
            "--concurrency" => {
                a.concurrency = val()
                    .split(',')
                    .map(|c| c.trim().parse().expect("--concurrency 1,4,16"))
                    .collect()
            }
            "--only" => a.only = val().split(',').map(str::to_owned).collect(),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

/// Empties the queue; with `finished > 0`, leaves that many finished jobs in the table (the
/// claim and the completion must stay cheap however many finished rows there are), and with
/// `future > 0` that many jobs scheduled for tomorrow.
fn clear(app: &App, (finished, future): (usize, usize)) {
    let mut c = app.connection().unwrap();
    c.set_io_timeout(Duration::from_secs(600));
    c.batch_execute("TRUNCATE postpone_jobs, postpone_workers")
        .unwrap();
    if finished > 0 {
        c.execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, attempts, finished_at)
             SELECT 'default', 'noop', 'null', 'succeeded', 1, now() FROM generate_series(1, $1::bigint)",
            &[&(finished as i64)],
        )
        .unwrap();
    }
    if future > 0 {
        c.execute(
            "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
             SELECT 'default', 'later', 'null', now() + interval '1 day'
               FROM generate_series(1, $1::bigint)",
            &[&(future as i64)],
        )
        .unwrap();
    }
    c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    if finished > 0 || future > 0 {
        // The rows just written would otherwise be flushed by checkpoints during the
        // measurement (a million rows are several hundred MB of WAL).
        if let Err(e) = c.batch_execute("CHECKPOINT") {
            eprintln!("no CHECKPOINT after the setup ({e}): figures may include its flush");
        }
    }
}

fn defer_n(app: &App, n: usize) {
    let batch: Vec<NewJob> = (0..1000)
        .map(|_| NewJob::new("noop", &()).unwrap())
        .collect();
    let mut left = n;
    while left > 0 {
        let k = left.min(1000);
        app.defer_batch(&batch[..k]).unwrap();
        left -= k;
    }
}

fn noop_tasks() -> Tasks {
    let mut t = Tasks::new();
    t.register("noop", |_: &Job| Ok(()));
    t
}

struct Results(BTreeMap<String, Vec<f64>>);

impl Results {
    fn record(&mut self, what: &str, rep: usize, n: usize, secs: f64, unit: &str) {
        let v = if unit == "jobs_per_s" {
            n as f64 / secs
        } else {
            secs
        };
        println!(
            "{{\"what\": \"{what}\", \"rep\": {rep}, \"n\": {n}, \"s\": {secs:.3}, \"{unit}\": {v:.1}}}"
        );
        self.0.entry(what.to_owned()).or_default().push(v);
    }
}

fn bench_defer(app: &App, a: &Args, r: &mut Results) {
    for rep in 0..a.repeats {
        clear(app, (a.finished, a.future));
        let t = Instant::now();
        for _ in 0..a.n_defer {
            app.defer("noop", &()).unwrap();
        }
        r.record(
            "defer_one_by_one",
            rep,
            a.n_defer,
            t.elapsed().as_secs_f64(),
            "jobs_per_s",
        );
        clear(app, (a.finished, a.future));
        let n = a.n_defer * 10;
        let t = Instant::now();
        defer_n(app, n);
        r.record(
            "defer_batch1000",
            rep,
            n,
            t.elapsed().as_secs_f64(),
            "jobs_per_s",
        );
    }
}

fn bench_work(app: &App, a: &Args, r: &mut Results) {
    for &c in &a.concurrency {
        for rep in 0..a.repeats {
            clear(app, (a.finished, a.future));
            defer_n(app, a.n_work);
            let t = Instant::now();
            let mut b = Worker::builder(app, noop_tasks())
                .outcomes_ride_claims(crate::common::ride())
                .concurrency(c);
            if let Some(p) = a.prefetch {
                b = b.prefetch(p);
            }
            if a.delete {
                b = b.delete_finished(postpone::DeleteJobs::Always);
            }
            let h = b.spawn().unwrap();
            let spawned = t.elapsed();
            // When the first outcome, and a quarter, half, three quarters of them, were
            // recorded: where a short drain's time goes (start-up, ramp, tail).
            let n = a.n_work as u64;
            let marks = [1, n / 4, n / 2, 3 * n / 4];
            let mut at = [Duration::ZERO; 4];
            // `--timeline`: the worker's counters every 4 ms (to stderr), to see which of
            // the claims, the executors and the recording holds a drain back.
            let tl = std::env::args().any(|a| a == "--timeline");
            let mut last_tl = Duration::ZERO;
            loop {
                let st = h.stats();
                if tl && t.elapsed() >= last_tl + Duration::from_millis(4) {
                    last_tl = t.elapsed();
                    eprintln!(
                        "timeline {:.1} ms: claims {} claimed {} succeeded {} recorded {} (with claims {}, by the fetcher {})",
                        last_tl.as_secs_f64() * 1e3,
                        st.claims,
                        st.claimed,
                        st.succeeded,
                        st.recorded,
                        st.outcomes_on_claims,
                        st.outcomes_by_fetcher
                    );
                }
                let done = st.recorded;
                for (m, slot) in marks.iter().zip(at.iter_mut()) {
                    if slot.is_zero() && done >= *m {
                        *slot = t.elapsed();
                    }
                }
                if done >= n {
                    break;
                }
                std::thread::sleep(Duration::from_micros(500));
                assert!(
                    t.elapsed() < Duration::from_secs(600),
                    "stuck: {:?}",
                    h.stats()
                );
            }
            let secs = t.elapsed().as_secs_f64();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "{{\"what\": \"drain_profile_c{c}\", \"rep\": {rep}, \"spawn_ms\": {:.1}, \"first_ms\": {:.1}, \"q1_ms\": {:.1}, \"half_ms\": {:.1}, \"q3_ms\": {:.1}, \"all_ms\": {:.1}}}",
                ms(spawned),
                ms(at[0]),
                ms(at[1]),
                ms(at[2]),
                ms(at[3]),
                secs * 1e3
            );
            let report = h.shutdown(Duration::from_secs(10));
            assert!(report.is_clean(), "{report}");
            let key = format!("worker_c{c}{}", if a.delete { "_delete" } else { "" });
            r.record(&key, rep, a.n_work, secs, "jobs_per_s");
        }
    }
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn bench_latency(app: &App, a: &Args, r: &mut Results) {
    clear(app, (a.finished, a.future));
    let (tx, rx) = mpsc::channel::<i64>();
    let tx = std::sync::Mutex::new(tx);
    let mut t = Tasks::new();
    t.register("ping", move |job: &Job| -> Result<(), TaskError> {
        let sent: i64 = job.args()?;
        let _ = tx.lock().unwrap().send(now_micros() - sent);
        Ok(())
    });
    let h = Worker::builder(app, t)
        .outcomes_ride_claims(crate::common::ride())
        .concurrency(4)
        .poll_interval(Duration::from_secs(10))
        .spawn()
        .unwrap();
    // Let the worker settle into its idle wait.
    std::thread::sleep(Duration::from_millis(500));
    let mut lat = Vec::with_capacity(a.n_latency);
    for _ in 0..a.n_latency {
        let sent = now_micros();
        app.defer("ping", &sent).unwrap();
        let d = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("job did not start");
        lat.push(d as f64 / 1000.0);
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = h.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{{\"what\": \"latency_defer_to_start_ms\", \"n\": {}, \"p50\": {:.2}, \"p90\": {:.2}, \"p99\": {:.2}, \"p999\": {:.2}, \"max\": {:.2}}}",
        lat.len(),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(0.999),
        lat[lat.len() - 1]
    );
    r.0.entry("latency_p50_ms".into())
        .or_default()
        .push(pct(0.5));
    r.0.entry("latency_p99_ms".into())
        .or_default()
        .push(pct(0.99));
}

fn bench_shutdown(app: &App, a: &Args, r: &mut Results) {
    for rep in 0..a.repeats {
        let h = Worker::builder(app, noop_tasks())
            .outcomes_ride_claims(crate::common::ride())
            .concurrency(16)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let report = h.shutdown(Duration::from_secs(10));
        let secs = t.elapsed().as_secs_f64();
        assert!(report.is_clean(), "{report}");
        r.record("shutdown_idle_c16_ms", rep, 1, secs * 1000.0, "ms");
    }
}

fn bench_rss(db: &BenchDb, app: &App, a: &Args, r: &mut Results) {
    clear(app, (a.finished, a.future));
    defer_n(app, a.n_work);
    let out = Command::new(std::env::current_exe().unwrap())
        .env("POSTPONE_BENCH_CHILD", db.url())
        .env("POSTPONE_BENCH_N", a.n_work.to_string())
        .output()
        .expect("run the child worker");
    let text = String::from_utf8_lossy(&out.stdout);
    let kb: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM_kB="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "child said: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    println!(
        "{{\"what\": \"peak_rss_worker_c16_MiB\", \"n\": {}, \"MiB\": {:.1}}}",
        a.n_work,
        kb / 1024.0
    );
    r.0.entry("peak_rss_worker_c16_MiB".into())
        .or_default()
        .push(kb / 1024.0);
}

/// The child of `bench_rss`: a worker process with 16 threads working the queue empty.
fn child(url: &str) {
    let n: u64 = std::env::var("POSTPONE_BENCH_N").unwrap().parse().unwrap();
    let app = App::builder(url).pool_size(2).build().unwrap();
    let h = Worker::builder(&app, noop_tasks())
        .outcomes_ride_claims(crate::common::ride())
        .concurrency(16)
        .spawn()
        .unwrap();
    while h.stats().recorded < n {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = h.shutdown(Duration::from_secs(10));
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim();
    println!("VmHWM_kB={hwm}");
}

/// The steady state: a producer keeps `--pending` jobs waiting while a worker consumes.
fn bench_steady(app: &App, a: &Args, r: &mut Results) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    clear(app, (a.finished, a.future));
    let c = a.concurrency.first().copied().unwrap_or(8);
    let mut b = Worker::builder(app, noop_tasks())
        .outcomes_ride_claims(crate::common::ride())
        .concurrency(c);
    if a.delete {
        b = b.delete_finished(postpone::DeleteJobs::Always);
    }
    if let Some(p) = a.prefetch {
        b = b.prefetch(p);
    }
    let deferred = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let h = b.spawn().unwrap();
    let recorded = |h: &postpone::WorkerHandle| h.stats().recorded;
    let producer = {
        let (app, deferred, stop) = (app.clone(), deferred.clone(), stop.clone());
        let pending = a.pending as u64;
        let done = Arc::new(AtomicU64::new(0));
        (
            std::thread::spawn({
                let done = done.clone();
                move || {
                    while !stop.load(Ordering::Relaxed) {
                        let waiting = deferred
                            .load(Ordering::Relaxed)
                            .saturating_sub(done.load(Ordering::Relaxed));
                        if waiting + 1000 <= pending {
                            defer_n(&app, 1000);
                            deferred.fetch_add(1000, Ordering::Relaxed);
                        } else {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                }
            }),
            done,
        )
    };
    let mut probe = app.connection().unwrap();
    probe
        .batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off; SET jit = off")
        .unwrap();
    let t0 = Instant::now();
    let mut last = (t0, 0u64);
    let mut rates = Vec::new();
    while t0.elapsed() < Duration::from_secs(a.seconds) {
        let next = last.0 + Duration::from_secs(a.interval);
        while Instant::now() < next {
            producer.1.store(recorded(&h), Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(5));
        }
        let now = Instant::now();
        let n = recorded(&h);
        let rate = (n - last.1) as f64 / (now - last.0).as_secs_f64();
        let walk = Instant::now();
        probe
            .query(
                // The predicate of the claim's index (`postpone_jobs_due_idx`): without
                // `blocked_by IS NULL` (schema 11) no index fits, and this timed a
                // sequential scan and a sort of the whole table instead of the walk.
                "SELECT id FROM postpone_jobs
                  WHERE status = 'todo' AND blocked_by IS NULL AND scheduled_at <= now()
                  ORDER BY priority DESC, scheduled_at, id LIMIT 64",
                &[],
            )
            .unwrap();
        let walk = walk.elapsed();
        let row = probe
            .query_one(
                "SELECT n_dead_tup, n_live_tup, pg_relation_size('postpone_jobs_due_idx'),
                        coalesce(autovacuum_count, 0)
                   FROM pg_stat_user_tables WHERE relname = 'postpone_jobs'",
                &[],
            )
            .unwrap();
        println!(
            "{{\"what\": \"steady_c{c}{}\", \"t_s\": {:.0}, \"jobs_per_s\": {rate:.1}, \"claim_walk_ms\": {:.2}, \"dead_tuples\": {}, \"live_tuples\": {}, \"due_idx_kb\": {}, \"autovacuums\": {}}}",
            if a.delete { "_delete" } else { "" },
            (now - t0).as_secs_f64(),
            walk.as_secs_f64() * 1000.0,
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2) / 1024,
            row.get::<_, i64>(3),
        );
        rates.push(rate);
        last = (now, n);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = producer.0.join();
    let report = h.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
    r.0.entry(format!(
        "steady_c{c}{}",
        if a.delete { "_delete" } else { "" }
    ))
    .or_default()
    .extend(rates);
}

fn main() {
    if let Ok(url) = std::env::var("POSTPONE_BENCH_CHILD") {
        child(&url);
        return;
    }
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return;
    }
    let a = parse_args();
    let want = |what: &str| a.only.is_empty() || a.only.iter().any(|o| o == what);
    let db = BenchDb::create("postpone_bench");
    let app = App::builder(db.url()).pool_size(4).build().unwrap();
    app.migrate().unwrap();
    let mut r = Results(BTreeMap::new());
    if want("defer") {
        bench_defer(&app, &a, &mut r);
    }
    if want("work") {
        bench_work(&app, &a, &mut r);
    }
    if want("latency") {
        bench_latency(&app, &a, &mut r);
    }
    if want("shutdown") {
        bench_shutdown(&app, &a, &mut r);
    }
    if want("rss") {
        bench_rss(&db, &app, &a, &mut r);
    }
    if want("roundtrip") {
        roundtrip::plain(&app, a.n_roundtrip, a.repeats, &mut r);
    }
    if a.only.iter().any(|o| o == "roundtrip_async") {
        roundtrip::in_runtime(&app, a.n_roundtrip, a.repeats, &mut r);
    }
    if a.only.iter().any(|o| o == "steady") {
        bench_steady(&app, &a, &mut r);
    }
    if a.only.iter().any(|o| o == "openloop" || o == "scheduled") {
        openloop::run(&db.url(), &db.name, &a.only);
    }
    if a.only.iter().any(|o| o == "soak") {
        soak::run(&db.url());
    }
    drop(app);
    if r.0.is_empty() {
        return;
    }
    println!("SUMMARY (median of runs):");
    for (k, v) in &r.0 {
        let runs: Vec<String> = v.iter().map(|x| format!("{x:.1}")).collect();
        println!(
            "  {k:<28} median={:>10.1}  runs=[{}]",
            median(v),
            runs.join(", ")
        );
    }
}
