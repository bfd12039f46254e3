//! Scale figures for postpone, printed (never asserted): many worker processes on one
//! database, and the claim's speed beside large backlogs.
//!
//! ```sh
//! cargo bench --bench scale                                  # both, defaults below
//! cargo bench --bench scale -- --only processes --processes 1,2,4,8 --concurrency 4
//! cargo bench --bench scale -- --only backlog --backlog 1000000 --n-work 20000
//! cargo bench --bench scale -- --only fleet --processes 10,30,90
//! ```
//!
//! On a fresh database (`postpone_scale_<pid>`, created and dropped here) on the server of
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`):
//! - `processes`: for each count P, `--n-work` no-op jobs deferred beforehand, then P worker
//!   processes (this executable, re-run as a child) of `--concurrency` threads each; wall
//!   time from the first spawn to the last job finished, read from the table.
//! - `backlog`: `--n-work` due no-op jobs worked by one worker of `--concurrency` threads,
//!   beside nothing (the reference), `--backlog` jobs scheduled for tomorrow, `--backlog`
//!   due jobs of a lower priority, `--backlog` finished jobs, and `--locks` jobs waiting
//!   for locks that running jobs hold (ahead of the due ones in the queue): first as the
//!   worker finds them (its first claim parks them, schema 11), then already parked and
//!   vacuumed (`locks_parked`); and `--backlog` jobs past their deadline (schema 25, expiry),
//!   due before the measured ones (`expired_first`: the head of the claim's order, the
//!   worst case) or scheduled among them over the same hour (`expired_mixed`, the measured
//!   jobs inserted there too), their times drawn from a seeded generator; for those, also
//!   the time until the workers' sweep has ended every expired job
//!   (`backlog_expired_*_swept`, jobs/s of the sweep).
//! - `fleet`: on a cluster of its own (initdb on a spare port, PostgreSQL's default
//!   `max_connections` 100, fsync on), for each count P, P idle worker processes of 2
//!   threads each (`pool_size(1)`, `pool_idle_timeout` 3 s so that idle comes soon); each
//!   retries its `spawn` for up to 30 s when the server refuses it, as a supervisor would.
//!   Reported: processes whose worker started, the fleet's server connections once idle and
//!   at most during a drain, all client connections of the server, errors per process
//!   (refused spawns and the worker's database errors), `--wakes` single jobs deferred one at
//!   a time to the idle fleet (claim time minus defer time on the server's clock: p50, p99),
//!   and a drain of `--n-work` no-op jobs deferred to the running fleet (jobs/s from the
//!   first insert to the last job done; a drain not done by `--drain-timeout` seconds, 300,
//!   is reported with the jobs done by then).
//!
//! Each figure prints as a JSON line, then a summary of medians over `--repeats` runs. The
//! backlog cases run in turn, once per repeat, after one unrecorded drain that warms the
//! server up, so that a machine whose speed drifts moves every case alike.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../tests/support/cluster.rs"]
#[allow(dead_code)]
mod cluster;
#[path = "common/mod.rs"]
mod common;
use common::{median, BenchDb};
use postpone::{App, Job, NewJob, Tasks, Worker};

struct Args {
    n_work: usize,
    concurrency: usize,
    processes: Vec<usize>,
    backlog: usize,
    locks: usize,
    repeats: usize,
    prefetch: Option<usize>,
    wakes: usize,
    drain_timeout: Duration,
    only: Vec<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        n_work: 20_000,
        concurrency: 4,
        processes: vec![1, 2, 4, 8],
        backlog: 1_000_000,
        locks: 10_000,
        repeats: 1,
        prefetch: None,
        wakes: 30,
        drain_timeout: Duration::from_secs(300),
        only: Vec::new(),
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let val = || argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--n-work" => a.n_work = val().parse().expect("--n-work N"),
            "--concurrency" => a.concurrency = val().parse().expect("--concurrency N"),
            "--backlog" => a.backlog = val().parse().expect("--backlog N"),
            "--locks" => a.locks = val().parse().expect("--locks N"),
            "--repeats" => a.repeats = val().parse().expect("--repeats N"),
            "--wakes" => a.wakes = val().parse().expect("--wakes N"),
            "--drain-timeout" => {
                a.drain_timeout =
                    Duration::from_secs(val().parse().expect("--drain-timeout SECONDS"))
            }
            "--prefetch" => a.prefetch = Some(val().parse().expect("--prefetch N")),
            "--processes" => {
                a.processes = val()
                    .split(',')
                    .map(|p| p.trim().parse().expect("--processes 1,2,4"))
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

/// The measured task, and the lower-priority backlog's task (run after the measured jobs, as
/// a worker runs its own lower-priority jobs; unregistered, each would be failed as unknown
/// with an error written, which is not what that case measures).
fn noop_tasks() -> Tasks {
    let mut t = Tasks::new();
    t.register("noop", |_: &Job| Ok(()));
    t.register("low", |_: &Job| Ok(()));
    t
}

fn defer_n(app: &App, n: usize, priority: i32) {
    let batch: Vec<NewJob> = (0..1000)
        .map(|_| NewJob::new("noop", &()).unwrap().priority(priority))
        .collect();
    let mut left = n;
    while left > 0 {
        let k = left.min(1000);
        app.defer_batch(&batch[..k]).unwrap();
        left -= k;
    }
}

fn sql(app: &App, statement: &str) {
    let mut c = app.connection().unwrap();
    c.set_io_timeout(Duration::from_secs(1800));
    c.batch_execute(statement).unwrap();
}

fn succeeded(app: &App) -> i64 {
    app.connection()
        .unwrap()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded' AND task = 'noop'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Waiting jobs past their deadline, not ended yet.
fn expired_waiting(app: &App) -> i64 {
    app.connection()
        .unwrap()
        .query_one(
            "SELECT count(*) FROM postpone_jobs
              WHERE status = 'todo' AND expires_at IS NOT NULL AND expires_at <= now()",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Whether any job is waiting or running.
fn busy(app: &App) -> bool {
    app.connection()
        .unwrap()
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM postpone_jobs
                             WHERE status = 'todo' AND blocked_by IS NULL)
                 OR EXISTS (SELECT 1 FROM postpone_jobs
                             WHERE status = 'todo' AND blocked_by IS NOT NULL)
                 OR EXISTS (SELECT 1 FROM postpone_jobs WHERE status = 'doing')",
            &[],
        )
        .unwrap()
        .get(0)
}

struct Results(BTreeMap<String, Vec<f64>>);

impl Results {
    fn record(&mut self, what: &str, n: usize, secs: f64) {
        let rate = n as f64 / secs;
        println!(
            "{{\"what\": \"{what}\", \"n\": {n}, \"s\": {secs:.3}, \"jobs_per_s\": {rate:.1}}}"
        );
        self.0.entry(what.to_owned()).or_default().push(rate);
    }
}

/// A child process: one worker until its parent closes our stdin.
fn child(url: &str) {
    let c: usize = std::env::var("POSTPONE_SCALE_C").unwrap().parse().unwrap();
    let app = App::builder(url).pool_size(1).build().unwrap();
    let mut b = Worker::builder(&app, noop_tasks())
        .outcomes_ride_claims(crate::common::ride())
        .claim_in_outcome_transaction(crate::common::one_write())
        .concurrency(c);
    // `--prefetch N`: a fixed prefetch instead of the adaptive one (empty: adaptive).
    if let Some(p) = std::env::var("POSTPONE_SCALE_PREFETCH")
        .ok()
        .and_then(|p| p.parse().ok())
    {
        b = b.prefetch(p);
    }
    let h = b.spawn().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let report = h.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report}");
}

fn bench_processes(db: &BenchDb, app: &App, a: &Args, r: &mut Results) {
    for &p in &a.processes {
        for _ in 0..a.repeats {
            sql(app, "TRUNCATE postpone_jobs, postpone_workers");
            defer_n(app, a.n_work, 0);
            sql(app, "VACUUM ANALYZE postpone_jobs");
            let t = Instant::now();
            let children: Vec<Child> = (0..p)
                .map(|_| {
                    Command::new(std::env::current_exe().unwrap())
                        .env("POSTPONE_SCALE_CHILD", db.url())
                        .env("POSTPONE_SCALE_C", a.concurrency.to_string())
                        .env(
                            "POSTPONE_SCALE_PREFETCH",
                            a.prefetch.map(|p| p.to_string()).unwrap_or_default(),
                        )
                        .stdin(std::process::Stdio::piped())
                        .spawn()
                        .expect("spawn a worker process")
                })
                .collect();
            // Watched with two probes of the head of an index, not a count: counting the
            // finished rows every 5 ms took a seqscan of the table (6 ms at 40,000 rows),
            // half a core of the two the workers share with the database.
            while busy(app) {
                std::thread::sleep(Duration::from_millis(5));
                assert!(t.elapsed() < Duration::from_secs(900), "stuck");
            }
            let secs = t.elapsed().as_secs_f64();
            assert_eq!(succeeded(app), a.n_work as i64, "jobs left or lost");
            for mut ch in children {
                drop(ch.stdin.take());
                let status = ch.wait().unwrap();
                assert!(status.success(), "a worker process failed: {status}");
            }
            r.record(
                &format!("processes_{p}x_c{}", a.concurrency),
                a.n_work,
                secs,
            );
        }
    }
}

fn bench_backlog(app: &App, a: &Args, r: &mut Results) {
    let n = a.backlog;
    let mut cases: Vec<(String, String)> = vec![
        ("empty".into(), String::new()),
        (
            format!("future_{n}"),
            format!(
                "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
                 SELECT 'default', 'later', 'null', now() + interval '1 day'
                   FROM generate_series(1, {n})"
            ),
        ),
        (
            format!("lower_priority_due_{n}"),
            format!(
                "INSERT INTO postpone_jobs (queue, task, args, priority, scheduled_at)
                 SELECT 'default', 'low', 'null', -1, now() - interval '1 hour'
                   FROM generate_series(1, {n})"
            ),
        ),
        (
            format!("finished_{n}"),
            format!(
                "INSERT INTO postpone_jobs (queue, task, args, status, attempts, finished_at)
                 SELECT 'default', 'old', 'null', 'succeeded', 1, now()
                   FROM generate_series(1, {n})"
            ),
        ),
        (
            format!("locks_blocked_{}", a.locks),
            // A worker row that stays alive (its heartbeat is refreshed below), running one
            // job per lock, and one job waiting behind each, due before the measured jobs.
            format!(
                "INSERT INTO postpone_workers (id, name, last_heartbeat)
                   OVERRIDING SYSTEM VALUE VALUES (1000000, 'holder', now() + interval '1 day');
                 INSERT INTO postpone_jobs (queue, task, args, status, lock, worker_id, attempts,
                                            started_at, scheduled_at)
                 SELECT 'default', 'held', 'null', 'doing', 'lock-' || g, 1000000, 1, now(),
                        now() - interval '2 hours'
                   FROM generate_series(1, {0}) g;
                 INSERT INTO postpone_jobs (queue, task, args, lock, scheduled_at)
                 SELECT 'default', 'blocked', 'null', 'lock-' || g, now() - interval '1 hour'
                   FROM generate_series(1, {0}) g",
                a.locks
            ),
        ),
        (
            format!("locks_parked_{}", a.locks),
            // The same, after a claim has parked the held-back jobs (schema 11) and a vacuum
            // has removed what that left behind: the steady state of the case above.
            format!(
                "INSERT INTO postpone_workers (id, name, last_heartbeat)
                   OVERRIDING SYSTEM VALUE VALUES (1000000, 'holder', now() + interval '1 day');
                 INSERT INTO postpone_jobs (queue, task, args, status, lock, worker_id, attempts,
                                            started_at, scheduled_at)
                 SELECT 'default', 'held', 'null', 'doing', 'lock-' || g, 1000000, 1, now(),
                        now() - interval '2 hours'
                   FROM generate_series(1, {0}) g;
                 INSERT INTO postpone_jobs (queue, task, args, lock, scheduled_at)
                 SELECT 'default', 'blocked', 'null', 'lock-' || g, now() - interval '1 hour'
                   FROM generate_series(1, {0}) g;
                 SELECT count(*) FROM postpone_claim(1000000, 1, NULL, NULL)",
                a.locks
            ),
        ),
    ];
    // Seeded (setseed), so that every run draws the same times.
    cases.push((
        format!("expired_first_{n}"),
        format!(
            "SELECT setseed(0.43);
             INSERT INTO postpone_jobs (queue, task, args, scheduled_at, expires_at)
             SELECT 'default', 'noop', 'null', s.at, s.at + interval '30 minutes'
               FROM (SELECT now() - interval '2 hours' + random() * interval '1 hour' AS at
                       FROM generate_series(1, {n})) s"
        ),
    ));
    cases.push((
        format!("expired_mixed_{n}"),
        format!(
            "SELECT setseed(0.43);
             INSERT INTO postpone_jobs (queue, task, args, scheduled_at, expires_at)
             SELECT 'default', 'noop', 'null', s.at, s.at + interval '30 minutes'
               FROM (SELECT now() - interval '2 hours' + random() * interval '1 hour' AS at
                       FROM generate_series(1, {n})) s;
             INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
             SELECT 'default', 'noop', 'null',
                    now() - interval '2 hours' + random() * interval '1 hour'
               FROM generate_series(1, {})",
            a.n_work
        ),
    ));
    let wanted = |case: &str| {
        a.only.is_empty()
            || a.only.iter().any(|o| o == "backlog")
            || a.only.iter().any(|o| case.starts_with(o.as_str()))
    };
    let cases: Vec<(String, String)> = cases.into_iter().filter(|(c, _)| wanted(c)).collect();
    // One unrecorded drain first (a server just started reads its files cold), then the
    // cases in turn, once per repeat: a machine whose speed drifts within minutes moves
    // every case alike, instead of the case that happened to run during a slow minute.
    let warm_up = ("warm_up".to_string(), String::new());
    let runs = std::iter::once((&warm_up, false))
        .chain((0..a.repeats).flat_map(|_| cases.iter().map(|c| (c, true))));
    for ((case, setup), recorded) in runs {
        {
            sql(app, "TRUNCATE postpone_jobs, postpone_workers");
            if !setup.is_empty() {
                sql(app, setup);
            }
            sql(app, "VACUUM ANALYZE postpone_jobs");
            // The mixed expiry case inserted the measured jobs among the expired ones.
            if !case.starts_with("expired_mixed") {
                defer_n(app, a.n_work, 0);
            }
            let t = Instant::now();
            let h = Worker::builder(app, noop_tasks())
                .outcomes_ride_claims(crate::common::ride())
                .claim_in_outcome_transaction(crate::common::one_write())
                .concurrency(a.concurrency)
                .spawn()
                .unwrap();
            loop {
                std::thread::sleep(Duration::from_millis(2));
                // The count reads the table: only once the worker says it may be done.
                if h.stats().recorded >= a.n_work as u64 && succeeded(app) >= a.n_work as i64 {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(900),
                    "stuck: {:?}",
                    h.stats()
                );
            }
            let secs = t.elapsed().as_secs_f64();
            // The expiry cases: until the sweep has ended the backlog.
            let swept = case.starts_with("expired").then(|| {
                while expired_waiting(app) > 0 {
                    std::thread::sleep(Duration::from_millis(20));
                    assert!(
                        t.elapsed() < Duration::from_secs(1800),
                        "the sweep is stuck"
                    );
                }
                t.elapsed().as_secs_f64()
            });
            let _ = h.shutdown(Duration::from_secs(10));
            if !recorded {
                continue;
            }
            r.record(
                &format!("backlog_{case}_c{}", a.concurrency),
                a.n_work,
                secs,
            );
            if let Some(swept) = swept {
                r.record(
                    &format!("backlog_{case}_c{}_swept", a.concurrency),
                    a.backlog,
                    swept,
                );
            }
        }
    }
}

/// For `cluster.rs`, which waits through `super::wait_until`.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The application_name of the fleet's worker processes, to count their connections.
const FLEET_NAME: &str = "postpone-fleet";

/// A fleet's worker process: 2 threads, a pool of 1; retries its spawn for up to 30 s while
/// the server refuses it; says `FLEET_READY` and, once its stdin closes, shuts down and says
/// what went wrong (`FLEET_DONE`).
fn fleet_child(url: &str) {
    let app = App::builder(url)
        .pool_size(1)
        .pool_idle_timeout(Duration::from_secs(3))
        .lazy(true)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut refused = 0u64;
    let handle = loop {
        match Worker::builder(&app, noop_tasks()).concurrency(2).spawn() {
            Ok(h) => break Some(h),
            Err(e) => {
                refused += 1;
                if refused == 1 {
                    eprintln!("fleet worker {}: {e}", std::process::id());
                }
                if t0.elapsed() > Duration::from_secs(30) {
                    break None;
                }
                let jitter = u64::from(std::process::id() % 7) * 40;
                std::thread::sleep(Duration::from_millis(300 + jitter));
            }
        }
    };
    println!("FLEET_READY started={}", handle.is_some());
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
    let (db_errors, clean) = match handle {
        Some(h) => {
            let errors = h.stats().db_errors;
            let report = h.shutdown(Duration::from_secs(10));
            (errors, report.is_clean())
        }
        None => (0, false),
    };
    println!("FLEET_DONE refused={refused} db_errors={db_errors} clean={clean}");
}

/// (the fleet's connections, every client connection) on the server now.
fn server_connections(c: &mut postgres::Client) -> (i64, i64) {
    let r = c
        .query_one(
            "SELECT count(*) FILTER (WHERE application_name = $1), count(*)
               FROM pg_stat_activity WHERE backend_type = 'client backend'",
            &[&FLEET_NAME],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn bench_fleet(a: &Args) {
    if let Some(why) = cluster::skip_reason() {
        println!("fleet: skipped: {why}");
        return;
    }
    // PostgreSQL's defaults where they matter here (the test clusters' helper turns fsync
    // off and keeps few connections).
    let cl = cluster::Cluster::primary_with(
        "fleet",
        "max_connections = 100\nfsync = on\nsynchronous_commit = on\nfull_page_writes = on\n\
         shared_buffers = 128MB\n",
        "",
    );
    cl.client("postgres")
        .batch_execute("CREATE DATABASE fleet")
        .unwrap();
    // The bench's own connection is opened before any fleet and kept (never closed as
    // idle): a full server must not refuse the bench itself.
    let owner = App::builder(cl.url("fleet"))
        .pool_size(1)
        .pool_idle_timeout(Duration::from_secs(86_400))
        .build()
        .unwrap();
    owner.migrate().unwrap();
    let mut observer = cl.client("fleet");
    let url = format!("{}?application_name={FLEET_NAME}", cl.url("fleet"));
    let mut rows = Vec::new();
    for &p in &a.processes {
        sql(&owner, "TRUNCATE postpone_jobs, postpone_workers");
        let t_spawn = Instant::now();
        let (tx, lines) = crossbeam_channel::unbounded::<String>();
        let mut children: Vec<Child> = (0..p)
            .map(|_| {
                let mut ch = Command::new(std::env::current_exe().unwrap())
                    .env("POSTPONE_FLEET_CHILD", &url)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn a worker process");
                let out = ch.stdout.take().unwrap();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        let _ = tx.send(line);
                    }
                });
                ch
            })
            .collect();
        let mut started = 0;
        for _ in 0..p {
            match lines.recv_timeout(Duration::from_secs(90)) {
                Ok(l) if l.contains("started=true") => started += 1,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let ready_s = t_spawn.elapsed().as_secs_f64();
        // Idle: past the children's pool_idle_timeout (3 s) and a poll or two.
        std::thread::sleep(Duration::from_secs(6));
        let mut idle = (0, 0);
        for _ in 0..10 {
            let c = server_connections(&mut observer);
            idle = (idle.0.max(c.0), idle.1.max(c.1));
            std::thread::sleep(Duration::from_millis(200));
        }
        // Wake latency: one job at a time to the idle fleet.
        let mut wakes = Vec::new();
        for i in 0..a.wakes {
            std::thread::sleep(Duration::from_millis(150 + (i as u64 * 37) % 250));
            let id = owner.defer("noop", &()).unwrap().get();
            let t = Instant::now();
            let ms: Option<f64> = loop {
                let r = observer
                    .query_one(
                        "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000
                           FROM postpone_jobs WHERE id = $1 AND started_at IS NOT NULL",
                        &[&id],
                    )
                    .ok();
                if let Some(r) = r {
                    break r.get(0);
                }
                if t.elapsed() > Duration::from_secs(30) {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            wakes.push(ms.unwrap_or(f64::NAN));
        }
        wakes.sort_by(|x, y| x.total_cmp(y));
        // A drain of n_work jobs deferred to the running fleet.
        let t = Instant::now();
        defer_n(&owner, a.n_work, 0);
        let mut busy_max = (0, 0);
        let mut samples = 0;
        // A drain that has not ended by `--drain-timeout` is reported as it stands (the
        // jobs done by then), not waited for.
        let mut complete = true;
        while busy(&owner) {
            if samples % 5 == 0 {
                let c = server_connections(&mut observer);
                busy_max = (busy_max.0.max(c.0), busy_max.1.max(c.1));
            }
            samples += 1;
            std::thread::sleep(Duration::from_millis(20));
            if t.elapsed() > a.drain_timeout {
                complete = false;
                break;
            }
        }
        let drain_s = t.elapsed().as_secs_f64();
        let drained = succeeded(&owner) - a.wakes as i64;
        if complete {
            assert_eq!(drained, a.n_work as i64, "jobs left or lost");
        }
        let (mut refused, mut db_errors, mut unclean) = (0u64, 0u64, 0);
        for ch in &mut children {
            drop(ch.stdin.take());
        }
        let mut done = 0;
        while done < p {
            let Ok(l) = lines.recv_timeout(Duration::from_secs(60)) else {
                break;
            };
            let Some(rest) = l.strip_prefix("FLEET_DONE ") else {
                continue;
            };
            done += 1;
            for kv in rest.split(' ') {
                match kv.split_once('=') {
                    Some(("refused", v)) => refused += v.parse::<u64>().unwrap(),
                    Some(("db_errors", v)) => db_errors += v.parse::<u64>().unwrap(),
                    Some(("clean", "false")) => unclean += 1,
                    _ => {}
                }
            }
        }
        for mut ch in children {
            let _ = ch.wait();
        }
        let errors = (refused + db_errors) as f64 / p as f64;
        let rate = drained as f64 / drain_s;
        println!(
            "{{\"what\": \"fleet_{p}\", \"started\": {started}, \"ready_s\": {ready_s:.1}, \
             \"idle_fleet_conns\": {}, \"idle_server_conns\": {}, \"drain_fleet_conns\": {}, \
             \"drain_server_conns\": {}, \"refused_spawns\": {refused}, \"db_errors\": {db_errors}, \
             \"errors_per_process\": {errors:.2}, \"unclean\": {unclean}, \"drained\": {drained}, \
             \"drain_complete\": {complete}, \"drain_jobs_per_s\": {rate:.1}, \
             \"wake_p50_ms\": {:.1}, \"wake_p99_ms\": {:.1}}}",
            idle.0,
            idle.1,
            busy_max.0,
            busy_max.1,
            percentile(&wakes, 0.5),
            percentile(&wakes, 0.99),
        );
        let rate = if complete {
            format!("{rate:.0}")
        } else {
            format!("{rate:.0} ({drained} of {} in {drain_s:.0} s)", a.n_work)
        };
        rows.push(format!(
            "| {p} | {started} | {} ({}) | {} ({}) | {errors:.2} | {rate} | {:.0} |",
            idle.0,
            idle.1,
            busy_max.0,
            busy_max.1,
            percentile(&wakes, 0.99),
        ));
    }
    println!("FLEET (max_connections 100; connections: the fleet's (the server's clients)):");
    println!("| processes | started | idle | during a drain | errors/process | drain jobs/s | wake p99 ms |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        println!("{r}");
    }
}

fn main() {
    if let Ok(url) = std::env::var("POSTPONE_SCALE_CHILD") {
        child(&url);
        return;
    }
    if let Ok(url) = std::env::var("POSTPONE_FLEET_CHILD") {
        fleet_child(&url);
        return;
    }
    let a = parse_args();
    let want = |what: &str| a.only.is_empty() || a.only.iter().any(|o| o == what);
    if want("fleet") {
        bench_fleet(&a);
        if a.only.iter().all(|o| o == "fleet") {
            return;
        }
    }
    let db = BenchDb::create("postpone_scale");
    let app = App::builder(db.url()).pool_size(4).build().unwrap();
    app.migrate().unwrap();
    let mut r = Results(BTreeMap::new());
    if want("processes") {
        bench_processes(&db, &app, &a, &mut r);
    }
    if want("backlog") || a.only.iter().any(|o| o != "processes" && o != "fleet") {
        bench_backlog(&app, &a, &mut r);
    }
    drop(app);
    println!("SUMMARY (median of runs, jobs/s):");
    for (k, v) in &r.0 {
        let runs: Vec<String> = v.iter().map(|x| format!("{x:.1}")).collect();
        println!(
            "  {k:<36} median={:>10.1}  runs=[{}]",
            median(v),
            runs.join(", ")
        );
    }
}
