//! Retention deletes finished jobs through the finished-jobs index, oldest first, whatever the
//! statistics say: with statistics taken when every kept job was already old enough, a batch
//! of the prune once scanned the table from its first page for its thousand rows.

use crate::support;

use std::time::{Duration, Instant};

use postpone::{App, Retention};
use support::TestDb;

/// The jobs table's sequential scans, the finished-jobs index's scans and the rows deleted
/// from the table, as the statistics say now.
fn counters(db: &TestDb) -> (i64, i64, i64) {
    let mut c = db.client();
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    let r = c
        .query_one(
            "SELECT t.seq_scan, i.idx_scan, t.n_tup_del
               FROM pg_stat_user_tables t
               JOIN pg_stat_user_indexes i ON i.relid = t.relid
              WHERE t.relname = 'postpone_jobs'
                AND i.indexrelname = 'postpone_jobs_finished_idx'",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

#[test]
fn prune_reads_the_finished_jobs_index_even_when_the_statistics_call_every_job_old() {
    let db = TestDb::new();
    let app = App::connect(&db.url()).unwrap();
    app.migrate().unwrap();
    let mut c = db.client();
    // 20,000 jobs finished one to two hours ago, in no order on the table's pages, and 2,000
    // waiting ones; the statistics are taken now, so every finished job is old enough for the
    // planner, which priced a sequential scan below the index for a LIMIT of 1,000.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, status, attempts, started_at, finished_at)
         SELECT 'default', 'old', 'null', 'succeeded', 1, now() - interval '3 hours',
                now() - interval '1 hour' - random() * interval '1 hour'
           FROM generate_series(1, 20000);
         INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'default', 'waiting', 'null' FROM generate_series(1, 2000)",
    )
    .unwrap();
    c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    c.batch_execute("SELECT pg_stat_force_next_flush()")
        .unwrap();
    c.batch_execute("SELECT 1").unwrap();
    let (seq0, idx0, del0) = counters(&db);

    let report = app
        .admin()
        .prune(&Retention::new(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(report.jobs_deleted, 20000, "{report}");
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'todo' AND task = 'waiting'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 2000, "the waiting jobs stay");

    // The pruning session flushes its counters as it ends (when idle, within 10 s).
    drop(app);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (seq1, idx1, del1) = loop {
        let now = counters(&db);
        if now.2 - del0 >= 20000 || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        del1 - del0 >= 20000,
        "the statistics never counted the prune's deletes ({} of 20000)",
        del1 - del0
    );
    assert_eq!(
        seq1 - seq0,
        0,
        "the prune scanned the jobs table sequentially {} time(s)",
        seq1 - seq0
    );
    // 20 full batches and the short one that ends the prune.
    assert!(
        idx1 - idx0 >= 21,
        "the finished-jobs index was scanned {} time(s)",
        idx1 - idx0
    );
}
