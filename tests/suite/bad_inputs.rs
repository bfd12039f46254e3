//! Bad user inputs through the public API and the dashboard: a value the database cannot
//! store or compute must be a clear error naming the input (never a panic, never a raw
//! database error, never a silent change of meaning).
//!
//! Each test here failed when it was written, because of the defect it names.

use crate::web_util;
use crate::worker_util;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postpone::{ErrorKind, JobFilter, JobSort, Retention, StatsBy};
use worker_util::*;

const YEAR: u64 = 31_556_952;

/// `Ok`, or an InvalidInput error: anything else (a raw database error) fails.
fn ok_or_invalid<T: std::fmt::Debug>(what: &str, r: postpone::Result<T>) {
    if let Err(e) = r {
        assert_eq!(
            e.kind(),
            ErrorKind::InvalidInput,
            "{what}: a raw error instead of a clear refusal: {e}"
        );
    }
}

#[test]
fn reschedule_to_a_time_far_in_the_future_does_not_panic() {
    let (_db, app) = setup();
    let id = app
        .job("ok")
        .schedule_in(Duration::from_secs(60))
        .defer(&1)
        .unwrap();
    let at = UNIX_EPOCH + Duration::from_secs(1_000_000 * YEAR);
    let r = no_panic("Admin::reschedule", || app.admin().reschedule(id, at));
    ok_or_invalid("reschedule", r);
}

#[test]
fn reschedule_to_the_year_580000_does_not_make_the_job_due_now() {
    let (_db, app) = setup();
    let id = app
        .job("ok")
        .schedule_in(Duration::from_secs(3600))
        .defer(&1)
        .unwrap();
    // 2000-01-01 + 1.84e13 s: its microseconds fit a u64 but not an i64.
    let at = UNIX_EPOCH + Duration::from_secs(946_684_800 + 18_400_000_000_000);
    let r = app.admin().reschedule(id, at);
    match r {
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
        Ok(()) => {
            let j = app.admin().job(id).unwrap();
            assert!(
                j.job.scheduled_at > SystemTime::now(),
                "asked for a time ~580,000 years ahead, stored {:?} (in the past: the job is due now)",
                j.job.scheduled_at
            );
        }
    }
}

#[test]
fn reschedule_before_4713_bc_is_a_clear_error() {
    let (_db, app) = setup();
    let id = app
        .job("ok")
        .schedule_in(Duration::from_secs(60))
        .defer(&1)
        .unwrap();
    let at = UNIX_EPOCH - Duration::from_secs(10_000 * YEAR);
    let r = no_panic("Admin::reschedule", || app.admin().reschedule(id, at));
    ok_or_invalid("reschedule to 8000 BC", r);
}

#[test]
fn defer_at_a_time_before_4713_bc_is_a_clear_error() {
    let (_db, app) = setup();
    let at = UNIX_EPOCH - Duration::from_secs(10_000 * YEAR);
    let r = no_panic("defer", || app.job("ok").schedule_at(at).defer(&1));
    ok_or_invalid("defer at 8000 BC", r);
}

#[test]
fn defer_at_a_time_300000_years_back_is_not_stored_in_the_future() {
    let (_db, app) = setup();
    let at = UNIX_EPOCH - Duration::from_secs(300_000 * YEAR);
    let r = no_panic("defer", || app.job("ok").schedule_at(at).defer(&1));
    match r {
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
        Ok(id) => {
            let j = app.admin().job(id).unwrap();
            assert!(
                j.job.scheduled_at <= SystemTime::now(),
                "asked for 300,000 years ago, stored {:?} (in the future)",
                j.job.scheduled_at
            );
        }
    }
}

#[test]
fn a_filter_time_far_in_the_future_does_not_panic() {
    let (_db, app) = setup();
    let at = UNIX_EPOCH + Duration::from_secs(1_000_000 * YEAR);
    let r = no_panic("Admin::jobs", || {
        app.admin().jobs(&JobFilter::new().created_before(at))
    });
    ok_or_invalid("created_before far future", r);
}

#[test]
fn a_filter_time_before_4713_bc_is_a_clear_error() {
    let (_db, app) = setup();
    let at = UNIX_EPOCH - Duration::from_secs(10_000 * YEAR);
    let r = app.admin().jobs(&JobFilter::new().created_after(at));
    ok_or_invalid("created_after 8000 BC", r);
}

/// Ages and windows (how far back from now) past what the database can subtract from its
/// clock were raw errors ("interval out of range", "timestamp out of range").
#[test]
fn ages_past_what_the_database_can_subtract_are_not_raw_errors() {
    let (_db, app) = setup();
    app.defer("ok", &1).unwrap();
    let admin = app.admin();
    let ten_thousand_years = Duration::from_secs(10_000 * YEAR);
    ok_or_invalid(
        "stats(Duration::MAX)",
        admin.stats(StatsBy::Queue, Some(Duration::MAX)),
    );
    ok_or_invalid(
        "prune_count(Duration::MAX)",
        admin.prune_count(&Retention::new(Duration::MAX)),
    );
    ok_or_invalid(
        "prune(Duration::MAX)",
        admin.prune(&Retention::new(Duration::MAX)),
    );
    ok_or_invalid(
        "prune(10,000 years)",
        admin.prune(&Retention::new(ten_thousand_years)),
    );
    ok_or_invalid("stalled_jobs(MAX)", admin.stalled_jobs(Duration::MAX));
    ok_or_invalid(
        "requeue_stalled(MAX)",
        admin.requeue_stalled(Duration::MAX, false),
    );
    ok_or_invalid(
        "forget_workers(MAX)",
        admin.forget_workers(Duration::MAX, false),
    );
}

/// Cursors whose key does not read as the sort's type were cast by the database, which
/// answered with a raw error ("invalid input syntax for type bigint", "out of range").
#[test]
fn cursors_with_malformed_keys_are_clear_errors() {
    let (_db, app) = setup();
    app.defer("ok", &1).unwrap();
    for (sort, cursor) in [
        (JobSort::Id, "id:desc:5:abc"),
        (JobSort::Priority, "priority:asc:5:99999999999"),
        (JobSort::Scheduled, "scheduled:asc:5:not a time"),
    ] {
        let desc = cursor.contains(":desc:");
        ok_or_invalid(
            cursor,
            app.admin()
                .jobs(&JobFilter::new().sort(sort, desc).after(cursor)),
        );
    }
}

/// Texts with a NUL character in a filter reached the database, which refused the statement
/// ("invalid byte sequence for encoding UTF8: 0x00").
#[test]
fn filter_texts_with_a_nul_are_clear_errors() {
    let (_db, app) = setup();
    for (what, f) in [
        ("queue", JobFilter::new().queue("a\0b")),
        ("error text", JobFilter::new().error_contains("x\0")),
        ("tag", JobFilter::new().tag("x\0")),
    ] {
        ok_or_invalid(what, app.admin().jobs(&f));
    }
}

#[test]
fn bulk_with_a_nul_in_the_filter_is_a_clear_error() {
    let (_db, app) = setup();
    ok_or_invalid(
        "bulk cancel task \\0",
        app.admin().bulk(
            postpone::BulkAction::Cancel,
            &JobFilter::new().task("t\0"),
            false,
        ),
    );
}

#[test]
fn the_jobs_page_with_a_nul_in_the_queue_filter_is_a_400() {
    let (_db, app) = setup();
    let dash = web_util::dashboard(&app);
    let r = web_util::get(dash.addr(), "/jobs?queue=a%00b");
    assert!(r.status < 500, "{} {}", r.status, r.body);
}

#[test]
fn the_jobs_page_with_a_nul_in_the_lock_filter_is_a_400() {
    let (_db, app) = setup();
    let dash = web_util::dashboard(&app);
    let r = web_util::get(dash.addr(), "/jobs?lock=%00");
    assert!(r.status < 500, "{} {}", r.status, r.body);
}

/// An output the task set with `set_output` is JSON that serde accepts but jsonb cannot
/// store (a number past numeric's range, a lone UTF-16 surrogate escape): `set_output`
/// said Ok, and the success was refused by the database when recorded, so the job ended
/// `failed` although its task succeeded (an operator's retry would run it twice).
#[test]
fn an_output_jsonb_cannot_store_is_refused_by_set_output_not_the_success() {
    use postpone::{Job, TaskError, Tasks};
    use serde_json::value::RawValue;
    use std::sync::{Arc, Mutex};
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let seen: Arc<Mutex<Vec<Option<ErrorKind>>>> = Arc::default();
    let s = seen.clone();
    tasks.register("out", move |job: &Job| -> Result<(), TaskError> {
        let text: String = job.args()?;
        let raw = RawValue::from_string(text).unwrap();
        let r = job.set_output(&*raw);
        s.lock().unwrap().push(r.err().map(|e| e.kind()));
        Ok(())
    });
    let texts = [
        "1e1000000".to_string(),
        "\"\\ud800\"".to_string(),
        "{\"k\\udc00\": 1}".to_string(),
        nested(20_000),
    ];
    let ids: Vec<_> = texts.iter().map(|t| app.defer("out", t).unwrap()).collect();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    for id in ids {
        let row = wait_status(&db, id, "succeeded", Duration::from_secs(10));
        assert!(row.errors.is_empty(), "{:?}", row.errors);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Some(ErrorKind::InvalidInput); 4],
        "set_output refuses what jsonb cannot store"
    );
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// `defer` refuses (InvalidInput) exactly the JSON jsonb refuses, as the server judges each
/// text: before, a raw value's number past numeric's range or lone surrogate escape was a
/// raw database error, and a text holding a backslash followed by `u0000` (stored fine,
/// as `"\\u0000"`) was refused as a NUL.
#[test]
fn defer_refuses_exactly_the_json_jsonb_refuses() {
    use serde_json::value::RawValue;
    let (db, app) = setup();
    let zeros = |n: usize| "0".repeat(n);
    let texts: Vec<String> = [
        "1e131071",
        "1e131072",
        "9e131071",
        "0.5e131072",
        "-1e-16383",
        "1e-16384",
        "0e-16384",
        "0e999999",
        "0E+1073741822",
        "0e1073741823",
        "1.5e-16382",
        "1.25e-16382",
        "123.456e-3",
        "[1, {\"a\": -0.0e-5}]",
        "\"\\u0000\"",
        "\"\\\\u0000\"",
        "\"a\\\\\\u0000\"",
        "\"\\ud83d\\ude00\"",
        "\"\\uD83D\\uDE00 and \\ud800\"",
        "\"\\ud800\"",
        "\"\\ud800x\\udc00\"",
        "\"\\ud800\\u0041\"",
        "\"\\udc00\"",
        "{\"k\\udfff\": 1}",
        "{\"k\": \"\\\"\\u00e9\\n\"}",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        format!("1.{}", zeros(16383)),
        format!("1.{}", zeros(16384)),
        format!("1{}", zeros(131071)),
        format!("1{}", zeros(131072)),
        format!("1{}e-5", zeros(131074)),
    ])
    .collect();
    let mut c = db.client();
    for text in texts {
        let server = c
            .query_one("SELECT $1::text::jsonb IS NOT NULL", &[&text])
            .is_ok();
        let raw = RawValue::from_string(text.clone()).unwrap();
        let r = app.defer("ok", &*raw);
        let short: String = text.chars().take(40).collect();
        match r {
            Ok(_) => assert!(server, "{short:?}: the server refuses it, defer took it"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{short:?}: {e}");
                // PostgreSQL 18 stores a zero with an exponent of INT_MAX / 2, which 15
                // refuses: the check keeps 15's bound there.
                let fifteens_bound = text == "0e1073741823";
                assert!(
                    !server || fifteens_bound,
                    "{short:?}: the server stores it, defer refused it: {e}"
                );
            }
        }
    }
}

/// JSON nested `depth` levels deep (`[[[...1...]]]`), built without recursion.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// A value that serializes as the given JSON text as it is (no parsing, so no depth limit).
struct Verbatim(String);
impl serde::Serialize for Verbatim {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_json::value::RawValue::from_string(self.0.clone())
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

/// Arrays and objects nested past what the server's jsonb parser can follow were a raw
/// "stack depth limit exceeded" error, with a hint to raise a server setting; `defer` and
/// `defer_batch` now refuse them (InvalidInput) past 1,000 levels, and store what is under.
#[test]
fn defer_refuses_json_nested_past_a_thousand_levels() {
    let (db, app) = setup();
    let id = app.defer("ok", &Verbatim(nested(1000))).unwrap();
    let mut c = db.client();
    let stored: String = c
        .query_one(
            "SELECT json_array_length(args)::text || ':' || length(args::text)::text
               FROM postpone_jobs WHERE id = $1",
            &[&id.0],
        )
        .unwrap()
        .get(0);
    assert_eq!(stored, "1:2001", "1,000 levels are stored as they are");
    // Brackets inside strings are text, not nesting.
    app.defer("ok", &"[{".repeat(5000)).unwrap();
    for depth in [1001, 20_000] {
        let e = app.defer("ok", &Verbatim(nested(depth))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "depth {depth}: {e}");
        assert!(
            e.to_string().contains("nested more than 1,000 levels"),
            "{e}"
        );
    }
    // A batch's job is refused as it is built, before anything is sent.
    let e = postpone::NewJob::new("ok", &Verbatim(nested(20_000))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let jobs: i64 = c
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(jobs, 2, "only the two jobs accepted above are stored");
}
