//! The `metrics` feature against PostgreSQL: a worker's run shows up in the counters,
//! histograms and gauges of an installed recorder (Prometheus's exporter here).

mod support;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use postpone::{App, Job, RetryStrategy, TaskError, Tasks, Worker};
use serde_json::json;
use support::*;

/// The value of the line of `text` that starts with `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_worker_run_shows_in_counters_histograms_and_gauges() {
    init_logging();
    let prometheus = PrometheusBuilder::new().install_recorder().unwrap();
    let db = TestDb::new();
    let app = App::builder(db.url())
        .io_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    app.migrate().unwrap();
    let ids = [
        app.job("ok").queue("m").defer(&json!(1)).unwrap(),
        app.job("ok").queue("m").defer(&json!(2)).unwrap(),
        app.job("bad").queue("m").defer(&json!(3)).unwrap(),
    ];
    app.job("ok")
        .queue("m")
        .schedule_in(Duration::from_secs(3600))
        .defer(&json!(4))
        .unwrap();
    let mut tasks = Tasks::new();
    tasks.register("ok", |_: &Job| -> Result<(), TaskError> { Ok(()) });
    tasks
        .register("bad", |_: &Job| -> Result<(), TaskError> {
            Err(TaskError::retry("always"))
        })
        .retry(RetryStrategy::fixed(Duration::ZERO, 2));
    let handle = Worker::builder(&app, tasks)
        .queues(["m"])
        .heartbeat_interval(Duration::from_millis(200))
        .stalled_after(Duration::from_secs(30))
        .spawn()
        .unwrap();
    let ids: Vec<i64> = ids.iter().map(|i| i.get()).collect();
    let mut conn = app.connection().unwrap();
    assert!(wait_until(Duration::from_secs(20), || {
        let left: i64 = conn
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1) AND status IN ('todo','doing')",
                &[&ids],
            )
            .unwrap()
            .get(0);
        left == 0
    }));
    // Gauges come from the beat thread: wait for a pass that saw the scheduled job.
    assert!(wait_until(Duration::from_secs(10), || {
        value(
            &prometheus.render(),
            "postpone_queue_scheduled_jobs{queue=\"m\"}",
        ) == Some(1.0)
    }));
    let report = handle.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");

    let text = prometheus.render();
    eprintln!("{text}");
    let v = |s: &str| value(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
    assert_eq!(v("postpone_jobs_deferred_total{task=\"ok\"}"), 3.0);
    assert_eq!(v("postpone_jobs_deferred_total{task=\"bad\"}"), 1.0);
    assert_eq!(
        v("postpone_jobs_started_total{queue=\"m\",task=\"ok\"}"),
        2.0
    );
    assert_eq!(
        v("postpone_jobs_started_total{queue=\"m\",task=\"bad\"}"),
        2.0
    );
    assert_eq!(
        v("postpone_jobs_succeeded_total{queue=\"m\",task=\"ok\"}"),
        2.0
    );
    assert_eq!(
        v("postpone_jobs_retried_total{queue=\"m\",task=\"bad\"}"),
        1.0
    );
    assert_eq!(
        v("postpone_jobs_failed_total{queue=\"m\",task=\"bad\"}"),
        1.0
    );
    assert_eq!(
        v("postpone_job_run_seconds_count{queue=\"m\",task=\"ok\"}"),
        2.0
    );
    assert_eq!(v("postpone_job_queue_wait_seconds_count{queue=\"m\"}"), 4.0);
    assert_eq!(v("postpone_queue_due_jobs{queue=\"m\"}"), 0.0);
    assert!(v("postpone_conn_reconnects_total") >= 1.0);
}
