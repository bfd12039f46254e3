//! The claim bounded in bytes (issue 44, schema version 27): a worker holds at most its byte
//! budget of arguments in jobs claimed and not started, whatever came before (no average of
//! past sizes decides it: the database measures at claim time); one job larger than the
//! whole budget still runs, alone; the jobs a claim leaves out stay waiting, untouched.

use crate::support;
use crate::worker_util;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use postpone::{Job, TaskError, Tasks};
use support::*;
use worker_util::*;

const MIB: i64 = 1 << 20;

/// Stores arguments uncompressed, so that a value's stored size is its size (the sampler
/// below reads stored sizes: measuring 100 MiB of text every few milliseconds would load
/// the server more than the worker under test).
fn uncompressed(c: &mut postgres::Client) {
    c.batch_execute("ALTER TABLE postpone_jobs ALTER COLUMN args SET STORAGE EXTERNAL")
        .unwrap();
}

/// Samples, until stopped, the largest total of arguments held by workers in jobs claimed
/// and not started (as the table shows them: `doing` with no start written yet), and how
/// many jobs made it up.
fn sample_held(db: &TestDb, stop: Arc<AtomicBool>) -> thread::JoinHandle<(i64, i64)> {
    let mut c = db.client();
    thread::spawn(move || {
        let mut peak = (0, 0);
        while !stop.load(Ordering::SeqCst) {
            let r = c
                .query_one(
                    "SELECT coalesce(sum(pg_column_size(args)), 0)::bigint, count(*)
                       FROM postpone_jobs WHERE status = 'doing' AND started_at IS NULL",
                    &[],
                )
                .unwrap();
            let now: (i64, i64) = (r.get(0), r.get(1));
            if now.0 > peak.0 {
                peak = now;
            }
            thread::sleep(Duration::from_millis(2));
        }
        peak
    })
}

fn waiting(c: &mut postgres::Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM postpone_jobs WHERE status IN ('todo', 'doing')",
        &[],
    )
    .unwrap()
    .get(0)
}

#[test]
fn a_claim_returns_no_more_argument_bytes_than_its_budget() {
    let (db, _app) = setup();
    let mut c = db.client();
    let w: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name) VALUES ('w') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    // 1,000 tiny jobs, then 10 of 100 KB (compressible: stored in about a kilobyte each,
    // measured as the text a worker receives), then tiny ones again.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'q', 't', jsonb_build_object('n', g) FROM generate_series(1, 1000) g;
         INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'q', 't', to_jsonb(repeat('x', 99998)) FROM generate_series(1, 10);
         INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'q', 't', jsonb_build_object('n', g) FROM generate_series(1, 1000) g;",
    )
    .unwrap();
    let stored: i64 = c
        .query_one(
            "SELECT max(pg_column_size(args))::bigint FROM postpone_jobs WHERE task = 't'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        stored < 20_000,
        "the large values are stored compressed ({stored})"
    );
    let claim = |c: &mut postgres::Client, bytes: i64, alone: bool| -> (Vec<i64>, i64, bool) {
        let mut tx = c.transaction().unwrap();
        let rows = tx
            .query(
                "SELECT id, octet_length(args::text)::bigint
                   FROM postpone_claim_jobs($1, 5000, NULL, NULL, 4, $2, $3)",
                &[&w, &bytes, &alone],
            )
            .unwrap();
        let cut: bool = tx
            .query_one("SELECT current_setting('postpone.cut', true) = 'on'", &[])
            .unwrap()
            .get(0);
        tx.commit().unwrap();
        let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort();
        (ids, rows.iter().map(|r| r.get::<_, i64>(1)).sum(), cut)
    };

    // 350 KB: every tiny job before the large ones (about 9 KB), then three of them.
    let (ids, bytes, cut) = claim(&mut c, 350_000, true);
    assert!(bytes <= 350_000, "{bytes}");
    assert!(cut, "the claim says it left jobs for their size");
    assert_eq!(ids.len(), 1003, "{bytes}");
    assert_eq!(ids.last(), Some(&1003), "in claim order, with no gap");
    // The jobs left out stay waiting and untouched: no attempt, no worker.
    let untouched: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_jobs
              WHERE status = 'todo' AND attempts = 0 AND worker_id IS NULL
                AND claimed_at IS NULL AND started_at IS NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(untouched, 2010 - 1003);

    // A budget smaller than the next job: nothing, unless the worker holds nothing else.
    let (ids, _, cut) = claim(&mut c, 50_000, false);
    assert!(ids.is_empty() && cut, "{ids:?}");
    let (ids, bytes, _) = claim(&mut c, 50_000, true);
    assert_eq!((ids, bytes), (vec![1004], 100_000), "the large job alone");
    // No budget: as the claim of version 25.
    let (ids, _, cut) = claim_all(&mut c, w);
    assert_eq!(ids.len(), 2010 - 1004);
    assert!(!cut);
    assert_eq!(waiting(&mut c), 2010);
}

fn claim_all(c: &mut postgres::Client, w: i64) -> (Vec<i64>, i64, bool) {
    let rows = c
        .query(
            "SELECT id FROM postpone_claim_jobs($1, 5000, NULL, NULL, 4, NULL, true)",
            &[&w],
        )
        .unwrap();
    (rows.iter().map(|r| r.get(0)).collect(), 0, false)
}

#[test]
fn large_jobs_after_thousands_of_small_ones_are_held_within_the_budget() {
    let (db, app) = setup();
    let mut c = db.client();
    uncompressed(&mut c);
    let mut tasks = Tasks::new();
    tasks.register("tiny", |_: &Job| -> Result<(), TaskError> { Ok(()) });
    tasks.register("big", |job: &Job| -> Result<(), TaskError> {
        let v: serde_json::Value = job.args()?;
        assert!(v.as_str().is_some_and(|s| s.len() > 1_000_000));
        thread::sleep(Duration::from_millis(10));
        Ok(())
    });
    let handle = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    // 4,000 tiny jobs run first: the worker learns that arguments are small.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'default', 'tiny', jsonb_build_object('n', g) FROM generate_series(1, 4000) g",
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || waiting(&mut c) == 0),
        "the tiny jobs ran"
    );
    // Then 100 jobs of 1 MiB, committed at once: 100 MiB against a 64 MiB budget.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_held(&db, stop.clone());
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'default', 'big', to_jsonb(repeat('b', 1048576)) FROM generate_series(1, 100)",
    )
    .unwrap();
    let done = wait_until(Duration::from_secs(120), || waiting(&mut c) == 0);
    stop.store(true, Ordering::SeqCst);
    let (peak, jobs) = sampler.join().unwrap();
    let report = handle.shutdown(Duration::from_secs(10));
    assert!(done, "every large job ran");
    assert!(report.is_clean(), "{report}");
    // Held: at most the budget on the board, plus the two jobs the executors took whose
    // start the worker had not written yet, plus a job's worth of slack. Before, all 100.
    assert!(
        peak <= 64 * MIB + 3 * MIB,
        "held {peak} bytes in {jobs} jobs claimed and not started"
    );
    assert!(jobs >= 2, "the worker did hold jobs ahead ({jobs})");
}

#[test]
fn a_job_larger_than_the_budget_still_runs_alone() {
    let (db, app) = setup();
    let mut c = db.client();
    uncompressed(&mut c);
    let mut tasks = Tasks::new();
    tasks.register("t", |_: &Job| -> Result<(), TaskError> {
        thread::sleep(Duration::from_millis(5));
        Ok(())
    });
    // Small ones, a 1 MiB one, small ones: the budget is 256 KiB.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'default', 't', to_jsonb(repeat('s', 20000)) FROM generate_series(1, 30);
         INSERT INTO postpone_jobs (queue, task, args)
         VALUES ('default', 't', to_jsonb(repeat('b', 1048576)));
         INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'default', 't', to_jsonb(repeat('s', 20000)) FROM generate_series(1, 30);",
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_held(&db, stop.clone());
    let handle = fast_worker(&app, tasks)
        .concurrency(2)
        .prefetch_bytes(256 << 10)
        .spawn()
        .unwrap();
    let done = wait_until(Duration::from_secs(60), || waiting(&mut c) == 0);
    stop.store(true, Ordering::SeqCst);
    let (peak, jobs) = sampler.join().unwrap();
    let report = handle.shutdown(Duration::from_secs(10));
    assert!(done, "every job ran, the large one too");
    assert!(report.is_clean(), "{report}");
    let succeeded: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded' AND attempts = 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(succeeded, 61);
    // The large job was held alone, or beside the two the executors had just taken.
    assert!(
        peak <= MIB + 256 * 1024 + 2 * 20_100,
        "held {peak} bytes in {jobs} jobs"
    );
}

/// Schema 29 measures the arguments in the walk that locks the rows; a claim of several
/// queues (whose walks are merged into claim order) and one that parks jobs behind their
/// locks measure them where they visit the rows again. Each keeps the budget as a prefix
/// of claim order: the same jobs whichever path the claim takes.
#[test]
fn the_budget_holds_across_queues_and_beside_parked_jobs() {
    let (db, _app) = setup();
    let mut c = db.client();
    let w: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name) VALUES ('w') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    // Queues a and b alternate in claim order (scheduled one second apart); every job's
    // arguments are 1,000 bytes of JSON text. Jobs 3 and 4 wait for lock 'k' behind job 2.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, scheduled_at, lock)
         SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 't', to_jsonb(repeat('x', 998)),
                now() - interval '1 hour' + g * interval '1 second',
                CASE WHEN g IN (2, 3, 4) THEN 'k' END
           FROM generate_series(1, 40) g",
    )
    .unwrap();
    let claim = |c: &mut postgres::Client, queues: Option<Vec<&str>>, bytes: i64| {
        let mut tx = c.transaction().unwrap();
        let rows = tx
            .query(
                "SELECT id, octet_length(args::text)::bigint
                   FROM postpone_claim_jobs($1, 100, $2, NULL, 4, $3, false)",
                &[&w, &queues, &bytes],
            )
            .unwrap();
        let cut: bool = tx
            .query_one("SELECT current_setting('postpone.cut', true) = 'on'", &[])
            .unwrap()
            .get(0);
        tx.rollback().unwrap();
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let sum: i64 = rows.iter().map(|r| r.get::<_, i64>(1)).sum();
        (ids, sum, cut)
    };
    // Both queues named (a merge of two walks), 10.5 jobs' worth: the first 10 in claim
    // order, jobs 3 and 4 left behind their lock (parked: not counted).
    let (ids, sum, cut) = claim(&mut c, Some(vec!["a", "b"]), 10_500);
    assert_eq!(ids, vec![1, 2, 5, 6, 7, 8, 9, 10, 11, 12]);
    assert_eq!(sum, 10_000);
    assert!(cut);
    // Every queue (one walk), the same budget: the same jobs.
    let (ids, sum, cut) = claim(&mut c, None, 10_500);
    assert_eq!(ids, vec![1, 2, 5, 6, 7, 8, 9, 10, 11, 12]);
    assert_eq!(sum, 10_000);
    assert!(cut);
    // One queue of the two, a budget of three jobs.
    let (ids, sum, cut) = claim(&mut c, Some(vec!["b"]), 3_000);
    assert_eq!(ids, vec![1, 5, 7]);
    assert_eq!(sum, 3_000);
    assert!(cut);
    // A pause of queue a leaves b alone, measured as one queue.
    c.batch_execute("INSERT INTO postpone_paused_queues (queue) VALUES ('a')")
        .unwrap();
    let (ids, _, _) = claim(&mut c, Some(vec!["a", "b"]), 2_000);
    assert_eq!(ids, vec![1, 5]);
    let (ids, _, _) = claim(&mut c, None, 2_000);
    assert_eq!(ids, vec![1, 5]);
    // A budget wide enough: everything free, nothing cut.
    c.batch_execute("DELETE FROM postpone_paused_queues")
        .unwrap();
    let (ids, sum, cut) = claim(&mut c, Some(vec!["a", "b"]), 1 << 30);
    assert_eq!(ids.len(), 38);
    assert_eq!(sum, 38_000);
    assert!(!cut);
}
