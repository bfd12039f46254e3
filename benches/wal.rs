//! Where the WAL of a job goes: defers `--n` jobs in batches of 1,000 (fewer for large
//! arguments: at most 4 MiB a batch), drains them with one worker of `--c` threads, and
//! prints one JSON line with the WAL positions around each phase, the database's oid, its
//! relations by file node and, when the server has `pg_stat_statements` loaded, the WAL each
//! statement wrote. `benches/wal.py` runs this on a cluster of its own and breaks the WAL
//! down with `pg_waldump` (see docs/wal.md).
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:PORT/postgres \
//!     cargo bench --bench wal -- --n 30000 --c 4 [--delete] [--args-kb 4] [--output-kb 1]
//! ```
//!
//! `--rounds R` runs R - 1 rounds of the same defer and drain first, each followed by a
//! VACUUM, and measures the last (a table that holds finished jobs and free space).
//! `--sleep-ms MS` makes each job run that long (a job that runs longer than 5 ms has its
//! start written on its own, before its outcome). `--hook CMD` runs `CMD start` right
//! before the drain and `CMD stop` right after it. `--setup SQL` runs SQL after the migrations (an experiment: `ALTER TABLE postpone_jobs SET
//! (fillfactor = 50)`, say). `--no-checkpoint` skips the CHECKPOINT before the defers (by default the run starts right
//! after one, so that every run pays the same full-page images); `--checkpoint-between`
//! takes one between the defers and the drain as well (the drain then pays the first touch of
//! every page it changes, as it would on a server that checkpointed meanwhile).
mod common;

use std::time::{Duration, Instant};

use postpone::{App, Job, NewJob, TaskError, Tasks, Worker, WorkerHandle};
use serde_json::json;

fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

fn num(name: &str, default: usize) -> usize {
    let argv: Vec<String> = std::env::args().collect();
    argv.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].parse().unwrap_or_else(|_| panic!("{name} N")))
        .unwrap_or(default)
}

/// The whole cluster's CPU seconds (the postmaster with its reaped children, and every live
/// child: backends, autovacuum, checkpointer, WAL writer...), as benches/costs.py reads it;
/// None when its data directory cannot be read from here.
fn cluster_cpu(data_dir: &str) -> Option<f64> {
    let pid_file = std::fs::read_to_string(format!("{data_dir}/postmaster.pid")).ok()?;
    let pm: u32 = pid_file.lines().next()?.trim().parse().ok()?;
    // USER_HZ, 100 on Linux.
    let tck = 100.0;
    let stat = |pid: &str| -> Option<(u32, f64)> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
        let ppid: u32 = rest[1].parse().ok()?;
        let t: f64 = rest[11..15]
            .iter()
            .map(|v| v.parse::<f64>().unwrap_or(0.0))
            .sum();
        Some((ppid, t / tck))
    };
    let mut total = stat(&pm.to_string())?.1;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.bytes().all(|b| b.is_ascii_digit()) {
            if let Some((ppid, t)) = stat(&name) {
                if ppid == pm {
                    total += t;
                }
            }
        }
    }
    Some(total)
}

/// Defers `n` jobs with arguments `args`, in batches of 1,000 (of at most 4 MiB of
/// arguments: a batch of 1,000 jobs of 64 KiB outlasted the 10-s `io_timeout` on a loaded
/// machine).
fn defer(app: &App, n: usize, args: &serde_json::Value) {
    let size = args.to_string().len().max(1);
    let batch = (4 * 1024 * 1024 / size).clamp(1, 1000);
    let mut left = n;
    while left > 0 {
        let k = left.min(batch);
        let batch: Vec<NewJob> = (0..k).map(|_| NewJob::new("noop", args).unwrap()).collect();
        app.defer_batch(&batch).unwrap();
        left -= k;
    }
}

/// The bench's one task: sleeps `--sleep-ms`, reads its arguments, sets its output.
fn tasks(args_kb: usize, output_kb: usize) -> Tasks {
    let output = (output_kb > 0).then(|| json!({ "out": common::pad(output_kb * 1024) }));
    let mut tasks = Tasks::new();
    let sleep = Duration::from_millis(num("--sleep-ms", 0) as u64);
    tasks.register("noop", move |job: &Job| -> Result<(), TaskError> {
        if !sleep.is_zero() {
            std::thread::sleep(sleep);
        }
        if args_kb > 0 {
            let _: serde::de::IgnoredAny = job.args()?;
        }
        if let Some(o) = &output {
            job.set_output(o)?;
        }
        Ok(())
    });
    tasks
}

/// Spawns a worker of `c` threads and returns its handle once it has recorded `n` outcomes
/// and the database shows no job waiting or running.
fn drain(
    app: &App,
    sql: &mut postgres::Client,
    n: usize,
    c: usize,
    delete: bool,
    kb: (usize, usize),
) -> WorkerHandle {
    let mut b = Worker::builder(app, tasks(kb.0, kb.1))
        .concurrency(c)
        .claim_in_outcome_transaction(crate::common::one_write());
    if delete {
        b = b.delete_finished(postpone::DeleteJobs::Always);
    }
    let h = b.spawn().unwrap();
    // The worker's own count of outcomes recorded (no query, so that the server's CPU is
    // the jobs'), then the database's word.
    while h.stats().recorded < n as u64 {
        std::thread::sleep(Duration::from_millis(2));
    }
    loop {
        let left: i64 = sql
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status IN ('todo', 'doing')",
                &[],
            )
            .unwrap()
            .get(0);
        if left == 0 {
            return h;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lsn(sql: &mut postgres::Client) -> String {
    sql.query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .unwrap()
        .get(0)
}

fn main() {
    let n = num("--n", 30000);
    let c = num("--c", 4);
    let delete = flag("--delete");
    let (args_kb, output_kb) = common::job_sizes();
    let argv: Vec<String> = std::env::args().collect();
    let db = common::BenchDb::create("postpone_wal");
    let mut sql = postgres::Client::connect(&db.url(), postgres::NoTls).expect("connect");
    let url = {
        // The bench database on DATABASE_URL's server.
        let base = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let (head, query) = match base.split_once('?') {
            Some((h, q)) => (h.to_owned(), format!("?{q}")),
            None => (base.clone(), String::new()),
        };
        let head = match head.rfind('/') {
            Some(i) if i > "postgres://".len() => head[..i].to_owned(),
            _ => head,
        };
        format!("{head}/{}{query}", db.name)
    };
    let app = App::builder(&url).build().expect("connect");
    app.migrate().expect("migrate");
    // The WAL of each statement, where the server has pg_stat_statements loaded.
    let stmts = sql
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .and_then(|_| sql.batch_execute("SELECT pg_stat_statements_reset()"))
        .is_ok();
    // `--setup SQL`: run after the migrations (an experiment's ALTER TABLE, say).
    if let Some(w) = argv.windows(2).find(|w| w[0] == "--setup") {
        sql.batch_execute(&w[1]).expect("--setup");
    }
    sql.batch_execute("VACUUM ANALYZE").unwrap();
    let args = common::job_args(args_kb);
    // `--rounds R`: R - 1 rounds of the same defer and drain first, each followed by a VACUUM
    // (the table then holds their finished jobs, and the free space they left, as a table in
    // use does); the last round is measured.
    for _ in 1..num("--rounds", 1) {
        defer(&app, n, &args);
        drain(&app, &mut sql, n, c, delete, (args_kb, output_kb)).shutdown(Duration::from_secs(10));
        sql.batch_execute("VACUUM postpone_jobs").unwrap();
    }
    if !flag("--no-checkpoint") {
        sql.batch_execute("CHECKPOINT").unwrap();
    }
    if stmts {
        sql.batch_execute("SELECT pg_stat_statements_reset()")
            .unwrap();
    }
    let data_dir: String = sql.query_one("SHOW data_directory", &[]).unwrap().get(0);

    let cpu0 = cluster_cpu(&data_dir);
    let lsn0 = lsn(&mut sql);
    let t = Instant::now();
    defer(&app, n, &args);
    let defer_s = t.elapsed().as_secs_f64();
    let lsn1 = lsn(&mut sql);
    let cpu1 = cluster_cpu(&data_dir);
    if flag("--checkpoint-between") {
        sql.batch_execute("CHECKPOINT").unwrap();
    }
    let lsn1b = lsn(&mut sql);

    // `--hook CMD`: `CMD start` runs right before the drain, `CMD stop` right after it (to
    // profile the server during the drain only, say).
    let hook = argv
        .windows(2)
        .find(|w| w[0] == "--hook")
        .map(|w| w[1].clone());
    let run_hook = |what: &str| {
        if let Some(cmd) = &hook {
            let ok = std::process::Command::new("sh")
                .args(["-c", &format!("{cmd} {what}")])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "--hook {cmd} {what} failed");
        }
    };
    run_hook("start");
    let cpu1b = cluster_cpu(&data_dir);
    let t = Instant::now();
    let h = drain(&app, &mut sql, n, c, delete, (args_kb, output_kb));
    let drain_s = t.elapsed().as_secs_f64();
    let lsn2 = lsn(&mut sql);
    let cpu2 = cluster_cpu(&data_dir);
    run_hook("stop");
    let stats = h.stats();
    let report = h.shutdown(Duration::from_secs(10));
    assert!(report.is_clean(), "{report:?}");

    let oid: u32 = sql
        .query_one(
            "SELECT oid FROM pg_database WHERE datname = current_database()",
            &[],
        )
        .unwrap()
        .get(0);
    let mut rels = serde_json::Map::new();
    for r in sql
        .query(
            "SELECT pg_relation_filenode(c.oid)::text, c.relname
               FROM pg_class c
              WHERE pg_relation_filenode(c.oid) IS NOT NULL
                AND c.relnamespace NOT IN ('pg_catalog'::regnamespace,
                                           'information_schema'::regnamespace)",
            &[],
        )
        .unwrap()
    {
        let node: String = r.get(0);
        let name: String = r.get(1);
        rels.insert(node, json!(name));
    }
    // The toast tables' names say whose they are.
    for r in sql
        .query(
            "SELECT pg_relation_filenode(t.oid)::text, c.relname || ' (toast)'
               FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid
              WHERE c.relnamespace = 'public'::regnamespace
             UNION ALL
             SELECT pg_relation_filenode(i.indexrelid)::text, c.relname || ' (toast index)'
               FROM pg_class c JOIN pg_index i ON i.indrelid = c.reltoastrelid
              WHERE c.relnamespace = 'public'::regnamespace",
            &[],
        )
        .unwrap()
    {
        let node: String = r.get(0);
        let name: String = r.get(1);
        rels.insert(node, json!(name));
    }
    let (heap_kb, index_kb): (i64, i64) = {
        let r = sql
            .query_one(
                "SELECT (pg_table_size('postpone_jobs') / 1024)::bigint,
                        (pg_indexes_size('postpone_jobs') / 1024)::bigint",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let mut statements = Vec::new();
    if stmts {
        for r in sql
            .query(
                "SELECT toplevel, calls, rows, wal_bytes::bigint, wal_records, wal_fpi,
                        total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
                   FROM pg_stat_statements
                  WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND (wal_bytes > 0 OR total_exec_time > 1)
                  ORDER BY wal_bytes DESC, total_exec_time DESC LIMIT 60",
                &[],
            )
            .unwrap()
        {
            statements.push(json!({
                "toplevel": r.get::<_, bool>(0),
                "calls": r.get::<_, i64>(1),
                "rows": r.get::<_, i64>(2),
                "wal_bytes": r.get::<_, i64>(3),
                "wal_records": r.get::<_, i64>(4),
                "wal_fpi": r.get::<_, i64>(5),
                "exec_ms": r.get::<_, f64>(6),
                "query": r.get::<_, String>(7),
            }));
        }
    }
    let out = json!({
        "what": "wal",
        "n": n, "c": c, "delete": delete, "args_kb": args_kb, "output_kb": output_kb,
        "db": db.name, "db_oid": oid, "data_directory": data_dir,
        "lsn0": lsn0, "lsn1": lsn1, "lsn1b": lsn1b, "lsn2": lsn2,
        "defer_s": defer_s,
        "defer_server_cpu_s": cpu0.zip(cpu1).map(|(a, b)| b - a),
        "drain_server_cpu_s": cpu1b.zip(cpu2).map(|(a, b)| b - a), "drain_s": drain_s,
        "claims": stats.claims, "recorded": stats.recorded,
        "outcomes_on_claims": stats.outcomes_on_claims,
        "jobs_table_kb": heap_kb, "jobs_indexes_kb": index_kb,
        "relations": rels,
        "statements": statements,
    });
    println!("{out}");
    drop(sql);
}
