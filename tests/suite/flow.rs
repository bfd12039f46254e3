//! Flow control against the real PostgreSQL with several workers: a paused queue is never
//! started (the tasks record their starts), resuming wakes the workers at once (their poll is
//! too slow to explain it), running jobs finish, pausing all queues, pauses survive a worker
//! restart, and bad queue names are clear errors.

use crate::support;
use crate::worker_util;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::unbounded;
use postpone::{ErrorKind, Job, Tasks, WorkerHandle};
use support::wait_until;
use worker_util::*;

const SHUTDOWN: Duration = Duration::from_secs(5);
/// Longer than any test waits: a job that runs after a resume was woken by the notification.
const SLOW_POLL: Duration = Duration::from_secs(60);

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(SHUTDOWN);
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

type Starts = Arc<Mutex<Vec<(String, i64)>>>;

/// Tasks whose `record` task notes (queue, job id) in `starts` when it starts.
fn recording_into(starts: &Starts) -> Tasks {
    let seen = starts.clone();
    let mut tasks = Tasks::new();
    tasks.register("record", move |job: &Job| {
        seen.lock()
            .unwrap()
            .push((job.queue().to_owned(), job.id().get()));
        Ok(())
    });
    tasks
}

/// Tasks that record their starts, and the record.
fn recording() -> (Tasks, Starts) {
    let starts: Starts = Arc::default();
    (recording_into(&starts), starts)
}

fn started_in(starts: &Starts, queue: &str) -> usize {
    starts
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.0 == queue)
        .count()
}

fn count(db: &support::TestDb, queue: &str, status: &str) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE queue = $1 AND status = $2",
            &[&queue, &status],
        )
        .unwrap()
        .get(0)
}

#[test]
fn a_paused_queue_is_never_started_and_resume_wakes_every_worker() {
    let (db, app) = setup();
    let admin = app.admin();
    assert!(admin.paused().unwrap().is_empty());
    assert!(admin.pause("slow").unwrap(), "a new pause");
    assert!(
        !admin.pause("slow").unwrap(),
        "already paused: nothing changes"
    );
    let p = admin.paused().unwrap();
    assert!(p.is_paused("slow") && !p.is_paused("fast") && p.all.is_none());
    assert_eq!(p.queues.len(), 1);

    let starts: Starts = Arc::default();
    let mut handles = Vec::new();
    // Workers of every queue (the claim finds the queues itself) and of named queues.
    for i in 0..3 {
        let b = fast_worker(&app, recording_into(&starts))
            .poll_interval(SLOW_POLL)
            .concurrency(2);
        let b = if i == 2 {
            b.queues(["slow", "fast"])
        } else {
            b
        };
        handles.push(b.spawn().unwrap());
    }
    // Higher priority in the paused queue: a claim that ignored the pause would take them
    // first.
    for i in 0..20 {
        app.job("record")
            .queue("slow")
            .priority(10)
            .defer(&i)
            .unwrap();
        app.job("record").queue("fast").defer(&i).unwrap();
        app.job("record").queue("other").defer(&i).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || count(&db, "fast", "succeeded")
            == 20
            && count(&db, "other", "succeeded") == 20),
        "the queues not paused ran"
    );
    // More claims go by (every deferred job woke the workers); nothing of "slow" started.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(started_in(&starts, "slow"), 0);
    assert_eq!(count(&db, "slow", "todo"), 20);

    assert!(admin.resume("slow").unwrap());
    assert!(!admin.resume("slow").unwrap(), "not paused any more");
    assert!(admin.paused().unwrap().is_empty());
    // Woken by the notification: the workers' poll (60 s) is far longer than this wait.
    assert!(
        wait_until(Duration::from_secs(20), || count(&db, "slow", "succeeded")
            == 20),
        "resume starts the queue again: {} started",
        started_in(&starts, "slow")
    );
    for h in handles {
        stop(h);
    }
    assert_eq!(started_in(&starts, "slow"), 20, "each job ran once");
}

#[test]
fn pausing_lets_running_jobs_finish_and_pause_all_holds_every_queue() {
    let (db, app) = setup();
    let admin = app.admin();
    let (started_tx, started_rx) = unbounded::<i64>();
    let (release_tx, release_rx) = unbounded::<()>();
    let starts: Starts = Arc::default();
    let mut handles = Vec::new();
    for _ in 0..2 {
        let (started_tx, release_rx, seen) =
            (started_tx.clone(), release_rx.clone(), starts.clone());
        let mut tasks = Tasks::new();
        tasks.register("block", move |job: &Job| {
            seen.lock()
                .unwrap()
                .push((job.queue().to_owned(), job.id().get()));
            started_tx.send(job.id().get()).unwrap();
            release_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            Ok(())
        });
        handles.push(
            fast_worker(&app, tasks)
                .poll_interval(Duration::from_millis(100))
                .concurrency(2)
                .spawn()
                .unwrap(),
        );
    }
    for i in 0..2 {
        app.job("block").queue("q").defer(&i).unwrap();
    }
    for _ in 0..2 {
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    assert!(admin.pause("q").unwrap());
    for i in 2..5 {
        app.job("block").queue("q").defer(&i).unwrap();
    }
    for _ in 0..2 {
        release_tx.send(()).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(10), || count(&db, "q", "succeeded")
            == 2),
        "the running jobs finish after the pause"
    );
    // Several polls (100 ms) go by: nothing more starts.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(started_in(&starts, "q"), 2);
    assert_eq!(count(&db, "q", "todo"), 3);

    // Pausing all queues holds queues with no pause of their own, and those with one even
    // after their own is lifted.
    assert!(admin.pause_all().unwrap());
    assert!(!admin.pause_all().unwrap());
    app.job("block").queue("r").defer(&9).unwrap();
    assert!(admin.resume("q").unwrap());
    let p = admin.paused().unwrap();
    assert!(p.all.is_some() && p.is_paused("q") && p.is_paused("r") && p.queues.is_empty());
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(started_in(&starts, "q") + started_in(&starts, "r"), 2);

    assert!(admin.pause("r").unwrap());
    assert_eq!(
        admin.resume_all().unwrap(),
        2,
        "the pause of all and that of r"
    );
    for _ in 0..4 {
        release_tx.send(()).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(10), || count(&db, "q", "succeeded")
            == 5
            && count(&db, "r", "succeeded") == 1),
        "everything runs after resume_all"
    );
    for h in handles {
        stop(h);
    }
}

#[test]
fn a_pause_survives_a_worker_restart() {
    let (db, app) = setup();
    assert!(app.admin().pause("kept").unwrap());
    let (tasks, starts) = recording();
    let h = fast_worker(&app, tasks).spawn().unwrap();
    let ids: Vec<i64> = (0..5)
        .map(|i| app.job("record").queue("kept").defer(&i).unwrap().get())
        .collect();
    app.job("record").queue("free").defer(&0).unwrap();
    assert!(wait_until(Duration::from_secs(10), || count(
        &db,
        "free",
        "succeeded"
    ) == 1));
    stop(h);

    // A new App and a new worker (another process, as far as the database can tell).
    let app2 = app_at(&db.url(), Duration::from_secs(5));
    assert!(app2.admin().paused().unwrap().is_paused("kept"));
    let (tasks, starts2) = recording();
    let h = fast_worker(&app2, tasks).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        started_in(&starts, "kept") + started_in(&starts2, "kept"),
        0
    );
    assert!(app2.admin().resume("kept").unwrap());
    assert!(wait_until(Duration::from_secs(10), || count(
        &db,
        "kept",
        "succeeded"
    ) == 5));
    stop(h);
    let mut ran: Vec<i64> = starts2.lock().unwrap().iter().map(|s| s.1).collect();
    ran.sort();
    assert_eq!(ran, ids);
}

#[test]
fn bad_queue_names_are_clear_errors() {
    let (_db, app) = setup();
    let admin = app.admin();
    let long = "q".repeat(256);
    for (what, res) in [
        ("pause empty", admin.pause("")),
        ("pause long", admin.pause(&long)),
        ("pause nul", admin.pause("a\0b")),
        ("resume empty", admin.resume("")),
        ("resume long", admin.resume(&long)),
    ] {
        let e = res.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
        let msg = e.to_string();
        assert!(msg.contains("queue"), "{what}: {msg}");
        assert!(
            msg.len() < 200,
            "{what}: the message does not echo the name: {msg}"
        );
    }
    // 255 bytes is allowed; nothing was stored by the refused calls.
    assert!(admin.pause(&"q".repeat(255)).unwrap());
    assert_eq!(admin.paused().unwrap().queues.len(), 1);
}

/// A queue is known by its jobs, whatever their status, and by the workers that serve it by
/// name; its settings alone (a pause, a limit) do not make a typo a queue.
#[test]
fn queue_seen_knows_queues_by_their_jobs_and_workers_not_by_their_settings() {
    let (db, app) = setup();
    let admin = app.admin();
    assert!(!admin.queue_seen("typo").unwrap());
    admin.pause("typo").unwrap();
    admin.set_queue_limit("typo", Some(2)).unwrap();
    assert!(
        !admin.queue_seen("typo").unwrap(),
        "settings are not sightings"
    );
    let mut c = db.client();
    for (queue, status) in [
        ("waiting", "todo"),
        ("running", "doing"),
        ("done", "succeeded"),
        ("gone", "failed"),
    ] {
        c.execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, attempts, started_at, finished_at)
             VALUES ($1, 't', 'null', $2::text, 1, now(),
                     CASE WHEN $2::text IN ('succeeded', 'failed') THEN now() END)",
            &[&queue, &status],
        )
        .unwrap();
        assert!(admin.queue_seen(queue).unwrap(), "{queue} ({status})");
    }
    // A worker that serves a queue by name makes it known while it is registered.
    let (tasks, _starts) = recording();
    let h = fast_worker(&app, tasks).queues(["served"]).spawn().unwrap();
    assert!(admin.queue_seen("served").unwrap());
    stop(h);
    assert!(!admin.queue_seen("served").unwrap());
    let e = admin.queue_seen("").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

#[test]
fn a_snoozed_job_runs_again_later_without_using_an_attempt() {
    use postpone::TaskError;
    use std::time::Instant;
    let (db, app) = setup();
    // (job id, attempt seen by the task, when), per run.
    let runs: Arc<Mutex<Vec<(i64, u32, Instant)>>> = Arc::default();
    let mut handles = Vec::new();
    for _ in 0..2 {
        let seen = runs.clone();
        let mut tasks = Tasks::new();
        // The default strategy allows one attempt: a snooze that used one would fail the job.
        tasks.register("nap", move |job: &Job| {
            let mut runs = seen.lock().unwrap();
            let before = runs.iter().filter(|r| r.0 == job.id().get()).count();
            runs.push((job.id().get(), job.attempts(), Instant::now()));
            if before < 3 {
                return Err(TaskError::snooze(Duration::from_millis(300)));
            }
            Ok(())
        });
        tasks.register("forever", |_job: &Job| {
            Err(TaskError::snooze(Duration::MAX))
        });
        handles.push(fast_worker(&app, tasks).spawn().unwrap());
    }
    let ids: Vec<i64> = (0..3)
        .map(|i| app.job("nap").defer(&i).unwrap().get())
        .collect();
    let forever = app.job("forever").defer(&0).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || count(
            &db,
            "default",
            "succeeded"
        ) == 3),
        "the snoozed jobs ran again and succeeded"
    );
    for h in handles {
        stop(h);
    }
    let runs = runs.lock().unwrap().clone();
    let admin = app.admin();
    for id in ids {
        let mine: Vec<&(i64, u32, Instant)> = runs.iter().filter(|r| r.0 == id).collect();
        assert_eq!(
            mine.len(),
            4,
            "job {id}: three snoozes, then the run that succeeded"
        );
        assert!(
            mine.iter().all(|r| r.1 == 1),
            "job {id}: always attempt 1: {mine:?}"
        );
        for w in mine.windows(2) {
            let gap = w[1].2 - w[0].2;
            assert!(
                gap >= Duration::from_millis(250),
                "job {id}: ran again after {gap:?}, before its snooze ended"
            );
        }
        let d = admin.job(postpone::JobId(id)).unwrap();
        assert_eq!(d.snoozes, 3, "job {id}");
        assert_eq!(d.job.attempts, 1, "job {id}");
        assert!(
            d.errors.is_empty(),
            "a snooze is not an error: {:?}",
            d.errors
        );
    }
    // A delay past what the database stores is clamped (about 100 years), not an error.
    let d = admin.job(forever).unwrap();
    assert_eq!(d.job.status, postpone::JobStatus::Todo);
    assert_eq!((d.snoozes, d.job.attempts), (1, 0));
    let years = d
        .job
        .scheduled_at
        .duration_since(std::time::SystemTime::now())
        .unwrap()
        .as_secs()
        / (365 * 24 * 3600);
    assert!((99..=101).contains(&years), "{years} years");
}

#[test]
fn max_attempts_at_defer_time_overrides_the_tasks_strategy() {
    use postpone::{NewJob, RetryStrategy};
    let (db, app) = setup();
    let runs: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut handles = Vec::new();
    for _ in 0..2 {
        let (a, b) = (runs.clone(), runs.clone());
        let mut tasks = Tasks::new();
        tasks
            .register("five", move |job: &Job| {
                a.lock().unwrap().push(job.id().get());
                Err(std::io::Error::other("always").into())
            })
            .retry(RetryStrategy::fixed(Duration::ZERO, 5));
        // The default strategy: one attempt.
        tasks.register("once", move |job: &Job| {
            b.lock().unwrap().push(job.id().get());
            Err(std::io::Error::other("always").into())
        });
        handles.push(fast_worker(&app, tasks).spawn().unwrap());
    }
    let fewer = app.job("five").max_attempts(2).defer(&0).unwrap();
    let one = app.job("five").max_attempts(1).defer(&1).unwrap();
    let strategy = app.job("five").defer(&2).unwrap();
    let more = app.job("once").max_attempts(3).defer(&3).unwrap();
    let ids = app
        .defer_batch(&[NewJob::new("once", &4).unwrap().max_attempts(2)])
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || count(&db, "default", "failed")
            == 5),
        "every job fails in the end"
    );
    for h in handles {
        stop(h);
    }
    let runs = runs.lock().unwrap().clone();
    let admin = app.admin();
    for (id, want, limit) in [
        (fewer, 2, Some(2)),
        (one, 1, Some(1)),
        (strategy, 5, None),
        (more, 3, Some(3)),
        (ids[0], 2, Some(2)),
    ] {
        assert_eq!(
            runs.iter().filter(|r| **r == id.get()).count(),
            want,
            "job {id}: its runs"
        );
        let d = admin.job(id).unwrap();
        assert_eq!(d.job.attempts, want as u32, "job {id}");
        assert_eq!(d.max_attempts, limit, "job {id}");
    }
}

#[test]
fn max_attempts_below_one_is_refused_before_anything_is_inserted() {
    use postpone::NewJob;
    let (db, app) = setup();
    let e = app.job("t").max_attempts(0).defer(&0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("max_attempts"), "{e}");
    let e = app.job("t").max_attempts(u32::MAX).defer(&0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = app
        .defer_batch(&[
            NewJob::new("t", &1).unwrap(),
            NewJob::new("t", &2).unwrap().max_attempts(0),
        ])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("job 1 of the batch"), "{e}");
    let n: i64 = db
        .client()
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[test]
fn tags_and_meta_are_stored_shown_and_filtered_on() {
    use postpone::{JobFilter, NewJob};
    use serde_json::json;
    let (db, app) = setup();
    let a = app
        .job("t")
        .tags(["billing", "eu"])
        .meta(&json!({"request": "r-1", "n": 7}))
        .defer(&1)
        .unwrap();
    let ids = app
        .defer_batch(&[
            NewJob::new("t", &2).unwrap().tags(["billing"]),
            NewJob::new("t", &3).unwrap(),
            NewJob::new("t", &4)
                .unwrap()
                .tags(Vec::<String>::new())
                .meta(&json!({})),
        ])
        .unwrap();
    let mut client = db.client();
    let mut tx = client.transaction().unwrap();
    let c = app
        .job("t")
        .tags(["eu"])
        .meta(&json!({"k": [1, 2]}))
        .defer_in(&mut tx, &5)
        .unwrap();
    tx.commit().unwrap();

    let admin = app.admin();
    let d = admin.job(a).unwrap();
    assert_eq!(d.tags, ["billing", "eu"]);
    assert_eq!(d.meta, Some(json!({"request": "r-1", "n": 7})));
    let d = admin.job(ids[1]).unwrap();
    assert!(d.tags.is_empty() && d.meta.is_none());
    let d = admin.job(ids[2]).unwrap();
    assert!(d.tags.is_empty());
    assert_eq!(d.meta, Some(json!({})));
    let d = admin.job(c).unwrap();
    assert_eq!(
        (d.tags.clone(), d.meta.clone()),
        (vec!["eu".to_owned()], Some(json!({"k": [1, 2]})))
    );

    let listed = |f: JobFilter| -> Vec<i64> {
        let mut v: Vec<i64> = admin.jobs(&f).unwrap().iter().map(|j| j.id.get()).collect();
        v.sort();
        v
    };
    assert_eq!(
        listed(JobFilter::new().tag("billing")),
        [a.get(), ids[0].get()]
    );
    assert_eq!(listed(JobFilter::new().tag("eu")), [a.get(), c.get()]);
    assert_eq!(listed(JobFilter::new().tag("eu").tag("billing")), [a.get()]);
    assert_eq!(listed(JobFilter::new().tag("none")), Vec::<i64>::new());
    assert!(!JobFilter::new().tag("x").is_unfiltered());
    // The same filter drives bulk operations.
    let r = admin
        .bulk(
            postpone::BulkAction::Cancel,
            &JobFilter::new().tag("eu"),
            false,
        )
        .unwrap();
    assert_eq!(r.changed, 2);
    assert_eq!(count(&db, "default", "cancelled"), 2);
}

#[test]
fn bad_tags_and_meta_are_refused_before_anything_is_inserted() {
    use postpone::NewJob;
    use serde_json::json;
    let (db, app) = setup();
    let long = "t".repeat(256);
    let many: Vec<String> = (0..=postpone::MAX_TAGS).map(|i| i.to_string()).collect();
    let big = "x".repeat(postpone::MAX_META_BYTES);
    for (what, res, says) in [
        (
            "empty tag",
            app.job("t").tags([""]).defer(&0),
            "tag must not be empty",
        ),
        ("long tag", app.job("t").tags([long]).defer(&0), "tag"),
        ("nul tag", app.job("t").tags(["a\0b"]).defer(&0), "tag"),
        (
            "many tags",
            app.job("t").tags(many).defer(&0),
            "over the 64 allowed",
        ),
        (
            "array meta",
            app.job("t").meta(&json!([1])).defer(&0),
            "not an array",
        ),
        (
            "null meta",
            app.job("t").meta(&json!(null)).defer(&0),
            "not null",
        ),
        (
            "nul meta",
            app.job("t").meta(&json!({"a": "\u{0}"})).defer(&0),
            "NUL",
        ),
        (
            "big meta",
            app.job("t").meta(&json!({ "a": big })).defer(&0),
            "bytes of JSON",
        ),
        (
            "batch",
            app.defer_batch(&[NewJob::new("t", &0).unwrap().meta(&json!("s"))])
                .map(|v| v[0]),
            "job 0 of the batch",
        ),
    ] {
        let e = res.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        assert!(e.to_string().len() < 300, "{what}: {e}");
    }
    let n: i64 = db
        .client()
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[test]
fn a_snooze_after_an_abort_request_ends_the_job_aborted() {
    use postpone::{AbortOutcome, JobStatus, TaskError};
    let (_db, app) = setup();
    let (started_tx, started_rx) = unbounded::<()>();
    let mut tasks = Tasks::new();
    tasks.register("nap", move |job: &Job| {
        started_tx.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !job.should_abort() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(TaskError::snooze(Duration::ZERO))
    });
    let h = fast_worker(&app, tasks).spawn().unwrap();
    let id = app.job("nap").defer(&0).unwrap();
    started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(app.admin().abort(id).unwrap(), AbortOutcome::Requested);
    assert!(wait_until(Duration::from_secs(10), || app
        .admin()
        .job(id)
        .unwrap()
        .job
        .status
        == JobStatus::Aborted));
    stop(h);
    assert_eq!(app.admin().job(id).unwrap().snoozes, 0, "not run again");
}
