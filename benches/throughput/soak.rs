//! A soak (`--only soak`): a long open-loop run at part of the capacity, with retention on,
//! printing every interval whether throughput, latency, the table and its indexes stay flat.
//!
//! ```sh
//! # the 20-minute soak: 50% of the measured capacity, one line per minute
//! cargo bench --bench throughput -- --only soak --csv /tmp/soak.csv
//! # the same, spelled out
//! cargo bench --bench throughput -- --only soak --load 0.5 --seconds 1200 --interval 60 \
//!     --concurrency 4 --senders 16 --retain 60 --prune-every 10 --csv /tmp/soak.csv
//! # its chart
//! python3 benches/charts.py soak /tmp/soak.csv docs/perf-soak-retention.svg --note "..."
//! # a smoke run
//! cargo bench --bench throughput -- --only soak --seconds 40 --interval 10 --retain 10 \
//!     --prune-every 5 --csv /tmp/soak.csv
//! ```
//!
//! The rate is `--rates R` (jobs/s; the first value), or `--load F` (0.5; the first value)
//! times the capacity that `--only openloop --load` measures (`--capacity-senders` threads
//! (4) deferring flat out, one job per `defer`, for `--capacity-seconds`). Then the open-loop generator of
//! `openloop.rs` defers no-op jobs one at a time at that rate from `--senders` threads (16)
//! for `--seconds` (1200), to one worker of `--concurrency` threads (4) that keeps finished
//! jobs (no `DeleteJobs`) and deletes those older than `--retain` seconds (60) every
//! `--prune-every` seconds (10): `Retention::new(retain).interval(prune_every)`. The worker's
//! own vacuum is on (`Vacuum::default()`) unless `--no-vacuum`; `--table-options
//! 'fillfactor=80,...'` sets storage parameters on `postpone_jobs` before the run (it is
//! emptied by `TRUNCATE` first, so every page is written under them).
//!
//! Every `--interval` seconds (60) it prints one JSON line (`"what": "soak"`), and with
//! `--csv PATH` writes one row there (flushed, so a run cut short keeps its rows):
//! - `t_s`: seconds since the first job was due; `sent_per_s`, `started_per_s`: jobs deferred
//!   and jobs whose task started in the interval; `behind`, `max_lag_ms`: sends that started
//!   over 5 ms late, and the largest lag, in the interval;
//! - `p50_ms`, `p99_ms`, `p999_ms`, `max_ms`: latency (from the instant a job was due to be
//!   sent to its task starting) of the jobs started in the interval;
//! - `todo`, `doing`, `finished`: rows of `postpone_jobs` by status (`count(*)`);
//! - `dead_tuples`, `live_tuples`: `n_dead_tup`, `n_live_tup` of `pg_stat_user_tables`
//!   (read after `pg_stat_clear_snapshot()`; backends report them about once a second);
//!   `deleted`, `hot_pct`: rows deleted in the interval (`n_tup_del`), and the part of its
//!   updates that were HOT (`n_tup_hot_upd / n_tup_upd`, what a lower fillfactor could raise);
//! - `table_mb`: `pg_relation_size('postpone_jobs')`; `index_mb`: `pg_indexes_size` (all its
//!   indexes); `due_idx_kb`: `pg_relation_size('postpone_jobs_due_idx')`, the claim's index;
//! - `vacuums`: `WorkerStats.vacuums` (the worker's own), `autovacuums`: `autovacuum_count`,
//!   both since the start.
//!
//! At the end it prints the intervals as a table and, over the intervals that started once the
//! retention window had filled (`--retain` + `--prune-every` after the start), the min, median
//! and max of each figure: flat means those three stay close.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use postpone::{App, PooledConnection, Retention, Vacuum, Worker};

use crate::common::median;
use crate::openloop::{
    apply_table_options, capacity, now_us, opts, percentiles_ms, sleep_until_us, spawn_senders,
    stop, truncate, Latencies, Schedule, SendCounters,
};

/// What the database says about `postpone_jobs` at one instant.
#[derive(Clone, Copy, Default)]
struct Snap {
    todo: i64,
    doing: i64,
    finished: i64,
    live: i64,
    dead: i64,
    upd: i64,
    hot_upd: i64,
    del: i64,
    autovacuums: i64,
    table: i64,
    indexes: i64,
    due_idx: i64,
}

fn snap(c: &mut PooledConnection) -> Snap {
    let by_status = c
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'todo'),
                    count(*) FILTER (WHERE status = 'doing'),
                    count(*) FILTER (WHERE status NOT IN ('todo', 'doing'))
               FROM postpone_jobs",
            &[],
        )
        .unwrap();
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    let r = c
        .query_one(
            "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, n_tup_del,
                    autovacuum_count, pg_relation_size('postpone_jobs'),
                    pg_indexes_size('postpone_jobs'), pg_relation_size('postpone_jobs_due_idx')
               FROM pg_stat_user_tables WHERE relname = 'postpone_jobs'",
            &[],
        )
        .unwrap();
    Snap {
        todo: by_status.get(0),
        doing: by_status.get(1),
        finished: by_status.get(2),
        live: r.get(0),
        dead: r.get(1),
        upd: r.get(2),
        hot_upd: r.get(3),
        del: r.get(4),
        autovacuums: r.get(5),
        table: r.get(6),
        indexes: r.get(7),
        due_idx: r.get(8),
    }
}

/// One interval's figures.
struct Tick {
    t_s: f64,
    sent_per_s: f64,
    started_per_s: f64,
    behind: u64,
    max_lag_ms: f64,
    /// p50, p90, p99, p99.9, max (ms) of the jobs started in the interval.
    lat: [f64; 5],
    db: Snap,
    deleted: i64,
    hot_pct: f64,
    vacuums: u64,
    db_errors: u64,
}

const MIB: f64 = 1024.0 * 1024.0;

const CSV_HEADER: &str = "t_s,sent_per_s,started_per_s,behind,max_lag_ms,p50_ms,p99_ms,p999_ms,max_ms,todo,doing,finished,dead_tuples,live_tuples,deleted,hot_pct,table_mb,index_mb,due_idx_kb,vacuums,autovacuums";

/// `v` with `prec` decimals, or `none` when it is not a number (no job started, no update).
fn fmt_num(v: f64, prec: usize, none: &str) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        none.to_owned()
    }
}

impl Tick {
    /// The interval's figures, named, as text: latencies with `lat` decimals and sizes in MiB
    /// with `mb` decimals, a missing figure as `none`.
    fn fields(&self, lat: usize, mb: usize, none: &str) -> Vec<(&'static str, String)> {
        let n = |v: f64, p: usize| fmt_num(v, p, none);
        vec![
            ("t_s", format!("{:.0}", self.t_s)),
            ("sent_per_s", format!("{:.1}", self.sent_per_s)),
            ("started_per_s", format!("{:.1}", self.started_per_s)),
            ("behind", self.behind.to_string()),
            ("max_lag_ms", format!("{:.1}", self.max_lag_ms)),
            ("p50_ms", n(self.lat[0], lat)),
            ("p99_ms", n(self.lat[2], lat)),
            ("p999_ms", n(self.lat[3], lat)),
            ("max_ms", n(self.lat[4], lat)),
            ("todo", self.db.todo.to_string()),
            ("doing", self.db.doing.to_string()),
            ("finished", self.db.finished.to_string()),
            ("dead_tuples", self.db.dead.to_string()),
            ("live_tuples", self.db.live.to_string()),
            ("deleted", self.deleted.to_string()),
            ("hot_pct", n(self.hot_pct, 1)),
            ("table_mb", format!("{:.mb$}", self.db.table as f64 / MIB)),
            ("index_mb", format!("{:.mb$}", self.db.indexes as f64 / MIB)),
            ("due_idx_kb", (self.db.due_idx / 1024).to_string()),
            ("vacuums", self.vacuums.to_string()),
            ("autovacuums", self.db.autovacuums.to_string()),
            ("db_errors", self.db_errors.to_string()),
        ]
    }

    fn json(&self) -> String {
        let fields: Vec<String> = self
            .fields(2, 2, "null")
            .into_iter()
            .map(|(k, v)| format!("\"{k}\": {v}"))
            .collect();
        format!("{{\"what\": \"soak\", {}}}", fields.join(", "))
    }

    /// The CSV row (the columns of `CSV_HEADER`: every field but `db_errors`).
    fn csv(&self) -> String {
        let fields: Vec<String> = self
            .fields(3, 3, "")
            .into_iter()
            .filter(|(k, _)| *k != "db_errors")
            .map(|(_, v)| v)
            .collect();
        format!("{}\n", fields.join(","))
    }
}

/// Runs the soak on the bench database at `url`.
pub fn run(url: &str) {
    let o = opts();
    let seconds = o.seconds.unwrap_or(1200.0);
    let interval = o.interval.unwrap_or(60.0);
    assert!(
        seconds > 0.0 && interval > 0.0,
        "--seconds and --interval must be positive"
    );
    let app = App::builder(url)
        .pool_size(o.senders.max(o.capacity_senders).max(1) as u32 + 2)
        .build()
        .unwrap();
    apply_table_options(&app, &o);
    let mut c = app.connection().unwrap();
    c.set_io_timeout(Duration::from_secs(600));
    let (rate, load, cap) = match o.rates.first() {
        Some(&r) => (r, None, None),
        None => {
            let load = o.load.first().copied().unwrap_or(0.5);
            let cap = capacity(&app, &o);
            ((load * cap).round().max(1.0), Some(load), Some(cap))
        }
    };
    let retention = Retention::new(o.retain).interval(o.prune_every);
    let vacuum = if o.no_vacuum {
        Vacuum::off()
    } else {
        Vacuum::default()
    };
    let server = c
        .query_one(
            "SELECT current_setting('server_version'), current_setting('autovacuum'),
                    current_setting('autovacuum_naptime'),
                    (SELECT coalesce(array_to_string(reloptions, ','), '')
                       FROM pg_class WHERE oid = 'postpone_jobs'::regclass)",
            &[],
        )
        .unwrap();
    let (version, autovacuum, naptime, reloptions): (String, String, String, String) =
        (server.get(0), server.get(1), server.get(2), server.get(3));
    let opt = |v: Option<f64>, p: usize| v.map_or("null".into(), |v| format!("{v:.p$}"));
    println!(
        "{{\"what\": \"soak_settings\", \"rate\": {rate:.0}, \"load\": {}, \"capacity_jobs_per_s\": {}, \"seconds\": {seconds}, \"interval\": {interval}, \"concurrency\": {}, \"senders\": {}, \"retention\": \"{retention:?}\", \"vacuum\": \"{vacuum:?}\", \"server\": \"PostgreSQL {version}\", \"autovacuum\": \"{autovacuum}\", \"autovacuum_naptime\": \"{naptime}\", \"table_options\": \"{reloptions}\"}}",
        opt(load, 2),
        opt(cap, 1),
        o.concurrency,
        o.senders,
    );

    truncate(&app);
    c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    let lat = Latencies::default();
    let h = Worker::builder(&app, lat.tasks())
        .outcomes_ride_claims(crate::common::ride())
        .concurrency(o.concurrency)
        .retention(retention.clone())
        .vacuum(vacuum.clone())
        .spawn()
        .unwrap();
    let mut csv = o.csv.as_ref().map(|path| {
        let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("creating {path}: {e}"));
        writeln!(f, "{CSV_HEADER}").unwrap();
        f
    });
    thread::sleep(Duration::from_millis(300));
    let mut prev = snap(&mut c);
    let vac0 = h.stats().vacuums;
    let s = Schedule::starting_soon(rate, seconds);
    let counters = Arc::new(SendCounters::default());
    let senders = spawn_senders(&app, s, o.senders, &counters, None);
    let step = (interval * 1e6) as i64;
    let (mut prev_t, mut prev_sent, mut prev_behind) = (s.t0, 0u64, 0u64);
    let mut ticks = Vec::new();
    for k in 1.. {
        let boundary = (s.t0 + k * step).min(s.end);
        sleep_until_us(boundary);
        let started = lat.take();
        let now = now_us();
        let sent = counters.sent.load(Ordering::Relaxed);
        let behind = counters.behind.load(Ordering::Relaxed);
        let max_lag = counters.max_lag_us.swap(0, Ordering::Relaxed);
        let stats = h.stats();
        let db = snap(&mut c);
        let dt = (now - prev_t) as f64 / 1e6;
        let upd = db.upd - prev.upd;
        let tick = Tick {
            t_s: (boundary - s.t0) as f64 / 1e6,
            sent_per_s: (sent - prev_sent) as f64 / dt,
            started_per_s: started.len() as f64 / dt,
            behind: behind - prev_behind,
            max_lag_ms: max_lag as f64 / 1000.0,
            lat: percentiles_ms(started),
            db,
            deleted: db.del - prev.del,
            hot_pct: if upd > 0 {
                (db.hot_upd - prev.hot_upd) as f64 * 100.0 / upd as f64
            } else {
                f64::NAN
            },
            vacuums: stats.vacuums - vac0,
            db_errors: stats.db_errors,
        };
        println!("{}", tick.json());
        if let Some(f) = csv.as_mut() {
            f.write_all(tick.csv().as_bytes()).unwrap();
            f.flush().unwrap();
        }
        ticks.push(tick);
        (prev_t, prev_sent, prev_behind, prev) = (now, sent, behind, db);
        if boundary >= s.end {
            break;
        }
    }
    for t in senders {
        t.join().unwrap();
    }
    stop(h);
    drop(c);
    let setup = Setup {
        rate,
        load,
        cap,
        seconds,
        interval,
        retention,
        vacuum,
    };
    summary(&ticks, &setup, &o);
    if let Some(path) = &o.csv {
        println!("wrote {path}");
    }
}

/// One figure of an interval, for the summary.
type Figure = fn(&Tick) -> f64;

/// How the soak ran, for its summary.
struct Setup {
    rate: f64,
    load: Option<f64>,
    cap: Option<f64>,
    seconds: f64,
    interval: f64,
    retention: Retention,
    vacuum: Vacuum,
}

fn summary(ticks: &[Tick], s: &Setup, o: &crate::openloop::Opts) {
    let Setup {
        rate,
        load,
        cap,
        seconds,
        interval,
        retention,
        vacuum,
    } = s;
    let how = match (load, cap) {
        (Some(l), Some(c)) => format!("{l} of a measured capacity of {c:.0} jobs/s"),
        _ => "--rates".into(),
    };
    println!(
        "\nsoak: {rate:.0} jobs/s ({how}) for {seconds} s, worker concurrency {}, {} senders\n  retention: {retention:?}\n  worker vacuum: {vacuum:?}",
        o.concurrency, o.senders
    );
    println!(
        "{:>6} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>6} {:>5} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>4} {:>4}",
        "t_s", "sent/s", "start/s", "behind", "p50", "p99", "p99.9", "todo", "doing", "finished",
        "dead", "live", "tbl_MiB", "idx_MiB", "due_kB", "vac", "avac"
    );
    for t in ticks {
        let n = |v: f64| fmt_num(v, 2, "-");
        println!(
            "{:>6.0} {:>8.1} {:>8.1} {:>6} {:>8} {:>8} {:>8} {:>6} {:>5} {:>8} {:>8} {:>8} {:>7.2} {:>7.2} {:>7} {:>4} {:>4}",
            t.t_s,
            t.sent_per_s,
            t.started_per_s,
            t.behind,
            n(t.lat[0]),
            n(t.lat[2]),
            n(t.lat[3]),
            t.db.todo,
            t.db.doing,
            t.db.finished,
            t.db.dead,
            t.db.live,
            t.db.table as f64 / MIB,
            t.db.indexes as f64 / MIB,
            t.db.due_idx / 1024,
            t.vacuums,
            t.db.autovacuums
        );
    }
    // Intervals that started once the oldest finished jobs were being pruned.
    let warm = (o.retain + o.prune_every).as_secs_f64();
    let mut settled: Vec<&Tick> = ticks.iter().filter(|t| t.t_s - interval >= warm).collect();
    let mut from = format!("those starting at {warm:.0} s or later");
    if settled.is_empty() {
        settled = ticks.iter().collect();
        from = "every one (none started after the retention window had filled)".into();
    }
    let mut out = format!(
        "\nover {} interval(s): {from}\n{:<22} {:>12} {:>12} {:>12}\n",
        settled.len(),
        "",
        "min",
        "median",
        "max"
    );
    let cols: [(&str, Figure); 10] = [
        ("started jobs/s", |t| t.started_per_s),
        ("p50 ms", |t| t.lat[0]),
        ("p99 ms", |t| t.lat[2]),
        ("p99.9 ms", |t| t.lat[3]),
        ("finished rows", |t| t.db.finished as f64),
        ("dead tuples", |t| t.db.dead as f64),
        ("table MiB", |t| t.db.table as f64 / MIB),
        ("indexes MiB", |t| t.db.indexes as f64 / MIB),
        ("due index kB", |t| t.db.due_idx as f64 / 1024.0),
        ("hot updates %", |t| t.hot_pct),
    ];
    for (name, f) in cols {
        let v: Vec<f64> = settled
            .iter()
            .map(|t| f(t))
            .filter(|v| v.is_finite())
            .collect();
        if v.is_empty() {
            continue;
        }
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        writeln!(
            out,
            "{name:<22} {min:>12.2} {:>12.2} {max:>12.2}",
            median(&v)
        )
        .unwrap();
    }
    print!("{out}");
}
