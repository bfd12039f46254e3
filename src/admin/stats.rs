//! Statistics: jobs per queue (or per task) and status, failure rate and run-time
//! percentiles over a window, the lag of the oldest due job, and the due jobs no running
//! worker knows the task of ([`UnknownTask`]).
//!
//! One statement scans the jobs table (prune finished jobs to keep it quick). No stored
//! value can fail it: times of `±infinity` count where they fall (a job due at `-infinity`
//! has an infinite lag), run times are taken only from finite start and finish times, and
//! an unknown status (from a newer postpone) is counted apart instead of lost.

use std::time::Duration;

use serde::Serialize;

use super::info::{secs, ser_opt_secs};
use super::Admin;
use crate::error::Result;
use crate::store;

/// How long a due job waits before [`Admin::stats`] reports that no running worker knows its
/// task ([`QueueCounts::unknown_tasks`]): 15 minutes, longer than a rolling deploy
/// usually takes to bring up workers that know a new task. [`Admin::unknown_tasks`] takes
/// any other.
pub const DEFAULT_UNKNOWN_TASK_AFTER: Duration = Duration::from_secs(15 * 60);

/// Due jobs of one task that no running worker knows; from [`Admin::unknown_tasks`].
///
/// Some live worker serves their queue, but every one that does claims only the tasks it
/// registered (`only_registered_tasks`, the default) and this one is not among them: the jobs
/// wait until a worker that registers the task runs (during a rolling deploy, the new
/// version's workers), and are never failed for it. A worker older than schema version 22,
/// or one with `only_registered_tasks(false)`, counts as knowing every task.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct UnknownTask {
    /// The queue of the jobs.
    pub queue: String,
    /// The task no running worker serving that queue knows.
    pub task: String,
    /// How many due jobs of it have waited longer than the threshold asked for.
    pub jobs: u64,
    /// How long the oldest of them has waited past its scheduled time.
    #[serde(serialize_with = "ser_opt_secs", rename = "oldest_wait_secs")]
    pub oldest_wait: Option<Duration>,
}

impl std::fmt::Display for UnknownTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no worker knows task {:?}: {} due job(s) of queue {:?} wait",
            self.task, self.jobs, self.queue
        )?;
        if let Some(d) = self.oldest_wait {
            let s = d.as_secs();
            match s {
                0..=59 => write!(f, ", the oldest for {s}s")?,
                60..=3599 => write!(f, ", the oldest for {}m{:02}s", s / 60, s % 60)?,
                _ => write!(f, ", the oldest for {}h{:02}m", s / 3600, s / 60 % 60)?,
            }
        }
        f.write_str(" (start a worker that registers it)")
    }
}

/// How [`Admin::stats`] groups jobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StatsBy {
    /// One row per queue. The default.
    #[default]
    Queue,
    /// One row per task name.
    Task,
}

/// Jobs of one queue, per status; from [`Admin::counts`] (one row per queue) and
/// [`Admin::stats`] (per queue or per task, with run times).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueCounts {
    /// The queue (or the task, for [`StatsBy::Task`]).
    pub queue: String,
    /// Waiting and due.
    pub todo: u64,
    /// Waiting, scheduled for later.
    pub scheduled: u64,
    /// Waiting for the jobs they were deferred to run after
    /// ([`NewJob::after`](crate::NewJob::after)); counted in neither `todo` nor
    /// `scheduled`.
    pub waiting_for_dependencies: u64,
    /// Running (claimed by a worker).
    pub doing: u64,
    /// Succeeded (still kept; within the window, if one was given).
    pub succeeded: u64,
    /// Failed (within the window, if one was given).
    pub failed: u64,
    /// Cancelled (within the window, if one was given).
    pub cancelled: u64,
    /// Of the cancelled ones, those that expired: not started by their deadline
    /// ([`NewJob::expires_at`](crate::NewJob::expires_at)).
    pub expired: u64,
    /// Aborted (within the window, if one was given).
    pub aborted: u64,
    /// Jobs with a status this library does not know (written by a newer postpone).
    pub other: u64,
    /// How long the oldest due job has waited past its scheduled time, if any is due.
    #[serde(serialize_with = "ser_opt_secs", rename = "oldest_todo_age_secs")]
    pub oldest_todo_age: Option<Duration>,
    /// Failed / (succeeded + failed), if any finished so.
    pub failure_rate: Option<f64>,
    /// Median run time of the jobs that finished (succeeded, failed or aborted).
    #[serde(serialize_with = "ser_opt_secs", rename = "run_time_p50_secs")]
    pub run_time_p50: Option<Duration>,
    /// 95th percentile of the run time.
    #[serde(serialize_with = "ser_opt_secs", rename = "run_time_p95_secs")]
    pub run_time_p95: Option<Duration>,
    /// 99th percentile of the run time.
    #[serde(serialize_with = "ser_opt_secs", rename = "run_time_p99_secs")]
    pub run_time_p99: Option<Duration>,
    /// Tasks of this queue's due jobs that no running worker knows, waiting longer than
    /// [`DEFAULT_UNKNOWN_TASK_AFTER`] (see [`Admin::unknown_tasks`]); per task, the task
    /// itself when no running worker serving one of its queues knows it.
    pub unknown_tasks: Vec<String>,
    /// Whether no worker starts this queue's jobs now ([`Admin::pause`], or
    /// [`Admin::pause_all`]); always `false` per task.
    pub paused: bool,
    /// The queue's concurrency limit ([`Admin::set_queue_limit`]), if it has one; `None`
    /// per task.
    pub max_running: Option<i32>,
    /// Whether the concurrency limit holds back its due jobs now: `doing` is at
    /// `max_running` or over (no worker claims more until one finishes).
    pub limit_reached: bool,
    /// Due jobs held back by their `lock`: another job with the same lock is running, or
    /// an older one with it waits.
    pub lock_held: u64,
    /// The queue's key limit ([`Admin::set_key_limit`]): at most this many running jobs per
    /// key; `None` if it has none (and per task).
    pub max_per_key: Option<i32>,
    /// The argument field that is the key of the key limit.
    pub key_arg: Option<String>,
    /// Due jobs held back by the key limit now: their key has all its slots taken.
    pub key_held: u64,
    /// The queue's rate limit ([`Admin::set_rate_limit`]): at most this many starts per
    /// `rate_period`; `None` if it has none (and per task).
    pub max_starts: Option<i32>,
    /// The window of the rate limit.
    #[serde(serialize_with = "ser_opt_secs", rename = "rate_period_secs")]
    pub rate_period: Option<Duration>,
    /// Whether the rate limit holds back its due jobs now: every start of the window is
    /// taken.
    pub rate_limited: bool,
    /// When the rate limit lets the next job start, if it holds them back now.
    #[serde(serialize_with = "ser_opt_secs", rename = "next_start_in_secs")]
    pub next_start_in: Option<Duration>,
}

impl QueueCounts {
    /// Why this queue's due jobs (`todo`) do not all run now, in words: `paused`,
    /// `limit reached` (concurrency limit), `key limit reached`, `rate limited`, `lock
    /// held`, `unknown task` (no running worker knows the task of some of them, see
    /// [`unknown_tasks`](Self::unknown_tasks)); empty when nothing holds them back (or none
    /// is due).
    pub fn waiting_reasons(&self) -> Vec<&'static str> {
        let mut why = Vec::new();
        if self.todo == 0 {
            return why;
        }
        if self.paused {
            why.push("paused");
        }
        if self.limit_reached {
            why.push("limit reached");
        }
        if self.key_held > 0 {
            why.push("key limit reached");
        }
        if self.rate_limited {
            why.push("rate limited");
        }
        if self.lock_held > 0 {
            why.push("lock held");
        }
        if !self.unknown_tasks.is_empty() {
            why.push("unknown task");
        }
        why
    }
}

impl Admin {
    /// Jobs per queue and status, queues in name order, counted over every kept job.
    pub fn counts(&self) -> Result<Vec<QueueCounts>> {
        self.stats(StatsBy::Queue, None)
    }

    /// Jobs per queue or per task: waiting, scheduled and running now; finished ones (all
    /// kept, or those that finished within `window`) with the failure rate and run-time
    /// percentiles; and the lag of the oldest due job. A window over 100 years reads as 100
    /// years.
    pub fn stats(&self, by: StatsBy, window: Option<Duration>) -> Result<Vec<QueueCounts>> {
        self.stats_first(by, window, None)
    }

    /// [`stats`](Self::stats) of the first `limit` queues or tasks by name (all with
    /// `None`), and every paused queue: what a screen shows, at a cost that does not grow
    /// with the number of queues.
    pub(crate) fn stats_first(
        &self,
        by: StatsBy,
        window: Option<Duration>,
        limit: Option<i64>,
    ) -> Result<Vec<QueueCounts>> {
        let group = match by {
            StatsBy::Queue => "queue",
            StatsBy::Task => "task",
        };
        let ms: Option<i64> = window.map(crate::limits::age_millis);
        let sql = store::JOB_STATS.replace("{group}", group);
        let mut conn = self.conn()?;
        let rows = conn.query_named("computing job statistics", &sql, &[&ms, &limit])?;
        drop(conn);
        let mut counts: Vec<QueueCounts> = rows
            .iter()
            .map(|r| {
                let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
                let p: Option<Vec<Option<f64>>> = r.get(10);
                let p = |i: usize| {
                    p.as_ref()
                        .and_then(|v| v.get(i).copied().flatten())
                        .and_then(secs)
                };
                let (ok, failed) = (n(4), n(5));
                QueueCounts {
                    queue: r.get(0),
                    todo: n(1),
                    scheduled: n(2),
                    waiting_for_dependencies: n(12),
                    doing: n(3),
                    succeeded: ok,
                    failed,
                    cancelled: n(6),
                    expired: n(13),
                    aborted: n(7),
                    other: n(8),
                    oldest_todo_age: r.get::<_, Option<f64>>(9).and_then(secs),
                    unknown_tasks: Vec::new(),
                    failure_rate: (ok + failed > 0).then(|| failed as f64 / (ok + failed) as f64),
                    run_time_p50: p(0),
                    run_time_p95: p(1),
                    run_time_p99: p(2),
                    paused: false,
                    max_running: None,
                    limit_reached: false,
                    lock_held: n(11),
                    max_per_key: None,
                    key_arg: None,
                    key_held: 0,
                    max_starts: None,
                    rate_period: None,
                    rate_limited: false,
                    next_start_in: None,
                }
            })
            .collect();
        for u in self.unknown_tasks(DEFAULT_UNKNOWN_TASK_AFTER)? {
            let (group, name) = match by {
                StatsBy::Queue => (&u.queue, u.task),
                StatsBy::Task => (&u.task, u.task.clone()),
            };
            if let Some(c) = counts.iter_mut().find(|c| &c.queue == group) {
                if !c.unknown_tasks.contains(&name) {
                    c.unknown_tasks.push(name);
                }
            }
        }
        if by == StatsBy::Queue {
            // Paused queues are listed even without jobs, so that a pause is always seen.
            let pauses = self.paused()?;
            for p in &pauses.queues {
                let q = p.queue.as_deref().unwrap_or_default();
                if !counts.iter().any(|c| c.queue == q) {
                    let at = counts
                        .iter()
                        .position(|c| c.queue.as_str() > q)
                        .unwrap_or(counts.len());
                    counts.insert(at, QueueCounts::empty(q));
                }
            }
            let limits = self.queue_limits()?;
            let keys = self.key_limits()?;
            let rates = self.rate_limits()?;
            for c in &mut counts {
                c.paused = pauses.is_paused(&c.queue);
                if let Some(l) = limits.iter().find(|l| l.queue == c.queue) {
                    c.max_running = Some(l.max_running);
                    c.limit_reached = l.is_reached();
                }
                if let Some(k) = keys.iter().find(|k| k.queue == c.queue) {
                    c.max_per_key = Some(k.max_per_key);
                    c.key_arg = Some(k.key_arg.clone());
                    c.key_held = k.held;
                }
                if let Some(r) = rates.iter().find(|r| r.queue == c.queue) {
                    c.max_starts = Some(r.max_starts);
                    c.rate_period = Some(r.period);
                    c.rate_limited = r.is_reached();
                    c.next_start_in = r.next_start_in;
                }
            }
        }
        Ok(counts)
    }
}

impl Admin {
    /// Due jobs whose task no running worker knows, per queue and task, of those that have
    /// waited longer than `after` past their scheduled time: some live worker serves their
    /// queue, but none that does registers the task (see [`UnknownTask`]). Such jobs wait,
    /// they are never failed for it; this says which would wait for ever if no worker that
    /// knows them comes. [`Admin::stats`] reports them past
    /// [`DEFAULT_UNKNOWN_TASK_AFTER`]; `postpone stats --unknown-after` and the dashboard
    /// show them too.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// use std::time::Duration;
    /// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// for u in app.admin().unknown_tasks(Duration::from_secs(600))? {
    ///     eprintln!("warning: {u}"); // no worker knows task "x": 3 due job(s) of queue ...
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn unknown_tasks(&self, after: Duration) -> Result<Vec<UnknownTask>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "finding due jobs no worker knows the task of",
            store::JOB_UNKNOWN_TASKS,
            &[&crate::limits::age_millis(after)],
        )?;
        Ok(rows
            .iter()
            .map(|r| UnknownTask {
                queue: r.get(0),
                task: r.get(1),
                jobs: r.get::<_, i64>(2).max(0) as u64,
                oldest_wait: r.get::<_, Option<f64>>(3).and_then(secs),
            })
            .collect())
    }
}

impl QueueCounts {
    fn empty(queue: &str) -> QueueCounts {
        QueueCounts {
            queue: queue.to_owned(),
            todo: 0,
            scheduled: 0,
            waiting_for_dependencies: 0,
            doing: 0,
            succeeded: 0,
            failed: 0,
            cancelled: 0,
            expired: 0,
            aborted: 0,
            other: 0,
            oldest_todo_age: None,
            unknown_tasks: Vec::new(),
            failure_rate: None,
            run_time_p50: None,
            run_time_p95: None,
            run_time_p99: None,
            paused: false,
            max_running: None,
            limit_reached: false,
            lock_held: 0,
            max_per_key: None,
            key_arg: None,
            key_held: 0,
            max_starts: None,
            rate_period: None,
            rate_limited: false,
            next_start_in: None,
        }
    }
}
