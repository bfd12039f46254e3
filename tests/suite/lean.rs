//! Schema version 12 ("lean"): the claim returns each job's attempt limit, the claim
//! statement looks for the next due job once per claim, the hot functions are planned once
//! per session, and the queueing-lock index holds only jobs that have a queueing lock.
//! Workers of version 11, still running during an upgrade, keep working. And version 13: the
//! recording waits at most 200 ms for a job row another session holds locked.

use crate::support;
use crate::worker_util;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use postpone::{ErrorKind, Job, NewJob, Tasks, WorkerHandle};
use support::{wait_until, TestDb};
use worker_util::*;

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

/// The recording statement a worker of version 11 sends (its `JOB_FINISH_BATCH`).
const V11_FINISH: &str = include_str!("lean_v11_finish.sql");

#[test]
fn a_version_11_worker_keeps_claiming_and_recording_after_the_upgrade() {
    support::init_logging();
    let db = TestDb::new();
    let mut old = db.client();
    let migrations = [
        include_str!("../../src/schema/0001_init.sql"),
        include_str!("../../src/schema/0002_integrity.sql"),
        include_str!("../../src/schema/0003_claim.sql"),
        include_str!("../../src/schema/0004_results.sql"),
        include_str!("../../src/schema/0005_flow.sql"),
        include_str!("../../src/schema/0006_unique.sql"),
        include_str!("../../src/schema/0007_limits.sql"),
        include_str!("../../src/schema/0008_rates.sql"),
        include_str!("../../src/schema/0009_due.sql"),
        include_str!("../../src/schema/0010_quiet.sql"),
        include_str!("../../src/schema/0011_parked.sql"),
    ];
    for sql in migrations {
        old.batch_execute(sql).unwrap();
    }
    old.batch_execute(
        "CREATE TABLE postpone_migrations (
             version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO postpone_migrations (version, name)
              SELECT g, 'v' || g FROM generate_series(1, 11) g;
         INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES (900, 'old-v11', now());
         INSERT INTO postpone_jobs (queue, task, args, max_attempts, queueing_lock)
              SELECT 'default', 'work', to_jsonb(g), CASE WHEN g % 2 = 0 THEN 7 END,
                     CASE WHEN g = 1 THEN 'only-one' END
                FROM generate_series(1, 6) g;",
    )
    .unwrap();
    // The old worker is running two jobs when the upgrade happens.
    let running: Vec<(i64, i32)> = old
        .query(
            "SELECT id, attempts FROM postpone_claim(900, 2, NULL, NULL)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(running.len(), 2);

    let app = app_at(&db.url(), Duration::from_secs(5));
    // Every later migration is applied (versions after 17 add what this test does not use).
    let applied = app.migrate().unwrap();
    assert_eq!(applied[..6], [12, 13, 14, 15, 16, 17], "{applied:?}");
    assert_eq!(
        applied.last(),
        Some(&postpone::SCHEMA_VERSION),
        "{applied:?}"
    );

    // Its recording statement still records, and its claim still returns its ten columns.
    let ids: Vec<i64> = running.iter().map(|r| r.0).collect();
    let attempts: Vec<i32> = running.iter().map(|r| r.1).collect();
    let recorded = old
        .query(
            V11_FINISH,
            &[
                &ids,
                &vec![900i64; 2],
                &attempts,
                &vec!["succeeded"; 2],
                &vec![None::<String>; 2],
                &vec![None::<serde_json::Value>; 2],
            ],
        )
        .unwrap();
    assert_eq!(recorded.len(), 2);
    let rows = old
        .query("SELECT * FROM postpone_claim(900, 10, NULL, NULL)", &[])
        .unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0].columns().len(), 10);
    let statuses: Vec<String> = old
        .query("SELECT status FROM postpone_jobs ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        statuses,
        ["succeeded", "succeeded", "doing", "doing", "doing", "doing"]
    );

    // The new claim gives each job's own attempt limit.
    old.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, max_attempts)
              VALUES ('default', 'work', '7', 3), ('default', 'work', '8', NULL)",
    )
    .unwrap();
    let limits: Vec<(i64, Option<i32>)> = old
        .query(
            "SELECT id, max_attempts FROM postpone_claim_jobs(900, 10, NULL, NULL) ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(limits.len(), 2);
    assert_eq!(limits[0].1, Some(3));
    assert_eq!(limits[1].1, None);

    // The claim's UPDATE and the recording (every overload: schema 20 added one) are planned
    // once per session.
    let (all, generic): (i64, i64) = {
        let r = old
            .query_one(
                "SELECT count(*),
                        count(*) FILTER (WHERE 'plan_cache_mode=force_generic_plan'
                                               = ANY(coalesce(proconfig, '{}')))
                   FROM pg_proc WHERE proname IN ('postpone_take', 'postpone_finish')",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(all >= 2, "{all}");
    assert_eq!(generic, all);
}

/// A recording planned once per session must not depend on the statistics it was planned
/// with: a session that first recorded outcomes while the table was nearly empty still
/// reaches each job by its id once the table has grown (a plan made then walked the whole
/// primary key at every recording).
#[test]
fn a_recording_planned_on_an_empty_table_still_reads_only_its_jobs() {
    let (db, _app) = setup();
    let mut admin = db.client();
    let worker: i64 = admin
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat)
             VALUES ('by hand', now() + interval '1 day') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    admin.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    let mut session = db.client();
    let claim_and_record = |c: &mut postgres::Client| -> u64 {
        c.batch_execute("INSERT INTO postpone_jobs (queue, task, args) VALUES ('q', 'work', '1'), ('q', 'work', '2')")
            .unwrap();
        let rows = c
            .query(
                "SELECT id, attempts FROM postpone_claim_jobs($1, 2, ARRAY['q'], NULL)",
                &[&worker],
            )
            .unwrap();
        assert_eq!(rows.len(), 2);
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let attempts: Vec<i32> = rows.iter().map(|r| r.get(1)).collect();
        let n = ids.len();
        c.query(
            "SELECT * FROM postpone_finish($1, $2, $3, $4, $5, $6)",
            &[
                &ids,
                &vec![worker; n],
                &attempts,
                &vec!["succeeded"; n],
                &vec![None::<String>; n],
                &vec![None::<serde_json::Value>; n],
            ],
        )
        .unwrap()
        .len() as u64
    };
    // Five recordings: PostgreSQL's plan cache has made its plan by then.
    for _ in 0..5 {
        assert_eq!(claim_and_record(&mut session), 2);
    }
    admin
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
             SELECT 'q', 'work', to_jsonb(g), 'succeeded', now()
               FROM generate_series(1, 20000) g",
        )
        .unwrap();
    let reads = |c: &mut postgres::Client| -> i64 {
        c.query_one(
            "SELECT pg_stat_clear_snapshot()::text,
                    (SELECT idx_tup_read FROM pg_stat_user_indexes
                      WHERE indexrelname = 'postpone_jobs_pkey')",
            &[],
        )
        .unwrap()
        .get(1)
    };
    // A session sends its counters when it goes idle, at most once a second: the same
    // session (its plans cached) goes on after each pause.
    let flush = |c: &mut postgres::Client| {
        thread::sleep(Duration::from_millis(1100));
        c.batch_execute("SELECT 1").unwrap();
        thread::sleep(Duration::from_millis(100));
    };
    flush(&mut session);
    let mut before = 0;
    wait_until(Duration::from_secs(5), || {
        before = reads(&mut admin);
        before > 0
    });
    assert_eq!(claim_and_record(&mut session), 2);
    flush(&mut session);
    let mut after = before;
    wait_until(Duration::from_secs(5), || {
        after = reads(&mut admin);
        after > before
    });
    println!(
        "  primary-key entries read by a claim and a recording of 2 jobs: {}",
        after - before
    );
    assert!(
        after - before < 100,
        "a claim and a recording of 2 jobs read {} primary-key entries (20,000 rows)",
        after - before
    );
}

/// The claim's statement asks for the next due job once per claim, not once per job it
/// returns (the planner had pulled that look into the join with the claimed rows).
#[test]
fn a_short_claim_looks_for_the_next_due_job_once() {
    let (db, admin_app) = setup();
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET track_functions = 'pl'",
            db.name()
        ))
        .unwrap();
    // A fresh App: its sessions start with track_functions on.
    let app = app_at(&db.url(), Duration::from_secs(5));
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = ran.clone();
    let mut tasks = Tasks::new();
    tasks.register("work", move |_: &Job| {
        seen.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let w = fast_worker(&app, tasks).concurrency(16).spawn().unwrap();
    // Batches of 4 into a worker with 16 free slots: every claim comes back short, most
    // with several jobs.
    for i in 0..25 {
        let jobs: Vec<NewJob> = (0..4)
            .map(|k| NewJob::new("work", &(i * 4 + k)).unwrap())
            .collect();
        admin_app.defer_batch(&jobs).unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    assert!(wait_until(Duration::from_secs(10), || ran
        .load(Ordering::SeqCst)
        == 100));
    stop(w);
    drop(app);
    let mut c = db.client();
    let mut calls = (0i64, 0i64);
    // The worker's sessions report their statistics when they end.
    wait_until(Duration::from_secs(5), || {
        let r = c
            .query_one(
                "SELECT pg_stat_clear_snapshot()::text,
                        coalesce((SELECT sum(calls) FROM pg_stat_user_functions
                                   WHERE funcname = 'postpone_claim_batch'), 0)::bigint,
                        coalesce((SELECT sum(calls) FROM pg_stat_user_functions
                                   WHERE funcname = 'postpone_next_due'), 0)::bigint",
                &[],
            )
            .unwrap();
        calls = (r.get(1), r.get(2));
        calls.0 > 0 && calls.1 > 0
    });
    let (claims, next_due) = calls;
    println!("  {claims} claims, {next_due} looks for the next due job, for 100 jobs");
    assert!(claims > 0, "no claim counted");
    assert!(
        next_due <= claims,
        "{next_due} looks for the next due job in {claims} claims"
    );
}

/// Jobs without a queueing lock leave no entry in its index; the lock is still enforced.
#[test]
fn the_queueing_lock_index_holds_only_jobs_that_have_one() {
    let (db, app) = setup();
    let jobs: Vec<NewJob> = (0..200).map(|i| NewJob::new("work", &i).unwrap()).collect();
    app.defer_batch(&jobs).unwrap();
    app.job("work").queueing_lock("one").defer(&0).unwrap();
    let e = app.job("work").queueing_lock("one").defer(&1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyEnqueued, "{e}");
    let mut c = db.client();
    c.batch_execute("VACUUM postpone_jobs").unwrap();
    let entries: f32 = c
        .query_one(
            "SELECT reltuples FROM pg_class WHERE relname = 'postpone_jobs_queueing_lock_idx'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(entries, 1.0, "index entries of the queueing-lock index");
}

/// A finished job whose row another session holds locked holds up no other outcome: the
/// recording waits at most its lock timeout (`postpone_finish`, schema 13), records the others, and
/// tries that one again until the row is free. (Before, the completer waited for the row,
/// and every outcome after it with it.)
#[test]
fn a_locked_job_row_holds_up_no_other_outcome() {
    let (db, app) = setup();
    let (started_tx, started_rx) = crossbeam_channel::unbounded::<i64>();
    let (gate_tx, gate_rx) = crossbeam_channel::unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks.register("gate", move |job: &Job| {
        let _ = started_tx.send(job.id().get());
        let _ = gate_rx.recv_timeout(Duration::from_secs(20));
        Ok(())
    });
    tasks.register("work", |_: &Job| Ok(()));
    // Outcomes do not ride on claims here: the completer records every one of them.
    let w = fast_worker(&app, tasks)
        .concurrency(2)
        .outcomes_ride_claims(false)
        .spawn()
        .unwrap();
    let gate = app.defer("gate", &()).unwrap();
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        gate.get()
    );
    let mut locker = db.client();
    let mut tx = locker.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM postpone_jobs WHERE id = $1 FOR UPDATE",
        &[&gate.get()],
    )
    .unwrap();
    gate_tx.send(()).unwrap();
    let jobs: Vec<NewJob> = (0..50).map(|i| NewJob::new("work", &i).unwrap()).collect();
    let ids = app.defer_batch(&jobs).unwrap();
    let mut c = db.client();
    let succeeded = |c: &mut postgres::Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1) AND status = 'succeeded'",
            &[&ids.iter().map(|i| i.get()).collect::<Vec<i64>>()],
        )
        .unwrap()
        .get(0)
    };
    let recorded = wait_until(Duration::from_secs(10), || succeeded(&mut c) == 50);
    let status: String = tx
        .query_one(
            "SELECT status FROM postpone_jobs WHERE id = $1",
            &[&gate.get()],
        )
        .unwrap()
        .get(0);
    assert!(
        recorded,
        "{} of 50 outcomes recorded while one finished job's row was locked",
        succeeded(&mut c)
    );
    assert_eq!(
        status, "doing",
        "the locked job's outcome waits for its row"
    );
    tx.rollback().unwrap();
    wait_status(&db, gate, "succeeded", Duration::from_secs(10));
    stop(w);
}
