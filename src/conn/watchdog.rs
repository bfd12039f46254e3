//! The watchdog: the one place that can end any round-trip of an `App` or of its workers.
//!
//! It holds a *sever handle* for every live socket: a `dup` of the socket's descriptor, taken
//! when the socket is created and before the first byte is sent (never the raw fd number, which
//! the kernel reuses). Severing is `shutdown(2)` on that handle: whatever thread is blocked on
//! the socket (a query, a notification wait, a TLS or startup handshake, a TCP connect) gets
//! "connection closed" within a millisecond, and the connection marks itself broken.
//!
//! Sockets are registered in *groups*: the `App` pool is one group, every worker another, so a
//! worker's shutdown severs its own sockets and nobody else's.
//!
//! The watchdog thread is also a backstop for deadlines: every round-trip arms its entry with
//! its deadline, and the thread severs any entry that is more than [`BACKSTOP_GRACE`] past it.
//! The deadline is normally enforced by a timer inside the connection's own runtime; the thread
//! only matters if that ever fails. It never touches a client, only handles, and takes its lock
//! for the few microseconds of a map update.
//!
//! States of an entry: registered (deadline unarmed) -> armed (a round-trip in flight) ->
//! unarmed again, or severed (terminal). Dropping the [`Registration`] removes the entry and
//! closes the dup.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use socket2::Socket;

/// How far past its deadline a round-trip may run before the watchdog thread severs it.
pub(crate) const BACKSTOP_GRACE: Duration = Duration::from_secs(1);
/// How often the watchdog thread looks at armed deadlines.
const TICK: Duration = Duration::from_millis(250);

/// Why a socket was severed; kept on the entry so the error can say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SeverReason {
    /// Not severed.
    None = 0,
    /// The connection itself gave up (deadline fired inside its runtime, or it was dropped).
    Local = 1,
    /// The watchdog thread found a round-trip past its deadline plus grace.
    Backstop = 2,
    /// Someone severed the whole group or the whole watchdog (shutdown).
    Shutdown = 3,
}

impl SeverReason {
    fn from_u8(v: u8) -> SeverReason {
        match v {
            1 => SeverReason::Local,
            2 => SeverReason::Backstop,
            3 => SeverReason::Shutdown,
            _ => SeverReason::None,
        }
    }
}

/// A registered socket, as the watchdog sees it.
pub(crate) struct Entry {
    group: u64,
    label: String,
    handle: Socket,
    /// Nanoseconds since the watchdog's epoch at which the current round-trip is overdue; 0 = none.
    deadline: AtomicU64,
    severed: AtomicU8,
    /// The group that borrowed this pooled socket (a worker whose task checked it out of the
    /// App's pool); 0 = none. A sever of that group severs this socket too.
    borrower: AtomicU64,
}

impl Entry {
    /// Shuts the socket down in both directions; returns false if it already was.
    fn sever(&self, reason: SeverReason) -> bool {
        if self
            .severed
            .compare_exchange(
                SeverReason::None as u8,
                reason as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return false;
        }
        crate::metrics::socket_severed(reason != SeverReason::Local);
        // ENOTCONN (never connected, or already closed by the peer) is fine: the point is
        // that nothing can block on this socket any more.
        let _ = self.handle.shutdown(Shutdown::Both);
        true
    }
}

struct Shared {
    entries: Mutex<HashMap<u64, Arc<Entry>>>,
    next_id: AtomicU64,
    next_group: AtomicU64,
    epoch: Instant,
    stop: Mutex<bool>,
    wake: Condvar,
    severed_total: AtomicU64,
    /// How many times each group was severed: work that holds no socket yet (a name lookup)
    /// compares it before and after to know it must give up.
    group_severs: Mutex<HashMap<u64, u64>>,
    /// Groups closed for good (a stopped worker's): a socket registered in one later is
    /// severed at once, so a connect that starts just after the close cannot outlive it.
    closed: Mutex<std::collections::HashSet<u64>>,
    /// Housekeeping run on every tick (the App pool closing its idle connections); gone
    /// once its owner is dropped.
    tickers: Mutex<Vec<Weak<dyn Tick>>>,
}

/// Housekeeping the watchdog thread runs on every tick, outside its own locks.
pub(crate) trait Tick: Send + Sync {
    fn tick(&self);
}

thread_local! {
    /// The group that pooled connections checked out on this thread are lent to (a worker's,
    /// while its executor runs a task); 0 = none.
    static BORROWER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with the pooled connections this thread checks out lent to `group`: a task that
/// blocks in a query through `job.app()` is severed with its worker at the hard deadline.
pub(crate) fn lending_to<T>(group: u64, f: impl FnOnce() -> T) -> T {
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            BORROWER.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(BORROWER.with(|b| b.replace(group)));
    f()
}

/// The group pooled connections checked out on this thread are lent to (0: none).
pub(crate) fn current_borrower() -> u64 {
    BORROWER.with(|b| b.get())
}

/// Owner of the watchdog thread; cheap to clone. The thread ends when the last clone and the
/// last registration are gone.
#[derive(Clone)]
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    _thread: Arc<ThreadGuard>,
}

struct ThreadGuard {
    shared: Weak<Shared>,
    handle: Mutex<Option<thread::JoinHandle<()>>>,
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            *shared.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
            shared.wake.notify_all();
        }
        let handle = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            // The thread wakes at once on `stop`; never join ourselves.
            if handle.thread().id() != thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

impl Watchdog {
    /// Starts the watchdog thread.
    pub(crate) fn start() -> std::io::Result<Watchdog> {
        let shared = Arc::new(Shared {
            entries: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            next_group: AtomicU64::new(1),
            epoch: Instant::now(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            severed_total: AtomicU64::new(0),
            group_severs: Mutex::new(HashMap::new()),
            closed: Mutex::new(std::collections::HashSet::new()),
            tickers: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&shared);
        let handle = thread::Builder::new()
            .name("postpone-watchdog".into())
            .spawn(move || run(weak))?;
        Ok(Watchdog {
            _thread: Arc::new(ThreadGuard {
                shared: Arc::downgrade(&shared),
                handle: Mutex::new(Some(handle)),
            }),
            shared,
        })
    }

    /// Runs `t.tick()` on the watchdog thread every tick, for as long as `t` lives.
    pub(crate) fn on_tick(&self, t: Weak<dyn Tick>) {
        lock(&self.shared.tickers).push(t);
    }

    /// A fresh group id: sockets registered under it can be severed together.
    pub(crate) fn new_group(&self) -> u64 {
        self.shared.next_group.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a socket: `handle` must be a dup of the connection's socket.
    pub(crate) fn register(&self, group: u64, label: String, handle: Socket) -> Registration {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            group,
            label,
            handle,
            deadline: AtomicU64::new(0),
            severed: AtomicU8::new(SeverReason::None as u8),
            borrower: AtomicU64::new(0),
        });
        lock(&self.shared.entries).insert(id, entry.clone());
        if lock(&self.shared.closed).contains(&group) {
            entry.sever(SeverReason::Shutdown);
        }
        Registration {
            id,
            entry,
            shared: self.shared.clone(),
        }
    }

    /// Severs every socket of `group`; returns how many were severed by this call.
    pub(crate) fn sever_group(&self, group: u64) -> usize {
        *lock(&self.shared.group_severs).entry(group).or_insert(0) += 1;
        self.sever_where(|e| e.group == group || e.borrower.load(Ordering::Acquire) == group)
    }

    /// Severs every socket of `group` and closes it: a socket registered in it later is
    /// severed at once. Returns how many were severed by this call.
    pub(crate) fn close_group(&self, group: u64) -> usize {
        lock(&self.shared.closed).insert(group);
        self.sever_group(group)
    }

    /// How many times `group` has been severed so far.
    pub(crate) fn sever_count(&self, group: u64) -> u64 {
        lock(&self.shared.group_severs)
            .get(&group)
            .copied()
            .unwrap_or(0)
    }

    fn sever_where(&self, pred: impl Fn(&Entry) -> bool) -> usize {
        let targets: Vec<Arc<Entry>> = lock(&self.shared.entries)
            .values()
            .filter(|e| pred(e))
            .cloned()
            .collect();
        let n = targets
            .iter()
            .filter(|e| e.sever(SeverReason::Shutdown))
            .count();
        self.shared
            .severed_total
            .fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            log::debug!("watchdog severed {n} socket(s)");
        }
        n
    }

    /// Number of live registrations in `group` (all groups if `None`).
    pub(crate) fn live(&self, group: Option<u64>) -> usize {
        lock(&self.shared.entries)
            .values()
            .filter(|e| group.is_none_or(|g| e.group == g))
            .count()
    }
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watchdog")
    }
}

/// A socket's place in the watchdog; removing it closes the dup.
pub(crate) struct Registration {
    id: u64,
    entry: Arc<Entry>,
    shared: Arc<Shared>,
}

impl Registration {
    /// Marks a round-trip in flight that must end by `deadline`.
    pub(crate) fn arm(&self, deadline: Instant) {
        let nanos = deadline
            .saturating_duration_since(self.shared.epoch)
            .as_nanos()
            .max(1) as u64;
        self.entry.deadline.store(nanos, Ordering::Release);
    }

    /// The round-trip ended.
    pub(crate) fn disarm(&self) {
        self.entry.deadline.store(0, Ordering::Release);
    }

    /// Severs this socket (the connection gave up on it).
    pub(crate) fn sever(&self) {
        self.entry.sever(SeverReason::Local);
    }

    /// Lends this (pooled) socket to `group` while it is checked out (0: returned), so that a
    /// sever of that group reaches it.
    pub(crate) fn lend(&self, group: u64) {
        self.entry.borrower.store(group, Ordering::Release);
    }

    /// Why the socket was severed, if it was.
    pub(crate) fn severed(&self) -> SeverReason {
        SeverReason::from_u8(self.entry.severed.load(Ordering::Acquire))
    }

    /// True when the socket has something nobody has read yet: bytes, an end of stream, or
    /// an error such as a reset. An idle connection should have nothing to say; one that does
    /// (a reset, a server that ended the session) must not be trusted without a round-trip.
    /// One non-blocking `recv(MSG_PEEK)`; if the socket cannot be confirmed non-blocking the
    /// answer is true, so that the caller checks the link instead of risking a blocking read.
    pub(crate) fn has_pending_input(&self) -> bool {
        let handle = &self.entry.handle;
        if !handle.nonblocking().unwrap_or(false) {
            return true;
        }
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match handle.peek(&mut buf) {
            Ok(_) => true, // data, or 0: end of stream
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.shared.entries).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map inconsistent (single inserts and
    // removes), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn run(shared: Weak<Shared>) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        {
            let stop = lock(&shared.stop);
            if *stop {
                return;
            }
            let (stop, _) = shared
                .wake
                .wait_timeout(stop, TICK)
                .unwrap_or_else(|e| e.into_inner());
            if *stop {
                return;
            }
        }
        let now = shared.epoch.elapsed().as_nanos() as u64;
        let grace = BACKSTOP_GRACE.as_nanos() as u64;
        let overdue: Vec<Arc<Entry>> = lock(&shared.entries)
            .values()
            .filter(|e| {
                let d = e.deadline.load(Ordering::Acquire);
                d != 0 && now > d.saturating_add(grace)
            })
            .cloned()
            .collect();
        let tickers: Vec<Arc<dyn Tick>> = {
            let mut t = lock(&shared.tickers);
            t.retain(|w| w.strong_count() > 0);
            t.iter().filter_map(Weak::upgrade).collect()
        };
        for t in tickers {
            t.tick();
        }
        for e in overdue {
            if e.sever(SeverReason::Backstop) {
                shared.severed_total.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "watchdog severed {}: a round-trip ran {} past its deadline",
                    e.label,
                    crate::error::fmt_duration(BACKSTOP_GRACE)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn sever_group_unblocks_a_blocked_read_and_spares_other_groups() {
        let wd = Watchdog::start().unwrap();
        let (g1, g2) = (wd.new_group(), wd.new_group());
        let (mut c1, _s1) = pair();
        let (c2, _s2) = pair();
        let r1 = wd.register(g1, "c1".into(), Socket::from(c1.try_clone().unwrap()));
        let r2 = wd.register(g2, "c2".into(), Socket::from(c2.try_clone().unwrap()));
        let reader = thread::spawn(move || {
            let mut buf = [0u8; 8];
            let t = Instant::now();
            let n = c1.read(&mut buf).unwrap_or(0);
            (n, t.elapsed())
        });
        thread::sleep(Duration::from_millis(50));
        assert_eq!(wd.sever_group(g1), 1);
        let (n, waited) = reader.join().unwrap();
        assert_eq!(n, 0, "a severed socket reads EOF");
        assert!(waited < Duration::from_secs(1));
        assert_eq!(r1.severed(), SeverReason::Shutdown);
        assert_eq!(r2.severed(), SeverReason::None);
        assert_eq!(wd.live(None), 2);
        drop(r1);
        assert_eq!(wd.live(Some(g1)), 0);
        assert_eq!(wd.live(Some(g2)), 1);
    }

    #[test]
    fn a_socket_registered_in_a_closed_group_is_severed_at_once() {
        let wd = Watchdog::start().unwrap();
        let (g, other) = (wd.new_group(), wd.new_group());
        assert_eq!(wd.close_group(g), 0);
        let (c, _s) = pair();
        let late = wd.register(g, "late".into(), Socket::from(c.try_clone().unwrap()));
        assert_eq!(late.severed(), SeverReason::Shutdown);
        let (c2, _s2) = pair();
        let fine = wd.register(other, "fine".into(), Socket::from(c2.try_clone().unwrap()));
        assert_eq!(fine.severed(), SeverReason::None);
        // A plain sever (App::sever_all) leaves the group open.
        wd.sever_group(other);
        let (c3, _s3) = pair();
        let again = wd.register(other, "again".into(), Socket::from(c3.try_clone().unwrap()));
        assert_eq!(again.severed(), SeverReason::None);
    }

    #[test]
    fn backstop_severs_an_overdue_round_trip() {
        let wd = Watchdog::start().unwrap();
        let g = wd.new_group();
        let (c, _s) = pair();
        let r = wd.register(g, "late".into(), Socket::from(c.try_clone().unwrap()));
        r.arm(Instant::now());
        let t = Instant::now();
        while r.severed() == SeverReason::None && t.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(r.severed(), SeverReason::Backstop);
        assert!(t.elapsed() >= BACKSTOP_GRACE);
    }
}
