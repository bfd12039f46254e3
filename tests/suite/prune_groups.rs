//! Retention prunes workflows and batches once none of their jobs is left and they are as
//! old as the jobs it prunes: a program that uses them and prunes keeps its tables flat.
//! Younger groups, and groups with a job left (waiting, or finished but kept), stay.

use crate::support;

use std::time::Duration;

use postpone::{App, ErrorKind, JobStatus, NewJob, Retention};
use support::TestDb;

fn count(db: &TestDb, sql: &str) -> i64 {
    db.client().query_one(sql, &[]).unwrap().get(0)
}

#[test]
fn prune_deletes_old_workflows_and_batches_whose_jobs_are_gone_and_keeps_the_rest() {
    let db = TestDb::new();
    let app = App::connect(&db.url()).unwrap();
    app.migrate().unwrap();
    let workflow = |name: &str| {
        let mut wf = app.workflow(name);
        let a = wf.step(NewJob::new("t", &"a").unwrap()).name("a").add();
        wf.step(NewJob::new("t", &"b").unwrap()).after([&a]).add();
        wf.insert().unwrap()
    };
    let batch = || {
        app.batch()
            .on_complete(NewJob::new("report", &()).unwrap())
            .defer(&[NewJob::new("t", &1).unwrap(), NewJob::new("t", &2).unwrap()])
            .unwrap()
    };
    // Finished two hours ago, created three: pruned whole.
    let (gone_wf, gone_b) = (workflow("gone"), batch());
    // Old and finished, but one job is still waiting: kept.
    let (live_wf, live_b) = (workflow("live"), batch());
    // Finished long ago but created within the hour (a clock the test sets): kept.
    let (young_wf, young_b) = (workflow("young"), batch());
    let mut c = db.client();
    let wf_jobs =
        |id: i64| format!("SELECT job_id FROM postpone_workflow_jobs WHERE workflow_id = {id}");
    for (wf, b, created) in [
        (gone_wf.id.get(), gone_b.id.get(), "3 hours"),
        (live_wf.id.get(), live_b.id.get(), "3 hours"),
        (young_wf.id.get(), young_b.id.get(), "10 minutes"),
    ] {
        c.batch_execute(&format!(
            "UPDATE postpone_workflows SET created_at = now() - interval '{created}' WHERE id = {wf};
             UPDATE postpone_batches SET created_at = now() - interval '{created}' WHERE id = {b};
             UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() - interval '2 hours',
                                      scheduled_at = now() - interval '3 hours'
              WHERE id IN ({}) OR batch_id = {b}",
            wf_jobs(wf)
        ))
        .unwrap();
    }
    // One job of the live workflow and of the live batch wait again.
    c.batch_execute(&format!(
        "UPDATE postpone_jobs SET status = 'todo', finished_at = NULL
          WHERE id = (SELECT max(job_id) FROM postpone_workflow_jobs WHERE workflow_id = {});
         UPDATE postpone_jobs SET status = 'todo', finished_at = NULL
          WHERE id = (SELECT min(id) FROM postpone_jobs WHERE batch_id = {})",
        live_wf.id.get(),
        live_b.id.get()
    ))
    .unwrap();

    let report = app
        .admin()
        .prune(&Retention::new(Duration::from_secs(3600)))
        .unwrap();
    // Jobs: gone's 2 + 3, live's 1 + 2, young's 2 + 3.
    assert_eq!(report.jobs_deleted, 13, "{report}");
    assert_eq!(report.groups_deleted, 2, "{report}");
    assert!(
        report.to_string().contains("2 workflow(s) or batch(es)"),
        "{report}"
    );
    let e = app.admin().workflow(gone_wf.id).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = app.admin().batch(gone_b.id).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT count(*) FROM postpone_workflow_jobs WHERE workflow_id = {}",
                gone_wf.id.get()
            )
        ),
        0,
        "the pruned workflow's membership rows stayed"
    );
    // The live ones keep their rows and their waiting job.
    let info = app.admin().workflow(live_wf.id).unwrap();
    assert_eq!(
        (info.total, info.waiting, info.deleted),
        (2, 1, 1),
        "{info:?}"
    );
    assert_eq!(info.jobs[1].status, Some(JobStatus::Todo));
    assert_eq!(app.admin().batch(live_b.id).unwrap().waiting, 1);
    // The young ones stay too, with no job left.
    let info = app.admin().workflow(young_wf.id).unwrap();
    assert_eq!((info.total, info.deleted), (2, 2), "{info:?}");
    assert_eq!(app.admin().batch(young_b.id).unwrap().waiting, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM postpone_workflows"), 2);
    assert_eq!(count(&db, "SELECT count(*) FROM postpone_batches"), 2);
    // Once the young ones are as old as the retention, the next prune takes them.
    c.batch_execute(&format!(
        "UPDATE postpone_workflows SET created_at = now() - interval '2 hours' WHERE id = {};
         UPDATE postpone_batches SET created_at = now() - interval '2 hours' WHERE id = {}",
        young_wf.id.get(),
        young_b.id.get()
    ))
    .unwrap();
    let report = app
        .admin()
        .prune(&Retention::new(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(
        (report.jobs_deleted, report.groups_deleted),
        (0, 2),
        "{report}"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM postpone_workflows"), 1);
    assert_eq!(count(&db, "SELECT count(*) FROM postpone_batches"), 1);
}
