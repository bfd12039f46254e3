//! Periodic tasks against PostgreSQL, with time driven through an injected clock: two
//! workers defer each instant exactly once; a schedule seen for the first time starts at its
//! next instant (no catch-up from before it existed); missed instants after a recorded one
//! are caught up only within the window; a restart resumes after the last deferred instant;
//! bad schedules are refused.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postpone::{App, ErrorKind, Job, TaskError, Tasks, Worker, WorkerBuilder, WorkerHandle};
use serde_json::json;
use support::*;

/// 2024-01-01T12:00:30Z.
const T0: u64 = 1_704_110_430;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// A clock the test moves, and how often each worker has read it. A read is counted under
/// the same lock as the time it returns, so two reads after a move prove that the worker
/// finished a whole round with the new time.
struct TestClock {
    now: Mutex<(SystemTime, Vec<u64>)>,
}

impl TestClock {
    fn new(start: SystemTime, workers: usize) -> Arc<TestClock> {
        Arc::new(TestClock {
            now: Mutex::new((start, vec![0; workers])),
        })
    }

    fn reader(self: &Arc<Self>, worker: usize) -> impl Fn() -> SystemTime + Send + Sync {
        let c = self.clone();
        move || {
            let mut g = c.now.lock().unwrap();
            g.1[worker] += 1;
            g.0
        }
    }

    fn reads(&self) -> Vec<u64> {
        self.now.lock().unwrap().1.clone()
    }

    /// Sets the time, then waits until every worker has run a full round with it.
    fn set_and_settle(&self, t: SystemTime) {
        let before = {
            let mut g = self.now.lock().unwrap();
            g.0 = t;
            g.1.clone()
        };
        self.settle(&before);
    }

    fn settle(&self, before: &[u64]) {
        let ok = wait_until(Duration::from_secs(10), || {
            self.reads()
                .iter()
                .zip(before)
                .all(|(now, then)| *now >= then + 2)
        });
        assert!(
            ok,
            "workers did not read the clock again: {:?}",
            self.reads()
        );
    }
}

fn app(db: &TestDb) -> App {
    let app = App::builder(db.url()).pool_size(2).build().expect("app");
    app.migrate().expect("migrate");
    app
}

fn tasks(every_minute_catch_up: Option<Duration>) -> Tasks {
    let mut t = Tasks::new();
    t.register("tick", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
    let minute = t.periodic("tick", "* * * * *");
    if let Some(w) = every_minute_catch_up {
        minute.catch_up(w);
    }
    t
}

fn builder(app: &App, tasks: Tasks, clock: &Arc<TestClock>, i: usize) -> WorkerBuilder {
    Worker::builder(app, tasks)
        .poll_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(200))
        .stalled_after(Duration::from_secs(2))
        .periodic_clock(clock.reader(i))
}

fn stop(h: WorkerHandle) {
    let r = h.shutdown(Duration::from_secs(5));
    assert!(r.is_clean(), "{r}");
}

/// (periodic id, instant as seconds since the epoch, job id) of every record, in order.
fn records(db: &TestDb) -> Vec<(String, u64, Option<i64>)> {
    db.client()
        .query(
            "SELECT periodic_id, extract(epoch FROM instant)::bigint, job_id
               FROM postpone_periodic ORDER BY periodic_id, instant",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get::<_, i64>(1) as u64, r.get(2)))
        .collect()
}

/// Instants (seconds) of the jobs of task "tick" whose args are `args`, in order.
fn job_instants(db: &TestDb, args: &serde_json::Value) -> Vec<u64> {
    db.client()
        .query(
            "SELECT extract(epoch FROM scheduled_at)::bigint FROM postpone_jobs
              WHERE task = 'tick' AND args::jsonb = $1 ORDER BY scheduled_at",
            &[args],
        )
        .unwrap()
        .iter()
        .map(|r| r.get::<_, i64>(0) as u64)
        .collect()
}

#[test]
fn two_workers_defer_each_instant_once() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let clock = TestClock::new(at(T0), 2);
    let make = || {
        let mut t = tasks(None);
        t.periodic("tick", "*/20 * * * * *")
            .id("fast")
            .args(&json!({"k": "fast"}))
            .queue("fastq")
            .catch_up(Duration::from_secs(60));
        t
    };
    let w0 = builder(&app, make(), &clock, 0).spawn().unwrap();
    let w1 = builder(&app, make(), &clock, 1).spawn().unwrap();
    clock.settle(&[0, 0]);
    // Six steps of 20 s: 12:00:50 ... 12:02:30.
    for step in 1..=6 {
        clock.set_and_settle(at(T0 + 20 * step));
    }
    stop(w0);
    stop(w1);

    let recs = records(&db);
    let minute: Vec<u64> = recs
        .iter()
        .filter(|r| r.0.is_empty())
        .map(|r| r.1)
        .collect();
    let fast: Vec<u64> = recs.iter().filter(|r| r.0 == "fast").map(|r| r.1).collect();
    // Both schedules are new: each starts at its next instant after 12:00:30. Every
    // minute: 12:01 and 12:02.
    let expect_minute: Vec<u64> = (0..2).map(|i| T0 + 30 + i * 60).collect();
    assert_eq!(minute, expect_minute);
    // Every 20 s: 12:00:40 ... 12:02:20.
    let expect_fast: Vec<u64> = (0..6).map(|i| T0 + 10 + i * 20).collect();
    assert_eq!(fast, expect_fast);
    // One job per instant, with the schedule's args and queue, and the record names it.
    assert_eq!(job_instants(&db, &json!(null)), expect_minute);
    assert_eq!(job_instants(&db, &json!({"k": "fast"})), expect_fast);
    let mut c = db.client();
    let row = c
        .query_one(
            "SELECT count(*), count(DISTINCT p.job_id), bool_and(j.queue = CASE WHEN p.periodic_id = 'fast' THEN 'fastq' ELSE 'default' END)
               FROM postpone_periodic p JOIN postpone_jobs j ON j.id = p.job_id",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 8);
    assert_eq!(row.get::<_, i64>(1), 8);
    assert!(row.get::<_, bool>(2));
    let jobs: i64 = c
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(jobs, 8, "no job without its record");
    // The admin API shows which instant a job was deferred for.
    let first = recs.iter().find(|r| r.0 == "fast").unwrap();
    let d = app.admin().job(postpone::JobId(first.2.unwrap())).unwrap();
    assert_eq!(d.periodic_id.as_deref(), Some("fast"));
    assert_eq!(d.periodic_instant, Some(at(first.1)));
}

#[test]
fn missed_instants_are_caught_up_only_within_the_window() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let clock = TestClock::new(at(T0), 1);
    let window = Some(Duration::from_secs(5 * 60));

    // First start: a new schedule, nothing from before it; 12:01 a minute later.
    let w = builder(&app, tasks(window), &clock, 0).spawn().unwrap();
    clock.settle(&[0]);
    let instants = || records(&db).iter().map(|r| r.1).collect::<Vec<u64>>();
    assert_eq!(instants(), Vec::<u64>::new());
    clock.set_and_settle(at(T0 + 60));
    stop(w);
    let first = vec![T0 + 30];
    assert_eq!(instants(), first);

    // Three hours of downtime: only the last 5 minutes are deferred (14:56 ... 15:00).
    let later = T0 + 3 * 3600;
    let before = clock.reads();
    {
        clock.now.lock().unwrap().0 = at(later);
    }
    let w = builder(&app, tasks(window), &clock, 0).spawn().unwrap();
    clock.settle(&before);
    let mut expected = first.clone();
    expected.extend((0..5).map(|i| later - 30 - 4 * 60 + i * 60));
    assert_eq!(instants(), expected);

    // The clock jumps 20 minutes while the worker runs: again only the window.
    clock.set_and_settle(at(later + 20 * 60));
    expected.extend((0..5).map(|i| later + 20 * 60 - 30 - 4 * 60 + i * 60));
    assert_eq!(instants(), expected);
    stop(w);

    // A restart two minutes later resumes after the last instant deferred.
    let before = clock.reads();
    {
        clock.now.lock().unwrap().0 = at(later + 22 * 60);
    }
    let w = builder(&app, tasks(window), &clock, 0).spawn().unwrap();
    clock.settle(&before);
    stop(w);
    expected.extend([later + 21 * 60 - 30, later + 22 * 60 - 30]);
    assert_eq!(instants(), expected);
    assert_eq!(job_instants(&db, &json!(null)), expected);
}

/// The flood the first version deferred: a 2-second schedule that the database had never
/// seen caught up its whole 10-minute window at once (300 jobs for instants before it
/// existed). A new schedule starts at its next instant; with `run_on_start`, plus the start.
#[test]
fn a_schedule_seen_for_the_first_time_starts_at_its_next_instant_not_with_a_flood() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let clock = TestClock::new(at(T0), 1);
    let mut t = Tasks::new();
    t.register("tick", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
    // The default 10-minute catch-up window.
    t.periodic("tick", "*/2 * * * * *").id("plain");
    t.periodic("tick", "*/2 * * * * *")
        .id("boot")
        .run_on_start(true);
    let w = builder(&app, t, &clock, 0).spawn().unwrap();
    clock.settle(&[0]);
    let of = |id: &str| -> Vec<u64> {
        records(&db)
            .into_iter()
            .filter(|r| r.0 == id)
            .map(|r| r.1)
            .collect()
    };
    assert_eq!(of("plain"), Vec::<u64>::new(), "nothing from before now");
    assert_eq!(of("boot"), vec![T0], "only the run-on-start job");
    // Five seconds later: the instants since the start, and no others.
    clock.set_and_settle(at(T0 + 5));
    stop(w);
    assert_eq!(of("plain"), vec![T0 + 2, T0 + 4]);
    assert_eq!(of("boot"), vec![T0, T0 + 2, T0 + 4]);
    assert_eq!(job_instants(&db, &json!(null)).len(), 5);
}

/// A restart with `run_on_start` catches up what it missed: the start's own record is read
/// after the schedule is primed, so it does not hide the instants before it.
#[test]
fn run_on_start_does_not_hide_the_instants_missed_before_it() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let make = || {
        let mut t = Tasks::new();
        t.register("tick", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
        t.periodic("tick", "* * * * *")
            .run_on_start(true)
            .catch_up(Duration::from_secs(5 * 60));
        t
    };
    let instants = || records(&db).iter().map(|r| r.1).collect::<Vec<u64>>();
    let clock = TestClock::new(at(T0), 1);
    let w = builder(&app, make(), &clock, 0).spawn().unwrap();
    clock.settle(&[0]);
    stop(w);
    assert_eq!(instants(), vec![T0]);
    // Three minutes of downtime: 12:01, 12:02 and 12:03 were missed.
    let clock = TestClock::new(at(T0 + 180), 1);
    let w = builder(&app, make(), &clock, 0).spawn().unwrap();
    clock.settle(&[0]);
    stop(w);
    assert_eq!(instants(), vec![T0, T0 + 30, T0 + 90, T0 + 150, T0 + 180]);
}

/// Retention keeps the latest record of every schedule, however old: without it a schedule
/// paused for longer than the retention would start afresh, without its catch-up.
#[test]
fn pruning_keeps_the_latest_instant_of_every_schedule() {
    let db = TestDb::new();
    let app = app(&db);
    db.client()
        .batch_execute(
            "INSERT INTO postpone_periodic (task, periodic_id, instant)
             SELECT 'tick', id, now() - g * interval '1 day'
               FROM generate_series(3, 9) g, unnest(ARRAY['', 'other']) id",
        )
        .unwrap();
    let r = app
        .admin()
        .prune(&postpone::Retention::new(Duration::ZERO))
        .unwrap();
    assert_eq!(r.periodic_deleted, 12);
    let left: Vec<(String, i64)> = db
        .client()
        .query(
            "SELECT periodic_id, round(extract(epoch FROM now() - instant) / 86400)::bigint
               FROM postpone_periodic ORDER BY periodic_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(left, vec![(String::new(), 3), ("other".to_owned(), 3)]);
}

#[test]
fn a_queueing_lock_skips_instants_while_a_job_waits() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let clock = TestClock::new(at(T0), 1);
    let mut t = Tasks::new();
    t.register("tick", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
    t.periodic("tick", "* * * * *")
        .queue("nobody-serves-this")
        .queueing_lock("tick-once")
        .catch_up(Duration::from_secs(150));
    // The worker serves another queue: the first job waits, later instants are skipped.
    let w = builder(&app, t, &clock, 0)
        .queues(["other"])
        .spawn()
        .unwrap();
    clock.settle(&[0]);
    for minute in 1..=3 {
        clock.set_and_settle(at(T0 + 60 * minute));
    }
    stop(w);
    let recs = records(&db);
    assert_eq!(
        recs.iter().map(|r| r.1).collect::<Vec<_>>(),
        vec![T0 + 30, T0 + 90, T0 + 150]
    );
    assert!(recs[0].2.is_some());
    assert_eq!(recs[1].2, None);
    assert_eq!(recs[2].2, None);
    assert_eq!(job_instants(&db, &json!(null)).len(), 1);
}

#[test]
fn bad_schedules_are_refused_at_spawn() {
    let db = TestDb::new();
    let app = app(&db);
    type Setup = Box<dyn Fn(&mut Tasks)>;
    let cases: Vec<(Setup, &str)> = vec![
        (
            Box::new(|t| {
                t.periodic("tick", "every tuesday");
            }),
            "invalid cron schedule \"every tuesday\"",
        ),
        (
            Box::new(|t| {
                t.periodic("nope", "@hourly");
            }),
            "no task \"nope\" is registered",
        ),
        (
            Box::new(|t| {
                t.periodic("tick", "@hourly").id("x");
                t.periodic("tick", "@daily").id("x");
            }),
            "registered twice",
        ),
        (
            Box::new(|t| {
                t.periodic("tick", "@hourly")
                    .catch_up(Duration::from_secs(3 * 86_400));
            }),
            "longer than the 24h allowed",
        ),
    ];
    for (setup, says) in cases {
        let mut t = Tasks::new();
        t.register("tick", |_job: &Job| -> Result<(), TaskError> { Ok(()) });
        setup(&mut t);
        let e = Worker::builder(&app, t).spawn().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    // Nothing was registered or deferred.
    assert!(app.admin().workers().unwrap().is_empty());
    assert!(records(&db).is_empty());
}

#[test]
fn a_worker_racing_another_for_an_instant_rolls_its_job_back() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let clock = TestClock::new(at(T0), 1);
    // The schedule was deferred before, at 11:59:00: it is no new schedule, so a worker
    // catches up after that record.
    db.client()
        .execute(
            "INSERT INTO postpone_periodic (task, periodic_id, instant) VALUES ('tick', '', $1)",
            &[&at(T0 - 90)],
        )
        .unwrap();
    // Another "worker" (this test) holds the record of 12:00:00, not yet committed.
    let mut other = db.client();
    let mut tx = other.transaction().unwrap();
    tx.execute(
        "INSERT INTO postpone_periodic (task, periodic_id, instant) VALUES ('tick', '', $1)",
        &[&at(T0 - 30)],
    )
    .unwrap();
    // Only 12:00:00 is inside a 60 s window at 12:00:30.
    let w = builder(&app, tasks(Some(Duration::from_secs(60))), &clock, 0)
        .spawn()
        .unwrap();
    // The worker passed the NOT EXISTS check, inserted its job, and now waits on the key.
    let mut watch = db.client();
    let name = db.name().to_owned();
    assert!(wait_until(Duration::from_secs(10), || {
        watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%postpone_periodic%'",
                &[&name],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 1
    }));
    let before = clock.reads();
    tx.commit().unwrap();
    clock.settle(&before);
    let stats = w.stats();
    stop(w);
    assert_eq!(stats.db_errors, 0, "losing the race is not an error");
    assert_eq!(
        records(&db),
        vec![
            (String::new(), T0 - 90, None),
            (String::new(), T0 - 30, None)
        ]
    );
    assert!(
        job_instants(&db, &json!(null)).is_empty(),
        "the loser's job was rolled back with its statement"
    );
}

/// A task that records as its output the periodic instant it was deferred for (seconds).
fn instant_recorder(t: &mut Tasks, name: &str) {
    t.register(name, |job: &Job| -> Result<(), TaskError> {
        let instant = job.periodic_instant()?;
        let secs = instant.map(|i| i.duration_since(UNIX_EPOCH).unwrap().as_secs());
        job.set_output(&secs)?;
        Ok(())
    });
}

fn job_of(db: &TestDb, task: &str) -> Vec<postpone::JobId> {
    db.client()
        .query(
            "SELECT id FROM postpone_jobs WHERE task = $1 ORDER BY id",
            &[&task],
        )
        .unwrap()
        .iter()
        .map(|r| postpone::JobId(r.get(0)))
        .collect()
}

#[test]
fn a_zoned_schedule_in_the_dst_gap_runs_when_the_gap_ends_with_its_instant() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    // 2024-03-10T06:50:00Z = 01:50 EST in New York; at 07:00Z clocks jump to 03:00 EDT.
    let gap_end = 1_710_054_000;
    let clock = TestClock::new(at(gap_end - 600), 1);
    let mut t = Tasks::new();
    instant_recorder(&mut t, "zoned");
    t.periodic("zoned", "30 2 * * *")
        .time_zone("America/New_York");
    let h = builder(&app, t, &clock, 0).spawn().unwrap();
    clock.set_and_settle(at(gap_end - 1));
    assert!(
        job_of(&db, "zoned").is_empty(),
        "nothing before the gap ends"
    );
    clock.set_and_settle(at(gap_end + 5));
    let ids = job_of(&db, "zoned");
    assert_eq!(ids.len(), 1);
    let r = app.wait(ids[0], Duration::from_secs(20)).unwrap();
    assert_eq!(r.output_as::<Option<u64>>().unwrap(), Some(gap_end));
    stop(h);
}

#[test]
fn run_on_start_defers_once_per_worker_start_with_the_start_instant() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let clock = TestClock::new(at(T0), 1);
    let make = || {
        let mut t = Tasks::new();
        instant_recorder(&mut t, "boot");
        t.periodic("boot", "@daily").run_on_start(true);
        // Without run_on_start, nothing is deferred before midnight.
        t.periodic("boot", "@daily").id("quiet");
        t
    };
    let h = builder(&app, make(), &clock, 0).spawn().unwrap();
    clock.set_and_settle(at(T0 + 1));
    let ids = job_of(&db, "boot");
    assert_eq!(ids.len(), 1, "one job at start");
    let r = app.wait(ids[0], Duration::from_secs(20)).unwrap();
    assert_eq!(r.output_as::<Option<u64>>().unwrap(), Some(T0));
    stop(h);
    // A later start defers again, for its own instant.
    let clock = TestClock::new(at(T0 + 90), 1);
    let h = builder(&app, make(), &clock, 0).spawn().unwrap();
    clock.set_and_settle(at(T0 + 91));
    let ids = job_of(&db, "boot");
    assert_eq!(ids.len(), 2);
    let r = app.wait(ids[1], Duration::from_secs(20)).unwrap();
    assert_eq!(r.output_as::<Option<u64>>().unwrap(), Some(T0 + 90));
    stop(h);
    // A job deferred by hand has no periodic instant.
    let mut t = Tasks::new();
    instant_recorder(&mut t, "plain");
    let h = Worker::builder(&app, t).spawn().unwrap();
    let r = app
        .job("plain")
        .defer_and_wait(&(), Duration::from_secs(20))
        .unwrap();
    assert_eq!(r.output_as::<Option<u64>>().unwrap(), None);
    stop(h);
}
