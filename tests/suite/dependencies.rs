//! Job dependencies (schema version 23): `after` runs a job once every listed job succeeded,
//! `after_finished` once every listed job finished; a dependency that ends badly cancels its
//! `after` dependents, in turn; a dependent is never started before its dependencies and
//! never left waiting once they have ended, whoever ends them (workers, operators, SQL).

use crate::support;
use crate::worker_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, SystemTime};

use postpone::{
    BulkAction, DeleteJobs, ErrorKind, Job, JobFilter, JobId, NewJob, TaskError, Tasks,
};
use serde_json::json;
use support::{wait_until, TestDb};
use worker_util::*;

/// When each job started and ended, on one counter shared by every worker thread.
#[derive(Default)]
struct Timeline {
    clock: AtomicU64,
    started: Mutex<HashMap<i64, u64>>,
    ended: Mutex<HashMap<i64, u64>>,
}

impl Timeline {
    fn start(&self, id: JobId) {
        let t = self.clock.fetch_add(1, Ordering::SeqCst);
        let mut started = self.started.lock().unwrap();
        assert!(started.insert(id.0, t).is_none(), "job {id} started twice");
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
}

/// Tasks "ok" (succeeds after a short pause, recording its output: its own id) and "fail"
/// (fails without retry), both on the timeline.
fn tasks(timeline: &Arc<Timeline>) -> Tasks {
    let mut tasks = Tasks::new();
    let t = timeline.clone();
    tasks.register("ok", move |job: &Job| {
        t.start(job.id());
        thread::sleep(Duration::from_millis(2));
        job.set_output(&job.id().0)?;
        t.end(job.id());
        Ok(())
    });
    let t = timeline.clone();
    tasks.register("fail", move |job: &Job| {
        t.start(job.id());
        t.end(job.id());
        Err(TaskError::fail("failing on purpose"))
    });
    tasks
}

fn status(db: &TestDb, id: JobId) -> String {
    db.client()
        .query_one("SELECT status FROM postpone_jobs WHERE id = $1", &[&id.0])
        .unwrap()
        .get(0)
}

/// Whether the job is waiting for dependencies (todo, scheduled for 'infinity').
fn waiting(db: &TestDb, id: JobId) -> bool {
    db.client()
        .query_one(
            "SELECT status = 'todo' AND scheduled_at = 'infinity' FROM postpone_jobs WHERE id = $1",
            &[&id.0],
        )
        .unwrap()
        .get(0)
}

fn count_jobs(db: &TestDb) -> i64 {
    db.client()
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0)
}

fn last_error(db: &TestDb, id: JobId) -> String {
    job_row(&mut db.client(), id)
        .unwrap()
        .error_texts()
        .pop()
        .unwrap_or_default()
}

#[test]
fn diamonds_never_start_a_job_before_its_dependencies_on_several_workers() {
    let (db, app) = setup();
    let timeline = Arc::new(Timeline::default());
    let workers: Vec<_> = (0..3)
        .map(|_| {
            fast_worker(&app, tasks(&timeline))
                .concurrency(3)
                .spawn()
                .unwrap()
        })
        .collect();
    // 40 diamonds a -> (b, c) -> d, deferred while the workers run.
    let mut diamonds = Vec::new();
    for _ in 0..40 {
        let a = app.defer("ok", &()).unwrap();
        let b = app.job("ok").after(&[a]).defer(&()).unwrap();
        let c = app.job("ok").after(&[a]).defer(&()).unwrap();
        let d = app.job("ok").after(&[b, c]).defer(&()).unwrap();
        diamonds.push((a, b, c, d));
    }
    for &(_, _, _, d) in &diamonds {
        wait_status(&db, d, "succeeded", Duration::from_secs(60));
    }
    for w in workers {
        assert!(w.shutdown(Duration::from_secs(10)).is_clean());
    }
    // The order is read on the tasks' own clock: the rows' started_at and finished_at are
    // their transactions' start times, and a claim's transaction may have begun (recording
    // other outcomes) before the dependency's finish committed.
    for &(a, b, c, d) in &diamonds {
        for (dependent, dependency) in [(b, a), (c, a), (d, b), (d, c)] {
            assert_eq!(status(&db, dependent), "succeeded");
            let start = timeline.started(dependent).unwrap();
            let end = timeline.ended(dependency).unwrap();
            assert!(
                start > end,
                "job {dependent} started at tick {start}, before its dependency {dependency} ended at tick {end}"
            );
        }
    }
}

#[test]
fn a_failed_dependency_cancels_its_dependents_in_turn_and_after_finished_still_runs() {
    let (db, app) = setup();
    let timeline = Arc::new(Timeline::default());
    let a = app.defer("fail", &()).unwrap();
    let b = app.job("ok").after(&[a]).defer(&()).unwrap();
    let c = app.job("ok").after(&[b]).defer(&()).unwrap();
    let cleanup = app.job("ok").after_finished(&[a, b, c]).defer(&()).unwrap();
    let sibling = app.defer("ok", &()).unwrap();
    // Needs both: one succeeds, one does not.
    let both = app.job("ok").after(&[sibling, b]).defer(&()).unwrap();
    let w = fast_worker(&app, tasks(&timeline))
        .concurrency(2)
        .spawn()
        .unwrap();
    wait_status(&db, cleanup, "succeeded", Duration::from_secs(30));
    wait_status(&db, sibling, "succeeded", Duration::from_secs(30));
    assert!(w.shutdown(Duration::from_secs(10)).is_clean());

    assert_eq!(status(&db, a), "failed");
    for (job, dependency) in [(b, a), (c, b), (both, b)] {
        assert_eq!(status(&db, job), "cancelled");
        assert_eq!(timeline.started(job), None, "job {job} ran");
        let e = last_error(&db, job);
        assert!(
            e.contains(&format!("job {dependency}"))
                && e.contains("cancelled") | e.contains("failed"),
            "job {job}: {e}"
        );
    }
    assert!(
        last_error(&db, b).contains("ended failed"),
        "{}",
        last_error(&db, b)
    );
    assert!(
        last_error(&db, c).contains("ended cancelled"),
        "{}",
        last_error(&db, c)
    );
    // after_finished ran once all three had ended, whatever their outcome.
    let run = timeline.started(cleanup).unwrap();
    assert!(run > timeline.ended(a).unwrap());
    let nothing_waits: i64 = db
        .client()
        .query_one("SELECT count(*) FROM postpone_deps_waiting", &[])
        .unwrap()
        .get(0);
    assert_eq!(nothing_waits, 0);
}

#[test]
fn dependencies_already_finished_count_at_once() {
    let (db, app) = setup();
    let timeline = Arc::new(Timeline::default());
    let ok = app.defer("ok", &()).unwrap();
    let bad = app.defer("fail", &()).unwrap();
    let w = fast_worker(&app, tasks(&timeline)).spawn().unwrap();
    wait_status(&db, ok, "succeeded", Duration::from_secs(30));
    wait_status(&db, bad, "failed", Duration::from_secs(30));
    assert!(w.shutdown(Duration::from_secs(10)).is_clean());

    let runs = app.job("ok").after(&[ok]).defer(&()).unwrap();
    let later = app
        .job("ok")
        .after(&[ok])
        .schedule_in(Duration::from_secs(3600))
        .defer(&())
        .unwrap();
    let never = app.job("ok").after(&[ok, bad]).defer(&()).unwrap();
    let anyway = app.job("ok").after_finished(&[bad]).defer(&()).unwrap();
    let mut c = db.client();
    let due: Vec<bool> = [runs, later, anyway]
        .iter()
        .map(|id| {
            c.query_one(
                "SELECT status = 'todo' AND scheduled_at <= now() FROM postpone_jobs WHERE id = $1",
                &[&id.0],
            )
            .unwrap()
            .get(0)
        })
        .collect();
    assert_eq!(due, [true, false, true]);
    let in_an_hour: bool = c
        .query_one(
            "SELECT scheduled_at BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes'
               FROM postpone_jobs WHERE id = $1",
            &[&later.0],
        )
        .unwrap()
        .get(0);
    assert!(
        in_an_hour,
        "a job whose dependencies succeeded keeps its own schedule"
    );
    assert_eq!(status(&db, never), "cancelled");
    let e = last_error(&db, never);
    assert!(
        e.contains(&format!("job {bad}")) && e.contains("failed"),
        "{e}"
    );
}

#[test]
fn an_unknown_or_deleted_dependency_is_an_error_and_inserts_nothing() {
    let (db, app) = setup();
    let a = app.defer("ok", &()).unwrap();
    let gone = app.defer("ok", &()).unwrap();
    app.admin().cancel_and_delete(gone).unwrap();
    let before = count_jobs(&db);
    for missing in [JobId(987_654), gone] {
        let e = app.job("ok").after(&[a, missing]).defer(&()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(
            e.to_string()
                .contains(&format!("job {missing} does not exist")),
            "{e}"
        );
        let e = app
            .job("ok")
            .after_finished(&[missing])
            .defer(&())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let batch = [
            NewJob::new("ok", &1).unwrap(),
            NewJob::new("ok", &2).unwrap().after(&[missing]),
        ];
        let e = app.defer_batch(&batch).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
    assert_eq!(count_jobs(&db), before, "nothing was inserted");
    // A unique job cannot wait for others.
    let e = app
        .job("ok")
        .unique(postpone::Unique::by_args())
        .after(&[a])
        .defer(&())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

#[test]
fn a_defer_racing_its_dependency_finishing_is_never_left_waiting() {
    let (db, app) = setup();
    let worker: i64 = db
        .client()
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat)
             VALUES ('by hand', now() + interval '1 day') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let mut waited = 0;
    for round in 0..150 {
        let outcome = ["succeeded", "failed", "cancelled"][round % 3];
        let a = app.defer("ok", &()).unwrap();
        db.client()
            .execute(
                "UPDATE postpone_jobs SET status = 'doing', worker_id = $2, attempts = 1,
                        started_at = now() WHERE id = $1",
                &[&a.0, &worker],
            )
            .unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let finisher = {
            let barrier = barrier.clone();
            let mut c = db.client();
            thread::spawn(move || {
                barrier.wait();
                // The worker's own recording statement.
                c.query(
                    "SELECT * FROM postpone_finish(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY[1],
                                                   ARRAY[$3::text], ARRAY[NULL::text], ARRAY[NULL::jsonb])",
                    &[&a.0, &worker, &outcome],
                )
                .unwrap();
            })
        };
        barrier.wait();
        let b = app.job("ok").after(&[a]).defer(&()).unwrap();
        let c = app.job("ok").after_finished(&[a]).defer(&()).unwrap();
        finisher.join().unwrap();
        if status(&db, a) == "doing" {
            panic!("round {round}: job {a} was not finished");
        }
        let mut client = db.client();
        let row = client
            .query_one(
                "SELECT b.status, b.scheduled_at = 'infinity', c.status, c.scheduled_at = 'infinity',
                        (SELECT count(*) FROM postpone_deps_waiting w WHERE w.job_id IN ($1, $2))
                   FROM postpone_jobs b, postpone_jobs c WHERE b.id = $1 AND c.id = $2",
                &[&b.0, &c.0],
            )
            .unwrap();
        let (b_status, b_waits, c_status, c_waits, rows): (String, bool, String, bool, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        let want_b = if outcome == "succeeded" {
            "todo"
        } else {
            "cancelled"
        };
        assert_eq!(
            (b_status.as_str(), b_waits, c_status.as_str(), c_waits, rows),
            (want_b, false, "todo", false, 0),
            "round {round}: job {a} ended {outcome}"
        );
        // Whether the defer saw the finish or the finish saw the defer.
        let counted_at_defer: bool = client
            .query_one(
                "SELECT outcome IS NOT NULL AND NOT EXISTS (
                        SELECT 1 FROM postpone_jobs WHERE id = $1 AND has_dependents)
                   FROM postpone_deps WHERE job_id = $2",
                &[&a.0, &b.0],
            )
            .unwrap()
            .get(0);
        if !counted_at_defer {
            waited += 1;
        }
    }
    println!(
        "MEASURED race: {waited} of 150 dependents were settled by the finish, the others at defer"
    );
}

#[test]
fn dependents_deferred_while_workers_run_their_dependencies_all_run_in_order() {
    let (db, app) = setup();
    let timeline = Arc::new(Timeline::default());
    let workers: Vec<_> = (0..2)
        .map(|_| {
            fast_worker(&app, tasks(&timeline))
                .concurrency(4)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut pairs = Vec::new();
    for _ in 0..300 {
        let a = app.defer("ok", &()).unwrap();
        let b = app.job("ok").after(&[a]).defer(&()).unwrap();
        pairs.push((a, b));
    }
    for &(_, b) in &pairs {
        wait_status(&db, b, "succeeded", Duration::from_secs(60));
    }
    for w in workers {
        assert!(w.shutdown(Duration::from_secs(10)).is_clean());
    }
    for &(a, b) in &pairs {
        assert!(timeline.started(b).unwrap() > timeline.ended(a).unwrap());
    }
}

#[test]
fn a_batch_defers_jobs_after_existing_ones_in_input_order() {
    let (db, app) = setup();
    let a = app.defer("ok", &()).unwrap();
    let b = app.defer("ok", &()).unwrap();
    let batch = vec![
        NewJob::new("ok", &1).unwrap().after(&[a]),
        NewJob::new("ok", &2).unwrap(),
        NewJob::new("ok", &3)
            .unwrap()
            .after(&[a, b])
            .after_finished(&[b])
            .queue("other")
            .priority(3),
        NewJob::new("ok", &4).unwrap().after_finished(&[a]),
    ];
    let ids = app.defer_batch(&batch).unwrap();
    assert_eq!(ids.len(), 4);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let mut c = db.client();
    for (i, id) in ids.iter().enumerate() {
        let row = c
            .query_one(
                "SELECT args, queue, priority, scheduled_at = 'infinity' FROM postpone_jobs WHERE id = $1",
                &[&id.0],
            )
            .unwrap();
        assert_eq!(row.get::<_, serde_json::Value>(0), json!(i + 1));
        assert_eq!(row.get::<_, bool>(3), i != 1, "job {i} of the batch");
        if i == 2 {
            assert_eq!(row.get::<_, String>(1), "other");
            assert_eq!(row.get::<_, i32>(2), 3);
        }
    }
    // Named by both: it must succeed.
    let both: bool = c
        .query_one(
            "SELECT NOT any_outcome FROM postpone_deps WHERE job_id = $1 AND dep_id = $2",
            &[&ids[2].0, &b.0],
        )
        .unwrap()
        .get(0);
    assert!(both);
    // Inside the caller's transaction too, and gone with its rollback.
    let mut client = db.client();
    let mut tx = client.transaction().unwrap();
    let in_tx = app.defer_batch_in(&mut tx, &batch[..1]).unwrap();
    let single = app.job("ok").after(&[a]).defer_in(&mut tx, &()).unwrap();
    tx.rollback().unwrap();
    for id in [in_tx[0], single] {
        assert!(job_row(&mut c, id).is_none());
    }
    let deps_left: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_deps WHERE job_id = ANY($1)",
            &[&vec![in_tx[0].0, single.0]],
        )
        .unwrap()
        .get(0);
    assert_eq!(deps_left, 0);
}

#[test]
fn a_long_chain_is_settled_in_one_statement_whichever_way_its_head_ends() {
    let (db, app) = setup();
    for head_ends in ["succeeded", "failed"] {
        let head = app.defer("ok", &()).unwrap();
        let mut chain = vec![head];
        for _ in 0..400 {
            let next = app
                .job("ok")
                .after(&[*chain.last().unwrap()])
                .defer(&())
                .unwrap();
            chain.push(next);
        }
        // Each link's "cleanup" runs once its link has ended, whatever the outcome.
        let cleanup = app
            .job("ok")
            .after_finished(&[chain[200]])
            .defer(&())
            .unwrap();
        db.client()
            .execute(
                "UPDATE postpone_jobs SET status = $2, finished_at = now() WHERE id = $1",
                &[&head.0, &head_ends],
            )
            .unwrap();
        if head_ends == "succeeded" {
            // Only the next link is released.
            assert!(!waiting(&db, chain[1]));
            assert!(waiting(&db, chain[2]));
        } else {
            let cancelled: i64 = db
                .client()
                .query_one(
                    "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1) AND status = 'cancelled'",
                    &[&chain[1..].iter().map(|j| j.0).collect::<Vec<_>>()],
                )
                .unwrap()
                .get(0);
            assert_eq!(cancelled, 400);
            assert!(!waiting(&db, cleanup));
            assert_eq!(status(&db, cleanup), "todo");
        }
    }
}

#[test]
fn operators_retry_cancel_reschedule_and_delete_without_starting_a_job_early() {
    let (db, app) = setup();
    let admin = app.admin();
    // Cancel and abort while waiting: the dependents of the cancelled job are cancelled.
    let a = app.defer("ok", &()).unwrap();
    let b = app.job("ok").after(&[a]).defer(&()).unwrap();
    let c = app.job("ok").after(&[b]).defer(&()).unwrap();
    let d = app.job("ok").after_finished(&[b]).defer(&()).unwrap();
    admin.cancel(b).unwrap();
    assert_eq!(status(&db, c), "cancelled");
    assert!(!waiting(&db, d), "after_finished: released by the cancel");
    let kept: bool = db
        .client()
        .query_one(
            "SELECT scheduled_at <> 'infinity' FROM postpone_jobs WHERE id = $1",
            &[&b.0],
        )
        .unwrap()
        .get(0);
    assert!(kept, "a cancelled dependent shows its own time");

    // Reschedule while waiting: still waiting, due at that time once released.
    let e = app.job("ok").after(&[a]).defer(&()).unwrap();
    let at = SystemTime::now() + Duration::from_secs(7200);
    admin.reschedule(e, at).unwrap();
    assert!(waiting(&db, e));
    let r = admin
        .bulk(
            BulkAction::Reschedule(SystemTime::now()),
            &JobFilter::new().id(e),
            false,
        )
        .unwrap();
    assert_eq!(r.changed, 1);
    assert!(
        waiting(&db, e),
        "a bulk reschedule does not release it either"
    );
    admin.reschedule(e, at).unwrap();

    let x = app.defer("ok", &()).unwrap();
    let later = app.job("ok").after(&[x]).defer(&()).unwrap();
    admin.reschedule(later, at).unwrap();
    db.client()
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = $1",
            &[&x.0],
        )
        .unwrap();
    let at_its_time: bool = db
        .client()
        .query_one(
            "SELECT status = 'todo' AND scheduled_at > now() + interval '1 hour'
               FROM postpone_jobs WHERE id = $1",
            &[&later.0],
        )
        .unwrap()
        .get(0);
    assert!(at_its_time, "released at the time it was rescheduled to");

    // Retry: a dependent whose dependency failed is refused until that one is retried.
    let mut client = db.client();
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'failed', finished_at = now() WHERE id = $1",
            &[&a.0],
        )
        .unwrap();
    assert_eq!(status(&db, e), "cancelled");
    let err = admin.retry(e).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
    assert!(err.to_string().contains(&format!("job {a}")), "{err}");
    assert_eq!(status(&db, e), "cancelled");
    admin.retry(a).unwrap();
    admin.retry(e).unwrap();
    assert!(
        waiting(&db, e),
        "retried while its dependency runs again: it waits"
    );
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = $1",
            &[&a.0],
        )
        .unwrap();
    let due: bool = client
        .query_one(
            "SELECT status = 'todo' AND scheduled_at <= now() FROM postpone_jobs WHERE id = $1",
            &[&e.0],
        )
        .unwrap()
        .get(0);
    assert!(due, "released, due now as the retry asked");

    // A bulk retry of a dependency and its dependent together.
    let f = app.job("ok").tags(["wf"]).defer(&()).unwrap();
    let g = app.job("ok").tags(["wf"]).after(&[f]).defer(&()).unwrap();
    client
        .execute(
            "UPDATE postpone_jobs SET status = 'failed', finished_at = now() WHERE id = $1",
            &[&f.0],
        )
        .unwrap();
    let r = admin
        .bulk(BulkAction::Retry, &JobFilter::new().tag("wf"), false)
        .unwrap();
    assert_eq!(r.changed, 2, "{r:?}");
    assert_eq!(status(&db, f), "todo");
    assert!(waiting(&db, g));

    // Deleting a waiting dependency cancels its dependents; deleting a dependent takes its
    // rows with it.
    let h = app.job("ok").after(&[g]).defer(&()).unwrap();
    admin.cancel_and_delete(g).unwrap();
    assert_eq!(status(&db, h), "cancelled");
    assert!(
        last_error(&db, h).contains("deleted"),
        "{}",
        last_error(&db, h)
    );
    let left: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM postpone_deps WHERE job_id = $1)
                  + (SELECT count(*) FROM postpone_deps_waiting WHERE job_id = $1)",
            &[&g.0],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

#[test]
fn a_dependent_reads_its_dependencies_outputs_and_runs_after_deleted_successes() {
    let (db, app) = setup();
    // (dependency id, its status, its output) as the consumer read them.
    type Seen = Vec<(i64, Option<String>, Option<i64>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut tasks = Tasks::new();
    tasks.register("produce", |job: &Job| {
        job.set_output(&(job.id().0 * 10))?;
        Ok(())
    });
    let s = seen.clone();
    tasks.register("consume", move |job: &Job| {
        for dep in job.dependency_outputs()? {
            s.lock().unwrap().push((
                dep.id.0,
                dep.status.map(|st| st.to_string()),
                dep.output_as::<i64>()?,
            ));
        }
        Ok(())
    });
    let p1 = app.defer("produce", &()).unwrap();
    let p2 = app.defer("produce", &()).unwrap();
    let consumer = app.job("consume").after(&[p1, p2]).defer(&()).unwrap();
    let w = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    wait_status(&db, consumer, "succeeded", Duration::from_secs(30));
    assert!(w.shutdown(Duration::from_secs(10)).is_clean());
    let got = seen.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            (p1.0, Some("succeeded".into()), Some(p1.0 * 10)),
            (p2.0, Some("succeeded".into()), Some(p2.0 * 10)),
        ]
    );

    // A worker that deletes its successes: the dependent still runs.
    let mut tasks = Tasks::new();
    tasks.register("produce", |_job: &Job| Ok(()));
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    tasks.register("consume", move |_job: &Job| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let p = app.defer("produce", &()).unwrap();
    let consumer = app.job("consume").after(&[p]).defer(&()).unwrap();
    let w = fast_worker(&app, tasks)
        .delete_finished(DeleteJobs::Successful)
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || runs
        .load(Ordering::SeqCst)
        == 1));
    assert!(w.shutdown(Duration::from_secs(10)).is_clean());
    assert!(job_row(&mut db.client(), consumer).is_none());
}

#[test]
fn postpone_defer_takes_after_and_after_finished_from_sql() {
    let (db, app) = setup();
    let a = app.defer("ok", &()).unwrap();
    let mut c = db.client();
    let b: i64 = c
        .query_one(
            "SELECT postpone_defer('ok', after => ARRAY[$1]::bigint[], queue => 'q')",
            &[&a.0],
        )
        .unwrap()
        .get(0);
    let d: i64 = c
        .query_one(
            "SELECT postpone_defer('ok', after_finished => ARRAY[$1, $2]::bigint[])",
            &[&a.0, &b],
        )
        .unwrap()
        .get(0);
    assert!(waiting(&db, JobId(b)) && waiting(&db, JobId(d)));
    // Without them, as before.
    let plain: i64 = c
        .query_one(
            "SELECT postpone_defer('ok', '{\"x\": 1}', priority => 2)",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!waiting(&db, JobId(plain)));
    let e = c
        .query_one(
            "SELECT postpone_defer('ok', after => ARRAY[-5]::bigint[])",
            &[],
        )
        .unwrap_err();
    let db_err = e.as_db_error().unwrap();
    assert_eq!(db_err.code().code(), "23503");
    assert!(
        db_err.message().contains("job -5 does not exist"),
        "{db_err:?}"
    );
    c.execute(
        "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = $1",
        &[&a.0],
    )
    .unwrap();
    assert!(!waiting(&db, JobId(b)));
    assert!(waiting(&db, JobId(d)));
}

#[test]
fn waiting_dependents_show_as_waiting_for_dependencies_not_as_scheduled() {
    let (_db, app) = setup();
    let admin = app.admin();
    let a = app.defer("ok", &()).unwrap();
    let later = app
        .job("ok")
        .schedule_in(Duration::from_secs(600))
        .defer(&())
        .unwrap();
    let b = app
        .job("ok")
        .after(&[a])
        .after_finished(&[later])
        .defer(&())
        .unwrap();

    let listed = admin.jobs(&JobFilter::new()).unwrap();
    let waits: Vec<(JobId, bool)> = listed
        .iter()
        .map(|j| (j.id, j.waiting_for_dependencies))
        .collect();
    assert_eq!(waits, vec![(b, true), (later, false), (a, false)]);

    let d = admin.job(b).unwrap();
    assert!(d.job.waiting_for_dependencies);
    let deps: Vec<(JobId, bool, Option<postpone::JobStatus>)> = d
        .dependencies
        .iter()
        .map(|x| (x.id, x.any_outcome, x.status))
        .collect();
    assert_eq!(
        deps,
        vec![
            (a, false, Some(postpone::JobStatus::Todo)),
            (later, true, Some(postpone::JobStatus::Todo)),
        ]
    );
    assert_eq!(admin.job(a).unwrap().dependents, vec![b]);
    assert!(
        admin
            .job_preview(b, 100)
            .unwrap()
            .detail
            .job
            .waiting_for_dependencies
    );

    let counts = admin.counts().unwrap();
    assert_eq!(counts.len(), 1);
    let c = &counts[0];
    assert_eq!(
        (c.todo, c.scheduled, c.waiting_for_dependencies),
        (1, 1, 1),
        "{c:?}"
    );
}

#[test]
fn a_rescued_dependency_keeps_its_dependents_waiting_until_it_runs_again() {
    let (db, app) = setup();
    let timeline = Arc::new(Timeline::default());
    let a = app.defer("ok", &()).unwrap();
    let b = app.job("ok").after(&[a]).defer(&()).unwrap();
    // A worker that claimed `a` and died: its heartbeat is an hour old.
    let mut c = db.client();
    let dead: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat)
             VALUES ('dead', now() - interval '1 hour') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    c.execute(
        "UPDATE postpone_jobs SET status = 'doing', worker_id = $2, attempts = 1,
                started_at = now() - interval '1 hour' WHERE id = $1",
        &[&a.0, &dead],
    )
    .unwrap();
    let w = fast_worker(&app, tasks(&timeline)).spawn().unwrap();
    wait_status(&db, b, "succeeded", Duration::from_secs(30));
    assert!(w.shutdown(Duration::from_secs(10)).is_clean());
    let row = job_row(&mut c, a).unwrap();
    assert_eq!(row.status, "succeeded");
    assert!(
        row.error_texts()
            .iter()
            .any(|e| e.contains("stopped sending heartbeats")),
        "{row:?}"
    );
    assert!(timeline.started(b).unwrap() > timeline.ended(a).unwrap());
}

#[test]
fn diamonds_keep_their_order_through_workers_shut_down_mid_job() {
    let (db, app) = setup();
    // Every start of every job, and the end of its successful run, on one clock.
    let clock = Arc::new(AtomicU64::new(0));
    let starts: Arc<Mutex<HashMap<i64, Vec<u64>>>> = Arc::default();
    let succeeded: Arc<Mutex<HashMap<i64, u64>>> = Arc::default();
    let make_tasks = || {
        let (clock, starts, succeeded) = (clock.clone(), starts.clone(), succeeded.clone());
        let mut tasks = Tasks::new();
        tasks.register("step", move |job: &Job| {
            let t = clock.fetch_add(1, Ordering::SeqCst);
            starts
                .lock()
                .unwrap()
                .entry(job.id().0)
                .or_default()
                .push(t);
            for _ in 0..10 {
                if job.should_abort() {
                    // A shutdown puts the job back in its queue.
                    return Err(TaskError::fail("stopped by the shutdown"));
                }
                thread::sleep(Duration::from_millis(6));
            }
            let t = clock.fetch_add(1, Ordering::SeqCst);
            succeeded.lock().unwrap().insert(job.id().0, t);
            Ok(())
        });
        tasks
    };
    let mut diamonds = Vec::new();
    for _ in 0..40 {
        let a = app.defer("step", &()).unwrap();
        let b = app.job("step").after(&[a]).defer(&()).unwrap();
        let c = app.job("step").after(&[a]).defer(&()).unwrap();
        let d = app.job("step").after(&[b, c]).defer(&()).unwrap();
        diamonds.push((a, b, c, d));
    }
    let last = diamonds.iter().map(|x| x.3).collect::<Vec<_>>();
    let all_done = |db: &TestDb| {
        let n: i64 = db
            .client()
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1) AND status = 'succeeded'",
                &[&last.iter().map(|j| j.0).collect::<Vec<_>>()],
            )
            .unwrap()
            .get(0);
        n == last.len() as i64
    };
    // Two workers at a time, one of them stopped every 150 ms with jobs in flight.
    let mut rounds = 0;
    let mut steady = fast_worker(&app, make_tasks())
        .concurrency(2)
        .spawn()
        .unwrap();
    while !all_done(&db) && rounds < 200 {
        rounds += 1;
        let w = fast_worker(&app, make_tasks())
            .concurrency(3)
            .shutdown_graceful_timeout(Duration::from_millis(5))
            .spawn()
            .unwrap();
        thread::sleep(Duration::from_millis(150));
        assert!(w.shutdown(Duration::from_secs(5)).is_clean());
        if rounds % 10 == 0 {
            assert!(steady.shutdown(Duration::from_secs(5)).is_clean());
            steady = fast_worker(&app, make_tasks())
                .concurrency(2)
                .spawn()
                .unwrap();
        }
    }
    assert!(
        wait_until(Duration::from_secs(60), || all_done(&db)),
        "not every diamond finished"
    );
    assert!(steady.shutdown(Duration::from_secs(10)).is_clean());
    let starts = starts.lock().unwrap();
    let succeeded = succeeded.lock().unwrap();
    let restarted = starts.values().filter(|s| s.len() > 1).count();
    for &(a, b, c, d) in &diamonds {
        for (dependent, dependency) in [(b, a), (c, a), (d, b), (d, c)] {
            let end = succeeded[&dependency.0];
            for &s in &starts[&dependent.0] {
                assert!(
                    s > end,
                    "job {dependent} started at tick {s}, before its dependency {dependency} succeeded at tick {end}"
                );
            }
        }
    }
    println!(
        "MEASURED shutdowns: {rounds} worker shutdowns, {restarted} jobs started more than once"
    );
}

#[test]
fn a_fan_in_of_two_thousand_jobs_releases_its_dependent_once_all_succeeded() {
    let (db, app) = setup();
    let timeline = Arc::new(Timeline::default());
    let jobs: Vec<NewJob> = (0..2000).map(|i| NewJob::new("ok", &i).unwrap()).collect();
    let ids = app.defer_batch(&jobs).unwrap();
    let started = std::time::Instant::now();
    let join = app.job("ok").after(&ids).defer(&()).unwrap();
    let deferred_in = started.elapsed();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            fast_worker(&app, tasks(&timeline))
                .concurrency(4)
                .spawn()
                .unwrap()
        })
        .collect();
    let started = std::time::Instant::now();
    wait_status(&db, join, "succeeded", Duration::from_secs(120));
    let ran_in = started.elapsed();
    for w in workers {
        assert!(w.shutdown(Duration::from_secs(10)).is_clean());
    }
    let start = timeline.started(join).unwrap();
    for id in &ids {
        assert!(start > timeline.ended(*id).unwrap(), "job {id}");
    }
    report_figure("deferring one job after 2,000", deferred_in);
    report_figure(
        "running 2,000 jobs and the one after them, 3 workers",
        ran_in,
    );
}
