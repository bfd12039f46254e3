//! Schedules stored in the database (`Admin::set_schedule` and friends), against PostgreSQL
//! with the real clock and schedules of one instant a second: a schedule added at runtime is
//! deferred once per instant across three workers; pause, resume, a change of cron and a
//! delete reach the workers within a poll interval, a resume without a flood of the paused
//! instants; a stored schedule replaces a code one with its (task, id); a worker that does not
//! register the task defers nothing; bad inputs are refused with errors that say why.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postpone::{App, ErrorKind, Job, NewSchedule, TaskError, Tasks, Worker, WorkerHandle};
use serde_json::json;
use support::*;

const POLL: Duration = Duration::from_millis(200);
/// Longer than a poll interval plus a round of the periodic thread, with a wide margin: a
/// change is followed by every worker after this.
const SETTLE: Duration = Duration::from_millis(1500);

fn app(db: &TestDb) -> App {
    let app = App::builder(db.url()).pool_size(2).build().expect("app");
    app.migrate().expect("migrate");
    app
}

fn tick_tasks(ran: &Arc<AtomicUsize>) -> Tasks {
    let mut t = Tasks::new();
    let r = ran.clone();
    t.register("tick", move |_job: &Job| -> Result<(), TaskError> {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    t
}

fn worker(app: &App, tasks: Tasks, name: &str) -> WorkerHandle {
    Worker::builder(app, tasks)
        .name(name)
        .poll_interval(POLL)
        .heartbeat_interval(Duration::from_millis(500))
        .stalled_after(Duration::from_secs(5))
        .spawn()
        .expect("spawn")
}

fn stop(h: WorkerHandle) {
    let r = h.shutdown(Duration::from_secs(5));
    assert!(r.is_clean(), "{r}");
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Instants recorded for (task, id), as whole seconds since the epoch, in order.
fn instants(db: &TestDb, task: &str, id: &str) -> Vec<i64> {
    db.client()
        .query(
            "SELECT extract(epoch FROM instant)::bigint FROM postpone_periodic
              WHERE task = $1 AND periodic_id = $2 ORDER BY instant",
            &[&task, &id],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Number of jobs of `task` per scheduled instant (whole seconds).
fn jobs_per_instant(db: &TestDb, task: &str) -> BTreeMap<i64, i64> {
    db.client()
        .query(
            "SELECT extract(epoch FROM scheduled_at)::bigint, count(*) FROM postpone_jobs
              WHERE task = $1 GROUP BY 1 ORDER BY 1",
            &[&task],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Every recorded instant has exactly one job, and every job one recorded instant.
fn assert_exactly_once(db: &TestDb, task: &str, ids: &[&str]) {
    let per = jobs_per_instant(db, task);
    let mut recorded: Vec<i64> = ids.iter().flat_map(|id| instants(db, task, id)).collect();
    recorded.sort_unstable();
    let doubles: Vec<_> = per.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubles.is_empty(),
        "instants with other than one job: {doubles:?}"
    );
    assert_eq!(
        per.keys().copied().collect::<Vec<_>>(),
        recorded,
        "jobs and records differ"
    );
}

#[test]
fn a_schedule_added_at_runtime_is_deferred_once_per_instant_across_three_workers() {
    let db = TestDb::new();
    let app = app(&db);
    let ran = Arc::new(AtomicUsize::new(0));
    let workers: Vec<WorkerHandle> = (0..3)
        .map(|i| worker(&app, tick_tasks(&ran), &format!("w{i}")))
        .collect();
    // A schedule of a task no worker registers: nobody defers it.
    let admin = app.admin();
    admin
        .set_schedule(&NewSchedule::new("ghost", "*/1 * * * * *"))
        .unwrap();
    let created = admin
        .set_schedule(&NewSchedule::new("tick", "*/1 * * * * *").args(&json!({"n": 1})))
        .unwrap();
    assert!(created);
    let since = admin.schedule("tick", "").unwrap().since;
    assert!(
        wait_until(Duration::from_secs(20), || instants(&db, "tick", "").len()
            >= 8),
        "{:?}",
        instants(&db, "tick", "")
    );
    for w in workers {
        stop(w);
    }
    let got = instants(&db, "tick", "");
    // Consecutive seconds, from the first after the schedule was stored: none missed, none
    // from before it existed.
    let first = got[0];
    assert!(first as f64 > secs(since) - 0.001, "{first} vs {since:?}");
    assert!(
        (first as f64) < secs(since) + 2.5,
        "the first instant came late: {first} vs {:?}",
        since
    );
    let expected: Vec<i64> = (first..first + got.len() as i64).collect();
    assert_eq!(got, expected, "an instant was missed");
    assert_exactly_once(&db, "tick", &[""]);
    assert!(instants(&db, "ghost", "").is_empty());
    let ghost = admin.schedule("ghost", "").unwrap();
    assert_eq!(ghost.last_instant, None);
    let tick = admin.schedule("tick", "").unwrap();
    assert_eq!(
        tick.last_instant.map(|t| secs(t) as i64),
        got.last().copied()
    );
    assert_eq!(tick.args.get(), r#"{"n": 1}"#);
    assert!(ran.load(Ordering::SeqCst) >= 1);
}

#[test]
fn pause_resume_change_and_delete_reach_every_worker_within_a_poll_interval() {
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();
    let ran = Arc::new(AtomicUsize::new(0));
    let workers: Vec<WorkerHandle> = (0..2)
        .map(|i| worker(&app, tick_tasks(&ran), &format!("w{i}")))
        .collect();
    admin
        .set_schedule(&NewSchedule::new("tick", "*/1 * * * * *").id("s"))
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || instants(
        &db, "tick", "s"
    )
    .len()
        >= 3));

    // Pause: nothing new once the workers have read it.
    assert!(admin.pause_schedule("tick", "s").unwrap());
    assert!(!admin.pause_schedule("tick", "s").unwrap(), "paused twice");
    let paused_at = admin.schedule("tick", "s").unwrap().paused_at.unwrap();
    assert!(admin.schedule("tick", "s").unwrap().next_instant.is_none());
    sleep(SETTLE);
    let during = instants(&db, "tick", "s");
    assert!(
        (*during.last().unwrap() as f64) < secs(paused_at) + SETTLE.as_secs_f64(),
        "deferred long after the pause: {during:?} paused at {paused_at:?}"
    );
    sleep(Duration::from_secs(3));
    assert_eq!(instants(&db, "tick", "s"), during, "deferred while paused");

    // Resume: new instants from the resume on, none of the paused seconds caught up (the
    // catch-up window of 10 minutes would allow them).
    assert!(admin.resume_schedule("tick", "s").unwrap());
    assert!(!admin.resume_schedule("tick", "s").unwrap());
    let resumed = admin.schedule("tick", "s").unwrap().since;
    assert!(wait_until(Duration::from_secs(20), || {
        instants(&db, "tick", "s").len() >= during.len() + 3
    }));
    let after: Vec<i64> = instants(&db, "tick", "s")[during.len()..].to_vec();
    assert!(
        after[0] as f64 > secs(resumed) - 0.001,
        "a paused instant was caught up: {after:?} resumed at {resumed:?}"
    );
    assert!(
        (after[0] as f64) < secs(resumed) + 2.5,
        "the first instant after the resume came late: {after:?} vs {resumed:?}"
    );

    // Change of cron: every other second from now on.
    admin
        .set_schedule(&NewSchedule::new("tick", "*/2 * * * * *").id("s"))
        .unwrap();
    let changed = admin.schedule("tick", "s").unwrap().since;
    assert!(secs(changed) > secs(resumed));
    let settled = secs(changed) + SETTLE.as_secs_f64();
    assert!(wait_until(Duration::from_secs(20), || {
        instants(&db, "tick", "s")
            .iter()
            .filter(|i| **i as f64 > settled)
            .count()
            >= 3
    }));
    let new: Vec<i64> = instants(&db, "tick", "s")
        .into_iter()
        .filter(|i| *i as f64 > settled)
        .collect();
    assert!(
        new.iter().all(|i| i % 2 == 0),
        "odd seconds after the change: {new:?}"
    );
    assert!(new.windows(2).all(|w| w[1] - w[0] == 2), "{new:?}");

    // Delete: nothing new.
    admin.delete_schedule("tick", "s").unwrap();
    sleep(SETTLE);
    let end = instants(&db, "tick", "s");
    sleep(Duration::from_secs(3));
    assert_eq!(instants(&db, "tick", "s"), end, "deferred after the delete");
    assert!(admin.schedules().unwrap().is_empty());
    for w in workers {
        stop(w);
    }
    assert_exactly_once(&db, "tick", &["s"]);
}

#[test]
fn a_stored_schedule_replaces_the_code_schedule_of_its_task_and_id() {
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();
    // Stored first, paused: the code's schedule of ("tick", "") must not run at all, its
    // run-on-start job neither.
    admin
        .set_schedule(&NewSchedule::new("tick", "*/1 * * * * *"))
        .unwrap();
    admin.pause_schedule("tick", "").unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let mut tasks = tick_tasks(&ran);
    tasks.periodic("tick", "*/1 * * * * *").run_on_start(true);
    let w = worker(&app, tasks, "coded");
    sleep(Duration::from_secs(3));
    assert!(
        instants(&db, "tick", "").is_empty(),
        "the replaced code schedule ran: {:?}",
        instants(&db, "tick", "")
    );
    // The stored one resumed: it runs (once per instant).
    admin.resume_schedule("tick", "").unwrap();
    assert!(wait_until(Duration::from_secs(20), || instants(
        &db, "tick", ""
    )
    .len()
        >= 2));
    // Paused again: the code's schedule stays replaced.
    admin.pause_schedule("tick", "").unwrap();
    sleep(SETTLE);
    let paused = instants(&db, "tick", "");
    sleep(Duration::from_secs(3));
    assert_eq!(instants(&db, "tick", ""), paused);
    // Deleted: the worker follows its code again.
    admin.delete_schedule("tick", "").unwrap();
    assert!(wait_until(Duration::from_secs(20), || {
        instants(&db, "tick", "").len() >= paused.len() + 2
    }));
    stop(w);
    assert_exactly_once(&db, "tick", &[""]);
}

#[test]
fn bad_schedules_and_unknown_names_are_refused_with_clear_errors() {
    let db = TestDb::new();
    let app = app(&db);
    let admin = app.admin();
    for (s, says) in [
        (NewSchedule::new("", "@daily"), "task must not be empty"),
        (
            NewSchedule::new("t", "61 * * * *"),
            "invalid cron schedule \"61 * * * *\"",
        ),
        (NewSchedule::new("t", "* * * *"), "expected 5 fields"),
        (
            NewSchedule::new("t", "@daily").time_zone("Mars/Olympus_Mons"),
            "unknown time zone \"Mars/Olympus_Mons\"",
        ),
        (NewSchedule::new("x".repeat(256), "@daily"), "at most 255"),
        (
            NewSchedule::new("t", "@daily").id("i".repeat(256)),
            "at most 255",
        ),
        (
            NewSchedule::new("t", "@daily").catch_up(Duration::from_secs(2 * 86_400)),
            "longer than the 24h",
        ),
    ] {
        let e = admin.set_schedule(&s).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
        assert!(
            e.to_string().starts_with("setting a schedule: schedule "),
            "{e}"
        );
    }
    assert!(
        admin.schedules().unwrap().is_empty(),
        "a bad schedule was stored"
    );
    // Created once; a second create is refused, a set replaces.
    let s = NewSchedule::new("t", "0 9 * * *").time_zone("Asia/Tokyo");
    admin.create_schedule(&s).unwrap();
    let e = admin.create_schedule(&s).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    assert!(e.to_string().contains("exists already"), "{e}");
    assert!(!admin.set_schedule(&s.clone().queue("q")).unwrap());
    let info = admin.schedule("t", "").unwrap();
    assert_eq!(info.queue.as_deref(), Some("q"));
    assert_eq!(info.time_zone.as_deref(), Some("Asia/Tokyo"));
    // 09:00 in Tokyo is 00:00 UTC.
    let next = secs(info.next_instant.unwrap()) as i64;
    assert_eq!(next % 86_400, 0, "{next}");
    for e in [
        admin.pause_schedule("t", "nope").unwrap_err(),
        admin.resume_schedule("nope", "").unwrap_err(),
        admin.delete_schedule("nope", "").unwrap_err(),
        admin.schedule("nope", "").unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("no stored schedule"), "{e}");
    }
}
