//! The limit on a job's arguments (`postpone_settings.max_args_bytes`, schema version 27):
//! refused with a clear error from every way a job enters (Rust's defers, `postpone_defer`,
//! a plain INSERT), nothing stored; configurable; the default finite.

use crate::support;

use postpone::{App, ErrorKind, NewJob, TaskArgs};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::*;

fn setup() -> (TestDb, App) {
    TestDb::with_app()
}

fn jobs(c: &mut postgres::Client) -> i64 {
    c.query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0)
}

/// Arguments of exactly `n` bytes of JSON text: a string of `n - 2` characters.
fn text_of(n: usize) -> String {
    "x".repeat(n - 2)
}

#[derive(Serialize, Deserialize)]
struct Big {
    blob: String,
}

impl TaskArgs for Big {
    const TASK: &'static str = "big";
}

/// The error says what was refused, its size, the limit, and how to raise it.
fn says_too_large(e: &postpone::Error, size: usize, limit: u64) {
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let text = e.to_string();
    assert!(text.contains(&format!("{size} bytes")), "{text}");
    assert!(text.contains(&format!("the {limit} allowed")), "{text}");
    assert!(text.contains("max_args_bytes"), "{text}");
    assert_eq!(e.sqlstate(), Some("54000"), "{text}");
}

#[test]
fn arguments_over_the_limit_are_refused_by_every_rust_defer() {
    let (db, app) = setup();
    let mut c = db.client();
    let admin = app.admin();
    assert_eq!(
        admin.max_args_bytes().unwrap(),
        postpone::DEFAULT_MAX_ARGS_BYTES
    );
    assert_eq!(postpone::DEFAULT_MAX_ARGS_BYTES, 16 << 20);
    assert_eq!(admin.set_max_args_bytes(1000).unwrap(), 16 << 20);
    assert_eq!(admin.max_args_bytes().unwrap(), 1000);

    // At the limit: stored. One byte over: refused, by each entry point.
    app.defer("t", &text_of(1000)).unwrap();
    assert_eq!(jobs(&mut c), 1);
    let over = text_of(1001);
    let e = app.defer("t", &over).unwrap_err();
    says_too_large(&e, 1001, 1000);
    let e = app
        .job("t")
        .queue("q")
        .schedule_in(std::time::Duration::from_secs(60))
        .defer(&over)
        .unwrap_err();
    says_too_large(&e, 1001, 1000);
    // A batch is refused whole.
    let e = app
        .defer_batch(&[
            NewJob::new("t", &"small").unwrap(),
            NewJob::new("t", &over).unwrap(),
        ])
        .unwrap_err();
    says_too_large(&e, 1001, 1000);
    // In the caller's transaction: the transaction learns of it.
    let mut tx = c.transaction().unwrap();
    let e = app.job("t").defer_in(&mut tx, &over).unwrap_err();
    says_too_large(&e, 1001, 1000);
    tx.rollback().unwrap();
    // Typed.
    let big = Big {
        blob: "b".repeat(2000),
    };
    let e = app.enqueue(&big).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // With dependencies (another statement).
    let first = app.defer("t", &"first").unwrap();
    let e = app.job("t").after(&[first]).defer(&over).unwrap_err();
    says_too_large(&e, 1001, 1000);
    assert_eq!(
        jobs(&mut c),
        2,
        "only the jobs within the limit were stored"
    );

    // Raised: the same arguments go in.
    assert_eq!(admin.set_max_args_bytes(4096).unwrap(), 1000);
    app.defer("t", &over).unwrap();
    app.enqueue(&big).unwrap();
    assert_eq!(jobs(&mut c), 4);

    // Zero and past what PostgreSQL can hold are refused.
    for bad in [0, postpone::MAX_ARGS_BYTES_CEILING + 1] {
        let e = admin.set_max_args_bytes(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    assert_eq!(admin.max_args_bytes().unwrap(), 4096);
}

#[test]
fn arguments_over_the_limit_are_refused_from_sql_and_by_a_plain_insert() {
    let (db, app) = setup();
    let mut c = db.client();
    c.batch_execute("UPDATE postpone_settings SET max_args_bytes = 1000")
        .unwrap();
    assert_eq!(app.admin().max_args_bytes().unwrap(), 1000);
    let small: i64 = c
        .query_one("SELECT postpone_defer('t', '{\"a\": 1}')", &[])
        .unwrap()
        .get(0);
    assert!(small > 0);

    let e = c
        .query_one(
            "SELECT postpone_defer('t', to_jsonb(repeat('x', 1999)), queue => 'q')",
            &[],
        )
        .unwrap_err();
    let db_err = e.as_db_error().expect("a server error");
    assert_eq!(db_err.code().code(), "54000");
    assert_eq!(db_err.constraint(), Some("postpone_max_args_bytes"));
    assert!(
        db_err
            .message()
            .contains("2001 bytes of JSON, more than the 1000 allowed"),
        "{}",
        db_err.message()
    );
    assert!(
        db_err
            .hint()
            .is_some_and(|h| h.contains("UPDATE postpone_settings SET max_args_bytes")),
        "{db_err:?}"
    );

    // Any INSERT, whatever writes it: many rows in one statement, or a compressible value
    // (stored in a few KB). What counts is the text stored, which is what a worker receives:
    // a short number that jsonb would print in 2,000 digits is 9 bytes (schema version 46).
    c.batch_execute("INSERT INTO postpone_jobs (queue, task, args) VALUES ('q', 't', '[1e-2000]')")
        .unwrap();
    for sql in [
        "INSERT INTO postpone_jobs (queue, task, args) VALUES ('q', 't', to_jsonb(repeat('y', 5000)))",
        "INSERT INTO postpone_jobs (queue, task, args)
         SELECT 'q', 't', CASE WHEN g = 500 THEN to_jsonb(repeat('z', 999)) ELSE '1' END
           FROM generate_series(1, 1000) g",
    ] {
        let e = c.batch_execute(sql).unwrap_err();
        let db_err = e.as_db_error().expect("a server error");
        assert_eq!(db_err.code().code(), "54000", "{sql}: {db_err:?}");
    }
    assert_eq!(jobs(&mut c), 2);
    // The stored limit binds the next statement of every session.
    c.batch_execute("UPDATE postpone_settings SET max_args_bytes = 1073741823")
        .unwrap();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args) VALUES ('q', 't', to_jsonb(repeat('y', 5000)))",
    )
    .unwrap();
    app.defer("t", &json!({"blob": "y".repeat(5000)})).unwrap();
    assert_eq!(jobs(&mut c), 4);
    // A limit out of range is refused by the table itself.
    assert!(c
        .batch_execute("UPDATE postpone_settings SET max_args_bytes = 0")
        .is_err());
}

/// The size the claim's byte budget and the limit read (`args_bytes`, schema version 32) is
/// the arguments' JSON text as PostgreSQL writes it, for rows written by the library, by
/// `postpone_defer`, by hand, and after their arguments are changed by hand.
#[test]
fn the_stored_size_of_arguments_follows_every_write() {
    let (db, app) = setup();
    let mut c = db.client();
    let deferred = app.job("t").defer(&json!({"a": text_of(1000)})).unwrap();
    let by_sql: i64 = c
        .query_one(
            "SELECT postpone_defer('t', '[1, 2.50, \"\\u0001\"]'::jsonb)",
            &[],
        )
        .unwrap()
        .get(0);
    let by_hand: i64 = c
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args) VALUES ('default', 't', '{\"b\": 1e-20}')
             RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let check = |c: &mut postgres::Client, id: i64| {
        let row = c
            .query_one(
                "SELECT args_bytes, octet_length(args::text) FROM postpone_jobs WHERE id = $1",
                &[&id],
            )
            .unwrap();
        let (stored, measured): (i32, i32) = (row.get(0), row.get(1));
        assert_eq!(stored, measured, "job {id}");
        stored
    };
    assert!(check(&mut c, deferred.0) > 1000);
    check(&mut c, by_sql);
    check(&mut c, by_hand);
    // Changed by hand: measured again. An update that leaves args alone keeps it.
    c.execute(
        "UPDATE postpone_jobs SET args = jsonb_build_object('big', repeat('x', 100000)) WHERE id = $1",
        &[&by_hand],
    )
    .unwrap();
    assert!(check(&mut c, by_hand) > 100_000);
    c.execute(
        "UPDATE postpone_jobs SET priority = 5 WHERE id = $1",
        &[&by_hand],
    )
    .unwrap();
    assert!(check(&mut c, by_hand) > 100_000);
    // Nobody can write it.
    let e = c
        .execute(
            "UPDATE postpone_jobs SET args_bytes = 1 WHERE id = $1",
            &[&by_hand],
        )
        .unwrap_err();
    let db_error = e.as_db_error().expect("a refusal by the server");
    assert!(
        db_error.detail().unwrap_or("").contains("generated column"),
        "{db_error:?}"
    );
}
