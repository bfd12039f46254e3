//! Shutdown: the reason postpone exists. Returns within its timeout, whatever the database does.
//!
//! The timeout is split in three: a *graceful* window (running jobs may finish), an *abort*
//! window (`should_abort()` is true; jobs may wrap up), and a *reserve* at the end (at most a
//! fifth of the timeout, 2 s at most) for the cleanup on a fresh connection. In order:
//!
//! 1. stop claiming and starting jobs; wake every thread (the listener out of its wait);
//! 2. until the graceful deadline, let running jobs finish;
//! 3. then raise the shutdown abort flag of every running job, and wait until the hard
//!    deadline;
//! 4. at the hard deadline, sever every socket the worker owns, so a thread blocked in a
//!    round-trip (on a half-open link, say) gets an error at once; join every thread that
//!    unwinds;
//! 5. with the time left, on a fresh connection: record the outcomes the completer could not,
//!    put back every job still held (jobs never started get their attempt back), delete the
//!    worker row. If that fails, the stale heartbeat lets other workers rescue the jobs;
//! 6. return the report.
//!
//! Nothing here waits without a deadline: thread exits arrive on a channel read with
//! `recv_deadline`, and only threads known to have ended are joined.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::record::Recorder;
use super::{complete, Running, Shared};
use crate::conn::Connection;
use crate::error::{fmt_duration, Error, ErrorKind, Result};
use crate::job::{JobId, ABORT_SHUTDOWN};
use crate::store;

/// What a shutdown did, returned by [`WorkerHandle::shutdown`](super::WorkerHandle::shutdown).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShutdownReport {
    elapsed: Duration,
    jobs_finished: usize,
    jobs_requeued: usize,
    threads_joined: usize,
    abandoned: Vec<String>,
    abandoned_jobs: Vec<JobId>,
    sockets_severed: usize,
    cleanup_error: Option<String>,
}

impl ShutdownReport {
    /// How long the call took.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Jobs that ran to an outcome while the worker was shutting down.
    pub fn jobs_finished(&self) -> usize {
        self.jobs_finished
    }

    /// Jobs put back in the queue: claimed but never started, interrupted by the shutdown,
    /// or still running in an abandoned thread.
    pub fn jobs_requeued(&self) -> usize {
        self.jobs_requeued
    }

    /// Threads that ended and were joined.
    pub fn threads_joined(&self) -> usize {
        self.threads_joined
    }

    /// Threads still running when the call returned: only executors stuck in task code can
    /// be here. Each entry names the thread and the job it was running.
    pub fn abandoned_threads(&self) -> &[String] {
        &self.abandoned
    }

    /// The jobs the abandoned threads were running (requeued: they may run again elsewhere
    /// while the stuck thread still runs them).
    pub fn abandoned_jobs(&self) -> &[JobId] {
        &self.abandoned_jobs
    }

    /// Sockets severed at the hard deadline (0 when every thread stopped in time).
    pub fn sockets_severed(&self) -> usize {
        self.sockets_severed
    }

    /// Why the final cleanup (requeue, worker row) did not happen, if it did not; the jobs
    /// are then rescued by other workers once the heartbeat is stale.
    pub fn cleanup_error(&self) -> Option<&str> {
        self.cleanup_error.as_deref()
    }

    /// True when every thread was joined.
    pub fn is_clean(&self) -> bool {
        self.abandoned.is_empty()
    }
}

impl fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stopped in {}: {} job(s) finished while stopping, {} requeued, {} thread(s) joined, {} abandoned, {} socket(s) severed",
            fmt_duration(self.elapsed),
            self.jobs_finished,
            self.jobs_requeued,
            self.threads_joined,
            self.abandoned.len(),
            self.sockets_severed
        )?;
        if !self.abandoned.is_empty() {
            write!(f, " ({})", self.abandoned.join("; "))?;
        }
        if let Some(e) = &self.cleanup_error {
            write!(f, "; cleanup failed: {e}")?;
        }
        Ok(())
    }
}

fn finished_count(s: &Shared) -> u64 {
    let st = &s.stats;
    [
        &st.succeeded,
        &st.failed,
        &st.retried,
        &st.cancelled,
        &st.aborted,
    ]
    .iter()
    .map(|a| a.load(Ordering::Relaxed))
    .sum()
}

/// The three deadlines of a shutdown started at `start`.
#[derive(Debug, PartialEq)]
pub(crate) struct Plan {
    pub(crate) graceful: Instant,
    pub(crate) hard: Instant,
    pub(crate) end: Instant,
    pub(crate) clipped: bool,
}

pub(crate) fn plan(start: Instant, timeout: Duration, graceful: Option<Duration>) -> Plan {
    let reserve = (timeout / 5).min(Duration::from_secs(2));
    let window = timeout - reserve;
    let default = window.mul_f64(0.8);
    let (g, clipped) = match graceful {
        // Clipped to the default split, not to the hard deadline: `should_abort` must come
        // before the sever, with time for the jobs to act on it.
        Some(g) if g > window => (default, true),
        Some(g) => (g, false),
        None => (default, false),
    };
    Plan {
        graceful: start + g,
        hard: start + window,
        end: start + timeout,
        clipped,
    }
}

pub(crate) fn run(mut r: Running, timeout: Duration) -> ShutdownReport {
    let start = Instant::now();
    let shared = r.shared.clone();
    let p = plan(start, timeout, shared.opts.graceful);
    if p.clipped {
        log::warn!(
            "worker {}: shutdown_graceful_timeout ({}) does not fit in the shutdown timeout ({}); clipped to {}",
            shared.name,
            fmt_duration(shared.opts.graceful.unwrap_or_default()),
            fmt_duration(timeout),
            fmt_duration(p.graceful - start)
        );
    }
    let finished_before = finished_count(&shared);
    let interrupted_before = shared.stats.interrupted.load(Ordering::Relaxed);
    log::info!(
        "worker {}: shutting down within {}",
        shared.name,
        fmt_duration(timeout)
    );

    // 1. Stop claiming and starting; wake everyone.
    shared.stopping.store(true, Ordering::Release);
    drop(r.stop_tx.take());
    shared.handoff.board().close();
    shared.listen_wake.notify_one();

    // 2. Graceful window.
    if !wait_exits(&mut r, p.graceful) {
        // 3. Ask running jobs to stop.
        let mut asked = 0;
        shared.ledger.for_each_running(|_, job| {
            job.abort.raise(ABORT_SHUTDOWN);
            asked += 1;
        });
        if asked > 0 {
            log::info!(
                "worker {}: graceful deadline passed; asked {asked} running job(s) to abort",
                shared.name
            );
        }
        wait_exits(&mut r, p.hard);
    }

    // 4. Hard deadline: the completer stops, every socket of the worker is severed (and
    // the worker's lasting connection, shared by the beat and the completer, is closed).
    drop(r.hard_tx.take());
    shared.shelf.close();
    let severed = if all_exited(&r) {
        0
    } else {
        shared.app.inner.watchdog.close_group(shared.group)
    };
    if !all_exited(&r) {
        let unwind = (p.hard + (p.end - p.hard) / 4).min(p.hard + Duration::from_millis(200));
        wait_exits(&mut r, unwind.max(Instant::now()));
    }
    let mut joined = 0;
    let mut abandoned = Vec::new();
    let mut abandoned_jobs = Vec::new();
    {
        let mut running = Vec::new();
        shared.ledger.for_each_running(|key, job| {
            running.push((key.id, job.thread.clone(), job.task.clone()));
        });
        for t in r.threads.iter_mut() {
            if t.exited {
                if let Some(h) = t.handle.take() {
                    // The thread has signalled its end: join returns at once.
                    let _ = h.join();
                    joined += 1;
                }
            } else {
                let job = running
                    .iter()
                    .find(|(_, thread, _)| **thread == *t.name)
                    .map(|(id, _, task)| (*id, task.clone()));
                match job {
                    Some((id, task)) => {
                        abandoned.push(format!("{} (job {id}, task {task:?})", t.name));
                        abandoned_jobs.push(id);
                    }
                    None => abandoned.push(format!("{} ({:?})", t.name, t.role)),
                }
            }
        }
    }
    if !abandoned.is_empty() {
        log::warn!(
            "worker {}: {} thread(s) still running task code after the hard deadline: {}",
            shared.name,
            abandoned.len(),
            abandoned.join("; ")
        );
    }

    // Jobs claimed and never started (waiting in the ledger, whether an executor took
    // them from the board or not): their attempt is given back.
    let never_started = shared.ledger.never_started();
    // Outcomes the completer could not record, and those it never took from its channel
    // (it stops at the hard deadline, or when severed, with more waiting behind its batch):
    // left there, their jobs would be requeued below and run again.
    let mut unrecorded =
        std::mem::take(&mut *shared.unrecorded.lock().unwrap_or_else(|e| e.into_inner()));
    unrecorded.extend(r.outcome_rx.try_iter());
    // And those left for a claim that never came.
    unrecorded.extend(shared.ride.take_all());

    // 5. Cleanup with the time left.
    let cleanup_deadline = p.end.checked_sub(Duration::from_millis(5)).unwrap_or(p.end);
    let (requeued, cleanup_error) = match cleanup(
        &shared,
        &unrecorded,
        &never_started,
        cleanup_deadline,
    ) {
        Ok(n) => (n, None),
        Err(e) => {
            log::warn!(
                    "worker {}: shutdown cleanup failed ({e}); its jobs will be rescued by other workers once its heartbeat is older than {}",
                    shared.name,
                    fmt_duration(shared.opts.stalled_after)
                );
            (0, Some(e.to_string()))
        }
    };
    let interrupted =
        (shared.stats.interrupted.load(Ordering::Relaxed) - interrupted_before) as usize;
    let finished = (finished_count(&shared) - finished_before) as usize;
    let report = ShutdownReport {
        elapsed: start.elapsed(),
        jobs_finished: finished,
        jobs_requeued: requeued + interrupted,
        threads_joined: joined,
        abandoned,
        abandoned_jobs,
        sockets_severed: severed,
        cleanup_error,
    };
    log::info!("worker {}: {report}", shared.name);
    report
}

fn all_exited(r: &Running) -> bool {
    r.threads.iter().all(|t| t.exited)
}

/// Waits for threads to signal their end until `deadline`; true when all have.
fn wait_exits(r: &mut Running, deadline: Instant) -> bool {
    loop {
        if all_exited(r) {
            return true;
        }
        match r.exit_rx.recv_deadline(deadline) {
            Ok(i) => {
                if let Some(t) = r.threads.get_mut(i) {
                    t.exited = true;
                }
            }
            Err(_) => return all_exited(r),
        }
    }
}

/// Records leftover outcomes, requeues what the worker still holds, deletes its row, every
/// round-trip within `deadline`. Returns the number of jobs requeued.
fn cleanup(
    shared: &Shared,
    unrecorded: &[super::Outcome],
    never_started: &[i64],
    deadline: Instant,
) -> Result<usize> {
    if deadline.saturating_duration_since(Instant::now()) < Duration::from_millis(2) {
        return Err(Error::new(
            ErrorKind::Timeout,
            "connecting for the shutdown cleanup: no time left in the shutdown timeout",
        ));
    }
    // A group of its own: the worker's is closed once severed.
    let mut conn = Connection::open(
        &shared.app.inner.opts,
        &shared.app.inner.watchdog,
        shared.app.inner.watchdog.new_group(),
        Some(deadline),
    )?;
    // However many round-trips follow (outcomes in chunks, a refused one isolated), none
    // runs past the shutdown's end.
    conn.set_deadline(Some(deadline));
    for chunk in unrecorded.chunks(complete::MAX_BATCH) {
        for key in Recorder::new(shared).record(&mut conn, chunk)? {
            // Its row was held locked by another session to the end: retiring the worker
            // requeues the job (it runs again: at least once).
            log::warn!(
                "worker {}: job {}'s row stayed locked by another session; its outcome could not be recorded before the worker stopped",
                shared.name,
                key.id
            );
        }
    }
    let id = shared.id();
    let note = format!(
        "worker {} stopped before this job's outcome was recorded; requeued",
        shared.name
    );
    let rows = conn.query_named(
        "requeueing jobs and removing the worker",
        store::WORKER_RETIRE,
        &[&id, &never_started, &note],
    )?;
    let requeued = rows
        .iter()
        .filter(|r| r.get::<_, &str>(1) == "todo")
        .count();
    Ok(requeued)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_splits_the_timeout() {
        let t0 = Instant::now();
        let p = plan(t0, Duration::from_secs(10), None);
        assert_eq!(p.end - t0, Duration::from_secs(10));
        assert_eq!(p.hard - t0, Duration::from_secs(8));
        assert_eq!(p.graceful - t0, Duration::from_millis(6400));
        assert!(!p.clipped);
        let p = plan(t0, Duration::from_secs(2), Some(Duration::from_secs(5)));
        assert!(p.clipped);
        assert_eq!(p.hard - t0, Duration::from_millis(1600));
        // Clipped to the default split, leaving the jobs an abort window before the sever.
        assert_eq!(p.graceful - t0, Duration::from_millis(1280));
        let p = plan(t0, Duration::from_secs(60), Some(Duration::from_secs(30)));
        assert_eq!(p.graceful - t0, Duration::from_secs(30));
        assert_eq!(p.end - p.hard, Duration::from_secs(2));
        let p = plan(t0, Duration::ZERO, None);
        assert_eq!(p.graceful, t0);
        assert_eq!(p.end, t0);
    }
}
