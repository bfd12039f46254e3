//! Observability hooks: every call the library makes to the `metrics` facade (feature
//! `metrics`) goes through a function of this module or of `worker/observe.rs` (the job
//! events, the queue gauges and the `tracing` span, which need the worker's types); this
//! module depends on nothing of the crate, so that the connection layer can call it.
//! Without the feature a function is empty and inlined: the call sites are one line each
//! and cost nothing.
//!
//! Metrics, all prefixed `postpone_` (labels in braces):
//! - counters `jobs_deferred_total{task}`, and `jobs_started_total`, `jobs_succeeded_total`,
//!   `jobs_failed_total`, `jobs_retried_total`, `jobs_cancelled_total`, `jobs_aborted_total`,
//!   `jobs_interrupted_total` (given back by a shutdown), all `{queue, task}`;
//!   `jobs_rescued_total` (requeued after their worker stopped sending heartbeats);
//!   `jobs_expired_total` (jobs that reached their deadline before they started, ended by
//!   a worker: held past it, retried or snoozed past it, or swept while they waited);
//! - histograms `job_run_seconds{queue, task}` (the task's own time) and
//!   `job_queue_wait_seconds{queue}` (from the scheduled time, which is the defer time of a
//!   job deferred without a schedule, to the start);
//! - gauges `queue_due_jobs{queue}`, `queue_scheduled_jobs{queue}`,
//!   `queue_waiting_for_dependencies_jobs{queue}` (deferred `after` jobs that have not all
//!   finished; not counted as scheduled) and `queue_oldest_due_seconds{queue}`, set by each
//!   worker's beat thread at every rescue pass (every `heartbeat_interval`);
//! - connection-layer counters `conn_deadlines_fired_total` (a round-trip exceeded its
//!   `io_timeout`), `conn_sockets_severed_total` (by the watchdog's backstop or a shutdown)
//!   and `conn_reconnects_total` (connections a worker thread opened, at start and after a
//!   loss).
//!
//! A deferred job is counted when its insert returns: a job deferred inside a transaction
//! that then rolls back is counted all the same.

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

/// A job started: records its wait, from when it was due to its start (seconds). A job a
/// worker held before it started waited until then, not only until its claim.
#[inline]
pub(crate) fn queue_wait(queue: &str, wait: f64) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("postpone_job_queue_wait_seconds", "queue" => queue.to_owned())
        .record(wait.max(0.0));
    #[cfg(not(feature = "metrics"))]
    let _ = (queue, wait);
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

/// `n` jobs ended expired (not started by their deadline).
#[inline]
pub(crate) fn expired(n: u64) {
    #[cfg(feature = "metrics")]
    if n > 0 {
        metrics::counter!("postpone_jobs_expired_total").increment(n);
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
