//! Rescue (DESIGN.md promise 4) against the real PostgreSQL: a worker cut off from the
//! database has its running job requeued by another worker once its heartbeat is older than
//! `stalled_after`, and its late outcome is not recorded; a rescue never touches a job that
//! finished meanwhile; a worker in a second process killed with SIGKILL has its job taken
//! over.
//!
//! The second process is this test binary itself, started with `--ignored --exact
//! child_worker_process` and env `POSTPONE_RESCUE_CHILD_URL`: that ignored test then runs a
//! worker whose task blocks forever, and prints `CHILD_STARTED <job id>`.

mod support;
mod worker_util;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{Job, TaskError, Tasks};
use support::{wait_until, FaultProxy, NewConns};
use worker_util::*;

const CHILD_ENV: &str = "POSTPONE_RESCUE_CHILD_URL";

/// A task named "hold" that succeeds at once, recording which worker ran it.
fn quick_hold(tag: &'static str) -> (Tasks, crossbeam_channel::Receiver<(i64, Instant)>) {
    let (tx, rx) = unbounded();
    let mut tasks = Tasks::new();
    tasks.register("hold", move |job: &Job| {
        log::info!("{tag} runs job {}", job.id());
        tx.send((job.id().0, Instant::now())).unwrap();
        Ok(())
    });
    (tasks, rx)
}

fn mentions_stale_heartbeat(row: &JobRow) -> bool {
    row.error_texts()
        .iter()
        .any(|e| e.contains("stopped sending heartbeats"))
}

#[test]
fn a_cut_off_workers_job_is_rescued_and_its_late_outcome_ignored() {
    let (db, direct) = setup();
    let proxy = FaultProxy::start(&db.server_addr());
    let app_a = app_at(&db.url_via(&proxy), Duration::from_secs(1));

    // Worker A runs the job in a task that blocks until released, then fails it (so a
    // late outcome that got recorded would show).
    let (started_tx, started_rx) = unbounded::<i64>();
    let (release_tx, release_rx) = unbounded::<()>();
    let mut tasks_a = Tasks::new();
    tasks_a.register("hold", move |job: &Job| {
        started_tx.send(job.id().0).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        Err(TaskError::fail("late failure from worker A"))
    });
    let a = fast_worker(&app_a, tasks_a)
        .name("worker-a")
        .concurrency(1)
        .spawn()
        .unwrap();
    let id = direct.defer("hold", &()).unwrap();
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        id.0
    );

    // Cut A off completely: its links hang, its new connections too.
    proxy.strand_all();
    proxy.set_new_conns(NewConns::Strand);
    let cut = Instant::now();

    let (tasks_b, ran_b) = quick_hold("worker B");
    let b = fast_worker(&direct, tasks_b)
        .name("worker-b")
        .stalled_after(Duration::from_secs(1))
        .spawn()
        .unwrap();
    let (ran, at) = ran_b
        .recv_timeout(Duration::from_secs(10))
        .expect("B runs A's job");
    assert_eq!(ran, id.0);
    let takeover = at - cut;
    report_figure(
        "rescue: A cut off to B running its job (stalled_after 1 s)",
        takeover,
    );
    assert!(
        takeover >= Duration::from_millis(800),
        "rescued after {takeover:?}, before A's heartbeat was 1 s old"
    );
    assert!(takeover < Duration::from_secs(5), "{takeover:?}");
    let row = wait_status(&db, id, "succeeded", Duration::from_secs(5));
    assert_eq!(row.worker_id, Some(b.worker_id()), "{row:?}");
    assert_eq!(row.attempts, 2, "{row:?}");
    assert!(mentions_stale_heartbeat(&row), "{:?}", row.errors);
    assert!(
        row.error_texts()[0].contains("worker-a"),
        "{:?}",
        row.errors
    );

    // Heal A and let its task end: A reconnects, finds itself presumed dead, registers
    // again under a new identity; its outcome for the job must not be recorded, the job is
    // B's.
    proxy.set_new_conns(NewConns::Forward);
    release_tx.send(()).unwrap();
    let mut client = db.client();
    let a_old = a.worker_id();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let now = a.worker_id();
            now != a_old
                && client
                    .query_opt("SELECT 1 FROM postpone_workers WHERE id = $1", &[&now])
                    .unwrap()
                    .is_some()
        }),
        "A registered again, under a new id, once healed"
    );
    assert!(client
        .query_opt("SELECT 1 FROM postpone_workers WHERE id = $1", &[&a_old])
        .unwrap()
        .is_none());
    assert!(wait_until(Duration::from_secs(5), || a.stats().failed == 1));
    let report = a.shutdown(Duration::from_secs(5));
    println!("  A: {report}");
    // A clean stop: the outcome went through the guarded statement (completer or cleanup).
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.cleanup_error(), None, "{report}");
    let b_id = b.worker_id();
    let report = b.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");

    let row = job_row(&mut client, id).unwrap();
    assert_eq!(
        (row.status.as_str(), row.worker_id, row.attempts),
        ("succeeded", Some(b_id), 2),
        "{row:?}"
    );
    assert!(
        !row.error_texts()
            .iter()
            .any(|e| e.contains("late failure from worker A")),
        "A's late outcome was recorded: {:?}",
        row.errors
    );
}

#[test]
fn a_rescue_never_touches_a_job_that_finished_meanwhile() {
    let (db, app) = setup();
    let mut client = db.client();
    // A worker whose heartbeat is an hour old, with one job still running and two that
    // finished just before its row was found stale (the race a rescue must lose).
    let ghost: i64 = client
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat) \
             VALUES ('ghost', now() - interval '1 hour') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let running = app.defer("hold", &()).unwrap();
    let done = app.defer("hold", &()).unwrap();
    let failed = app.defer("hold", &()).unwrap();
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'doing', worker_id = $1, attempts = 1, \
                    started_at = now() - interval '1 hour' WHERE id = $2",
            &[&ghost, &running.0],
        )
        .unwrap();
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded', worker_id = $1, attempts = 1, \
                    started_at = now() - interval '1 hour', finished_at = now() WHERE id = $2",
            &[&ghost, &done.0],
        )
        .unwrap();
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'failed', worker_id = $1, attempts = 1, \
                    errors = '[{\"attempt\": 1, \"error\": \"own failure\"}]', \
                    started_at = now() - interval '1 hour', finished_at = now() WHERE id = $2",
            &[&ghost, &failed.0],
        )
        .unwrap();
    let before: Vec<JobRow> = [done, failed]
        .iter()
        .map(|id| job_row(&mut client, *id).unwrap())
        .collect();

    let (tasks, ran) = quick_hold("rescuer");
    let handle = fast_worker(&app, tasks).spawn().unwrap();
    let (id, _) = ran.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(id, running.0, "only the running job is rescued and run");
    let row = wait_status(&db, running, "succeeded", Duration::from_secs(5));
    assert!(mentions_stale_heartbeat(&row), "{:?}", row.errors);
    assert_eq!(row.attempts, 2);
    let gone = client
        .query_opt("SELECT 1 FROM postpone_workers WHERE id = $1", &[&ghost])
        .unwrap()
        .is_none();
    assert!(gone, "the stale worker row is removed");
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    assert!(ran.try_recv().is_err(), "no other job ran");

    for b in before {
        let after = job_row(&mut client, postpone::JobId(b.id)).unwrap();
        assert_eq!(
            (after.status.as_str(), after.worker_id, after.attempts),
            (b.status.as_str(), Some(ghost), 1),
            "a finished job was touched: {after:?}"
        );
        assert_eq!(after.errors, b.errors, "errors of a finished job changed");
    }
}

#[test]
fn a_worker_finishing_its_jobs_during_shutdown_keeps_its_heartbeat() {
    let (db, app) = setup();
    let (started_tx, started_rx) = unbounded::<i64>();
    let mut tasks_a = Tasks::new();
    tasks_a.register("hold", move |job: &Job| {
        started_tx.send(job.id().0).unwrap();
        // Longer than stalled_after: only a heartbeat kept through the graceful wait
        // keeps the other worker's rescue away.
        thread::sleep(Duration::from_millis(2500));
        Ok(())
    });
    let a = fast_worker(&app, tasks_a)
        .name("worker-a")
        .concurrency(1)
        .spawn()
        .unwrap();
    let id = app.defer("hold", &()).unwrap();
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        id.0
    );
    let a_id = a.worker_id();
    let (tasks_b, ran_b) = quick_hold("worker B");
    let b = fast_worker(&app, tasks_b)
        .name("worker-b")
        .stalled_after(Duration::from_secs(1))
        .spawn()
        .unwrap();

    let report = a.shutdown(Duration::from_secs(10));
    println!("  A: {report}");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.jobs_finished(), 1, "{report}");
    let row = job_row(&mut db.client(), id).unwrap();
    assert_eq!(
        (row.status.as_str(), row.worker_id, row.attempts),
        ("succeeded", Some(a_id), 1),
        "the job was rescued from a live worker: {row:?}"
    );
    assert!(
        ran_b.try_recv().is_err(),
        "B ran the job while A was still finishing it"
    );
    let report = b.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
}

/// The child half of `a_worker_killed_with_sigkill_is_rescued_by_another_process`: runs a
/// worker on the database named by env `POSTPONE_RESCUE_CHILD_URL` whose task blocks
/// forever, prints `CHILD_STARTED <job id>`, and waits to be killed. Without the variable
/// (a plain `--ignored` run) there is nothing to do.
#[test]
#[ignore = "child process of a_worker_killed_with_sigkill_is_rescued_by_another_process"]
fn child_worker_process() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let app = app_at(&url, Duration::from_secs(2));
    let mut tasks = Tasks::new();
    tasks.register("hold", |job: &Job| {
        println!("CHILD_STARTED {}", job.id());
        loop {
            thread::sleep(Duration::from_secs(1));
        }
    });
    let _handle = fast_worker(&app, tasks)
        .name("doomed-child")
        .concurrency(1)
        .spawn()
        .unwrap();
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_worker_killed_with_sigkill_is_rescued_by_another_process() {
    let (db, app) = setup();
    let id = app.defer("hold", &()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_worker_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, db.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the child worker process");
    let (line_tx, line_rx) = unbounded::<String>();
    let stdout = child.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = line_tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    // The harness prints "test child_worker_process ... " with no newline before it.
    let started = loop {
        match line_rx.recv_deadline(deadline) {
            Ok(line) => {
                if let Some((_, rest)) = line.split_once("CHILD_STARTED ") {
                    break rest.trim().to_owned();
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!("the child worker never started the job");
            }
        }
    };
    assert_eq!(started, id.to_string());
    let row = job_row(&mut db.client(), id).unwrap();
    assert_eq!(row.status, "doing");

    child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
    let status = child.wait().unwrap();
    let killed = Instant::now();
    assert!(!status.success());
    reader.join().unwrap();

    let (tasks, ran) = quick_hold("survivor");
    let handle = fast_worker(&app, tasks)
        .stalled_after(Duration::from_secs(1))
        .spawn()
        .unwrap();
    let (ran_id, at) = ran
        .recv_timeout(Duration::from_secs(10))
        .expect("the survivor runs the killed worker's job");
    assert_eq!(ran_id, id.0);
    report_figure(
        "rescue: SIGKILL to the job running elsewhere (stalled_after 1 s)",
        at - killed,
    );
    let row = wait_status(&db, id, "succeeded", Duration::from_secs(5));
    assert_eq!(row.worker_id, Some(handle.worker_id()));
    assert_eq!(row.attempts, 2);
    assert!(mentions_stale_heartbeat(&row), "{:?}", row.errors);
    assert!(
        row.error_texts()[0].contains("doomed-child"),
        "{:?}",
        row.errors
    );
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
}
