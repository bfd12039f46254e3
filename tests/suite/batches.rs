//! Batches (schema version 24): a group of jobs whose `on_complete` callback runs once when
//! all have finished and whose `on_success` callback runs once when all have succeeded (and
//! is cancelled, naming the job, when one did not); jobs added from inside a batch job delay
//! the callbacks; an add to a finished batch is refused; progress is exact.

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postpone::{App, BatchId, ErrorKind, Job, JobId, NewJob, TaskError, Tasks};
use support::{wait_until, TestDb};
use worker_util::*;

/// When each job started and ended, on one counter shared by every worker thread, and how
/// many times each task ran.
#[derive(Default)]
struct Timeline {
    clock: AtomicU64,
    started: Mutex<HashMap<i64, u64>>,
    ended: Mutex<HashMap<i64, u64>>,
    runs: Mutex<HashMap<String, u64>>,
    /// What each callback saw of its batch when it ran: (pending, total).
    seen: Mutex<Vec<(String, u64, u64)>>,
}

impl Timeline {
    fn start(&self, job: &Job) {
        let t = self.clock.fetch_add(1, Ordering::SeqCst);
        *self
            .runs
            .lock()
            .unwrap()
            .entry(job.task().to_owned())
            .or_default() += 1;
        let mut started = self.started.lock().unwrap();
        assert!(
            started.insert(job.id().0, t).is_none(),
            "job {} started twice",
            job.id()
        );
    }
    fn end(&self, id: JobId) {
        let t = self.clock.fetch_add(1, Ordering::SeqCst);
        self.ended.lock().unwrap().insert(id.0, t);
    }
    fn started(&self, id: JobId) -> Option<u64> {
        self.started.lock().unwrap().get(&id.0).copied()
    }
    fn ended(&self, id: JobId) -> Option<u64> {
        self.ended.lock().unwrap().get(&id.0).copied()
    }
    fn runs(&self, task: &str) -> u64 {
        self.runs.lock().unwrap().get(task).copied().unwrap_or(0)
    }
}

/// Tasks: "ok" (succeeds after a short pause), "fail" (fails, no retry), "slow" (succeeds
/// after 150 ms), "spawn" (adds two "spawn" jobs of one less depth to its batch, and a
/// "slow" one at depth 0), and the callbacks "report" and "notify", which record what their
/// batch's progress says when they run.
fn tasks(app: &App, timeline: &Arc<Timeline>) -> Tasks {
    let mut tasks = Tasks::new();
    let t = timeline.clone();
    tasks.register("ok", move |job: &Job| {
        t.start(job);
        thread::sleep(Duration::from_millis(1));
        t.end(job.id());
        Ok(())
    });
    let t = timeline.clone();
    tasks.register("fail", move |job: &Job| {
        t.start(job);
        t.end(job.id());
        Err(TaskError::fail("failing on purpose"))
    });
    let t = timeline.clone();
    tasks.register("slow", move |job: &Job| {
        t.start(job);
        thread::sleep(Duration::from_millis(150));
        t.end(job.id());
        Ok(())
    });
    let t = timeline.clone();
    tasks.register("spawn", move |job: &Job| {
        t.start(job);
        let depth: u32 = job.args()?;
        let more = if depth == 0 {
            vec![NewJob::new("slow", &())?]
        } else {
            vec![
                NewJob::new("spawn", &(depth - 1))?,
                NewJob::new("spawn", &(depth - 1))?,
            ]
        };
        job.add_to_batch(&more)?;
        t.end(job.id());
        Ok(())
    });
    for name in ["report", "notify"] {
        let t = timeline.clone();
        let app = app.clone();
        tasks.register(name, move |job: &Job| {
            t.start(job);
            let batch = job.batch_id()?.expect("a callback belongs to its batch");
            let p = app.admin().batch(batch)?;
            t.seen
                .lock()
                .unwrap()
                .push((job.task().to_owned(), p.pending(), p.total));
            t.end(job.id());
            Ok(())
        });
    }
    tasks
}

fn workers(app: &App, timeline: &Arc<Timeline>, n: usize) -> Vec<postpone::WorkerHandle> {
    (0..n)
        .map(|_| {
            fast_worker(app, tasks(app, timeline))
                .concurrency(4)
                .spawn()
                .unwrap()
        })
        .collect()
}

fn shutdown(workers: Vec<postpone::WorkerHandle>) {
    for w in workers {
        assert!(w.shutdown(Duration::from_secs(10)).is_clean());
    }
}

fn count_jobs(db: &TestDb) -> i64 {
    db.client()
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0)
}

/// Asserts that the callback `cb` started after every job of `jobs` ended.
fn started_after_all(t: &Timeline, cb: JobId, jobs: &[JobId]) {
    let start = t.started(cb).expect("the callback ran");
    for id in jobs {
        let end = t
            .ended(*id)
            .unwrap_or_else(|| panic!("job {id} never ended"));
        assert!(
            start > end,
            "callback {cb} started at tick {start}, before job {id} ended at tick {end}"
        );
    }
}

#[test]
fn on_complete_runs_once_after_every_job_finished_with_mixed_outcomes_and_on_success_is_cancelled()
{
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    let mut jobs = Vec::new();
    for i in 0..60 {
        jobs.push(NewJob::new(if i % 7 == 3 { "fail" } else { "ok" }, &i).unwrap());
    }
    let batch = app
        .batch()
        .on_complete(NewJob::new("report", &()).unwrap())
        .on_success(NewJob::new("notify", &()).unwrap())
        .defer(&jobs)
        .unwrap();
    assert_eq!(batch.jobs.len(), 60);
    let on_complete = batch.on_complete.unwrap();
    let on_success = batch.on_success.unwrap();
    let ws = workers(&app, &t, 3);
    wait_status(&db, on_complete, "succeeded", Duration::from_secs(60));
    let cancelled = wait_status(&db, on_success, "cancelled", Duration::from_secs(10));
    shutdown(ws);

    assert_eq!(t.runs("report"), 1);
    assert_eq!(t.runs("notify"), 0);
    started_after_all(&t, on_complete, &batch.jobs);
    // The report saw its batch finished.
    assert_eq!(
        t.seen.lock().unwrap().as_slice(),
        &[("report".to_owned(), 0, 60)]
    );
    // The on_success callback names a job of the batch that failed.
    let error = cancelled.error_texts().pop().unwrap();
    let failed: Vec<JobId> = batch
        .jobs
        .iter()
        .zip(0..)
        .filter(|(_, i)| i % 7 == 3)
        .map(|(id, _)| *id)
        .collect();
    assert!(
        failed
            .iter()
            .any(|id| error.contains(&format!("job {id},"))),
        "{error}"
    );
    assert!(error.contains("ended failed"), "{error}");

    let p = app.admin().batch(batch.id).unwrap();
    assert_eq!(p.total, 60);
    assert_eq!(p.failed, failed.len() as u64);
    assert_eq!(p.succeeded, 60 - failed.len() as u64);
    assert_eq!((p.waiting, p.running, p.cancelled, p.aborted), (0, 0, 0, 0));
    assert_eq!(p.deleted, 0);
    assert!(p.is_finished());
    assert_eq!(p.finished(), 60);
    let oc = p.on_complete.unwrap();
    assert_eq!((oc.id, oc.describe()), (on_complete, "succeeded"));
    let os = p.on_success.unwrap();
    assert_eq!((os.id, os.describe()), (on_success, "cancelled"));
}

#[test]
fn on_success_runs_once_when_every_job_succeeded() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    let jobs: Vec<NewJob> = (0..80).map(|i| NewJob::new("ok", &i).unwrap()).collect();
    let batch = app
        .batch()
        .on_complete(NewJob::new("report", &()).unwrap())
        .on_success(NewJob::new("notify", &()).unwrap())
        .defer(&jobs)
        .unwrap();
    // Before any worker: everything waits, the callbacks for the batch.
    let p = app.admin().batch(batch.id).unwrap();
    assert_eq!((p.total, p.waiting, p.finished()), (80, 80, 0));
    assert_eq!(
        p.on_complete.as_ref().unwrap().describe(),
        "waiting for the batch"
    );
    assert_eq!(
        p.on_success.as_ref().unwrap().describe(),
        "waiting for the batch"
    );
    let ws = workers(&app, &t, 3);
    let on_success = batch.on_success.unwrap();
    let on_complete = batch.on_complete.unwrap();
    wait_status(&db, on_success, "succeeded", Duration::from_secs(60));
    wait_status(&db, on_complete, "succeeded", Duration::from_secs(10));
    shutdown(ws);
    assert_eq!(t.runs("notify"), 1);
    assert_eq!(t.runs("report"), 1);
    assert_eq!(t.runs("ok"), 80);
    started_after_all(&t, on_success, &batch.jobs);
    started_after_all(&t, on_complete, &batch.jobs);
    let p = app.admin().batch(batch.id).unwrap();
    assert_eq!(
        (p.total, p.succeeded, p.pending(), p.unsuccessful()),
        (80, 80, 0, 0)
    );
}

#[test]
fn jobs_added_from_inside_batch_jobs_delay_the_callbacks_until_they_finish() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    // Two roots of depth 3: each adds two of depth 2, ... each of depth 0 adds a slow job.
    // 2 * (1 + 2 + 4 + 8) spawns and 2 * 8 slow jobs: 46 in all, 44 of them added.
    let batch = app
        .batch()
        .on_complete(NewJob::new("report", &()).unwrap())
        .on_success(NewJob::new("notify", &()).unwrap())
        .defer(&[
            NewJob::new("spawn", &3u32).unwrap(),
            NewJob::new("spawn", &3u32).unwrap(),
        ])
        .unwrap();
    let ws = workers(&app, &t, 3);
    let on_complete = batch.on_complete.unwrap();
    let on_success = batch.on_success.unwrap();
    wait_status(&db, on_complete, "succeeded", Duration::from_secs(60));
    wait_status(&db, on_success, "succeeded", Duration::from_secs(10));
    shutdown(ws);
    assert_eq!(t.runs("spawn"), 30);
    assert_eq!(t.runs("slow"), 16);
    assert_eq!((t.runs("report"), t.runs("notify")), (1, 1));
    let members: Vec<JobId> = db
        .client()
        .query(
            "SELECT id FROM postpone_jobs WHERE batch_id = $1 AND id <> ALL($2)",
            &[&batch.id.0, &vec![on_complete.0, on_success.0]],
        )
        .unwrap()
        .iter()
        .map(|r| JobId(r.get(0)))
        .collect();
    assert_eq!(members.len(), 46);
    started_after_all(&t, on_complete, &members);
    started_after_all(&t, on_success, &members);
    let p = app.admin().batch(batch.id).unwrap();
    assert_eq!((p.total, p.succeeded, p.pending()), (46, 46, 0));
    for (task, pending, total) in t.seen.lock().unwrap().iter() {
        assert_eq!(
            (*pending, *total),
            (0, 46),
            "{task} saw its batch unfinished"
        );
    }
}

#[test]
fn an_add_to_a_finished_batch_is_refused_and_inserts_nothing() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    let batch = app
        .batch()
        .on_complete(NewJob::new("report", &()).unwrap())
        .defer(&[NewJob::new("ok", &1).unwrap()])
        .unwrap();
    // Open: an add from outside, before it ran, is accepted and waited for.
    let added = app
        .add_to_batch(batch.id, &[NewJob::new("ok", &2).unwrap()])
        .unwrap();
    let ws = workers(&app, &t, 1);
    wait_status(
        &db,
        batch.on_complete.unwrap(),
        "succeeded",
        Duration::from_secs(30),
    );
    shutdown(ws);
    started_after_all(&t, batch.on_complete.unwrap(), &[batch.jobs[0], added[0]]);

    let before = count_jobs(&db);
    let err = app
        .add_to_batch(batch.id, &[NewJob::new("ok", &3).unwrap()])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("batch {} is finished", batch.id)),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "on_complete job {} is succeeded",
            batch.on_complete.unwrap()
        )),
        "{msg}"
    );
    assert_eq!(count_jobs(&db), before, "a refused add inserted nothing");
    assert_eq!(app.admin().batch(batch.id).unwrap().total, 2);

    // Unknown batches.
    let err = app
        .add_to_batch(
            BatchId(batch.id.0 + 1000),
            &[NewJob::new("ok", &4).unwrap()],
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = app.admin().batch(BatchId(batch.id.0 + 1000)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(count_jobs(&db), before);
}

#[test]
fn a_batch_without_callbacks_keeps_its_progress_and_closes_when_its_jobs_have_finished() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    let batch = app
        .batch()
        .defer(&[
            NewJob::new("ok", &1).unwrap(),
            NewJob::new("fail", &2).unwrap(),
        ])
        .unwrap();
    assert_eq!((batch.on_complete, batch.on_success), (None, None));
    // A job outside any batch says so; one inside names it.
    let outside = app.defer("ok", &0).unwrap();
    assert_eq!(app.admin().job(outside).unwrap().batch_id, None);
    assert_eq!(
        app.admin().job(batch.jobs[0]).unwrap().batch_id,
        Some(batch.id)
    );
    app.add_to_batch(batch.id, &[NewJob::new("ok", &3).unwrap()])
        .unwrap();
    let ws = workers(&app, &t, 1);
    let finished = wait_until(Duration::from_secs(30), || {
        app.admin().batch(batch.id).unwrap().is_finished()
    });
    assert!(finished);
    wait_status(&db, outside, "succeeded", Duration::from_secs(10));
    shutdown(ws);
    let p = app.admin().batch(batch.id).unwrap();
    assert_eq!((p.total, p.succeeded, p.failed), (3, 2, 1));
    assert_eq!((p.on_complete, p.on_success), (None, None));
    let err = app
        .add_to_batch(batch.id, &[NewJob::new("ok", &4).unwrap()])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
}

#[test]
fn adds_from_outside_racing_the_last_jobs_are_either_waited_for_or_refused() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    for round in 0..5 {
        let jobs: Vec<NewJob> = (0..30).map(|i| NewJob::new("ok", &i).unwrap()).collect();
        let batch = app
            .batch()
            .on_complete(NewJob::new("report", &round).unwrap())
            .on_success(NewJob::new("notify", &round).unwrap())
            .defer(&jobs)
            .unwrap();
        let ws = workers(&app, &t, 3);
        // Two threads add one job at a time until the batch refuses them.
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(AtomicBool::new(false));
        let adders: Vec<_> = (0..2)
            .map(|_| {
                let (app, accepted, refused) = (app.clone(), accepted.clone(), refused.clone());
                thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < deadline {
                        match app.add_to_batch(batch.id, &[NewJob::new("ok", &-1).unwrap()]) {
                            Ok(ids) => accepted.lock().unwrap().extend(ids),
                            Err(e) => {
                                assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
                                // Refused only once the callbacks no longer wait.
                                let p = app.admin().batch(batch.id).unwrap();
                                assert!(p.is_finished(), "refused while jobs remain: {p:?}");
                                for cb in [&p.on_complete, &p.on_success] {
                                    let cb = cb.as_ref().unwrap();
                                    assert!(!cb.waiting, "refused while {cb:?} waits");
                                }
                                refused.store(true, Ordering::SeqCst);
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        for a in adders {
            a.join().unwrap();
        }
        assert!(refused.load(Ordering::SeqCst), "the batch never finished");
        let on_complete = batch.on_complete.unwrap();
        let on_success = batch.on_success.unwrap();
        wait_status(&db, on_complete, "succeeded", Duration::from_secs(30));
        wait_status(&db, on_success, "succeeded", Duration::from_secs(30));
        shutdown(ws);
        let accepted = accepted.lock().unwrap().clone();
        let mut all = batch.jobs.clone();
        all.extend(&accepted);
        started_after_all(&t, on_complete, &all);
        started_after_all(&t, on_success, &all);
        let p = app.admin().batch(batch.id).unwrap();
        assert_eq!(p.total, all.len() as u64);
        assert_eq!(p.succeeded, all.len() as u64);
    }
    assert_eq!((t.runs("report"), t.runs("notify")), (5, 5));
}

/// A batch of `n` jobs on 3 workers: its callbacks run once, after every job; progress
/// exact. Returns how long the jobs and callbacks took to run.
///
/// The workers keep the default lease and the App a 30 s `io_timeout`: a large fan-in's
/// recordings take turns on its callbacks' rows, and on a loaded machine a recording can wait
/// longer than the short deadlines of `fast_worker` (which would then end in a rescue and a
/// second run, as at-least-once allows, not in a lost job).
fn big_batch(n: usize) -> Duration {
    let (db, _) = setup();
    let app = app_at(&db.url(), Duration::from_secs(30));
    let t = Arc::new(Timeline::default());
    let jobs: Vec<NewJob> = (0..n).map(|i| NewJob::new("ok", &i).unwrap()).collect();
    let started = Instant::now();
    let batch = app
        .batch()
        .on_complete(NewJob::new("report", &()).unwrap())
        .on_success(NewJob::new("notify", &()).unwrap())
        .defer(&jobs)
        .unwrap();
    report_figure(
        &format!("deferring a batch of {n} jobs with 2 callbacks"),
        started.elapsed(),
    );
    let ws: Vec<_> = (0..3)
        .map(|_| {
            postpone::Worker::builder(&app, tasks(&app, &t))
                .concurrency(4)
                .poll_interval(Duration::from_millis(100))
                .stalled_after(Duration::from_secs(90))
                .spawn()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    wait_status(
        &db,
        batch.on_complete.unwrap(),
        "succeeded",
        Duration::from_secs(600),
    );
    wait_status(
        &db,
        batch.on_success.unwrap(),
        "succeeded",
        Duration::from_secs(60),
    );
    let ran = started.elapsed();
    shutdown(ws);
    assert_eq!((t.runs("report"), t.runs("notify")), (1, 1));
    assert_eq!(t.runs("ok"), n as u64);
    started_after_all(&t, batch.on_complete.unwrap(), &batch.jobs);
    started_after_all(&t, batch.on_success.unwrap(), &batch.jobs);
    let p = app.admin().batch(batch.id).unwrap();
    assert_eq!((p.total, p.succeeded, p.pending()), (n as u64, n as u64, 0));
    report_figure(
        &format!("running a batch of {n} jobs and its 2 callbacks, 3 workers"),
        ran,
    );
    ran
}

#[test]
fn a_batch_of_ten_thousand_jobs_runs_its_callbacks_once() {
    big_batch(10_000);
}
