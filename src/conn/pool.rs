//! Pooling of [`Connection`]s through r2d2, with every step bounded.
//!
//! r2d2 validates a connection on checkout and discards broken ones on return. With the stock
//! postgres manager both steps can block forever on a half-open socket; here:
//! - `is_valid` skips the ping for a connection that answered within the last second and
//!   whose socket holds no unread input (no reset, no end of stream), and otherwise pings
//!   under a short deadline that also never runs past the deadline of the checkout in
//!   progress (so a pool full of half-open sockets is drained in bounded time);
//! - `has_broken` is true for a severed, closed or timed-out connection, or one left inside a
//!   transaction; such a connection is dropped, which never blocks.

use std::cell::Cell;
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
        // Skip the ping only if the socket has nothing unread: an idle socket with input
        // has been reset, closed by the server, or sent an error (a terminated backend).
        if conn.idle_for() < FRESH && !conn.has_pending_input() {
            return Ok(());
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
        conn.ping(wait)
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.is_broken() || conn.in_transaction()
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

/// Checks a connection out, bounded by `timeout` even when every pooled socket is half-open.
pub(crate) fn checkout(pool: &Pool, timeout: Duration) -> Result<Pooled> {
    let deadline = Instant::now() + timeout;
    let previous = CHECKOUT_DEADLINE.with(|c| c.replace(Some(deadline)));
    let res = pool.get_timeout(timeout);
    CHECKOUT_DEADLINE.with(|c| c.set(previous));
    res.map_err(|e| {
        let text = e.to_string();
        let last = text
            .strip_prefix("timed out waiting for connection")
            .unwrap_or(&text)
            .trim_start_matches(": ");
        if last.is_empty() {
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
        }
    })
}
