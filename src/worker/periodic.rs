//! The `postpone-periodic` thread: defers the instants of periodic schedules, and prunes
//! old finished jobs when the worker was given a [`Retention`].
//!
//! It runs only when there is something to do (a schedule, or a retention). At start, and
//! for each schedule, it asks the database for the last instant already deferred (by any
//! worker) and resumes after it, or after the start of the catch-up window if that is
//! later; a schedule with no recorded instant (never deferred anywhere) starts at its next
//! instant after now, so its first start defers nothing from the past. Then it defers the
//! run-on-start job, if asked for, and wakes at each due instant (and at least once a
//! second, so that a clock that jumps is noticed) and defers every instant that is due and
//! still inside the schedule's catch-up window; instants that fell out of the window
//! (downtime, a long database outage) are skipped with a warning. See `periodic.rs` for the
//! exactly-once insert.
//!
//! Like every worker thread it owns one connection in the worker's watchdog group, logs
//! and retries every database error with capped backoff (an instant is only passed once it
//! is deferred or has left its window), stops on the `stop` channel, and is severed at the
//! shutdown's hard deadline if it is inside a round-trip.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Receiver;

use super::link::Link;
use super::{sleep_or_stop, Shared, WorkerBuilder, WorkerOptions};
use crate::admin::rfc3339;
use crate::error::{fmt_duration, Error, ErrorKind, Result};
use crate::periodic::{self, describe, Deferred, PeriodicOptions};
use crate::retention::{self, Retention};
use crate::retry::jitter_rand;
use crate::task::Tasks;

/// Longest sleep with the system clock: a wall clock that jumps is noticed within this.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Longest sleep with an injected clock, which tests move at will.
const MAX_SLEEP_INJECTED: Duration = Duration::from_millis(20);

/// A source of the current time, replaceable for tests.
pub(crate) type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The worker options of this thread.
#[derive(Clone, Default)]
pub(crate) struct PeriodicSettings {
    pub(crate) retention: Option<Retention>,
    pub(crate) clock: Option<Clock>,
}

impl fmt::Debug for PeriodicSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeriodicSettings")
            .field("retention", &self.retention)
            .field("clock", &self.clock.as_ref().map(|_| "injected"))
            .finish()
    }
}

impl WorkerBuilder {
    /// Deletes old finished jobs every [`Retention::interval`] (5 minutes by default), in
    /// batches, from this worker's `postpone-periodic` thread. Several workers may prune at
    /// once: they skip each other's rows. Defaults to keeping every finished job.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.opts.periodic.retention = Some(retention);
        self
    }

    /// Replaces the clock that periodic schedules read, for tests that drive time (feature
    /// `test-util`). Defaults to the system clock.
    #[cfg(feature = "test-util")]
    pub fn periodic_clock(
        mut self,
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> Self {
        self.opts.periodic.clock = Some(Arc::new(clock));
        self
    }
}

/// Checks the schedules and the retention of a worker being built.
pub(crate) fn validate(tasks: &Tasks, opts: &WorkerOptions) -> Result<()> {
    let mut problems = Vec::new();
    for (i, spec) in tasks.periodic.iter().enumerate() {
        problems.extend(spec.check(|t| tasks.contains(t)));
        let dup = tasks.periodic[..i]
            .iter()
            .any(|o| o.task == spec.task && o.id == spec.id);
        if dup {
            problems.push(format!(
                "periodic task {} is registered twice: give each schedule of a task its own .id(..)",
                describe(&spec.task, &spec.id)
            ));
        }
    }
    if let Some(p) = problems.first() {
        return Err(Error::new(
            ErrorKind::Config,
            format!("invalid task registry: {p}"),
        ));
    }
    if let Some(r) = &opts.periodic.retention {
        r.validate()
            .map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
    }
    Ok(())
}

/// A schedule as the thread tracks it.
pub(crate) struct Schedule {
    spec: PeriodicOptions,
    queue: String,
    priority: i32,
    /// The next instant to defer; `None` before priming, or when the expression never
    /// matches again.
    next: Option<SystemTime>,
    primed: bool,
    /// The run-on-start job is deferred (or was not asked for).
    started: bool,
}

/// The schedules of `tasks`, with their queue and priority resolved against the tasks'
/// defaults.
pub(crate) fn schedules(tasks: &Tasks) -> Vec<Schedule> {
    tasks
        .periodic
        .iter()
        .map(|spec| {
            let task = tasks.map.get(&spec.task).map(|t| &t.options);
            Schedule {
                queue: spec
                    .queue
                    .clone()
                    .or_else(|| task.and_then(|t| t.queue.clone()))
                    .unwrap_or_else(|| "default".to_owned()),
                priority: spec
                    .priority
                    .or_else(|| task.and_then(|t| t.priority))
                    .unwrap_or(0),
                started: !spec.run_on_start,
                spec: spec.clone(),
                next: None,
                primed: false,
            }
        })
        .collect()
}

/// True when the worker needs this thread.
pub(crate) fn needed(schedules: &[Schedule], opts: &WorkerOptions) -> bool {
    !schedules.is_empty() || opts.periodic.retention.is_some()
}

pub(crate) fn run(shared: &Shared, mut schedules: Vec<Schedule>, stop: &Receiver<()>) {
    let settings = shared.opts.periodic.clone();
    let now_fn = || {
        settings
            .clock
            .as_ref()
            .map_or_else(SystemTime::now, |c| c())
    };
    let max_sleep = if settings.clock.is_some() {
        MAX_SLEEP_INJECTED
    } else {
        MAX_SLEEP
    };
    let mut next_prune = settings
        .retention
        .as_ref()
        .map(|r| Instant::now() + r.interval.mul_f64(jitter_rand()));
    let mut link = Link::new(shared, "periodic tasks and retention");
    if !schedules.is_empty() {
        log::info!(
            "worker {}: deferring {} periodic schedule(s): {}",
            shared.name,
            schedules.len(),
            schedules
                .iter()
                .map(|s| format!(
                    "{} {:?}",
                    describe(&s.spec.task, &s.spec.id),
                    s.spec.expression
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    loop {
        if shared.stopping() {
            return;
        }
        // The clock is read once per round (tests count the reads).
        let now = now_fn();
        let result = defer_due(shared, &mut link, &mut schedules, now).and_then(|()| {
            match (&settings.retention, next_prune) {
                (Some(r), Some(at)) if Instant::now() >= at => {
                    prune(shared, &mut link, r)?;
                    next_prune = Some(Instant::now() + r.interval);
                    Ok(())
                }
                _ => Ok(()),
            }
        });
        if result.is_err() && shared.stopping() {
            return;
        }
        let wait = match link.judge(result) {
            Ok(()) => {
                let mut wait = max_sleep;
                for s in &schedules {
                    if let Some(next) = s.next {
                        wait = wait.min(next.duration_since(now).unwrap_or(Duration::ZERO));
                    }
                }
                if let Some(at) = next_prune {
                    wait = wait.min(at.saturating_duration_since(Instant::now()));
                }
                wait
            }
            Err(wait) => wait,
        };
        if sleep_or_stop(stop, wait) {
            return;
        }
    }
}

/// How far ahead of a worker's clock a periodic task's last deferred instant may lie and
/// still be believed (see `defer_due`).
const PERIODIC_SKEW: Duration = Duration::from_secs(60);

/// Primes the schedules not primed yet, then defers every due instant inside its window.
fn defer_due(
    shared: &Shared,
    link: &mut Link<'_>,
    schedules: &mut [Schedule],
    now: SystemTime,
) -> Result<()> {
    for s in schedules.iter_mut() {
        let window_start = now.checked_sub(s.spec.catch_up).unwrap_or(now);
        // Primed before the run-on-start job is recorded: that record is no instant of the
        // schedule, and read first it would hide the instants missed before it.
        if !s.primed {
            let c = link.connection()?;
            let latest = periodic::latest_instant(c, &s.spec)?;
            let from = match latest {
                // Never deferred (by any worker): the schedule starts now, at its next
                // instant. Its catch-up window looks back from a recorded instant only,
                // never into a past in which the schedule did not exist.
                None => now,
                // A record more than a minute after now: a worker whose clock runs far
                // ahead, or a row written by hand (at 'infinity' or in the year 3000, it
                // would stop the schedule for good). The schedule starts as if there were
                // no record; an instant already deferred is recognised by its record. A
                // record less far ahead (clocks a little apart) counts as usual.
                Some(l) if l > now + PERIODIC_SKEW => {
                    log::warn!(
                        "worker {}: periodic task {}: its last deferred instant {} lies more than {} ahead of this worker's clock ({}); scheduling as if it had none",
                        shared.name,
                        describe(&s.spec.task, &s.spec.id),
                        rfc3339(l),
                        fmt_duration(PERIODIC_SKEW),
                        rfc3339(now)
                    );
                    now
                }
                // Deferred before: the instants missed since, inside the window.
                Some(l) if l > window_start => l,
                Some(_) => window_start,
            };
            s.next = s.spec.next_after(from);
            s.primed = true;
            log::debug!(
                "worker {}: periodic task {}: last deferred instant {}, next {}",
                shared.name,
                describe(&s.spec.task, &s.spec.id),
                latest.map_or_else(|| "none".to_owned(), rfc3339),
                s.next.map_or_else(|| "never".to_owned(), rfc3339),
            );
        }
        if !s.started {
            // Its instant is the start time, to the second (instants are whole seconds).
            let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
            let at = UNIX_EPOCH + Duration::from_secs(secs);
            let c = link.connection()?;
            let who = describe(&s.spec.task, &s.spec.id);
            let done = periodic::defer_instant(c, &s.spec, &s.queue, s.priority, at)
                .map_err(|e| e.context(format_args!("periodic task {who}: run on start")))?;
            log::info!(
                "worker {}: periodic task {who}: run on start at {}: {done:?}",
                shared.name,
                rfc3339(at)
            );
            s.started = true;
        }
        while let Some(at) = s.next {
            if at > now {
                break;
            }
            if at < window_start {
                let resume = s.spec.next_after(window_start);
                log::warn!(
                    "worker {}: periodic task {}: skipping instants from {} to before {} (older than its {} catch-up window)",
                    shared.name,
                    describe(&s.spec.task, &s.spec.id),
                    rfc3339(at),
                    rfc3339(window_start),
                    fmt_duration(s.spec.catch_up)
                );
                s.next = resume;
                continue;
            }
            let c = link.connection()?;
            let who = describe(&s.spec.task, &s.spec.id);
            match periodic::defer_instant(c, &s.spec, &s.queue, s.priority, at)
                .map_err(|e| e.context(format_args!("periodic task {who} at {}", rfc3339(at))))?
            {
                Deferred::Job(id) => log::info!(
                    "worker {}: periodic task {who}: deferred job {id} for {}",
                    shared.name,
                    rfc3339(at)
                ),
                Deferred::Skipped => log::info!(
                    "worker {}: periodic task {who}: skipped {} (a job of its queueing lock is still waiting)",
                    shared.name,
                    rfc3339(at)
                ),
                Deferred::AlreadyDone => log::debug!(
                    "worker {}: periodic task {who}: {} was deferred by another worker",
                    shared.name,
                    rfc3339(at)
                ),
            }
            s.next = s.spec.next_after(at);
        }
    }
    Ok(())
}

fn prune(shared: &Shared, link: &mut Link<'_>, r: &Retention) -> Result<()> {
    let c = link.connection()?;
    let report = retention::prune(c, r, || !shared.stopping())?;
    if report.jobs_deleted > 0 || report.periodic_deleted > 0 {
        log::info!(
            "worker {}: retention ({} and older): {report}",
            shared.name,
            fmt_duration(r.older_than)
        );
    }
    Ok(())
}
