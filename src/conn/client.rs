//! The deadline-bounded synchronous connection.
//!
//! A [`Connection`] owns its socket (through tokio-postgres), a current-thread tokio runtime
//! that drives it, and its registration with the watchdog. Every call is one or more
//! round-trips run with `block_on` under a deadline, by default the connection's `io_timeout`.
//!
//! States: *healthy* -> *broken* (terminal). A connection becomes broken when a deadline fires
//! (it severs its own socket first), when the socket is closed, reset or severed by the
//! watchdog, or when the server ends the session. A broken connection answers every later call
//! with an error at once and is never reused: pools discard it, workers open a new one.
//!
//! Dropping a connection never blocks: it shuts the socket down (the server sees an orderly
//! end of stream) and drops the runtime.
//!
//! Must not be used from inside an async runtime (like the `postgres` crate, it runs its own).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio_postgres::tls::TlsConnect;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, Row, Statement, ToStatement};

use super::options::ConnectOptions;
use super::socket::{self, Stream, Target};
use super::watchdog::{Registration, SeverReason, Watchdog};
use crate::error::{fmt_duration, Error, ErrorKind, Result};

/// A notification received on a `LISTEN`ed channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The channel it was sent on.
    pub channel: String,
    /// Its payload (may be empty).
    pub payload: String,
    /// The server process that sent it.
    pub process_id: i32,
}

/// A synchronous PostgreSQL connection whose every round-trip has a deadline.
///
/// Get one from [`App::connection`](crate::App::connection) (pooled) to reach the database
/// from task code. Calls use the connection's `io_timeout` (the App's, 10 s by default); when
/// it fires, the socket is severed, the connection is marked broken and the call returns an
/// error of kind [`Timeout`](ErrorKind::Timeout) at once: no call can hang.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let mut conn = app.connection()?;
/// let row = conn.query_one("SELECT $1::int + 1", &[&41i32])?;
/// assert_eq!(row.get::<_, i32>(0), 42);
/// # Ok(())
/// # }
/// ```
pub struct Connection {
    // Field order is drop order: statements and client before the runtime that drives them,
    // the runtime (which closes the socket) before the watchdog registration (the dup).
    statements: HashMap<&'static str, Statement>,
    client: Client,
    inner: Inner,
}

struct Inner {
    notifications: mpsc::UnboundedReceiver<Notification>,
    rt: Runtime,
    reg: Registration,
    io_timeout: Duration,
    /// An absolute end no round-trip may pass, whatever `io_timeout` says (a shutdown's).
    deadline: Option<Instant>,
    /// Statements of the caller's ran since the pool last checked the session: they may
    /// have left state behind (an open transaction, a LISTEN).
    touched: bool,
    /// A LISTEN ran on this connection (through `listen`, or in a text we saw): a pooled one
    /// is discarded on return, since a session that listens and is not read holds up the
    /// server's notification queue for everyone.
    listening: bool,
    broken: Option<String>,
    in_tx: bool,
    last_ok: Instant,
    peer: String,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.inner.peer)
            .field("io_timeout", &self.inner.io_timeout)
            .field("broken", &self.inner.broken)
            .finish()
    }
}

impl Connection {
    /// Opens a connection: each target of the connection string in turn, each attempt under
    /// `connect_timeout` (and never past `overall`), its socket registered in `group` of the
    /// watchdog from before the first byte.
    pub(crate) fn open(
        opts: &ConnectOptions,
        watchdog: &Watchdog,
        group: u64,
        overall: Option<Instant>,
    ) -> Result<Connection> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| {
                Error::with_source(ErrorKind::Other, "starting a connection runtime", e)
            })?;
        let first = socket::attempt_deadline(opts.connect_timeout, overall);
        let severs = watchdog.sever_count(group);
        let targets = socket::resolve(opts, first.at, &|| watchdog.sever_count(group) != severs)?;
        let mut rt = Some(rt);
        let mut last = None;
        for target in &targets {
            let deadline = socket::attempt_deadline(opts.connect_timeout, overall);
            if Instant::now() >= deadline.at {
                break;
            }
            let runtime = match rt.take() {
                Some(r) => r,
                None => tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .build()
                    .map_err(|e| {
                        Error::with_source(ErrorKind::Other, "starting a connection runtime", e)
                    })?,
            };
            match Self::open_target(runtime, opts, target, watchdog, group, &deadline) {
                Ok(conn) => return Ok(conn),
                Err(e) if e.kind() == ErrorKind::Shutdown => return Err(e),
                Err(e) => {
                    log::debug!("{e}");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "connecting to {}: no answer within {}",
                    opts.describe(),
                    first.name
                ),
            )
        }))
    }

    fn open_target(
        rt: Runtime,
        opts: &ConnectOptions,
        target: &Target,
        watchdog: &Watchdog,
        group: u64,
        deadline: &socket::Deadline,
    ) -> Result<Connection> {
        let mut with_check = opts.wants_check_interval();
        let mut plain = false;
        loop {
            let (stream, reg) = socket::connect(&rt, opts, target, watchdog, group, deadline)?;
            let mut config = opts.config.clone();
            if with_check {
                let options = match config.get_options() {
                    Some(o) if !o.is_empty() => format!(
                        "{o} -c client_connection_check_interval={}",
                        opts.check_interval_ms()
                    ),
                    _ => format!(
                        "-c client_connection_check_interval={}",
                        opts.check_interval_ms()
                    ),
                };
                config.options(options);
            }
            let connector = if plain {
                None
            } else {
                opts.tls.connector(target)?
            };
            let result = match connector {
                None => {
                    // No TLS for this target (sslmode=disable, or a Unix socket, where libpq
                    // does not use TLS either): do not even ask the server for it.
                    config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                    handshake(
                        &rt,
                        &reg,
                        &config,
                        stream,
                        tokio_postgres::NoTls,
                        deadline.at,
                    )
                }
                Some(tls) => {
                    let watch = tls.watch();
                    handshake(&rt, &reg, &config, stream, tls, deadline.at)
                        .map_err(|e| watch.explain(e))
                }
            };
            match result {
                Ok((client, notifications)) => {
                    return Ok(Connection {
                        statements: HashMap::new(),
                        client,
                        inner: Inner {
                            notifications,
                            rt,
                            reg,
                            io_timeout: opts.io_timeout,
                            deadline: None,
                            touched: false,
                            listening: false,
                            broken: None,
                            in_tx: false,
                            last_ok: Instant::now(),
                            peer: target.to_string(),
                        },
                    })
                }
                Err(e) => {
                    reg.sever();
                    if with_check
                        && e.kind() == ErrorKind::Database
                        && e.to_string().contains("client_connection_check_interval")
                    {
                        log::info!(
                            "server at {target} rejects client_connection_check_interval; \
                             connecting without it (a severed client may keep its backend until \
                             the server notices)"
                        );
                        opts.disable_check_interval();
                        with_check = false;
                        continue;
                    }
                    if e.kind() == ErrorKind::Tls
                        && !plain
                        && opts.tls.falls_back_to_plain()
                        && reg.severed() == SeverReason::Local
                        && Instant::now() < deadline.at
                    {
                        log::info!(
                            "connecting to {target}: {e}; sslmode=prefer, so trying again without TLS"
                        );
                        plain = true;
                        continue;
                    }
                    let e = match reg.severed() {
                        SeverReason::Shutdown => Error::new(
                            ErrorKind::Shutdown,
                            format!("connecting to {target}: connection severed by shutdown"),
                        ),
                        _ => e,
                    };
                    return Err(if e.kind() == ErrorKind::Timeout {
                        Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "connecting to {target}: {e} got no answer within {}",
                                deadline.name
                            ),
                        )
                    } else {
                        e.context(format_args!("connecting to {target}"))
                    });
                }
            }
        }
    }

    /// Where this connection goes (`127.0.0.1:5432`, or a socket path).
    pub fn peer(&self) -> &str {
        &self.inner.peer
    }

    /// The deadline of each round-trip.
    pub fn io_timeout(&self) -> Duration {
        self.inner.io_timeout
    }

    /// Changes the deadline of each later round-trip on this connection (for a statement known
    /// to run long). A pooled connection gets the App's `io_timeout` back when it is reused.
    pub fn set_io_timeout(&mut self, timeout: Duration) {
        self.inner.io_timeout = timeout;
    }

    /// Lends this pooled connection's socket to watchdog group `group` (0: returns it).
    pub(crate) fn lend(&self, group: u64) {
        self.inner.reg.lend(group);
    }

    /// Caps every later round-trip at `deadline` (a shutdown's end), on top of `io_timeout`;
    /// `None` removes the cap.
    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.inner.deadline = deadline;
    }

    /// True once the connection can no longer be used (deadline fired, closed or severed).
    pub fn is_broken(&self) -> bool {
        self.inner.broken.is_some()
            || self.client.is_closed()
            || self.inner.reg.severed() != SeverReason::None
    }

    /// True when the socket holds unread input (bytes, end of stream, a reset) while no call
    /// is running: the link must be checked with a round-trip before the connection is reused.
    pub(crate) fn has_pending_input(&self) -> bool {
        self.inner.reg.has_pending_input()
    }

    /// How long ago the last round-trip succeeded.
    pub(crate) fn idle_for(&self) -> Duration {
        self.inner.last_ok.elapsed()
    }

    /// Runs a statement and returns its rows.
    pub fn query<T>(&mut self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>>
    where
        T: ?Sized + ToStatement,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        self.inner
            .run("running a query", t, self.client.query(statement, params))
    }

    /// Runs a statement that returns exactly one row.
    pub fn query_one<T>(&mut self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Row>
    where
        T: ?Sized + ToStatement,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        self.inner.run(
            "running a query",
            t,
            self.client.query_one(statement, params),
        )
    }

    /// Runs a statement that returns at most one row.
    pub fn query_opt<T>(
        &mut self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>>
    where
        T: ?Sized + ToStatement,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        self.inner.run(
            "running a query",
            t,
            self.client.query_opt(statement, params),
        )
    }

    /// Runs a statement and returns the number of rows it changed.
    pub fn execute<T>(&mut self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<u64>
    where
        T: ?Sized + ToStatement,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        self.inner.run(
            "running a statement",
            t,
            self.client.execute(statement, params),
        )
    }

    /// Runs one or more statements separated by semicolons, without parameters.
    pub fn batch_execute(&mut self, sql: &str) -> Result<()> {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        self.inner.listening |= mentions_listen(sql);
        self.inner
            .run("running statements", t, self.client.batch_execute(sql))
    }

    /// Prepares a statement.
    pub fn prepare(&mut self, sql: &str) -> Result<Statement> {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        self.inner.listening |= mentions_listen(sql);
        self.inner
            .run("preparing a statement", t, self.client.prepare(sql))
    }

    /// True once a LISTEN ran on this connection.
    pub(crate) fn listening(&self) -> bool {
        self.inner.listening
    }

    /// True when statements of the caller's ran since the pool last checked the session.
    pub(crate) fn touched(&self) -> bool {
        self.inner.touched
    }

    /// For the pool, before it hands this connection out again: if the previous user ran
    /// statements of its own, proves in one round-trip under `timeout` (which doubles as the
    /// ping) that they left no open transaction (even a failed one) and no LISTEN behind, and
    /// drops the notifications a LISTEN may have buffered. `Ok(false)`: the session carries
    /// state and the connection must not be reused. `Ok(true)` without a round-trip when the
    /// previous user ran nothing of its own.
    pub(crate) fn session_is_clean(&mut self, timeout: Duration) -> Result<Option<bool>> {
        while self.inner.notifications.try_recv().is_ok() {}
        if !std::mem::take(&mut self.inner.touched) {
            return Ok(None);
        }
        // The simple protocol, so that the statement is the transaction's first: outside a
        // transaction block both clocks are then the same instant.
        let messages = self.inner.run(
            "checking the session of a pooled connection",
            timeout,
            self.client.simple_query(
                "SELECT now() = statement_timestamp()
                        AND NOT EXISTS (SELECT pg_catalog.pg_listening_channels())",
            ),
        )?;
        let clean = messages.iter().any(
            |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t")),
        );
        Ok(Some(clean))
    }

    /// Proves the link is alive with one round-trip under `timeout`.
    pub fn ping(&mut self, timeout: Duration) -> Result<()> {
        self.inner.run(
            "pinging the server",
            timeout,
            self.client.check_connection(),
        )
    }

    /// Starts a transaction (`BEGIN`); end it with [`commit`](Self::commit) or
    /// [`rollback`](Self::rollback). A connection dropped or returned to the pool inside a
    /// transaction is discarded, never reused.
    pub fn begin(&mut self) -> Result<()> {
        self.batch_execute("BEGIN")?;
        self.inner.in_tx = true;
        Ok(())
    }

    /// Commits the transaction started by [`begin`](Self::begin).
    pub fn commit(&mut self) -> Result<()> {
        let r = self.batch_execute("COMMIT");
        self.inner.in_tx = false;
        r
    }

    /// Rolls back the transaction started by [`begin`](Self::begin).
    pub fn rollback(&mut self) -> Result<()> {
        let r = self.batch_execute("ROLLBACK");
        self.inner.in_tx = false;
        r
    }

    /// True between [`begin`](Self::begin) and [`commit`](Self::commit) or
    /// [`rollback`](Self::rollback).
    pub fn in_transaction(&self) -> bool {
        self.inner.in_tx
    }

    /// Starts listening on `channel` (quoted as an identifier).
    pub fn listen(&mut self, channel: &str) -> Result<()> {
        let sql = format!("LISTEN \"{}\"", channel.replace('"', "\"\""));
        self.batch_execute(&sql)
    }

    /// Waits up to `timeout` for a notification. `Ok(None)` means none arrived: it is not
    /// proof that the link is alive (a half-open link delivers nothing); use [`ping`](Self::ping).
    pub fn wait_notification(&mut self, timeout: Duration) -> Result<Option<Notification>> {
        self.wait_notification_or(timeout, std::future::pending())
    }

    /// Like [`wait_notification`](Self::wait_notification), but also returns `Ok(None)` as soon
    /// as `interrupt` completes (a shutdown signal from another thread).
    pub(crate) fn wait_notification_or(
        &mut self,
        timeout: Duration,
        interrupt: impl Future<Output = ()>,
    ) -> Result<Option<Notification>> {
        self.inner.usable("waiting for notifications")?;
        if let Ok(n) = self.inner.notifications.try_recv() {
            return Ok(Some(n));
        }
        let inner = &mut self.inner;
        let rx = &mut inner.notifications;
        let got = inner.rt.block_on(async {
            let mut interrupt = std::pin::pin!(interrupt);
            let mut sleep = std::pin::pin!(tokio::time::sleep(timeout));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(n) = rx.poll_recv(cx) {
                    return Poll::Ready(Some(n));
                }
                if interrupt.as_mut().poll(cx).is_ready() || sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await
        });
        match got {
            Some(Some(n)) => Ok(Some(n)),
            // The driver ended: the connection is gone.
            Some(None) => Err(inner.closed_error("waiting for notifications")),
            None => {
                if self.client.is_closed() {
                    return Err(self.inner.closed_error("waiting for notifications"));
                }
                Ok(None)
            }
        }
    }

    /// Runs a statement from the library's own SQL, prepared once per connection.
    pub(crate) fn query_cached(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let stmt = self.cached(what, sql)?;
        let t = self.inner.io_timeout;
        self.inner.run(what, t, self.client.query(&stmt, params))
    }

    /// Like [`query_cached`](Self::query_cached) for a statement that returns no rows.
    pub(crate) fn execute_cached(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        let stmt = self.cached(what, sql)?;
        let t = self.inner.io_timeout;
        self.inner.run(what, t, self.client.execute(&stmt, params))
    }

    fn cached(&mut self, what: &str, sql: &'static str) -> Result<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let t = self.inner.io_timeout;
        let stmt = self.inner.run(what, t, self.client.prepare(sql))?;
        self.statements.insert(sql, stmt.clone());
        Ok(stmt)
    }

    /// Like [`query`](Self::query), naming the operation in errors and logs.
    pub(crate) fn query_named<T>(
        &mut self,
        what: &str,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>>
    where
        T: ?Sized + ToStatement,
    {
        let t = self.inner.io_timeout;
        self.inner
            .run(what, t, self.client.query(statement, params))
    }

    /// Severs the socket now (used when the connection is abandoned mid-transaction).
    pub(crate) fn sever(&mut self) {
        self.inner.reg.sever();
        self.inner.broken.get_or_insert_with(|| "severed".into());
    }
}

impl Inner {
    fn usable(&self, what: &str) -> Result<()> {
        match &self.broken {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::Closed,
                format!("{what}: connection to {} is unusable ({why})", self.peer),
            )),
        }
    }

    fn run<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        fut: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        self.usable(what)?;
        let (timeout, capped) = match self.deadline {
            Some(d) if d.saturating_duration_since(Instant::now()) < timeout => {
                (d.saturating_duration_since(Instant::now()), true)
            }
            _ => (timeout, false),
        };
        self.reg.arm(Instant::now() + timeout);
        let res = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, fut).await });
        self.reg.disarm();
        match res {
            Ok(Ok(v)) => {
                self.last_ok = Instant::now();
                Ok(v)
            }
            Ok(Err(e)) => Err(self.classify(what, e)),
            Err(_) => {
                self.reg.sever();
                let why = if capped {
                    format!(
                        "no answer within the {} left before the caller's deadline",
                        fmt_duration(timeout)
                    )
                } else {
                    format!("no answer within {} io_timeout", fmt_duration(timeout))
                };
                self.broken = Some(why.clone());
                log::warn!("{what} on {}: {why}; connection severed", self.peer);
                Err(Error::new(ErrorKind::Timeout, format!("{what}: {why}")))
            }
        }
    }

    fn closed_error(&mut self, what: &str) -> Error {
        let why = match self.reg.severed() {
            SeverReason::Shutdown => "connection severed by shutdown".to_owned(),
            SeverReason::Backstop => "connection severed by the watchdog".to_owned(),
            _ => format!("connection to {} closed", self.peer),
        };
        self.broken.get_or_insert_with(|| why.clone());
        self.reg.sever();
        let kind = if self.reg.severed() == SeverReason::Shutdown {
            ErrorKind::Shutdown
        } else {
            ErrorKind::Closed
        };
        Error::new(kind, format!("{what}: {why}"))
    }

    fn classify(&mut self, what: &str, e: tokio_postgres::Error) -> Error {
        if let Some(db) = e.as_db_error() {
            let err = Error::from_db(what, db);
            // FATAL and PANIC end the session (terminated backend, server shutdown).
            if matches!(db.severity(), "FATAL" | "PANIC") || db.code().code().starts_with("57P") {
                self.broken = Some(format!("server ended the session: {}", db.message()));
                self.reg.sever();
                return err.set_kind(ErrorKind::Closed);
            }
            return err;
        }
        let lost = e.is_closed()
            || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        if lost {
            let mut err = self.closed_error(what);
            if self.reg.severed() == SeverReason::None || self.reg.severed() == SeverReason::Local {
                err = Error::with_source(err.kind(), err.to_string(), e);
            }
            return err;
        }
        // Anything else (a type conversion, an unexpected message) leaves the link alone.
        Error::with_source(ErrorKind::Database, what.to_owned(), e)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Shut the socket down first: the server sees an orderly end of stream and nothing
        // below can block on it. Then the fields drop: client, runtime (closes the fd), the
        // registration (closes the dup).
        self.inner.reg.sever();
    }
}

/// True when `sql` has the word LISTEN in it (any case), as a statement that starts
/// listening would.
fn mentions_listen(sql: &str) -> bool {
    sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w.eq_ignore_ascii_case("listen"))
}

/// TLS negotiation (if any) and the startup/auth exchange, under `deadline`; then the driver
/// task that forwards notifications.
fn handshake<T>(
    rt: &Runtime,
    reg: &Registration,
    config: &tokio_postgres::Config,
    stream: Stream,
    tls: T,
    deadline: Instant,
) -> Result<(Client, mpsc::UnboundedReceiver<Notification>)>
where
    T: TlsConnect<Stream> + 'static,
    T::Stream: Send + 'static,
{
    let wait = deadline.saturating_duration_since(Instant::now());
    reg.arm(deadline);
    let res =
        rt.block_on(async { tokio::time::timeout(wait, config.connect_raw(stream, tls)).await });
    reg.disarm();
    let (client, mut connection) = match res {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => {
            if let Some(db) = e.as_db_error() {
                let code = db.code().code().to_owned();
                let kind = if code == "28000" || code == "28P01" || code == "3D000" {
                    ErrorKind::Connect
                } else {
                    ErrorKind::Database
                };
                return Err(Error::new(
                    kind,
                    format!("{}: {} [SQLSTATE {code}]", db.severity(), db.message()),
                )
                .set_sqlstate(&code));
            }
            return Err(Error::with_source(ErrorKind::Connect, String::new(), e));
        }
        Err(_) => return Err(Error::new(ErrorKind::Timeout, "startup handshake")),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    rt.spawn(async move {
        let end = std::future::poll_fn(|cx| loop {
            match connection.poll_message(cx) {
                Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                    let _ = tx.send(Notification {
                        channel: n.channel().to_owned(),
                        payload: n.payload().to_owned(),
                        process_id: n.process_id(),
                    });
                }
                Poll::Ready(Some(Ok(AsyncMessage::Notice(n)))) => {
                    log::debug!("server notice: {}: {}", n.severity(), n.message());
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await;
        if let Err(e) = end {
            log::debug!("connection ended: {e}");
        }
    });
    Ok((client, rx))
}
