//! The App's pool of [`Connection`]s: every step bounded, and nothing left running behind a
//! checkout.
//!
//! Owns: the idle connections, the count of connections open (idle, checked out, or being
//! opened) against `pool_size`, and what the last checkout pings learned. A connection is
//! opened only by a checkout that needs one, on the caller's thread and within the caller's
//! deadline; when the checkout gives up, nothing goes on trying in the background. (r2d2,
//! which this replaces, opens connections on its own threads and retries a failed one without
//! end: one failed checkout against a full server kept `pool_size` connect loops running.)
//!
//! A checkout takes the most recently returned idle connection and checks it:
//! - a connection that answered within the last second and whose socket holds no unread
//!   input (no reset, no end of stream, no error from a terminated backend) is handed out as
//!   it is;
//! - otherwise it is pinged. The ping's deadline is the App's `io_timeout`, the bound it puts
//!   on every healthy round-trip. When the checkout has less time left than that, the ping
//!   gets what is left, and an unanswered one condemns nothing: the connection goes back to
//!   the pool with its ping outstanding, and is judged once that ping has had its whole
//!   `io_timeout`;
//! - once a ping has gone unanswered for its whole `io_timeout`, connections idle since
//!   before it are discarded without a ping of their own (half-open sockets come in groups:
//!   a failover, a middlebox reset).
//!
//! A connection whose last user ran statements of its own is checked, in the round-trip that
//! serves as its ping, for an open transaction (a raw `BEGIN`) or a LISTEN it left behind;
//! if so it is discarded.
//!
//! A connection idle in the pool for `pool_idle_timeout` (30 s by default) is closed by the
//! watchdog thread's tick, and its place is free: an idle process holds no pooled
//! connection.
//!
//! Returned connections that are broken, inside a transaction (`begin`), that ran a LISTEN,
//! or returned by a thread that is panicking are dropped (which never blocks), and their
//! place is free at once.
//!
//! Fails with `Timeout` (nothing free within `pool_timeout`), `Connect` (no connection could
//! be opened within it; the message carries the last error) or `Shutdown` (`sever_all`).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::client::{deadline_after, Checked, Connection};
use super::options::ConnectOptions;
use super::watchdog::{Tick, Watchdog};
use crate::error::{fmt_duration, Error, ErrorKind, Result};

/// A connection that answered this recently is handed out without a ping.
const FRESH: Duration = Duration::from_secs(1);
/// A checkout waits in slices this long, so that `sever_all` can end the wait.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// First pause after a failed connect; doubles up to [`BACKOFF_MAX`], always within the
/// caller's deadline.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Default of `pool_idle_timeout`: an idle connection is closed after this long unused.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// At most one warning about failed connects per this interval; the others are counted.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The pool. Cheap to share behind the App's `Arc`.
pub(crate) struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    opts: Arc<ConnectOptions>,
    watchdog: Watchdog,
    group: u64,
    size: usize,
    /// An idle connection unused this long is closed.
    idle_timeout: Duration,
    state: Mutex<State>,
    /// Signalled when a connection is returned or a place becomes free.
    freed: Condvar,
    /// When a ping last went unanswered for its whole `io_timeout`.
    ping_timed_out: Mutex<Option<Instant>>,
    log: Mutex<LogLimit>,
}

struct State {
    idle: Vec<Connection>,
    /// Idle, checked out, or being opened; never more than `size`.
    open: usize,
}

/// Rate limit of the warnings about failed connects.
struct LogLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    /// Whether a warning may be written at `now`: `Some(n)` with the number of warnings held
    /// back since the last one, or `None` to hold this one back too.
    fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < LOG_EVERY)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.shared.state);
        f.debug_struct("Pool")
            .field("size", &self.shared.size)
            .field("open", &st.open)
            .field("idle", &st.idle.len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few field updates: a panic cannot leave them half done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// A pool of at most `size` connections, opened lazily and closed after `idle_timeout`
    /// unused.
    pub(crate) fn new(
        opts: Arc<ConnectOptions>,
        watchdog: Watchdog,
        group: u64,
        size: u32,
        idle_timeout: Duration,
    ) -> Pool {
        let pool = Pool {
            shared: Arc::new(Shared {
                opts,
                watchdog,
                group,
                size: size.max(1) as usize,
                idle_timeout,
                state: Mutex::new(State {
                    idle: Vec::new(),
                    open: 0,
                }),
                freed: Condvar::new(),
                ping_timed_out: Mutex::new(None),
                log: Mutex::new(LogLimit {
                    last: None,
                    suppressed: 0,
                }),
            }),
        };
        let ticker: Arc<dyn Tick> = pool.shared.clone();
        pool.shared.watchdog.on_tick(Arc::downgrade(&ticker));
        pool
    }

    /// Checks a connection out, bounded by `timeout` even when every pooled socket is
    /// half-open, and ended early (kind `Shutdown`) when `severs` moves, i.e. when
    /// `App::sever_all` runs.
    pub(crate) fn checkout(&self, timeout: Duration, severs: &AtomicU64) -> Result<Pooled> {
        let shared = &self.shared;
        let deadline = deadline_after(timeout);
        let epoch = severs.load(Ordering::Acquire);
        let interrupted = || severs.load(Ordering::Acquire) != epoch;
        // Connections whose ping this checkout left unanswered: back to the pool at the end.
        let mut unanswered: Vec<Connection> = Vec::new();
        let mut last: Option<Error> = None;
        let mut backoff = BACKOFF_MIN;
        let res = loop {
            if interrupted() {
                break Err(Error::new(
                    ErrorKind::Shutdown,
                    "getting a pooled connection: interrupted by sever_all",
                ));
            }
            let mut st = lock(&shared.state);
            if let Some(mut conn) = st.idle.pop() {
                drop(st);
                match shared.check(&mut conn, deadline) {
                    Check::Good => break Ok(conn),
                    Check::Unanswered => unanswered.push(conn),
                    Check::Dead(e) => {
                        log::debug!("pooled connection discarded: {e}");
                        drop(conn);
                        shared.release_place();
                    }
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(timed_out(timeout, last.as_ref(), !unanswered.is_empty()));
            }
            if st.open < shared.size {
                st.open += 1;
                drop(st);
                match Connection::open_within(
                    &shared.opts,
                    &shared.watchdog,
                    shared.group,
                    Some((deadline, "pool_timeout")),
                ) {
                    Ok(conn) => break Ok(conn),
                    Err(e) => {
                        shared.release_place();
                        if e.kind() == ErrorKind::Shutdown || interrupted() {
                            break Err(e.context("getting a pooled connection"));
                        }
                        shared.log_connect_failure(&e);
                        last = Some(e);
                        // Do not hammer a server that refuses: pause (a returned connection
                        // ends the pause early), within the caller's deadline only.
                        let until = Instant::now() + backoff;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                        let mut st = lock(&shared.state);
                        while st.idle.is_empty() && !interrupted() {
                            let left = until
                                .min(deadline)
                                .saturating_duration_since(Instant::now());
                            if left.is_zero() {
                                break;
                            }
                            st = shared
                                .freed
                                .wait_timeout(st, left.min(WAIT_SLICE))
                                .unwrap_or_else(|e| e.into_inner())
                                .0;
                        }
                    }
                }
                continue;
            }
            // Full: wait for a connection to come back or a place to free up.
            let _ = shared.freed.wait_timeout(st, left.min(WAIT_SLICE));
        };
        if !unanswered.is_empty() {
            let mut st = lock(&shared.state);
            st.idle.splice(0..0, unanswered);
            drop(st);
            shared.freed.notify_all();
        }
        res.map(|conn| Pooled {
            conn: Some(conn),
            shared: self.shared.clone(),
        })
    }
}

impl Tick for Shared {
    /// Closes the connections idle for `idle_timeout`.
    fn tick(&self) {
        let stale: Vec<Connection> = {
            let mut st = lock(&self.state);
            if st.idle.iter().all(|c| c.idle_for() < self.idle_timeout) {
                return;
            }
            let (stale, keep) = std::mem::take(&mut st.idle)
                .into_iter()
                .partition(|c| c.idle_for() >= self.idle_timeout);
            st.idle = keep;
            st.open = st.open.saturating_sub(stale.len());
            stale
        };
        log::debug!(
            "connection pool: closed {} connection(s) idle for {}",
            stale.len(),
            fmt_duration(self.idle_timeout)
        );
        drop(stale);
        self.freed.notify_all();
    }
}

impl Pool {
    /// The most connections the pool holds open at once.
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    pub(crate) fn size(&self) -> usize {
        self.shared.size
    }

    /// How long a connection may sit unused before it is closed.
    pub(crate) fn idle_timeout(&self) -> Duration {
        self.shared.idle_timeout
    }
}

/// What a checkout learned about an idle connection.
enum Check {
    Good,
    /// Its ping had less than `io_timeout` and got no answer yet: no verdict.
    Unanswered,
    Dead(Error),
}

impl Shared {
    fn check(&self, conn: &mut Connection, deadline: Instant) -> Check {
        if conn.is_broken() || conn.in_transaction() {
            return Check::Dead(Error::new(ErrorKind::Closed, "pooled connection is broken"));
        }
        conn.set_io_timeout(self.opts.io_timeout);
        // Skip the ping only if the socket has nothing unread: an idle socket with input
        // has been reset, closed by the server, or sent an error (a terminated backend).
        // Its last user must have run no statement that could have left session state
        // behind either (a raw BEGIN, a LISTEN): that is checked in the same round-trip.
        let pending = conn.has_pending_input();
        if conn.unanswered_since().is_none()
            && conn.idle_for() < FRESH
            && !pending
            && !conn.touched()
        {
            return Check::Good;
        }
        let last_answer = Instant::now().checked_sub(conn.idle_for());
        let timed_out = *lock(&self.ping_timed_out);
        if let (Some(failed), Some(answered)) = (timed_out, last_answer) {
            if answered < failed {
                return Check::Dead(Error::new(
                    ErrorKind::Closed,
                    "pooled connection discarded unchecked: idle since before another one's ping timed out",
                ));
            }
        }
        let budget = deadline.saturating_duration_since(Instant::now());
        if budget.is_zero() {
            return Check::Unanswered;
        }
        match conn.check_within(budget) {
            Ok(Checked::Alive) => Check::Good,
            Ok(Checked::Unanswered) => Check::Unanswered,
            Ok(Checked::Dirty) => Check::Dead(Error::new(
                ErrorKind::Closed,
                "pooled connection discarded: its last user left a transaction open or a LISTEN behind, or changed the schema's search_path",
            )),
            Err(e) => {
                if e.is_timeout() {
                    // Unanswered for a whole io_timeout: half-open, and probably not alone.
                    *lock(&self.ping_timed_out) = Some(Instant::now());
                }
                Check::Dead(e)
            }
        }
    }

    /// A connection left the pool for good: its place is free.
    fn release_place(&self) {
        let mut st = lock(&self.state);
        st.open = st.open.saturating_sub(1);
        drop(st);
        self.freed.notify_one();
    }

    fn give_back(&self, conn: Connection) {
        if std::thread::panicking() || conn.is_broken() || conn.in_transaction() || conn.listening()
        {
            // Dropping severs the socket: the server ends the session (and rolls back).
            drop(conn);
            self.release_place();
            return;
        }
        lock(&self.state).idle.push(conn);
        self.freed.notify_one();
    }

    fn log_connect_failure(&self, e: &Error) {
        let Some(suppressed) = lock(&self.log).allow(Instant::now()) else {
            log::debug!("connection pool: {e}");
            return;
        };
        if suppressed > 0 {
            log::warn!(
                "connection pool: {e} ({suppressed} more failed connect(s) in the last {})",
                fmt_duration(LOG_EVERY)
            );
        } else {
            log::warn!("connection pool: {e}");
        }
    }
}

fn timed_out(timeout: Duration, last: Option<&Error>, unanswered: bool) -> Error {
    match last {
        Some(last) => {
            let e = Error::new(
                // A missing database stays one: the server was reached.
                if last.is_database_missing() {
                    ErrorKind::DatabaseMissing
                } else {
                    ErrorKind::Connect
                },
                format!(
                    "getting a pooled connection: none within {} pool_timeout; last error: {last}",
                    fmt_duration(timeout)
                ),
            );
            match last.sqlstate() {
                Some(code) => e.set_sqlstate(code),
                None => e,
            }
        }
        None if unanswered => Error::new(
            ErrorKind::Timeout,
            format!(
                "getting a pooled connection: none within {} pool_timeout (the server is slow to answer pings; they go on under io_timeout)",
                fmt_duration(timeout)
            ),
        ),
        None => Error::new(
            ErrorKind::Timeout,
            format!(
                "getting a pooled connection: none free within {} pool_timeout (raise pool_size, or return connections sooner)",
                fmt_duration(timeout)
            ),
        ),
    }
}

/// A connection checked out of the pool; goes back when dropped (or is discarded: broken,
/// inside a transaction, or dropped while its thread panics).
pub(crate) struct Pooled {
    conn: Option<Connection>,
    shared: Arc<Shared>,
}

impl Deref for Pooled {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a pooled connection is present until dropped")
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
            .as_mut()
            .expect("a pooled connection is present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.shared.give_back(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_failures_are_logged_at_most_once_per_interval() {
        let mut l = LogLimit {
            last: None,
            suppressed: 0,
        };
        let t0 = Instant::now();
        assert_eq!(l.allow(t0), Some(0));
        for i in 1..=100u64 {
            assert_eq!(l.allow(t0 + Duration::from_millis(i * 50)), None);
        }
        assert_eq!(l.allow(t0 + LOG_EVERY), Some(100));
        assert_eq!(l.allow(t0 + LOG_EVERY + Duration::from_secs(1)), None);
    }
}
