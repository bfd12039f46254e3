//! Outcomes that ride on the next claim (`WorkerBuilder::outcomes_ride_claims`): a worker fed
//! a steady stream of jobs records their outcomes in its claims' transactions; every job
//! still ends once, with the right status; an outcome the database refuses inside a claim's
//! transaction costs neither that claim nor the other outcomes; and the switch turns it off.

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use postpone::{App, Job, JobId, Tasks, WorkerStats};
use worker_util::*;

/// Defers `n` jobs one at a time, one every `gap`, so that each claim finds one or two
/// (the regime where outcomes ride: the fetcher claims often and finds less than it asks).
fn stream(app: &App, n: usize, gap: Duration, args: impl Fn(usize) -> i64) -> Vec<JobId> {
    (0..n)
        .map(|i| {
            std::thread::sleep(gap);
            app.defer("ok", &args(i)).unwrap()
        })
        .collect()
}

fn run_stream(ride: bool) -> (WorkerStats, HashMap<i64, usize>, Vec<JobId>) {
    let (db, app) = setup();
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(2)
        .outcomes_ride_claims(ride)
        .spawn()
        .unwrap();
    let ids = stream(&app, 300, Duration::from_millis(1), |i| i as i64);
    for id in &ids {
        wait_status(&db, *id, "succeeded", Duration::from_secs(10));
    }
    let stats = stats_once_recorded(&w, ids.len() as u64);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    let runs = runs.lock().unwrap().clone();
    (stats, runs, ids)
}

#[test]
fn a_steady_stream_records_its_outcomes_with_the_claims_and_each_job_once() {
    let (stats, runs, ids) = run_stream(true);
    println!("{stats:?}");
    for id in &ids {
        assert_eq!(runs.get(&id.0), Some(&1), "job {id} ran once");
    }
    assert_eq!(stats.recorded, 300, "{stats:?}");
    // Most of them ride (288 of 300 on a quiet machine, 88 with two more test binaries
    // running); a loaded machine spreads the claims out, and outcomes then have commits of
    // their own.
    assert!(
        stats.outcomes_on_claims >= 10,
        "outcomes recorded with a claim: {stats:?}"
    );
    assert!(stats.outcomes_on_claims <= stats.recorded, "{stats:?}");
}

#[test]
fn with_riding_off_every_outcome_has_a_commit_of_its_own() {
    let (stats, runs, ids) = run_stream(false);
    for id in &ids {
        assert_eq!(runs.get(&id.0), Some(&1), "job {id} ran once");
    }
    assert_eq!(stats.recorded, 300, "{stats:?}");
    assert_eq!(stats.outcomes_on_claims, 0, "{stats:?}");
}

/// A trigger of the user's refuses some outcomes. Recorded with a claim, such a refusal
/// rolls back the claim's transaction: the claim is sent again alone, the outcomes go back to
/// the completer, which records the others and fails the refused jobs with the reason.
#[test]
fn an_outcome_refused_inside_a_claims_transaction_costs_nothing_else() {
    let (db, app) = setup();
    db.client()
        .batch_execute(
            "CREATE FUNCTION refuse_tens() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.status = 'succeeded' AND (NEW.args #>> '{}')::bigint % 10 = 0 THEN
                     RAISE EXCEPTION 'multiples of ten may not succeed';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_tens BEFORE UPDATE ON postpone_jobs
                 FOR EACH ROW EXECUTE FUNCTION refuse_tens();",
        )
        .unwrap();
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    // 300 jobs, every tenth refused; then, once all of them are recorded, 300 more with no
    // refusal: some of those still ride, so refusals stopped neither riding nor claiming.
    // (How many ride depends on the machine's load: 192 of the first 300 on a quiet
    // machine.)
    let ids = stream(&app, 300, Duration::from_millis(1), |i| i as i64 + 1);
    for (i, id) in ids.iter().enumerate() {
        let refused = (i + 1) % 10 == 0;
        let row = wait_status(
            &db,
            *id,
            if refused { "failed" } else { "succeeded" },
            Duration::from_secs(10),
        );
        if refused {
            assert!(
                row.error_texts()[0].contains("multiples of ten may not succeed"),
                "{:?}",
                row.errors
            );
        }
    }
    let after_refusals = stats_once_recorded(&w, ids.len() as u64);
    let more = stream(&app, 300, Duration::from_millis(1), |i| 10 * i as i64 + 1);
    for id in &more {
        wait_status(&db, *id, "succeeded", Duration::from_secs(10));
    }
    let stats = stats_once_recorded(&w, (ids.len() + more.len()) as u64);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    let runs = runs.lock().unwrap();
    for id in ids.iter().chain(&more) {
        assert_eq!(runs.get(&id.0), Some(&1), "job {id} ran once");
    }
    println!("{after_refusals:?}\n{stats:?}");
    assert!(
        stats.outcomes_on_claims > after_refusals.outcomes_on_claims,
        "no outcome rode a claim after the refusals: {after_refusals:?} then {stats:?}"
    );
}

/// A finished job whose row someone else holds locked (an admin command, a transaction of
/// the user's) must not stall the claims its outcome rides on: the claim gives the
/// recording up after its lock timeout and goes alone, and the completer waits for the row.
#[test]
fn a_locked_job_row_does_not_hold_up_the_claims() {
    let (db, app) = setup();
    let (started_tx, started_rx) = crossbeam_channel::unbounded::<(i64, i64)>();
    let (gate_tx, gate_rx) = crossbeam_channel::unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks.register("ok", move |job: &Job| {
        let n = job.args::<i64>()?;
        let _ = started_tx.send((job.id().0, n));
        // The first job ends only once the test holds its row.
        if n == 0 {
            let _ = gate_rx.recv_timeout(Duration::from_secs(10));
        }
        Ok(())
    });
    let w = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    // The stream runs before, during and after the lock.
    let feeder = {
        let app = app.clone();
        std::thread::spawn(move || stream(&app, 1500, Duration::from_millis(1), |i| i as i64))
    };
    let held = loop {
        let (id, n) = started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        if n == 0 {
            break id;
        }
    };
    // The claim's transaction committed: the row lock is taken at once.
    let mut locker = db.client();
    let mut tx = locker.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM postpone_jobs WHERE id = $1 AND status = 'doing' FOR UPDATE",
        &[&held],
    )
    .unwrap();
    gate_tx.send(()).unwrap();
    // While the row is held, other jobs go on starting (through the second thread): 30 of
    // them within 5 s (a stalled claim let 8 start, however long the row was held; a loaded
    // machine may need more than the second a quiet one takes).
    let until = Instant::now() + Duration::from_secs(5);
    let mut started_meanwhile = 0;
    while started_meanwhile < 30
        && started_rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .is_ok()
    {
        started_meanwhile += 1;
    }
    let status: String = tx
        .query_one("SELECT status FROM postpone_jobs WHERE id = $1", &[&held])
        .unwrap()
        .get(0);
    assert_eq!(status, "doing", "its outcome waits for the row");
    tx.rollback().unwrap();
    assert!(
        started_meanwhile >= 30,
        "only {started_meanwhile} jobs started in 5 s while one finished job's row was locked"
    );
    let ids = feeder.join().unwrap();
    for id in &ids {
        wait_status(&db, *id, "succeeded", Duration::from_secs(20));
    }
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// Reset connections (the server gone, as the worker sees it) in the middle of a stream
/// whose outcomes ride on claims: a claim's transaction cut off before its reply hands its
/// outcomes back to the completer, which records them (or finds them recorded); every job
/// succeeds, and none runs twice.
#[test]
fn resets_during_riding_lose_no_outcome_and_run_no_job_twice() {
    let (db, direct) = setup();
    let proxy = support::FaultProxy::start(&db.server_addr());
    let app = app_at(&db.url_via(&proxy), Duration::from_secs(2));
    let (tasks, runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(2)
        // Long enough that no reset makes the worker presumed dead (which would allow a rerun).
        .stalled_after(Duration::from_secs(20))
        .spawn()
        .unwrap();
    let feeder = {
        let direct = direct.clone();
        std::thread::spawn(move || stream(&direct, 1000, Duration::from_millis(1), |i| i as i64))
    };
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(150));
        proxy.reset_all();
    }
    let ids = feeder.join().unwrap();
    for id in &ids {
        wait_status(&db, *id, "succeeded", Duration::from_secs(20));
    }
    let stats = w.stats();
    println!("{stats:?}");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    let runs = runs.lock().unwrap();
    for id in &ids {
        assert_eq!(runs.get(&id.0), Some(&1), "job {id} ran once");
    }
    assert!(
        stats.connections_opened > 3,
        "the resets cut links: {stats:?}"
    );
    assert!(stats.outcomes_on_claims > 0, "{stats:?}");
}
