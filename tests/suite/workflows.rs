//! Workflows (schema version 28): a graph of jobs inserted in one transaction (also the
//! caller's), refused whole when it has a cycle or names a step it does not have; run by
//! several workers, no job starts before the jobs it runs after ended, and every job ends
//! final; a failed member cancels its dependents, and a retry of the workflow runs the
//! failed part again in order; a cancel ends every waiting member.

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use postpone::{
    App, ErrorKind, Job, JobFilter, JobId, JobStatus, NewJob, Step, TaskError, Tasks, WorkflowId,
};
use support::{wait_until, TestDb};
use worker_util::*;

/// Every start and end of a job, on one counter shared by every worker thread.
#[derive(Default)]
struct Timeline {
    clock: AtomicU64,
    /// Per job: the ticks of its starts and of its ends, in order.
    starts: Mutex<HashMap<i64, Vec<u64>>>,
    ends: Mutex<HashMap<i64, Vec<u64>>>,
    /// The workflow each job said it belongs to.
    workflows: Mutex<HashMap<i64, Option<WorkflowId>>>,
    /// While set, "flaky" jobs fail.
    flaky_fails: AtomicBool,
}

impl Timeline {
    fn start(&self, job: &Job) {
        let t = self.clock.fetch_add(1, Ordering::SeqCst);
        self.starts
            .lock()
            .unwrap()
            .entry(job.id().0)
            .or_default()
            .push(t);
    }
    fn end(&self, job: &Job) {
        let t = self.clock.fetch_add(1, Ordering::SeqCst);
        self.ends
            .lock()
            .unwrap()
            .entry(job.id().0)
            .or_default()
            .push(t);
    }
    fn starts(&self, id: JobId) -> Vec<u64> {
        self.starts
            .lock()
            .unwrap()
            .get(&id.0)
            .cloned()
            .unwrap_or_default()
    }
    fn ends(&self, id: JobId) -> Vec<u64> {
        self.ends
            .lock()
            .unwrap()
            .get(&id.0)
            .cloned()
            .unwrap_or_default()
    }
}

/// Tasks: "ok" (succeeds after a short pause, recording its workflow), "flaky" (fails
/// while the timeline says so, else succeeds), "hold" (runs until it is asked to abort).
fn tasks(timeline: &Arc<Timeline>) -> Tasks {
    let mut tasks = Tasks::new();
    let t = timeline.clone();
    tasks.register("ok", move |job: &Job| {
        t.start(job);
        let wf = job.workflow_id()?;
        t.workflows.lock().unwrap().insert(job.id().0, wf);
        thread::sleep(Duration::from_millis(5));
        t.end(job);
        Ok(())
    });
    let t = timeline.clone();
    tasks.register("flaky", move |job: &Job| {
        t.start(job);
        thread::sleep(Duration::from_millis(20));
        t.end(job);
        if t.flaky_fails.load(Ordering::SeqCst) {
            return Err(TaskError::fail("failing on purpose"));
        }
        Ok(())
    });
    let t = timeline.clone();
    tasks.register("hold", move |job: &Job| {
        t.start(job);
        while !job.should_abort() {
            thread::sleep(Duration::from_millis(10));
        }
        t.end(job);
        Ok(())
    });
    tasks
}

fn workers(app: &App, timeline: &Arc<Timeline>, n: usize) -> Vec<postpone::WorkerHandle> {
    (0..n)
        .map(|_| {
            fast_worker(app, tasks(timeline))
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

fn count(db: &TestDb, table: &str) -> i64 {
    db.client()
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .unwrap()
        .get(0)
}

/// Asserts that every start of `job` came after the last end of each of `deps` before it.
fn started_after(t: &Timeline, job: JobId, deps: &[JobId]) {
    let starts = t.starts(job);
    assert!(!starts.is_empty(), "job {job} never started");
    for &start in &starts {
        for &d in deps {
            let ended_before = t.ends(d).iter().any(|&e| e < start);
            assert!(
                ended_before,
                "job {job} started at tick {start} before its dependency {d} ended (ends: {:?})",
                t.ends(d)
            );
        }
    }
}

/// A diamond `a -> (b, c) -> d` with `b` of task `b_task`; the steps and the builder's result.
fn diamond(app: &App, name: &str, b_task: &str) -> (postpone::Workflow, [Step; 4]) {
    let mut wf = app.workflow(name);
    let a = wf.step(NewJob::new("ok", &"a").unwrap()).name("a").add();
    let b = wf
        .step(NewJob::new(b_task, &"b").unwrap())
        .after([&a])
        .add();
    let c = wf.step(NewJob::new("ok", &"c").unwrap()).after([&a]).add();
    let d = wf
        .step(NewJob::new("ok", &"d").unwrap())
        .after([&b, &c])
        .add();
    (wf.insert().unwrap(), [a, b, c, d])
}

fn ids(run: &postpone::Workflow, steps: &[Step; 4]) -> [JobId; 4] {
    steps
        .clone()
        .map(|s| run.job(&s).expect("a step of the workflow"))
}

#[test]
fn diamonds_run_by_several_workers_never_start_a_job_before_its_dependencies() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    let runs: Vec<_> = (0..15)
        .map(|i| diamond(&app, &format!("diamond {i}"), "ok"))
        .collect();
    // Before any worker: only the roots are due; the rest wait for their dependencies.
    let info = app.admin().workflow(runs[0].0.id).unwrap();
    assert_eq!((info.total, info.waiting, info.finished()), (4, 4, 0));
    let shown: Vec<&str> = info.jobs.iter().map(|j| j.describe()).collect();
    assert_eq!(
        shown,
        [
            "waiting",
            "waiting for dependencies",
            "waiting for dependencies",
            "waiting for dependencies"
        ]
    );
    let [a, b, c, _] = ids(&runs[0].0, &runs[0].1);
    assert_eq!(info.jobs[0].step.as_deref(), Some("a"));
    assert_eq!(info.jobs[3].after, vec![b, c]);
    assert_eq!(info.jobs[1].after, vec![a]);

    let ws = workers(&app, &t, 3);
    for (run, steps) in &runs {
        let [_, _, _, d] = ids(run, steps);
        wait_status(&db, d, "succeeded", Duration::from_secs(60));
    }
    shutdown(ws);

    for (run, steps) in &runs {
        let [a, b, c, d] = ids(run, steps);
        started_after(&t, b, &[a]);
        started_after(&t, c, &[a]);
        started_after(&t, d, &[b, c]);
        for id in [a, b, c, d] {
            assert_eq!(t.starts(id).len(), 1, "job {id} ran once");
            // The job a task is given knows its workflow.
            assert_eq!(t.workflows.lock().unwrap()[&id.0], Some(run.id));
        }
        let info = app.admin().workflow(run.id).unwrap();
        assert_eq!((info.total, info.succeeded), (4, 4));
        assert!(info.is_finished());
        assert_eq!(info.describe(), "succeeded");
    }
    // The admin API's job views carry the workflow id too.
    let (run, steps) = &runs[3];
    let [a, ..] = ids(run, steps);
    assert_eq!(app.admin().job(a).unwrap().job.workflow_id, Some(run.id));
    let listed = app
        .admin()
        .jobs(&JobFilter::new().id(a))
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(listed.workflow_id, Some(run.id));
    // A job outside a workflow has none.
    let lone = app.defer("ok", &()).unwrap();
    assert_eq!(app.admin().job(lone).unwrap().job.workflow_id, None);
}

#[test]
fn a_failed_member_cancels_its_dependents_and_a_retry_of_the_workflow_runs_them_in_order() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    t.flaky_fails.store(true, Ordering::SeqCst);
    let runs: Vec<_> = (0..6)
        .map(|i| diamond(&app, &format!("flaky {i}"), "flaky"))
        .collect();
    let ws = workers(&app, &t, 3);
    for (run, steps) in &runs {
        let [_, b, c, d] = ids(run, steps);
        wait_status(&db, b, "failed", Duration::from_secs(60));
        wait_status(&db, c, "succeeded", Duration::from_secs(60));
        let row = wait_status(&db, d, "cancelled", Duration::from_secs(10));
        let error = row.error_texts().pop().unwrap();
        assert!(error.contains(&format!("job {b}")), "{error}");
    }
    for (run, steps) in &runs {
        let [_, _, _, d] = ids(run, steps);
        assert!(
            t.starts(d).is_empty(),
            "job {d} ran after its dependency failed"
        );
        let info = app.admin().workflow(run.id).unwrap();
        assert_eq!(
            (info.succeeded, info.failed, info.cancelled, info.pending()),
            (2, 1, 1, 0)
        );
        assert_eq!(info.describe(), "finished with failures");
    }

    // Retried while the workers run: the failed job and the one it cancelled come back;
    // the dependent waits for the retried job again.
    t.flaky_fails.store(false, Ordering::SeqCst);
    for (run, steps) in &runs {
        let [_, b, _, d] = ids(run, steps);
        let retry = app.admin().retry_workflow(run.id).unwrap();
        assert_eq!(retry.retried, vec![b, d]);
        assert!(retry.refused.is_empty(), "{:?}", retry.refused);
    }
    for (run, steps) in &runs {
        let [_, _, _, d] = ids(run, steps);
        wait_status(&db, d, "succeeded", Duration::from_secs(60));
    }
    shutdown(ws);
    for (run, steps) in &runs {
        let [a, b, c, d] = ids(run, steps);
        assert_eq!(t.starts(b).len(), 2);
        assert_eq!(t.starts(d).len(), 1);
        assert_eq!((t.starts(a).len(), t.starts(c).len()), (1, 1));
        // d started after b's second run ended.
        let last_b = *t.ends(b).last().unwrap();
        assert!(t.starts(d)[0] > last_b);
        started_after(&t, d, &[c]);
        let info = app.admin().workflow(run.id).unwrap();
        assert_eq!((info.total, info.succeeded, info.pending()), (4, 4, 0));
    }
    // Retrying a workflow with nothing failed does nothing.
    let again = app.admin().retry_workflow(runs[0].0.id).unwrap();
    assert!(again.retried.is_empty() && again.refused.is_empty());
}

#[test]
fn a_cycle_or_a_reference_to_a_step_it_does_not_have_is_refused_and_nothing_is_inserted() {
    let (db, app) = setup();
    let nothing = |db: &TestDb| {
        assert_eq!(count(db, "postpone_jobs"), 0);
        assert_eq!(count(db, "postpone_workflows"), 0);
        assert_eq!(count(db, "postpone_workflow_jobs"), 0);
    };
    let job = |task: &str| NewJob::new(task, &()).unwrap();

    // a -> b -> c -> a, through names given later.
    let mut wf = app.workflow("cycle");
    wf.step(job("ok"))
        .name("a")
        .after(&[Step::named("c")])
        .add();
    let b = wf
        .step(job("ok"))
        .name("b")
        .after(&[Step::named("a")])
        .add();
    wf.step(job("ok")).name("c").after(&[b]).add();
    wf.step(job("ok")).name("free").add();
    let e = wf.insert().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let msg = e.to_string();
    assert!(msg.contains("cycle"), "{msg}");
    for n in ["\"a\"", "\"b\"", "\"c\""] {
        assert!(msg.contains(n), "{msg}");
    }
    assert!(!msg.contains("free"), "{msg}");
    nothing(&db);

    // A step that waits for itself.
    let mut wf = app.workflow("self");
    wf.step(job("ok"))
        .name("me")
        .after_finished(&[Step::named("me")])
        .add();
    assert!(wf.insert().unwrap_err().to_string().contains("cycle"));

    // A name no step has.
    let mut wf = app.workflow("unknown");
    wf.step(job("ok")).after(&[Step::named("nobody")]).add();
    let e = wf.insert().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("\"nobody\""), "{e}");

    // A step of another workflow.
    let mut other = app.workflow("other");
    let foreign = other.step(job("ok")).add();
    let mut wf = app.workflow("borrower");
    wf.step(job("ok")).add();
    wf.step(job("ok")).after(&[foreign]).add();
    let e = wf.insert().unwrap_err();
    assert!(e.to_string().contains("another workflow"), "{e}");

    // Two steps of one name; no step at all; an invalid job in the last layer.
    let mut wf = app.workflow("twins");
    wf.step(job("ok")).name("x").add();
    wf.step(job("ok")).name("x").add();
    assert!(wf.insert().unwrap_err().to_string().contains("both named"));
    assert!(app.workflow("empty").insert().is_err());
    let mut wf = app.workflow("bad job");
    let a = wf.step(job("ok")).add();
    wf.step(job("ok").queue("")).after(&[a]).add();
    assert_eq!(wf.insert().unwrap_err().kind(), ErrorKind::InvalidInput);
    nothing(&db);

    // A job outside the workflow that does not exist: refused by the database, and the
    // transaction leaves nothing behind.
    let mut wf = app.workflow("missing outside");
    let a = wf.step(job("ok")).add();
    wf.step(job("ok").after(&[JobId(987_654)]))
        .after(&[a])
        .add();
    assert_eq!(wf.insert().unwrap_err().kind(), ErrorKind::NotFound);
    nothing(&db);
}

#[test]
fn a_workflow_inserted_in_a_transaction_that_rolls_back_leaves_nothing() {
    let (db, app) = setup();
    let mut client = db.client();
    fn build(app: &App) -> postpone::WorkflowBuilder<'_> {
        let mut wf = app.workflow("in tx");
        let a = wf.step(NewJob::new("ok", &1).unwrap()).add();
        wf.step(NewJob::new("ok", &2).unwrap()).after(&[a]).add();
        wf
    }
    {
        let mut tx = client.transaction().unwrap();
        let run = build(&app).insert_in(&mut tx).unwrap();
        assert_eq!(run.jobs.len(), 2);
        tx.rollback().unwrap();
    }
    assert_eq!(count(&db, "postpone_jobs"), 0);
    assert_eq!(count(&db, "postpone_workflows"), 0);
    assert_eq!(count(&db, "postpone_workflow_jobs"), 0);
    assert_eq!(count(&db, "postpone_deps"), 0);

    let mut tx = client.transaction().unwrap();
    let run = build(&app).insert_in(&mut tx).unwrap();
    tx.commit().unwrap();
    let info = app.admin().workflow(run.id).unwrap();
    assert_eq!(info.total, 2);
    assert_eq!(info.jobs[1].after, vec![run.jobs[0]]);
}

#[test]
fn cancelling_a_workflow_ends_every_waiting_member_and_aborts_the_running_one() {
    let (db, app) = setup();
    let t = Arc::new(Timeline::default());
    let mut wf = app.workflow("to cancel");
    let hold = wf.step(NewJob::new("hold", &()).unwrap()).add();
    let mut waiting = Vec::new();
    for i in 0..5 {
        waiting.push(wf.step(NewJob::new("ok", &i).unwrap()).after([&hold]).add());
    }
    let last = wf
        .step(NewJob::new("ok", &"last").unwrap())
        .after_finished(&waiting)
        .add();
    // Due in an hour, depending on nothing: waiting all the same.
    let later = wf
        .step(
            NewJob::new("ok", &"later")
                .unwrap()
                .schedule_in(Duration::from_secs(3600)),
        )
        .add();
    let run = wf.insert().unwrap();
    let hold = run.job(&hold).unwrap();
    let ws = workers(&app, &t, 2);
    assert!(wait_until(Duration::from_secs(30), || !t
        .starts(hold)
        .is_empty()));

    let done = app.admin().cancel_workflow(run.id).unwrap();
    assert_eq!((done.cancelled, done.aborting), (7, 1));
    wait_status(&db, hold, "aborted", Duration::from_secs(30));
    shutdown(ws);

    let info = app.admin().workflow(run.id).unwrap();
    assert!(info.is_finished(), "{info:?}");
    assert_eq!((info.cancelled, info.aborted, info.total), (7, 1, 8));
    for id in [run.job(&last).unwrap(), run.job(&later).unwrap()] {
        let row = job_row(&mut db.client(), id).unwrap();
        assert_eq!(row.status, "cancelled");
        assert!(row
            .error_texts()
            .iter()
            .any(|e| e.contains(&format!("cancelled with its workflow {}", run.id))));
        assert!(t.starts(id).is_empty());
    }
    assert_eq!(count(&db, "postpone_deps_waiting"), 0);
    for j in &info.jobs {
        assert!(
            matches!(j.status, Some(JobStatus::Cancelled | JobStatus::Aborted)),
            "{j:?}"
        );
    }
    // A second cancel finds nothing left; an unknown workflow is NotFound.
    let again = app.admin().cancel_workflow(run.id).unwrap();
    assert_eq!((again.cancelled, again.aborting), (0, 0));
    for e in [
        app.admin()
            .cancel_workflow(WorkflowId(424_242))
            .unwrap_err(),
        app.admin().retry_workflow(WorkflowId(424_242)).unwrap_err(),
        app.admin().workflow(WorkflowId(424_242)).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }

    // And a retry brings the whole workflow back, in order.
    let retry = app.admin().retry_workflow(run.id).unwrap();
    assert_eq!(retry.retried.len(), 8, "{retry:?}");
    let info = app.admin().workflow(run.id).unwrap();
    assert_eq!(info.waiting, 8);
    // Ids follow the graph's layers: the roots (hold, later), the five, then last.
    let shown: Vec<&str> = info.jobs.iter().map(|j| j.describe()).collect();
    assert_eq!(&shown[..2], ["waiting", "waiting"]);
    assert!(
        shown[2..].iter().all(|s| *s == "waiting for dependencies"),
        "{shown:?} {info:?}"
    );
    assert_eq!(info.jobs[7].id, run.job(&last).unwrap());
    assert_eq!(info.jobs[7].after_finished.len(), 5);
}
