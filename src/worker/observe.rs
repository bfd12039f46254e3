//! The worker's observability hooks (see `crate::metrics` for the list of metrics): job
//! events, the queue gauges the beat thread reads, and the `tracing` span every task runs in
//! (feature `tracing`). Without the features each function is empty and inlined.

use std::time::Duration;

use super::JobEventKind;
use crate::conn::Connection;
use crate::job::Job;

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
            JobEventKind::Snoozed => "postpone_jobs_snoozed_total",
            // Counted by `metrics::expired`, with the jobs the sweep ends.
            JobEventKind::Expired => return,
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
    use crate::store;

    /// Queues given a value before: a queue that empties is set to zero, not left stale.
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

    pub(super) fn refresh(conn: &mut Connection) {
        let rows = match conn.query_cached("reading queue gauges", store::QUEUE_GAUGES, &[]) {
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
            let after_deps: i64 = r.get(4);
            metrics::gauge!("postpone_queue_due_jobs", "queue" => queue.clone()).set(due as f64);
            metrics::gauge!("postpone_queue_scheduled_jobs", "queue" => queue.clone())
                .set(scheduled as f64);
            metrics::gauge!("postpone_queue_oldest_due_seconds", "queue" => queue.clone())
                .set(oldest.unwrap_or(0.0).max(0.0));
            metrics::gauge!(
                "postpone_queue_waiting_for_dependencies_jobs",
                "queue" => queue.clone()
            )
            .set(after_deps as f64);
            now.insert(queue);
        }
        for gone in seen.difference(&now) {
            for name in [
                "postpone_queue_due_jobs",
                "postpone_queue_scheduled_jobs",
                "postpone_queue_oldest_due_seconds",
                "postpone_queue_waiting_for_dependencies_jobs",
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
