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
//! - `steady` (only when named in `--only`): the steady state a real system lives in.
//!   `--pending N` (20,000) jobs are deferred before the worker starts (as the Rust peers'
//!   harness does), then a producer keeps that many waiting, deferring batches of 1,000, while a
//!   worker of the first `--concurrency` consumes, for `--seconds S` (120); every
//!   `--interval S` (10) it prints the jobs/s of the interval, the time of the claim's index
//!   walk (64 due jobs, no locks taken), the table's dead tuples and the claim index's size.
//!   `--delete` makes the worker delete finished jobs (`DeleteJobs::Always`), in the drain
//!   (`worker_c<C>_delete`) and in the steady state; `--retain S` keeps them S seconds
//!   (`Retention::new(S)`, pruned every `--prune-every` seconds, 10); `--no-vacuum` leaves
//!   vacuuming to autovacuum (`Vacuum::off()`). Each interval also prints the table's size
//!   (`table_mb`: heap and TOAST, `index_mb`, `total_mb`), the worker's vacuums and the
//!   autovacuums; `--csv PATH` writes the intervals as CSV rows.
//!
//! - `retention` (only when named in `--only`): retention at speed. The steady state for
//!   `--seconds` (600) with `Retention::new(--retain)` (60 s), then the same with
//!   `DeleteJobs::Always`; prints both rates and the table's total size (first, last, min,
//!   max over the intervals after the retention window filled). With `--no-vacuum`, the same
//!   with autovacuum as the only vacuum.
//!
//!   ```sh
//!   cargo bench --bench throughput -- --only retention --cluster --concurrency 4 --csv /tmp/ret.csv
//!   cargo bench --bench throughput -- --only retention --cluster --concurrency 4 --no-vacuum
//!   ```
//!
//! `--tasks N`: the worker registers N task names (the jobs' `noop` and N - 1 others of
//! realistic length) and claims only those (the default, `only_registered_tasks(true)`);
//! `--any-task` makes it claim every task instead (`only_registered_tasks(false)`: no task
//! filter in the claim). The figures' names end in `_tasks_N` or `_any_task`: the claim's
//! cost of the task filter (README, Deploying).
//!
//! Everywhere (`work`, `steady`, `retention`): `--args-kb N` gives every job `{"pad": "..."}`
//! arguments of N KiB (text pglz cannot compress; the task parses and drops them) and
//! `--output-kb M` has the task set an output of M KiB; the figures' names end in
//! `_args_N_KiB_output_M_KiB`.
//!
//! `--cluster`: instead of `DATABASE_URL`, a PostgreSQL cluster of the bench's own, made with
//! initdb on a spare port with the server's default settings (autovacuum on, shared_buffers
//! 128MB; `benches/cluster.sh`), stopped and removed at the end. The first line printed names
//! the server and its settings.
//!
//! - `openloop` and `scheduled` (only when named in `--only`): latency under an open-loop
//!   load and the lateness of scheduled jobs; see `throughput/openloop.rs` for their flags.
//!
//! - `mixed` (only when named in `--only`): short and long jobs in one queue on two workers;
//!   the short jobs' waits (see `throughput/mixed.rs`).
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

#[path = "throughput/mixed.rs"]
mod mixed;
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
    /// `--seconds` as given (the retention mode's default differs from the steady state's).
    seconds_given: bool,
    /// `--retain S`: the steady state's worker keeps finished jobs S seconds
    /// (`Retention::new(S)`), pruning every `--prune-every` seconds (10).
    retain: Option<u64>,
    prune_every: u64,
    /// `--no-vacuum`: the worker leaves vacuuming to autovacuum (`Vacuum::off()`).
    no_vacuum: bool,
    /// `--csv PATH`: the steady state's intervals as CSV rows.
    csv: Option<String>,
    /// `--args-kb N`, `--output-kb M`: realistic jobs (see `common::job_sizes`).
    args_kb: usize,
    output_kb: usize,
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
  steady           --pending jobs deferred first, then kept waiting while a worker consumes
  retention        10 min of steady state with Retention of --retain s, then DeleteJobs::Always
  openloop, scheduled, soak   see benches/throughput/openloop.rs and soak.rs
  mixed            1 ms and 2 s jobs in one queue on two workers: the short jobs' waits

Options:
  --n-defer N (5000)  --n-work N (20000)  --n-latency N (300)  --n-roundtrip N (5000)
  --concurrency 1,4,16  --repeats N (3)  --prefetch N  --finished N  --future N
  --pending N (20000)  --seconds S (120)  --interval S (10)  --delete  --timeline  --no-ride
  --one-write (jobs written once, with their outcome: claim_in_outcome_transaction)
  --retain S  --prune-every S (10)  --no-vacuum  --csv PATH       (steady, retention)
  --args-kb N  --output-kb M   realistic jobs: N KiB of arguments, an output of M KiB
  --tasks N    the worker registers N task names (claims only those); --any-task: claims any
  --cluster    run on a cluster of our own with default settings (benches/cluster.sh)
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
        seconds_given: false,
        retain: None,
        prune_every: 10,
        no_vacuum: false,
        csv: None,
        args_kb: 0,
        output_kb: 0,
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
            "--seconds" => {
                a.seconds = val().parse().expect("--seconds S");
                a.seconds_given = true;
            }
            "--retain" => a.retain = Some(val().parse().expect("--retain S")),
            "--prune-every" => a.prune_every = val().parse().expect("--prune-every S"),
            "--csv" => a.csv = Some(val()),
            "--no-vacuum" => {
                a.no_vacuum = true;
                i += 1;
                continue;
            }
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
    (a.args_kb, a.output_kb) = common::job_sizes();
    a
}

/// `--tasks N` (1 without it) and `--any-task`: how many task names the worker registers,
/// and whether it claims every task rather than only those.
fn task_filter() -> (usize, bool) {
    let argv: Vec<String> = std::env::args().collect();
    let n = argv
        .iter()
        .position(|a| a == "--tasks")
        .and_then(|i| argv.get(i + 1))
        .map_or(1, |v| v.parse().expect("--tasks N"));
    (n.max(1), argv.iter().any(|a| a == "--any-task"))
}

/// The suffix of a figure's name for realistic jobs (`_args_4_KiB_output_1_KiB`) and task
/// filters (`_tasks_200`, `_any_task`), or "".
fn sizes_suffix(a: &Args) -> String {
    let mut s = String::new();
    match task_filter() {
        (_, true) => s += "_any_task",
        (1, false) => {}
        (n, false) => s += &format!("_tasks_{n}"),
    }
    if a.args_kb > 0 {
        s += &format!("_args_{}_KiB", a.args_kb);
    }
    if a.output_kb > 0 {
        s += &format!("_output_{}_KiB", a.output_kb);
    }
    s
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

/// The sizes of the jobs this bench defers and runs: `--args-kb`, `--output-kb` (0: no-op
/// jobs, arguments `null`, no output).
fn sizes() -> (usize, usize) {
    static SIZES: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *SIZES.get_or_init(common::job_sizes)
}

/// Defers `n` jobs in batches of 1,000 (`defer_batch`); realistic jobs in batches of at most
/// 4 MiB of arguments (64 jobs of 64 KiB), so that no statement grows to tens of MiB.
fn defer_n(app: &App, n: usize) {
    let (args_kb, _) = sizes();
    let per = 4096usize
        .checked_div(args_kb)
        .map_or(1000, |p| p.clamp(1, 1000));
    let args = common::job_args(args_kb);
    let batch: Vec<NewJob> = (0..per.min(n.max(1)))
        .map(|_| NewJob::new("noop", &args).unwrap())
        .collect();
    let mut left = n;
    while left > 0 {
        let k = left.min(batch.len());
        app.defer_batch(&batch[..k]).unwrap();
        left -= k;
    }
}

/// The task every drain and steady state runs: nothing, or with `--args-kb` its arguments
/// parsed and dropped (as the peers' handlers do: a struct without fields) and with
/// `--output-kb` an output of that size set (`job.set_output`).
fn noop_tasks() -> Tasks {
    let (args_kb, output_kb) = sizes();
    let output =
        (output_kb > 0).then(|| serde_json::json!({ "out": common::pad(output_kb * 1024) }));
    let mut t = Tasks::new();
    let (names, _) = task_filter();
    let mut register = |name: String| {
        let output = output.clone();
        t.register(name, move |job: &Job| -> Result<(), TaskError> {
            if args_kb > 0 {
                let _: serde::de::IgnoredAny = job.args()?;
            }
            if let Some(o) = &output {
                job.set_output(o)?;
            }
            Ok(())
        });
    };
    register("noop".to_owned());
    for i in 1..names {
        register(format!("billing.invoices.send_reminder_{i:04}"));
    }
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
                .claim_in_outcome_transaction(crate::common::one_write())
                .only_registered_tasks(!task_filter().1)
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
                        "timeline {:.1} ms: claims {} claimed {} succeeded {} recorded {} (with claims {}, by the fetcher {}, written once {})",
                        last_tl.as_secs_f64() * 1e3,
                        st.claims,
                        st.claimed,
                        st.succeeded,
                        st.recorded,
                        st.outcomes_on_claims,
                        st.outcomes_by_fetcher,
                        st.written_once
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
            let key = format!(
                "worker_c{c}{}{}",
                if a.delete { "_delete" } else { "" },
                sizes_suffix(a)
            );
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
        .claim_in_outcome_transaction(crate::common::one_write())
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
            .claim_in_outcome_transaction(crate::common::one_write())
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
        .claim_in_outcome_transaction(crate::common::one_write())
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

/// What the steady state's worker does with finished jobs.
#[derive(Clone, Copy)]
enum Finished {
    /// Keeps them (the default).
    Keep,
    /// `DeleteJobs::Always`.
    Delete,
    /// `Retention::new(secs)`, pruning every `--prune-every` seconds.
    Retain(u64),
}

/// One interval of a steady state.
struct Tick {
    t_s: f64,
    rate: f64,
    total_mb: f64,
}

/// A steady state's figures: its name (`steady_c4_retain_60_s`...), every interval.
struct SteadyRun {
    name: String,
    ticks: Vec<Tick>,
}

/// The steady state: `--pending` jobs deferred before the worker starts, then a producer
/// keeps that many waiting while the worker consumes (`--retain`, `--delete`: what it does with finished jobs; `--no-vacuum`: autovacuum alone).
fn bench_steady(app: &App, a: &Args, r: &mut Results) {
    let finished = match (a.retain, a.delete) {
        (Some(s), _) => Finished::Retain(s),
        (None, true) => Finished::Delete,
        (None, false) => Finished::Keep,
    };
    let run = steady_run(app, a, finished, a.seconds, &mut csv_file(a));
    r.0.entry(run.name)
        .or_default()
        .extend(run.ticks.iter().map(|t| t.rate));
}

/// `--csv PATH`, created with its header.
fn csv_file(a: &Args) -> Option<std::fs::File> {
    use std::io::Write;
    a.csv.as_ref().map(|path| {
        let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("creating {path}: {e}"));
        writeln!(f, "run,t_s,jobs_per_s,table_mb,index_mb,total_mb,dead_tuples,live_tuples,vacuums,autovacuums").unwrap();
        f
    })
}

/// Retention at speed (`--only retention`): the steady state at full speed for `--seconds`
/// (600) with `Retention::new(--retain)` (60 s, pruned every `--prune-every` s, 10), then the
/// same with `DeleteJobs::Always`; the table's size (heap, TOAST and indexes) every
/// `--interval`. `--no-vacuum`: both with autovacuum as the only vacuum (`Vacuum::off()`).
/// Prints the rates side by side and whether the table stays flat once the retention window
/// has filled.
fn bench_retention(app: &App, a: &Args, r: &mut Results) {
    let secs = if a.seconds_given { a.seconds } else { 600 };
    let retain = a.retain.unwrap_or(60);
    let mut csv = csv_file(a);
    let runs = [
        steady_run(app, a, Finished::Retain(retain), secs, &mut csv),
        steady_run(app, a, Finished::Delete, secs, &mut csv),
    ];
    // Intervals that ended once the oldest finished jobs were being pruned.
    let warm = (retain + a.prune_every + a.interval) as f64;
    println!("\nretention at speed: {secs} s each, intervals from {warm:.0} s on (the retention window filled)");
    println!(
        "{:<44} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "", "jobs/s", "MiB first", "MiB last", "MiB min", "MiB max"
    );
    let mut means = Vec::new();
    for run in &runs {
        let settled: Vec<&Tick> = run.ticks.iter().filter(|t| t.t_s >= warm).collect();
        let all: Vec<&Tick> = if settled.is_empty() {
            run.ticks.iter().collect()
        } else {
            settled
        };
        let mean = all.iter().map(|t| t.rate).sum::<f64>() / all.len().max(1) as f64;
        let sizes: Vec<f64> = all.iter().map(|t| t.total_mb).collect();
        let min = sizes.iter().copied().fold(f64::INFINITY, f64::min);
        let max = sizes.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!(
            "{:<44} {mean:>10.0} {:>10.1} {:>10.1} {min:>10.1} {max:>10.1}",
            run.name,
            sizes.first().copied().unwrap_or(f64::NAN),
            sizes.last().copied().unwrap_or(f64::NAN)
        );
        println!(
            "{{\"what\": \"retention_summary\", \"run\": \"{}\", \"from_s\": {warm:.0}, \"jobs_per_s\": {mean:.1}, \"total_mb_first\": {:.1}, \"total_mb_last\": {:.1}, \"total_mb_min\": {min:.1}, \"total_mb_max\": {max:.1}}}",
            run.name,
            sizes.first().copied().unwrap_or(f64::NAN),
            sizes.last().copied().unwrap_or(f64::NAN)
        );
        means.push(mean);
    }
    println!(
        "retention / DeleteJobs::Always: {:.1}% of the rate",
        means[0] * 100.0 / means[1]
    );
    for run in runs {
        r.0.entry(run.name)
            .or_default()
            .extend(run.ticks.iter().map(|t| t.rate));
    }
}

fn steady_run(
    app: &App,
    a: &Args,
    finished: Finished,
    seconds: u64,
    csv: &mut Option<std::fs::File>,
) -> SteadyRun {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    clear(app, (a.finished, a.future));
    let c = a.concurrency.first().copied().unwrap_or(8);
    let mut b = Worker::builder(app, noop_tasks())
        .outcomes_ride_claims(crate::common::ride())
        .claim_in_outcome_transaction(crate::common::one_write())
        .concurrency(c);
    let policy = match finished {
        Finished::Keep => String::new(),
        Finished::Delete => {
            b = b.delete_finished(postpone::DeleteJobs::Always);
            "_delete".into()
        }
        Finished::Retain(s) => {
            b = b.retention(
                postpone::Retention::new(Duration::from_secs(s))
                    .interval(Duration::from_secs(a.prune_every)),
            );
            format!("_retain_{s}_s")
        }
    };
    if a.no_vacuum {
        b = b.vacuum(postpone::Vacuum::off());
    }
    if let Some(p) = a.prefetch {
        b = b.prefetch(p);
    }
    let name = format!(
        "steady_c{c}{policy}{}{}",
        if a.no_vacuum { "_autovacuum_only" } else { "" },
        sizes_suffix(a)
    );
    // The backlog is deferred before the worker starts and the clock runs, as the Rust
    // peers' harness does: where the producer keeps up, nothing changes; where it cannot
    // (large arguments), every system's first intervals include the same backlog's drain.
    defer_n(app, a.pending);
    let deferred = Arc::new(AtomicU64::new(a.pending as u64));
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
    let mut ticks = Vec::new();
    let (mut wal_first, mut wal_prev) = (None, None);
    while t0.elapsed() < Duration::from_secs(seconds) {
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
                // The predicate of the claim's index (`postpone_jobs_due_idx`, the jobs
                // without a deadline, as the bench's are): without `blocked_by IS NULL`
                // (schema 11) or `expires_at IS NULL` (schema 30) no index fits, and this
                // timed a sequential scan and a sort of the whole table instead of the walk.
                "SELECT id FROM postpone_jobs
                  WHERE status = 'todo' AND blocked_by IS NULL AND expires_at IS NULL
                    AND scheduled_at <= now()
                  ORDER BY priority DESC, scheduled_at, id LIMIT 64",
                &[],
            )
            .unwrap();
        let walk = walk.elapsed();
        let row = probe
            .query_one(
                "SELECT n_dead_tup, n_live_tup, pg_relation_size('postpone_jobs_due_idx'),
                        coalesce(autovacuum_count, 0), pg_table_size('postpone_jobs'),
                        pg_indexes_size('postpone_jobs'), pg_total_relation_size('postpone_jobs'),
                        (SELECT wal_bytes::bigint FROM pg_stat_wal),
                        (SELECT wal_fpi FROM pg_stat_wal),
                        (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)
                   FROM pg_stat_user_tables WHERE relname = 'postpone_jobs'",
                &[],
            )
            .unwrap();
        let mb = |i: usize| row.get::<_, i64>(i) as f64 / (1024.0 * 1024.0);
        let t_s = (now - t0).as_secs_f64();
        let vacuums = h.stats().vacuums;
        // The server's WAL (every database's) and its full-page images since the last tick,
        // per job recorded, and the checkpoints since the run began.
        let wal = (
            row.get::<_, i64>(7),
            row.get::<_, i64>(8),
            row.get::<_, i64>(9),
        );
        let (wal0, wal_last) = (*wal_first.get_or_insert(wal), wal_prev.replace(wal));
        let per_job = |now: i64, before: Option<i64>| {
            before.map_or(f64::NAN, |b| (now - b) as f64 / (n - last.1).max(1) as f64)
        };
        println!(
            "{{\"what\": \"{name}\", \"t_s\": {t_s:.0}, \"jobs_per_s\": {rate:.1}, \"claim_walk_ms\": {:.2}, \"dead_tuples\": {}, \"live_tuples\": {}, \"due_idx_kb\": {}, \"table_mb\": {:.1}, \"index_mb\": {:.1}, \"total_mb\": {:.1}, \"vacuums\": {vacuums}, \"autovacuums\": {}, \"wal_bytes_per_job\": {:.0}, \"wal_fpi_per_job\": {:.3}, \"checkpoints\": {}}}",
            walk.as_secs_f64() * 1000.0,
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2) / 1024,
            mb(4),
            mb(5),
            mb(6),
            row.get::<_, i64>(3),
            per_job(wal.0, wal_last.map(|w| w.0)),
            per_job(wal.1, wal_last.map(|w| w.1)),
            wal.2 - wal0.2,
        );
        if let Some(f) = csv.as_mut() {
            writeln!(
                f,
                "{name},{t_s:.0},{rate:.1},{:.2},{:.2},{:.2},{},{},{vacuums},{}",
                mb(4),
                mb(5),
                mb(6),
                row.get::<_, i64>(0),
                row.get::<_, i64>(1),
                row.get::<_, i64>(3)
            )
            .unwrap();
            f.flush().unwrap();
        }
        ticks.push(Tick {
            t_s,
            rate,
            total_mb: mb(6),
        });
        last = (now, n);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = producer.0.join();
    let report = h.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
    SteadyRun { name, ticks }
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
    // `--cluster`: a cluster of our own with default settings, removed when `main` returns.
    let own = std::env::args().any(|a| a == "--cluster");
    let _cluster = own.then(common::OwnCluster::start);
    println!("{}", common::server_line(own));
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
    if a.only.iter().any(|o| o == "retention") {
        bench_retention(&app, &a, &mut r);
    }
    if a.only.iter().any(|o| o == "openloop" || o == "scheduled") {
        openloop::run(&db.url(), &db.name, &a.only);
    }
    if a.only.iter().any(|o| o == "soak") {
        soak::run(&db.url());
    }
    if a.only.iter().any(|o| o == "mixed") {
        mixed::run(&db.url());
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
