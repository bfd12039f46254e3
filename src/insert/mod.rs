//! Inserting jobs: one builder, [`NewJob`], used by every entry point.
//!
//! A `NewJob` carries a task name, its serialized arguments and the insert options (queue,
//! priority, lock, queueing lock, a schedule given as an instant or a delay, attempt limit,
//! tags, metadata, uniqueness, and the jobs it runs after).
//! Its setters are written once, for both of its shapes:
//!
//! - detached (`NewJob`, from [`NewJob::new`] or [`NewJob::of`]): a value to collect and
//!   hand to [`App::defer_batch`](crate::App::defer_batch);
//! - bound to an App (`JobBuilder<'a>`, from [`App::job`](crate::App::job)): ends with [`defer`](JobBuilder::defer),
//!   [`defer_in`](JobBuilder::defer_in) or [`defer_on`](JobBuilder::defer_on), which take the
//!   arguments last.
//!
//! Every insert resolves the task's default queue and priority the same way (an explicit
//! value wins, then the task's registered default, then `"default"` and 0), is validated
//! before any round-trip, and maps a taken queueing lock to
//! [`AlreadyEnqueued`](ErrorKind::AlreadyEnqueued).

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::client_trait::DeferClient;
use postgres::types::ToSql;
use serde::Serialize;

use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::pooled::PooledConnection;
use crate::store;
use crate::types::{serialize_args, JobId, RawJson, TaskArgs, TaskDefaults};
use crate::unique::{Deferred, Unique, UniqueStates};
use crate::wait::JobResult;

mod write;

use crate::namespace::Namespace;
use write::*;
pub(crate) use write::{
    check_batch, defer_error, insert_batch, insert_batch_in, insert_batch_unique,
};

/// The queue of jobs deferred without one (a static, so that it can be lent as a parameter).
pub(crate) static DEFAULT_QUEUE: &str = "default";

/// A job not bound to an App: the shape of [`NewJob`] collected for [`App::defer_batch`](crate::App::defer_batch).
#[derive(Clone, Copy, Debug, Default)]
pub struct Detached;

/// What a bound job needs from the App that will insert it (implemented by `App`, so that
/// this module does not depend on it).
pub(crate) trait Inserter: Sync {
    /// A pooled connection whose schema was checked.
    fn pooled(&self) -> Result<PooledConnection>;
    /// The tasks' default queues and priorities.
    fn defaults(&self) -> &TaskDefaults;
    /// Waits for a job to finish (`App::wait`).
    fn wait(&self, id: JobId, timeout: Duration) -> Result<JobResult>;
    /// Where postpone's objects are.
    fn namespace(&self) -> &Namespace;
}

/// A job bound to the App that will insert it: the shape of [`JobBuilder`].
#[derive(Clone, Copy)]
pub struct Bound<'a>(&'a dyn Inserter);

impl fmt::Debug for Bound<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Bound")
    }
}

/// A job being built by [`App::job`](crate::App::job); ends with [`defer`](NewJob::defer),
/// [`defer_in`](NewJob::defer_in) or [`defer_on`](NewJob::defer_on).
pub type JobBuilder<'a> = NewJob<Bound<'a>>;

/// Most tags a job can carry ([`NewJob::tags`]).
pub const MAX_TAGS: usize = 64;

/// Largest metadata of a job, in bytes of JSON ([`NewJob::meta`]).
pub const MAX_META_BYTES: usize = 64 * 1024;

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[derive(Clone, Copy, Debug)]
enum Schedule {
    Now,
    At(SystemTime),
    In(Duration),
}

/// When a job not started yet no longer runs.
#[derive(Clone, Copy, Debug)]
enum Expiry {
    At(SystemTime),
    /// From now, by the database's clock.
    In(Duration),
}

/// A job to insert: a task name, arguments, and options. The one insert type of the
/// crate: detached (`NewJob`) for [`App::defer_batch`](crate::App::defer_batch), or bound to an App
/// ([`JobBuilder`]) by [`App::job`](crate::App::job).
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// use std::time::Duration;
/// use postpone::NewJob;
///
/// // Bound: options, then the arguments.
/// app.job("send_email").queue("emails").priority(5).defer(&"a@b.c")?;
/// // Detached: arguments first, many jobs in one round-trip.
/// let jobs = vec![
///     NewJob::new("send_email", &"d@e.f")?.queue("emails"),
///     NewJob::new("send_email", &"g@h.i")?.schedule_in(Duration::from_secs(60)),
/// ];
/// app.defer_batch(&jobs)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a job is inserted only by defer, defer_in, defer_on or defer_batch"]
pub struct NewJob<S = Detached> {
    target: S,
    task: String,
    queue: Option<String>,
    priority: Option<i32>,
    lock: Option<String>,
    queueing_lock: Option<String>,
    schedule: Schedule,
    expiry: Option<Expiry>,
    args: RawJson,
    max_attempts: Option<u32>,
    tags: Option<Vec<String>>,
    /// The metadata as JSON, or why it cannot be stored (reported by `defer`).
    meta: Option<std::result::Result<RawJson, String>>,
    unique: Option<Unique>,
    /// Jobs that must have succeeded first.
    after: Vec<JobId>,
    /// Jobs that must have finished first, whatever their outcome.
    after_finished: Vec<JobId>,
}

impl<S> fmt::Debug for NewJob<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewJob")
            .field("task", &self.task)
            .field("queue", &self.queue)
            .field("priority", &self.priority)
            .field("lock", &self.lock)
            .field("queueing_lock", &self.queueing_lock)
            .field("schedule", &self.schedule)
            .field("expiry", &self.expiry)
            .field("args", &self.args.0)
            .field("max_attempts", &self.max_attempts)
            .field("tags", &self.tags)
            .field("meta", &self.meta)
            .field("unique", &self.unique)
            .field("after", &self.after)
            .field("after_finished", &self.after_finished)
            .finish()
    }
}

impl NewJob<Detached> {
    /// A job of `task` with `args`, serialized now. An argument that does not serialize to
    /// JSON, or whose JSON PostgreSQL's jsonb cannot store (a NUL character, a lone
    /// surrogate escape, a number past numeric's range, arrays or objects nested more than
    /// 1,000 levels deep), is an error of kind `InvalidInput`.
    pub fn new<A: Serialize + ?Sized>(task: impl Into<String>, args: &A) -> Result<NewJob> {
        Ok(NewJob::blank(Detached, task.into()).with_args(serialize_args(args)?))
    }

    /// A job of the typed task whose arguments are `args` (the task name comes from
    /// [`TaskArgs::TASK`]).
    pub fn of<A: TaskArgs>(args: &A) -> Result<NewJob> {
        NewJob::new(A::TASK, args)
    }
}

impl<S> NewJob<S> {
    fn blank(target: S, task: String) -> NewJob<S> {
        NewJob {
            target,
            task,
            queue: None,
            priority: None,
            lock: None,
            queueing_lock: None,
            schedule: Schedule::Now,
            expiry: None,
            args: RawJson("null".into()),
            max_attempts: None,
            tags: None,
            meta: None,
            unique: None,
            after: Vec::new(),
            after_finished: Vec::new(),
        }
    }

    fn with_args(mut self, args: RawJson) -> NewJob<S> {
        self.args = args;
        self
    }

    /// The queue. Defaults to the task's default queue
    /// ([`TaskOptions::queue`](crate::TaskOptions::queue)), or `"default"`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Higher runs first. Defaults to the task's default priority, or 0.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// At most one job of this lock runs at a time, in defer order. Defaults to none.
    pub fn lock(mut self, lock: impl Into<String>) -> Self {
        self.lock = Some(lock.into());
        self
    }

    /// At most one job of this queueing lock waits (`todo`) at a time; deferring a second is
    /// an error of kind [`AlreadyEnqueued`](ErrorKind::AlreadyEnqueued). Defaults to none.
    pub fn queueing_lock(mut self, lock: impl Into<String>) -> Self {
        self.queueing_lock = Some(lock.into());
        self
    }

    /// Not before `at`. Defaults to now. A time in the past is due at once; one before the
    /// year 1, or more than 100 years ahead, is an
    /// [`InvalidInput`](ErrorKind::InvalidInput) error when the job is deferred.
    pub fn schedule_at(mut self, at: SystemTime) -> Self {
        self.schedule = Schedule::At(at);
        self
    }

    /// Not before `delay` from now (by the database's clock). Defaults to now.
    pub fn schedule_in(mut self, delay: Duration) -> Self {
        self.schedule = Schedule::In(delay);
        self
    }

    /// The job's deadline: if it has not *started* by `at`, it never runs. A worker that
    /// finds it waiting past then (or holding it, claimed but not started) ends it
    /// `cancelled`, its error saying that it expired and when; it counts as expired in
    /// [`Admin::stats`](crate::Admin::stats) and the metrics. A job that started before its
    /// deadline runs to its end; a retry or snooze that would run it at or after the
    /// deadline expires it instead. Defaults to none (the job waits as long as it takes).
    ///
    /// It must come after the job's scheduled time (now, unless
    /// [`schedule_at`](Self::schedule_at) or [`schedule_in`](Self::schedule_in) says
    /// otherwise) and lie within 100 years; otherwise the defer fails with an
    /// [`InvalidInput`](ErrorKind::InvalidInput) error. A time given as an instant
    /// is compared with a relative schedule by this process's clock.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let end_of_sale = SystemTime::now() + Duration::from_secs(3600);
    /// app.job("announce_sale").expires_at(end_of_sale).defer(&42)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn expires_at(mut self, at: SystemTime) -> Self {
        self.expiry = Some(Expiry::At(at));
        self
    }

    /// The job's deadline, `d` from now by the database's clock: see
    /// [`expires_at`](Self::expires_at). Zero is an error (the job could never start), and
    /// so is a deadline at or before its scheduled time. Defaults to none.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// use std::time::Duration;
    ///
    /// // A one-time code is worthless after ten minutes: never send it late.
    /// app.job("send_code").expires_in(Duration::from_secs(600)).defer(&"a@b.c")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn expires_in(mut self, d: Duration) -> Self {
        self.expiry = Some(Expiry::In(d));
        self
    }

    /// At most this many attempts for this job, whatever its task's
    /// [`RetryStrategy`](crate::RetryStrategy) allows (its delays still apply between
    /// attempts): 1 runs it once. Snoozes ([`TaskError::snooze`](crate::TaskError::snooze))
    /// do not count. Zero, or more than `i32::MAX`, is an
    /// [`InvalidInput`](ErrorKind::InvalidInput) error when the job is deferred. Defaults to
    /// the task's strategy.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Tags for operators: listed with the job, and a filter of the admin API
    /// ([`JobFilter::tag`](crate::JobFilter::tag)) and of `postpone jobs --tag`. Each is a
    /// non-empty text of at most 255 bytes, at most
    /// [`MAX_TAGS`] of them (checked when the job is deferred). Defaults to none.
    pub fn tags<I, T>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.tags = Some(tags.into_iter().map(Into::into).collect());
        self
    }

    /// Makes the job unique: no job is inserted while another with the same key (task,
    /// arguments, and what `unique` adds) is in the states it names; the insert reports the
    /// job that covers it instead. [`defer_unique`](NewJob::defer_unique) and
    /// [`App::defer_batch_unique`](crate::App::defer_batch_unique) return that as
    /// [`Deferred::Duplicate`]; `defer` and `defer_in` as an error of kind
    /// [`AlreadyEnqueued`](ErrorKind::AlreadyEnqueued) naming its id; `defer_batch` refuses
    /// unique jobs. See [`Unique`] for an example. Defaults to none.
    pub fn unique(mut self, unique: Unique) -> Self {
        self.unique = Some(unique);
        self
    }

    /// Metadata for operators: a JSON object (shown with the job by the admin API; workers
    /// do not read it). Anything that does not serialize to a JSON object, or whose JSON is
    /// over [`MAX_META_BYTES`], is an [`InvalidInput`](ErrorKind::InvalidInput) error when
    /// the job is deferred. Defaults to none.
    pub fn meta<M: Serialize + ?Sized>(mut self, meta: &M) -> Self {
        self.meta = Some(match serde_json::to_value(meta) {
            Ok(serde_json::Value::Object(_)) => match serialize_args(meta) {
                Ok(json) if json.0.len() <= MAX_META_BYTES => Ok(json),
                Ok(json) => Err(format!(
                    "invalid meta: {} bytes of JSON, over the {MAX_META_BYTES} allowed",
                    json.0.len()
                )),
                Err(e) => Err(format!("invalid meta: {e}")),
            },
            Ok(other) => Err(format!(
                "invalid meta: it must be a JSON object, not {}",
                json_kind(&other)
            )),
            Err(e) => Err(format!("invalid meta: it does not serialize to JSON: {e}")),
        });
        self
    }

    /// Runs the job only once every job of `jobs` has succeeded. Until then it waits
    /// (`todo`, and no worker claims it); if one of them ends failed, cancelled or aborted, or
    /// is deleted before it finished, this job ends `cancelled` with an error naming it (and
    /// so do the jobs waiting for this one in turn). Jobs already finished when this one is
    /// deferred count at once. Every id must name a job that exists: an unknown or deleted
    /// one is an error of kind [`NotFound`](ErrorKind::NotFound) when the job is deferred, and
    /// nothing is inserted. Calls add up. Defaults to none.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let fetch = app.defer("fetch", &"https://example.com/a.csv")?;
    /// let parse = app.job("parse").after(&[fetch]).defer(&"a.csv")?;
    /// let report = app.job("report").after(&[parse]).defer(&())?;
    /// // Whatever happened to the others, clean up once they are done:
    /// app.job("cleanup").after_finished(&[fetch, parse, report]).defer(&())?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A dependent reads what its dependencies recorded with
    /// [`Job::dependency_outputs`](crate::Job::dependency_outputs). See also
    /// [`after_finished`](Self::after_finished).
    pub fn after(mut self, jobs: &[JobId]) -> Self {
        self.after.extend_from_slice(jobs);
        self
    }

    /// Runs the job only once every job of `jobs` has finished, whatever its outcome
    /// (succeeded, failed, cancelled, aborted, or deleted before it finished). Otherwise as
    /// [`after`](Self::after), with which it combines (a job named by both must succeed).
    /// Calls add up. Defaults to none.
    pub fn after_finished(mut self, jobs: &[JobId]) -> Self {
        self.after_finished.extend_from_slice(jobs);
        self
    }

    /// The task name.
    pub fn task(&self) -> &str {
        &self.task
    }

    fn validate(&self) -> Result<()> {
        if self.task.trim().is_empty() {
            return Err(Error::invalid("invalid task name: it must not be empty"));
        }
        if self.queue.as_deref().is_some_and(|q| q.trim().is_empty()) {
            return Err(Error::invalid("invalid queue name: it must not be empty"));
        }
        for (what, v) in [("lock", &self.lock), ("queueing lock", &self.queueing_lock)] {
            if v.as_deref().is_some_and(str::is_empty) {
                return Err(Error::invalid(format!(
                    "invalid {what}: it must not be empty (leave it unset instead)"
                )));
            }
        }
        for (what, v) in [
            ("task name", Some(&self.task)),
            ("queue name", self.queue.as_ref()),
            ("lock", self.lock.as_ref()),
            ("queueing lock", self.queueing_lock.as_ref()),
        ] {
            if v.is_some_and(|s| s.contains('\0')) {
                return Err(Error::invalid(format!(
                    "invalid {what}: it contains a NUL character"
                )));
            }
        }
        // What notification payloads and index entries can hold, and a schedule the
        // database's timestamps can reach.
        crate::limits::check_name("task name", &self.task)?;
        if let Some(q) = &self.queue {
            crate::limits::check_name("queue name", q)?;
        }
        for (what, v) in [("lock", &self.lock), ("queueing lock", &self.queueing_lock)] {
            if let Some(v) = v {
                crate::limits::check_lock(what, v)?;
            }
        }
        match self.schedule {
            Schedule::In(d) => crate::limits::check_schedule(d)?,
            Schedule::At(t) => {
                crate::limits::check_time("schedule", t)?;
                if let Ok(d) = t.duration_since(SystemTime::now()) {
                    crate::limits::check_schedule(d)?;
                }
            }
            Schedule::Now => {}
        }
        if let Some(e) = self.expiry {
            check_expiry(self.schedule, e, SystemTime::now())?;
        }
        if let Some(tags) = &self.tags {
            if tags.len() > MAX_TAGS {
                return Err(Error::invalid(format!(
                    "invalid tags: {} of them, over the {MAX_TAGS} allowed",
                    tags.len()
                )));
            }
            for t in tags {
                crate::limits::check_name("tag", t)?;
            }
        }
        if let Some(Err(e)) = &self.meta {
            return Err(Error::invalid(e.clone()));
        }
        if let Some(n) = self.max_attempts {
            if n == 0 || n > i32::MAX as u32 {
                return Err(Error::invalid(format!(
                    "invalid max_attempts {n}: it must be at least 1 and at most {}",
                    i32::MAX
                )));
            }
        }
        if let Some(u) = &self.unique {
            if !self.after.is_empty() || !self.after_finished.is_empty() {
                return Err(Error::invalid(
                    "invalid unique job: a unique job cannot have dependencies (after, after_finished); drop one of them",
                ));
            }
            u.period_us()?;
            if u.scope() == UniqueStates::Waiting.scope() && self.queueing_lock.is_some() {
                return Err(Error::invalid(
                    "invalid unique job: UniqueStates::Waiting is kept as the job's queueing lock, so it cannot be combined with queueing_lock; drop one of them",
                ));
            }
        }
        Ok(())
    }

    /// The row to insert, with the task's defaults applied.
    fn row(&self, defaults: &TaskDefaults) -> Row {
        let (dq, dp) = defaults.get(&self.task);
        let (at, delay_us) = match self.schedule {
            Schedule::Now => (None, 0),
            Schedule::At(t) => (Some(t), 0),
            Schedule::In(d) => (None, d.as_micros().min(i64::MAX as u128) as i64),
        };
        let (expires_at, expires_in_us) = match self.expiry {
            None => (None, None),
            Some(Expiry::At(t)) => (Some(t), None),
            Some(Expiry::In(d)) => (None, Some(d.as_micros().min(i64::MAX as u128) as i64)),
        };
        Row {
            expires_at,
            expires_in_us,
            queue: self
                .queue
                .clone()
                .or_else(|| dq.map(str::to_owned))
                .unwrap_or_else(|| DEFAULT_QUEUE.to_owned()),
            task: self.task.clone(),
            args: self.args.clone(),
            priority: self.priority.or(dp).unwrap_or(0),
            lock: self.lock.clone(),
            queueing_lock: self.queueing_lock.clone(),
            at,
            delay_us,
            max_attempts: self.max_attempts.map(|n| n.min(i32::MAX as u32) as i32),
            tags: self.tags.clone(),
            meta: self.meta.clone().and_then(|m| m.ok()),
            unique: self.unique,
            after: self.after.iter().map(|id| id.0).collect(),
            after_finished: self.after_finished.iter().map(|id| id.0).collect(),
        }
    }
}

/// Checks an expiry against the job's schedule, `now` being this process's clock (used only
/// to compare an instant with a delay).
fn check_expiry(schedule: Schedule, expiry: Expiry, now: SystemTime) -> Result<()> {
    // The deadline and the due time, as offsets from now (negative: past).
    let offset = |t: SystemTime| -> i128 {
        match t.duration_since(now) {
            Ok(d) => d.as_micros() as i128,
            Err(e) => -(e.duration().as_micros() as i128),
        }
    };
    let due = match schedule {
        Schedule::Now => 0,
        Schedule::In(d) => d.as_micros() as i128,
        Schedule::At(t) => offset(t).max(0),
    };
    let deadline = match expiry {
        Expiry::In(d) => {
            crate::limits::check_schedule(d).map_err(|_| {
                Error::invalid(
                    "invalid expiry: more than 100 years ahead (the most a deadline can lie)",
                )
            })?;
            d.as_micros() as i128
        }
        Expiry::At(t) => {
            crate::limits::check_time("expiry", t)?;
            let o = offset(t);
            if o > crate::limits::MAX_DELAY.as_micros() as i128 {
                return Err(Error::invalid(
                    "invalid expiry: more than 100 years ahead (the most a deadline can lie)",
                ));
            }
            o
        }
    };
    if deadline <= due {
        let when = |us: i128| -> String {
            let s = us.unsigned_abs() as f64 / 1e6;
            match us {
                0 => "now".to_owned(),
                u if u > 0 => format!("{s:.3} s from now"),
                _ => format!("{s:.3} s ago"),
            }
        };
        return Err(Error::invalid(format!(
            "invalid expiry: the deadline ({}) is not after the job's scheduled time ({}); a job must be able to start before it expires",
            when(deadline),
            when(due)
        )));
    }
    Ok(())
}

impl<'a> NewJob<Bound<'a>> {
    pub(crate) fn bound(app: &'a dyn Inserter, task: &str) -> JobBuilder<'a> {
        NewJob::blank(Bound(app), task.to_owned())
    }

    fn prepare<A: Serialize + ?Sized>(self, args: &A) -> Result<(&'a dyn Inserter, Row)> {
        let app = self.target.0;
        let job = self.with_args(serialize_args(args)?);
        job.validate()?;
        Ok((app, job.row(app.defaults())))
    }

    /// Inserts the job through the App's pool; returns its id once committed.
    pub fn defer<A: Serialize + ?Sized>(self, args: &A) -> Result<JobId> {
        let (app, row) = self.prepare(args)?;
        let mut conn = app.pooled()?;
        if row.unique.is_some() {
            return row
                .insert_unique(app.namespace(), &mut conn)
                .and_then(duplicate_error);
        }
        row.insert_on(app.namespace(), &mut conn)
    }

    /// Inserts the job through the App's pool unless a job that covers it exists (see
    /// [`unique`](NewJob::unique)): returns [`Deferred::Inserted`] with the new id once
    /// committed, or [`Deferred::Duplicate`] with the id of that job. A job without
    /// `unique` is always inserted (a taken queueing lock is still an
    /// [`AlreadyEnqueued`](ErrorKind::AlreadyEnqueued) error).
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// use postpone::Unique;
    /// let first = app.job("sync").unique(Unique::by_args()).defer_unique(&42)?;
    /// let second = app.job("sync").unique(Unique::by_args()).defer_unique(&42)?;
    /// assert!(second.is_duplicate());
    /// assert_eq!(second.id(), first.id());
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer_unique<A: Serialize + ?Sized>(self, args: &A) -> Result<Deferred> {
        let (app, row) = self.prepare(args)?;
        let mut conn = app.pooled()?;
        row.insert_unique(app.namespace(), &mut conn)
    }

    /// Like [`defer_unique`](Self::defer_unique), with the caller's client (see
    /// [`defer_in`](Self::defer_in)): inside its transaction, a duplicate is reported against
    /// what that transaction sees, and waits for other transactions inserting the same key.
    pub fn defer_unique_in<C: DeferClient + ?Sized, A: Serialize + ?Sized>(
        self,
        client: &mut C,
        args: &A,
    ) -> Result<Deferred> {
        let (app, row) = self.prepare(args)?;
        row.insert_unique(app.namespace(), client)
    }

    /// Inserts the job through the App's pool, then waits until it is finished and returns
    /// its status and output: [`App::wait`](crate::App::wait) with the id, whose errors and
    /// bounds apply (`timeout` counts from the insert).
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// use std::time::Duration;
    /// let result = app
    ///     .job("add")
    ///     .queue("math")
    ///     .defer_and_wait(&(2, 3), Duration::from_secs(10))?;
    /// assert_eq!(result.output_as::<i64>()?, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer_and_wait<A: Serialize + ?Sized>(
        self,
        args: &A,
        timeout: Duration,
    ) -> Result<JobResult> {
        let app = self.target.0;
        let id = self.defer(args)?;
        app.wait(id, timeout)
    }

    /// Inserts the job with the caller's client, typically inside its transaction: the job
    /// exists if and only if that transaction commits. The client is any
    /// `postgres::GenericClient` (which has no deadline of ours), or a postpone
    /// [`Connection`], [`Transaction`](crate::Transaction) or
    /// [`PooledConnection`](crate::PooledConnection) (see [`DeferClient`]).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let mut client = postgres::Client::connect("host=127.0.0.1 user=postgres", postgres::NoTls)?;
    /// let mut tx = client.transaction()?;
    /// tx.execute("CREATE TEMP TABLE orders (id int)", &[])?;
    /// app.job("ship_order").defer_in(&mut tx, &serde_json::json!({"order": 1}))?;
    /// tx.commit()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer_in<C: DeferClient + ?Sized, A: Serialize + ?Sized>(
        self,
        client: &mut C,
        args: &A,
    ) -> Result<JobId> {
        let (app, row) = self.prepare(args)?;
        let ns = app.namespace();
        if row.unique.is_some() {
            return row.insert_unique(ns, client).and_then(duplicate_error);
        }
        if row.has_deps() {
            return row.insert_after(ns, client);
        }
        let rows = client
            .run_query(
                "deferring a job",
                &ns.qualify(store::JOB_INSERT),
                &row.params(),
            )
            .map_err(|e| defer_error(e, row.queueing_lock.as_deref()))?;
        crate::metrics::deferred(&row.task);
        let r = rows.first().ok_or_else(|| {
            Error::new(
                crate::error::ErrorKind::Other,
                "deferring a job: the insert returned no row",
            )
        })?;
        Ok(JobId(r.get(0)))
    }

    /// Inserts the job on a connection of ours, e.g. inside a transaction started with
    /// [`Connection::begin`] in task code. The same as [`defer_in`](Self::defer_in), which
    /// takes a [`Connection`] too.
    pub fn defer_on<A: Serialize + ?Sized>(self, conn: &mut Connection, args: &A) -> Result<JobId> {
        let (app, row) = self.prepare(args)?;
        if row.unique.is_some() {
            return row
                .insert_unique(app.namespace(), conn)
                .and_then(duplicate_error);
        }
        row.insert_on(app.namespace(), conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_expiry_must_come_after_the_schedule_and_within_100_years() {
        let now = SystemTime::now();
        let ok = |s, e| check_expiry(s, e, now).is_ok();
        assert!(ok(Schedule::Now, Expiry::In(S)));
        assert!(!ok(Schedule::Now, Expiry::In(Duration::ZERO)));
        assert!(!ok(Schedule::Now, Expiry::At(now - S)));
        assert!(ok(Schedule::Now, Expiry::At(now + S)));
        assert!(!ok(Schedule::In(2 * S), Expiry::In(S)));
        assert!(!ok(Schedule::In(S), Expiry::In(S)));
        assert!(ok(Schedule::In(S), Expiry::In(2 * S)));
        assert!(!ok(Schedule::At(now + 2 * S), Expiry::At(now + S)));
        assert!(ok(Schedule::At(now + S), Expiry::In(2 * S)));
        // A schedule in the past is due now.
        assert!(ok(Schedule::At(now - 60 * S), Expiry::In(S)));
        assert!(!ok(Schedule::Now, Expiry::In(crate::limits::MAX_DELAY + S)));
        assert!(!ok(
            Schedule::Now,
            Expiry::At(now + crate::limits::MAX_DELAY + S)
        ));
        let e = check_expiry(Schedule::In(2 * S), Expiry::In(S), now).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(
            e.to_string()
                .contains("is not after the job's scheduled time"),
            "{e}"
        );
    }
}
