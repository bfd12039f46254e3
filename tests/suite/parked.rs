//! Jobs held back by their lock are parked out of the claim's way (schema version 11), and
//! come back whenever what held them leaves: never stranded, never started out of order.

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use postpone::{Job, JobId, TaskError, Tasks};
use support::{wait_until, TestDb};
use worker_util::*;

/// A worker row for claims made by hand, alive for a day.
fn hand_worker(db: &TestDb) -> i64 {
    db.client()
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat)
             VALUES ('by hand', now() + interval '1 day') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Claims by hand, as a worker does: the ids claimed, in order.
fn claim(db: &TestDb, worker: i64, limit: i32) -> Vec<i64> {
    let mut ids: Vec<i64> = db
        .client()
        .query(
            "SELECT id FROM postpone_claim($1, $2, NULL, NULL)",
            &[&worker, &limit],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.sort();
    ids
}

fn blocked_by(db: &TestDb, id: i64) -> Option<i64> {
    db.client()
        .query_one("SELECT blocked_by FROM postpone_jobs WHERE id = $1", &[&id])
        .unwrap()
        .get(0)
}

fn insert(db: &TestDb, lock: Option<&str>, at: &str) -> i64 {
    db.client()
        .query_one(
            &format!(
                "INSERT INTO postpone_jobs (queue, task, args, lock, scheduled_at)
                 VALUES ('default', 't', 'null', $1, {at}) RETURNING id"
            ),
            &[&lock],
        )
        .unwrap()
        .get(0)
}

fn set_status(db: &TestDb, id: i64, status: &str) {
    let n = db
        .client()
        .execute(
            "UPDATE postpone_jobs SET status = $2 WHERE id = $1",
            &[&id, &status],
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn a_claim_parks_the_jobs_a_lock_holds_back_and_their_blocker_leaving_frees_them() {
    let (db, app) = setup();
    let w = hand_worker(&db);
    // A chain on one lock, a job free of locks behind it.
    let a = insert(&db, Some("L"), "now() - interval '3 s'");
    let b = insert(&db, Some("L"), "now() - interval '2 s'");
    let c = insert(&db, Some("L"), "now() - interval '1 s'");
    let free = insert(&db, None, "now()");
    assert_eq!(
        claim(&db, w, 10),
        vec![a, free],
        "the head of the chain and the free job"
    );
    // Each waits for the job just before it, not for the running one.
    assert_eq!(blocked_by(&db, b), Some(a));
    assert_eq!(blocked_by(&db, c), Some(b));
    assert!(claim(&db, w, 10).is_empty(), "parked jobs are not claimed");
    // Operators see it (the CLI's `postpone job` and the dashboard print this field).
    let detail = app.admin().job(JobId::from(c)).unwrap();
    assert_eq!(detail.blocked_by, Some(JobId::from(b)));
    assert_eq!(detail.job.status.as_str(), "todo");

    // `a` finishes: `b` (and only `b`) is free, in the same statement.
    set_status(&db, a, "succeeded");
    assert_eq!(blocked_by(&db, b), None);
    assert_eq!(blocked_by(&db, c), Some(b));
    assert_eq!(claim(&db, w, 10), vec![b]);
    // `b` is cancelled while running: `c` is next.
    set_status(&db, b, "cancelled");
    assert_eq!(claim(&db, w, 10), vec![c]);
}

#[test]
fn a_job_parked_behind_a_later_running_job_is_freed_when_that_job_goes_back_to_waiting() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    // `later` (a larger id) runs while `early` waits: it committed first and was claimed
    // before `early` existed, as can happen with concurrent defers.
    let early = insert(&db, Some("L"), "now() - interval '1 s'");
    let later = insert(&db, Some("L"), "now()");
    db.client()
        .execute(
            "UPDATE postpone_jobs SET status = 'doing', worker_id = $2, attempts = 1
              WHERE id = $1",
            &[&later, &w],
        )
        .unwrap();
    assert!(claim(&db, w, 10).is_empty());
    assert_eq!(blocked_by(&db, early), Some(later));
    // `later` goes back to waiting (a retry, a rescue): `early` comes first again.
    set_status(&db, later, "todo");
    assert_eq!(blocked_by(&db, early), None);
    assert_eq!(claim(&db, w, 10), vec![early]);
    assert_eq!(blocked_by(&db, later), Some(early));
}

#[test]
fn a_parked_job_that_leaves_and_comes_back_is_judged_again() {
    let (db, app) = setup();
    let w = hand_worker(&db);
    let holder = insert(&db, Some("L"), "now() - interval '1 s'");
    let parked = insert(&db, Some("L"), "now()");
    assert_eq!(claim(&db, w, 10), vec![holder]);
    assert_eq!(blocked_by(&db, parked), Some(holder));
    app.admin().cancel(JobId::from(parked)).unwrap();
    assert_eq!(
        blocked_by(&db, parked),
        None,
        "a cancelled job forgets its blocker"
    );
    set_status(&db, holder, "succeeded");
    app.admin().retry(JobId::from(parked)).unwrap();
    assert_eq!(claim(&db, w, 10), vec![parked]);
}

#[test]
fn any_statement_that_takes_parked_jobs_out_of_the_queue_clears_their_blocker() {
    // Schema 15 keeps this rule in the statement trigger, not in a row trigger: plain SQL,
    // one statement over several rows, one of which leaves the queue while the job it
    // waited for stays, and one of which stays parked.
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let holder = insert(&db, Some("L"), "now() - interval '3 s'");
    let stays = insert(&db, Some("L"), "now() - interval '2 s'");
    let leaves = insert(&db, Some("L"), "now() - interval '1 s'");
    assert_eq!(claim(&db, w, 10), vec![holder]);
    assert_eq!(blocked_by(&db, stays), Some(holder));
    assert_eq!(blocked_by(&db, leaves), Some(stays));
    let n = db
        .client()
        .execute(
            "UPDATE postpone_jobs
                SET status = CASE WHEN id = $1 THEN 'cancelled' ELSE status END,
                    priority = priority + 1
              WHERE id = ANY($2)",
            &[&leaves, &vec![stays, leaves]],
        )
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        blocked_by(&db, leaves),
        None,
        "a job cancelled while parked forgets its blocker, which is still waiting"
    );
    assert_eq!(
        blocked_by(&db, stays),
        Some(holder),
        "a job still waiting stays parked"
    );
    // Back in the queue, it is judged again: behind `stays` again, not stranded.
    set_status(&db, leaves, "todo");
    assert!(claim(&db, w, 10).is_empty());
    assert_eq!(blocked_by(&db, leaves), Some(stays));
    set_status(&db, holder, "succeeded");
    assert_eq!(claim(&db, w, 10), vec![stays]);
}

#[test]
fn no_row_trigger_on_the_jobs_table_locks_each_updated_row() {
    // PostgreSQL locks every row an UPDATE changes, one more WAL record per row, whenever
    // the table has a BEFORE UPDATE row trigger, whatever its WHEN clause: schema 15 took
    // the last one off (56 bytes of WAL fewer per finished job, measured).
    let (db, _app) = setup();
    let row_triggers: Vec<String> = db
        .client()
        .query(
            "SELECT t.tgname::text FROM pg_trigger t
              WHERE t.tgrelid = 'postpone_jobs'::regclass AND NOT t.tgisinternal
                AND (t.tgtype & 1) = 1 AND (t.tgtype & 2) = 2 AND (t.tgtype & 16) = 16",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        row_triggers.is_empty(),
        "BEFORE UPDATE row triggers: {row_triggers:?}"
    );
}

#[test]
fn deleting_the_blocker_frees_the_jobs_parked_behind_it() {
    let (db, app) = setup();
    let w = hand_worker(&db);
    // The earlier job of the lock waits for tomorrow: the later one waits for it.
    let tomorrow = insert(&db, Some("L"), "now() + interval '1 day'");
    let today = insert(&db, Some("L"), "now()");
    assert!(claim(&db, w, 10).is_empty());
    assert_eq!(blocked_by(&db, today), Some(tomorrow));
    app.admin()
        .cancel_and_delete(JobId::from(tomorrow))
        .unwrap();
    assert_eq!(blocked_by(&db, today), None);
    assert_eq!(claim(&db, w, 10), vec![today]);
}

#[test]
fn thousands_of_held_back_jobs_are_parked_in_one_claim_and_the_due_jobs_behind_them_run() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    db.client()
        .batch_execute(&format!(
            "INSERT INTO postpone_jobs (queue, task, args, status, lock, worker_id, attempts,
                                        started_at, scheduled_at)
             SELECT 'default', 'held', 'null', 'doing', 'lock-' || g, {w}, 1, now(),
                    now() - interval '2 hours'
               FROM generate_series(1, 3000) g;
             INSERT INTO postpone_jobs (queue, task, args, lock, scheduled_at)
             SELECT 'default', 'blocked', 'null', 'lock-' || g, now() - interval '1 hour'
               FROM generate_series(1, 3000) g;
             INSERT INTO postpone_jobs (queue, task, args)
             SELECT 'default', 'due', 'null' FROM generate_series(1, 5)"
        ))
        .unwrap();
    let got = claim(&db, w, 5);
    assert_eq!(
        got.len(),
        5,
        "one claim reaches the due jobs behind 3,000 held ones"
    );
    let mut client = db.client();
    let tasks: Vec<String> = client
        .query("SELECT task FROM postpone_jobs WHERE id = ANY($1)", &[&got])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tasks.iter().all(|t| t == "due"), "{tasks:?}");
    let parked: i64 = client
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE blocked_by IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(parked, 3000);
    // The holders finish in one statement: every parked job is free and claimable.
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded' WHERE task = 'held'",
            &[],
        )
        .unwrap();
    assert_eq!(claim(&db, w, 4000).len(), 3000);
}

#[test]
fn workers_with_retries_and_cancels_leave_no_job_parked_and_keep_each_lock_in_order() {
    let (db, app) = setup();
    const LOCKS: usize = 12;
    const PER_LOCK: usize = 12;
    // Per lock: the numbers of the jobs that succeeded, in order; and how many ran at once.
    let done: Arc<Mutex<HashMap<usize, Vec<usize>>>> = Arc::default();
    let running: Arc<Vec<AtomicUsize>> =
        Arc::new((0..LOCKS).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let make_tasks = || {
        let mut tasks = Tasks::new();
        let (done, running, overlaps) = (done.clone(), running.clone(), overlaps.clone());
        tasks.register("chain", move |job: &Job| {
            let (lock, n): (usize, usize) = job.args()?;
            if running[lock].fetch_add(1, Ordering::SeqCst) > 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            thread::sleep(Duration::from_millis(2));
            running[lock].fetch_sub(1, Ordering::SeqCst);
            // Every third job fails its first attempt and goes back to the queue at once.
            if n % 3 == 1 && job.attempts() == 1 {
                return Err(TaskError::retry("first attempt fails"));
            }
            done.lock().unwrap().entry(lock).or_default().push(n);
            Ok(())
        });
        tasks.register("free", |_job: &Job| Ok(()));
        tasks
    };
    let workers: Vec<_> = (0..3)
        .map(|_| {
            fast_worker(&app, make_tasks())
                .concurrency(4)
                .spawn()
                .unwrap()
        })
        .collect();
    // Defers from two threads at once, interleaved with free jobs, while the workers run.
    let mut cancelled = Vec::new();
    thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|half| {
                let app = &app;
                s.spawn(move || {
                    let mut ids = Vec::new();
                    for n in 0..PER_LOCK {
                        for lock in (0..LOCKS).filter(|l| l % 2 == half) {
                            let id = app
                                .job("chain")
                                .lock(format!("lock-{lock}"))
                                .max_attempts(3)
                                .defer(&(lock, n))
                                .unwrap();
                            ids.push((lock, n, id));
                            app.defer("free", &n).unwrap();
                        }
                    }
                    ids
                })
            })
            .collect();
        for h in handles {
            for (lock, n, id) in h.join().unwrap() {
                // Cancel a few that may still wait (parked or not): the chain goes on.
                if n == PER_LOCK - 2 && app.admin().cancel(id).is_ok() {
                    cancelled.push((lock, n));
                }
            }
        }
    });
    let total = LOCKS * PER_LOCK - cancelled.len();
    let finished = wait_until(Duration::from_secs(60), || {
        done.lock().unwrap().values().map(Vec::len).sum::<usize>() >= total
    });
    let mut client = db.client();
    // A task counts itself done a moment before its worker records the outcome: give the
    // last outcomes the time to land before reading what is left.
    wait_until(Duration::from_secs(10), || {
        client
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status IN ('todo', 'doing')",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 0
    });
    let left: Vec<(i64, String, Option<i64>)> = client
        .query(
            "SELECT id, status, blocked_by FROM postpone_jobs
              WHERE status IN ('todo', 'doing') ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    for w in workers {
        w.shutdown(Duration::from_secs(5));
    }
    assert!(finished, "jobs left in the queue: {left:?}");
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two jobs of one lock ran at once"
    );
    for (lock, ns) in done.lock().unwrap().iter() {
        let mut sorted = ns.clone();
        sorted.sort();
        assert_eq!(ns, &sorted, "lock-{lock} ran out of defer order");
    }
    let parked: i64 = client
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE blocked_by IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(parked, 0);
}

/// The bench's case at a smaller scale: `held` jobs waiting behind locks whose holders run,
/// due before `free` jobs without a lock; the table analyzed, as a worker's vacuum leaves it.
fn held_then_free(db: &TestDb, held: i64, free: i64) -> i64 {
    let w = hand_worker(db);
    db.client()
        .batch_execute(&format!(
            "INSERT INTO postpone_jobs (queue, task, args, status, lock, worker_id, attempts,
                                        started_at, scheduled_at)
             SELECT 'default', 'held', 'null', 'doing', 'lock-' || g, {w}, 1, now(),
                    now() - interval '2 hours'
               FROM generate_series(1, {held}) g;
             INSERT INTO postpone_jobs (queue, task, args, lock, scheduled_at)
             SELECT 'default', 'blocked', 'null', 'lock-' || g, now() - interval '1 hour'
               FROM generate_series(1, {held}) g;
             INSERT INTO postpone_jobs (queue, task, args)
             SELECT 'default', 'due', 'null' FROM generate_series(1, {free});
             ANALYZE postpone_jobs"
        ))
        .unwrap();
    w
}

/// Claims up to `limit` jobs for `worker` inside `tx` (left open): how many it took.
fn claim_in(tx: &mut postgres::Transaction<'_>, worker: i64, limit: i32) -> i64 {
    tx.query_one(
        "SELECT count(*) FROM postpone_claim_jobs($1, $2, NULL, NULL)",
        &[&worker, &limit],
    )
    .unwrap()
    .get(0)
}

/// Schema 14: the claim that parks held-back jobs reads each walked job's key a few times,
/// never the whole primary key. With version 13, the batch being a twentieth of the table, it
/// joined by hash over every key, twice a round (191,150 entries read for this claim).
#[test]
fn parking_reads_the_keys_of_the_walked_jobs_not_the_whole_table() {
    let (db, _app) = setup();
    let w = held_then_free(&db, 5_000, 35_000);
    let mut session = db.client();
    let mut tx = session.transaction().unwrap();
    let claimed = claim_in(&mut tx, w, 2050);
    // This transaction's own counters: no wait for the statistics to be sent.
    let read: i64 = tx
        .query_one(
            "SELECT pg_stat_get_xact_tuples_returned('postpone_jobs_pkey'::regclass)",
            &[],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    assert_eq!(claimed, 2050);
    let parked: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE blocked_by IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(parked, 5_000, "every held-back job is parked");
    println!(
        "  primary-key entries read by a claim parking 5,000 jobs in a table of 45,000: {read}"
    );
    assert!(
        read < 45_000,
        "the claim read {read} primary-key entries: more than one pass over the table"
    );
}

/// Schema 14: the round after the one that reached the free jobs walks (and locks until the
/// claim commits) only as many jobs as are still wanted. With version 13 it walked twice the
/// last round's width: here 400 rows locked to take 50, 350 kept from every other claimer.
#[test]
fn a_claim_that_parks_jobs_locks_no_free_job_it_does_not_take() {
    let (db, _app) = setup();
    let w = held_then_free(&db, 250, 1_000);
    let mut claimer = db.client();
    let mut tx = claimer.transaction().unwrap();
    let claimed = claim_in(&mut tx, w, 100);
    assert_eq!(claimed, 100);
    // Another claimer, before the first commits: it sees 1,250 waiting jobs, of which the
    // first holds the 250 it parked and the 100 it took, and should hold no other.
    let mut other = db.client();
    let mut other_tx = other.transaction().unwrap();
    let lockable: i64 = other_tx
        .query_one(
            "SELECT count(*) FROM (SELECT id FROM postpone_jobs
                                    WHERE status = 'todo' AND blocked_by IS NULL
                                      FOR UPDATE SKIP LOCKED) x",
            &[],
        )
        .unwrap()
        .get(0);
    other_tx.rollback().unwrap();
    tx.commit().unwrap();
    let held_by_first = 1_250 - lockable;
    assert_eq!(
        held_by_first - 250 - 100,
        0,
        "the claim kept {held_by_first} jobs locked: 250 parked, 100 taken, and {} it did not take",
        held_by_first - 350
    );
}
