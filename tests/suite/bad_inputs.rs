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
