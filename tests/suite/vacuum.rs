//! The worker's vacuum of `postpone_jobs` against the real server (whose autovacuum may be
//! off, as it is on this project's CI machine): a busy worker vacuums once the dead rows
//! pass its threshold, `Vacuum::off()` never does, and a role that does not own the table
//! never vacuums and meets no error. The claim's speed itself is a bench's business
//! (`cargo bench --bench throughput -- --only steady`).

use crate::support;
use crate::worker_util;

use std::time::{Duration, Instant};

use postpone::{App, NewJob, Tasks, Vacuum, WorkerHandle};
use support::wait_until;
use worker_util::*;

fn noop() -> Tasks {
    let mut tasks = Tasks::new();
    tasks.register("noop", |_job: &postpone::Job| Ok(()));
    tasks
}

fn defer(app: &App, n: usize) {
    let jobs: Vec<NewJob> = (0..n).map(|_| NewJob::new("noop", &()).unwrap()).collect();
    app.defer_batch(&jobs).unwrap();
}

/// (manual vacuums, manual analyzes) of the table, as the server counts them.
fn server_counts(db: &support::TestDb) -> (i64, i64) {
    let row = db
        .client()
        .query_one(
            "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables
              WHERE relid = 'postpone_jobs'::regclass",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// Keeps the worker busy (so its completer reads the counters) until `done` or `timeout`.
fn feed_until(app: &App, timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if done() {
            return true;
        }
        defer(app, 200);
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

fn stop(handle: WorkerHandle) {
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "unclean shutdown: {report}");
}

#[test]
fn a_busy_worker_vacuums_the_jobs_table_past_its_threshold() {
    let (db, app) = setup();
    assert_eq!(server_counts(&db), (0, 0));
    let w = fast_worker(&app, noop())
        .concurrency(4)
        .vacuum(
            Vacuum::default()
                .dead_rows(500)
                .live_fraction(0.0)
                .check_every(Duration::from_millis(200)),
        )
        .spawn()
        .unwrap();
    let vacuumed = feed_until(&app, Duration::from_secs(60), || w.stats().vacuums > 0);
    let stats = w.stats();
    stop(w);
    assert!(
        vacuumed,
        "no vacuum after {} jobs: {stats:?}",
        stats.recorded
    );
    // The server counts the vacuum too (its counters may lag the worker's by a moment).
    assert!(
        wait_until(Duration::from_secs(10), || server_counts(&db).0 >= 1),
        "pg_stat_user_tables counts no vacuum: {:?}",
        server_counts(&db)
    );
    assert_eq!(stats.db_errors, 0, "{stats:?}");
}

#[test]
fn vacuum_off_leaves_the_table_to_autovacuum() {
    let (db, app) = setup();
    let w = fast_worker(&app, noop())
        .concurrency(4)
        .vacuum(Vacuum::off())
        .spawn()
        .unwrap();
    // As many jobs as the test above needed many times over.
    feed_until(&app, Duration::from_secs(8), || false);
    assert!(wait_until(Duration::from_secs(30), || {
        db.client()
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status <> 'succeeded'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 0
    }));
    let stats = w.stats();
    stop(w);
    assert!(stats.recorded >= 1_000, "too few jobs ran: {stats:?}");
    assert_eq!(stats.vacuums, 0);
    assert_eq!(server_counts(&db), (0, 0), "a manual vacuum or analyze ran");
}

#[test]
fn a_role_that_does_not_own_the_table_never_vacuums_and_meets_no_error() {
    let (db, app) = setup();
    let role = format!("{}_user", db.name());
    let mut admin = db.client();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT USAGE ON SCHEMA public TO {role};
             GRANT ALL ON ALL TABLES IN SCHEMA public TO {role};
             GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role};"
        ))
        .unwrap();
    let mut spec = db.server().clone();
    spec.user = role.clone();
    spec.password = None;
    let other = app_at(&spec.url(db.name()), Duration::from_secs(5));
    let w = fast_worker(&other, noop())
        .concurrency(2)
        .vacuum(
            Vacuum::default()
                .dead_rows(200)
                .live_fraction(0.0)
                .check_every(Duration::from_millis(100)),
        )
        .spawn()
        .unwrap();
    // Enough work for several checks past the threshold; the vacuum thread ends after its
    // first look, so the worker's connections go back to the steady set.
    feed_until(&app, Duration::from_secs(5), || false);
    let stats = w.stats();
    stop(w);
    drop(other);
    assert!(stats.recorded >= 400, "too few jobs ran: {stats:?}");
    assert_eq!(stats.vacuums, 0);
    assert_eq!(stats.db_errors, 0, "not owning the table is not an error");
    assert_eq!(server_counts(&db), (0, 0));
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .unwrap();
}
