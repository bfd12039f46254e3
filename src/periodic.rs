//! Periodic tasks: the registry of cron schedules ([`Schedules`], which a [`Tasks`](crate::Tasks)
//! holds next to its tasks and fills through [`Tasks::periodic`](crate::Tasks::periodic)), and
//! the deferral of one scheduled instant.
//!
//! A schedule is a cron expression read by the `croner` crate: 5 fields (minute, hour, day
//! of month, month, day of week), or 6 with a leading seconds field, or one of the aliases
//! `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`), `@hourly`.
//! Instants are computed in UTC, or in the schedule's [time zone](PeriodicOptions::time_zone)
//! (IANA names, read with `jiff` from the system's time zone database).
//!
//! In a time zone, the expression matches wall-clock times, and each matching wall-clock
//! time is deferred once. Across daylight saving changes this means: a time that falls in
//! a skipped hour (02:30 on a spring-forward night) is deferred at the end of the gap (03:00
//! in the new offset), once however many times of the gap match; a time that occurs twice
//! (01:30 on a fall-back night) is deferred at its first occurrence only. So a daily job runs
//! once every day, and a job every 15 minutes does not run during the repeated hour's second
//! pass: schedules that must run at a fixed real-time interval are best left in UTC.
//!
//! Every worker that was given the schedule defers its jobs (from its `postpone-periodic`
//! thread, see `worker/periodic.rs`). Each instant is deferred exactly once across all
//! workers and hosts: the job is inserted by the same statement that records the instant in
//! `postpone_periodic`, whose primary key is (task, periodic id, instant); a worker that
//! comes second inserts nothing. After downtime, missed instants are deferred only if they
//! are younger than the schedule's catch-up window (10 minutes by default); older ones are
//! skipped with a log line, never deferred as a flood. An instant is missed only after the
//! schedule's last recorded one: a schedule no worker ever deferred starts at its next
//! instant from now (and with its run-on-start job, when asked), never in a past in which
//! it did not exist. Retention keeps the latest record of every schedule for that reason.
//!
//! A schedule registered with a queueing lock skips an instant (recording it with no job)
//! while a job of that queueing lock is still waiting: a slow periodic task then never
//! piles up.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Datelike, Timelike, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Serialize;

use crate::conn::Connection;
use crate::error::{fmt_duration, Result};
use crate::store;
use crate::types::{JobId, RawJson};

/// The catch-up window of a schedule unless [`PeriodicOptions::catch_up`] says otherwise.
pub(crate) const DEFAULT_CATCH_UP: Duration = Duration::from_secs(10 * 60);

/// The longest catch-up window accepted. Retention never prunes the records of periodic
/// instants younger than [`PERIODIC_KEEP_MIN`], which must stay longer than this, or an
/// instant could be deferred twice.
pub(crate) const MAX_CATCH_UP: Duration = Duration::from_secs(24 * 3600);

/// Records of deferred instants are kept at least this long, whatever the retention.
pub(crate) const PERIODIC_KEEP_MIN: Duration = Duration::from_secs(2 * 24 * 3600);

/// A periodic schedule of a task; returned by [`Tasks::periodic`](crate::Tasks::periodic) and
/// [`Schedules::add`] to adjust.
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
    pub(crate) time_zone: Option<(String, jiff::tz::TimeZone)>,
    pub(crate) run_on_start: bool,
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
            .field("time_zone", &self.time_zone.as_ref().map(|(n, _)| n))
            .field("run_on_start", &self.run_on_start)
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
        match crate::types::serialize_args(args) {
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
    /// (after downtime, or a database outage). Older instants are skipped. Only instants
    /// after the schedule's last recorded one count as missed: a schedule never deferred
    /// before starts at its next instant, whatever the window. At most a day. Defaults to
    /// 10 minutes.
    pub fn catch_up(&mut self, window: Duration) -> &mut PeriodicOptions {
        self.catch_up = window;
        self
    }

    /// The time zone whose wall clock the expression is read in, by IANA name
    /// (`"Europe/Paris"`, `"America/New_York"`); see the module docs for how daylight saving
    /// changes are handled. An unknown name is reported when the worker is spawned.
    /// Defaults to UTC.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// let mut tasks = postpone::Tasks::new();
    /// let s = tasks.periodic("report", "0 9 * * *").time_zone("Asia/Tokyo");
    /// // 2024-01-01T00:00:00Z is 09:00 in Tokyo (UTC+9).
    /// let midnight_utc = UNIX_EPOCH + Duration::from_secs(1_704_067_200);
    /// assert_eq!(
    ///     s.next_after(midnight_utc - Duration::from_secs(1)),
    ///     Some(midnight_utc)
    /// );
    /// ```
    pub fn time_zone(&mut self, name: &str) -> &mut PeriodicOptions {
        match jiff::tz::TimeZone::get(name) {
            Ok(tz) => self.time_zone = Some((name.to_owned(), tz)),
            Err(e) => self.problems.push(format!(
                "periodic task {}: unknown time zone {name:?} ({e}); use an IANA name such as \"Europe/Paris\"",
                describe(&self.task, &self.id)
            )),
        }
        self
    }

    /// Also defers one job as soon as each worker given this schedule starts (its instant
    /// is the start time, to the second), then follows the schedule. Defaults to false.
    pub fn run_on_start(&mut self, yes: bool) -> &mut PeriodicOptions {
        self.run_on_start = yes;
        self
    }

    /// The name of its time zone, or `None` for UTC.
    pub fn time_zone_name(&self) -> Option<&str> {
        self.time_zone.as_ref().map(|(n, _)| n.as_str())
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
        let cron = self.cron.as_ref()?;
        match &self.time_zone {
            None => next_after(cron, t),
            Some((_, tz)) => next_after_in(cron, tz, t),
        }
    }

    /// Everything wrong with this schedule, for the worker's validation; `registered` tells
    /// whether a task name is known.
    pub(crate) fn check(&self, registered: impl Fn(&str) -> bool) -> Vec<String> {
        let mut out = self.problems.clone();
        let who = describe(&self.task, &self.id);
        if !registered(&self.task) {
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

/// The registry of periodic schedules, kept next to the tasks they defer.
///
/// A [`Tasks`](crate::Tasks) holds one, filled by [`Tasks::periodic`](crate::Tasks::periodic);
/// it dereferences to the list of its [`PeriodicOptions`].
///
/// ```
/// let mut tasks = postpone::Tasks::new();
/// tasks.register("report", |_job| Ok(()));
/// tasks.periodic("report", "0 8 * * MON-FRI");
/// assert_eq!(tasks.schedules().len(), 1);
/// assert_eq!(tasks.schedules()[0].schedule(), "0 8 * * MON-FRI");
/// ```
#[derive(Clone, Debug, Default)]
pub struct Schedules {
    list: Vec<PeriodicOptions>,
}

impl std::ops::Deref for Schedules {
    type Target = [PeriodicOptions];
    fn deref(&self) -> &[PeriodicOptions] {
        &self.list
    }
}

impl Schedules {
    /// An empty registry.
    pub fn new() -> Schedules {
        Schedules::default()
    }

    /// Adds a schedule of `task`; see [`Tasks::periodic`](crate::Tasks::periodic), which
    /// calls this, for the expression syntax. A malformed expression is recorded and
    /// reported when the worker is spawned (adding never panics).
    pub fn add(&mut self, task: impl Into<String>, schedule: &str) -> &mut PeriodicOptions {
        let task = task.into();
        let mut problems = Vec::new();
        let cron = match parse(schedule) {
            Ok(c) => Some(c),
            Err(e) => {
                problems.push(format!("periodic task {task:?}: {e}"));
                None
            }
        };
        self.list.push(PeriodicOptions {
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
            time_zone: None,
            run_on_start: false,
            problems,
        });
        self.list.last_mut().expect("just pushed")
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
    // croner reads an empty list element (`,`, `1,,2`) as no value at all: such a field
    // never matches, and proving that (below) searched every second up to its last year,
    // about 2 s of CPU (found by the cron fuzz target).
    if let Some(f) = text
        .split_whitespace()
        .find(|f| !f.starts_with('@') && f.split(',').any(str::is_empty))
    {
        return Err(format!(
            "invalid cron schedule {expression:?}: field {f:?} has an empty list element"
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

/// Most wall-clock candidates examined for one instant in a time zone (a schedule every
/// second walks 3,600 of them through a repeated hour).
const MAX_ZONED_STEPS: usize = 10_000;

/// The first instant strictly after `t` whose wall-clock time in `tz` matches `cron`; see
/// the module docs for daylight saving changes. The expression is evaluated on wall-clock
/// times carried in a `DateTime<Utc>` that stands for the civil time, then each candidate is
/// placed on the time line: unambiguous times directly, a repeated time at its first
/// occurrence, a skipped time at the end of its gap. That placement never goes backwards, so
/// the instants come out in order.
pub(crate) fn next_after_in(
    cron: &Cron,
    tz: &jiff::tz::TimeZone,
    t: SystemTime,
) -> Option<SystemTime> {
    let secs = i64::try_from(t.duration_since(UNIX_EPOCH).ok()?.as_secs()).ok()?;
    let ts = jiff::Timestamp::from_second(secs).ok()?;
    let mut wall = tz.to_datetime(ts);
    for _ in 0..MAX_ZONED_STEPS {
        let carried = DateTime::<Utc>::from_naive_utc_and_offset(
            chrono::NaiveDate::from_ymd_opt(
                wall.year().into(),
                wall.month() as u32,
                wall.day() as u32,
            )?
            .and_hms_opt(
                wall.hour() as u32,
                wall.minute() as u32,
                wall.second() as u32,
            )?,
            Utc,
        );
        let next = cron.find_next_occurrence(&carried, false).ok()?;
        wall = jiff::civil::DateTime::new(
            i16::try_from(next.year()).ok()?,
            next.month() as i8,
            next.day() as i8,
            next.hour() as i8,
            next.minute() as i8,
            next.second() as i8,
            0,
        )
        .ok()?;
        let at = place(tz, wall)?;
        if at > ts {
            return UNIX_EPOCH
                .checked_add(Duration::from_secs(u64::try_from(at.as_second()).ok()?));
        }
    }
    None
}

/// The instant of wall-clock time `wall` in `tz`: a repeated time at its first occurrence, a
/// skipped one at the end of the gap.
fn place(tz: &jiff::tz::TimeZone, wall: jiff::civil::DateTime) -> Option<jiff::Timestamp> {
    use jiff::tz::AmbiguousOffset as A;
    match tz.to_ambiguous_timestamp(wall).offset() {
        A::Unambiguous { offset } => offset.to_timestamp(wall).ok(),
        A::Fold { before, .. } => before.to_timestamp(wall).ok(),
        A::Gap { after, .. } => {
            // Read with the offset after the gap, the time lands before the transition: the
            // transition that follows is the end of the gap.
            let before_gap = after.to_timestamp(wall).ok()?;
            tz.following(before_gap).next().map(|tr| tr.timestamp())
        }
    }
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

    fn zoned(expr: &str, tz: &str, from: u64) -> Vec<u64> {
        let cron = parse(expr).unwrap();
        let tz = jiff::tz::TimeZone::get(tz).unwrap();
        let mut t = at(from);
        let mut out = Vec::new();
        for _ in 0..6 {
            t = next_after_in(&cron, &tz, t).unwrap();
            out.push(t.duration_since(UNIX_EPOCH).unwrap().as_secs());
        }
        out
    }

    #[test]
    fn a_time_zone_moves_instants_and_handles_the_dst_gap() {
        // 2024-03-10 in New York: 02:00 EST jumps to 03:00 EDT (07:00Z).
        // Daily at 02:30: the 9th at 07:30Z (EST), the 10th falls in the gap and runs when
        // the gap ends (07:00Z), the 11th at 06:30Z (EDT).
        let from = 1_709_942_400; // 2024-03-09T00:00:00Z
        let got = zoned("30 2 * * *", "America/New_York", from);
        assert_eq!(
            &got[..3],
            &[1_709_969_400, 1_710_054_000, 1_710_138_600],
            "{got:?}"
        );
        // Every 20 minutes through the gap: 01:40 EST, then the gap's 02:00/02:20/02:40 all
        // land on its end (once), then 03:20 EDT: never backwards, never twice.
        let got = zoned("*/20 * * * *", "America/New_York", 1_710_052_200); // 06:30Z = 01:30 EST
        assert_eq!(
            got,
            vec![
                1_710_052_800,         // 06:40Z = 01:40 EST
                1_710_054_000,         // 07:00Z = 03:00 EDT, end of the gap
                1_710_054_000 + 1_200, // 03:20 EDT
                1_710_054_000 + 2_400, // 03:40 EDT
                1_710_054_000 + 3_600, // 04:00 EDT
                1_710_054_000 + 4_800, // 04:20 EDT
            ]
        );
    }

    #[test]
    fn a_repeated_hour_defers_each_wall_clock_time_once() {
        // 2024-11-03 in New York: 02:00 EDT falls back to 01:00 EST; 01:xx happens twice
        // (05:xxZ in EDT, then 06:xxZ in EST).
        let from = 1_730_592_000; // 2024-11-03T00:00:00Z (20:00 EDT on the 2nd)
        let got = zoned("30 1 * * *", "America/New_York", from);
        // 01:30 EDT (05:30Z) only, then 01:30 EST the next day (06:30Z on the 4th).
        assert_eq!(&got[..2], &[1_730_611_800, 1_730_611_800 + 86_400 + 3_600]);
        // Every 30 minutes: 01:00 and 01:30 on the first pass, then 02:00 EST.
        let got = zoned("*/30 * * * *", "America/New_York", 1_730_610_000 - 1); // 00:59:59 EDT
        assert_eq!(
            got,
            vec![
                1_730_610_000, // 05:00Z = 01:00 EDT
                1_730_611_800, // 05:30Z = 01:30 EDT
                1_730_617_200, // 07:00Z = 02:00 EST
                1_730_619_000, // 02:30 EST
                1_730_620_800, // 03:00 EST
                1_730_622_600, // 03:30 EST
            ]
        );
        // A start inside the second pass goes on after it, not back.
        let got = zoned("*/30 * * * *", "America/New_York", 1_730_613_600 + 60); // 01:01 EST
        assert_eq!(got[0], 1_730_617_200);
    }

    #[test]
    fn unknown_time_zones_are_reported() {
        let mut s = Schedules::new();
        s.add("a", "@daily").time_zone("Mars/Olympus_Mons");
        let p = s[0].check(|_| true);
        assert!(
            p[0].contains("unknown time zone \"Mars/Olympus_Mons\""),
            "{p:?}"
        );
        assert_eq!(s[0].time_zone_name(), None);
        s.add("a", "@daily").id("x").time_zone("Europe/Paris");
        assert_eq!(s[1].time_zone_name(), Some("Europe/Paris"));
        assert!(s[1].check(|_| true).is_empty());
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
            // Found by the cron fuzz target: refused at once, where proving that it never
            // matches took about 2 s of CPU.
            (", 0 2 L * ?", "empty list element"),
            ("1,,2 * * * *", "empty list element"),
            ("0 0 * * MON,", "empty list element"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn registration_records_problems_instead_of_panicking() {
        let mut tasks = Schedules::new();
        let known = |t: &str| t == "a";
        tasks.add("a", "nonsense");
        tasks.add("b", "@hourly");
        tasks
            .add("a", "@hourly")
            .catch_up(Duration::from_secs(2 * 86400))
            .queue(" ");
        let p: Vec<Vec<String>> = tasks.iter().map(|s| s.check(known)).collect();
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
        let ok = tasks.add("a", "@hourly").id("x").clone();
        assert_eq!(ok.args.0, "null");
        assert_eq!(ok.catch_up, DEFAULT_CATCH_UP);
        assert!(ok.check(known).is_empty());
        assert!(PERIODIC_KEEP_MIN > MAX_CATCH_UP);
    }
}
