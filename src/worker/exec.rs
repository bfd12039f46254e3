//! Executors: run one job at a time and decide its outcome; never touch the database.
//!
//! A task runs under `catch_unwind`: a panic fails the job with the panic's message and
//! its backtrace (see `backtrace.rs`), and the thread goes on. The outcome goes to the completer through a channel, so the executor is
//! free for its next job while the previous outcome is being recorded.
//!
//! Deciding, in order: a job whose abort was requested ends `aborted`, whatever the task
//! returned; `Ok` succeeds; a snooze snoozes; once the shutdown has asked the task to stop
//! (past its graceful deadline), anything else (an error, a `fail`, a `cancel`, a retry, a
//! panic) is an interruption: the job goes back to the queue with its attempt given back,
//! unless the error was made [`TaskError::even_on_shutdown`]; otherwise the [`TaskError`]
//! and the task's retry strategy decide between retry, failed and cancelled.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::ledger::{AttemptKey, Begin, RunningJob, Unstarted};
use super::{Claimed, DeleteJobs, Outcome, OutcomeKind, Shared};
use crate::job::{AbortFlag, Job, JobId, ABORT_REQUESTED, ABORT_SHUTDOWN};
use crate::retry::jitter_rand;
use crate::task::{TaskAction, TaskError};

/// What happened to a job, as seen by a [`JobHook`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobEventKind {
    /// The task is about to run.
    Started,
    /// The task returned `Ok`.
    Succeeded,
    /// The attempt failed and the job will be retried.
    Retried,
    /// The job failed for good.
    Failed,
    /// The job was cancelled by its task.
    Cancelled,
    /// The job was aborted on request.
    Aborted,
    /// The worker stopped before the job finished; it goes back to the queue.
    Interrupted,
    /// The task snoozed the job ([`TaskError::snooze`]): it runs again later, without
    /// using an attempt.
    Snoozed,
    /// The job was held by this worker past its deadline
    /// ([`NewJob::expires_at`](crate::NewJob::expires_at)) and ends without running.
    Expired,
}

/// One event of a job's run, given to a [`JobHook`].
#[derive(Debug)]
#[non_exhaustive]
pub struct JobEvent<'a> {
    /// What happened.
    pub kind: JobEventKind,
    /// The job.
    pub job_id: JobId,
    /// Its task name.
    pub task: &'a str,
    /// Its queue.
    pub queue: &'a str,
    /// Which attempt (1 on the first run).
    pub attempt: u32,
    /// How long the task ran (zero for `Started`).
    pub duration: Duration,
    /// The error message, for failed, retried, cancelled and aborted jobs.
    pub error: Option<&'a str>,
    /// The name of the worker.
    pub worker: &'a str,
}

/// Observes jobs as they start and end, to feed metrics or tracing without forking the
/// library. Runs on the executor thread, between the task and its next job: keep it fast.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use postpone::{JobEvent, JobEventKind, JobHook};
///
/// #[derive(Default)]
/// struct Counter { failed: AtomicU64 }
///
/// impl JobHook for Counter {
///     fn on_event(&self, event: &JobEvent<'_>) {
///         if event.kind == JobEventKind::Failed {
///             self.failed.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait JobHook: Send + Sync {
    /// Called for every event of every job.
    fn on_event(&self, event: &JobEvent<'_>);
}

impl<F> JobHook for F
where
    F: Fn(&JobEvent<'_>) + Send + Sync,
{
    fn on_event(&self, event: &JobEvent<'_>) {
        self(event)
    }
}

/// How many runs beyond its retry strategy a job gets when its runs end with their worker
/// (a crash or a lost database, then a rescue). Past that it is failed without running.
const MAX_RESCUES: u32 = 3;

/// Whether attempt number `attempt` is past the `allowed` attempts and the rescues beyond
/// them (a strategy may allow `u32::MAX` attempts: retry for ever).
fn past_rescues(attempt: u32, allowed: u32) -> bool {
    attempt > allowed.saturating_add(MAX_RESCUES)
}

pub(crate) fn run(shared: &Shared, me: usize, stop: &Receiver<()>, outcomes: &Sender<Outcome>) {
    // Shared by every job this thread runs, not copied for each.
    let thread_name: Arc<str> = Arc::from(std::thread::current().name().unwrap_or("postpone-exec"));
    super::backtrace::install();
    let _alive = shared.handoff.executor_alive();
    loop {
        // The shutdown sets `stopping`, then closes the board.
        let Some(claimed) = shared.handoff.take(me) else {
            return;
        };
        // Claimed but never started when the worker stops: it stays in the ledger as
        // waiting, and the shutdown gives it back with its attempt.
        if shared.stopping() {
            return;
        }
        let Some(outcome) = run_one(shared, claimed, &thread_name, stop) else {
            if shared.stopping() {
                return;
            }
            continue;
        };
        shared.ledger.finish(outcome.key);
        // The outcome of a job the fetcher's open transaction locked is kept for it
        // (`locked.rs`); the channel holds as many outcomes as the worker can hold
        // attempts: never full.
        if let Some(outcome) = shared.absorb.absorb(outcome) {
            let _ = outcomes.send(outcome);
        }
        // The last claimed job has started: a fetcher waiting for room may claim now,
        // without waiting for the completer to record these outcomes first.
        shared.handoff.job_done();
    }
}

/// How long an executor waits between two looks at a start the ledger holds back.
const START_RECHECK: Duration = Duration::from_millis(50);

/// How long a held job runs before its start is written to the table (unless its task's
/// jobs typically run longer: then at once).
pub(crate) const START_DELAY: Duration = Duration::from_millis(5);

/// Runs one claimed attempt, if the ledger lets it start; `None` when it is not this
/// worker's any more, or when the worker stopped before it could start.
fn run_one(
    shared: &Shared,
    claimed: Claimed,
    thread_name: &Arc<str>,
    stop: &Receiver<()>,
) -> Option<Outcome> {
    let key = claimed.key();
    let abort = Arc::new(AbortFlag::default());
    let task = shared.tasks.get(&claimed.task).cloned();
    let timeout = task.as_ref().and_then(|t| t.options.timeout);
    // A held job's start is written to the table at once for a task whose jobs typically
    // run longer than START_DELAY, else once it has run that long (most short jobs end
    // first, and their start is written with their outcome, in the same row update).
    let write_start_in = if shared.typical_time(&claimed.task) > START_DELAY {
        Duration::ZERO
    } else {
        START_DELAY
    };
    let verdict = loop {
        if claimed.abort_requested {
            // The claim read the table: the abort was requested before the job started.
            break match shared.ledger.begin(key, write_start_in, || {
                running_job(&abort, timeout, thread_name, &claimed.task)
            }) {
                Begin::Start | Begin::Wait => {
                    shared.ledger.finish(key);
                    Begin::AbortedBeforeStart { cancel: false }
                }
                other => other,
            };
        }
        match shared.ledger.begin(key, write_start_in, || {
            running_job(&abort, timeout, thread_name, &claimed.task)
        }) {
            Begin::Wait => {
                if shared.stopping() || !matches!(stop.try_recv(), Err(TryRecvError::Empty)) {
                    return None;
                }
                if shared.ledger.needs_control_read() {
                    shared.wake_beat();
                }
                shared.ledger.wait_change(START_RECHECK);
            }
            other => break other,
        }
    };
    if let Begin::Start = verdict {
        if let Some(w) = claimed.queue_wait {
            crate::metrics::queue_wait(&claimed.queue, w + claimed.claimed.elapsed().as_secs_f64());
        }
        if write_start_in.is_zero() {
            // The completer writes it.
            let _ = shared.starts_due.0.try_send(());
        }
    }
    let max_attempts = claimed.max_attempts;
    let job = Job {
        id: claimed.id,
        task: claimed.task,
        queue: claimed.queue,
        args: claimed.args,
        attempts: claimed.attempts,
        priority: claimed.priority,
        lock: claimed.lock,
        abort: abort.clone(),
        app: shared.app.clone(),
        extras: crate::job::JobExtras::waiting_for(claimed.locked.then(|| {
            let absorb = shared.absorb.clone();
            crate::job::WaitWritten(Arc::new(move |t| absorb.wait_written(&key, t)))
        })),
    };
    match verdict {
        Begin::Start => {}
        Begin::AbortedBeforeStart { cancel } => {
            let (why, kind) = if cancel {
                shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                (Unstarted::Cancelled, super::JobEventKind::Cancelled)
            } else {
                shared.stats.aborted.fetch_add(1, Ordering::Relaxed);
                (Unstarted::Aborted, super::JobEventKind::Aborted)
            };
            let outcome = Outcome::unstarted(key, why);
            emit(shared, &job, kind, Duration::ZERO, outcome.error.as_deref());
            return Some(outcome);
        }
        Begin::Expired => {
            shared.stats.expired.fetch_add(1, Ordering::Relaxed);
            crate::metrics::expired(1);
            log::info!(
                "worker {}: job {} ({}) not started: its deadline passed while it waited for a thread; it ends expired",
                shared.name,
                job.id,
                job.task
            );
            let outcome = Outcome::unstarted(key, Unstarted::Expired);
            emit(
                shared,
                &job,
                super::JobEventKind::Expired,
                Duration::ZERO,
                Some("expired: not started by its deadline"),
            );
            return Some(outcome);
        }
        Begin::GiveBack => {
            log::debug!(
                "worker {}: job {} not started: its queue {} is paused; given back",
                shared.name,
                job.id,
                job.queue
            );
            return Some(Outcome::unstarted(key, Unstarted::GivenBack));
        }
        Begin::NotOurs | Begin::Wait => {
            log::info!(
                "worker {}: job {} (attempt {}) not started: it is no longer this worker's (the worker was presumed dead and the job requeued)",
                shared.name,
                job.id,
                key.attempt
            );
            return None;
        }
    }
    let attempt = job.attempts();
    let Some(task) = task else {
        let mut names: Vec<&str> = shared.tasks.keys().map(String::as_str).collect();
        names.sort_unstable();
        let msg = format!(
            "task {:?} is not registered on worker {} (it knows: {})",
            job.task,
            shared.name,
            names.join(", ")
        );
        return Some(finish(
            shared,
            key,
            &job,
            Duration::ZERO,
            Decision::Failed(msg),
        ));
    };
    // The job's own attempt limit, given when it was deferred, overrides the strategy's.
    let strategy = match max_attempts {
        Some(n) => {
            std::borrow::Cow::Owned(task.options.retry.clone().max_attempts(n.max(1) as u32))
        }
        None => std::borrow::Cow::Borrowed(&task.options.retry),
    };
    let allowed = strategy.attempts_allowed();
    if past_rescues(attempt, allowed) {
        // Earlier attempts ended with their worker (rescued after a crash, each time): a
        // job that kills its worker must not loop forever.
        let msg = format!(
            "attempt {attempt}: its task {:?} allows {allowed} and earlier attempts kept ending with their worker (rescued {} times); giving up",
            job.task,
            attempt - 1
        );
        return Some(finish(
            shared,
            key,
            &job,
            Duration::ZERO,
            Decision::Failed(msg),
        ));
    }
    emit(
        shared,
        &job,
        super::JobEventKind::Started,
        Duration::ZERO,
        None,
    );
    log::debug!(
        "worker {}: running job {} ({}, attempt {attempt})",
        shared.name,
        job.id,
        job.task
    );
    let started = Instant::now();
    // Pooled connections the task checks out (`job.app()`) are lent to the worker's group,
    // so the hard deadline's sever reaches a task blocked in a query.
    let (result, backtrace) = super::backtrace::capturing(|| {
        crate::conn::watchdog::lending_to(shared.group, || {
            super::observe::in_job_span(&job, || {
                catch_unwind(AssertUnwindSafe(|| (task.func)(&job)))
            })
        })
    });
    // The panic's message, then its backtrace when one was captured.
    let panicked = |p: &Box<dyn Any + Send>| match &backtrace {
        Some(bt) => with_backtrace(&panic_text(p), bt),
        None => panic_text(p),
    };
    let took = started.elapsed();
    shared.job_duration.observe(took);
    if let Some(t) = shared.task_time.get(&job.task) {
        t.observe(took);
    }

    let flags = abort.get();
    // Asked to stop by the shutdown: the task's answer is taken for an interruption, not
    // for a verdict on the job (DESIGN promise 12), unless it says otherwise.
    let interrupted = |why: String| {
        Decision::Interrupted(format!(
            "interrupted by the shutdown of worker {} (attempt {attempt} given back); the task returned: {why}",
            shared.name
        ))
    };
    let shutdown = flags & ABORT_SHUTDOWN != 0;
    let decision = match result {
        _ if flags & ABORT_REQUESTED != 0 => {
            let why = match &result {
                Ok(Err(e)) => format!("aborted on request: {e}"),
                Err(p) => format!(
                    "aborted on request; then the task panicked: {}",
                    panicked(p)
                ),
                Ok(Ok(())) => "aborted on request".to_owned(),
            };
            Decision::Aborted(why)
        }
        Ok(Ok(())) => Decision::Succeeded,
        Ok(Err(e))
            if shutdown && !e.even_on_shutdown && !matches!(e.action, TaskAction::Snooze(_)) =>
        {
            interrupted(format!("{} ({e})", action_word(e.action)))
        }
        Ok(Err(e)) => decide(&e, attempt, &strategy),
        Err(p) if shutdown => interrupted(format!("a panic ({})", panic_text(&p))),
        Err(p) => {
            let e = TaskError::with_action(
                TaskAction::Error,
                format!("task panicked: {}", panicked(&p)),
            );
            decide(&e, attempt, &strategy)
        }
    };
    Some(finish(shared, key, &job, took, decision))
}

fn running_job(
    abort: &Arc<AbortFlag>,
    timeout: Option<Duration>,
    thread: &Arc<str>,
    task: &str,
) -> RunningJob {
    RunningJob {
        abort: abort.clone(),
        started: Instant::now(),
        timeout,
        thread: thread.clone(),
        task: task.to_owned(),
    }
}

/// The verdict on one run.
#[derive(Debug, PartialEq)]
enum Decision {
    Succeeded,
    Retry(Duration, String),
    Failed(String),
    Cancelled(String),
    Aborted(String),
    Interrupted(String),
    Snooze(Duration),
}

/// What an action asks for, in the words of an interruption's note.
fn action_word(action: TaskAction) -> &'static str {
    match action {
        TaskAction::Error => "an error",
        TaskAction::RetryIn(_) => "a retry",
        TaskAction::Fail => "a failure",
        TaskAction::Cancel => "a cancel",
        TaskAction::Snooze(_) => "a snooze",
    }
}

fn decide(e: &TaskError, attempt: u32, strategy: &crate::RetryStrategy) -> Decision {
    let msg = e.message().to_owned();
    match e.action {
        TaskAction::Fail => Decision::Failed(msg),
        TaskAction::Cancel => Decision::Cancelled(msg),
        TaskAction::Snooze(d) => Decision::Snooze(d),
        TaskAction::Error => match strategy.next_delay(attempt, jitter_rand()) {
            Some(d) => Decision::Retry(d, msg),
            None => Decision::Failed(msg),
        },
        TaskAction::RetryIn(d) => {
            if attempt < strategy.attempts_allowed() {
                Decision::Retry(d, msg)
            } else {
                Decision::Failed(format!(
                    "{msg} (retry requested, but attempt {attempt} was the last the retry strategy allows)"
                ))
            }
        }
    }
}

fn finish(
    shared: &Shared,
    key: AttemptKey,
    job: &Job,
    took: Duration,
    decision: Decision,
) -> Outcome {
    use super::JobEventKind as K;
    let stats = &shared.stats;
    let delete = shared.opts.delete;
    let (outcome, kind, delay, error) = match decision {
        Decision::Succeeded => {
            stats.succeeded.fetch_add(1, Ordering::Relaxed);
            log::debug!(
                "worker {}: job {} ({}) succeeded in {}",
                shared.name,
                job.id,
                job.task,
                crate::error::fmt_duration(took)
            );
            let outcome = if delete == DeleteJobs::Never {
                OutcomeKind::Succeeded
            } else {
                OutcomeKind::Delete
            };
            (outcome, K::Succeeded, Duration::ZERO, None)
        }
        Decision::Retry(d, msg) => {
            stats.retried.fetch_add(1, Ordering::Relaxed);
            let when = if d.is_zero() {
                "now".to_owned()
            } else {
                format!("in {}", crate::error::fmt_duration(d))
            };
            log::warn!(
                "worker {}: job {} ({}) attempt {} failed, retrying {when}: {msg}",
                shared.name,
                job.id,
                job.task,
                job.attempts()
            );
            (OutcomeKind::Retry, K::Retried, d, Some(msg))
        }
        Decision::Failed(msg) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            log::error!(
                "worker {}: job {} ({}) failed on attempt {}: {msg}",
                shared.name,
                job.id,
                job.task,
                job.attempts()
            );
            (
                final_kind(delete, OutcomeKind::Failed),
                K::Failed,
                Duration::ZERO,
                Some(msg),
            )
        }
        Decision::Cancelled(msg) => {
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
            log::info!(
                "worker {}: job {} ({}) cancelled by its task: {msg}",
                shared.name,
                job.id,
                job.task
            );
            (
                final_kind(delete, OutcomeKind::Cancelled),
                K::Cancelled,
                Duration::ZERO,
                Some(msg),
            )
        }
        Decision::Aborted(msg) => {
            stats.aborted.fetch_add(1, Ordering::Relaxed);
            log::info!(
                "worker {}: job {} ({}) {msg} after {}",
                shared.name,
                job.id,
                job.task,
                crate::error::fmt_duration(took)
            );
            (
                final_kind(delete, OutcomeKind::Aborted),
                K::Aborted,
                Duration::ZERO,
                Some(msg),
            )
        }
        Decision::Interrupted(msg) => {
            stats.interrupted.fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "worker {}: job {} ({}): {msg}; it goes back to the queue",
                shared.name,
                job.id,
                job.task
            );
            (
                OutcomeKind::Release,
                K::Interrupted,
                Duration::ZERO,
                Some(msg),
            )
        }
        Decision::Snooze(d) => {
            stats.snoozed.fetch_add(1, Ordering::Relaxed);
            log::debug!(
                "worker {}: job {} ({}) snoozed for {}",
                shared.name,
                job.id,
                job.task,
                crate::error::fmt_duration(d)
            );
            (OutcomeKind::Snooze, K::Snoozed, d, None)
        }
    };
    emit(shared, job, kind, took, error.as_deref());
    Outcome {
        key,
        kind: outcome,
        delay,
        error,
        output: if outcome == OutcomeKind::Succeeded {
            job.take_output()
        } else {
            None
        },
        ran: Some(took),
    }
}

/// A final outcome other than success, as `delete` makes it: deleted under
/// `DeleteJobs::Always`, with its kind kept for the statistics.
fn final_kind(delete: DeleteJobs, kind: OutcomeKind) -> OutcomeKind {
    match (delete, kind) {
        (DeleteJobs::Always, OutcomeKind::Failed) => OutcomeKind::DeleteFailed,
        (DeleteJobs::Always, OutcomeKind::Cancelled) => OutcomeKind::DeleteCancelled,
        (DeleteJobs::Always, OutcomeKind::Aborted) => OutcomeKind::DeleteAborted,
        _ => kind,
    }
}

fn emit(
    shared: &Shared,
    job: &Job,
    kind: super::JobEventKind,
    duration: Duration,
    error: Option<&str>,
) {
    super::observe::job_event(kind, &job.queue, &job.task, duration);
    if let Some(hook) = &shared.hook {
        let event = JobEvent {
            kind,
            job_id: job.id,
            task: &job.task,
            queue: &job.queue,
            attempt: job.attempts(),
            duration,
            error,
            worker: &shared.name,
        };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| hook.on_event(&event))) {
            log::error!(
                "worker {}: job hook panicked on job {} (ignored): {}",
                shared.name,
                job.id,
                panic_text(&p)
            );
        }
    }
}

/// A panic's message and its backtrace, as an attempt records them: the message cut so
/// that both fit in [`MAX_ERROR_BYTES`](crate::limits::MAX_ERROR_BYTES).
fn with_backtrace(message: &str, bt: &str) -> String {
    let room = crate::limits::MAX_ERROR_BYTES
        .saturating_sub(bt.len() + super::backtrace::MARK.len() + 64)
        .max(1024);
    let mut end = message.len().min(room);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < message.len() { "..." } else { "" };
    format!("{}{more}{}{bt}", &message[..end], super::backtrace::MARK)
}

fn panic_text(p: &Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-text panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RetryStrategy;

    #[test]
    fn a_job_runs_its_allowed_attempts_and_the_rescues_then_gives_up() {
        assert!(!past_rescues(3 + MAX_RESCUES, 3));
        assert!(past_rescues(4 + MAX_RESCUES, 3));
        // Retry for ever: no attempt is past it (the sum used to overflow).
        assert!(!past_rescues(u32::MAX, u32::MAX));
        assert!(!past_rescues(7, u32::MAX - 1));
    }

    #[test]
    fn errors_retry_while_the_strategy_allows() {
        let s = RetryStrategy::fixed(Duration::from_secs(2), 3);
        let e: TaskError = std::io::Error::other("boom").into();
        assert_eq!(
            decide(&e, 1, &s),
            Decision::Retry(Duration::from_secs(2), "boom".into())
        );
        assert_eq!(decide(&e, 3, &s), Decision::Failed("boom".into()));
    }

    #[test]
    fn explicit_actions_override_the_strategy_within_its_attempts() {
        let s = RetryStrategy::fixed(Duration::from_secs(2), 3);
        let e = TaskError::retry_in("later", Duration::from_secs(9));
        assert_eq!(
            decide(&e, 2, &s),
            Decision::Retry(Duration::from_secs(9), "later".into())
        );
        assert!(
            matches!(decide(&e, 3, &s), Decision::Failed(m) if m.contains("last the retry strategy allows"))
        );
        assert_eq!(
            decide(&TaskError::fail("no"), 1, &s),
            Decision::Failed("no".into())
        );
        assert_eq!(
            decide(&TaskError::cancel("stop"), 1, &s),
            Decision::Cancelled("stop".into())
        );
        let never = RetryStrategy::never();
        assert!(matches!(
            decide(&TaskError::retry("x"), 1, &never),
            Decision::Failed(_)
        ));
    }

    #[test]
    fn a_snooze_never_depends_on_the_attempts_left() {
        let never = RetryStrategy::never();
        let e = TaskError::snooze(Duration::from_secs(5));
        for attempt in [1, 2, 1000] {
            assert_eq!(
                decide(&e, attempt, &never),
                Decision::Snooze(Duration::from_secs(5))
            );
        }
    }

    #[test]
    fn panic_payloads_become_text() {
        let p = catch_unwind(|| panic!("kaput {}", 7)).unwrap_err();
        assert_eq!(panic_text(&p), "kaput 7");
        let p = catch_unwind(|| std::panic::panic_any(42u8)).unwrap_err();
        assert_eq!(panic_text(&p), "a non-text panic payload");
    }
}
