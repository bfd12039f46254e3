//! Jobs written once, with their outcome, in their claim's transaction
//! (`WorkerBuilder::claim_in_outcome_transaction`): every job still runs once and ends
//! `succeeded` with one attempt, its row updated once; connections reset, sessions ended by
//! the server and half-open links lose none; a shutdown returns in time holding none; jobs
//! with a `lock` are claimed as before; and a claim the server lost keeps its jobs from other
//! claims until its worker writes them, or the rescue requeues them with an attempt counted.

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use postpone::{App, JobId, NewJob};
use worker_util::*;

fn defer_n(app: &App, n: usize) -> Vec<JobId> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("ok", &serde_json::json!({ "i": i })).unwrap())
        .collect();
    jobs.chunks(500)
        .flat_map(|c| app.defer_batch(c).unwrap())
        .collect()
}

fn count(db: &support::TestDb, sql: &str) -> i64 {
    db.client().query_one(sql, &[]).unwrap().get(0)
}

fn succeeded(db: &support::TestDb) -> i64 {
    count(
        db,
        "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
    )
}

fn wait_succeeded(db: &support::TestDb, n: usize) {
    let done = support::wait_until(Duration::from_secs(60), || succeeded(db) == n as i64);
    assert!(done, "{} of {n} jobs succeeded after 60 s", succeeded(db));
}

fn assert_ran_once(runs: &Mutex<HashMap<i64, usize>>, ids: &[JobId]) {
    let runs = runs.lock().unwrap();
    for id in ids {
        assert_eq!(runs.get(&id.0), Some(&1), "job {id} ran once");
    }
}

/// Every job `succeeded` with one attempt counted, a worker and a start and end time.
fn assert_all_done_once(db: &support::TestDb, n: usize) {
    let bad = count(
        db,
        "SELECT count(*) FROM postpone_jobs
          WHERE status <> 'succeeded' OR attempts <> 1 OR worker_id IS NULL
             OR started_at IS NULL OR finished_at IS NULL OR started_at > finished_at",
    );
    assert_eq!(bad, 0, "jobs not succeeded once, with their times");
    assert_eq!(succeeded(db), n as i64);
}

/// A count of postpone_jobs' rows the server keeps (`n_tup_upd`, `n_tup_del`), once its
/// sessions reported theirs.
fn rows_counted(db: &support::TestDb, column: &str) -> i64 {
    let mut last = -1;
    // Sessions report their counts when idle, at most once a second.
    for _ in 0..30 {
        let now = count(
            db,
            &format!(
                "SELECT coalesce({column}, 0) FROM pg_stat_user_tables
                  WHERE relname = 'postpone_jobs' AND schemaname = current_schema()"
            ),
        );
        if now == last {
            return now;
        }
        last = now;
        std::thread::sleep(Duration::from_millis(1200));
    }
    last
}

/// The row updates of postpone_jobs the server counted.
fn row_updates(db: &support::TestDb) -> i64 {
    rows_counted(db, "n_tup_upd")
}

#[test]
fn a_drain_writes_each_job_once_and_runs_each_once() {
    let (db, app) = setup();
    let n = 3000;
    let ids = defer_n(&app, n);
    let before = row_updates(&db);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    wait_succeeded(&db, n);
    assert_ran_once(&runs, &ids);
    let stats = stats_once_recorded(&w, n as u64);
    w.shutdown(Duration::from_secs(5));
    assert_all_done_once(&db, n);
    // Most jobs end within their claim's transaction; the others (running or waiting when
    // it committed) are written twice, as without this mode.
    assert!(
        stats.written_once >= n as u64 / 2,
        "{} of {n} jobs written once: {stats:?}",
        stats.written_once
    );
    let updates = row_updates(&db) - before;
    let twice = n as i64 - stats.written_once as i64;
    assert!(
        updates <= n as i64 + twice + n as i64 / 10,
        "{updates} row updates for {n} jobs, {} of them written once",
        stats.written_once
    );
    // The statistics count each job once.
    let counted = count(
        &db,
        "SELECT coalesce(sum(jobs), 0)::bigint FROM postpone_stats
          WHERE span = 'hour' AND outcome = 'succeeded'",
    );
    assert_eq!(counted, n as i64);
}

/// The row deletes of postpone_jobs the server counted.
fn row_deletes(db: &support::TestDb) -> i64 {
    rows_counted(db, "n_tup_del")
}

/// A worker that deletes the jobs that succeed deletes each in its claim's transaction,
/// never writing it first: each job runs once, is deleted once and is counted once in the
/// statistics, with its wait.
#[test]
fn a_drain_that_deletes_what_succeeds_deletes_each_job_once() {
    let (db, app) = setup();
    let n = 3000;
    let ids = defer_n(&app, n);
    let (updates0, deletes0) = (row_updates(&db), row_deletes(&db));
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .delete_finished(postpone::DeleteJobs::Successful)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    let gone = support::wait_until(Duration::from_secs(60), || {
        count(&db, "SELECT count(*) FROM postpone_jobs") == 0
    });
    assert!(
        gone,
        "{} of {n} jobs left after 60 s",
        count(&db, "SELECT count(*) FROM postpone_jobs")
    );
    assert_ran_once(&runs, &ids);
    let stats = stats_once_recorded(&w, n as u64);
    w.shutdown(Duration::from_secs(5));
    // Written once here means deleted in the claim's transaction, never updated.
    assert!(
        stats.written_once >= n as u64 / 2,
        "{} of {n} jobs deleted in their claim's transaction: {stats:?}",
        stats.written_once
    );
    let twice = n as i64 - stats.written_once as i64;
    let updates = row_updates(&db) - updates0;
    assert!(
        updates <= twice + n as i64 / 10,
        "{updates} row updates for {n} deleted jobs, {} of them deleted at once",
        stats.written_once
    );
    assert_eq!(row_deletes(&db) - deletes0, n as i64);
    // Counted once each, every one with its wait.
    let (jobs, waits): (i64, i64) = {
        let r = db
            .client()
            .query_one(
                "SELECT coalesce(sum(jobs), 0)::bigint,
                        coalesce(sum(w0 + w1 + w2 + w3 + w4 + w5 + w6 + w7 + w8 + w9 + w10 + w11
                                     + w12 + w13 + w14 + w15 + w16 + w17 + w18 + w19 + w20
                                     + w21 + w22 + w23), 0)::bigint
                   FROM postpone_stats WHERE span = 'hour' AND outcome = 'succeeded'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((jobs, waits), (n as i64, n as i64));
}

/// A job others wait for, deleted once it succeeds, is seen to succeed by them (written
/// `succeeded`, then deleted): they run, and every row is gone after.
#[test]
fn a_deleted_job_that_others_wait_for_lets_them_run() {
    let (db, app) = setup();
    let firsts = defer_n(&app, 40);
    let mut thens = Vec::new();
    for a in &firsts {
        thens.push(app.job("ok").after(&[*a]).defer(&()).unwrap());
    }
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .delete_finished(postpone::DeleteJobs::Always)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    let gone = support::wait_until(Duration::from_secs(60), || {
        count(&db, "SELECT count(*) FROM postpone_jobs") == 0
    });
    w.shutdown(Duration::from_secs(5));
    assert!(
        gone,
        "jobs left after 60 s: {:?}",
        db.client()
            .query("SELECT id, status, has_dependents FROM postpone_jobs", &[])
            .unwrap()
            .iter()
            .map(|r| (
                r.get::<_, i64>(0),
                r.get::<_, String>(1),
                r.get::<_, bool>(2)
            ))
            .collect::<Vec<_>>()
    );
    assert_ran_once(&runs, &firsts);
    assert_ran_once(&runs, &thens);
    assert_eq!(count(&db, "SELECT count(*) FROM postpone_deps"), 0);
}

/// Jobs with a `lock` (and others beside them) are claimed and started as without the mode,
/// one at a time per lock, every job once.
#[test]
fn jobs_with_a_lock_beside_others_run_once_each() {
    let (db, app) = setup();
    let mut jobs = Vec::new();
    for i in 0..300 {
        let mut j = NewJob::new("ok", &serde_json::json!({ "i": i })).unwrap();
        if i % 3 == 0 {
            j = j.lock(format!("l{}", i % 4));
        }
        jobs.push(j);
    }
    let ids: Vec<JobId> = jobs
        .chunks(100)
        .flat_map(|c| app.defer_batch(c).unwrap())
        .collect();
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    wait_succeeded(&db, ids.len());
    assert_ran_once(&runs, &ids);
    w.shutdown(Duration::from_secs(5));
    assert_all_done_once(&db, ids.len());
}

/// Every connection reset, again and again, while jobs are only locked: the server rolls
/// their transactions back, the worker writes them again, and no job runs twice (no other
/// claim takes a job of a lost transaction while its worker lives).
#[test]
fn resets_while_jobs_are_only_locked_lose_none_and_run_none_twice() {
    let (db, direct) = setup();
    let proxy = support::FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), Duration::from_secs(2));
    let n = 4000;
    let ids = defer_n(&direct, n);
    let (tasks, runs) = slow_counting_tasks(Duration::from_millis(1));
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .stalled_after(Duration::from_secs(60))
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    let mut resets = 0;
    while succeeded(&db) < n as i64 && resets < 8 {
        std::thread::sleep(Duration::from_millis(150));
        proxy.reset_all();
        resets += 1;
    }
    wait_succeeded(&db, n);
    assert_ran_once(&runs, &ids);
    let stats = stats_once_recorded(&w, n as u64);
    w.shutdown(Duration::from_secs(5));
    assert_all_done_once(&db, n);
    assert!(stats.written_once > 0, "{stats:?}");
    // Nothing is left noted.
    let noted = count(
        &db,
        "SELECT count(*) FROM postpone_workers WHERE postpone_note_lost(claim_xids)",
    );
    assert_eq!(noted, 0);
}

/// The same resets while jobs are only locked, for a worker that deletes what succeeds: a
/// lost transaction's deletions are written again by its id, every job runs once, every row
/// is gone and the statistics count each job once.
#[test]
fn resets_while_jobs_to_delete_are_only_locked_lose_none_and_count_each_once() {
    let (db, direct) = setup();
    let proxy = support::FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), Duration::from_secs(2));
    let n = 4000;
    let ids = defer_n(&direct, n);
    let (tasks, runs) = slow_counting_tasks(Duration::from_millis(1));
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .stalled_after(Duration::from_secs(60))
        .delete_finished(postpone::DeleteJobs::Successful)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    let left = || count(&db, "SELECT count(*) FROM postpone_jobs");
    let mut resets = 0;
    while left() > 0 && resets < 8 {
        std::thread::sleep(Duration::from_millis(150));
        proxy.reset_all();
        resets += 1;
    }
    let gone = support::wait_until(Duration::from_secs(60), || left() == 0);
    assert!(gone, "{} of {n} jobs left after 60 s", left());
    assert_ran_once(&runs, &ids);
    let stats = stats_once_recorded(&w, n as u64);
    w.shutdown(Duration::from_secs(5));
    assert!(stats.written_once > 0, "{stats:?}");
    let counted = count(
        &db,
        "SELECT coalesce(sum(jobs), 0)::bigint FROM postpone_stats
          WHERE span = 'hour' AND outcome = 'succeeded'",
    );
    assert_eq!(counted, n as i64);
    let noted = count(
        &db,
        "SELECT count(*) FROM postpone_workers WHERE postpone_note_lost(claim_xids)",
    );
    assert_eq!(noted, 0);
}

/// The server ends the worker's claiming session while it holds jobs only locked (an
/// operator's pg_terminate_backend): the jobs are written again by their worker, each run
/// once with one attempt.
#[test]
fn a_claiming_session_ended_by_the_server_loses_no_job() {
    let (db, app) = setup();
    let n = 3000;
    let ids = defer_n(&app, n);
    let (tasks, runs) = slow_counting_tasks(Duration::from_millis(1));
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    let mut ended = 0i64;
    let c = db.client();
    let mut c = c;
    for _ in 0..40 {
        if succeeded(&db) >= n as i64 {
            break;
        }
        // Sessions of this database inside a transaction that locked rows: the claims'.
        let k: i64 = c
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()
                    AND state = 'idle in transaction' AND backend_xid IS NOT NULL) t",
                &[],
            )
            .unwrap()
            .get(0);
        ended += k;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ended > 0, "no claiming session was caught holding jobs");
    wait_succeeded(&db, n);
    assert_ran_once(&runs, &ids);
    let stats = stats_once_recorded(&w, n as u64);
    w.shutdown(Duration::from_secs(5));
    assert_all_done_once(&db, n);
    assert!(stats.claims_lost > 0, "{stats:?}");
}

/// Every connection goes half-open while jobs are only locked (no reply ever comes): the
/// worker's deadlines end the stuck round-trips, the session still holding the claim's
/// transaction is ended from a new connection, the jobs are written again, every job runs
/// once, and a shutdown afterwards returns in time.
#[test]
fn half_open_connections_while_jobs_are_only_locked_lose_none() {
    let (db, direct) = setup();
    let proxy = support::FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), Duration::from_secs(1));
    let n = 3000;
    let ids = defer_n(&direct, n);
    let (tasks, runs) = slow_counting_tasks(Duration::from_millis(1));
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .stalled_after(Duration::from_secs(60))
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    let started = support::wait_until(Duration::from_secs(30), || w.stats().written_once > 0);
    assert!(started, "no job written once: {:?}", w.stats());
    proxy.strand_all();
    wait_succeeded(&db, n);
    assert_ran_once(&runs, &ids);
    let report = w.shutdown(Duration::from_secs(2));
    assert!(report.elapsed() < Duration::from_secs(3), "{report}");
    assert_all_done_once(&db, n);
}

/// A shutdown in the middle of a drain returns in time and leaves every job done once or
/// waiting, none held for the stopped worker, none noted.
#[test]
fn a_shutdown_while_jobs_are_only_locked_returns_in_time_and_holds_none() {
    let (db, app) = setup();
    let n = 20_000;
    let ids = defer_n(&app, n);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    let going = support::wait_until(Duration::from_secs(30), || w.stats().written_once > 500);
    assert!(going, "{:?}", w.stats());
    let report = w.shutdown(Duration::from_secs(2));
    assert!(report.elapsed() < Duration::from_secs(3), "{report}");
    assert!(report.is_clean(), "{report}");
    let done = succeeded(&db);
    let todo = count(
        &db,
        "SELECT count(*) FROM postpone_jobs WHERE status = 'todo'",
    );
    assert_eq!(done + todo, ids.len() as i64, "no job doing or lost");
    let runs = runs.lock().unwrap();
    assert!(runs.values().all(|&k| k == 1), "a job ran twice");
    assert_eq!(runs.len() as i64, done);
    assert_eq!(
        count(&db, "SELECT count(*) FROM postpone_workers"),
        0,
        "the worker's row (and its note) is gone"
    );
}

/// The database's side alone: a lock-only claim noted by its worker, then lost with its
/// session. Other claims skip its jobs while the worker lives; its worker writes them by the
/// lost transaction's id; the rescue of a worker presumed dead requeues those it did not
/// write, each with its attempt counted.
#[test]
fn a_lost_claim_keeps_its_jobs_from_others_until_written_or_rescued() {
    let (db, app) = setup();
    let ids = defer_n(&app, 6);
    let mut admin = db.client();
    let w1: i64 = admin
        .query_one(
            "INSERT INTO postpone_workers (name) VALUES ('w1') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let w2: i64 = admin
        .query_one(
            "INSERT INTO postpone_workers (name) VALUES ('w2') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    // w1 locks four jobs, notes them, and loses its session.
    let mut s1 = db.client();
    s1.batch_execute("BEGIN").unwrap();
    let locked: Vec<(i64, bool, i32)> = s1
        .query(
            "SELECT id, locked, attempts FROM postpone_claim_batch($1, 4, NULL, NULL, 4, NULL, false, true)",
            &[&w1],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(locked.len(), 4);
    assert!(locked.iter().all(|(_, l, a)| *l && *a == 1), "{locked:?}");
    let (xid, pid): (String, i32) = {
        let r = s1
            .query_one("SELECT pg_current_xact_id()::text, pg_backend_pid()", &[])
            .unwrap();
        (r.get(0), r.get(1))
    };
    let lost: Vec<i64> = locked.iter().map(|(id, _, _)| *id).collect();
    let noted: bool = admin
        .query_one(
            "SELECT postpone_note_claim($1, ARRAY[$2::text::xid8], $3)",
            &[&w1, &xid, &lost],
        )
        .unwrap()
        .get(0);
    assert!(noted);
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    let gone = support::wait_until(Duration::from_secs(5), || {
        count(
            &db,
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"),
        ) == 0
    });
    assert!(gone);
    // The rows are `todo` and unlocked, yet another worker's claims skip them.
    let others: Vec<i64> = admin
        .query(
            "SELECT id FROM postpone_claim_batch($1, 10, NULL, NULL, 10, NULL, false, false)",
            &[&w2],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(others.len(), ids.len() - lost.len(), "{others:?}");
    assert!(others.iter().all(|id| !lost.contains(id)));
    // w1 writes two of them by the lost transaction's id: one succeeded, one running.
    let written: Vec<i64> = admin
        .query(
            "SELECT id FROM postpone_settle_locked($1, $2::text::xid8, $3, ARRAY[1, 1],
                                                  ARRAY['succeeded', 'running'],
                                                  ARRAY[NULL, NULL]::jsonb[], ARRAY[500, 500]::bigint[]) AS s(id)",
            &[&w1, &xid, &vec![lost[0], lost[1]]],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(written.len(), 2, "{written:?}");
    // A second write of the same attempt finds nothing to write.
    let again = count(
        &db,
        &format!(
            "SELECT count(*) FROM postpone_settle_locked({w1}, '{xid}'::xid8, ARRAY[{}]::bigint[],
                ARRAY[1], ARRAY['succeeded'], ARRAY[NULL]::jsonb[], ARRAY[1]::bigint[])",
            lost[0]
        ),
    );
    assert_eq!(again, 0);
    // w1 is presumed dead: the rescue requeues its running job and the two it never wrote,
    // each with its attempt counted.
    admin
        .execute(
            "UPDATE postpone_workers SET last_heartbeat = now() - interval '1 hour' WHERE id = $1",
            &[&w1],
        )
        .unwrap();
    admin
        .query("SELECT * FROM postpone_rescue(1000, $1)", &[&w2])
        .unwrap();
    let rows: Vec<(i64, String, i32)> = admin
        .query(
            "SELECT id, status, attempts FROM postpone_jobs WHERE id = ANY($1) ORDER BY id",
            &[&lost],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(rows[0], (lost[0], "succeeded".into(), 1));
    for (id, status, attempts) in &rows[1..] {
        assert_eq!(
            (status.as_str(), *attempts),
            ("todo", 1),
            "job {id}: {rows:?}"
        );
    }
    // Its note went with its row: the jobs are claimable again.
    let back: Vec<i64> = admin
        .query(
            "SELECT id FROM postpone_claim_batch($1, 10, NULL, NULL, 10, NULL, false, false)",
            &[&w2],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(back.len(), 3, "{back:?}");
}

/// A pause waits for the jobs a worker holds only locked too: none of the paused queue's
/// jobs starts after `pause` returns.
#[test]
fn no_job_starts_after_a_pause_returns() {
    let (_db, app) = setup();
    let mut tasks = postpone::Tasks::new();
    let starts = std::sync::Arc::new(Mutex::new(Vec::<std::time::Instant>::new()));
    let s = starts.clone();
    tasks.register("short", move |_job: &postpone::Job| {
        s.lock().unwrap().push(std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    });
    let jobs: Vec<NewJob> = (0..5000)
        .map(|_| NewJob::new("short", &()).unwrap())
        .collect();
    for c in jobs.chunks(1000) {
        app.defer_batch(c).unwrap();
    }
    let w = fast_worker(&app, tasks)
        .concurrency(2)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    assert!(support::wait_until(Duration::from_secs(20), || w
        .stats()
        .written_once
        >= 200));
    app.admin().pause("default").unwrap();
    let paused = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let late = starts
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t > paused)
        .count();
    let ran = starts.lock().unwrap().len();
    w.shutdown(Duration::from_secs(5));
    assert_eq!(late, 0, "jobs started after pause() returned ({ran} ran)");
    assert!(
        ran < 5000,
        "the queue drained before the pause: the test proves nothing"
    );
}

/// An operator's cancel and abort of jobs a worker holds only locked wait for its
/// transaction (at most a few milliseconds), then apply to what the job became: none fails.
#[test]
fn cancels_and_aborts_of_locked_jobs_wait_then_apply() {
    let (db, app) = setup();
    let n = 4000;
    let ids = defer_n(&app, n);
    let (tasks, runs) = slow_counting_tasks(Duration::from_millis(1));
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .claim_in_outcome_transaction(true)
        .spawn()
        .unwrap();
    assert!(support::wait_until(Duration::from_secs(20), || w
        .stats()
        .written_once
        >= 100));
    // Jobs near the head of the queue: some are locked by the worker's claim now.
    let head: Vec<JobId> = ids
        .iter()
        .skip(w.stats().claimed as usize)
        .take(300)
        .copied()
        .collect();
    for (i, id) in head.iter().enumerate() {
        // A job that ran meanwhile cannot be cancelled, one that ended cannot be aborted:
        // said as for any job (InvalidState); anything else is a failure.
        let res = if i % 2 == 0 {
            app.admin().cancel(*id)
        } else {
            app.admin().abort(*id).map(|_| ())
        };
        let res = match res {
            Err(e) if e.kind() == postpone::ErrorKind::InvalidState => Ok(()),
            other => other,
        };
        let what = if i % 2 == 0 { "cancel" } else { "abort" };
        res.unwrap_or_else(|e| panic!("{what} of job {id}: {e}"));
    }
    w.shutdown(Duration::from_secs(5));
    // Each job ran at most once, and one cancelled or aborted either did not run or ran
    // before the request reached it (it then ends as it ran, or aborted).
    let runs = runs.lock().unwrap();
    assert!(runs.values().all(|&k| k == 1), "a job ran twice");
    let mut c = db.client();
    for id in &head {
        let (status, attempts): (String, i32) = {
            let r = c
                .query_one(
                    "SELECT status, attempts FROM postpone_jobs WHERE id = $1",
                    &[&id.0],
                )
                .unwrap();
            (r.get(0), r.get(1))
        };
        let ran = runs.contains_key(&id.0);
        match status.as_str() {
            "cancelled" => assert!(!ran && attempts == 0, "job {id} cancelled after it ran"),
            "succeeded" => assert!(ran, "job {id} succeeded without running"),
            // Aborted while it ran, or before it started (no attempt used then).
            "aborted" => assert!(
                ran || attempts == 0,
                "job {id}: aborted, {attempts} attempts"
            ),
            other => panic!("job {id} ends {other}"),
        }
    }
}

/// A claim's note given as ranges of ids (what the worker sends) names the same jobs as one
/// given id by id.
#[test]
fn a_note_of_ranges_names_the_jobs_a_note_of_ids_names() {
    let (db, app) = setup();
    let mut c = db.client();
    let worker: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name) VALUES ('noted') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    drop(app);
    let ids: Vec<i64> = vec![1, 2, 3, 7, 9, 10, 11, 40];
    let mut note = |sql: &str, params: &[&(dyn postgres::types::ToSql + Sync)]| -> String {
        let noted: bool = c.query_one(sql, params).unwrap().get(0);
        assert!(noted);
        c.query_one(
            "SELECT claim_jobs::text FROM postpone_workers WHERE id = $1",
            &[&worker],
        )
        .unwrap()
        .get(0)
    };
    let by_ids = note(
        "SELECT postpone_note_claim($1, ARRAY['5'::xid8], $2::bigint[])",
        &[&worker, &ids],
    );
    let by_ranges = note(
        "SELECT postpone_note_claim($1, ARRAY['5'::xid8], $2::bigint[], $3::bigint[])",
        &[&worker, &vec![1i64, 7, 9, 40], &vec![3i64, 7, 11, 40]],
    );
    assert_eq!(by_ids, "{[1,4),[7,8),[9,12),[40,41)}");
    assert_eq!(by_ranges, by_ids);
}
