//! Key limits and rate limits per queue (schema version 8), claimed from SQL and read back:
//! simultaneous claims (8 connections behind a barrier) obey both limits; stats, `postpone
//! stats` and `--json` say why due jobs wait; bad input is a clear error from the admin API,
//! the tables and the command line; and figures of a claim's cost under each limit.
//! (tests/suite/rates.rs: the same promises with real workers.)

use crate::support;
use crate::worker_util;

use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postpone::ErrorKind;
use support::TestDb;
use worker_util::*;

fn cli(db: &TestDb, args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_postpone"))
        .env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(db.url())
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn sql_worker(c: &mut postgres::Client) -> i64 {
    c.query_one(
        "INSERT INTO postpone_workers (name, last_heartbeat) VALUES ('sql', now()) RETURNING id",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Many claims at the same instant (8 connections behind a barrier): together they never
/// start more than the rate limit allows in its window, nor more than the key limit per key.
#[test]
fn simultaneous_claims_obey_rate_and_key_limits() {
    let (db, app) = setup();
    let admin = app.admin();
    admin
        .set_rate_limit("rate", 5, Duration::from_secs(3600))
        .unwrap();
    admin.set_key_limit("keyed", "u", 2).unwrap();
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'rate', 'work', '0' FROM generate_series(1, 100);
         INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'keyed', 'work', jsonb_build_object('u', i % 3) FROM generate_series(1, 90) i;",
    )
    .unwrap();
    let worker = sql_worker(&mut c);
    const CLAIMERS: usize = 8;
    let mut clients: Vec<postgres::Client> = (0..CLAIMERS).map(|_| db.client()).collect();
    let claim_all = |clients: &mut Vec<postgres::Client>, queue: &str| -> usize {
        let barrier = Arc::new(std::sync::Barrier::new(CLAIMERS));
        thread::scope(|s| {
            let handles: Vec<_> = clients
                .iter_mut()
                .map(|cl| {
                    let barrier = barrier.clone();
                    s.spawn(move || {
                        barrier.wait();
                        cl.query(
                            "SELECT id FROM postpone_claim($1, 10, ARRAY[$2], NULL)",
                            &[&worker, &queue],
                        )
                        .unwrap()
                        .len()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        })
    };
    // The rate: 5 starts in the hour, whatever the rounds; the jobs finishing changes nothing.
    let mut started = 0;
    for _ in 0..5 {
        started += claim_all(&mut clients, "rate");
        c.execute(
            "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now()
              WHERE status = 'doing'",
            &[],
        )
        .unwrap();
    }
    assert_eq!(started, 5, "{started} starts under a limit of 5 per hour");
    let r = &admin.rate_limits().unwrap()[0];
    assert_eq!(r.recent_starts, 5);
    assert!(r.is_reached(), "{r:?}");
    let wait = r.next_start_in.unwrap();
    // A start's slot comes back between one period and 1.01 periods after it.
    assert!(
        wait > Duration::from_secs(3500) && wait <= Duration::from_secs(3637),
        "{wait:?}"
    );
    // A worker of every queue (NULL) obeys it too.
    let n = c
        .query(
            "SELECT id FROM postpone_claim($1, 10, ARRAY['rate'], NULL)",
            &[&worker],
        )
        .unwrap()
        .len();
    assert_eq!(n, 0);

    // The keys: 3 keys, 2 slots each.
    for round in 0..10 {
        let n = claim_all(&mut clients, "keyed");
        let most: i64 = c
            .query_one(
                "SELECT max(n) FROM (SELECT count(*) AS n FROM postpone_jobs
                  WHERE queue = 'keyed' AND status = 'doing' GROUP BY (args -> 'u')::text) s",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 6, "round {round}: {n} claimed");
        assert_eq!(most, 2, "round {round}");
        c.execute(
            "UPDATE postpone_jobs SET status = 'todo', worker_id = NULL WHERE status = 'doing'",
            &[],
        )
        .unwrap();
    }
    let n = c
        .query(
            "SELECT id FROM postpone_claim($1, 2147483647, NULL, NULL)",
            &[&worker],
        )
        .unwrap()
        .len();
    assert_eq!(n, 6, "a worker of every queue: 2 per key");
}

#[test]
fn bad_limits_are_clear_errors() {
    let (db, app) = setup();
    let admin = app.admin();
    let hour = Duration::from_secs(3600);
    for n in [0, -1, i64::from(i32::MAX) + 1] {
        let e = admin.set_rate_limit("q", n, hour).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{n}: {e}");
        assert!(e.to_string().contains("at least 1"), "{e}");
        let e = admin.set_key_limit("q", "user", n).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{n}: {e}");
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
    for per in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(200 * 365 * 86_400),
    ] {
        let e = admin.set_rate_limit("q", 1, per).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{per:?}: {e}");
        assert!(e.to_string().contains("at least 1 ms"), "{e}");
    }
    let long = "x".repeat(300);
    for q in ["", "a\0b", long.as_str()] {
        for e in [
            admin.set_rate_limit(q, 1, hour).unwrap_err(),
            admin.clear_rate_limit(q).unwrap_err(),
            admin.set_key_limit(q, "user", 1).unwrap_err(),
            admin.set_key_limit("q", q, 1).unwrap_err(),
            admin.clear_key_limit(q).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{q:?}: {e}");
        }
    }
    assert!(admin.rate_limits().unwrap().is_empty(), "nothing stored");
    assert!(admin.key_limits().unwrap().is_empty(), "nothing stored");
    // A queue without jobs can be limited; setting again replaces and returns the old one.
    assert_eq!(admin.set_rate_limit("empty", 3, hour).unwrap(), None);
    assert_eq!(admin.set_rate_limit("empty", 4, hour).unwrap(), Some(3));
    assert_eq!(admin.set_key_limit("empty", "a", 2).unwrap(), None);
    assert_eq!(
        admin.set_key_limit("empty", "b", 3).unwrap(),
        Some((2, "a".to_owned()))
    );
    // The tables refuse what the API refuses, for SQL written by hand.
    let mut c = db.client();
    for (sql, constraint) in [
        (
            "INSERT INTO postpone_rate_limits (queue, max_starts, period) VALUES ('z', 0, '1s')",
            "postpone_rate_limits_positive",
        ),
        (
            "INSERT INTO postpone_rate_limits (queue, max_starts, period) VALUES ('z', 1, '0s')",
            "postpone_rate_limits_period",
        ),
        (
            "INSERT INTO postpone_key_limits (queue, max_per_key, key_arg) VALUES ('z', 0, 'u')",
            "postpone_key_limits_positive",
        ),
        (
            "INSERT INTO postpone_key_limits (queue, max_per_key, key_arg) VALUES ('z', 1, '')",
            "postpone_key_limits_arg",
        ),
    ] {
        let e = c.execute(sql, &[]).unwrap_err();
        assert_eq!(
            e.as_db_error().and_then(|d| d.constraint()),
            Some(constraint),
            "{e:?}"
        );
    }

    // The command line: a note for a queue without jobs, none for one with jobs.
    let (code, out, err) = cli(&db, &["rate-limit", "cli", "10", "1m"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("at most 10 starts per 1m00s"), "{out}");
    assert!(out.contains("note: queue cli has never been seen"), "{out}");
    app.job("work").queue("cli").defer(&0).unwrap();
    let (code, out, _) = cli(&db, &["key-limit", "cli", "2", "--by", "user"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("at most 2 running jobs per value of argument user"),
        "{out}"
    );
    assert!(!out.contains("note:"), "{out}");
    let (code, out, _) = cli(&db, &["--json", "rate-limit"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["queue"], "cli");
    assert_eq!(v[0]["max_starts"], 10);
    assert_eq!(v[0]["period_secs"], 60.0);
    let (code, out, _) = cli(&db, &["--json", "key-limit"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["key_arg"], "user");
    for bad in [
        &["rate-limit", "cli", "0", "1s"][..],
        &["rate-limit", "cli", "-2", "1s"],
        &["rate-limit", "cli", "2", "0s"],
        &["key-limit", "cli", "0", "--by", "u"],
        &["key-limit", "cli", "1", "--by", ""],
    ] {
        let (code, out, err) = cli(&db, bad);
        assert_eq!(code, Some(2), "{bad:?}: {out}{err}");
        assert!(
            err.contains("at least 1") || err.contains("empty"),
            "{bad:?}: {err}"
        );
    }
    let (code, out, _) = cli(&db, &["rate-limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("rate limit cleared"), "{out}");
    let (code, out, _) = cli(&db, &["rate-limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("had no rate limit"), "{out}");
    let (code, out, _) = cli(&db, &["key-limit", "cli", "--clear"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("key limit cleared"), "{out}");
}

/// `Admin::stats`, `postpone stats` and its `--json` say why due jobs are not running: a
/// key limit reached, a rate limit reached (with the other reasons of version 7).
#[test]
fn stats_say_why_due_jobs_wait() {
    let (db, app) = setup();
    let admin = app.admin();
    let mut c = db.client();
    let worker = sql_worker(&mut c);
    admin.set_key_limit("keyed", "user", 1).unwrap();
    admin
        .set_rate_limit("rated", 2, Duration::from_secs(600))
        .unwrap();
    admin.set_queue_limit("lim", Some(1)).unwrap();
    for _ in 0..3 {
        app.job("t")
            .queue("keyed")
            .defer(&serde_json::json!({"user": 1}))
            .unwrap();
        app.job("t").queue("rated").defer(&()).unwrap();
        app.job("t").queue("lim").defer(&()).unwrap();
    }
    let claimed = c
        .query(
            "SELECT queue FROM postpone_claim($1, 10, NULL, NULL)",
            &[&worker],
        )
        .unwrap();
    // keyed: 1 (one key, one slot), rated: 2 (its starts), lim: 1.
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    let stats = admin.counts().unwrap();
    let get = |q: &str| stats.iter().find(|s| s.queue == q).unwrap().clone();
    let keyed = get("keyed");
    assert_eq!((keyed.todo, keyed.doing, keyed.key_held), (2, 1, 2));
    assert_eq!(keyed.max_per_key, Some(1));
    assert_eq!(keyed.waiting_reasons(), ["key limit reached"]);
    let rated = get("rated");
    assert_eq!((rated.todo, rated.doing, rated.max_starts), (1, 2, Some(2)));
    assert!(rated.rate_limited, "{rated:?}");
    assert!(rated.next_start_in.unwrap() > Duration::from_secs(500));
    assert_eq!(rated.waiting_reasons(), ["rate limited"]);
    assert_eq!(get("lim").waiting_reasons(), ["limit reached"]);

    let (code, out, err) = cli(&db, &["stats"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("-- key limit reached: keyed (2 due jobs wait"),
        "{out}"
    );
    assert!(
        out.contains("-- rate limited: rated (at most 2 starts per 10m00s; next start in"),
        "{out}"
    );
    assert!(out.contains("-- limit reached: lim"), "{out}");
    let (code, out, _) = cli(&db, &["--json", "stats"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = |q: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|r| r["queue"] == q)
            .unwrap()
            .clone()
    };
    assert_eq!(row("keyed")["key_held"], 2);
    assert_eq!(row("keyed")["max_per_key"], 1);
    assert_eq!(row("rated")["rate_limited"], true);
    assert_eq!(row("rated")["max_starts"], 2);
    assert_eq!(row("rated")["rate_period_secs"], 600.0);
    assert!(row("rated")["next_start_in_secs"].as_f64().unwrap() > 500.0);
}

/// Figures (measured on a loaded machine; printed, not asserted): 300 claims of one job each
/// from a queue of 3,000 due jobs, on one connection: without limits, with a concurrency
/// limit, a key limit (10 keys) and rate limits whose window holds few or many logged starts.
#[test]
fn cost_of_a_claim_with_each_limit() {
    let (db, app) = setup();
    let admin = app.admin();
    let mut c = db.client();
    let worker = sql_worker(&mut c);
    let n = 300;
    let measure = |what: &str, queue: &str, c: &mut postgres::Client| {
        c.execute(
            "INSERT INTO postpone_jobs (queue, task, args)
             SELECT $1, 'work', jsonb_build_object('u', i % 10) FROM generate_series(1, 3000) i",
            &[&queue],
        )
        .unwrap();
        c.batch_execute("ANALYZE postpone_jobs").unwrap();
        let t = Instant::now();
        for _ in 0..n {
            let got = c
                .query(
                    "SELECT id FROM postpone_claim($1, 1, ARRAY[$2], NULL)",
                    &[&worker, &queue],
                )
                .unwrap();
            assert_eq!(got.len(), 1, "{what}");
            // The job finishes at once, so that the limits never hold the next claim back.
            c.execute(
                "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now()
                  WHERE status = 'doing'",
                &[],
            )
            .unwrap();
        }
        report_figure(&format!("{n} claims+finishes, {what}"), t.elapsed());
    };
    measure("no limit", "plain", &mut c);
    admin.set_queue_limit("conc", Some(5)).unwrap();
    measure("concurrency limit", "conc", &mut c);
    admin.set_key_limit("keyed", "u", 1).unwrap();
    measure("key limit", "keyed", &mut c);
    admin
        .set_rate_limit("rate", 1_000_000, Duration::from_secs(3600))
        .unwrap();
    measure("rate limit, window of up to 300 starts", "rate", &mut c);
    // 20,000 starts already in the window (in the buckets a claim would have written).
    c.execute(
        "INSERT INTO postpone_rate_starts (queue, until, starts)
         SELECT 'rate2', now() - i * interval '36 s', 200 FROM generate_series(0, 99) i",
        &[],
    )
    .unwrap();
    admin
        .set_rate_limit("rate2", 1_000_000, Duration::from_secs(3600))
        .unwrap();
    measure("rate limit, window of 20,000 starts", "rate2", &mut c);
    // The rate limit's wait, as a worker could ask for it.
    let wait: Option<f64> = c
        .query_one("SELECT postpone_rate_wait(ARRAY['rate2'])", &[])
        .unwrap()
        .get(0);
    assert_eq!(wait, Some(0.0));
    let wait: Option<f64> = c
        .query_one("SELECT postpone_rate_wait(ARRAY['plain'])", &[])
        .unwrap()
        .get(0);
    assert_eq!(wait, None, "no rate limit");
}
