//! Scale figures for postpone, printed (never asserted): many worker processes on one
//! database, and the claim's speed beside large backlogs.
//!
//! ```sh
//! cargo bench --bench scale                                  # both, defaults below
//! cargo bench --bench scale -- --only processes --processes 1,2,4,8 --concurrency 4
//! cargo bench --bench scale -- --only backlog --backlog 1000000 --n-work 20000
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
//!
//! Each figure prints as a JSON line, then a summary of medians over `--repeats` runs. The
//! backlog cases run in turn, once per repeat, after one unrecorded drain that warms the
//! server up, so that a machine whose speed drifts moves every case alike.

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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

fn main() {
    if let Ok(url) = std::env::var("POSTPONE_SCALE_CHILD") {
        child(&url);
        return;
    }
    let a = parse_args();
    let want = |what: &str| a.only.is_empty() || a.only.iter().any(|o| o == what);
    let db = BenchDb::create("postpone_scale");
    let app = App::builder(db.url()).pool_size(4).build().unwrap();
    app.migrate().unwrap();
    let mut r = Results(BTreeMap::new());
    if want("processes") {
        bench_processes(&db, &app, &a, &mut r);
    }
    if want("backlog") || a.only.iter().any(|o| o != "processes") {
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
