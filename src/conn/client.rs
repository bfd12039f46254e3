//! The deadline-bounded synchronous connection.
//!
//! A [`Connection`] owns its socket (through tokio-postgres), a current-thread tokio runtime
//! that drives it, and its registration with the watchdog. Every call is one or more
//! round-trips run with `block_on` under a deadline, by default the connection's `io_timeout`.
//!
//! States: *healthy* -> *broken* (terminal). A connection becomes broken when a deadline fires
//! (it sends a CancelRequest from a fresh socket, then severs its own socket), when the
//! socket is closed, reset or severed by the watchdog, when the server ends the session, or
//! when a panic (user code such as a `ToSql`) unwinds out of a round-trip. A broken connection answers every later call
//! with an error at once and is never reused: pools discard it, workers open a new one.
//!
//! Dropping a connection never blocks: it shuts the socket down (the server sees an orderly
//! end of stream) and shuts the runtime down without waiting.
//!
//! Usable from any thread, an async task's included: there the round-trips are driven on a
//! helper thread while the caller waits (see `conn/runtime.rs`).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, CancelToken, Client, Row, Statement, ToStatement};

use super::options::ConnectOptions;
use super::runtime::ConnRuntime;
use super::session_attrs;
use super::socket;
use super::target::{Stream, Target};
pub(crate) use super::time::{deadline_after, LONGEST};
use super::watchdog::{Registration, SeverReason, Watchdog};
use crate::error::{fmt_duration, Error, ErrorKind, Result};

mod inbox;
pub(crate) mod open;
mod pipeline;
pub(crate) use pipeline::Cycle;
mod round_trip;
mod routing;

pub(crate) use inbox::{Inbox, NotifyGauge, NOTIFY_UNREAD_MAX};

/// What [`Connection::check_within`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The server answered, and the session carries nothing of its last user's.
    Alive,
    /// The server answered: the last user left a transaction open or a LISTEN behind, or
    /// changed the search_path of a namespace's connection.
    Dirty,
    /// No answer within the budget, which was shorter than `io_timeout`: no verdict yet.
    Unanswered,
}

/// The pool's check of a used connection: no transaction left open (even a failed one),
/// no LISTEN left behind.
const CLEAN_SESSION: &str = "SELECT now() = statement_timestamp()
        AND NOT EXISTS (SELECT pg_catalog.pg_listening_channels())";

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
/// Before the socket goes, a CancelRequest is sent from a fresh socket (under its own short
/// deadline, at most 1 s and never more than `connect_timeout`), so that the server stops the
/// statement instead of running it on for a caller that has given up. A timeout does not say
/// whether a write happened: the statement may have committed before the deadline fired, or
/// before the cancel arrived (a `defer` that timed out may have inserted its job). Write so
/// that a retry is harmless (a `queueing_lock`, an idempotent statement), or check.
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
    /// Through a transaction pooler: the parameter types of each SQL text sent unnamed.
    unnamed: Option<HashMap<String, Vec<tokio_postgres::types::Type>>>,
    client: Client,
    inner: Inner,
}

struct Inner {
    notifications: Inbox,
    rt: ConnRuntime,
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
    /// The `search_path` the namespace set (as `SHOW` gives it): the pool's check of a used
    /// connection proves it is still so (a caller's `SET`, `RESET ALL` or `DISCARD ALL`
    /// would send postpone's statements to another schema's tables). None: the default.
    search_path: Option<String>,
    broken: Option<String>,
    in_tx: bool,
    last_ok: Instant,
    peer: String,
    cancel: CancelRoute,
    /// A round-trip is in flight: still true afterwards only if user code (a `ToSql`)
    /// panicked inside it, and then the session's state is unknown: the connection is broken.
    in_flight: bool,
    /// When a ping that was given less than `io_timeout` went unanswered; the link is not
    /// judged until that ping has had its full `io_timeout`.
    unanswered_since: Option<Instant>,
}

/// What it takes to send a CancelRequest for this connection from a fresh socket of ours: a
/// timed-out statement would otherwise run on in its backend (with its locks) while the link
/// is half-open, since the server learns of nothing until its own keepalive fires.
struct CancelRoute {
    opts: Arc<ConnectOptions>,
    target: Target,
    /// The session fell back to plain text (`sslmode=prefer`): so does its cancel.
    plain: bool,
    token: CancelToken,
    watchdog: Watchdog,
    group: u64,
}

/// The longest a CancelRequest may take (connect, TLS, send), on top of the deadline that
/// fired; never more than `connect_timeout`.
pub(crate) const CANCEL_DEADLINE: Duration = Duration::from_secs(1);

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
        self.inner.io_timeout = timeout.min(LONGEST);
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
            || self.inner.in_flight
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
        T: ?Sized + ToStatement + Sync,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        let fut = Self::pinned(
            &self.client,
            self.needs_pinning(),
            self.client.query(statement, params),
        );
        self.inner.run("running a query", t, fut)
    }

    /// Runs a statement that returns exactly one row.
    pub fn query_one<T>(&mut self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Row>
    where
        T: ?Sized + ToStatement + Sync,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        let fut = Self::pinned(
            &self.client,
            self.needs_pinning(),
            self.client.query_one(statement, params),
        );
        self.inner.run("running a query", t, fut)
    }

    /// Runs a statement that returns at most one row.
    pub fn query_opt<T>(
        &mut self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>>
    where
        T: ?Sized + ToStatement + Sync,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        let fut = Self::pinned(
            &self.client,
            self.needs_pinning(),
            self.client.query_opt(statement, params),
        );
        self.inner.run("running a query", t, fut)
    }

    /// Runs a statement and returns the number of rows it changed.
    pub fn execute<T>(&mut self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<u64>
    where
        T: ?Sized + ToStatement + Sync,
    {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        let fut = Self::pinned(
            &self.client,
            self.needs_pinning(),
            self.client.execute(statement, params),
        );
        self.inner.run("running a statement", t, fut)
    }

    /// Runs one or more statements separated by semicolons, without parameters.
    pub fn batch_execute(&mut self, sql: &str) -> Result<()> {
        let t = self.inner.io_timeout;
        self.inner.touched = true;
        self.inner.listening |= mentions_listen(sql);
        self.inner
            .run("running statements", t, self.client.batch_execute(sql))
    }

    /// Prepares a statement. Refused through a transaction-pooling PgBouncer
    /// (`pooler_mode=transaction`), where a named statement does not outlive the
    /// transaction: pass the SQL text to [`query`](Self::query) instead.
    pub fn prepare(&mut self, sql: &str) -> Result<Statement> {
        self.refuse_without_session("a prepared statement (Connection::prepare)")?;
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

    /// Proves the link is alive with one round-trip under `timeout`.
    pub fn ping(&mut self, timeout: Duration) -> Result<()> {
        self.inner.run_then_cancel(
            "pinging the server",
            timeout,
            self.client.check_connection(),
            false,
        )
    }

    /// The pool's check before it hands this connection out again, in one round-trip: a
    /// ping, or, if the previous user ran statements of its own, a query that proves they
    /// left no open transaction (even a failed one) and no LISTEN behind (it also drops the
    /// notifications a LISTEN may have buffered).
    ///
    /// The check may be given less than `io_timeout` (a checkout with little time left)
    /// without condemning a healthy but slow link: when `budget` runs out first the answer is
    /// [`Checked::Unanswered`], the request stays outstanding and the connection unbroken; a
    /// later check sends another, and once the first unanswered one has had its whole
    /// `io_timeout` the link is judged (and severed) as any round-trip is.
    pub(crate) fn check_within(&mut self, budget: Duration) -> Result<Checked> {
        while self.inner.notifications.try_recv().is_ok() {}
        let now = Instant::now();
        // Input waiting in the socket: the earlier check's answer (or an error) has come, so
        // the link is judged afresh, with a whole io_timeout from now.
        let since = match self.inner.unanswered_since {
            Some(t) if !self.has_pending_input() => t,
            _ => now,
        };
        let full = since
            .checked_add(self.inner.io_timeout)
            .map_or(Duration::MAX, |d| d.saturating_duration_since(now));
        let (what, wait, soft) = if full <= budget {
            ("pinging the server", full, false)
        } else {
            ("pinging the server", budget, true)
        };
        let touched = std::mem::take(&mut self.inner.touched);
        let got = if touched {
            // The simple protocol, so that the statement is the transaction's first: outside
            // a transaction block both clocks are then the same instant.
            let sql: std::borrow::Cow<'static, str> = match &self.inner.search_path {
                None => CLEAN_SESSION.into(),
                Some(path) => format!(
                    "{CLEAN_SESSION} AND pg_catalog.current_setting('search_path') = {}",
                    crate::namespace::quote_literal(path)
                )
                .into(),
            };
            let fut = self.client.simple_query(&sql);
            let what = "checking the session of a pooled connection";
            if soft {
                self.inner.run_soft(what, wait, fut)?
            } else {
                Some(self.inner.run_then_cancel(what, wait, fut, false)?)
            }
            .map(|messages| {
                messages.iter().any(|m| {
                    matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t"))
                })
            })
        } else {
            let fut = self.client.check_connection();
            if soft {
                self.inner.run_soft(what, wait, fut)?
            } else {
                Some(self.inner.run_then_cancel(what, wait, fut, false)?)
            }
            .map(|()| true)
        };
        Ok(match got {
            Some(clean) => {
                self.inner.unanswered_since = None;
                if clean {
                    Checked::Alive
                } else {
                    Checked::Dirty
                }
            }
            None => {
                self.inner.touched = touched;
                self.inner.unanswered_since = Some(since);
                Checked::Unanswered
            }
        })
    }

    /// When a ping given less than `io_timeout` went unanswered (see `ping_within`).
    pub(crate) fn unanswered_since(&self) -> Option<Instant> {
        self.inner.unanswered_since
    }

    /// Starts a transaction (`BEGIN`); end it with [`commit`](Self::commit) or
    /// [`rollback`](Self::rollback). A connection dropped or returned to the pool inside a
    /// transaction is discarded, never reused.
    pub fn begin(&mut self) -> Result<()> {
        if self.through_transaction_pooler() {
            self.batch_execute(routing::BEGIN_CLEAN)?;
        } else {
            self.batch_execute("BEGIN")?;
        }
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

    /// Starts listening on `channel` (quoted as an identifier). Refused through a
    /// transaction-pooling PgBouncer (`pooler_mode=transaction`), which does not keep the
    /// session that would hear the notifications.
    pub fn listen(&mut self, channel: &str) -> Result<()> {
        self.refuse_without_session("LISTEN")?;
        let sql = format!("LISTEN \"{}\"", channel.replace('"', "\"\""));
        self.batch_execute(&sql)
    }

    /// Waits up to `timeout` for a notification. `Ok(None)` means none arrived: it is not
    /// proof that the link is alive (a half-open link delivers nothing); use [`ping`](Self::ping).
    pub fn wait_notification(&mut self, timeout: Duration) -> Result<Option<Notification>> {
        self.wait_notification_or(timeout, std::future::pending())
    }

    /// A notification that arrived during an earlier round-trip, if any: no wait and no read
    /// of the socket (for a thread that shares a LISTENing connection between its own
    /// round-trips).
    pub(crate) fn buffered_notification(&mut self) -> Option<Notification> {
        self.inner.notifications.try_recv().ok()
    }

    /// True once the server sent more notifications than this connection holds unread
    /// ([`NOTIFY_UNREAD_MAX`]): it was dropped, and its round-trips fail as closed.
    pub(crate) fn flooded(&self) -> bool {
        self.inner.notifications.flooded()
    }

    /// Like [`wait_notification`](Self::wait_notification), but also returns `Ok(None)` as soon
    /// as `interrupt` completes (a shutdown signal from another thread).
    pub(crate) fn wait_notification_or(
        &mut self,
        timeout: Duration,
        interrupt: impl Future<Output = ()> + Send,
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
        })?;
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
        if self.through_transaction_pooler() {
            return self.query_unnamed(what, sql, params);
        }
        self.with_cached(what, sql, |conn, stmt| {
            let t = conn.inner.io_timeout;
            conn.inner.run(what, t, conn.client.query(stmt, params))
        })
    }

    /// Like [`query_cached`](Self::query_cached) for a statement that returns no rows.
    pub(crate) fn execute_cached(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        if self.through_transaction_pooler() {
            return self.execute_unnamed(what, sql, params);
        }
        self.with_cached(what, sql, |conn, stmt| {
            let t = conn.inner.io_timeout;
            conn.inner.run(what, t, conn.client.execute(stmt, params))
        })
    }

    /// Runs `call` with the cached statement for `sql`. Task code may have dropped the
    /// session's prepared statements (`DEALLOCATE ALL`, `DISCARD ALL`): the server then
    /// answers 26000 (no such prepared statement), which executed nothing. The cache is
    /// forgotten (ours and the driver's type-lookup statements), and outside a transaction
    /// the call is made once more with a statement prepared afresh; inside one, the error
    /// is returned (the transaction is aborted anyway) and the next call prepares afresh.
    fn with_cached<T>(
        &mut self,
        what: &str,
        sql: &'static str,
        mut call: impl FnMut(&mut Connection, &Statement) -> Result<T>,
    ) -> Result<T> {
        let stmt = self.cached(what, sql)?;
        match call(self, &stmt) {
            Err(e) if e.sqlstate() == Some("26000") => {
                log::info!(
                    "{what} on {}: the session's prepared statements were dropped \
                     (DEALLOCATE/DISCARD); preparing them again",
                    self.inner.peer
                );
                self.statements.clear();
                self.client.clear_type_cache();
                if self.inner.in_tx {
                    return Err(e);
                }
                let stmt = self.cached(what, sql)?;
                call(self, &stmt)
            }
            other => other,
        }
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

    /// Like [`query`](Self::query), naming the operation in errors and logs; for SQL built
    /// at run time, which is not kept prepared (through a transaction pooler it goes as an
    /// unnamed statement).
    pub(crate) fn query_named(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        if self.through_transaction_pooler() {
            return self.query_unnamed(what, sql, params);
        }
        let t = self.inner.io_timeout;
        self.inner.run(what, t, self.client.query(sql, params))
    }

    /// Severs the socket now (used when the connection is abandoned mid-transaction).
    pub(crate) fn sever(&mut self) {
        self.inner.reg.sever();
        self.inner.broken.get_or_insert_with(|| "severed".into());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener};

    /// `hang.invalid` stalls for 3 s (a resolver that does not answer); other names are
    /// 127.0.0.1.
    fn hang_resolver(name: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        if name == "hang.invalid" {
            std::thread::sleep(Duration::from_secs(3));
        }
        Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
    }

    /// How long until a connection attempt to `hosts` reaches a listener on 127.0.0.1
    /// (which never answers the startup: only the arrival matters).
    fn time_to_first_attempt(hosts: &str) -> Duration {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut opts = ConnectOptions::parse(&format!(
            "host={hosts} port={port} user=u dbname=d connect_timeout=1 sslmode=disable"
        ))
        .unwrap();
        opts.resolver = hang_resolver;
        let opts = Arc::new(opts);
        let watchdog = Watchdog::start().unwrap();
        let group = watchdog.new_group();
        let started = Instant::now();
        let opener = std::thread::spawn(move || {
            let _ = Connection::open(&opts, &watchdog, group, None);
        });
        let (_accepted, _) = listener.accept().unwrap();
        let took = started.elapsed();
        opener.join().unwrap();
        took
    }

    #[test]
    fn hosts_are_resolved_one_at_a_time_each_under_its_own_deadline() {
        // The first host is tried at once, whatever a later one's name lookup does.
        let t = time_to_first_attempt("localhost,hang.invalid");
        assert!(t < Duration::from_millis(500), "first attempt after {t:?}");
        // A stalled first name costs its own connect_timeout (1 s), then the next host.
        let t = time_to_first_attempt("hang.invalid,localhost");
        assert!(
            t >= Duration::from_millis(900) && t < Duration::from_millis(2500),
            "failed over after {t:?}"
        );
    }
}
