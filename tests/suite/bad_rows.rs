//! One bad row: a row with odd but storable contents (written by SQL by hand, bypassing the
//! library's checks) must not make a statement that reads many rows fail for all of them,
//! again and again, nor make the library panic.
//!
//! Each test here failed when it was written, because of the defect it names.

use crate::support;
use crate::web_util;
use crate::worker_util;

use std::sync::atomic::Ordering;
use std::time::Duration;

use postpone::{Dashboard, JobFilter, JobId, JobSort, Tasks};
use worker_util::*;

/// Inserts a job row by hand, `extra` being `column = value` assignments applied after.
fn raw_job(db: &support::TestDb, set: &str) -> i64 {
    let mut c = db.client();
    let id: i64 = c
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args) VALUES ('default', 'ok', 'null')
             RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    c.execute(
        &format!("UPDATE postpone_jobs SET {set} WHERE id = $1"),
        &[&id],
    )
    .unwrap();
    id
}

/// The dashboard's overview reads the last hour's throughput with
/// `date_trunc('minute', now()) - date_trunc('minute', finished_at)` for every job that
/// finished "after an hour ago": a job finished at 'infinity' makes that an error ("cannot
/// subtract infinite timestamps"), and the overview fails at every load.
#[test]
fn the_dashboard_overview_survives_a_job_finished_at_infinity() {
    let (db, app) = setup();
    app.defer("ok", &1).unwrap();
    raw_job(&db, "status = 'succeeded', finished_at = 'infinity'");
    let dash = web_util::dashboard(&app);
    let r = web_util::get(dash.addr(), "/");
    assert_eq!(r.status, 200, "{}", r.body);
}

/// The same statement with a job finished in a far (finite) future: the minute index
/// `(59 - ...)::int` overflows ("integer out of range").
#[test]
fn the_dashboard_overview_survives_a_job_finished_in_the_year_9999() {
    let (db, app) = setup();
    app.defer("ok", &1).unwrap();
    raw_job(
        &db,
        "status = 'succeeded', finished_at = '9999-01-01 00:00:00+00'",
    );
    let dash = web_util::dashboard(&app);
    let r = web_util::get(dash.addr(), "/");
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Pages all jobs of `f` (at most 50 pages), returning the ids in order.
fn page_all(app: &postpone::App, f: JobFilter) -> Vec<i64> {
    let admin = app.admin();
    let mut f = f;
    let mut ids = Vec::new();
    for _ in 0..50 {
        let page = admin.job_page(&f).unwrap();
        ids.extend(page.jobs.iter().map(|j| j.id.0));
        match page.next_cursor {
            Some(c) => f = f.after(c),
            None => return ids,
        }
    }
    panic!("still paging after 50 pages: {ids:?}");
}

/// The keyset cursor of a listing sorted by scheduled time prints the time with
/// `to_char(... 'YYYY-MM-DD...')`, which drops the era: a job scheduled in 4713 BC gives a
/// cursor for 4713 AD, and the next page starts after every ordinary job. Ascending, they
/// are all skipped.
#[test]
fn a_listing_by_scheduled_time_pages_past_a_job_scheduled_before_christ() {
    let (db, app) = setup();
    let good: Vec<i64> = (0..3).map(|i| app.defer("ok", &i).unwrap().0).collect();
    let bc = raw_job(&db, "scheduled_at = '4713-11-24 00:00:00+00 BC'");
    let ids = page_all(
        &app,
        JobFilter::new()
            .queue("default")
            .sort(JobSort::Scheduled, false)
            .limit(1),
    );
    let mut want = vec![bc];
    want.extend(&good);
    assert_eq!(ids, want, "paging by scheduled time, ascending");
}

/// Descending, two such jobs make the pages loop for ever (the cursor of the first goes
/// back to the ordinary jobs): `postpone jobs --all --sort scheduled --desc` never ends.
#[test]
fn a_descending_listing_by_scheduled_time_ends_with_jobs_scheduled_before_christ() {
    let (db, app) = setup();
    let good = app.defer("ok", &1).unwrap().0;
    let bc1 = raw_job(&db, "scheduled_at = '4000-01-01 00:00:00+00 BC'");
    let bc2 = raw_job(&db, "scheduled_at = '4713-11-24 00:00:00+00 BC'");
    let ids = page_all(
        &app,
        JobFilter::new()
            .queue("default")
            .sort(JobSort::Scheduled, true)
            .limit(1),
    );
    assert_eq!(
        ids,
        vec![good, bc1, bc2],
        "paging by scheduled time, descending"
    );
}

/// A job's tags are read as `Option<Vec<String>>`: an array holding a NULL element makes
/// `row.get` panic in `Admin::job` (and so in the dashboard's job page and `postpone job`).
#[test]
fn a_job_whose_tags_hold_a_null_is_shown_not_a_panic() {
    let (db, app) = setup();
    let id = raw_job(&db, "tags = ARRAY['a', NULL]::text[]");
    let tags = no_panic("Admin::job", || app.admin().job(JobId(id)).map(|d| d.tags));
    assert_eq!(tags.expect("Admin::job"), vec!["a".to_owned()]);
}

/// The workers listing reads `queues` as `Option<Vec<String>>`: one worker row whose queues
/// hold a NULL makes every `Admin::workers` call panic, and the dashboard's overview with it.
#[test]
fn a_worker_row_whose_queues_hold_a_null_does_not_break_the_workers_listing() {
    let (db, app) = setup();
    db.client()
        .execute(
            "INSERT INTO postpone_workers (name, queues) VALUES ('odd', ARRAY['a', NULL]::text[])",
            &[],
        )
        .unwrap();
    let workers = no_panic("Admin::workers", || app.admin().workers()).expect("Admin::workers");
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].queues, Some(vec!["a".to_owned()]));
}

/// A rate limit whose period was written by hand past what the admin API allows (100
/// years): `now() - period` before 4713 BC was "timestamp out of range" in the claim, which
/// then failed for every queue of the worker, at every try. Schema 17 refuses such a period,
/// and cuts one stored before it to the API's bound.
#[test]
fn a_rate_limit_of_ten_thousand_years_does_not_stop_the_claims() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let mut c = db.client();
    let refused = c
        .execute(
            "INSERT INTO postpone_rate_limits (queue, max_starts, period)
             VALUES ('slow', 1000, interval '10000 years')",
            &[],
        )
        .expect_err("the table refuses a period past 100 years");
    assert_eq!(
        refused.as_db_error().and_then(|e| e.constraint()),
        Some("postpone_rate_limits_period"),
        "{refused:?}"
    );
    // A row stored before schema 17, which had no upper bound.
    c.batch_execute(
        "ALTER TABLE postpone_rate_limits DROP CONSTRAINT postpone_rate_limits_period,
             ADD CONSTRAINT postpone_rate_limits_period CHECK (period > interval '0');
         DELETE FROM postpone_migrations WHERE version = 17;
         INSERT INTO postpone_rate_limits (queue, max_starts, period)
              VALUES ('slow', 1000, interval '10000 years');",
    )
    .unwrap();
    assert_eq!(app.migrate().unwrap(), vec![17]);
    let days: f64 = c
        .query_one(
            "SELECT extract(epoch FROM period)::float8 / 86400 FROM postpone_rate_limits",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(days, 36525.0);
    app.job("ok").queue("slow").defer(&0).unwrap();
    let id = app.defer("ok", &1).unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    wait_status(&db, id, "succeeded", Duration::from_secs(10));
    assert!(runs.load(Ordering::SeqCst) >= 1);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// The panic of `Admin::workers` (above) happens on a request thread of the dashboard,
/// which does not catch it: each load of the overview kills one request thread, and once
/// they are gone the dashboard answers no page at all.
#[test]
fn a_worker_row_whose_queues_hold_a_null_does_not_take_the_dashboard_down() {
    let (db, app) = setup();
    db.client()
        .execute(
            "INSERT INTO postpone_workers (name, queues) VALUES ('odd', ARRAY['a', NULL]::text[])",
            &[],
        )
        .unwrap();
    let dash = Dashboard::new(&app)
        .threads(2)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .expect("dashboard");
    let addr = dash.addr();
    for _ in 0..2 {
        // Each of these may get no answer at all (its thread panicked).
        let _ = std::panic::catch_unwind(|| web_util::get(addr, "/"));
    }
    let jobs = std::panic::catch_unwind(|| web_util::get(addr, "/jobs"));
    match jobs {
        Ok(r) => assert_eq!(r.status, 200, "the jobs page: {}", r.body),
        Err(_) => panic!("the jobs page got no answer after two loads of the overview"),
    }
}

/// A periodic task's next instant is computed after the latest instant recorded for it; a
/// record at 'infinity' (or any far future) makes the schedule stop for ever: nothing is
/// deferred again, with nothing in the log but the debug line "next never".
#[test]
fn a_periodic_record_at_infinity_does_not_stop_its_schedule() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    tasks.periodic("ok", "* * * * * *");
    db.client()
        .execute(
            "INSERT INTO postpone_periodic (task, instant) VALUES ('ok', 'infinity')",
            &[],
        )
        .unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let ok = support::wait_until(Duration::from_secs(5), || runs.load(Ordering::SeqCst) > 0);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert!(ok, "no periodic job ran within 5 s");
}

/// A job inserted by SQL for PostgreSQL's last years (past 9.2e18 µs since 1970, what a
/// bigint holds): the insert trigger's wake-up converted its time to µs, and the insert
/// failed with "bigint out of range". Schema 17 caps that time as the claim does.
#[test]
fn a_job_inserted_for_the_end_of_time_is_stored_and_does_not_stop_the_claims() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let far: i64 = db
        .client()
        .query_one(
            "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
             VALUES ('default', 'ok', 'null', '294276-12-31 23:59:59+00') RETURNING id",
            &[],
        )
        .expect("the insert is stored")
        .get(0);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let id = app.defer("ok", &1).unwrap();
    wait_status(&db, id, "succeeded", Duration::from_secs(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let row = job_row(&mut db.client(), JobId(far)).unwrap();
    assert_eq!(row.status, "todo");
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// A running job without a start time whose worker row is gone (both written by hand): the
/// rescue requeued such jobs only once `started_at` was older than `stalled_after`, which a
/// NULL never is, so the job stayed `doing` for ever.
#[test]
fn a_running_job_without_a_start_time_whose_worker_is_gone_is_rescued() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let id = raw_job(
        &db,
        "status = 'doing', worker_id = 999, attempts = 1, started_at = NULL",
    );
    let w = fast_worker(&app, tasks).spawn().unwrap();
    wait_status(&db, JobId(id), "succeeded", Duration::from_secs(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// The other side of the periodic fix above: a record only a little ahead of this worker's
/// clock (another worker's clock runs a few seconds fast) still counts as done, so the
/// worker does not catch up ten minutes of instants that were never due for it.
#[test]
fn a_periodic_record_a_little_ahead_still_counts_as_deferred() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    tasks.periodic("ok", "* * * * * *");
    let ahead: std::time::SystemTime = db
        .client()
        .query_one(
            "INSERT INTO postpone_periodic (task, instant)
             VALUES ('ok', date_trunc('second', now()) + interval '3 seconds') RETURNING instant",
            &[],
        )
        .unwrap()
        .get(0);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "no instant before the record is deferred"
    );
    let ran = support::wait_until(Duration::from_secs(8), || runs.load(Ordering::SeqCst) > 0);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert!(ran, "no periodic job ran after the record's instant");
    let before: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM postpone_periodic WHERE task = 'ok' AND instant < $1",
            &[&ahead],
        )
        .unwrap()
        .get(0);
    assert_eq!(before, 0);
}

/// A worker row whose heartbeat was written by hand at the end of PostgreSQL's time
/// (294276 AD): its lease end, that heartbeat plus at least 30 s, is "timestamp out of
/// range", which failed the rescue's one DELETE of dead workers for every worker row: a
/// dead worker's running job was never requeued, and the workers listing failed too.
#[test]
fn a_worker_row_whose_heartbeat_is_at_the_end_of_time_does_not_stop_the_rescue_of_others() {
    let (db, app) = setup();
    let mut c = db.client();
    c.execute(
        "INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES
             (901, 'ghost', now() - interval '1 hour'),
             (902, 'end-of-time', '294276-12-31 23:59:59+00')",
        &[],
    )
    .unwrap();
    let id = raw_job(
        &db,
        "status = 'doing', worker_id = 901, attempts = 1, started_at = now()",
    );
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    wait_status(&db, JobId(id), "succeeded", Duration::from_secs(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let workers = no_panic("Admin::workers", || app.admin().workers()).expect("Admin::workers");
    assert!(
        workers.iter().any(|w| w.name == "end-of-time"),
        "{workers:?}"
    );
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// Rows of the throughput statistics at the top of their counters (written by hand, as by
/// a restore or a tool that sums): every statement that finished a job of that queue added
/// to them from its statement trigger, which failed with "integer out of range", and the
/// worker failed each job whose task had succeeded ("could not be recorded ... failed
/// instead"), for the rest of the hour.
#[test]
fn statistics_rows_at_the_top_of_their_counters_do_not_fail_the_successes() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let mut cols = String::new();
    let mut vals = String::new();
    for b in 0..24 {
        cols.push_str(&format!(", w{b}"));
        vals.push_str(", 2147483647");
    }
    db.client()
        .batch_execute(&format!(
            "INSERT INTO postpone_stats (span, at, queue, outcome, shard, jobs{cols})
             SELECT sp, date_trunc(sp, now() + d * interval '1 minute'), 'default', 'succeeded',
                    sh, 9223372036854775807{vals}
               FROM unnest(ARRAY['hour', 'minute']) AS sp,
                    generate_series(0, 3) AS sh,
                    generate_series(0, 2) AS d
             ON CONFLICT DO NOTHING"
        ))
        .unwrap();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let id = app.defer("ok", &1).unwrap();
    let row = wait_status(&db, id, "succeeded", Duration::from_secs(10));
    assert!(row.errors.is_empty(), "{:?}", row.errors);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// A job deferred by SQL with a deadline in PostgreSQL's last second (294276 AD): the check
/// of a late start added a second to the deadline, "timestamp out of range", which failed
/// the statement recording the job's outcome (and the batch of starts written with it):
/// the job ended failed although its task succeeded.
#[test]
fn a_deadline_in_the_last_second_of_time_does_not_fail_the_success() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let id: i64 = db
        .client()
        .query_one(
            "SELECT postpone_defer('ok', expires_at => '294276-12-31 23:59:59.5+00')",
            &[],
        )
        .unwrap()
        .get(0);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let row = wait_status(&db, JobId(id), "succeeded", Duration::from_secs(10));
    assert!(row.errors.is_empty(), "{:?}", row.errors);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// A bulk cancel skips the rows other sessions hold locked, but cancelling a job that others
/// wait for settles its dependents in the same statement, and one of those held locked by a
/// long transaction (an operator's open session) made the statement wait for it: the whole
/// call failed at the App's io_timeout, and the other jobs of its batch were not cancelled.
#[test]
fn a_bulk_cancel_is_not_failed_by_a_locked_dependent_of_one_job() {
    let (db, app) = setup();
    let later = Duration::from_secs(3600);
    let head = app.job("a").schedule_in(later).defer(&0).unwrap();
    let others: Vec<JobId> = (1..=3)
        .map(|i| app.job("a").schedule_in(later).defer(&i).unwrap())
        .collect();
    let dependent = app.job("b").after(&[head]).defer(&0).unwrap();
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM postpone_jobs WHERE id = $1 FOR UPDATE",
        &[&dependent.get()],
    )
    .unwrap();
    let started = std::time::Instant::now();
    let r = app.admin().bulk(
        postpone::BulkAction::Cancel,
        &JobFilter::new().task("a"),
        false,
    );
    let took = started.elapsed();
    let mut c = db.client();
    let cancelled: Vec<bool> = others
        .iter()
        .map(|id| job_row(&mut c, *id).unwrap().status == "cancelled")
        .collect();
    let head_status = job_row(&mut c, head).unwrap().status;
    tx.rollback().unwrap();
    let report = r.expect("the bulk cancel");
    assert_eq!(cancelled, vec![true; 3], "{report}");
    assert_eq!(
        head_status, "todo",
        "the job whose dependent is held is skipped"
    );
    assert_eq!((report.changed, report.skipped), (3, 1), "{report}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// A task asks for a retry while another session (an operator's open transaction) holds its
/// job's row locked. Final outcomes wait at most 200 ms for a lock and are set aside, but
/// the requeue had no lock timeout: the worker's outcome recording waited until the
/// io_timeout severed its connection, again and again, and the heartbeat, which shares that
/// connection, waited behind it (the lease ran out).
#[test]
fn a_retry_whose_row_is_locked_holds_up_neither_the_heartbeat_nor_other_outcomes() {
    use postpone::{Job, TaskError};
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let (locked_tx, locked_rx) = crossbeam_channel::bounded::<()>(1);
    let url = db.url();
    tasks
        .register("again", move |job: &Job| -> Result<(), TaskError> {
            if job.attempts() == 1 {
                // Another session takes the row while the task runs, and keeps it 6 s.
                let id = job.id().get();
                let url = url.clone();
                let locked_tx = locked_tx.clone();
                std::thread::spawn(move || {
                    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                    let mut tx = c.transaction().unwrap();
                    tx.execute(
                        "SELECT 1 FROM postpone_jobs WHERE id = $1 FOR UPDATE",
                        &[&id],
                    )
                    .unwrap();
                    locked_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_secs(6));
                    tx.rollback().unwrap();
                });
                let _ = locked_rx.recv_timeout(Duration::from_secs(5));
                return Err(TaskError::retry("once more"));
            }
            Ok(())
        })
        .retry(postpone::RetryStrategy::fixed(Duration::ZERO, 3));
    let w = fast_worker(&app, tasks).concurrency(2).spawn().unwrap();
    let again = app.defer("again", &0).unwrap();
    let mut c = db.client();
    let start = std::time::Instant::now();
    let mut worst = 0.0f64;
    let mut slowest = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(5) {
        let age: f64 = c
            .query_one(
                "SELECT coalesce(max(extract(epoch FROM now() - last_heartbeat))::float8, 0)
                   FROM postpone_workers",
                &[],
            )
            .unwrap()
            .get(0);
        worst = worst.max(age);
        let t = std::time::Instant::now();
        let id = app.defer("ok", &0).unwrap();
        while job_row(&mut c, id).unwrap().status != "succeeded"
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Once the lock is gone, the retry is recorded and the job runs again.
    let row = wait_status(&db, again, "succeeded", Duration::from_secs(15));
    assert_eq!(row.attempts, 2);
    assert!(runs.load(Ordering::SeqCst) > 0);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert!(
        worst < 1.0 && slowest < Duration::from_secs(1),
        "the heartbeat was {worst:.2} s old at worst; a job took {slowest:?} to be recorded"
    );
}

/// The beat's sweep of expired jobs cancels a job others wait for, which settles its
/// dependents in the same statement: one of those held locked by a long transaction made the
/// sweep wait until the io_timeout severed the worker's connection, again at every sweep
/// (the held one first each time). No other job expired, and the heartbeat and the outcomes,
/// which share that connection, waited behind it.
#[test]
fn a_locked_dependent_of_an_expired_job_does_not_stop_the_sweep_nor_the_worker() {
    let (db, app) = setup();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let head = app
        .job("a")
        .queue("slow")
        .expires_in(Duration::from_millis(500))
        .defer(&0)
        .unwrap();
    let dependent = app.job("b").queue("slow").after(&[head]).defer(&0).unwrap();
    let other = app
        .job("a")
        .queue("slow")
        .expires_in(Duration::from_millis(1500))
        .defer(&1)
        .unwrap();
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM postpone_jobs WHERE id = $1 FOR UPDATE",
        &[&dependent.get()],
    )
    .unwrap();
    let w = fast_worker(&app, tasks).queues(["main"]).spawn().unwrap();
    let mut c = db.client();
    let start = std::time::Instant::now();
    let mut worst = 0.0f64;
    let mut slowest = Duration::ZERO;
    let mut other_expired = None;
    while start.elapsed() < Duration::from_secs(8) {
        let age: f64 = c
            .query_one(
                "SELECT coalesce(max(extract(epoch FROM now() - last_heartbeat))::float8, 0)
                   FROM postpone_workers",
                &[],
            )
            .unwrap()
            .get(0);
        worst = worst.max(age);
        let t = std::time::Instant::now();
        let id = app.job("ok").queue("main").defer(&0).unwrap();
        while job_row(&mut c, id).unwrap().status != "succeeded"
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        slowest = slowest.max(t.elapsed());
        if other_expired.is_none() && job_row(&mut c, other).unwrap().status == "cancelled" {
            other_expired = Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tx.rollback().unwrap();
    // Once the lock is gone, a later sweep ends the held-up job, and its dependent with it.
    wait_status(&db, head, "cancelled", Duration::from_secs(5));
    wait_status(&db, dependent, "cancelled", Duration::from_secs(5));
    assert!(runs.load(Ordering::SeqCst) > 0);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
    assert!(
        other_expired.is_some_and(|d| d < Duration::from_secs(4)),
        "the other expired job was cancelled after {other_expired:?} (heartbeat {worst:.2} s old at worst, a job recorded after {slowest:?} at worst)"
    );
    assert!(worst < 1.0, "the heartbeat was {worst:.2} s old at worst");
    assert!(
        slowest < Duration::from_secs(1),
        "a job took {slowest:?} to be recorded"
    );
}

/// The rescue requeues the running jobs of every dead worker in one statement: one of those
/// jobs held locked by another session (an operator's open transaction) failed it for all,
/// at every heartbeat for as long as the lock was held (before schema 42 the statement
/// waited for the lock until the io_timeout), so no other dead worker's job was requeued.
#[test]
fn a_locked_job_of_a_dead_worker_does_not_stop_the_rescue_of_others() {
    let (db, app) = setup();
    let mut c = db.client();
    c.execute(
        "INSERT INTO postpone_workers (id, name, last_heartbeat) VALUES
             (901, 'ghost-1', now() - interval '1 hour'),
             (902, 'ghost-2', now() - interval '1 hour')",
        &[],
    )
    .unwrap();
    let held = raw_job(
        &db,
        "status = 'doing', worker_id = 901, attempts = 1, started_at = now() - interval '1 hour'",
    );
    let free = raw_job(
        &db,
        "status = 'doing', worker_id = 902, attempts = 1, started_at = now() - interval '1 hour'",
    );
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM postpone_jobs WHERE id = $1 FOR UPDATE",
        &[&held],
    )
    .unwrap();
    let mut tasks = Tasks::new();
    let runs = ok_task(&mut tasks);
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let ok = support::wait_until(Duration::from_secs(6), || {
        job_row(&mut c, JobId(free)).unwrap().status == "succeeded"
    });
    let free_row = job_row(&mut c, JobId(free)).unwrap();
    tx.rollback().unwrap();
    // Once the lock is gone, the held job is rescued too.
    wait_status(&db, JobId(held), "succeeded", Duration::from_secs(10));
    assert!(
        ok,
        "the free job was not rescued while the other was held: {free_row:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(w.shutdown(Duration::from_secs(5)).is_clean());
}

/// Calls of the admin API on one job whose row, or a row their change reaches (a dependent
/// a cancel settles), another session holds locked: each must give up within seconds with
/// a clear error and change nothing, and succeed once the lock is gone. Before, `cancel`,
/// `cancel_and_delete` and `abort` waited for the lock until the App's `io_timeout`
/// severed their connection, `retry` failed with the raw lock error of its 200 ms wait,
/// and `reschedule` and `set_priority` (which skip locked rows) said the job was in a
/// state it was not.
#[test]
fn admin_calls_on_one_job_held_locked_give_up_with_a_clear_error() {
    use postpone::ErrorKind;
    let (db, app) = setup();
    let later = Duration::from_secs(3600);
    let admin = app.admin();
    let waiting = app.job("a").schedule_in(later).defer(&0).unwrap();
    let failed = app.job("a").schedule_in(later).defer(&1).unwrap();
    let head = app.job("a").schedule_in(later).defer(&2).unwrap();
    let dependent = app.job("b").after(&[head]).defer(&0).unwrap();
    let mut c = db.client();
    c.execute(
        "UPDATE postpone_jobs SET status = 'failed', finished_at = now() WHERE id = $1",
        &[&failed.get()],
    )
    .unwrap();
    let mut holder = db.client();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM postpone_jobs WHERE id = ANY($1) FOR UPDATE",
        &[&vec![waiting.get(), failed.get(), dependent.get()]],
    )
    .unwrap();
    type Call<'a> = Box<dyn Fn() -> postpone::Result<()> + 'a>;
    let calls: Vec<(&str, Call)> = vec![
        ("cancel", Box::new(|| admin.cancel(waiting))),
        (
            "cancel_and_delete",
            Box::new(|| admin.cancel_and_delete(waiting)),
        ),
        ("abort", Box::new(|| admin.abort(waiting).map(drop))),
        ("retry", Box::new(|| admin.retry(failed))),
        (
            "reschedule",
            Box::new(|| admin.reschedule(waiting, std::time::SystemTime::now())),
        ),
        ("set_priority", Box::new(|| admin.set_priority(waiting, 5))),
        (
            "cancel of a job whose dependent is held",
            Box::new(|| admin.cancel(head)),
        ),
    ];
    for (name, call) in &calls {
        let started = std::time::Instant::now();
        let r = call();
        let took = started.elapsed();
        let e = r.expect_err(name);
        assert_eq!(e.kind(), ErrorKind::Timeout, "{name}: {e}");
        assert!(e.to_string().contains("locked"), "{name}: {e}");
        assert!(took < Duration::from_secs(4), "{name} took {took:?}");
    }
    // The dashboard's cancel: the job's page with the reason, a conflict (409).
    let dash = web_util::dashboard(&app);
    let page = web_util::get(dash.addr(), &format!("/jobs/{waiting}")).body;
    let r = web_util::request(
        dash.addr(),
        "POST",
        &format!("/jobs/{waiting}/cancel"),
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &format!("csrf={}", web_util::csrf_of(&page)),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("locked"), "{}", r.body);
    dash.shutdown();
    let statuses: Vec<String> = [waiting, failed, head, dependent]
        .iter()
        .map(|id| job_row(&mut c, *id).unwrap().status)
        .collect();
    assert_eq!(
        statuses,
        ["todo", "failed", "todo", "todo"],
        "nothing changed"
    );
    tx.rollback().unwrap();
    admin.set_priority(waiting, 5).unwrap();
    admin.cancel(head).unwrap();
    admin.retry(failed).unwrap();
    admin.cancel(waiting).unwrap();
}
