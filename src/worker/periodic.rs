//! The `postpone-periodic` thread: defers the instants of periodic schedules (those of the
//! worker's code and those stored in the database for its tasks), and prunes old finished
//! jobs when the worker was given a [`Retention`].
//!
//! Every worker runs it. It holds a connection only while it has something to do soon: an
//! instant to defer or a prune within the App's `pool_idle_timeout`; otherwise it closes
//! it, waits for that time (or a wake-up) without one, and connects again then. The
//! beat thread looks at the stored schedules of the worker's tasks every `poll_interval`
//! (their number and highest revision, [`check_stored`]) and wakes this thread when that
//! changed; it then reads the rows and follows them: a new or changed row starts afresh, a
//! paused or deleted one is dropped, an unchanged one keeps its place. A row with the (task,
//! id) of a schedule of the code replaces it while the row exists. A worker with schedules
//! in its code reads the stored rows before its first round, so a replaced schedule never
//! defers an instant. Stored schedules of tasks the worker does not register are never read.
//!
//! For each schedule it asks the database for the last instant already deferred (by any
//! worker) and resumes after it, or after the start of the catch-up window if that is
//! later (`resume_after`); a stored schedule never before its `since` (its creation, last
//! change of timing, or resume); a code schedule with no recorded instant (never deferred
//! anywhere) starts at its next instant after now, so its first start defers nothing from
//! the past. Then it defers the run-on-start job, if asked for, and wakes at each due
//! instant (and at least once a second, so that a clock that jumps is noticed) and defers
//! every instant that is due and still inside the schedule's catch-up window; instants that
//! fell out of the window (downtime, a long database outage) are skipped with a warning. See
//! `periodic.rs` for the exactly-once insert.
//!
//! Like every worker thread it owns one connection in the worker's watchdog group, logs
//! and retries every database error with capped backoff (an instant is only passed once it
//! is deferred or has left its window), stops on the `stop` channel, and is severed at the
//! shutdown's hard deadline if it is inside a round-trip.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{select, Receiver, Sender};

use super::link::Link;
use super::{Shared, WorkerBuilder, WorkerOptions};
use crate::admin::{rfc3339, NewSchedule};
use crate::conn::Connection;
use crate::error::{fmt_duration, Error, ErrorKind, Result};
use crate::periodic::{self, describe, Deferred, PeriodicOptions};
use crate::retention::{self, Retention};
use crate::retry::jitter_rand;
use crate::store;
use crate::task::{Registered, Tasks};
use crate::types::RawJson;

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

/// What the beat thread last saw of the stored schedules of this worker's tasks (their
/// number and highest revision), and the wake-up of the periodic thread when it changed.
#[derive(Debug)]
pub(crate) struct Watch {
    seen: Mutex<Option<Fingerprint>>,
    wake: (Sender<()>, Receiver<()>),
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            seen: Mutex::new(None),
            wake: crossbeam_channel::bounded(1),
        }
    }
}

/// (number of rows, highest revision) of the stored schedules of the worker's tasks.
type Fingerprint = (i64, i64);

impl Watch {
    fn seen(&self) -> Option<Fingerprint> {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The names of the worker's tasks, as the statements take them.
fn task_names(shared: &Shared) -> Vec<String> {
    shared.tasks.keys().cloned().collect()
}

/// The beat thread's check, every `poll_interval`: reads the fingerprint of the stored
/// schedules of this worker's tasks and wakes the periodic thread when it changed (and after
/// the first read).
pub(crate) fn check_stored(shared: &Shared, conn: &mut Connection) -> Result<()> {
    let names = task_names(shared);
    let rows = conn.query_cached(
        "checking the stored schedules",
        store::SCHEDULE_FINGERPRINT,
        &[&names],
    )?;
    let fp: Fingerprint = rows.first().map_or((0, 0), |r| (r.get(0), r.get(1)));
    let mut seen = shared
        .schedules
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if *seen != Some(fp) {
        *seen = Some(fp);
        let _ = shared.schedules.wake.0.try_send(());
    }
    Ok(())
}

/// Where a schedule comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The worker's code (`Tasks::periodic`).
    Code,
    /// A row of `postpone_schedules`, at this revision.
    Stored { revision: i64 },
}

/// A schedule as the thread tracks it.
pub(crate) struct Schedule {
    spec: PeriodicOptions,
    queue: String,
    priority: i32,
    origin: Origin,
    /// A stored schedule counts from here (its creation, last change of timing, or resume):
    /// no instant at or before it is deferred.
    since: Option<SystemTime>,
    /// A code schedule replaced by a stored one with its (task, id): not followed.
    replaced: bool,
    /// The next instant to defer; `None` before priming, or when the expression never
    /// matches again.
    next: Option<SystemTime>,
    primed: bool,
    /// The run-on-start job is deferred (or was not asked for).
    started: bool,
}

impl Schedule {
    fn new(
        tasks: &HashMap<String, Arc<Registered>>,
        spec: PeriodicOptions,
        origin: Origin,
    ) -> Self {
        let task = tasks.get(&spec.task).map(|t| &t.options);
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
            spec,
            origin,
            since: None,
            replaced: false,
            next: None,
            primed: false,
        }
    }

    fn key(&self) -> (&str, &str) {
        (&self.spec.task, &self.spec.id)
    }
}

/// The schedules of `tasks`, with their queue and priority resolved against the tasks'
/// defaults.
pub(crate) fn schedules(tasks: &Tasks) -> Vec<Schedule> {
    tasks
        .periodic
        .iter()
        .map(|spec| Schedule::new(&tasks.map, spec.clone(), Origin::Code))
        .collect()
}

/// A row of `postpone_schedules` as the worker reads it.
struct StoredRow {
    spec: std::result::Result<PeriodicOptions, String>,
    task: String,
    id: String,
    paused: bool,
    since: SystemTime,
    revision: i64,
}

fn read_stored(shared: &Shared, conn: &mut Connection) -> Result<Vec<StoredRow>> {
    let names = task_names(shared);
    let rows = conn.query_cached(
        "reading the stored schedules",
        store::SCHEDULE_READ,
        &[&names],
    )?;
    Ok(rows
        .iter()
        .map(|r| {
            let task: String = r.get(0);
            let id: String = r.get(1);
            let mut s = NewSchedule::new(task.clone(), r.get::<_, String>(2)).id(id.clone());
            if let Some(tz) = r.get::<_, Option<String>>(3) {
                s = s.time_zone(tz);
            }
            let args: RawJson = r.get(4);
            if let Some(q) = r.get::<_, Option<String>>(5) {
                s = s.queue(q);
            }
            if let Some(p) = r.get::<_, Option<i32>>(6) {
                s = s.priority(p);
            }
            if let Some(l) = r.get::<_, Option<String>>(7) {
                s = s.lock(l);
            }
            if let Some(l) = r.get::<_, Option<String>>(8) {
                s = s.queueing_lock(l);
            }
            let ms: i64 = r.get(9);
            s = s.catch_up(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
            let spec = s.to_options().map(|mut o| {
                o.args = args;
                o
            });
            StoredRow {
                spec,
                task,
                id,
                paused: r.get(10),
                since: r.get(11),
                revision: r.get(12),
            }
        })
        .collect())
}

/// Follows the stored rows: a stored schedule whose revision is unchanged keeps its state,
/// a new or changed one starts afresh; a code schedule with the (task, id) of a row is
/// replaced while the row exists (and primed again when it comes back).
fn apply_stored(shared: &Shared, schedules: &mut Vec<Schedule>, rows: Vec<StoredRow>) {
    for s in schedules.iter_mut().filter(|s| s.origin == Origin::Code) {
        let replaced = rows
            .iter()
            .any(|r| (r.task.as_str(), r.id.as_str()) == s.key());
        if s.replaced && !replaced {
            log::info!(
                "worker {}: periodic task {}: its stored schedule is gone; following the code's {:?} again",
                shared.name,
                describe(&s.spec.task, &s.spec.id),
                s.spec.expression
            );
            s.primed = false;
        } else if !s.replaced && replaced {
            log::info!(
                "worker {}: periodic task {}: a stored schedule replaces the code's",
                shared.name,
                describe(&s.spec.task, &s.spec.id)
            );
            // Its run-on-start job belongs to the start only: replaced then, it never runs.
            s.started = true;
        }
        s.replaced = replaced;
    }
    let (code, mut old): (Vec<Schedule>, Vec<Schedule>) = std::mem::take(schedules)
        .into_iter()
        .partition(|s| s.origin == Origin::Code);
    *schedules = code;
    for r in rows {
        if r.paused {
            continue;
        }
        let who = describe(&r.task, &r.id);
        let spec = match r.spec {
            Ok(spec) => spec,
            Err(p) => {
                log::warn!(
                    "worker {}: stored schedule {who} (revision {}) is not followed: {p}",
                    shared.name,
                    r.revision
                );
                continue;
            }
        };
        let origin = Origin::Stored {
            revision: r.revision,
        };
        if let Some(i) = old
            .iter()
            .position(|o| o.origin == origin && o.key() == (r.task.as_str(), r.id.as_str()))
        {
            schedules.push(old.swap_remove(i));
            continue;
        }
        log::info!(
            "worker {}: following stored schedule {who} {:?} (revision {})",
            shared.name,
            spec.expression,
            r.revision
        );
        let mut s = Schedule::new(&shared.tasks, spec, origin);
        s.since = Some(r.since);
        schedules.push(s);
    }
    for o in old {
        if !schedules
            .iter()
            .any(|s| s.key() == o.key() && s.origin != Origin::Code)
        {
            log::info!(
                "worker {}: stored schedule {} is paused, changed or deleted: no longer followed",
                shared.name,
                describe(&o.spec.task, &o.spec.id)
            );
        }
    }
}

/// True when the thread has schedules to follow or a retention: it wakes at least every
/// `max_sleep` (a clock that jumps is noticed), and keeps its connection while their next
/// instant or prune is near.
fn busy(schedules: &[Schedule], opts: &WorkerOptions) -> bool {
    schedules.iter().any(|s| !s.replaced) || opts.periodic.retention.is_some()
}

/// `ready` hears once the first round has read the clock (its instant is the start instant
/// of schedules that run on start): `spawn` waits for it, bounded.
pub(crate) fn run(
    shared: &Shared,
    mut schedules: Vec<Schedule>,
    stop: &Receiver<()>,
    ready: crossbeam_channel::Sender<()>,
) {
    let mut ready = Some(ready);
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
    let idle_close = shared.app.inner.pool.idle_timeout();
    let wake = shared.schedules.wake.1.clone();
    // The fingerprint of the stored rows this thread follows (`None`: none read yet).
    let mut applied: Option<Fingerprint> = None;
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
        if let Some(r) = ready.take() {
            let _ = r.try_send(());
        }
        let seen = shared.schedules.seen();
        let result = (|| -> Result<()> {
            // Before its first round a worker with schedules in its code reads the stored
            // ones itself: one of them may replace (or pause) a schedule of its code.
            let first = applied.is_none() && !schedules.is_empty();
            if first || (seen.is_some() && seen != applied) {
                let has_rows = seen.is_none_or(|(n, _)| n > 0);
                let follows = schedules
                    .iter()
                    .any(|s| s.origin != Origin::Code || s.replaced);
                let rows = if first || has_rows || follows {
                    read_stored(shared, link.connection()?)?
                } else {
                    Vec::new()
                };
                let fp = (
                    i64::try_from(rows.len()).unwrap_or(i64::MAX),
                    rows.iter().map(|r| r.revision).max().unwrap_or(0),
                );
                apply_stored(shared, &mut schedules, rows);
                applied = Some(fp);
            }
            defer_due(shared, &mut link, &mut schedules, now)?;
            match (&settings.retention, next_prune) {
                (Some(r), Some(at)) if Instant::now() >= at => {
                    prune(shared, &mut link, r)?;
                    next_prune = Some(Instant::now() + r.interval);
                    Ok(())
                }
                _ => Ok(()),
            }
        })();
        if result.is_err() && shared.stopping() {
            return;
        }
        let busy = busy(&schedules, &shared.opts);
        let wait = match link.judge(result) {
            Ok(()) => {
                // The next instant to defer or prune, from now (`None`: none).
                let work = schedules
                    .iter()
                    .filter(|s| !s.replaced)
                    .filter_map(|s| s.next)
                    .map(|next| next.duration_since(now).unwrap_or(Duration::ZERO))
                    .chain(next_prune.map(|at| at.saturating_duration_since(Instant::now())))
                    .min();
                // Nothing to defer or prune within the App's pool_idle_timeout: no
                // connection held until there is (a schedule of an hour, a retention's
                // prune every few minutes: the thread connects when the time comes).
                if !busy || work.is_none_or(|d| d >= idle_close) {
                    link.close();
                }
                let wait = if busy { max_sleep } else { IDLE_WAIT };
                work.map_or(wait, |d| wait.min(d))
            }
            Err(wait) => wait,
        };
        select! {
            recv(stop) -> _ => return,
            recv(wake) -> _ => {},
            default(wait) => {},
        }
    }
}

/// How long an idle periodic thread (nothing to defer or prune) waits without a wake-up.
const IDLE_WAIT: Duration = Duration::from_secs(60);

/// How far ahead of a worker's clock a periodic task's last deferred instant may lie and
/// still be believed (see `defer_due`).
const PERIODIC_SKEW: Duration = Duration::from_secs(60);

/// Where a schedule being primed resumes: the instants strictly after the returned time
/// are deferred. `latest` is its last deferred instant (by any worker), `since` the time a
/// stored schedule counts from. Without either, it starts now (a code schedule never
/// deferred anywhere defers nothing from a past in which it did not exist); otherwise after
/// the later of the two, but not before the start of its catch-up window. A time more than
/// [`PERIODIC_SKEW`] after `now` (a clock far ahead, a row written by hand) is not believed:
/// it starts now, and the flag says so.
fn resume_after(
    latest: Option<SystemTime>,
    since: Option<SystemTime>,
    now: SystemTime,
    catch_up: Duration,
) -> (SystemTime, bool) {
    let window_start = now.checked_sub(catch_up).unwrap_or(now);
    let base = match (latest, since) {
        (None, None) => return (now, false),
        (Some(l), None) => l,
        (None, Some(s)) => s,
        (Some(l), Some(s)) => l.max(s),
    };
    if base > now + PERIODIC_SKEW {
        (now, true)
    } else {
        (base.max(window_start), false)
    }
}

/// Primes the schedules not primed yet, then defers every due instant inside its window.
fn defer_due(
    shared: &Shared,
    link: &mut Link<'_>,
    schedules: &mut [Schedule],
    now: SystemTime,
) -> Result<()> {
    for s in schedules.iter_mut().filter(|s| !s.replaced) {
        let window_start = now.checked_sub(s.spec.catch_up).unwrap_or(now);
        // Primed before the run-on-start job is recorded: that record is no instant of the
        // schedule, and read first it would hide the instants missed before it.
        if !s.primed {
            let c = link.connection()?;
            let latest = periodic::latest_instant(c, &s.spec)?;
            let (from, skewed) = resume_after(latest, s.since, now, s.spec.catch_up);
            if skewed {
                log::warn!(
                    "worker {}: periodic task {}: its last deferred instant or start lies more than {} ahead of this worker's clock ({}); scheduling from now",
                    shared.name,
                    describe(&s.spec.task, &s.spec.id),
                    fmt_duration(PERIODIC_SKEW),
                    rfc3339(now)
                );
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_schedule_resumes_after_its_last_instant_its_start_and_its_window() {
        let now = at(100_000);
        let w = Duration::from_secs(600);
        // Code schedule never deferred: starts now.
        assert_eq!(resume_after(None, None, now, w), (now, false));
        // Deferred 5 minutes ago: catches up from there; a day ago: from the window.
        assert_eq!(
            resume_after(Some(at(99_700)), None, now, w),
            (at(99_700), false)
        );
        assert_eq!(
            resume_after(Some(at(10_000)), None, now, w),
            (at(99_400), false)
        );
        // Stored schedule created 2 s ago, never deferred: its instants since then.
        assert_eq!(
            resume_after(None, Some(at(99_998)), now, w),
            (at(99_998), false)
        );
        // Resumed after a long pause: the instants of the pause are not caught up.
        assert_eq!(
            resume_after(Some(at(50_000)), Some(at(99_999)), now, w),
            (at(99_999), false)
        );
        // Stored a day ago, never deferred (no worker knew the task): only its window.
        assert_eq!(
            resume_after(None, Some(at(10_000)), now, w),
            (at(99_400), false)
        );
        // A record or start far ahead of this clock is not believed.
        assert_eq!(resume_after(Some(at(200_000)), None, now, w), (now, true));
        assert_eq!(
            resume_after(None, Some(at(100_030)), now, w),
            (at(100_030), false)
        );
    }
}
