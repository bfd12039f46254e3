//! Large values are compressed with lz4 where the server has it (schema version 34): a job's
//! arguments and output, written by the library, by `postpone_defer` and by hand, come back
//! as they were written, and values stored with pglz before the migration stay readable.

use crate::worker_util;

use std::time::Duration;

use postpone::{Job, Tasks};
use serde_json::{json, Value};
use worker_util::*;

/// Whether the server can compress with lz4 (PostgreSQL 14 or later, built with it).
fn server_has_lz4(c: &mut postgres::Client) -> bool {
    c.query_one(
        "SELECT current_setting('server_version_num')::integer >= 140000
            AND EXISTS (SELECT 1 FROM pg_settings
                         WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Records of the kind jobs carry: they compress well.
fn records(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"id": i, "name": format!("customer {i}"), "email": format!("user{i}@example.com")}))
            .collect(),
    )
}

fn compression(c: &mut postgres::Client, column: &str, id: i64) -> Option<String> {
    c.query_one(
        &format!("SELECT pg_column_compression({column}) FROM postpone_jobs WHERE id = $1"),
        &[&id],
    )
    .unwrap()
    .get(0)
}

#[test]
fn large_arguments_and_outputs_are_stored_with_lz4_and_read_back_whole() {
    let (db, app) = setup();
    let mut c = db.client();
    let lz4 = server_has_lz4(&mut c);
    let want = if lz4 { "lz4" } else { "pglz" };
    if !lz4 {
        eprintln!("this server has no lz4: the columns keep pglz, which the test checks instead");
    }

    // What the migration set: every column that carries what users write.
    let set: Vec<(String, String)> = c
        .query(
            "SELECT a.attrelid::regclass::text || '.' || a.attname,
                    CASE a.attcompression WHEN 'l' THEN 'lz4' WHEN 'p' THEN 'pglz'
                                          ELSE 'default (' || current_setting('default_toast_compression') || ')' END
               FROM pg_attribute a
              WHERE (a.attrelid = 'postpone_jobs'::regclass
                     AND a.attname IN ('args', 'output', 'progress', 'errors', 'meta'))
                 OR (a.attrelid = 'postpone_schedules'::regclass AND a.attname = 'args')
              ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(set.len(), 6);
    for (column, method) in &set {
        let expected = if lz4 { "lz4" } else { "default (pglz)" };
        assert_eq!(method, expected, "{column}");
    }

    // A value stored before the migration (pglz), as a job of an upgraded database holds it.
    c.batch_execute("ALTER TABLE postpone_jobs ALTER COLUMN args SET COMPRESSION pglz")
        .unwrap();
    let old_args = json!({"rows": records(2000), "from": "before"});
    let old = app.job("echo").defer(&old_args).unwrap();
    assert_eq!(compression(&mut c, "args", old.0).as_deref(), Some("pglz"));
    if lz4 {
        c.batch_execute("ALTER TABLE postpone_jobs ALTER COLUMN args SET COMPRESSION lz4")
            .unwrap();
    }

    let args = json!({"rows": records(2000)});
    let by_library = app.job("echo").defer(&args).unwrap();
    let by_sql: i64 = c
        .query_one("SELECT postpone_defer('echo', $1::jsonb)", &[&args])
        .unwrap()
        .get(0);
    let by_hand: i64 = c
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args) VALUES ('default', 'echo', $1)
             RETURNING id",
            &[&args],
        )
        .unwrap()
        .get(0);
    for id in [by_library.0, by_sql, by_hand] {
        assert_eq!(
            compression(&mut c, "args", id).as_deref(),
            Some(want),
            "job {id}"
        );
    }

    // The task sees its arguments whole and returns them as its output.
    let mut tasks = Tasks::new();
    tasks.register("echo", |job: &Job| {
        let a: Value = job.args()?;
        job.set_output(&a)?;
        Ok(())
    });
    let w = fast_worker(&app, tasks).spawn().unwrap();
    for id in [old.0, by_library.0, by_sql, by_hand] {
        wait_status(
            &db,
            postpone::JobId(id),
            "succeeded",
            Duration::from_secs(60),
        );
    }
    w.shutdown(Duration::from_secs(10));
    for (id, expected) in [
        (old.0, &old_args),
        (by_library.0, &args),
        (by_sql, &args),
        (by_hand, &args),
    ] {
        let output: Value = c
            .query_one("SELECT output FROM postpone_jobs WHERE id = $1", &[&id])
            .unwrap()
            .get(0);
        assert_eq!(&output, expected, "job {id}");
        assert_eq!(
            compression(&mut c, "output", id).as_deref(),
            Some(want),
            "job {id}"
        );
    }
}
