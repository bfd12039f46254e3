//! Periodic tasks: cron schedules registered with [`Tasks::periodic`], and the deferral of
//! one scheduled instant.
//!
//! A schedule is a cron expression read by the `croner` crate: 5 fields (minute, hour, day
//! of month, month, day of week), or 6 with a leading seconds field, or one of the aliases
//! `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`), `@hourly`.
//! Instants are computed in UTC.
//!
//! Every worker that was given the schedule defers its jobs (from its `postpone-periodic`
//! thread, see `worker/periodic.rs`). Each instant is deferred exactly once across all
//! workers and hosts: the job is inserted by the same statement that records the instant in
//! `postpone_periodic`, whose primary key is (task, periodic id, instant); a worker that
//! comes second inserts nothing. After downtime, missed instants are deferred only if they
//! are younger than the schedule's catch-up window (10 minutes by default); older ones are
//! skipped with a log line, never deferred as a flood.
//!
//! A schedule registered with a queueing lock skips an instant (recording it with no job)
//! while a job of that queueing lock is still waiting: a slow periodic task then never
//! piles up.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Serialize;

use crate::conn::Connection;
use crate::error::{fmt_duration, Result};
use crate::job::{JobId, RawJson};
use crate::store;
use crate::task::Tasks;

/// The catch-up window of a schedule unless [`PeriodicOptions::catch_up`] says otherwise.
pub(crate) const DEFAULT_CATCH_UP: Duration = Duration::from_secs(10 * 60);

/// The longest catch-up window accepted. Retention never prunes the records of periodic
/// instants younger than [`PERIODIC_KEEP_MIN`], which must stay longer than this, or an
/// instant could be deferred twice.
pub(crate) const MAX_CATCH_UP: Duration = Duration::from_secs(24 * 3600);

/// Records of deferred instants are kept at least this long, whatever the retention.
pub(crate) const PERIODIC_KEEP_MIN: Duration = Duration::from_secs(2 * 24 * 3600);

/// A periodic schedule of a task; returned by [`Tasks::periodic`] to adjust.
///
/// ```
/// use std::time::Duration;
/// use postpone::Tasks;
/// use serde_json::json;
///
/// let mut tasks = Tasks::new();
/// tasks.register("cleanup", |_job| Ok(()));
/// // Every 5 minutes, with fixed arguments.
/// tasks.periodic("cleanup", "*/5 * * * *").args(&json!({"table": "sessions"}));
/// // The same task on a second schedule needs its own id.
/// tasks
///     .periodic("cleanup", "@daily")
///     .id("nightly")
///     .args(&json!({"table": "audit", "vacuum": true}))
///     .queue("maintenance")
///     .catch_up(Duration::from_secs(3600));
/// // A 6-field expression starts with seconds: every 30 seconds.
/// tasks.periodic("cleanup", "*/30 * * * * *").id("fast");
/// ```
#[derive(Clone)]
pub struct PeriodicOptions {
    pub(crate) task: String,
    pub(crate) expression: String,
    pub(crate) cron: Option<Cron>,
    pub(crate) id: String,
    pub(crate) args: RawJson,
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<i32>,
    pub(crate) lock: Option<String>,
    pub(crate) queueing_lock: Option<String>,
    pub(crate) catch_up: Duration,
    pub(crate) problems: Vec<String>,
}

impl fmt::Debug for PeriodicOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeriodicOptions")
            .field("task", &self.task)
            .field("schedule", &self.expression)
            .field("id", &self.id)
            .field("args", &self.args.0)
            .field("queue", &self.queue)
            .field("catch_up", &self.catch_up)
            .finish_non_exhaustive()
    }
}

impl PeriodicOptions {
    /// Tells apart several schedules of one task; the pair (task, id) must be unique among
    /// the schedules of a worker, and the same on every worker that defers it. Defaults to
    /// the empty string.
    pub fn id(&mut self, id: impl Into<String>) -> &mut PeriodicOptions {
        self.id = id.into();
        self
    }

    /// The arguments every job of this schedule gets, serialized now (a value that does not
    /// serialize is reported when the worker is spawned). Defaults to JSON `null`.
    pub fn args<A: Serialize + ?Sized>(&mut self, args: &A) -> &mut PeriodicOptions {
        match crate::app::serialize_args(args) {
            Ok(json) => self.args = json,
            Err(e) => self.problems.push(format!(
                "periodic task {}: {e}",
                describe(&self.task, &self.id)
            )),
        }
        self
    }

    /// The queue of its jobs. Defaults to the task's default queue
    /// ([`TaskOptions::queue`](crate::TaskOptions::queue)), or `"default"`.
    pub fn queue(&mut self, queue: impl Into<String>) -> &mut PeriodicOptions {
        self.queue = Some(queue.into());
        self
    }

    /// The priority of its jobs. Defaults to the task's default priority, or 0.
    pub fn priority(&mut self, priority: i32) -> &mut PeriodicOptions {
        self.priority = Some(priority);
        self
    }

    /// The lock of its jobs (at most one running at a time, in order). Defaults to none.
    pub fn lock(&mut self, lock: impl Into<String>) -> &mut PeriodicOptions {
        self.lock = Some(lock.into());
        self
    }

    /// The queueing lock of its jobs: while a job of this schedule still waits (`todo`),
    /// later instants are skipped instead of queued behind it. Defaults to none.
    pub fn queueing_lock(&mut self, lock: impl Into<String>) -> &mut PeriodicOptions {
        self.queueing_lock = Some(lock.into());
        self
    }

    /// How old a missed instant may be and still be deferred when a worker gets to it
    /// (after downtime, or a database outage). Older instants are skipped. At most a day.
    /// Defaults to 10 minutes.
    pub fn catch_up(&mut self, window: Duration) -> &mut PeriodicOptions {
        self.catch_up = window;
        self
    }

    /// The task name.
    pub fn task(&self) -> &str {
        &self.task
    }

    /// The cron expression as given.
    pub fn schedule(&self) -> &str {
        &self.expression
    }

    /// The first instant of the schedule strictly after `t`, or `None` if the expression is
    /// invalid or never matches again.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// let mut tasks = postpone::Tasks::new();
    /// let every5 = tasks.periodic("t", "*/5 * * * *");
    /// let t = UNIX_EPOCH + Duration::from_secs(60); // 00:01:00 UTC
    /// assert_eq!(every5.next_after(t), Some(UNIX_EPOCH + Duration::from_secs(300)));
    /// ```
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        next_after(self.cron.as_ref()?, t)
    }

    /// Everything wrong with this schedule, for the worker's validation.
    pub(crate) fn check(&self, tasks: &Tasks) -> Vec<String> {
        let mut out = self.problems.clone();
        let who = describe(&self.task, &self.id);
        if !tasks.map.contains_key(&self.task) {
            out.push(format!(
                "periodic task {who}: no task {:?} is registered",
                self.task
            ));
        }
        if self.catch_up > MAX_CATCH_UP {
            out.push(format!(
                "periodic task {who}: catch_up of {} is longer than the 24h allowed",
                fmt_duration(self.catch_up)
            ));
        }
        for (what, v) in [
            ("queue", self.queue.as_deref()),
            ("lock", self.lock.as_deref()),
            ("queueing lock", self.queueing_lock.as_deref()),
        ] {
            if v.is_some_and(|s| s.trim().is_empty() || s.contains('\0')) {
                out.push(format!(
                    "periodic task {who}: invalid {what} {v:?}: it must be non-empty text without NUL"
                ));
            }
        }
        if self.id.contains('\0') {
            out.push(format!(
                "periodic task {who}: its id contains a NUL character"
            ));
        }
        out
    }
}

/// `"task"` or `"task" (id "x")`, for messages.
pub(crate) fn describe(task: &str, id: &str) -> String {
    if id.is_empty() {
        format!("{task:?}")
    } else {
        format!("{task:?} (id {id:?})")
    }
}

impl Tasks {
    /// Defers `task` on a cron schedule, from every worker given these tasks; each instant
    /// is deferred exactly once, whatever the number of workers and hosts. The task must be
    /// registered in this registry too. A malformed expression is reported when the worker
    /// is spawned (registering never panics).
    ///
    /// `schedule` has 5 fields (`minute hour day-of-month month day-of-week`, as in crontab),
    /// or 6 with a leading seconds field, or is one of `@yearly`, `@annually`, `@monthly`,
    /// `@weekly`, `@daily`, `@midnight`, `@hourly`. Ranges, steps, lists and names
    /// (`MON-FRI`, `JAN`) are accepted, as are `L`, `W` and `#`. Times are UTC.
    ///
    /// See [`PeriodicOptions`] for the arguments, id, queue and catch-up window.
    pub fn periodic(&mut self, task: impl Into<String>, schedule: &str) -> &mut PeriodicOptions {
        let task = task.into();
        let mut problems = Vec::new();
        let cron = match parse(schedule) {
            Ok(c) => Some(c),
            Err(e) => {
                problems.push(format!("periodic task {task:?}: {e}"));
                None
            }
        };
        self.periodic.push(PeriodicOptions {
            task,
            expression: schedule.to_owned(),
            cron,
            id: String::new(),
            args: RawJson("null".into()),
            queue: None,
            priority: None,
            lock: None,
            queueing_lock: None,
            catch_up: DEFAULT_CATCH_UP,
            problems,
        });
        self.periodic.last_mut().expect("just pushed")
    }
}

/// Parses a cron expression: 5 or 6 fields, or an alias.
pub(crate) fn parse(expression: &str) -> std::result::Result<Cron, String> {
    let text = expression.trim();
    let text = if text.eq_ignore_ascii_case("@midnight") {
        "@daily"
    } else {
        text
    };
    if text.is_empty() {
        return Err("invalid cron schedule \"\": it is empty".into());
    }
    if text.starts_with('@') && !is_alias(text) {
        return Err(format!(
            "invalid cron schedule {expression:?}: unknown alias (use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"
        ));
    }
    let fields = text.split_whitespace().count();
    if !text.starts_with('@') && !(5..=6).contains(&fields) {
        return Err(format!(
            "invalid cron schedule {expression:?}: expected 5 fields (minute hour day month weekday) or 6 with leading seconds, got {fields}"
        ));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(text)
        .map_err(|e| format!("invalid cron schedule {expression:?}: {e}"))?;
    // An expression that can never match (February 30th) is refused now rather than
    // searched for at every tick.
    let probe = DateTime::from_timestamp(1_700_000_000, 0).expect("in range");
    if cron.find_next_occurrence(&probe, false).is_err() {
        return Err(format!(
            "invalid cron schedule {expression:?}: it never matches a real date"
        ));
    }
    Ok(cron)
}

fn is_alias(text: &str) -> bool {
    [
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@hourly",
    ]
    .iter()
    .any(|a| a.eq_ignore_ascii_case(text))
}

fn to_utc(t: SystemTime) -> Option<DateTime<Utc>> {
    let d = t.duration_since(UNIX_EPOCH).ok()?;
    DateTime::from_timestamp(i64::try_from(d.as_secs()).ok()?, 0)
}

fn from_utc(t: DateTime<Utc>) -> Option<SystemTime> {
    let secs = u64::try_from(t.timestamp()).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// The first instant of `cron` strictly after `t` (instants are whole seconds).
pub(crate) fn next_after(cron: &Cron, t: SystemTime) -> Option<SystemTime> {
    let from = to_utc(t)?;
    from_utc(cron.find_next_occurrence(&from, false).ok()?)
}

/// What deferring one instant did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deferred {
    /// This call inserted the job.
    Job(JobId),
    /// This call recorded the instant but inserted no job: one of its queueing lock waits.
    Skipped,
    /// Another worker had deferred the instant already.
    AlreadyDone,
}

/// Defers the instant `at` of `spec` (and records it) in one statement; see the module
/// docs. `queue` and `priority` are the resolved defaults.
pub(crate) fn defer_instant(
    conn: &mut Connection,
    spec: &PeriodicOptions,
    queue: &str,
    priority: i32,
    at: SystemTime,
) -> Result<Deferred> {
    let res = conn.query_cached(
        "deferring a periodic task",
        store::PERIODIC_DEFER,
        &[
            &spec.task,
            &spec.id,
            &at,
            &queue,
            &spec.args,
            &priority,
            &spec.lock,
            &spec.queueing_lock,
        ],
    );
    match res {
        Ok(rows) => Ok(match rows.first() {
            None => Deferred::AlreadyDone,
            Some(r) => match r.get::<_, Option<i64>>(0) {
                Some(id) => {
                    crate::metrics::deferred(&spec.task);
                    Deferred::Job(JobId(id))
                }
                None => Deferred::Skipped,
            },
        }),
        // Two workers raced for the instant: the loser's whole statement (its job
        // included) is rolled back by the primary key.
        Err(e) if e.sqlstate() == Some("23505") && e.constraint() == Some(store::PERIODIC_PKEY) => {
            Ok(Deferred::AlreadyDone)
        }
        Err(e) => Err(e),
    }
}

/// The most recent instant of (task, id) already deferred, if any.
pub(crate) fn latest_instant(
    conn: &mut Connection,
    spec: &PeriodicOptions,
) -> Result<Option<SystemTime>> {
    let rows = conn.query_cached(
        "reading the last periodic instant",
        store::PERIODIC_LATEST,
        &[&spec.task, &spec.id],
    )?;
    Ok(rows.first().and_then(|r| r.get(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn five_fields_six_fields_and_aliases() {
        // 2023-11-14T22:13:20Z
        let t = at(1_700_000_000);
        let every5 = parse("*/5 * * * *").unwrap();
        assert_eq!(next_after(&every5, t), Some(at(1_700_000_100))); // 22:15:00
        let secs = parse("*/20 * * * * *").unwrap();
        assert_eq!(next_after(&secs, t), Some(at(1_700_000_020))); // 22:13:40
        let hourly = parse("@hourly").unwrap();
        assert_eq!(next_after(&hourly, t), Some(at(1_700_002_800))); // 23:00:00
        let daily = parse("@DAILY").unwrap();
        let midnight = parse("@midnight").unwrap();
        assert_eq!(next_after(&daily, t), Some(at(1_700_006_400))); // next day 00:00
        assert_eq!(next_after(&midnight, t), next_after(&daily, t));
        // Strictly after: an instant is not its own successor.
        assert_eq!(
            next_after(&every5, at(1_700_000_100)),
            Some(at(1_700_000_400))
        );
        // Sub-second times round down to their second.
        let just_after = at(1_700_000_100) + Duration::from_millis(400);
        assert_eq!(next_after(&every5, just_after), Some(at(1_700_000_400)));
        // Names and weekdays, POSIX style (0 and 7 are Sunday).
        let weekdays = parse("0 9 * * MON-FRI").unwrap();
        // 2023-11-14 is a Tuesday: next is Wednesday 09:00.
        assert_eq!(next_after(&weekdays, t), Some(at(1_700_038_800)));
    }

    #[test]
    fn bad_expressions_are_explained() {
        for (bad, says) in [
            ("", "it is empty"),
            ("* * * *", "expected 5 fields"),
            ("0 0 0 1 1 * 2030", "expected 5 fields"),
            ("0 0 1 1 * 2030", "out of bounds"),
            ("61 * * * *", "invalid cron schedule"),
            ("@reboot", "unknown alias"),
            ("0 0 30 2 *", "never matches"),
            ("x * * * *", "invalid cron schedule"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn registration_records_problems_instead_of_panicking() {
        let mut tasks = Tasks::new();
        tasks.register("a", |_| Ok(()));
        tasks.periodic("a", "nonsense");
        tasks.periodic("b", "@hourly");
        tasks
            .periodic("a", "@hourly")
            .catch_up(Duration::from_secs(2 * 86400))
            .queue(" ");
        let p: Vec<Vec<String>> = tasks.periodic.iter().map(|s| s.check(&tasks)).collect();
        assert!(
            p[0][0].contains("invalid cron schedule \"nonsense\""),
            "{p:?}"
        );
        assert!(p[1][0].contains("no task \"b\" is registered"), "{p:?}");
        assert!(
            p[2].iter().any(|m| m.contains("longer than the 24h")),
            "{p:?}"
        );
        assert!(p[2].iter().any(|m| m.contains("invalid queue")), "{p:?}");
        let ok = tasks.periodic("a", "@hourly").id("x").clone();
        assert_eq!(ok.args.0, "null");
        assert_eq!(ok.catch_up, DEFAULT_CATCH_UP);
        assert!(ok.check(&tasks).is_empty());
        assert!(PERIODIC_KEEP_MIN > MAX_CATCH_UP);
    }
}
