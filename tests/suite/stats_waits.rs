//! The statistics trigger's roll-up (`postpone_stats_record`, schema versions 19, 31, 35, 40 and 45):
//! each finished job counted once, in its queue and outcome, and in the bucket of its wait
//! (b = 0 under 1 ms, else 1 + floor(log2(ms)), at most 23; no bucket when a time is missing
//! or infinite); rows that were already finished not counted again; rows deleted by hand
//! not counted; and a worker that deletes its jobs as they end counts each, in its outcome
//! and with its wait (schema 49).

use crate::support;

use postpone::App;
use serde_json::json;
use support::*;

/// `(span, queue, outcome, jobs, w0..w23)` per row of `postpone_stats`, summed over shards.
fn stats(c: &mut postgres::Client) -> Vec<(String, String, String, i64, Vec<i64>)> {
    let cols: Vec<String> = (0..24).map(|k| format!("sum(w{k})::bigint")).collect();
    c.query(
        &format!(
            "SELECT span, queue, outcome, sum(jobs)::bigint, ARRAY[{}]
               FROM postpone_stats GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            cols.join(", ")
        ),
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
    .collect()
}

fn hist(buckets: &[(usize, i64)]) -> Vec<i64> {
    let mut h = vec![0; 24];
    for &(b, n) in buckets {
        h[b] += n;
    }
    h
}

#[test]
fn finished_jobs_are_counted_once_in_the_bucket_of_their_wait() {
    init_logging();
    let db = TestDb::new();
    let app = App::builder(db.url()).pool_size(2).build().unwrap();
    app.migrate().unwrap();
    let mut c = db.client();
    // Waits in ms (NULL: the job never started; 'inf': its scheduled time is -infinity),
    // and the bucket each lands in.
    let waits: &[(&str, Option<usize>)] = &[
        ("0", Some(0)),
        ("0.5", Some(0)),
        ("-5000", Some(0)),
        ("1.5", Some(1)),
        ("3", Some(2)),
        ("3", Some(2)),
        ("1000", Some(10)),
        ("70000", Some(17)),
        ("5000000", Some(23)),
        // Bounds exactly: 2^(b-1) ms is the first wait of bucket b.
        ("1", Some(1)),
        ("2", Some(2)),
        ("8", Some(4)),
        ("1024", Some(11)),
        ("4194303.999", Some(22)),
        ("4194304", Some(23)),
        ("NULL", None),
        ("inf", None),
    ];
    let mut ids = Vec::new();
    for (i, (ms, _)) in waits.iter().enumerate() {
        let id: i64 = app.defer("t", &json!(i)).unwrap().get();
        let sql = match *ms {
            "NULL" => {
                "UPDATE postpone_jobs SET status = 'doing', attempts = 1 WHERE id = $1".to_owned()
            }
            "inf" => "UPDATE postpone_jobs SET status = 'doing', attempts = 1,
                             scheduled_at = '-infinity', started_at = now() WHERE id = $1"
                .to_owned(),
            ms => format!(
                "UPDATE postpone_jobs SET status = 'doing', attempts = 1,
                        started_at = scheduled_at + {ms} * interval '1 millisecond'
                  WHERE id = $1"
            ),
        };
        c.execute(&sql, &[&id]).unwrap();
        ids.push(id);
    }
    // All but the last two finished by one statement (one of them failed); the last two
    // deleted while `doing`, by hand: not counted (the statistics count updates; a worker's
    // outcome statement counts the jobs it deletes itself, below).
    let (done, gone) = ids.split_at(ids.len() - 2);
    c.execute(
        "UPDATE postpone_jobs SET finished_at = now(),
                status = CASE WHEN id = $1 THEN 'failed' ELSE 'succeeded' END
          WHERE id = ANY($2)",
        &[&done[6], &done.to_vec()],
    )
    .unwrap();
    c.execute(
        "DELETE FROM postpone_jobs WHERE id = ANY($1)",
        &[&gone.to_vec()],
    )
    .unwrap();
    // Finished jobs updated again (an output rewritten by hand) are not counted again.
    c.execute(
        "UPDATE postpone_jobs SET output = '1' WHERE id = ANY($1)",
        &[&done.to_vec()],
    )
    .unwrap();

    let bucket_of = |range: &[(&str, Option<usize>)], skip: Option<usize>| -> Vec<(usize, i64)> {
        range
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != skip)
            .filter_map(|(_, (_, b))| b.map(|b| (b, 1)))
            .collect()
    };
    let ok = &waits[..waits.len() - 2];
    // Succeeded: the updated ones but the failed one (its wait, 1000 ms, bucket 10).
    let want_ok = hist(&bucket_of(ok, Some(6)));
    let want_failed = hist(&[(10, 1)]);
    let mut want = Vec::new();
    for span in ["hour", "minute"] {
        want.push((
            span.to_owned(),
            "default".to_owned(),
            "failed".to_owned(),
            1,
            want_failed.clone(),
        ));
        want.push((
            span.to_owned(),
            "default".to_owned(),
            "succeeded".to_owned(),
            // Every job but the failed one and the two deleted.
            waits.len() as i64 - 3,
            want_ok.clone(),
        ));
    }
    assert_eq!(stats(&mut c), want);
}

/// Waits (up to 60 s) until the worker `w`, which deletes its jobs, has deleted all `n`,
/// then shuts it down.
fn drain_deleted(db: &TestDb, w: postpone::WorkerHandle, n: usize) {
    let left = || -> i64 {
        db.client()
            .query_one("SELECT count(*) FROM postpone_jobs", &[])
            .unwrap()
            .get(0)
    };
    let gone = wait_until(std::time::Duration::from_secs(60), || left() == 0);
    w.shutdown(std::time::Duration::from_secs(5));
    assert!(gone, "{} of {n} jobs left after 60 s", left());
}

/// A worker that deletes what succeeds counts every job with its wait: most of its jobs are
/// deleted held (they ran shorter than the start's delay, so their rows have no start), and
/// its outcome statement counts those itself.
#[test]
fn a_worker_that_deletes_what_succeeds_counts_each_jobs_wait() {
    use crate::worker_util::{counting_tasks, fast_worker, setup};
    let (db, app) = setup();
    let n = 600;
    let jobs: Vec<postpone::NewJob> = (0..n)
        .map(|i| postpone::NewJob::new("ok", &json!(i)).unwrap())
        .collect();
    app.defer_batch(&jobs).unwrap();
    let (tasks, _runs) = counting_tasks();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .delete_finished(postpone::DeleteJobs::Successful)
        .spawn()
        .unwrap();
    drain_deleted(&db, w, n);
    let mut c = db.client();
    let rows = stats(&mut c);
    let hour: Vec<_> = rows.iter().filter(|r| r.0 == "hour").collect();
    assert_eq!(hour.len(), 1, "{rows:?}");
    let (_, queue, outcome, count, buckets) = hour[0];
    assert_eq!(
        (queue.as_str(), outcome.as_str(), *count),
        ("default", "succeeded", n as i64)
    );
    assert_eq!(buckets.iter().sum::<i64>(), n as i64, "{buckets:?}");
}

/// A worker that deletes every finished job counts each in its outcome: its failures are
/// failures, not successes, with their waits.
#[test]
fn a_worker_that_deletes_every_job_counts_each_in_its_outcome() {
    use crate::worker_util::{fast_worker, setup};
    let (db, app) = setup();
    let mut tasks = postpone::Tasks::new();
    tasks.register("ok", |_job: &postpone::Job| Ok(()));
    tasks.register("fail", |_job: &postpone::Job| {
        Err(postpone::TaskError::fail("failing on purpose"))
    });
    let jobs: Vec<postpone::NewJob> = (0..300)
        .map(|i| postpone::NewJob::new(if i % 3 == 0 { "fail" } else { "ok" }, &json!(i)).unwrap())
        .collect();
    app.defer_batch(&jobs).unwrap();
    let w = fast_worker(&app, tasks)
        .concurrency(4)
        .delete_finished(postpone::DeleteJobs::Always)
        .spawn()
        .unwrap();
    drain_deleted(&db, w, 300);
    let mut c = db.client();
    let hour: Vec<(String, i64, i64)> = stats(&mut c)
        .into_iter()
        .filter(|r| r.0 == "hour")
        .map(|r| (r.2, r.3, r.4.iter().sum::<i64>()))
        .collect();
    assert_eq!(
        hour,
        [
            ("failed".to_owned(), 100, 100),
            ("succeeded".to_owned(), 200, 200)
        ]
    );
}
