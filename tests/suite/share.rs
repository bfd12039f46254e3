//! The fetcher's share of the recording: a fetcher with nothing to claim (or no room for
//! more) records a batch of the outcomes waiting behind the completer's, on its own
//! connection. Every job still ends once, with the right status; what the fetcher cannot
//! record goes back to the completer; resets and a shutdown in the middle lose nothing.
//!
//! The completer is made slow on purpose: a statement trigger sleeps 20 ms in every UPDATE
//! that makes a job succeed, so that outcomes pile up behind each of its batches.

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use postpone::{App, JobId, NewJob};
use worker_util::*;

const N: usize = 5000;

/// Every statement that makes jobs succeed takes 100 ms more: the completer records at most
/// 10,000 outcomes a second (batches of at most 1,000), far fewer than the executors finish
/// no-op jobs, so it is behind whatever the machine's pace. (At 20 ms it recorded up to
/// 50,000 a second and sometimes kept up: the fetcher then never took a share.)
fn slow_successes(db: &support::TestDb) {
    db.client()
        .batch_execute(
            "CREATE FUNCTION slow_success() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF EXISTS (SELECT 1 FROM slow_new WHERE status = 'succeeded') THEN
                     PERFORM pg_sleep(0.1);
                 END IF;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER slow_success AFTER UPDATE ON postpone_jobs
                 REFERENCING NEW TABLE AS slow_new
                 FOR EACH STATEMENT EXECUTE FUNCTION slow_success();",
        )
        .unwrap();
}

fn defer_n(app: &App, n: usize) -> Vec<JobId> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("ok", &(i as i64)).unwrap())
        .collect();
    jobs.chunks(1000)
        .flat_map(|c| app.defer_batch(c).unwrap())
        .collect()
}

fn count(db: &support::TestDb, status: &str) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = $1",
            &[&status],
        )
        .unwrap()
        .get(0)
}

fn wait_all(db: &support::TestDb, status: &str, n: usize, timeout: Duration) {
    let done = support::wait_until(timeout, || count(db, status) == n as i64);
    assert!(
        done,
        "{} of {n} jobs are {status} after {timeout:?}",
        count(db, status)
    );
}

fn assert_ran_once(runs: &Mutex<HashMap<i64, usize>>, ids: &[JobId]) {
    let runs = runs.lock().unwrap();
    for id in ids {
        assert_eq!(runs.get(&id.0), Some(&1), "job {id} ran once");
    }
}

/// The backend pid of the worker's fetcher: the one session of the test's database (other
/// than `c`'s) whose last statement was a claim. Waits up to 10 s for the first claim.
fn fetcher_pid(c: &mut postgres::Client) -> i32 {
    let mut fetcher: Vec<i32> = Vec::new();
    let found = support::wait_until(Duration::from_secs(10), || {
        fetcher = c
            .query(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()
                    AND query LIKE '%postpone_claim_batch%'",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        fetcher.len() == 1
    });
    assert!(found, "the fetcher's session: {fetcher:?}");
    fetcher[0]
}

/// Each job ran once on one of two workers, one after the other.
fn assert_ran_once_across(
    first: &Mutex<HashMap<i64, usize>>,
    second: &Mutex<HashMap<i64, usize>>,
    ids: &[JobId],
) {
    let first = first.lock().unwrap();
    let second = second.lock().unwrap();
    for id in ids {
        let n = first.get(&id.0).unwrap_or(&0) + second.get(&id.0).unwrap_or(&0);
        assert_eq!(n, 1, "job {id} ran {n} times");
    }
}

/// A drain of `N` jobs behind a fault proxy (round-trips cut after `io_timeout`): what the
/// fault tests start from.
struct BehindProxy {
    db: support::TestDb,
    direct: App,
    proxy: support::FaultProxy,
    w: postpone::WorkerHandle,
    runs: std::sync::Arc<Mutex<HashMap<i64, usize>>>,
    ids: Vec<JobId>,
}

fn behind_proxy(io_timeout: Duration) -> BehindProxy {
    let (db, direct) = setup();
    slow_successes(&db);
    let proxy = support::FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), io_timeout);
    let (tasks, runs) = counting_tasks();
    let ids = defer_n(&direct, N);
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        // Long enough that no stuck round-trip or reset makes the worker presumed dead
        // (which would allow a rerun).
        .stalled_after(Duration::from_secs(30))
        // Every outcome goes to the completer, so that it surely falls behind and the
        // fetcher records (outcomes riding on claims took that work away under some loads).
        .outcomes_ride_claims(false)
        .spawn()
        .unwrap();
    BehindProxy {
        db,
        direct,
        proxy,
        w,
        runs,
        ids,
    }
}

/// [`behind_proxy`], once the fetcher has begun to record.
fn helped_behind_proxy(io_timeout: Duration) -> BehindProxy {
    let b = behind_proxy(io_timeout);
    let helped = support::wait_until(Duration::from_secs(30), || {
        b.w.stats().outcomes_by_fetcher > 0
    });
    assert!(helped, "the fetcher never recorded: {:?}", b.w.stats());
    b
}

#[test]
fn a_completer_that_falls_behind_is_helped_and_every_job_ends_once() {
    let (db, app) = setup();
    slow_successes(&db);
    let ids = defer_n(&app, N);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks).concurrency(4).spawn().unwrap();
    wait_all(&db, "succeeded", N, Duration::from_secs(60));
    let stats = stats_once_recorded(&w, N as u64);
    println!("{stats:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert_ran_once(&runs, &ids);
    assert_eq!(stats.recorded, N as u64, "{stats:?}");
    assert!(
        stats.outcomes_by_fetcher > 0,
        "the fetcher recorded nothing although the completer was behind: {stats:?}"
    );
    assert!(stats.outcomes_by_fetcher < N as u64, "{stats:?}");
}

/// The database refuses every success the fetcher's session records (a trigger that knows
/// its backend); the completer's are accepted. The fetcher hands what it took back, and
/// the completer records it: every job succeeds, once.
#[test]
fn what_the_fetcher_cannot_record_goes_back_to_the_completer() {
    let (db, app) = setup();
    slow_successes(&db);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks).concurrency(4).spawn().unwrap();
    // An idle worker's fetcher has sent its claim; the completer has planned its recording.
    let mut c = db.client();
    let fetcher = fetcher_pid(&mut c);
    c.batch_execute(&format!(
        "CREATE SEQUENCE fetcher_refusals;
         CREATE FUNCTION refuse_fetcher() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.status = 'succeeded' AND pg_backend_pid() = {} THEN
                 PERFORM nextval('fetcher_refusals');
                 RAISE EXCEPTION 'not from the fetcher';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_fetcher BEFORE UPDATE ON postpone_jobs
             FOR EACH ROW EXECUTE FUNCTION refuse_fetcher();",
        fetcher
    ))
    .unwrap();
    let ids = defer_n(&app, N);
    wait_all(&db, "succeeded", N, Duration::from_secs(60));
    let stats = stats_once_recorded(&w, N as u64);
    println!("{stats:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert_ran_once(&runs, &ids);
    let refused: i64 = c
        .query_one(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM fetcher_refusals",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        refused > 0,
        "the fetcher never tried to record (the test shows nothing): {stats:?}"
    );
    assert_eq!(stats.outcomes_by_fetcher, 0, "{stats:?}");
    assert_eq!(stats.recorded, N as u64, "{stats:?}");
}

/// Reset connections while both the completer and the fetcher record: a recording cut off
/// before its reply goes back to the completer, which records it (or finds it recorded);
/// every job succeeds, and none runs twice.
#[test]
fn resets_while_the_fetcher_records_lose_no_outcome_and_run_no_job_twice() {
    let BehindProxy {
        db,
        proxy,
        w,
        runs,
        ids,
        ..
    } = behind_proxy(Duration::from_secs(2));
    let mut resets = 0;
    while count(&db, "succeeded") < N as i64 && resets < 8 {
        std::thread::sleep(Duration::from_millis(60));
        proxy.reset_all();
        resets += 1;
    }
    wait_all(&db, "succeeded", N, Duration::from_secs(60));
    let stats = w.stats();
    println!("{resets} resets; {stats:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert_ran_once(&runs, &ids);
    assert!(resets > 0);
}

/// A shutdown in the middle of a drain whose fetcher records too: what was recorded stays
/// recorded, what was not is recorded by the shutdown or given back to the queue, and a
/// second worker finishes the rest. Every job succeeds, and none runs twice.
#[test]
fn a_shutdown_while_the_fetcher_records_loses_nothing() {
    let (db, app) = setup();
    slow_successes(&db);
    let ids = defer_n(&app, N);
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks).concurrency(4).spawn().unwrap();
    let helped = support::wait_until(Duration::from_secs(30), || {
        w.stats().outcomes_by_fetcher > 0
    });
    assert!(helped, "the fetcher never recorded: {:?}", w.stats());
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    println!("{report}");
    assert_eq!(count(&db, "doing"), 0, "no job is left running");
    let (tasks2, runs2) = counting_tasks();
    let w2 = fast_worker(&app, tasks2).concurrency(4).spawn().unwrap();
    wait_all(&db, "succeeded", N, Duration::from_secs(60));
    assert!(w2.shutdown(Duration::from_secs(5)).is_clean());
    assert_ran_once_across(&runs, &runs2, &ids);
}

/// Half-open links (the server stops answering, the sockets stay open) in the middle of a
/// drain whose fetcher records too: each round-trip stuck on them is cut at its deadline,
/// what it carried goes back to the completer, and the worker goes on to a second wave of
/// jobs deferred after the strand. Every job succeeds, and none runs twice.
#[test]
fn half_open_links_while_the_fetcher_records_are_cut_and_lose_nothing() {
    let BehindProxy {
        db,
        direct,
        proxy,
        w,
        runs,
        mut ids,
    } = helped_behind_proxy(Duration::from_secs(1));
    proxy.strand_all();
    // The strand may come after the last of the first wave's round-trips went out; a second
    // wave, deferred behind the proxy's back, can only be claimed over the stranded links or
    // new ones, so the worker has to notice them.
    ids.extend(defer_n(&direct, N / 5));
    wait_all(&db, "succeeded", N + N / 5, Duration::from_secs(60));
    let stats = w.stats();
    println!("{stats:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert_ran_once(&runs, &ids);
    assert!(
        stats.db_errors > 0,
        "round-trips on the stranded links were cut: {stats:?}"
    );
}

/// A shutdown right after every link went half-open, in the middle of a drain whose fetcher
/// records too, returns within its timeout; a second worker finishes the rest, and no job
/// runs twice.
#[test]
fn a_shutdown_over_half_open_links_returns_in_time_and_loses_nothing() {
    let BehindProxy {
        db,
        direct,
        proxy,
        w,
        runs,
        ids,
    } = helped_behind_proxy(Duration::from_secs(5));
    proxy.strand_all();
    let t = std::time::Instant::now();
    let report = w.shutdown(Duration::from_secs(2));
    let took = t.elapsed();
    println!("{report}");
    assert!(
        took < Duration::from_secs(3),
        "shutdown(2 s) took {took:?}: {report}"
    );
    assert!(report.abandoned_threads().is_empty(), "{report}");
    let (tasks2, runs2) = counting_tasks();
    let w2 = fast_worker(&direct, tasks2).concurrency(4).spawn().unwrap();
    wait_all(&db, "succeeded", N, Duration::from_secs(60));
    assert!(w2.shutdown(Duration::from_secs(5)).is_clean());
    assert_ran_once_across(&runs, &runs2, &ids);
}

/// Outcomes whose jobs are gone (deleted by hand while they ran) are applied by no
/// statement: when the fetcher records them, it counts none of them, as the completer
/// counts none; `outcomes_by_fetcher` stays a part of `recorded`.
#[test]
fn outcomes_the_fetcher_records_for_jobs_that_are_gone_count_nowhere() {
    // Every job runs at once (a worker holds no job it cannot start: the jobs that wait at
    // the gate are all running). The gate lets one job end first, and the rest only once the
    // completer is held in its statement for that one: so more outcomes than the fetcher's
    // share wait at once whatever the threads' order (the completer takes every outcome
    // waiting when it wakes, and would otherwise take a varying part of them).
    const JOBS: usize = 300;
    let (db, app) = setup();
    // How many jobs may still pass the gate.
    let gate = Arc::new((Mutex::new(0usize), Condvar::new()));
    let open = |n: usize| {
        let (permits, cv) = &*gate;
        *permits.lock().unwrap() += n;
        cv.notify_all();
    };
    let mut tasks = postpone::Tasks::new();
    {
        let gate = gate.clone();
        tasks.register("ok", move |_: &postpone::Job| {
            let (permits, cv) = &*gate;
            let mut permits = permits.lock().unwrap();
            while *permits == 0 {
                permits = cv.wait(permits).unwrap();
            }
            *permits -= 1;
            Ok(())
        });
    }
    let w = fast_worker(&app, tasks)
        .concurrency(JOBS)
        .stalled_after(Duration::from_secs(30))
        .spawn()
        .unwrap();
    let mut c = db.client();
    let fetcher = fetcher_pid(&mut c);
    // Every update of jobs that is not the fetcher's takes 3 s more (the completer falls
    // behind); the fetcher's statements other than its claims are written down.
    c.batch_execute(&format!(
        "CREATE TABLE fetcher_statements (query text);
         CREATE FUNCTION watch_updates() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF pg_backend_pid() <> {0} THEN
                 PERFORM pg_sleep(3);
             ELSIF current_query() NOT LIKE '%postpone_claim_batch%' THEN
                 INSERT INTO fetcher_statements VALUES (current_query());
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER watch_updates AFTER UPDATE ON postpone_jobs
             FOR EACH STATEMENT EXECUTE FUNCTION watch_updates();",
        fetcher
    ))
    .unwrap();
    defer_n(&app, JOBS);
    let claimed = support::wait_until(Duration::from_secs(30), || w.stats().claimed == JOBS as u64);
    assert!(claimed, "the worker claimed every job: {:?}", w.stats());
    // The jobs go while they run; then one ends, and once the completer records it (held
    // 3 s by the trigger), all the others end at once.
    c.batch_execute("DELETE FROM postpone_jobs").unwrap();
    open(1);
    let completer_held = support::wait_until(Duration::from_secs(30), || {
        c.query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> $1
                AND wait_event = 'PgSleep' AND query LIKE '%postpone_finish%'",
            &[&fetcher],
        )
        .unwrap()
        .get::<_, i64>(0)
            > 0
    });
    assert!(
        completer_held,
        "the completer never recorded the first outcome: {:?}",
        w.stats()
    );
    open(JOBS - 1);
    let fetcher_recorded = support::wait_until(Duration::from_secs(30), || {
        c.query_one("SELECT count(*) FROM fetcher_statements", &[])
            .unwrap()
            .get::<_, i64>(0)
            > 0
    });
    assert!(
        fetcher_recorded,
        "the fetcher never recorded (the test shows nothing): {:?}",
        w.stats()
    );
    // The fetcher counts right after its statement returns: give a wrong count time to show.
    let counted = support::wait_until(Duration::from_secs(2), || w.stats().outcomes_by_fetcher > 0);
    let stats = w.stats();
    println!("{stats:?}");
    assert!(
        !counted,
        "the fetcher counted outcomes no statement applied: {stats:?}"
    );
    assert_eq!(stats.recorded, 0, "{stats:?}");
    assert_eq!(stats.succeeded, JOBS as u64, "{stats:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert_eq!(count(&db, "succeeded") + count(&db, "doing"), 0);
}
