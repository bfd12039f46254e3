//! Overload (issue 39, item 5): many producers defer faster than a worker can run the jobs,
//! on a server whose connection slots are all taken; then the producers stop and the queue
//! drains. Figures are printed, never asserted, except the promises below, which end the
//! run with status 1 when broken.
//!
//! ```sh
//! cargo bench --bench overload                        # defaults below
//! cargo bench --bench overload -- --seconds 300 --producers 2000 --rate 0.2
//! ```
//!
//! Setup: a PostgreSQL cluster of the run's own (initdb on a spare port with
//! `tests/support/cluster.rs`, removed at the end; never the machine's shared server) with
//! `max_connections` = `--max-connections` (30). One worker process (this executable,
//! re-run as a child) of `--concurrency` threads (2) runs `overload_work` jobs that sleep
//! `--task-ms` (20) each, so it finishes at most about `concurrency * 1000 / task_ms` jobs a
//! second. The producers are `--producers` threads (2,000) of this process, each deferring
//! one job every `1 / --rate` seconds (0.2 a second each: 400 jobs a second offered) through
//! `--apps` Apps (3) of `--pool` connections each (6): with the worker's, the observer's and
//! the hog's connections, 26 of the 30 slots.
//! Every defer has a deadline: `pool_timeout` (`--deadline-ms`, 2,000) to get a connection,
//! then `io_timeout` (5 s) for the insert. Every `--hog-every` seconds of production (40; 0:
//! never) the server refuses work for `--hog-for` seconds (10): every client backend is
//! terminated (`pg_terminate_backend`: the worker's and the producers' connections) and every
//! free slot is taken, so that reconnecting pools hear "too many clients".
//!
//! Phases: `--seconds` (180) of production, then the drain (until no job waits or runs, at
//! most `--drain-limit` seconds, 900). Every `--every` seconds (5) one line: queue depth
//! (todo + doing), jobs finished, defers acknowledged and failed (by error kind), the
//! slowest defer of the interval, the resident memory (VmRSS) of this process, of the worker
//! process and of the server's processes together, and the server's connection count.
//!
//! Checked at the end (status 1 when broken):
//! - nothing lost: every job whose defer returned an id has succeeded (a defer that failed
//!   may still have committed: such rows are counted, not judged);
//! - every failed defer returned within its deadline (`pool_timeout` + `io_timeout` + 1 s
//!   for a loaded machine), with an error that names what failed;
//! - the queue drained within `--drain-limit`.
//!
//! The acknowledged ids are kept in memory to check them at the end: 8 bytes per job, part
//! of this process's memory growth (about 0.6 MB for 72,000 jobs).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postpone::{App, DeleteJobs, Job, Tasks, Worker};
use support::cluster::{self, Cluster};

const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
struct Args {
    seconds: u64,
    producers: usize,
    rate: f64,
    apps: usize,
    pool: u32,
    deadline_ms: u64,
    max_connections: u32,
    concurrency: usize,
    task_ms: u64,
    drain_limit: u64,
    every: u64,
    hog_every: u64,
    hog_for: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seconds: 180,
        producers: 2000,
        rate: 0.2,
        apps: 3,
        pool: 6,
        deadline_ms: 2000,
        max_connections: 30,
        concurrency: 2,
        task_ms: 20,
        drain_limit: 900,
        every: 5,
        hog_every: 40,
        hog_for: 10,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--bench" {
            continue;
        }
        let v = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n = |v: &str| -> Result<u64, String> {
            v.parse()
                .map_err(|e| format!("{flag} {v:?}: not a number: {e}"))
        };
        match flag.as_str() {
            "--seconds" => a.seconds = n(&v)?,
            "--producers" => a.producers = n(&v)?.max(1) as usize,
            "--rate" => {
                a.rate = v
                    .parse::<f64>()
                    .map_err(|e| format!("--rate {v:?}: {e}"))?
                    .max(0.001)
            }
            "--apps" => a.apps = n(&v)?.max(1) as usize,
            "--pool" => a.pool = n(&v)?.max(1) as u32,
            "--deadline-ms" => a.deadline_ms = n(&v)?.max(1),
            "--max-connections" => a.max_connections = n(&v)?.max(10) as u32,
            "--concurrency" => a.concurrency = n(&v)?.max(1) as usize,
            "--task-ms" => a.task_ms = n(&v)?,
            "--drain-limit" => a.drain_limit = n(&v)?,
            "--every" => a.every = n(&v)?.max(1),
            "--hog-every" => a.hog_every = n(&v)?,
            "--hog-for" => a.hog_for = n(&v)?,
            other => return Err(format!("unknown option {other} (see benches/overload.rs)")),
        }
    }
    Ok(a)
}

/// VmRSS of a process, in KiB (0 if it is gone).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// The postmaster's pid and its children's (the server's processes), from /proc.
fn server_pids(postmaster: u32) -> Vec<u32> {
    let mut pids = vec![postmaster];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1.to_owned();
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                });
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// The worker process: runs `overload_work` until its standard input closes.
fn child(url: &str) {
    let c: usize = std::env::var("OVERLOAD_C").unwrap().parse().unwrap();
    let ms: u64 = std::env::var("OVERLOAD_TASK_MS").unwrap().parse().unwrap();
    let app = App::builder(url)
        .pool_size(4)
        .io_timeout(IO_TIMEOUT)
        .build()
        .expect("worker: connecting");
    let mut tasks = Tasks::new();
    tasks.register("overload_work", move |_job: &Job| {
        thread::sleep(Duration::from_millis(ms));
        Ok(())
    });
    let h = Worker::builder(&app, tasks)
        .concurrency(c)
        .delete_finished(DeleteJobs::Never)
        .spawn()
        .expect("worker: spawning");
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let report = h.shutdown(Duration::from_secs(10));
    eprintln!("worker shutdown: clean {}", report.is_clean());
}

#[derive(Default)]
struct Interval {
    acked: u64,
    failed: BTreeMap<String, u64>,
    slowest_ok_ms: u64,
    slowest_err_ms: u64,
}

#[derive(Default)]
struct Totals {
    acked_ids: Vec<i64>,
    failed: BTreeMap<String, u64>,
    /// A few messages of each error kind, to show what the caller sees.
    samples: BTreeMap<String, Vec<String>>,
    slowest_ok_ms: u64,
    slowest_err_ms: u64,
    /// Failed defers that took longer than their deadline.
    over_deadline: u64,
    now: Interval,
}

fn main() {
    if let Ok(url) = std::env::var("OVERLOAD_CHILD_URL") {
        child(&url);
        return;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Some(reason) = cluster::skip_reason() {
        eprintln!("overload: cannot build a server of our own here: {reason}");
        std::process::exit(2);
    }
    let ok = run(&args);
    std::process::exit(if ok { 0 } else { 1 });
}

fn run(a: &Args) -> bool {
    let deadline = Duration::from_millis(a.deadline_ms);
    let bound = deadline + IO_TIMEOUT + Duration::from_secs(1);
    let cluster = Cluster::primary_with(
        "overload",
        &format!("max_connections = {}\n", a.max_connections),
        "",
    );
    let url = cluster.url("postgres");
    let setup = App::builder(&url).pool_size(1).build().expect("connecting");
    setup.migrate().expect("migrating");
    drop(setup);
    let mut observer = cluster.client("postgres");
    let postmaster: u32 = observer
        .query_one("SELECT pg_backend_pid()", &[])
        .ok()
        .and_then(|_| {
            std::fs::read_to_string(cluster.data().join("postmaster.pid"))
                .ok()?
                .lines()
                .next()?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    let offered = a.producers as f64 * a.rate;
    let capacity = if a.task_ms == 0 {
        f64::INFINITY
    } else {
        a.concurrency as f64 * 1000.0 / a.task_ms as f64
    };
    println!(
        "overload: {} s of production, {} producers x {}/s = {:.0} jobs/s offered; worker {} \
         threads x {} ms tasks (at most {:.0} jobs/s); {} apps x pool {} = {} connections \
         wanted by the producers; max_connections {}; defer deadline {} ms pool_timeout + {} s \
         io_timeout; cluster on port {}",
        a.seconds,
        a.producers,
        a.rate,
        offered,
        a.concurrency,
        a.task_ms,
        capacity,
        a.apps,
        a.pool,
        a.apps as u32 * a.pool,
        a.max_connections,
        a.deadline_ms,
        IO_TIMEOUT.as_secs(),
        cluster.port()
    );

    // The worker first, so that it holds its connections before the producers take the rest.
    let exe = std::env::current_exe().expect("this executable");
    let mut worker = Command::new(exe)
        .env("OVERLOAD_CHILD_URL", &url)
        .env("OVERLOAD_C", a.concurrency.to_string())
        .env("OVERLOAD_TASK_MS", a.task_ms.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning the worker");
    let worker_pid = worker.id();
    {
        let out = worker.stdout.take().expect("worker stdout");
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        if line.trim() != "ready" {
            eprintln!("overload: the worker did not start");
            let _ = worker.kill();
            let _ = worker.wait();
            return false;
        }
    }

    let apps: Vec<App> = (0..a.apps)
        .map(|_| {
            App::builder(&url)
                .pool_size(a.pool)
                .pool_timeout(deadline)
                .connect_timeout(deadline)
                .io_timeout(IO_TIMEOUT)
                .lazy(true)
                .build()
                .expect("building a producer App")
        })
        .collect();
    let totals = Arc::new(Mutex::new(Totals::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let produce_until = t0 + Duration::from_secs(a.seconds);
    let period = Duration::from_secs_f64(1.0 / a.rate);
    let mut producers = Vec::new();
    for p in 0..a.producers {
        let app = apps[p % apps.len()].clone();
        let totals = totals.clone();
        let stop = stop.clone();
        let attempts = attempts.clone();
        // Spread the producers' first defers over one period.
        let first = t0 + period.mul_f64(p as f64 / a.producers as f64);
        let h = thread::Builder::new()
            .name(format!("producer-{p}"))
            .stack_size(128 * 1024)
            .spawn(move || {
                let mut next = first;
                let mut seq = 0u64;
                loop {
                    let now = Instant::now();
                    if now >= produce_until || stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if next > now {
                        thread::sleep(next - now);
                        continue;
                    }
                    next += period;
                    if next < Instant::now() {
                        // Behind (a slow defer): skip the missed ticks rather than burst.
                        next = Instant::now() + period;
                    }
                    attempts.fetch_add(1, Ordering::Relaxed);
                    let started = Instant::now();
                    let res = app.defer("overload_work", &serde_json::json!({"p": p, "n": seq}));
                    let took = started.elapsed();
                    let ms = took.as_millis() as u64;
                    seq += 1;
                    let mut t = totals.lock().unwrap();
                    match res {
                        Ok(id) => {
                            t.acked_ids.push(id.get());
                            t.now.acked += 1;
                            t.now.slowest_ok_ms = t.now.slowest_ok_ms.max(ms);
                            t.slowest_ok_ms = t.slowest_ok_ms.max(ms);
                        }
                        Err(e) => {
                            let kind = format!("{:?}", e.kind());
                            *t.failed.entry(kind.clone()).or_default() += 1;
                            *t.now.failed.entry(kind.clone()).or_default() += 1;
                            t.now.slowest_err_ms = t.now.slowest_err_ms.max(ms);
                            t.slowest_err_ms = t.slowest_err_ms.max(ms);
                            if took > bound {
                                t.over_deadline += 1;
                            }
                            let s = t.samples.entry(kind).or_default();
                            if s.len() < 3 && !s.iter().any(|m| *m == e.to_string()) {
                                s.push(e.to_string());
                            }
                        }
                    }
                }
            })
            .expect("spawning a producer thread");
        producers.push(h);
    }

    // The server refusing: every `hog_every` seconds of production, every client backend
    // but ours is terminated and every free slot taken for `hog_for` seconds, so that the
    // pools (and the worker) must reconnect to a server that answers "too many clients".
    let hogger = (a.hog_every > 0 && a.hog_for > 0).then(|| {
        let mut admin = cluster.client("postgres");
        let socket = format!(
            "host={} port={} user=postgres dbname=postgres connect_timeout=2",
            cluster.dir().display(),
            cluster.port()
        );
        let observer_pid: i32 = observer
            .query_one("SELECT pg_backend_pid()", &[])
            .map(|r| r.get(0))
            .unwrap_or(0);
        let (hog_every, hog_for) = (
            Duration::from_secs(a.hog_every),
            Duration::from_secs(a.hog_for),
        );
        let stop = stop.clone();
        thread::spawn(move || {
            let mut next = t0 + hog_every;
            while next + hog_for < produce_until && !stop.load(Ordering::Relaxed) {
                thread::sleep(next.saturating_duration_since(Instant::now()));
                next += hog_every;
                // Terminate everyone else and take the slots they free, until we hold
                // every slot (or for 3 s): pools reconnect fast, so once is not enough.
                let mut held: Vec<postgres::Client> = Vec::new();
                let mut held_pids: Vec<i32> = vec![observer_pid];
                let mut terminated = 0i64;
                let mut refused = String::new();
                let until = Instant::now() + Duration::from_secs(3);
                while Instant::now() < until {
                    terminated += admin
                        .query_one(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                              WHERE backend_type = 'client backend'
                                AND pid <> pg_backend_pid() AND pid <> ALL($1)",
                            &[&held_pids],
                        )
                        .map(|r| r.get::<_, i64>(0))
                        .unwrap_or(0);
                    thread::sleep(Duration::from_millis(20));
                    loop {
                        match postgres::Client::connect(&socket, postgres::NoTls) {
                            Ok(mut c) => {
                                if let Ok(r) = c.query_one("SELECT pg_backend_pid()", &[]) {
                                    held_pids.push(r.get(0));
                                }
                                held.push(c);
                            }
                            Err(e) => {
                                refused = e
                                    .as_db_error()
                                    .map_or_else(|| e.to_string(), |d| d.message().to_owned());
                                break;
                            }
                        }
                    }
                    let others: i64 = admin
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity
                              WHERE backend_type = 'client backend'
                                AND pid <> pg_backend_pid() AND pid <> ALL($1)",
                            &[&held_pids],
                        )
                        .map(|r| r.get(0))
                        .unwrap_or(-1);
                    if others == 0 {
                        break;
                    }
                }
                println!(
                    "hog at {:.0} s: {terminated} backends terminated, {} slots held for {} s \
                     (a new connection then: {refused})",
                    t0.elapsed().as_secs_f64(),
                    held.len(),
                    hog_for.as_secs()
                );
                thread::sleep(hog_for);
                drop(held);
            }
        })
    });

    let every = Duration::from_secs(a.every);
    let mut rss_self = Vec::new();
    let mut rss_worker = Vec::new();
    let mut rss_server = Vec::new();
    let mut max_depth = 0i64;
    let mut prev_done = 0i64;
    let mut prev_t = t0;
    let mut produce_rates = Vec::new();
    let mut drain_rates = Vec::new();
    let mut drained_at = None;
    let mut producers_joined = false;
    let drain_limit = Duration::from_secs(a.seconds + a.drain_limit);
    println!(
        "{:>6} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>5}",
        "t_s",
        "phase",
        "depth",
        "done",
        "acked",
        "failed",
        "ok_max",
        "err_max",
        "rss_prod",
        "rss_wrk",
        "rss_srv",
        "conns"
    );
    loop {
        thread::sleep(every.saturating_sub(prev_t.elapsed()));
        let now = Instant::now();
        let producing = now < produce_until;
        if !producing && !producers_joined {
            stop.store(true, Ordering::Relaxed);
            for h in producers.drain(..) {
                let _ = h.join();
            }
            producers_joined = true;
        }
        let (depth, done, conns) = match observer.query_one(
            "SELECT count(*) FILTER (WHERE status IN ('todo', 'doing')),
                    count(*) FILTER (WHERE status NOT IN ('todo', 'doing')),
                    (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
               FROM postpone_jobs",
            &[],
        ) {
            Ok(r) => (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2)),
            Err(e) => {
                eprintln!("observer: {e}");
                (-1, prev_done, -1)
            }
        };
        max_depth = max_depth.max(depth);
        let dt = now.duration_since(prev_t).as_secs_f64();
        let rate = (done - prev_done) as f64 / dt;
        if producing {
            produce_rates.push(rate);
        } else if depth > 0 {
            drain_rates.push(rate);
        }
        prev_done = done;
        prev_t = now;
        let (acked, failed, ok_max, err_max) = {
            let mut t = totals.lock().unwrap();
            let i = std::mem::take(&mut t.now);
            (
                i.acked,
                i.failed.values().sum::<u64>(),
                i.slowest_ok_ms,
                i.slowest_err_ms,
            )
        };
        let (rs, rw) = (rss_kib(std::process::id()), rss_kib(worker_pid));
        let rv: u64 = server_pids(postmaster).into_iter().map(rss_kib).sum();
        rss_self.push(rs);
        rss_worker.push(rw);
        rss_server.push(rv);
        println!(
            "{:>6.0} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>5}",
            t0.elapsed().as_secs_f64(),
            if producing { "produce" } else { "drain" },
            depth,
            done,
            acked,
            failed,
            ok_max,
            err_max,
            rs,
            rw,
            rv,
            conns
        );
        let _ = std::io::stdout().flush();
        if !producing && depth == 0 {
            drained_at = Some(now);
            break;
        }
        if t0.elapsed() > drain_limit {
            break;
        }
    }

    // The checks.
    if let Some(h) = hogger {
        let _ = h.join();
    }
    let _ = worker.stdin.take();
    let _ = worker.wait();
    let t = totals.lock().unwrap();
    let acked: Vec<i64> = t.acked_ids.clone();
    let row = observer
        .query_one(
            "SELECT count(*) FILTER (WHERE j.status = 'succeeded'),
                    count(*) FILTER (WHERE j.id IS NULL),
                    count(*) FILTER (WHERE j.status IS DISTINCT FROM 'succeeded' AND j.id IS NOT NULL)
               FROM unnest($1::bigint[]) AS a(id) LEFT JOIN postpone_jobs j ON j.id = a.id",
            &[&acked],
        )
        .expect("checking the acknowledged jobs");
    let (succeeded, missing, unfinished) = (
        row.get::<_, i64>(0),
        row.get::<_, i64>(1),
        row.get::<_, i64>(2),
    );
    let rows: i64 = observer
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .map(|r| r.get(0))
        .unwrap_or(-1);
    let failed_total: u64 = t.failed.values().sum();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let spread = |v: &[u64]| {
        let n = v.len();
        let first = v.iter().take((n / 4).max(1)).copied().max().unwrap_or(0);
        let last = v
            .iter()
            .skip(n - (n / 4).max(1))
            .copied()
            .max()
            .unwrap_or(0);
        let min = v.iter().copied().min().unwrap_or(0);
        let max = v.iter().copied().max().unwrap_or(0);
        format!("min {min} max {max}, first quarter's max {first}, last quarter's max {last} KiB")
    };
    println!();
    println!(
        "defers: {} attempted, {} acknowledged, {} failed {:?}",
        attempts.load(Ordering::Relaxed),
        acked.len(),
        failed_total,
        t.failed
    );
    for (kind, msgs) in &t.samples {
        for m in msgs {
            println!("  {kind}: {m}");
        }
    }
    println!(
        "slowest defer: acknowledged {} ms, failed {} ms (bound {} ms: pool_timeout + io_timeout + 1 s); failed over the bound: {}",
        t.slowest_ok_ms,
        t.slowest_err_ms,
        bound.as_millis(),
        t.over_deadline
    );
    println!(
        "queue: deepest {max_depth}; finished {:.1} jobs/s while producing, {:.1} jobs/s while draining; drained {}",
        mean(&produce_rates),
        mean(&drain_rates),
        match drained_at {
            Some(d) => format!(
                "{:.0} s after production stopped",
                d.duration_since(produce_until).as_secs_f64()
            ),
            None => format!("NOT within {} s", a.drain_limit),
        }
    );
    println!(
        "acknowledged jobs: {succeeded} succeeded, {missing} missing, {unfinished} not succeeded; rows in all {rows} ({} from defers that reported an error)",
        rows - acked.len() as i64
    );
    println!("rss producers: {}", spread(&rss_self));
    println!("rss worker:    {}", spread(&rss_worker));
    println!("rss server:    {}", spread(&rss_server));
    let ok = missing == 0 && unfinished == 0 && t.over_deadline == 0 && drained_at.is_some();
    println!("overload: {}", if ok { "OK" } else { "BROKEN PROMISE" });
    drop(cluster);
    ok
}
