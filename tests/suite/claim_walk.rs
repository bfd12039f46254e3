//! The claim walks only due jobs: one priority at a time, each walk ending at the first job
//! not due yet (schema version 11), and still takes jobs in claim order across priorities
//! and queues, through the index of its queues when it names them (whatever the table's size
//! and statistics, schema version 36), and updates the rows it walked where it found them
//! (schema version 16). Walks it merges (several queues, jobs with a deadline beside others)
//! take turns, so that it locks about as many rows as it claims (schema version 50), in rounds
//! of one statement for many walks, and a queue named twice is walked once (schema version 51).

use crate::support;
use crate::worker_util;

use std::str::FromStr;
use std::sync::{Arc, Mutex};

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

/// Buffers of the claim index read so far (hits and reads), as the statistics say once the
/// claiming session has flushed its counters.
fn due_index_buffers(db: &TestDb) -> i64 {
    index_buffers(db, "postpone_jobs_due_idx")
}

/// Buffers of an index read so far (hits and reads), as the statistics say once the sessions
/// that read it have flushed their counters.
fn index_buffers(db: &TestDb, index: &str) -> i64 {
    let mut c = db.client();
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    c.query_one(
        "SELECT (coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0))::bigint
           FROM pg_statio_user_indexes WHERE indexrelname = $1",
        &[&index],
    )
    .unwrap()
    .get(0)
}

/// Flushes this session's statistics counters (`pg_stat_force_next_flush` asks for it at the
/// end of the next transaction).
fn flush_counters(c: &mut postgres::Client) {
    c.batch_execute("SELECT pg_stat_force_next_flush()")
        .unwrap();
    c.batch_execute("SELECT 1").unwrap();
}

#[test]
fn a_short_claim_does_not_walk_the_jobs_scheduled_for_later() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut c = db.client();
    // 50,000 jobs for tomorrow at priority 0 sit, in index order, between the claim's start
    // and the three due jobs of priority -1; the claim asks for more than there are.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
         SELECT 'default', 'later', 'null', now() + interval '1 day'
           FROM generate_series(1, 50000);
         INSERT INTO postpone_jobs (queue, task, args, priority)
         SELECT 'default', 'due', 'null', -1 FROM generate_series(1, 3)",
    )
    .unwrap();
    c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    let size: i64 = c
        .query_one(
            "SELECT pg_relation_size('postpone_jobs_due_idx') / 8192",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(size > 100, "the index holds {size} pages");
    // This session's counters so far (the inserts, the vacuum) reach the statistics now.
    c.batch_execute("SELECT pg_stat_force_next_flush()")
        .unwrap();
    c.batch_execute("SELECT 1").unwrap();
    let before = due_index_buffers(&db);
    let rows = c
        .query("SELECT task FROM postpone_claim($1, 10, NULL, NULL)", &[&w])
        .unwrap();
    c.batch_execute("SELECT pg_stat_force_next_flush()")
        .unwrap();
    // A new transaction of the same session flushes the counters.
    c.batch_execute("SELECT 1").unwrap();
    let read = due_index_buffers(&db) - before;
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.get::<_, String>(0) == "due"));
    assert!(
        read < 40,
        "the claim read {read} pages of a {size}-page index: it walked the jobs for tomorrow"
    );
}

#[test]
fn claims_take_jobs_by_priority_across_queues_then_by_due_time() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, priority, scheduled_at) VALUES
           ('a', 'a-low-old',  'null', 0, now() - interval '3 s'),
           ('b', 'b-high-new', 'null', 5, now() - interval '1 s'),
           ('a', 'a-high-old', 'null', 5, now() - interval '2 s'),
           ('b', 'b-mid',      'null', 2, now() - interval '9 s'),
           ('a', 'a-later',    'null', 9, now() + interval '1 hour')",
    )
    .unwrap();
    let claim = |c: &mut postgres::Client, queues: Option<Vec<&str>>, n: i32| -> Vec<String> {
        let mut rows: Vec<(i32, f64, String)> = c
            .query(
                "SELECT priority, extract(epoch FROM scheduled_at)::float8, task
                   FROM postpone_claim($1, $2, $3, NULL)",
                &[&w, &n, &queues],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        rows.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.total_cmp(&y.1)));
        rows.into_iter().map(|r| r.2).collect()
    };
    // Two queues named: the best three of both, in claim order.
    assert_eq!(
        claim(&mut c, Some(vec!["a", "b"]), 3),
        ["a-high-old", "b-high-new", "b-mid"]
    );
    // Every queue: what is left and due; the job for later stays.
    assert_eq!(claim(&mut c, None, 10), ["a-low-old"]);
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'todo'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 1);
}

/// The plans auto_explain printed (as notices) for the statements run inside one call of
/// `sql` on `c`, after eight calls that are not looked at (PostgreSQL decides after five
/// whether a statement of a function keeps being planned for each call's values).
fn nested_plans(c: &mut postgres::Client, notices: &Mutex<Vec<String>>, sql: &str) -> String {
    for _ in 0..8 {
        c.batch_execute(sql).unwrap();
    }
    notices.lock().unwrap().clear();
    c.batch_execute(sql).unwrap();
    notices.lock().unwrap().join("\n")
}

/// With two queues of equal size and statistics that know it, a plan made once for any
/// queue (`plan_cache_mode = force_generic_plan` on postpone_claim_jobs, tried and not kept)
/// walks the index of every queue and filters on the queue: a claim of a queue whose jobs
/// are few would walk all the others' first. The walk must use the index of its queues.
#[test]
fn a_claim_from_named_queues_walks_the_index_of_its_queues() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut setup_client = db.client();
    setup_client
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args)
             SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 't', 'null'
               FROM generate_series(1, 20000) g",
        )
        .unwrap();
    setup_client
        .batch_execute("VACUUM ANALYZE postpone_jobs")
        .unwrap();
    let notices = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = notices.clone();
    let mut c = postgres::Config::from_str(&db.url())
        .unwrap()
        .notice_callback(move |n| sink.lock().unwrap().push(n.message().to_string()))
        .connect(postgres::NoTls)
        .unwrap();
    c.batch_execute(
        "LOAD 'auto_explain';
         SET auto_explain.log_min_duration = 0;
         SET auto_explain.log_nested_statements = on;
         SET auto_explain.log_level = notice;
         SET client_min_messages = notice",
    )
    .unwrap();

    for (what, sql, index) in [
        (
            "a claim from every queue",
            format!("SELECT id FROM postpone_claim_jobs({w}, 1, NULL, NULL)"),
            "postpone_jobs_due_idx",
        ),
        (
            "a claim from named queues",
            format!("SELECT id FROM postpone_claim_jobs({w}, 1, '{{a,b}}', NULL)"),
            "postpone_jobs_due_queue_idx",
        ),
    ] {
        let plans = nested_plans(&mut c, &notices, &sql);
        let walk = plans
            .split("Query Text:")
            .find(|p| p.contains("FOR UPDATE SKIP LOCKED"))
            .unwrap_or_else(|| panic!("{what}: no walk among the plans:\n{plans}"));
        assert!(
            walk.contains(&format!("Index Scan using {index} ")),
            "{what}: the walk does not use {index}:\n{walk}"
        );
        let cond = walk
            .lines()
            .find(|l| l.trim_start().starts_with("Index Cond:"))
            .unwrap_or_else(|| panic!("{what}: no index condition in the walk:\n{walk}"));
        assert!(
            cond.contains("priority =") && cond.contains("ROW(scheduled_at, id) >"),
            "{what}: the walk does not start at its first job: {cond}"
        );
        // The walked rows stay locked, so their addresses still hold them: the update
        // reads them there (schema version 16), not through the primary key again.
        let take = plans
            .split("Query Text:")
            .find(|p| p.contains("SET status = 'doing'"))
            .unwrap_or_else(|| panic!("{what}: no claiming update among the plans:\n{plans}"));
        assert!(
            take.contains("Tid Scan on postpone_jobs"),
            "{what}: the claiming update does not read its rows by address:\n{take}"
        );
    }
}

/// The index a named queue's walk reads must not rest on the planner's costs: 20,000 waiting
/// jobs of two alternating queues with arguments of about 150 bytes (the queue column's
/// correlation 0.5, 646 heap pages at fillfactor 100 and twice that at 50) made the claim of
/// named queues walk the index of every queue with a filter on the queue (schema 32, at
/// fillfactor 100), and a queue of a few jobs behind them would be found by stepping over
/// every other job. Counted in buffers of each index, over enough claims that PostgreSQL
/// plans the function's statements once for any queue.
#[test]
fn a_claim_from_named_queues_reads_only_their_index_however_large_the_table() {
    for fillfactor in [100, 50] {
        let (db, _app) = setup();
        let w = hand_worker(&db);
        let mut c = db.client();
        c.batch_execute(&format!(
            "ALTER TABLE postpone_jobs SET (fillfactor = {fillfactor});
             INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
             SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 't', to_jsonb(repeat('x', 150)),
                    now() - interval '1 hour' + g * interval '1 ms'
               FROM generate_series(1, 20000) g;
             INSERT INTO postpone_jobs (queue, task, args)
             SELECT 'c', 't', to_jsonb(repeat('x', 150)) FROM generate_series(1, 20)"
        ))
        .unwrap();
        c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
        let pages: i64 = c
            .query_one("SELECT pg_relation_size('postpone_jobs') / 8192", &[])
            .unwrap()
            .get(0);
        assert!(
            pages >= 600,
            "fillfactor {fillfactor}: the table holds {pages} pages"
        );
        flush_counters(&mut c);

        for (queues, n) in [("{a,b}", 1), ("{c}", 1), ("{a,b}", 10), ("{c,a}", 2)] {
            // The jobs the claims must take: the first of these queues in claim order.
            let mut wanted: Vec<i64> = c
                .query(
                    "SELECT id FROM postpone_jobs
                      WHERE queue = ANY($1::text::text[]) AND status = 'todo'
                      ORDER BY priority DESC, scheduled_at, id LIMIT $2",
                    &[&queues, &(8 * n as i64)],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            flush_counters(&mut c);
            let every_before = index_buffers(&db, "postpone_jobs_due_idx");
            let queue_before = index_buffers(&db, "postpone_jobs_due_queue_idx");
            let mut taken: Vec<i64> = Vec::new();
            for _ in 0..8 {
                let rows = c
                    .query(
                        "SELECT id FROM postpone_claim_jobs($1, $2, $3::text::text[], NULL)",
                        &[&w, &n, &queues],
                    )
                    .unwrap();
                assert_eq!(rows.len(), n as usize, "fillfactor {fillfactor}, {queues}");
                taken.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
            }
            flush_counters(&mut c);
            let every = index_buffers(&db, "postpone_jobs_due_idx") - every_before;
            let queue = index_buffers(&db, "postpone_jobs_due_queue_idx") - queue_before;
            assert_eq!(
                every, 0,
                "fillfactor {fillfactor}: claims of {queues} read {every} pages of the index of \
                 every queue (and {queue} of the index of the queues)"
            );
            assert!(
                queue > 0 && queue < 40 * 8,
                "fillfactor {fillfactor}: claims of {queues} read {queue} pages of the index of \
                 the queues"
            );
            taken.sort_unstable();
            wanted.sort_unstable();
            assert_eq!(taken, wanted, "fillfactor {fillfactor}: claims of {queues}");
        }
    }
}

/// A claim naming its queue still ends its walk at the queue's first job not due: 50,000 jobs
/// of the queue for tomorrow lie, in the index of the queues, between the claim's start and
/// its three due jobs of a lower priority.
#[test]
fn a_short_claim_from_a_named_queue_does_not_walk_its_jobs_scheduled_for_later() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
         SELECT 'a', 'later', 'null', now() + interval '1 day'
           FROM generate_series(1, 50000);
         INSERT INTO postpone_jobs (queue, task, args, priority)
         SELECT 'a', 'due', 'null', -1 FROM generate_series(1, 3)",
    )
    .unwrap();
    c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    let size: i64 = c
        .query_one(
            "SELECT pg_relation_size('postpone_jobs_due_queue_idx') / 8192",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(size > 100, "the index holds {size} pages");
    flush_counters(&mut c);
    let before = index_buffers(&db, "postpone_jobs_due_queue_idx");
    let rows = c
        .query(
            "SELECT task FROM postpone_claim($1, 10, '{a}', NULL)",
            &[&w],
        )
        .unwrap();
    flush_counters(&mut c);
    let read = index_buffers(&db, "postpone_jobs_due_queue_idx") - before;
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.get::<_, String>(0) == "due"));
    assert!(
        read < 40,
        "the claim read {read} pages of a {size}-page index: it walked the jobs for tomorrow"
    );
    // The time of the next job due: one probe of the same index for each priority.
    let before = index_buffers(&db, "postpone_jobs_due_queue_idx");
    let next: Option<std::time::SystemTime> = c
        .query_one("SELECT postpone_next_due('{a}')", &[])
        .unwrap()
        .get(0);
    flush_counters(&mut c);
    let read = index_buffers(&db, "postpone_jobs_due_queue_idx") - before;
    assert!(next.is_some());
    assert!(
        read < 40,
        "postpone_next_due read {read} pages of a {size}-page index"
    );
}

/// Statistics that know one queue only (taken before a second queue had jobs; this project's
/// test server runs no autovacuum) price the index of every queue, filtered on the queue, as
/// cheap as the queue's own for a plan made for any queue: a claim of the new queue would
/// then find its first job by stepping over all of the other queue's jobs, at every claim.
#[test]
fn a_claim_of_a_queue_the_statistics_do_not_know_reads_only_its_index() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'the-emails-of-the-customers-of-the-shop', 't', 'null'
           FROM generate_series(1, 20000)",
    )
    .unwrap();
    c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'new', 't', 'null' FROM generate_series(1, 20)",
    )
    .unwrap();
    flush_counters(&mut c);
    let every_before = index_buffers(&db, "postpone_jobs_due_idx");
    let queue_before = index_buffers(&db, "postpone_jobs_due_queue_idx");
    for _ in 0..10 {
        let rows = c
            .query(
                "SELECT queue FROM postpone_claim_jobs($1, 1, '{new}', NULL)",
                &[&w],
            )
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].get::<_, String>(0), "new");
    }
    flush_counters(&mut c);
    let every = index_buffers(&db, "postpone_jobs_due_idx") - every_before;
    let queue = index_buffers(&db, "postpone_jobs_due_queue_idx") - queue_before;
    assert_eq!(
        every, 0,
        "ten claims of a new queue read {every} pages of the index of every queue \
         (and {queue} of the index of the queues)"
    );
    assert!(
        queue < 100,
        "ten claims read {queue} pages of the index of the queues"
    );
}

/// Rows this transaction holds locked but left waiting: the claim walked and locked them, then
/// kept others (each such lock is a WAL record).
fn locked_left_waiting(c: &mut postgres::Transaction<'_>) -> i64 {
    c.query_one(
        "SELECT count(*) FROM postpone_jobs
          WHERE status = 'todo' AND xmax::text::bigint = txid_current() % 4294967296",
        &[],
    )
    .unwrap()
    .get(0)
}

#[test]
fn a_claim_from_several_queues_locks_about_as_many_rows_as_it_claims() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut c = db.client();
    // Three queues with due jobs interleaved in time, priorities mixed, every fourth job with
    // a deadline (walked apart, through an index of its own); queue a also holds a run of
    // older jobs, and some of every queue's jobs are for later.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, priority, scheduled_at, expires_at)
         SELECT (ARRAY['a', 'b', 'c'])[1 + g % 3], 'j', 'null', g % 5 / 3,
                now() - (30000 - g) * interval '10 ms'
                      + CASE WHEN g % 7 = 0 THEN interval '1 day' ELSE interval '0' END,
                CASE WHEN g % 4 = 0 THEN now() + interval '2 days' END
           FROM generate_series(1, 30000) AS g;
         INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
         SELECT 'a', 'old', 'null', now() - interval '1 day' + g * interval '1 ms'
           FROM generate_series(1, 2000) AS g;
         ANALYZE postpone_jobs",
    )
    .unwrap();
    // Three queues named, one, and every queue (the jobs with a deadline are a second walk
    // in each).
    for queues in [Some(vec!["a", "b", "c"]), Some(vec!["b"]), None] {
        for n in [1, 10, 500, 1000, 3000] {
            let mut t = c.transaction().unwrap();
            let mut want: Vec<i64> = t
                .query(
                    "SELECT id FROM postpone_jobs
                      WHERE status = 'todo' AND ($1::text[] IS NULL OR queue = ANY($1))
                        AND scheduled_at <= now()
                      ORDER BY priority DESC, scheduled_at, id LIMIT $2",
                    &[&queues, &i64::from(n)],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let mut got: Vec<i64> = t
                .query(
                    "SELECT id FROM postpone_claim_batch($1, $2, $3, NULL)",
                    &[&w, &n, &queues],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(
                got, want,
                "a claim of {n} from {queues:?}: the best {n} due jobs"
            );
            let left = locked_left_waiting(&mut t);
            // Each walk's last turn (at most 32 jobs, or an eighth of its share) may lock
            // rows past the bound, and the bound is computed again only each time the walks
            // hold an eighth more than the claim. (Walks of the whole claim each, merged
            // after, left 2n from three queues, n from one with jobs with a deadline beside
            // the others.)
            assert!(
                left <= i64::from(n) / 4 + 64,
                "a claim of {n} jobs from {queues:?} locked {left} more rows it left waiting"
            );
            t.rollback().unwrap();
            // With a byte budget of half of them (the arguments `null`, 4 bytes each): the
            // first half in claim order.
            let half = (n / 2).max(1);
            let mut t = c.transaction().unwrap();
            let mut got: Vec<i64> = t
                .query(
                    "SELECT id FROM postpone_claim_batch($1, $2, $3, NULL, $2, $4, false)",
                    &[&w, &n, &queues, &(4 * i64::from(half))],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            got.sort_unstable();
            let mut first: Vec<i64> = t
                .query(
                    "SELECT id FROM postpone_jobs
                      WHERE status IN ('todo', 'doing') AND ($1::text[] IS NULL OR queue = ANY($1))
                        AND scheduled_at <= now()
                      ORDER BY priority DESC, scheduled_at, id LIMIT $2",
                    &[&queues, &i64::from(half)],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            first.sort_unstable();
            assert_eq!(
                got, first,
                "a claim of {n} from {queues:?} with room for {half}"
            );
            t.rollback().unwrap();
        }
    }
}

/// A claim that names many queues (a worker of many queues, or a worker of every queue
/// while one is paused, which then names the queues with due jobs) merges a walk of each,
/// and another of each queue's jobs with a deadline. It takes the best jobs in claim order,
/// locks at most about a quarter more rows than it claims, and runs a few
/// statements, not a few per walk (schema version 51; with a statement or more per walk, a
/// claim of 100 jobs naming 1,000 queues took a second).
#[test]
fn a_claim_naming_many_queues_runs_a_few_statements_for_all_their_walks() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut c = db.client();
    // 600 queues; queue q0 holds a third of the jobs; five priorities; some jobs for later,
    // every fourth with a deadline, some of those past it.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, priority, scheduled_at, expires_at)
         SELECT 'q' || CASE WHEN g % 3 = 0 THEN 0 ELSE g % 600 END, 'j', 'null',
                g * 7919 % 5 - 2,
                now() - (g % 97) * interval '1 s'
                      + CASE WHEN g % 11 = 0 THEN interval '1 hour' ELSE interval '0' END,
                CASE WHEN g % 29 = 0 THEN now() - interval '1 s'
                     WHEN g % 4 = 0 THEN now() + interval '1 hour' END
           FROM generate_series(1, 6000) AS g;
         INSERT INTO postpone_paused_queues (queue) VALUES ('paused');
         INSERT INTO postpone_jobs (queue, task, args) SELECT 'paused', 'j', 'null'
           FROM generate_series(1, 100)",
    )
    .unwrap();
    c.batch_execute("VACUUM ANALYZE postpone_jobs").unwrap();
    let named: Vec<String> = (0..600).map(|q| format!("q{q}")).collect();
    let notices = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = notices.clone();
    let mut e = postgres::Config::from_str(&db.url())
        .unwrap()
        .notice_callback(move |n| sink.lock().unwrap().push(n.message().to_string()))
        .connect(postgres::NoTls)
        .unwrap();
    e.batch_execute(
        "LOAD 'auto_explain';
         SET auto_explain.log_min_duration = 0;
         SET auto_explain.log_nested_statements = on;
         SET auto_explain.log_level = notice;
         SET client_min_messages = notice",
    )
    .unwrap();
    for queues in [Some(named.clone()), None] {
        for n in [1, 10, 500, 3000] {
            let mut t = e.transaction().unwrap();
            let mut want: Vec<i64> = t
                .query(
                    "SELECT id FROM postpone_jobs
                      WHERE status = 'todo' AND queue <> 'paused'
                        AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
                      ORDER BY priority DESC, scheduled_at, id LIMIT $1",
                    &[&i64::from(n)],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            notices.lock().unwrap().clear();
            let mut got: Vec<i64> = t
                .query(
                    "SELECT id FROM postpone_claim_batch($1, $2, $3, NULL)",
                    &[&w, &n, &queues],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let statements = notices
                .lock()
                .unwrap()
                .iter()
                .filter(|m| m.contains("Query Text:"))
                .count();
            let whose = if queues.is_some() {
                "naming 600 queues"
            } else {
                "of every queue, one paused"
            };
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want, "a claim of {n} {whose}: the best {n} due jobs");
            // 1,200 walks: a statement each would be 1,200 at least (24 to 109 here, 24 of
            // them the claim's own before any walk).
            assert!(
                statements <= 200,
                "a claim of {n} {whose} ran {statements} statements"
            );
            // A round gives turns to many walks at once, before they know how the claim's
            // jobs are shared among them, so some of what it locks is pushed past the bound
            // by a later round (474 rows past a claim of 3,000 here, 120 past one of 500).
            // A walk of the whole claim each, merged after, locked up to a claim's rows per
            // walk.
            let left = locked_left_waiting(&mut t);
            assert!(
                left <= i64::from(n) / 4 + 64,
                "a claim of {n} {whose} locked {left} more rows it left waiting"
            );
            t.rollback().unwrap();
        }
    }
}

/// A queue named twice (or more) in a claim is walked once: two walks of it would take the
/// same jobs (a transaction's own row locks do not make its walks skip them) and the merge
/// would count them twice, claiming fewer than it could (schema version 51; at schema 50 a
/// claim of 12 naming a queue ten times and two others took 5 of the 15 waiting).
#[test]
fn a_queue_named_twice_in_a_claim_is_walked_once() {
    let (db, _app) = setup();
    let w = hand_worker(&db);
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, priority, expires_at)
         SELECT 'q' || (g % 80), 'j', 'null', g % 3,
                CASE WHEN g % 4 = 0 THEN now() + interval '1 hour' END
           FROM generate_series(1, 400) AS g",
    )
    .unwrap();
    // Few walks (turns), and many (rounds): q1 named ten times beside q2 and q3, then
    // beside every other queue.
    let few: Vec<String> = std::iter::repeat_n("q1".to_owned(), 10)
        .chain(["q2".to_owned(), "q3".to_owned()])
        .collect();
    let many: Vec<String> = std::iter::repeat_n("q1".to_owned(), 10)
        .chain((2..80).map(|q| format!("q{q}")))
        .collect();
    for (queues, n, waiting) in [(few, 12i32, 15i64), (many, 350, 400)] {
        let mut t = c.transaction().unwrap();
        let got: Vec<i64> = t
            .query(
                "SELECT id FROM postpone_claim_batch($1, $2, $3, NULL)",
                &[&w, &n, &queues],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let distinct: std::collections::BTreeSet<i64> = got.iter().copied().collect();
        assert_eq!(distinct.len(), got.len(), "a job claimed twice");
        assert_eq!(
            got.len() as i64,
            i64::from(n).min(waiting),
            "a claim of {n} naming q1 ten times ({} names)",
            queues.len()
        );
        t.rollback().unwrap();
    }
}
