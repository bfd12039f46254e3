//! Schedules as data: periodic schedules stored in the database, created, changed, paused
//! and deleted at runtime ([`Admin::set_schedule`], [`Admin::create_schedule`],
//! [`Admin::pause_schedule`], [`Admin::resume_schedule`], [`Admin::delete_schedule`],
//! [`Admin::schedules`]); the `postpone schedule` commands and the dashboard's periodic page
//! call these.
//!
//! A stored schedule is a row of `postpone_schedules`. Every worker that registers its task
//! follows it: the worker's beat thread compares the rows of its tasks (their number and
//! highest revision) every `poll_interval`, and on a change its `postpone-periodic` thread
//! reads them again. So a change reaches every worker of the cluster within about one poll
//! interval. A worker that does not register the task ignores the schedule (it never defers
//! a job no worker of its version could run); a schedule whose task no worker registers
//! defers nothing, and [`ScheduleInfo::last_instant`] shows it.
//!
//! The instants are deferred as those of code-defined schedules are (see
//! [`Tasks::periodic`](crate::Tasks::periodic)): each exactly once across all workers (the
//! primary key of `postpone_periodic`), missed instants caught up only within the
//! schedule's catch-up window, wall-clock times of an IANA time zone. A stored schedule
//! counts from its `since`: its creation, the last change of its cron expression or time
//! zone, its last resume. Instants before that are never deferred, so a resume or a change
//! never brings a flood of old instants.
//!
//! A stored schedule with the (task, id) of a schedule given in a worker's code replaces
//! that one on the worker while the row exists: its expression and options apply, and
//! pausing it pauses the code's schedule. Deleting the row gives the worker its code's
//! schedule back. Both share the record of deferred instants, so no instant is deferred
//! twice across the switch.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::value::RawValue;

use super::info::{ser_opt_time, ser_time};
use super::Admin;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::{self, MAX_NAME_BYTES};
use crate::periodic::{describe, PeriodicOptions, Schedules, DEFAULT_CATCH_UP, MAX_CATCH_UP};
use crate::store;
use crate::types::RawJson;

/// A periodic schedule to store in the database; give it to [`Admin::set_schedule`] or
/// [`Admin::create_schedule`]. The options are those of
/// [`PeriodicOptions`](crate::PeriodicOptions), and are checked when it is stored.
///
/// ```no_run
/// use std::time::Duration;
/// use postpone::NewSchedule;
/// use serde_json::json;
///
/// # fn main() -> postpone::Result<()> {
/// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let admin = app.admin();
/// // Every weekday at 09:00 in Paris, from now on, on every worker that registers "report".
/// admin.set_schedule(
///     &NewSchedule::new("report", "0 9 * * MON-FRI")
///         .id("paris")
///         .time_zone("Europe/Paris")
///         .args(&json!({"office": "paris"}))
///         .queue("reports")
///         .catch_up(Duration::from_secs(3600)),
/// )?;
/// admin.pause_schedule("report", "paris")?; // no instant is deferred while paused
/// admin.resume_schedule("report", "paris")?; // counts again from now
/// admin.delete_schedule("report", "paris")?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct NewSchedule {
    task: String,
    id: String,
    cron: String,
    time_zone: Option<String>,
    args: RawJson,
    queue: Option<String>,
    priority: Option<i32>,
    lock: Option<String>,
    queueing_lock: Option<String>,
    catch_up: Duration,
    problems: Vec<String>,
}

impl NewSchedule {
    /// A schedule of `task` on the cron expression `cron` (5 fields, 6 with leading seconds,
    /// or an alias such as `@daily`; see [`Tasks::periodic`](crate::Tasks::periodic)).
    pub fn new(task: impl Into<String>, cron: impl Into<String>) -> NewSchedule {
        NewSchedule {
            task: task.into(),
            id: String::new(),
            cron: cron.into(),
            time_zone: None,
            args: RawJson("null".into()),
            queue: None,
            priority: None,
            lock: None,
            queueing_lock: None,
            catch_up: DEFAULT_CATCH_UP,
            problems: Vec::new(),
        }
    }

    /// Tells apart several schedules of one task: (task, id) names the schedule. Defaults
    /// to the empty string.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The arguments of every job of the schedule. A value that does not serialize is
    /// reported when the schedule is stored. Defaults to JSON `null`.
    pub fn args<A: Serialize + ?Sized>(mut self, args: &A) -> Self {
        match crate::types::serialize_args(args) {
            Ok(json) => self.args = json,
            Err(e) => self.problems.push(e.to_string()),
        }
        self
    }

    /// The queue of its jobs. Defaults to the task's default queue on the worker that
    /// defers the instant, or `"default"`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// The priority of its jobs. Defaults to the task's default priority, or 0.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The lock of its jobs. Defaults to none.
    pub fn lock(mut self, lock: impl Into<String>) -> Self {
        self.lock = Some(lock.into());
        self
    }

    /// The queueing lock of its jobs: an instant is skipped while a job of this lock still
    /// waits. Defaults to none.
    pub fn queueing_lock(mut self, lock: impl Into<String>) -> Self {
        self.queueing_lock = Some(lock.into());
        self
    }

    /// The IANA time zone whose wall clock the expression is read in (`"Europe/Paris"`).
    /// Defaults to UTC.
    pub fn time_zone(mut self, name: impl Into<String>) -> Self {
        self.time_zone = Some(name.into());
        self
    }

    /// How old a missed instant may be and still be deferred (at most a day). Defaults to
    /// 10 minutes.
    pub fn catch_up(mut self, window: Duration) -> Self {
        self.catch_up = window;
        self
    }

    /// The schedule as a worker follows it, or what is wrong with it.
    pub(crate) fn to_options(&self) -> std::result::Result<PeriodicOptions, String> {
        let who = describe(&self.task, &self.id);
        if let Some(p) = self.problems.first() {
            return Err(format!("schedule {who}: {p}"));
        }
        limits::check_name("task", &self.task).map_err(|e| format!("schedule {who}: {e}"))?;
        limits::check_no_nul("id", &self.id).map_err(|e| format!("schedule {who}: {e}"))?;
        if self.id.len() > MAX_NAME_BYTES {
            return Err(format!(
                "schedule {who}: its id is {} bytes long; at most {MAX_NAME_BYTES} are allowed",
                self.id.len()
            ));
        }
        if let Some(q) = &self.queue {
            limits::check_name("queue", q).map_err(|e| format!("schedule {who}: {e}"))?;
        }
        for (what, v) in [("lock", &self.lock), ("queueing lock", &self.queueing_lock)] {
            if let Some(v) = v {
                limits::check_lock(what, v).map_err(|e| format!("schedule {who}: {e}"))?;
            }
        }
        if self.catch_up > MAX_CATCH_UP {
            return Err(format!(
                "schedule {who}: catch_up of {} is longer than the 24h allowed",
                crate::error::fmt_duration(self.catch_up)
            ));
        }
        let mut reg = Schedules::new();
        let o = reg.add(self.task.clone(), &self.cron);
        o.id(self.id.clone()).catch_up(self.catch_up);
        o.args = self.args.clone();
        o.queue = self.queue.clone();
        o.priority = self.priority;
        o.lock = self.lock.clone();
        o.queueing_lock = self.queueing_lock.clone();
        if let Some(tz) = &self.time_zone {
            o.time_zone(tz);
        }
        let o = o.clone();
        // The task is not looked up: a stored schedule may name a task of other workers.
        match o.check(|_| true).into_iter().next() {
            Some(p) => Err(p.replacen("periodic task", "schedule", 1)),
            None => Ok(o),
        }
    }

    fn checked(&self, doing: &str) -> Result<()> {
        self.to_options()
            .map(drop)
            .map_err(|p| Error::new(ErrorKind::InvalidInput, format!("{doing}: {p}")))
    }
}

/// A schedule stored in the database; from [`Admin::schedules`] and [`Admin::schedule`].
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The task its jobs run.
    pub task: String,
    /// Its id among the schedules of the task (often empty).
    pub id: String,
    /// The cron expression.
    pub cron: String,
    /// Its IANA time zone; `None`: UTC.
    pub time_zone: Option<String>,
    /// The arguments of its jobs.
    pub args: Box<RawValue>,
    /// The queue of its jobs; `None`: the task's default.
    pub queue: Option<String>,
    /// The priority of its jobs; `None`: the task's default.
    pub priority: Option<i32>,
    /// The lock of its jobs.
    pub lock: Option<String>,
    /// The queueing lock of its jobs.
    pub queueing_lock: Option<String>,
    /// How old a missed instant may be and still be deferred.
    #[serde(serialize_with = "ser_secs")]
    pub catch_up: Duration,
    /// Since when it is paused; `None`: it runs.
    #[serde(serialize_with = "ser_opt_time")]
    pub paused_at: Option<SystemTime>,
    /// Its instants count from this time: its creation, the last change of its expression
    /// or time zone, or its last resume.
    #[serde(serialize_with = "ser_time")]
    pub since: SystemTime,
    /// When it was created.
    #[serde(serialize_with = "ser_time")]
    pub created_at: SystemTime,
    /// When it was last changed, paused or resumed.
    #[serde(serialize_with = "ser_time")]
    pub updated_at: SystemTime,
    /// The latest instant deferred for its (task, id), by any worker; `None`: none yet (no
    /// instant came, or no running worker registers the task).
    #[serde(serialize_with = "ser_opt_time")]
    pub last_instant: Option<SystemTime>,
    /// Its next instant after the database's clock now; `None` while paused.
    #[serde(serialize_with = "ser_opt_time")]
    pub next_instant: Option<SystemTime>,
}

impl ScheduleInfo {
    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

fn from_row(r: &postgres::Row) -> Result<ScheduleInfo> {
    let task: String = r.get(0);
    let id: String = r.get(1);
    let cron: String = r.get(2);
    let time_zone: Option<String> = r.get(3);
    let RawJson(args) = r.get(4);
    let catch_up_ms: i64 = r.get(9);
    let paused_at: Option<SystemTime> = r.get(10);
    let now: SystemTime = r.get(15);
    let next_instant = if paused_at.is_some() {
        None
    } else {
        let mut reg = Schedules::new();
        let o = reg.add(task.clone(), &cron);
        if let Some(tz) = &time_zone {
            o.time_zone(tz);
        }
        o.next_after(now)
    };
    Ok(ScheduleInfo {
        args: RawValue::from_string(args).map_err(|e| {
            Error::with_source(ErrorKind::Other, "reading a schedule's arguments", e)
        })?,
        queue: r.get(5),
        priority: r.get(6),
        lock: r.get(7),
        queueing_lock: r.get(8),
        catch_up: Duration::from_millis(u64::try_from(catch_up_ms).unwrap_or(0)),
        paused_at,
        since: r.get(11),
        created_at: r.get(12),
        updated_at: r.get(13),
        last_instant: r.get(14),
        next_instant,
        task,
        id,
        cron,
        time_zone,
    })
}

fn not_found(task: &str, id: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!(
            "no stored schedule {} (list them with `postpone schedules` or Admin::schedules)",
            describe(task, id)
        ),
    )
}

impl Admin {
    /// Every schedule stored in the database, in (task, id) order, with its last and next
    /// instants. Schedules given in workers' code are not stored and not listed.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "listing schedules",
            store::SCHEDULE_LIST,
            &[&None::<&str>, &None::<&str>],
        )?;
        rows.iter().map(from_row).collect()
    }

    /// The stored schedule (`task`, `id`); [`NotFound`](ErrorKind::NotFound) if there is
    /// none.
    pub fn schedule(&self, task: &str, id: &str) -> Result<ScheduleInfo> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "reading a schedule",
            store::SCHEDULE_LIST,
            &[&Some(task), &Some(id)],
        )?;
        match rows.first() {
            Some(r) => from_row(r),
            None => Err(not_found(task, id)),
        }
    }

    /// Stores `schedule`, replacing the stored schedule with its (task, id) if there is one
    /// (a paused one stays paused). Returns `true` if it was created. Every worker that
    /// registers the task follows it within about a poll interval. An empty task, a name
    /// over 255 bytes, a bad cron expression, an unknown time zone or a catch-up window
    /// over a day is an [`InvalidInput`](ErrorKind::InvalidInput) error that says which.
    ///
    /// A replacement that changes the expression or the time zone counts from now: no
    /// instant between the last one deferred and now is caught up.
    pub fn set_schedule(&self, schedule: &NewSchedule) -> Result<bool> {
        self.store_schedule(schedule, true, "setting a schedule")
            .map(|c| c.unwrap_or(false))
    }

    /// Stores `schedule` if no schedule with its (task, id) is stored; otherwise fails with
    /// [`InvalidState`](ErrorKind::InvalidState) and changes nothing. Inputs are checked as
    /// by [`set_schedule`](Self::set_schedule).
    pub fn create_schedule(&self, schedule: &NewSchedule) -> Result<()> {
        match self.store_schedule(schedule, false, "creating a schedule")? {
            Some(_) => Ok(()),
            None => Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "creating a schedule: schedule {} exists already (change it with set_schedule, `postpone schedule add --replace`)",
                    describe(&schedule.task, &schedule.id)
                ),
            )),
        }
    }

    fn store_schedule(&self, s: &NewSchedule, replace: bool, doing: &str) -> Result<Option<bool>> {
        s.checked(doing)?;
        let catch_up_ms = i64::try_from(s.catch_up.as_millis()).unwrap_or(i64::MAX);
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            doing,
            store::SCHEDULE_SET,
            &[
                &s.task,
                &s.id,
                &s.cron,
                &s.time_zone,
                &s.args,
                &s.queue,
                &s.priority,
                &s.lock,
                &s.queueing_lock,
                &catch_up_ms,
                &replace,
            ],
        )?;
        let created = rows.first().map(|r| r.get::<_, bool>(0));
        if let Some(c) = created {
            log::info!(
                "schedule {} {} by the admin API: {:?}",
                describe(&s.task, &s.id),
                if c { "created" } else { "replaced" },
                s.cron
            );
        }
        Ok(created)
    }

    /// Pauses the stored schedule (`task`, `id`): once every worker has read it (within
    /// about a poll interval) no instant of it is deferred, until
    /// [`resume_schedule`](Self::resume_schedule). Returns `false` if it was paused already;
    /// [`NotFound`](ErrorKind::NotFound) if there is no such schedule.
    pub fn pause_schedule(&self, task: &str, id: &str) -> Result<bool> {
        self.schedule_change(task, id, store::SCHEDULE_PAUSE, "pausing a schedule")
    }

    /// Resumes the paused schedule (`task`, `id`): it counts from now, its instants during
    /// the pause are not deferred. Returns `false` if it was not paused;
    /// [`NotFound`](ErrorKind::NotFound) if there is no such schedule.
    pub fn resume_schedule(&self, task: &str, id: &str) -> Result<bool> {
        self.schedule_change(task, id, store::SCHEDULE_RESUME, "resuming a schedule")
    }

    /// Deletes the stored schedule (`task`, `id`): workers stop deferring it within about a
    /// poll interval (a worker whose code gives a schedule with that (task, id) goes back to
    /// it). The record of its deferred instants stays. [`NotFound`](ErrorKind::NotFound) if
    /// there is no such schedule.
    pub fn delete_schedule(&self, task: &str, id: &str) -> Result<()> {
        let mut conn = self.conn()?;
        let rows =
            conn.query_named("deleting a schedule", store::SCHEDULE_DELETE, &[&task, &id])?;
        if rows.is_empty() {
            return Err(not_found(task, id).context("deleting a schedule"));
        }
        log::info!("schedule {} deleted by the admin API", describe(task, id));
        Ok(())
    }

    fn schedule_change(&self, task: &str, id: &str, sql: &str, doing: &str) -> Result<bool> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(doing, sql, &[&task, &id])?;
        if !rows.is_empty() {
            log::info!("{doing} {} by the admin API", describe(task, id));
            return Ok(true);
        }
        let exists = !conn
            .query_named(doing, store::SCHEDULE_EXISTS, &[&task, &id])?
            .is_empty();
        if exists {
            Ok(false)
        } else {
            Err(not_found(task, id).context(doing))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(s: NewSchedule) -> String {
        s.to_options().unwrap_err()
    }

    #[test]
    fn bad_schedules_are_explained() {
        assert!(problem(NewSchedule::new("", "@daily")).contains("task must not be empty"));
        assert!(problem(NewSchedule::new("t", "61 * * * *")).contains("invalid cron schedule"));
        assert!(problem(NewSchedule::new("t", "")).contains("it is empty"));
        let p = problem(NewSchedule::new("t", "@daily").time_zone("Mars/Olympus"));
        assert!(p.contains("unknown time zone \"Mars/Olympus\""), "{p}");
        let p = problem(NewSchedule::new("x".repeat(300), "@daily"));
        assert!(p.contains("at most 255"), "{p}");
        let p = problem(NewSchedule::new("t", "@daily").id("i".repeat(256)));
        assert!(p.contains("its id is 256 bytes long"), "{p}");
        let p = problem(NewSchedule::new("t", "@daily").catch_up(Duration::from_secs(90_000)));
        assert!(p.contains("longer than the 24h"), "{p}");
        let p = problem(NewSchedule::new("t", "@daily").queue(""));
        assert!(p.contains("queue must not be empty"), "{p}");
        assert!(p.starts_with("schedule \"t\""), "{p}");
        let ok = NewSchedule::new("t", "*/5 * * * *")
            .id("x")
            .time_zone("Europe/Paris")
            .args(&serde_json::json!({"a": 1}))
            .to_options()
            .unwrap();
        assert_eq!(ok.time_zone_name(), Some("Europe/Paris"));
        assert_eq!(ok.id, "x");
        assert_eq!(ok.args.0, r#"{"a":1}"#);
    }
}
