//! Issue 13's first promise: a database installed by version 1 that holds jobs in every
//! status upgrades to the latest version in place **while a version 1 worker still runs**.
//! The old worker (a connection speaking the statements version 1 sent, copied from that
//! release's store.rs) is in the middle of a job when `migrate` runs; afterwards it records
//! that job's outcome, heartbeats and claims again with its own statements, side by side
//! with a worker of this version, and no job is lost, run twice, or left behind.

use crate::support;

use std::time::{Duration, Instant};

use postpone::{App, Job, Tasks, Worker};
use support::*;

/// Version 1's claim (a worker of every queue and task), as it was sent.
const V1_CLAIM: &str = "
UPDATE postpone_jobs j
   SET status = 'doing', worker_id = $1, attempts = j.attempts + 1, started_at = now()
 WHERE j.id = ANY(ARRAY(
       SELECT j.id
         FROM postpone_jobs j
        WHERE j.status = 'todo'
          AND j.scheduled_at <= now()
          AND (j.lock IS NULL OR NOT EXISTS (
               SELECT 1 FROM postpone_jobs e
                WHERE e.lock = j.lock
                  AND e.status IN ('todo', 'doing')
                  AND (e.status = 'doing' OR e.id < j.id)))
        ORDER BY j.priority DESC, j.id
        LIMIT $2
          FOR UPDATE SKIP LOCKED))
   AND EXISTS (SELECT 1 FROM postpone_workers w WHERE w.id = $1)
RETURNING j.id, j.queue, j.task, j.args, j.attempts, j.priority, j.lock, j.abort_requested";

/// Version 1's outcome of one job (its batch statement, for `succeeded` and `failed`).
const V1_FINISH: &str = "
UPDATE postpone_jobs j
   SET status = $3, finished_at = now(),
       errors = CASE WHEN $4::text IS NULL THEN j.errors
                     ELSE coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(
                         jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', $4::text))
                END
 WHERE j.id = $2 AND j.status IS NOT DISTINCT FROM 'doing'
   AND j.worker_id IS NOT DISTINCT FROM $1::bigint
RETURNING j.id";

const V1_HEARTBEAT: &str = "UPDATE postpone_workers SET last_heartbeat = now() WHERE id = $1";

fn status(c: &mut postgres::Client, arg: i32) -> String {
    c.query_one(
        "SELECT status FROM postpone_jobs WHERE args::jsonb = to_jsonb($1::int)",
        &[&arg],
    )
    .unwrap()
    .get(0)
}

#[test]
fn a_version_1_database_with_jobs_in_every_status_upgrades_while_a_v1_worker_runs() {
    init_logging();
    let db = TestDb::new();
    let mut old = db.client();
    old.batch_execute(include_str!("../../src/schema/0001_init.sql"))
        .unwrap();
    old.batch_execute(
        "CREATE TABLE postpone_migrations (
             version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO postpone_migrations (version, name) VALUES (1, 'init');
         INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES (900, 'old-v1', now());
         INSERT INTO postpone_jobs (queue, task, args, status, priority) VALUES
              ('default', 'work', '1', 'todo', 10),
              ('default', 'work', '2', 'succeeded', 0),
              ('default', 'work', '3', 'failed', 0),
              ('default', 'work', '4', 'cancelled', 0),
              ('default', 'work', '5', 'aborted', 0);
         INSERT INTO postpone_jobs (queue, task, args, lock) VALUES ('default', 'work', '6', 'L');
         INSERT INTO postpone_jobs (queue, task, args, lock) VALUES ('default', 'work', '7', 'L');
         INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
              VALUES ('default', 'work', '8', now() + interval '1 hour');
         INSERT INTO postpone_jobs (queue, task, args)
              SELECT 'bulk', 'work', to_jsonb(100 + i) FROM generate_series(1, 40) i;",
    )
    .unwrap();
    // The old worker is in the middle of job 1 (the highest priority) when the upgrade runs.
    let running: i64 = old.query_one(V1_CLAIM, &[&900i64, &1i64]).unwrap().get(0);
    assert_eq!(running, 1);

    let app = App::builder(db.url()).pool_size(2).build().unwrap();
    let applied = app.migrate().unwrap();
    assert_eq!(applied.first(), Some(&2), "{applied:?}");
    assert_eq!(applied.last(), Some(&postpone::SCHEMA_VERSION));
    assert_eq!(
        status(&mut old, 1),
        "doing",
        "the old worker's job was left alone"
    );

    // The old worker finishes its job, heartbeats, and claims again with its statements.
    assert_eq!(
        old.query(V1_FINISH, &[&900i64, &running, &"succeeded", &None::<&str>])
            .unwrap()
            .len(),
        1
    );
    assert_eq!(old.execute(V1_HEARTBEAT, &[&900i64]).unwrap(), 1);

    // A worker of this version joins. Both run jobs until every due job is done; each job
    // runs once (the new worker's runs are counted here, the old one's by its claims).
    let (tx, rx) = crossbeam_channel::unbounded::<i64>();
    let mut tasks = Tasks::new();
    tasks.register("work", move |job: &Job| {
        tx.send(job.id().get()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    });
    let w = Worker::builder(&app, tasks)
        .concurrency(2)
        .poll_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(100))
        .stalled_after(Duration::from_secs(5))
        .spawn()
        .unwrap();
    let mut old_ran: Vec<i64> = vec![running];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        old.execute(V1_HEARTBEAT, &[&900i64]).unwrap();
        let rows = old.query(V1_CLAIM, &[&900i64, &3i64]).unwrap();
        for r in &rows {
            let id: i64 = r.get(0);
            let outcome = if id % 7 == 0 { "failed" } else { "succeeded" };
            let err = (outcome == "failed").then_some("the old worker failed it");
            assert_eq!(
                old.query(V1_FINISH, &[&900i64, &id, &outcome, &err])
                    .unwrap()
                    .len(),
                1,
                "the old worker's outcome of job {id} was refused"
            );
            old_ran.push(id);
        }
        let due: i64 = old
            .query_one(
                "SELECT count(*) FROM postpone_jobs
                  WHERE status IN ('todo', 'doing') AND scheduled_at <= now()",
                &[],
            )
            .unwrap()
            .get(0);
        if due == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    let new_ran: Vec<i64> = rx.try_iter().collect();
    println!(
        "  old v1 worker ran {} jobs, the new worker {}",
        old_ran.len(),
        new_ran.len()
    );
    let mut all: Vec<i64> = old_ran.iter().chain(&new_ran).copied().collect();
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "a job ran twice");
    // Jobs 1, 6, 7 and the 40 bulk jobs ran; finished ones were left alone; the scheduled
    // job waits.
    assert_eq!(n, 43, "old {old_ran:?} new {new_ran:?}");
    let got: Vec<String> = (1..=8).map(|a| status(&mut old, a)).collect();
    assert_eq!(
        got,
        [
            "succeeded", // run by the old worker across the upgrade
            "succeeded",
            "failed",
            "cancelled",
            "aborted",
            got[5].as_str(), // lock L, first: run by either worker
            got[6].as_str(), // lock L, second
            "todo",          // due in an hour
        ]
    );
    for a in [6, 7] {
        assert!(
            ["succeeded", "failed"].contains(&got[a - 1].as_str()),
            "job {a}: {}",
            got[a - 1]
        );
    }
    let left: i64 = old
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status IN ('todo', 'doing')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 1, "only the scheduled job is left");
    // The schema works for this version's admin calls too.
    let counts = app.admin().counts().unwrap();
    assert_eq!(counts.iter().map(|c| c.doing).sum::<u64>(), 0);
}
