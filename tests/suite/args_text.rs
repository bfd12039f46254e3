//! Arguments stored as the JSON text they were deferred as (`postpone_jobs.args` is `json`
//! since schema version 46): a task reads that text; the claim entry points of earlier
//! builds still return `jsonb` with the same values; text PostgreSQL cannot read back (a
//! `\u0000` escape, a lone surrogate) is refused from a raw INSERT or UPDATE as from the
//! library; and arguments jsonb cannot hold that json stores (a number past numeric's range)
//! fail neither a claim of a queue with a key limit nor a listing filtered on arguments.

use crate::support;

use postpone::{App, BulkAction, Deferred, JobFilter, Unique};
use serde::Serialize;
use serde_json::json;
use support::*;

fn setup() -> (TestDb, App) {
    TestDb::with_app()
}

/// Fields in an order that is not jsonb's (it sorts keys by length, then bytes).
#[derive(Serialize)]
struct Order {
    zebra: u32,
    a: &'static str,
}

#[test]
fn arguments_are_stored_as_deferred_and_earlier_claims_read_them_as_jsonb() {
    let (db, app) = setup();
    let mut c = db.client();
    let typed = app.defer("t", &Order { zebra: 1, a: "x" }).unwrap();
    let by_sql: i64 = c
        .query_one(
            "SELECT postpone_defer('t', '{\"zebra\": 2, \"a\": [1, 2.50]}'::jsonb)",
            &[],
        )
        .unwrap()
        .get(0);
    let text = |c: &mut postgres::Client, id: i64| -> String {
        c.query_one("SELECT args::text FROM postpone_jobs WHERE id = $1", &[&id])
            .unwrap()
            .get(0)
    };
    // A job that waits for others (deferred through `postpone_defer_jobs`, schema 47), and
    // one deferred from SQL after it.
    let after = app
        .job("t")
        .after(&[typed])
        .defer(&Order { zebra: 3, a: "z" })
        .unwrap();
    let after_by_sql: i64 = c
        .query_one(
            "SELECT postpone_defer('t', '{\"zebra\": 4, \"a\": 1.0}'::jsonb, after => ARRAY[$1::bigint])",
            &[&typed.0],
        )
        .unwrap()
        .get(0);
    // The library's serialization, as it was written; a jsonb value as jsonb prints it.
    assert_eq!(text(&mut c, typed.0), r#"{"zebra":1,"a":"x"}"#);
    assert_eq!(text(&mut c, after.0), r#"{"zebra":3,"a":"z"}"#);
    assert_eq!(text(&mut c, by_sql), r#"{"a": [1, 2.50], "zebra": 2}"#);
    assert_eq!(text(&mut c, after_by_sql), r#"{"a": 1.0, "zebra": 4}"#);
    let ty: String = c
        .query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
              WHERE attrelid = 'postpone_jobs'::regclass AND attname = 'args'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ty, "json");

    // A unique job keeps its text too; its key reads the value, so the same object with its
    // keys in another order is the same job (as before schema 46, whose keys stay valid).
    let unique = app
        .job("u")
        .unique(Unique::by_args())
        .defer_unique(&Order { zebra: 3, a: "y" })
        .unwrap();
    let Deferred::Inserted(unique) = unique else {
        panic!("{unique:?}")
    };
    assert_eq!(text(&mut c, unique.0), r#"{"zebra":3,"a":"y"}"#);
    let again = app
        .job("u")
        .unique(Unique::by_args())
        .defer_unique(&json!({"a": "y", "zebra": 3}))
        .unwrap();
    assert_eq!(again, Deferred::Duplicate(unique));
    c.execute("DELETE FROM postpone_jobs WHERE id = $1", &[&unique.0])
        .unwrap();

    // A build of schema 45 claims through the seven-argument postpone_claim_jobs: the same
    // jobs, the arguments as jsonb with the same values.
    c.batch_execute(
        "INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES (901, 'v45', now())",
    )
    .unwrap();
    let rows = c
        .query(
            "SELECT id, pg_typeof(args)::text, args::text
               FROM postpone_claim_jobs(901, 10, NULL, NULL, 10, NULL, true) ORDER BY id",
            &[],
        )
        .unwrap();
    let got: Vec<(i64, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        vec![
            (typed.0, "jsonb".into(), r#"{"a": "x", "zebra": 1}"#.into()),
            (
                by_sql,
                "jsonb".into(),
                r#"{"a": [1, 2.50], "zebra": 2}"#.into()
            ),
        ]
    );
    // The four-argument one and postpone_take_at too; the worker's own claim gives json.
    let again = app.defer("t", &json!([3])).unwrap();
    let four: String = c
        .query_one(
            "SELECT pg_typeof(args)::text || ' ' || args::text
               FROM postpone_claim_jobs(901, 10, NULL, NULL)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(four, "jsonb [3]");
    let last = app.defer("t", &json!({"k": true})).unwrap();
    let batch: String = c
        .query_one(
            "SELECT pg_typeof(args)::text || ' ' || args::text
               FROM postpone_claim_batch(901, 10, NULL, NULL, 10, NULL, true)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(batch, r#"json {"k":true}"#);
    let claimed: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'doing' AND id = ANY($1)",
            &[&vec![typed.0, by_sql, again.0, last.0]],
        )
        .unwrap()
        .get(0);
    assert_eq!(claimed, 4);
}

#[test]
fn arguments_jsonb_cannot_read_fail_no_claim_and_no_filter() {
    let (db, app) = setup();
    let mut c = db.client();
    app.admin().set_key_limit("k", "u", 1).unwrap();
    // Escapes `->` could not read back are refused, in the key field and beside it; so is
    // the whole statement.
    for bad in [r#"{"u": "\u0000"}"#, r#"{"u": 1, "x": "\ud800"}"#] {
        let e = c
            .execute(
                "INSERT INTO postpone_jobs (queue, task, args)
                 SELECT 'k', 't', a::json FROM unnest(ARRAY['{}', $1]) a",
                &[&bad],
            )
            .unwrap_err();
        let db = e.as_db_error().expect("a server error");
        assert!(
            ["22P02", "22P05"].contains(&db.code().code())
                && db.where_().is_some_and(|w| w.contains("JSON data")),
            "{bad}: {db:?}"
        );
    }
    // An update that sets such arguments is refused too.
    let ok_id: i64 = c
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args) VALUES ('other', 't', '[1]') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let e = c
        .execute(
            r#"UPDATE postpone_jobs SET args = '{"u": "\u0000"}' WHERE id = $1"#,
            &[&ok_id],
        )
        .unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("22P05"),
        "{e:?}"
    );
    c.execute(
        r#"UPDATE postpone_jobs SET args = '{"u": "\u00e9"}' WHERE id = $1"#,
        &[&ok_id],
    )
    .unwrap();
    c.execute("DELETE FROM postpone_jobs WHERE id = $1", &[&ok_id])
        .unwrap();
    // Other escapes pass (read as jsonb once, at the insert), and a number jsonb refuses.
    c.batch_execute(
        r#"INSERT INTO postpone_jobs (queue, task, args) VALUES
             ('k', 't', '{"u": "\u00e9\n"}'),
             ('k', 't', '{"u": 1, "x": "\ud83d\ude00"}'),
             ('k', 't', '{"u": 1e1000000}'),
             ('k', 't', '{"u": 1}'),
             ('k', 't', '{"u": 2}');
           INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES (902, 'w', now());"#,
    )
    .unwrap();
    // One job of each key value, by its text: "\u00e9\n", 1 (twice), 1e1000000, 2.
    let keys: Vec<String> = c
        .query(
            "SELECT coalesce((args -> 'u')::text, '-')
               FROM postpone_claim_batch(902, 10, ARRAY['k'], NULL, 10, NULL, true) ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, vec![r#""\u00e9\n""#, "1", "1e1000000", "2"]);
    // The second job of key 1 waits for the first.
    let again: i64 = c
        .query_one(
            "SELECT count(*)
               FROM postpone_claim_batch(902, 10, ARRAY['k'], NULL, 10, NULL, true)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(again, 0);

    // A listing filtered on arguments passes over the rows jsonb cannot read.
    let found: Vec<String> = app
        .admin()
        .jobs(&JobFilter::new().queue("k").args_contain(json!({"u": 2})))
        .unwrap()
        .iter()
        .map(|j| j.args.to_string())
        .collect();
    assert_eq!(found, vec![r#"{"u": 2}"#]);
    let all = app.admin().jobs(&JobFilter::new().queue("k")).unwrap();
    assert_eq!(all.len(), 5);
    // So do the bulk operations, planned and done: two jobs of key 1, one of them waiting.
    let by_u1 = JobFilter::new().queue("k").args_contain(json!({"u": 1}));
    let plan = app
        .admin()
        .bulk(BulkAction::Priority(5), &by_u1, true)
        .unwrap();
    assert_eq!((plan.matched, plan.changed), (2, 1));
    let done = app
        .admin()
        .bulk(BulkAction::Priority(5), &by_u1, false)
        .unwrap();
    assert_eq!((done.matched, done.changed), (2, 1));
    let raised: i64 = c
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE queue = 'k' AND priority = 5 AND status = 'todo'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(raised, 1);
}
