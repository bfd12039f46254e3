//! Observability hooks: every call the library makes to the `metrics` facade (feature
//! `metrics`) and to `tracing` (feature `tracing`) goes through a function of this module.
//! Without the feature a function is empty and inlined: the call sites are one line each
//! and cost nothing.
//!
//! Metrics, all prefixed `postpone_` (labels in braces):
//! - counters `jobs_deferred_total{task}`, and `jobs_started_total`, `jobs_succeeded_total`,
//!   `jobs_failed_total`, `jobs_retried_total`, `jobs_cancelled_total`, `jobs_aborted_total`,
//!   `jobs_interrupted_total` (given back by a shutdown), all `{queue, task}`;
//!   `jobs_rescued_total` (requeued after their worker stopped sending heartbeats);
//! - histograms `job_run_seconds{queue, task}` (the task's own time) and
//!   `job_queue_wait_seconds{queue}` (from the scheduled time, which is the defer time of a
//!   job deferred without a schedule, to the start);
//! - gauges `queue_due_jobs{queue}`, `queue_scheduled_jobs{queue}` and
//!   `queue_oldest_due_seconds{queue}`, set by each worker's beat thread at every rescue
//!   pass (every `heartbeat_interval`);
//! - connection-layer counters `conn_deadlines_fired_total` (a round-trip exceeded its
//!   `io_timeout`), `conn_sockets_severed_total` (by the watchdog's backstop or a shutdown)
//!   and `conn_reconnects_total` (connections a worker thread opened, at start and after a
//!   loss).
//!
//! A deferred job is counted when its insert returns: a job deferred inside a transaction
//! that then rolls back is counted all the same.

use std::time::Duration;

use crate::conn::Connection;
use crate::job::Job;
use crate::worker::JobEventKind;

/// A job was inserted.
#[inline]
pub(crate) fn deferred(task: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("postpone_jobs_deferred_total", "task" => task.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = task;
}

/// Jobs of these tasks were inserted, one per entry.
#[inline]
pub(crate) fn deferred_tasks(tasks: &[String]) {
    #[cfg(feature = "metrics")]
    for task in tasks {
        deferred(task);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = tasks;
}

/// An executor reported an event of a job (the same events a `JobHook` sees).
#[inline]
pub(crate) fn job_event(kind: JobEventKind, queue: &str, task: &str, took: Duration) {
    #[cfg(feature = "metrics")]
    {
        let name = match kind {
            JobEventKind::Started => "postpone_jobs_started_total",
            JobEventKind::Succeeded => "postpone_jobs_succeeded_total",
            JobEventKind::Retried => "postpone_jobs_retried_total",
            JobEventKind::Failed => "postpone_jobs_failed_total",
            JobEventKind::Cancelled => "postpone_jobs_cancelled_total",
            JobEventKind::Aborted => "postpone_jobs_aborted_total",
            JobEventKind::Interrupted => "postpone_jobs_interrupted_total",
        };
        let labels = [("queue", queue.to_owned()), ("task", task.to_owned())];
        metrics::counter!(name, &labels).increment(1);
        if kind != JobEventKind::Started {
            metrics::histogram!("postpone_job_run_seconds", &labels).record(took.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, queue, task, took);
}

/// Jobs were claimed: records each one's wait from its `queue_wait` column (seconds).
#[inline]
pub(crate) fn queue_waits(rows: &[postgres::Row]) {
    #[cfg(feature = "metrics")]
    for r in rows {
        if let (Ok(queue), Ok(Some(wait))) = (
            r.try_get::<_, &str>("queue"),
            r.try_get::<_, Option<f64>>("queue_wait"),
        ) {
            metrics::histogram!("postpone_job_queue_wait_seconds", "queue" => queue.to_owned())
                .record(wait.max(0.0));
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = rows;
}

/// A rescue pass requeued `n` jobs of stalled workers.
#[inline]
pub(crate) fn rescued(n: usize) {
    #[cfg(feature = "metrics")]
    if n > 0 {
        metrics::counter!("postpone_jobs_rescued_total").increment(n as u64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = n;
}

/// A round-trip exceeded its deadline.
#[inline]
pub(crate) fn deadline_fired() {
    #[cfg(feature = "metrics")]
    metrics::counter!("postpone_conn_deadlines_fired_total").increment(1);
}

/// A socket was shut down by us; `forced` unless it was its own connection closing it (on
/// drop, or after its deadline fired, which `deadline_fired` counts). Only forced ones count.
#[inline]
pub(crate) fn socket_severed(forced: bool) {
    #[cfg(feature = "metrics")]
    if forced {
        metrics::counter!("postpone_conn_sockets_severed_total").increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = forced;
}

/// A worker thread opened a connection.
#[inline]
pub(crate) fn reconnect() {
    #[cfg(feature = "metrics")]
    metrics::counter!("postpone_conn_reconnects_total").increment(1);
}

/// Per-queue gauges read on the beat thread's connection (under its `io_timeout`). A failure
/// is logged and otherwise ignored: the beat's own statements report a broken connection.
#[inline]
pub(crate) fn queue_gauges(conn: &mut Connection) {
    #[cfg(feature = "metrics")]
    gauges::refresh(conn);
    #[cfg(not(feature = "metrics"))]
    let _ = conn;
}

#[cfg(feature = "metrics")]
mod gauges {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use crate::conn::Connection;

    /// Waiting jobs per queue; the partial claim indexes cover it (only `todo` rows).
    const QUEUE_GAUGES: &str = "
SELECT queue,
       count(*) FILTER (WHERE scheduled_at <= now()),
       count(*) FILTER (WHERE scheduled_at > now()),
       EXTRACT(EPOCH FROM now() - min(scheduled_at) FILTER (WHERE scheduled_at <= now()))::float8
  FROM postpone_jobs
 WHERE status = 'todo'
 GROUP BY queue";

    /// Queues given a value before: a queue that empties is set to zero, not left stale.
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

    pub(super) fn refresh(conn: &mut Connection) {
        let rows = match conn.query_cached("reading queue gauges", QUEUE_GAUGES, &[]) {
            Ok(rows) => rows,
            Err(e) => {
                log::debug!("metrics: {e}");
                return;
            }
        };
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = BTreeSet::new();
        for r in &rows {
            let queue: String = r.get(0);
            let due: i64 = r.get(1);
            let scheduled: i64 = r.get(2);
            let oldest: Option<f64> = r.get(3);
            metrics::gauge!("postpone_queue_due_jobs", "queue" => queue.clone()).set(due as f64);
            metrics::gauge!("postpone_queue_scheduled_jobs", "queue" => queue.clone())
                .set(scheduled as f64);
            metrics::gauge!("postpone_queue_oldest_due_seconds", "queue" => queue.clone())
                .set(oldest.unwrap_or(0.0).max(0.0));
            now.insert(queue);
        }
        for gone in seen.difference(&now) {
            for name in [
                "postpone_queue_due_jobs",
                "postpone_queue_scheduled_jobs",
                "postpone_queue_oldest_due_seconds",
            ] {
                metrics::gauge!(name, "queue" => gone.clone()).set(0.0);
            }
        }
        seen.extend(now);
    }
}

/// Runs `f` (a task) inside a `tracing` span named `postpone_job` with the job's id, task,
/// queue and attempt, so that the task's own events carry them.
#[inline]
pub(crate) fn in_job_span<T>(job: &Job, f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "tracing")]
    {
        let span = tracing::info_span!(
            "postpone_job",
            job_id = job.id.get(),
            task = %job.task,
            queue = %job.queue,
            attempt = job.attempts(),
        );
        span.in_scope(f)
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = job;
        f()
    }
}
