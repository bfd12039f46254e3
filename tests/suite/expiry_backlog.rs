//! A backlog of expired jobs at the head of claim order does not slow the claim (schema
//! version 30, issue 43): jobs with a deadline have due indexes of their own, and the
//! claim's walk of them starts past every job whose deadline must have passed (now less the
//! longest time a waiting job may wait). Every claim variant still takes the live jobs in
//! claim order, with and without a deadline, and never an expired one; `next_due` sees jobs
//! with a deadline scheduled for later.

use crate::support;
use crate::worker_util;

use support::TestDb;
use worker_util::*;

fn hand_worker(db: &TestDb) -> i64 {
    db.client()
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat)
             VALUES ('by hand', now() + interval '1 day') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0)
}

/// 50,000 expired jobs (a minute to live, scheduled two to three hours ago: due before
/// everything else), 100 due jobs without a deadline (30 minutes ago), 5 live jobs with a
/// deadline scheduled before them (50 minutes ago, ten minutes left) and one of priority 1
/// (a minute ago, five minutes left); vacuumed and analyzed.
fn backlog(db: &TestDb) {
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, scheduled_at, expires_at)
             SELECT 'default', 'old', 'null', s.at, s.at + interval '1 minute'
               FROM (SELECT now() - interval '3 hours' + (g % 3600) * interval '1 second' AS at
                       FROM generate_series(1, 50000) g) s;
             INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
             SELECT 'default', 'plain', 'null', now() - interval '30 minutes'
               FROM generate_series(1, 100);
             INSERT INTO postpone_jobs (queue, task, args, scheduled_at, expires_at)
             SELECT 'default', 'live', 'null', now() - interval '50 minutes',
                    now() + interval '10 minutes'
               FROM generate_series(1, 5);
             INSERT INTO postpone_jobs (queue, task, args, priority, scheduled_at, expires_at)
             VALUES ('default', 'urgent', 'null', 1, now() - interval '1 minute',
                     now() + interval '5 minutes')",
        )
        .unwrap();
    db.client()
        .batch_execute("VACUUM ANALYZE postpone_jobs")
        .unwrap();
}

/// Runs `claim` (a query returning the claimed tasks) in a transaction rolled back after:
/// the tasks it returned, and the heap rows of postpone_jobs its statements fetched through
/// the table's indexes (this transaction's own counters).
fn claim(c: &mut postgres::Client, claim: &str, w: i64) -> (Vec<String>, i64) {
    let mut tx = c.transaction().unwrap();
    let before: i64 = tx
        .query_one(
            "SELECT sum(pg_stat_get_xact_tuples_fetched(indexrelid))::bigint
               FROM pg_index WHERE indrelid = 'postpone_jobs'::regclass",
            &[],
        )
        .unwrap()
        .get(0);
    let rows = tx.query(claim, &[&w]).unwrap();
    let after: i64 = tx
        .query_one(
            "SELECT sum(pg_stat_get_xact_tuples_fetched(indexrelid))::bigint
               FROM pg_index WHERE indrelid = 'postpone_jobs'::regclass",
            &[],
        )
        .unwrap()
        .get(0);
    tx.rollback().unwrap();
    let mut tasks: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    tasks.sort();
    (tasks, after - before)
}

#[test]
fn expired_jobs_ahead_of_live_ones_are_not_read_by_the_claim() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    backlog(&db);
    let mut c = db.client();
    // Claim order: the urgent job (priority 1), the five live ones (50 minutes ago), then
    // 58 of the jobs without a deadline; none of the 50,000 expired ones.
    let mut expected = vec!["urgent".to_string()];
    expected.extend((0..5).map(|_| "live".to_string()));
    expected.extend((0..58).map(|_| "plain".to_string()));
    expected.sort();
    for (what, sql) in [
        (
            "every queue, held",
            "SELECT task FROM postpone_claim_jobs($1, 64, NULL, NULL, 64)",
        ),
        (
            "one queue",
            "SELECT task FROM postpone_claim_jobs($1, 64, ARRAY['default'], NULL, 64)",
        ),
        (
            "two queues",
            "SELECT task FROM postpone_claim_jobs($1, 64, ARRAY['other', 'default'], NULL, 64)",
        ),
        (
            "tasks named",
            "SELECT task FROM postpone_claim_jobs($1, 64, NULL,
                                                  ARRAY['old', 'plain', 'live', 'urgent'], 64)",
        ),
        (
            "a byte budget",
            "SELECT task FROM postpone_claim_jobs($1, 64, NULL, NULL, 64, 1000000, true)",
        ),
        (
            "every queue, started (postpone_claim)",
            "SELECT task FROM postpone_claim($1, 64, NULL, NULL)",
        ),
    ] {
        let (tasks, fetched) = claim(&mut c, sql, w);
        assert_eq!(tasks, expected, "{what}");
        // Schema 25 read every expired row (50,000 heap fetches); here the claim reads the
        // rows it takes and those it locks, a few probes, and the parked-lock checks.
        println!("  {what}: {fetched} rows of postpone_jobs fetched");
        assert!(
            fetched < 2_000,
            "{what}: the claim fetched {fetched} rows: it walked the expired jobs"
        );
    }
    // A claim that asks for everything takes every live job and no expired one.
    let (tasks, fetched) = claim(
        &mut c,
        "SELECT task FROM postpone_claim_jobs($1, 1000, NULL, NULL, 1000)",
        w,
    );
    assert_eq!(tasks.len(), 106);
    assert!(!tasks.iter().any(|t| t == "old"));
    assert!(fetched < 5_000, "{fetched}");
}

#[test]
fn a_queue_with_a_limit_takes_live_jobs_beside_an_expired_backlog() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    backlog(&db);
    let mut c = db.client();
    c.batch_execute("INSERT INTO postpone_queue_limits (queue, max_running) VALUES ('default', 3)")
        .unwrap();
    // The limit starts at most three: the urgent job and two of the five live ones.
    let (tasks, _) = claim(
        &mut c,
        "SELECT task FROM postpone_claim_jobs($1, 64, NULL, NULL, 64)",
        w,
    );
    assert_eq!(tasks, vec!["live", "live", "urgent"]);
    let (tasks, _) = claim(
        &mut c,
        "SELECT task FROM postpone_claim_jobs($1, 64, ARRAY['default'], NULL, 64)",
        w,
    );
    assert_eq!(tasks, vec!["live", "live", "urgent"]);
}

#[test]
fn next_due_sees_jobs_with_and_without_a_deadline() {
    let (db, _app) = setup();
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
         VALUES ('a', 't', 'null', now() + interval '20 minutes');
         INSERT INTO postpone_jobs (queue, task, args, scheduled_at, expires_at)
         VALUES ('b', 't', 'null', now() + interval '10 minutes', now() + interval '1 hour')",
    )
    .unwrap();
    let due = |c: &mut postgres::Client, queues: Option<Vec<&str>>| -> f64 {
        c.query_one(
            "SELECT extract(epoch FROM postpone_next_due($1) - now())::float8",
            &[&queues],
        )
        .unwrap()
        .get(0)
    };
    let near = |v: f64, minutes: f64| (v - minutes * 60.0).abs() < 30.0;
    assert!(near(due(&mut c, None), 10.0));
    assert!(near(due(&mut c, Some(vec!["a", "b"])), 10.0));
    assert!(near(due(&mut c, Some(vec!["a"])), 20.0));
    assert!(near(due(&mut c, Some(vec!["b"])), 10.0));
    // A pause of queue b: its jobs do not count, whichever index holds them.
    c.batch_execute("INSERT INTO postpone_paused_queues (queue) VALUES ('b')")
        .unwrap();
    assert!(near(due(&mut c, None), 20.0));
    c.batch_execute(
        "DELETE FROM postpone_paused_queues;
         INSERT INTO postpone_paused_queues (queue) VALUES ('a')",
    )
    .unwrap();
    assert!(near(due(&mut c, None), 10.0));
}
