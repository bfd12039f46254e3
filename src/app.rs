//! [`App`]: the handle programs keep to defer jobs, migrate, reach the pool and administer.
//!
//! It is a cheap `Clone` over an `Arc`: the parsed connection settings, the watchdog that can
//! sever every socket of the App, and a pool of deadline-bounded connections. The
//! schema version is checked once per App, on the first call that needs it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::conn::options::ConnectOptions;
use crate::conn::pool::Pool;
use crate::conn::tls::SslMode;
use crate::conn::watchdog::Watchdog;
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::insert::{self, Inserter, JobBuilder, NewJob};
use crate::namespace::Namespace;
// The admin API names it through `crate::app`.
pub use crate::pooled::PooledConnection;
use crate::schema;
use crate::types::{JobId, TaskArgs, TaskDefaults};
use crate::wait::{self, JobResult};

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
    pub(crate) pool: Pool,
    pool_timeout: Duration,
    /// Bumped by every `sever_all`, so that checkouts waiting for a connection give up too.
    severs: AtomicU64,
    schema_ok: AtomicBool,
    defaults: TaskDefaults,
    /// Longest wait between two reads of a waited-for job.
    wait_poll: Duration,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("database", &self.inner.opts.describe())
            .field("schema", &self.schema())
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
#[must_use = "call .build() to connect"]
pub struct AppBuilder {
    url: String,
    pool_size: u32,
    io_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    pool_timeout: Option<Duration>,
    pool_idle_timeout: Duration,
    tcp_user_timeout: Option<Duration>,
    lazy: bool,
    defaults: TaskDefaults,
    wait_poll: Duration,
    ssl_mode: Option<SslMode>,
    ssl_root_cert: Option<PathBuf>,
    ssl_client_cert: Option<(PathBuf, PathBuf)>,
    schema: Option<String>,
}

impl std::fmt::Debug for AppBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppBuilder")
            .field("url", &redact_url(&self.url))
            .field("pool_size", &self.pool_size)
            .field("io_timeout", &self.io_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("pool_timeout", &self.pool_timeout)
            .field("pool_idle_timeout", &self.pool_idle_timeout)
            .field("tcp_user_timeout", &self.tcp_user_timeout)
            .field("lazy", &self.lazy)
            .field("task_defaults", &self.defaults)
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .field("ssl_client_cert", &self.ssl_client_cert)
            .field("schema", &self.schema)
            .finish()
    }
}

/// `url` with any password replaced by `***`: in the userinfo of a URL
/// (`postgres://user:secret@host`), as a `password=` key of a key=value string, or as a
/// `password` query parameter.
pub(crate) fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    // URL userinfo: between "://" and the last '@' before the path, after the first ':'.
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let at = rest_start + at;
            if let Some(colon) = out[rest_start..at].find(':') {
                out.replace_range(rest_start + colon + 1..at, "***");
            }
        }
    }
    // `password=...` as a key=value pair or a query parameter, quoted or not.
    let lower = out.to_ascii_lowercase();
    let mut result = String::with_capacity(out.len());
    let mut i = 0;
    while let Some(found) = lower[i..].find("password") {
        let start = i + found;
        let key_ok =
            start == 0 || matches!(lower.as_bytes()[start - 1], b' ' | b'?' | b'&' | b'\t');
        let mut j = start + "password".len();
        while j < out.len() && out.as_bytes()[j] == b' ' {
            j += 1;
        }
        if !key_ok || j >= out.len() || out.as_bytes()[j] != b'=' {
            result.push_str(&out[i..start + 1]);
            i = start + 1;
            continue;
        }
        j += 1;
        while j < out.len() && out.as_bytes()[j] == b' ' {
            j += 1;
        }
        let end = if out[j..].starts_with('\'') {
            // Quoted: up to the closing quote not escaped by a backslash.
            let mut k = j + 1;
            let bytes = out.as_bytes();
            while k < out.len() && bytes[k] != b'\'' {
                k += if bytes[k] == b'\\' { 2 } else { 1 };
            }
            (k + 1).min(out.len())
        } else {
            out[j..].find([' ', '&', '\t']).map_or(out.len(), |e| j + e)
        };
        result.push_str(&out[i..j]);
        result.push_str("***");
        i = end;
    }
    result.push_str(&out[i..]);
    result
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

    /// How long a connection may sit unused in the App's pool before it is closed, so that an
    /// idle process holds no pooled connection (a fleet of idle worker processes then costs
    /// the server only their workers' own connections). Checked four times a second; a
    /// caller after a quiet spell pays for one new connection. The completer of a worker of
    /// this App closes its connection after as long without outcomes to record, and its
    /// fetcher after as long without a job to claim (its heartbeat's connection then claims
    /// for it), so an idle worker process holds one connection.
    /// `Duration::MAX` keeps idle connections open for good. Defaults to 30 s.
    pub fn pool_idle_timeout(mut self, timeout: Duration) -> AppBuilder {
        self.pool_idle_timeout = timeout;
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

    /// Lets every defer of this App use the default queue and priority registered with each
    /// task ([`TaskOptions::queue`](crate::TaskOptions::queue)) when the call gives none.
    /// Takes a `&Tasks` (or a [`TaskDefaults`] built by hand). Defaults to none.
    pub fn task_defaults(mut self, tasks: impl Into<TaskDefaults>) -> AppBuilder {
        self.defaults.extend(tasks.into());
        self
    }

    /// How often [`App::wait`] reads the job's row when no notification comes, for tests
    /// of the notification path and of the backstop (feature `test-util`). Defaults to 1 s.
    #[cfg(feature = "test-util")]
    pub fn wait_poll_interval(mut self, interval: Duration) -> AppBuilder {
        self.wait_poll = interval;
        self
    }

    /// Puts every object of postpone (tables, functions, triggers) in the PostgreSQL schema
    /// `name`, with notification channels and advisory locks of its own, so that several
    /// installations share one database without seeing each other: a worker of one never
    /// claims, wakes, pauses or rescues the jobs of another. [`App::migrate`] creates the
    /// schema if it is missing and installs into it; every connection of the App (its pool,
    /// its workers, waiters, the admin API and the dashboard) finds postpone's objects there,
    /// and only there (its `search_path` is that schema). Every App of an installation must
    /// name the same schema.
    ///
    /// The name is taken as written (case, spaces and punctuation kept; it is always
    /// quoted). An empty name, one longer than 63 bytes, one with a NUL or starting with
    /// `pg_` is an error of kind [`Config`](ErrorKind::Config) from `build`, as is a schema
    /// with `pooler_mode=transaction` (a transaction pooler does not keep a session's
    /// `search_path`: connect directly or through a session-mode pool).
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// let billing = postpone::App::builder("postgres://postgres@127.0.0.1/app")
    ///     .schema("billing")
    ///     .build()?;
    /// billing.migrate()?; // creates the schema "billing" and installs postpone in it
    /// billing.defer("invoice", &serde_json::json!({"id": 7}))?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Defaults to none: postpone's objects are wherever the session's `search_path` finds
    /// them (usually `public`), with the channels `postpone` and `postpone_done`.
    pub fn schema(mut self, name: impl Into<String>) -> AppBuilder {
        self.schema = Some(name.into());
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
                // A huge timeout means "very long", never an overflow further on.
                Ok(d.min(crate::conn::client::LONGEST))
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
        if let Some(name) = &self.schema {
            opts.namespace = Namespace::named(name)?;
            if opts.routing.transaction_pooler {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "schema {name:?} cannot be used with pooler_mode=transaction: a \
                         transaction pooler does not keep a session's search_path, so \
                         statements would reach another schema's tables; connect directly or \
                         through a session-mode pool (PgBouncer pool_mode=session) for an App \
                         with a schema"
                    ),
                ));
            }
        }
        let pool_timeout = match self.pool_timeout {
            Some(t) => positive("pool_timeout", t)?,
            None => opts.connect_timeout.saturating_add(Duration::from_secs(1)),
        };
        let opts = Arc::new(opts);
        let watchdog = Watchdog::start()
            .map_err(|e| Error::with_source(ErrorKind::Other, "starting the watchdog thread", e))?;
        let group = watchdog.new_group();
        if !self.lazy {
            Connection::open(&opts, &watchdog, group, None).map_err(|e| {
                if e.is_database_missing() {
                    // The server was reached: the message already says where and what.
                    e
                } else if e.sqlstate().is_some_and(|c| c.starts_with("28")) {
                    // Reached too, and it refused the role or its password (class 28).
                    e.context(format_args!(
                        "the server refused to log in to the database {}",
                        opts.describe()
                    ))
                    .remedy(
                        "check the user and password of the connection string, or the \
                         server's pg_hba.conf",
                    )
                } else {
                    e.context(format_args!(
                        "cannot reach the database {}",
                        opts.describe()
                    ))
                }
            })?;
        }
        let pool = Pool::new(
            opts.clone(),
            watchdog.clone(),
            group,
            self.pool_size,
            self.pool_idle_timeout,
        );
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
                wait_poll: self.wait_poll,
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
    /// `connect_timeout`, one of kind `Connect` or `Timeout`; a server that answers that
    /// the database does not exist, one of kind
    /// [`DatabaseMissing`](ErrorKind::DatabaseMissing).
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
            pool_idle_timeout: crate::conn::pool::IDLE_TIMEOUT,
            tcp_user_timeout: None,
            lazy: false,
            defaults: TaskDefaults::default(),
            wait_poll: wait::POLL_INTERVAL,
            ssl_mode: None,
            ssl_root_cert: None,
            ssl_client_cert: None,
            schema: None,
        }
    }

    /// Installs or upgrades the schema. Idempotent, and safe to run from many processes at
    /// once. Returns the migration versions this call applied (empty if none were missing).
    pub fn migrate(&self) -> Result<Vec<i32>> {
        let mut conn = self.connection_unchecked()?;
        let applied = schema::migrate(&mut conn, self.namespace())?;
        self.inner.schema_ok.store(true, Ordering::Release);
        Ok(applied)
    }

    /// The schema version installed in the database, or `None` if postpone is not installed.
    pub fn schema_version(&self) -> Result<Option<i32>> {
        let mut conn = self.connection_unchecked()?;
        schema::installed_version(&mut conn, self.namespace())
    }

    /// A pooled connection, checked out within `pool_timeout`; every call on it has the
    /// App's `io_timeout`. It goes back to the pool when dropped (or is discarded if broken).
    pub fn connection(&self) -> Result<PooledConnection> {
        let mut conn = self.connection_unchecked()?;
        self.ensure_schema(&mut conn)?;
        Ok(conn)
    }

    pub(crate) fn connection_unchecked(&self) -> Result<PooledConnection> {
        let conn = self
            .inner
            .pool
            .checkout(self.inner.pool_timeout, &self.inner.severs)?;
        // Checked out by a worker's task: a sever of that worker reaches it.
        conn.lend(crate::conn::watchdog::current_borrower());
        Ok(PooledConnection::new(conn))
    }

    /// Checks the schema version once per App.
    pub(crate) fn ensure_schema(&self, conn: &mut Connection) -> Result<()> {
        if self.inner.schema_ok.load(Ordering::Acquire) {
            return Ok(());
        }
        schema::check(conn, self.namespace())?;
        self.inner.schema_ok.store(true, Ordering::Release);
        Ok(())
    }

    /// Defers a job of `task` with `args` on the default queue, now; returns its id once
    /// the insert is committed. Use [`job`](Self::job) for the other options.
    pub fn defer<A: Serialize + ?Sized>(&self, task: &str, args: &A) -> Result<JobId> {
        self.job(task).defer(args)
    }

    /// Defers a job of the typed task whose arguments are `args` (its name comes from
    /// [`TaskArgs::TASK`]), now, on the task's default queue. Use
    /// [`job_of`](Self::job_of) for the other options.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Resize { image: u64 }
    /// impl postpone::TaskArgs for Resize {
    ///     const TASK: &'static str = "resize";
    /// }
    /// let id = app.enqueue(&Resize { image: 7 })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn enqueue<A: TaskArgs>(&self, args: &A) -> Result<JobId> {
        self.job(A::TASK).defer(args)
    }

    /// Starts deferring a job of the typed task of arguments `A`: set options, then
    /// [`defer`](JobBuilder::defer) the arguments.
    pub fn job_of<A: TaskArgs>(&self) -> JobBuilder<'_> {
        self.job(A::TASK)
    }

    /// Starts deferring a job of `task`: set options, then [`defer`](JobBuilder::defer).
    pub fn job(&self, task: &str) -> JobBuilder<'_> {
        NewJob::bound(self, task)
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
        insert::insert_batch(self, jobs)
    }

    /// Inserts `jobs`, unique ones included (see [`NewJob::unique`]), in one transaction:
    /// returns, in input order, what each did: [`Deferred::Inserted`](crate::Deferred) with
    /// its id, or [`Deferred::Duplicate`](crate::Deferred) with the id of the job that covers
    /// it (an earlier entry of the same batch, or a job already there). Each entry is its own
    /// statement, so this is slower than [`defer_batch`](Self::defer_batch) (which refuses
    /// unique jobs). Two batches inserting the same keys at once in opposite orders can
    /// deadlock: PostgreSQL then fails one of them, which inserts nothing; try it again.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// use postpone::{NewJob, Unique};
    /// let jobs = [1, 2, 1]
    ///     .iter()
    ///     .map(|n| Ok(NewJob::new("sync", n)?.unique(Unique::by_args())))
    ///     .collect::<postpone::Result<Vec<_>>>()?;
    /// let done = app.defer_batch_unique(&jobs)?;
    /// assert!(done[2].is_duplicate() && done[2].id() == done[0].id());
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer_batch_unique(&self, jobs: &[NewJob]) -> Result<Vec<crate::Deferred>> {
        insert::insert_batch_unique(self, jobs)
    }

    /// Like [`defer_batch`](Self::defer_batch), inside the caller's transaction or client.
    pub fn defer_batch_in<C: crate::DeferClient + ?Sized>(
        &self,
        client: &mut C,
        jobs: &[NewJob],
    ) -> Result<Vec<JobId>> {
        insert::insert_batch_in(self, client, jobs)
    }

    /// Waits until job `id` is finished (succeeded, failed, cancelled or aborted) and
    /// returns its status with the output its task recorded, from any process: the job may
    /// have been deferred and run anywhere.
    ///
    /// The wait uses a connection of its own, woken by a notification when the job finishes,
    /// and reads the job's row at least every second as a backstop. It is bounded by
    /// `timeout` (then an error of kind [`Timeout`](ErrorKind::Timeout) that names the
    /// job's status), and each read by the App's `io_timeout`, so a connection lost or gone
    /// half-open during the wait is an error, never a hang. A job that does not exist, or
    /// was deleted when it finished (a worker with `delete_finished`), is an error of kind
    /// [`NotFound`](ErrorKind::NotFound).
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// use std::time::Duration;
    /// let id = app.defer("thumbnail", &serde_json::json!({"image": 7}))?;
    /// let result = app.wait(id, Duration::from_secs(30))?;
    /// if result.succeeded() {
    ///     let size: (u32, u32) = result.output_as()?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait(&self, id: JobId, timeout: Duration) -> Result<JobResult> {
        let deadline = std::time::Instant::now() + timeout;
        let mut conn = self.dedicated()?;
        let res = wait::wait(
            &mut conn,
            self.namespace().done_channel(),
            id,
            timeout,
            self.inner.wait_poll,
        );
        match res {
            // A flood of notifications (any role can NOTIFY) dropped the listening
            // connection: the row is the truth, read it at every poll instead.
            Err(e) if conn.flooded() => {
                log::warn!(
                    "{e}; reading the job's row every {:?} instead",
                    self.inner.wait_poll
                );
                let mut conn = self.dedicated()?;
                wait::wait_polling(&mut conn, id, deadline, timeout, self.inner.wait_poll)
            }
            r => r,
        }
    }

    /// Defers a job of the typed task whose arguments are `args`, then [`wait`](Self::wait)s
    /// for it; see [`JobBuilder::defer_and_wait`] for the other options.
    pub fn enqueue_and_wait<A: TaskArgs>(&self, args: &A, timeout: Duration) -> Result<JobResult> {
        self.job(A::TASK).defer_and_wait(args, timeout)
    }

    /// The status of job `id` now, with its output and latest progress, whether it has
    /// finished or not; [`NotFound`](ErrorKind::NotFound) if there is no such job.
    pub fn job_result(&self, id: JobId) -> Result<JobResult> {
        let mut conn = self.connection()?;
        wait::read(&mut conn, id)?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("reading job {id}: there is no such job"),
            )
        })
    }

    /// A connection of its own (not pooled), schema checked, in the App's watchdog group so
    /// that [`sever_all`](Self::sever_all) reaches it.
    fn dedicated(&self) -> Result<Connection> {
        let mut conn = Connection::open(
            &self.inner.opts,
            &self.inner.watchdog,
            self.inner.group,
            None,
        )?;
        self.ensure_schema(&mut conn)?;
        Ok(conn)
    }

    /// Severs every socket of this App's pool at once: every blocked round-trip returns an
    /// error within milliseconds and its connection is discarded, and so does every call
    /// waiting for a pooled connection (a connect in progress included). Returns how many
    /// sockets were severed. (Workers have their own sockets; stop them with their handle.)
    pub fn sever_all(&self) -> usize {
        // First, so that a checkout waiting for a connection (its connect about to be
        // severed) gives up instead of waiting out its pool_timeout.
        self.inner.severs.fetch_add(1, Ordering::AcqRel);
        self.inner.watchdog.sever_group(self.inner.group)
    }

    /// The schema given to [`AppBuilder::schema`], or `None` for the default.
    pub fn schema(&self) -> Option<&str> {
        self.inner.opts.namespace.name()
    }

    /// Where postpone's objects are, and the channels of this installation.
    pub(crate) fn namespace(&self) -> &Namespace {
        &self.inner.opts.namespace
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

impl Inserter for App {
    fn pooled(&self) -> Result<PooledConnection> {
        self.connection()
    }

    fn defaults(&self) -> &TaskDefaults {
        &self.inner.defaults
    }

    fn wait(&self, id: JobId, timeout: Duration) -> Result<JobResult> {
        App::wait(self, id, timeout)
    }

    fn namespace(&self) -> &Namespace {
        App::namespace(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_debug_never_shows_a_password() {
        for url in [
            "postgres://alice:s3cret@db.example:5432/app?sslmode=require",
            "postgres://alice:s3cret@[::1]/app",
            "postgresql://alice:s3%40cret@host/app",
            "postgres://alice@host/app?password=s3cret&sslmode=disable",
            "host=db user=alice password=s3cret dbname=app",
            "host=db password = 's3cret with \\' quote' user=alice",
            "host=db PASSWORD=s3cret user=alice",
        ] {
            let shown = format!("{:?}", App::builder(url).pool_size(3));
            assert!(!shown.contains("s3"), "{url} shown as {shown}");
            assert!(shown.contains("***"), "{shown}");
            assert!(shown.contains("alice"), "{shown}");
            assert!(shown.contains("pool_size: 3"), "{shown}");
        }
        // Nothing to hide: shown as given.
        let plain = "postgres://bob@host:5432/app";
        assert_eq!(redact_url(plain), plain);
        assert_eq!(
            redact_url("host=db user=passwordless"),
            "host=db user=passwordless"
        );
    }
}
