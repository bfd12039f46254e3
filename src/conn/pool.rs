//! Pooling of [`Connection`]s through r2d2, with every step bounded.
//!
//! r2d2 validates a connection on checkout and discards broken ones on return. With the stock
//! postgres manager both steps can block forever on a half-open socket; here:
//! - `is_valid` skips the ping for a connection that answered within the last second and
//!   whose socket holds no unread input (no reset, no end of stream), and otherwise pings
//!   under a short deadline that also never runs past the deadline of the checkout in
//!   progress (so a pool full of half-open sockets is drained in bounded time); once a ping
//!   has timed out, connections idle since before it are discarded without a ping of their
//!   own (half-open sockets come in groups);
//! - `has_broken` is true for a severed, closed or timed-out connection, one left inside a
//!   transaction by `begin`, or one that ran a LISTEN; such a connection is dropped, which
//!   never blocks;
//! - a connection whose last user ran statements of its own is checked, at its next checkout
//!   and in the round-trip that serves as its ping, for an open transaction (a raw `BEGIN`)
//!   or a LISTEN it left behind; if so it is discarded.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::Connection;
use super::options::ConnectOptions;
use super::watchdog::Watchdog;
use crate::error::{fmt_duration, Error, ErrorKind, Result};

/// A connection that answered this recently is handed out without a ping.
const FRESH: Duration = Duration::from_secs(1);
/// The longest a checkout ping may wait.
const PING_CAP: Duration = Duration::from_secs(1);
/// A checkout waits in slices this long, so that `sever_all` can end the wait.
const WAIT_SLICE: Duration = Duration::from_millis(100);

thread_local! {
    /// Deadline of the checkout running on this thread, read by `is_valid`.
    static CHECKOUT_DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The r2d2 manager of postpone connections.
#[derive(Debug)]
pub(crate) struct Manager {
    opts: Arc<ConnectOptions>,
    watchdog: Watchdog,
    group: u64,
    /// When a checkout ping last ran out of time. Idle connections are usually cut off
    /// together (a failover, a middlebox reset): one that has not answered since then is
    /// discarded without its own ping, so a pool of half-open sockets costs one ping
    /// deadline, not one per socket.
    ping_timed_out: std::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watchdog")
    }
}

impl Manager {
    pub(crate) fn new(opts: Arc<ConnectOptions>, watchdog: Watchdog, group: u64) -> Manager {
        Manager {
            opts,
            watchdog,
            group,
            ping_timed_out: std::sync::Mutex::new(None),
        }
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Connection;
    type Error = Error;

    fn connect(&self) -> Result<Connection> {
        Connection::open(&self.opts, &self.watchdog, self.group, None)
    }

    fn is_valid(&self, conn: &mut Connection) -> Result<()> {
        if conn.is_broken() || conn.in_transaction() {
            return Err(Error::new(ErrorKind::Closed, "pooled connection is broken"));
        }
        conn.set_io_timeout(self.opts.io_timeout);
        // Skip the ping only if the socket has nothing unread (an idle socket with input has
        // been reset, closed by the server, or sent an error: a terminated backend), and its
        // last user ran no statement that could have left session state behind.
        if conn.idle_for() < FRESH && !conn.has_pending_input() && !conn.touched() {
            return Ok(());
        }
        let last_answer = Instant::now().checked_sub(conn.idle_for());
        let timed_out = *self
            .ping_timed_out
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let (Some(failed), Some(answered)) = (timed_out, last_answer) {
            if answered < failed {
                return Err(Error::new(
                    ErrorKind::Closed,
                    "pooled connection discarded unchecked: idle since before another one's ping timed out",
                ));
            }
        }
        let mut wait = PING_CAP.min(self.opts.io_timeout);
        if let Some(deadline) = CHECKOUT_DEADLINE.with(Cell::get) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "pooled connection not checked: the checkout deadline has passed",
                ));
            }
            wait = wait.min(left);
        }
        let res = match conn.session_is_clean(wait) {
            // The previous user ran nothing of its own: a plain ping.
            Ok(None) => conn.ping(wait),
            Ok(Some(true)) => Ok(()),
            Ok(Some(false)) => Err(Error::new(
                ErrorKind::Closed,
                "pooled connection discarded: its last user left a transaction open or a LISTEN behind",
            )),
            Err(e) => Err(e),
        };
        if res.as_ref().is_err_and(Error::is_timeout) {
            *self
                .ping_timed_out
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
        res
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.is_broken() || conn.in_transaction() || conn.listening()
    }
}

/// Logs pool errors (failed connects, failed checks) as warnings with context.
#[derive(Debug)]
pub(crate) struct LogErrors;

impl r2d2::HandleError<Error> for LogErrors {
    fn handle_error(&self, error: Error) {
        log::warn!("connection pool: {error}");
    }
}

pub(crate) type Pool = r2d2::Pool<Manager>;
pub(crate) type Pooled = r2d2::PooledConnection<Manager>;

/// Builds a pool that opens connections lazily.
pub(crate) fn build(manager: Manager, size: u32, checkout_timeout: Duration) -> Result<Pool> {
    let pool = r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .connection_timeout(checkout_timeout)
        .test_on_check_out(true)
        .error_handler(Box::new(LogErrors))
        .build_unchecked(manager);
    Ok(pool)
}

/// Checks a connection out, bounded by `timeout` even when every pooled socket is half-open,
/// and ended early (kind `Shutdown`) when `severs` moves, i.e. when `App::sever_all` runs.
///
/// r2d2 opens connections on its own threads and its waiting `get` wakes only when one is
/// added or returned: a connect that `sever_all` cuts short is retried in the background and
/// the caller would wait out the whole `timeout`. So the wait is taken in slices of
/// [`WAIT_SLICE`], looking at `severs` between them. (Each slice that finds no idle
/// connection asks r2d2 for one, so a long wait may open more connections in parallel, never
/// more than `pool_size`: as when several threads wait.)
pub(crate) fn checkout(pool: &Pool, timeout: Duration, severs: &AtomicU64) -> Result<Pooled> {
    let deadline = Instant::now() + timeout;
    let epoch = severs.load(Ordering::Acquire);
    let previous = CHECKOUT_DEADLINE.with(|c| c.replace(Some(deadline)));
    // r2d2 hands each failed wait the last error and forgets it: keep the latest one here.
    let mut last = String::new();
    let res = loop {
        let slice = deadline
            .saturating_duration_since(Instant::now())
            .min(WAIT_SLICE);
        let err = match pool.get_timeout(slice) {
            Ok(conn) => break Ok(conn),
            Err(e) => e.to_string(),
        };
        let text = err
            .strip_prefix("timed out waiting for connection")
            .unwrap_or(&err)
            .trim_start_matches(": ");
        if !text.is_empty() {
            last = text.to_owned();
        }
        if severs.load(Ordering::Acquire) != epoch {
            break Err(Error::new(
                ErrorKind::Shutdown,
                "getting a pooled connection: interrupted by sever_all",
            ));
        }
        if Instant::now() >= deadline {
            break Err(if last.is_empty() {
                Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "getting a pooled connection: none free within {} pool_timeout (raise pool_size, or return connections sooner)",
                        fmt_duration(timeout)
                    ),
                )
            } else {
                Error::new(
                    ErrorKind::Connect,
                    format!(
                        "getting a pooled connection: none within {} pool_timeout; last error: {last}",
                        fmt_duration(timeout)
                    ),
                )
            });
        }
    };
    CHECKOUT_DEADLINE.with(|c| c.set(previous));
    res
}
