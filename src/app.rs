//! [`App`]: the handle programs keep to defer jobs, migrate, reach the pool and administer.
//!
//! It is a cheap `Clone` over an `Arc`: the parsed connection settings, the watchdog that can
//! sever every socket of the App, and an r2d2 pool of deadline-bounded connections. The
//! schema version is checked once per App, on the first call that needs it.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use postgres::GenericClient;
use serde::Serialize;

use crate::conn::options::ConnectOptions;
use crate::conn::pool::{self, Manager, Pool, Pooled};
use crate::conn::tls::SslMode;
use crate::conn::watchdog::Watchdog;
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, RawJson};
use crate::schema;
use crate::store;
use crate::task::Tasks;

/// The application handle: defers jobs and owns the connection pool.
///
/// Cheap to clone, `Send + Sync`: keep one per process and clone it where needed.
///
/// ```no_run
/// use serde_json::json;
///
/// # fn main() -> postpone::Result<()> {
/// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// app.migrate()?;
/// let id = app.defer("send_email", &json!({"to": "a@b.c"}))?;
/// let id2 = app
///     .job("send_email")
///     .queue("emails")
///     .priority(5)
///     .schedule_in(std::time::Duration::from_secs(60))
///     .defer(&json!({"to": "d@e.f"}))?;
/// assert!(id2 > id);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct App {
    pub(crate) inner: Arc<AppInner>,
}

pub(crate) struct AppInner {
    pub(crate) opts: Arc<ConnectOptions>,
    pub(crate) watchdog: Watchdog,
    group: u64,
    pool: Pool,
    pool_timeout: Duration,
    /// Bumped by every `sever_all`, so that checkouts waiting for a connection give up too.
    severs: AtomicU64,
    schema_ok: AtomicBool,
    defaults: HashMap<String, (Option<String>, Option<i32>)>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("database", &self.inner.opts.describe())
            .finish_non_exhaustive()
    }
}

/// Builds an [`App`] with settings other than the defaults.
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> postpone::Result<()> {
/// let app = postpone::App::builder("postgres://postgres@127.0.0.1/postgres")
///     .pool_size(8)
///     .io_timeout(Duration::from_secs(5))
///     .connect_timeout(Duration::from_secs(5))
///     .build()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "call .build() to connect"]
pub struct AppBuilder {
    url: String,
    pool_size: u32,
    io_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    pool_timeout: Option<Duration>,
    tcp_user_timeout: Option<Duration>,
    lazy: bool,
    defaults: HashMap<String, (Option<String>, Option<i32>)>,
    ssl_mode: Option<SslMode>,
    ssl_root_cert: Option<PathBuf>,
    ssl_client_cert: Option<(PathBuf, PathBuf)>,
}

impl AppBuilder {
    /// How TLS is negotiated, as libpq's `sslmode`; wins over the URL's. Defaults to the URL's,
    /// else [`SslMode::Prefer`].
    pub fn ssl_mode(mut self, mode: SslMode) -> AppBuilder {
        self.ssl_mode = Some(mode);
        self
    }

    /// A PEM file of the roots the server's certificate must chain to; wins over the URL's
    /// `sslrootcert`. With `Prefer` or `Require` it makes the check that `VerifyCa` does, as
    /// in libpq. Defaults to the URL's, else the system's store for the verify modes.
    pub fn ssl_root_cert(mut self, path: impl Into<PathBuf>) -> AppBuilder {
        self.ssl_root_cert = Some(path.into());
        self
    }

    /// A client certificate and its unencrypted key (PEM files), for servers that
    /// authenticate clients by certificate; wins over the URL's `sslcert`/`sslkey`.
    /// Defaults to none.
    pub fn ssl_client_cert(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> AppBuilder {
        self.ssl_client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Most connections the App's pool opens. Defaults to 8.
    pub fn pool_size(mut self, size: u32) -> AppBuilder {
        self.pool_size = size;
        self
    }

    /// Deadline of every round-trip to the database. Defaults to 10 s.
    pub fn io_timeout(mut self, timeout: Duration) -> AppBuilder {
        self.io_timeout = Some(timeout);
        self
    }

    /// Deadline of opening a connection: TCP connect, TLS and startup handshakes, per host.
    /// Defaults to the `connect_timeout` of the URL, or 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> AppBuilder {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Longest wait for a connection from the pool. Defaults to `connect_timeout` + 1 s.
    pub fn pool_timeout(mut self, timeout: Duration) -> AppBuilder {
        self.pool_timeout = Some(timeout);
        self
    }

    /// TCP_USER_TIMEOUT of every socket (Linux): how long sent data may stay unacknowledged
    /// before the kernel drops the connection. Defaults to the URL's, or 30 s.
    pub fn tcp_user_timeout(mut self, timeout: Duration) -> AppBuilder {
        self.tcp_user_timeout = Some(timeout);
        self
    }

    /// Skips the connection made by `build` to check that the server answers: the App is
    /// built even while the database is down, and connects on first use. Defaults to false.
    pub fn lazy(mut self, lazy: bool) -> AppBuilder {
        self.lazy = lazy;
        self
    }

    /// Lets `app.job(name)` use the default queue and priority registered with each task
    /// ([`TaskOptions::queue`](crate::TaskOptions::queue)) when the call gives none.
    pub fn task_defaults(mut self, tasks: &Tasks) -> AppBuilder {
        for (name, task) in &tasks.map {
            let o = &task.options;
            if o.queue.is_some() || o.priority.is_some() {
                self.defaults
                    .insert(name.clone(), (o.queue.clone(), o.priority));
            }
        }
        self
    }

    /// Parses the URL, starts the watchdog and the pool, and (unless [`lazy`](Self::lazy))
    /// opens one connection to check that the server answers.
    pub fn build(self) -> Result<App> {
        let mut opts = ConnectOptions::parse(&self.url)?;
        if self.ssl_mode.is_some() || self.ssl_root_cert.is_some() || self.ssl_client_cert.is_some()
        {
            let client = self
                .ssl_client_cert
                .as_ref()
                .map(|(c, k)| (c.as_path(), k.as_path()));
            opts.tls =
                opts.tls
                    .with_overrides(self.ssl_mode, self.ssl_root_cert.as_deref(), client)?;
            opts.config.ssl_mode(opts.tls.driver_mode());
        }
        let positive = |name: &str, d: Duration| {
            if d.is_zero() {
                Err(Error::new(
                    ErrorKind::Config,
                    format!("invalid {name}: it must be longer than zero"),
                ))
            } else {
                Ok(d)
            }
        };
        if let Some(t) = self.io_timeout {
            opts.io_timeout = positive("io_timeout", t)?;
        }
        if let Some(t) = self.connect_timeout {
            opts.connect_timeout = positive("connect_timeout", t)?;
        }
        if let Some(t) = self.tcp_user_timeout {
            opts.tcp_user_timeout = positive("tcp_user_timeout", t)?;
        }
        if self.pool_size == 0 {
            return Err(Error::new(
                ErrorKind::Config,
                "invalid pool_size: it must be at least 1",
            ));
        }
        let pool_timeout = match self.pool_timeout {
            Some(t) => positive("pool_timeout", t)?,
            None => opts.connect_timeout + Duration::from_secs(1),
        };
        let opts = Arc::new(opts);
        let watchdog = Watchdog::start()
            .map_err(|e| Error::with_source(ErrorKind::Other, "starting the watchdog thread", e))?;
        let group = watchdog.new_group();
        if !self.lazy {
            Connection::open(&opts, &watchdog, group, None).map_err(|e| {
                e.context(format_args!(
                    "cannot reach the database {}",
                    opts.describe()
                ))
            })?;
        }
        let manager = Manager::new(opts.clone(), watchdog.clone(), group);
        let pool = pool::build(manager, self.pool_size, pool_timeout)?;
        Ok(App {
            inner: Arc::new(AppInner {
                opts,
                watchdog,
                group,
                pool,
                pool_timeout,
                severs: AtomicU64::new(0),
                schema_ok: AtomicBool::new(false),
                defaults: self.defaults,
            }),
        })
    }
}

impl App {
    /// Connects with default settings: checks that the server answers, then returns.
    ///
    /// `url` is a URL (`postgres://user:pass@host:5432/db?sslmode=require`) or a key=value
    /// string (`host=... user=... dbname=...`). A malformed string is an error of kind
    /// [`Config`](ErrorKind::Config); a server that cannot be reached within
    /// `connect_timeout`, one of kind `Connect` or `Timeout`.
    pub fn connect(url: &str) -> Result<App> {
        App::builder(url).build()
    }

    /// Starts an [`AppBuilder`] for `url`.
    pub fn builder(url: impl Into<String>) -> AppBuilder {
        AppBuilder {
            url: url.into(),
            pool_size: 8,
            io_timeout: None,
            connect_timeout: None,
            pool_timeout: None,
            tcp_user_timeout: None,
            lazy: false,
            defaults: HashMap::new(),
            ssl_mode: None,
            ssl_root_cert: None,
            ssl_client_cert: None,
        }
    }

    /// Installs or upgrades the schema. Idempotent, and safe to run from many processes at
    /// once. Returns the migration versions this call applied (empty if none were missing).
    pub fn migrate(&self) -> Result<Vec<i32>> {
        let mut conn = self.connection_unchecked()?;
        let applied = schema::migrate(&mut conn)?;
        self.inner.schema_ok.store(true, Ordering::Release);
        Ok(applied)
    }

    /// The schema version installed in the database, or `None` if postpone is not installed.
    pub fn schema_version(&self) -> Result<Option<i32>> {
        let mut conn = self.connection_unchecked()?;
        schema::installed_version(&mut conn)
    }

    /// A pooled connection, checked out within `pool_timeout`; every call on it has the
    /// App's `io_timeout`. It goes back to the pool when dropped (or is discarded if broken).
    pub fn connection(&self) -> Result<PooledConnection> {
        let mut conn = self.connection_unchecked()?;
        self.ensure_schema(&mut conn)?;
        Ok(conn)
    }

    pub(crate) fn connection_unchecked(&self) -> Result<PooledConnection> {
        let conn = pool::checkout(
            &self.inner.pool,
            self.inner.pool_timeout,
            &self.inner.severs,
        )?;
        // Checked out by a worker's task: a sever of that worker reaches it.
        conn.lend(crate::conn::watchdog::current_borrower());
        Ok(PooledConnection(conn))
    }

    /// Checks the schema version once per App.
    pub(crate) fn ensure_schema(&self, conn: &mut Connection) -> Result<()> {
        if self.inner.schema_ok.load(Ordering::Acquire) {
            return Ok(());
        }
        schema::check(conn)?;
        self.inner.schema_ok.store(true, Ordering::Release);
        Ok(())
    }

    /// Defers a job of `task` with `args` on the default queue, now; returns its id once
    /// the insert is committed. Use [`job`](Self::job) for the other options.
    pub fn defer<A: Serialize + ?Sized>(&self, task: &str, args: &A) -> Result<JobId> {
        self.job(task).defer(args)
    }

    /// Starts deferring a job of `task`: set options, then [`defer`](JobBuilder::defer).
    pub fn job(&self, task: &str) -> JobBuilder<'_> {
        let (queue, priority) = self
            .inner
            .defaults
            .get(task)
            .cloned()
            .unwrap_or((None, None));
        JobBuilder {
            app: self,
            new: NewJob {
                task: task.to_owned(),
                queue,
                priority: priority.unwrap_or(0),
                lock: None,
                queueing_lock: None,
                schedule: Schedule::Now,
                args: RawJson::default(),
            },
        }
    }

    /// Defers many jobs in one round-trip and one transaction: all are inserted, or none.
    /// Returns their ids in input order. Listening workers get one notification per queue.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let jobs = (0..1000)
    ///     .map(|i| postpone::NewJob::new("index", &i))
    ///     .collect::<postpone::Result<Vec<_>>>()?;
    /// let ids = app.defer_batch(&jobs)?;
    /// assert_eq!(ids.len(), 1000);
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer_batch(&self, jobs: &[NewJob]) -> Result<Vec<JobId>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let cols = BatchColumns::new(jobs, &self.inner.defaults)?;
        let mut conn = self.connection()?;
        let rows = conn
            .query_cached("deferring jobs", store::JOB_INSERT_BATCH, &cols.params())
            .map_err(|e| defer_error(e, None))?;
        Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
    }

    /// Like [`defer_batch`](Self::defer_batch), inside the caller's transaction or client.
    pub fn defer_batch_in<C: GenericClient>(
        &self,
        client: &mut C,
        jobs: &[NewJob],
    ) -> Result<Vec<JobId>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let cols = BatchColumns::new(jobs, &self.inner.defaults)?;
        let rows = client
            .query(store::JOB_INSERT_BATCH, &cols.params())
            .map_err(|e| defer_error(Error::from_client("deferring jobs", e), None))?;
        Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
    }

    /// Severs every socket of this App's pool at once: every blocked round-trip returns an
    /// error within milliseconds and its connection is discarded, and so does every call
    /// waiting for a pooled connection (a connect in progress included). Returns how many
    /// sockets were severed. (Workers have their own sockets; stop them with their handle.)
    pub fn sever_all(&self) -> usize {
        // First, so that a checkout waiting for a connection (its connect about to be
        // severed) gives up instead of waiting for r2d2's retry.
        self.inner.severs.fetch_add(1, Ordering::AcqRel);
        self.inner.watchdog.sever_group(self.inner.group)
    }

    /// The deadline of every round-trip.
    pub fn io_timeout(&self) -> Duration {
        self.inner.opts.io_timeout
    }

    /// The deadline of opening a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.inner.opts.connect_timeout
    }

    /// Live sockets of this App's pool (for tests and metrics).
    pub fn open_sockets(&self) -> usize {
        self.inner.watchdog.live(Some(self.inner.group))
    }
}

/// The queue of jobs deferred without one (a static, so that it can be lent as a parameter).
static DEFAULT_QUEUE: &str = "default";

/// A connection checked out of the App's pool; derefs to [`Connection`].
pub struct PooledConnection(Pooled);

impl Deref for PooledConnection {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.0
    }
}

impl DerefMut for PooledConnection {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.0
    }
}

impl Drop for PooledConnection {
    fn drop(&mut self) {
        self.0.lend(0);
    }
}

impl std::fmt::Debug for PooledConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[derive(Clone, Debug)]
enum Schedule {
    Now,
    At(SystemTime),
    In(Duration),
}

/// A job to insert, for [`App::defer_batch`]: a task name, serialized arguments and options.
#[derive(Clone, Debug)]
pub struct NewJob {
    task: String,
    queue: Option<String>,
    priority: i32,
    lock: Option<String>,
    queueing_lock: Option<String>,
    schedule: Schedule,
    args: RawJson,
}

impl NewJob {
    /// A job of `task` with `args`, serialized now (an argument that does not serialize to
    /// JSON is an error of kind `InvalidInput`).
    pub fn new<A: Serialize + ?Sized>(task: impl Into<String>, args: &A) -> Result<NewJob> {
        Ok(NewJob {
            task: task.into(),
            queue: None,
            priority: 0,
            lock: None,
            queueing_lock: None,
            schedule: Schedule::Now,
            args: serialize_args(args)?,
        })
    }

    /// The queue. Defaults to the task's default queue, or `"default"`.
    pub fn queue(mut self, queue: impl Into<String>) -> NewJob {
        self.queue = Some(queue.into());
        self
    }

    /// Higher runs first. Defaults to 0.
    pub fn priority(mut self, priority: i32) -> NewJob {
        self.priority = priority;
        self
    }

    /// At most one job of this lock runs at a time, in defer order.
    pub fn lock(mut self, lock: impl Into<String>) -> NewJob {
        self.lock = Some(lock.into());
        self
    }

    /// At most one job of this queueing lock waits (`todo`) at a time.
    pub fn queueing_lock(mut self, lock: impl Into<String>) -> NewJob {
        self.queueing_lock = Some(lock.into());
        self
    }

    /// Not before `at`.
    pub fn schedule_at(mut self, at: SystemTime) -> NewJob {
        self.schedule = Schedule::At(at);
        self
    }

    /// Not before `delay` from now (by the database's clock).
    pub fn schedule_in(mut self, delay: Duration) -> NewJob {
        self.schedule = Schedule::In(delay);
        self
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
                if let Ok(d) = t.duration_since(SystemTime::now()) {
                    crate::limits::check_schedule(d)?;
                }
            }
            Schedule::Now => {}
        }
        Ok(())
    }

    fn schedule_params(&self) -> (Option<SystemTime>, i64) {
        match self.schedule {
            Schedule::Now => (None, 0),
            Schedule::At(t) => (Some(t), 0),
            Schedule::In(d) => (None, d.as_micros().min(i64::MAX as u128) as i64),
        }
    }
}

/// Serializes job arguments, refusing what PostgreSQL's jsonb cannot store.
pub(crate) fn serialize_args<A: Serialize + ?Sized>(args: &A) -> Result<RawJson> {
    let text = serde_json::to_string(args).map_err(|e| {
        Error::with_source(
            ErrorKind::InvalidInput,
            "job arguments do not serialize to JSON",
            e,
        )
    })?;
    if text.contains("\\u0000") {
        return Err(Error::invalid(
            "job arguments contain a NUL character (\\u0000), which PostgreSQL jsonb cannot store",
        ));
    }
    Ok(RawJson(text))
}

/// Turns a unique violation of the queueing-lock index into `AlreadyEnqueued`.
fn defer_error(e: Error, queueing_lock: Option<&str>) -> Error {
    if e.sqlstate() == Some("23505") && e.constraint() == Some(store::QUEUEING_LOCK_INDEX) {
        let msg = match queueing_lock {
            Some(l) => format!(
                "deferring a job: a job with queueing lock {l:?} is already waiting (todo); nothing was inserted"
            ),
            None => "deferring jobs: a job with one of these queueing locks is already waiting (todo); nothing was inserted".to_owned(),
        };
        return Error::new(ErrorKind::AlreadyEnqueued, msg).set_sqlstate("23505");
    }
    e
}

/// Options of a job being deferred; from [`App::job`].
#[must_use = "call .defer(&args) to insert the job"]
pub struct JobBuilder<'a> {
    app: &'a App,
    new: NewJob,
}

impl std::fmt::Debug for JobBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobBuilder")
            .field("job", &self.new)
            .finish()
    }
}

impl<'a> JobBuilder<'a> {
    /// The queue. Defaults to the task's default queue, or `"default"`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.new = self.new.queue(queue);
        self
    }

    /// Higher runs first. Defaults to 0 (or the task's default priority).
    pub fn priority(mut self, priority: i32) -> Self {
        self.new = self.new.priority(priority);
        self
    }

    /// At most one job of this lock runs at a time, in defer order.
    pub fn lock(mut self, lock: impl Into<String>) -> Self {
        self.new = self.new.lock(lock);
        self
    }

    /// At most one job of this queueing lock waits (`todo`) at a time; deferring a second is
    /// an error of kind [`AlreadyEnqueued`](ErrorKind::AlreadyEnqueued).
    pub fn queueing_lock(mut self, lock: impl Into<String>) -> Self {
        self.new = self.new.queueing_lock(lock);
        self
    }

    /// Not before `at`.
    pub fn schedule_at(mut self, at: SystemTime) -> Self {
        self.new = self.new.schedule_at(at);
        self
    }

    /// Not before `delay` from now (by the database's clock).
    pub fn schedule_in(mut self, delay: Duration) -> Self {
        self.new = self.new.schedule_in(delay);
        self
    }

    fn prepare<A: Serialize + ?Sized>(mut self, args: &A) -> Result<NewJob> {
        self.new.args = serialize_args(args)?;
        self.new.validate()?;
        Ok(self.new)
    }

    /// Inserts the job through the App's pool; returns its id once committed.
    pub fn defer<A: Serialize + ?Sized>(self, args: &A) -> Result<JobId> {
        let app = self.app;
        let job = self.prepare(args)?;
        let mut conn = app.connection()?;
        job.insert_on(&mut conn)
    }

    /// Inserts the job with the caller's client, typically inside its transaction: the job
    /// exists if and only if that transaction commits. (The caller's client has no deadline
    /// of ours.)
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
    pub fn defer_in<C: GenericClient, A: Serialize + ?Sized>(
        self,
        client: &mut C,
        args: &A,
    ) -> Result<JobId> {
        let job = self.prepare(args)?;
        let (at, delay) = job.schedule_params();
        let row = client
            .query_one(store::JOB_INSERT, &job.insert_params(&at, &delay))
            .map_err(|e| {
                defer_error(
                    Error::from_client("deferring a job", e),
                    job.queueing_lock.as_deref(),
                )
            })?;
        Ok(JobId(row.get(0)))
    }

    /// Inserts the job on a connection of ours, e.g. inside a transaction started with
    /// [`Connection::begin`] in task code.
    pub fn defer_on<A: Serialize + ?Sized>(self, conn: &mut Connection, args: &A) -> Result<JobId> {
        self.prepare(args)?.insert_on(conn)
    }
}

impl NewJob {
    /// The parameters of `store::JOB_INSERT`.
    fn insert_params<'a>(
        &'a self,
        at: &'a Option<SystemTime>,
        delay: &'a i64,
    ) -> [&'a (dyn postgres::types::ToSql + Sync); 8] {
        [
            match &self.queue {
                Some(q) => q,
                None => &DEFAULT_QUEUE,
            },
            &self.task,
            &self.args,
            &self.priority,
            &self.lock,
            &self.queueing_lock,
            at,
            delay,
        ]
    }

    /// Inserts this job on one of our connections.
    fn insert_on(&self, conn: &mut Connection) -> Result<JobId> {
        let (at, delay) = self.schedule_params();
        let rows = conn
            .query_cached(
                "deferring a job",
                store::JOB_INSERT,
                &self.insert_params(&at, &delay),
            )
            .map_err(|e| defer_error(e, self.queueing_lock.as_deref()))?;
        Ok(JobId(rows[0].get(0)))
    }
}

/// Column arrays of a batch insert.
struct BatchColumns {
    queue: Vec<String>,
    task: Vec<String>,
    args: Vec<RawJson>,
    priority: Vec<i32>,
    lock: Vec<Option<String>>,
    queueing_lock: Vec<Option<String>>,
    at: Vec<Option<SystemTime>>,
    delay: Vec<i64>,
}

impl BatchColumns {
    fn new(
        jobs: &[NewJob],
        defaults: &HashMap<String, (Option<String>, Option<i32>)>,
    ) -> Result<BatchColumns> {
        let n = jobs.len();
        let mut c = BatchColumns {
            queue: Vec::with_capacity(n),
            task: Vec::with_capacity(n),
            args: Vec::with_capacity(n),
            priority: Vec::with_capacity(n),
            lock: Vec::with_capacity(n),
            queueing_lock: Vec::with_capacity(n),
            at: Vec::with_capacity(n),
            delay: Vec::with_capacity(n),
        };
        for (i, j) in jobs.iter().enumerate() {
            j.validate()
                .map_err(|e| e.context(format_args!("job {i} of the batch")))?;
            let d = defaults.get(&j.task);
            let queue = j
                .queue
                .clone()
                .or_else(|| d.and_then(|d| d.0.clone()))
                .unwrap_or_else(|| "default".to_owned());
            let priority = if j.priority == 0 {
                d.and_then(|d| d.1).unwrap_or(0)
            } else {
                j.priority
            };
            let (at, delay) = j.schedule_params();
            c.queue.push(queue);
            c.task.push(j.task.clone());
            c.args.push(j.args.clone());
            c.priority.push(priority);
            c.lock.push(j.lock.clone());
            c.queueing_lock.push(j.queueing_lock.clone());
            c.at.push(at);
            c.delay.push(delay);
        }
        Ok(c)
    }

    fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 8] {
        [
            &self.queue,
            &self.task,
            &self.args,
            &self.priority,
            &self.lock,
            &self.queueing_lock,
            &self.at,
            &self.delay,
        ]
    }
}
