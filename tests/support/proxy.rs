//! A fault-injecting TCP proxy, built on std threads and blocking IO.
//!
//! It forwards bytes between a client (the library under test) and an
//! upstream server (PostgreSQL) and, on command, simulates the network
//! failures the library must survive: half-open links ("stranded"
//! connections that never answer), resets, and a server that refuses
//! connections.
//!
//! Threads: one `fault-proxy-accept` thread polls a non-blocking listener;
//! each forwarded connection has two `fault-proxy-pump` threads (one per
//! direction) whose sockets carry short timeouts, so that they notice a
//! strand, a reset or the proxy's drop within a few tens of milliseconds.
//! The registry of live connections holds `try_clone()` handles of every
//! socket; its lock is never held across blocking IO.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What happens to connections accepted from now on (see [`FaultProxy::set_new_conns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewConns {
    /// Forwarded normally (the default).
    Forward,
    /// Accepted, then never forwarded nor answered; the socket stays open.
    Strand,
    /// The listening socket is closed: connecting gets ECONNREFUSED.
    Refuse,
}

/// How often a pump looks at its connection's state while its socket is idle.
const PUMP_POLL: Duration = Duration::from_millis(20);
/// How often the accept thread polls its non-blocking listener.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on the wait for a connection's pumps to stop after a strand/reset.
const PUMP_STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on retrying to re-bind the listening port after `Refuse`.
const REBIND_TIMEOUT: Duration = Duration::from_secs(3);

// Connection states.
const FORWARDING: u8 = 0;
const STRANDED: u8 = 1;
const RESET: u8 = 2;
/// Ended (EOF/error) or being torn down by the proxy's drop.
const CLOSED: u8 = 3;

struct ConnCtl {
    state: AtomicU8,
    /// Threads (connector/pumps) still running for this connection.
    active: AtomicUsize,
}

impl ConnCtl {
    fn state(&self) -> u8 {
        self.state.load(Ordering::SeqCst)
    }

    fn forwarding(&self) -> bool {
        self.state() == FORWARDING
    }

    /// Waits (bounded) until no thread works on this connection any more.
    fn wait_idle(&self) {
        let deadline = Instant::now() + PUMP_STOP_TIMEOUT;
        while self.active.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                eprintln!("fault-proxy: pump threads did not stop within {PUMP_STOP_TIMEOUT:?}");
                return;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A registered connection: the registry's own handles on its sockets.
struct Conn {
    ctl: Arc<ConnCtl>,
    client: TcpStream,
    upstream: Option<TcpStream>,
}

impl Conn {
    fn shutdown(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(upstream) = &self.upstream {
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }
}

struct Listening {
    listener: Option<TcpListener>,
    mode: NewConns,
}

struct Shared {
    upstream: Vec<SocketAddr>,
    port: u16,
    listening: Mutex<Listening>,
    conns: Mutex<HashMap<u64, Conn>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
    accepted: AtomicUsize,
    next_id: AtomicU64,
    /// Milliseconds each forwarded chunk waits before it is passed on (see `set_delay`).
    delay_ms: Arc<AtomicU64>,
}

/// Locks a mutex, ignoring poisoning: a panicking test thread must not turn
/// the proxy's teardown into a second panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A TCP proxy on 127.0.0.1 that can strand, reset or refuse connections.
pub struct FaultProxy {
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1:<ephemeral>, forwards to `upstream` (e.g. "127.0.0.1:5432").
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream_addrs: Vec<SocketAddr> = upstream
            .to_socket_addrs()
            .unwrap_or_else(|e| panic!("fault-proxy: cannot resolve upstream {upstream:?}: {e}"))
            .collect();
        assert!(
            !upstream_addrs.is_empty(),
            "fault-proxy: upstream {upstream:?} resolves to no address"
        );
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .unwrap_or_else(|e| panic!("fault-proxy: cannot bind a listener: {e}"));
        listener
            .set_nonblocking(true)
            .expect("fault-proxy: set_nonblocking on listener");
        let port = listener
            .local_addr()
            .expect("fault-proxy: local_addr")
            .port();
        let shared = Arc::new(Shared {
            upstream: upstream_addrs,
            port,
            listening: Mutex::new(Listening {
                listener: Some(listener),
                mode: NewConns::Forward,
            }),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            delay_ms: Arc::new(AtomicU64::new(0)),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name("fault-proxy-accept".into())
            .spawn(move || accept_loop(&accept_shared))
            .expect("fault-proxy: cannot spawn the accept thread");
        FaultProxy {
            shared,
            accept_thread: Some(accept_thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/<dbname>`
    pub fn url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port(), dbname)
    }

    /// Every connection established right now stops forwarding in both
    /// directions, forever: nothing more is read or written on either side,
    /// but both sockets stay open (no FIN, no RST) until the proxy is dropped.
    /// The client's writes may still be accepted into kernel buffers; no reply
    /// ever comes. When this returns, the pumps of those connections have
    /// stopped. New connections are not affected (see [`Self::set_new_conns`]).
    pub fn strand_all(&self) {
        let ctls: Vec<Arc<ConnCtl>> = lock(&self.shared.conns)
            .values()
            .filter(|c| {
                c.ctl
                    .state
                    .compare_exchange(FORWARDING, STRANDED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            })
            .map(|c| Arc::clone(&c.ctl))
            .collect();
        for ctl in ctls {
            ctl.wait_idle();
        }
    }

    /// Every connection established right now (forwarding or stranded) is
    /// reset: the client side gets an RST (SO_LINGER 0, then close) and the
    /// upstream side is closed. When this returns, the RSTs have been sent.
    pub fn reset_all(&self) {
        let victims: Vec<Conn> = lock(&self.shared.conns)
            .drain()
            .map(|(_, conn)| conn)
            .collect();
        for conn in &victims {
            conn.ctl.state.store(RESET, Ordering::SeqCst);
            // SO_LINGER is a property of the socket, shared by every handle.
            if let Err(e) = socket2::SockRef::from(&conn.client).set_linger(Some(Duration::ZERO)) {
                eprintln!("fault-proxy: SO_LINGER 0 failed: {e}");
            }
        }
        // The kernel sends the RST when the last descriptor of the client
        // socket is closed: let the pumps drop theirs first (they must not
        // touch the sockets once they see RESET), then drop ours.
        for conn in &victims {
            conn.ctl.wait_idle();
        }
        for conn in &victims {
            if let Some(upstream) = &conn.upstream {
                let _ = upstream.shutdown(Shutdown::Both);
            }
        }
        drop(victims);
    }

    /// What happens to connections accepted from now on:
    /// `Forward` (default): forwarded normally.
    /// `Strand`: accepted (the client's TCP connect succeeds) but nothing is
    /// ever forwarded nor answered; the socket is kept open.
    /// `Refuse`: the listening socket is closed, a connect gets ECONNREFUSED;
    /// switching back to `Forward`/`Strand` re-binds the same port.
    pub fn set_new_conns(&self, mode: NewConns) {
        if mode == NewConns::Refuse {
            let old = {
                let mut listening = lock(&self.shared.listening);
                listening.mode = mode;
                listening.listener.take()
            };
            // Closing the only descriptor of the listener: from now on the
            // port refuses connections (pending, unaccepted ones get an RST).
            drop(old);
            return;
        }
        let needs_bind = lock(&self.shared.listening).listener.is_none();
        let fresh = if needs_bind {
            Some(rebind(self.shared.port))
        } else {
            None
        };
        let mut listening = lock(&self.shared.listening);
        listening.mode = mode;
        if listening.listener.is_none() {
            listening.listener = fresh;
        }
    }

    /// Every chunk forwarded from now on, in either direction, waits `delay` first: a slow
    /// but healthy link (a round-trip costs at least twice `delay`). Zero turns it off.
    pub fn set_delay(&self, delay: Duration) {
        self.shared
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Connections currently open through the proxy (forwarding or stranded).
    pub fn live_connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Connections accepted since start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Stranded connections whose client has since closed its end (FIN or
    /// RST received by the kernel), as seen from the kernel's TCP state: the
    /// proxy itself still reads nothing. Lets a test check that the library
    /// abandoned a dead link. (A FIN queued behind data that the full receive
    /// window cannot take is not seen until the proxy is dropped.)
    pub fn peer_closed_stranded(&self) -> usize {
        // (local port, remote port) of the client side of stranded connections.
        let stranded: Vec<Option<(u16, u16)>> = lock(&self.shared.conns)
            .values()
            .filter(|c| c.ctl.state() == STRANDED)
            .map(|c| {
                let local = c.client.local_addr().ok()?;
                let peer = c.client.peer_addr().ok()?;
                Some((local.port(), peer.port()))
            })
            .collect();
        let table = super::tcp_sockets();
        stranded
            .into_iter()
            .filter(|ports| match ports {
                // getpeername fails once an RST has torn the socket down.
                None => true,
                Some((local, remote)) => !table.iter().any(|s| {
                    s.local_port == *local
                        && s.remote_port == *remote
                        && s.state == super::TCP_ESTABLISHED
                }),
            })
            .count()
    }
}

impl Drop for FaultProxy {
    /// Stops accepting, closes every socket and joins every thread.
    fn drop(&mut self) {
        let shared = &self.shared;
        shared.stopping.store(true, Ordering::SeqCst);
        let listener = lock(&shared.listening).listener.take();
        drop(listener);
        if let Some(handle) = self.accept_thread.take() {
            let _ = handle.join();
        }
        let conns: Vec<Conn> = lock(&shared.conns).drain().map(|(_, c)| c).collect();
        for conn in &conns {
            conn.ctl.state.store(CLOSED, Ordering::SeqCst);
            // Wakes up blocked pumps at once and tells both peers.
            conn.shutdown();
        }
        // A connector thread may still spawn its second pump: loop until no
        // handle is left.
        loop {
            let handles = std::mem::take(&mut *lock(&shared.threads));
            if handles.is_empty() {
                break;
            }
            for handle in handles {
                let _ = handle.join();
            }
        }
        drop(conns);
    }
}

fn rebind(port: u16) -> TcpListener {
    // std sets SO_REUSEADDR on listeners (Unix), so accepted connections and
    // TIME_WAIT leftovers on the port do not prevent re-binding; a retry
    // covers the rare case of the port being briefly used by someone else.
    let deadline = Instant::now() + REBIND_TIMEOUT;
    loop {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(listener) => {
                listener
                    .set_nonblocking(true)
                    .expect("fault-proxy: set_nonblocking on listener");
                return listener;
            }
            Err(_) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("fault-proxy: cannot re-bind 127.0.0.1:{port}: {e}"),
        }
    }
}

fn spawn_tracked(shared: &Arc<Shared>, f: impl FnOnce() + Send + 'static) -> bool {
    match thread::Builder::new()
        .name("fault-proxy-pump".into())
        .spawn(f)
    {
        Ok(handle) => {
            lock(&shared.threads).push(handle);
            true
        }
        Err(e) => {
            eprintln!("fault-proxy: cannot spawn a pump thread: {e}");
            false
        }
    }
}

/// Joins the threads that have already finished, so the list stays short.
fn reap_finished(shared: &Shared) {
    let finished: Vec<JoinHandle<()>> = {
        let mut threads = lock(&shared.threads);
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *threads)
            .into_iter()
            .partition(|h| h.is_finished());
        *threads = running;
        done
    };
    for handle in finished {
        let _ = handle.join();
    }
}

fn accept_loop(shared: &Arc<Shared>) {
    let mut iterations: u32 = 0;
    while !shared.stopping.load(Ordering::SeqCst) {
        iterations = iterations.wrapping_add(1);
        if iterations % 64 == 0 {
            reap_finished(shared);
        }
        let attempt = {
            let listening = lock(&shared.listening);
            listening
                .listener
                .as_ref()
                .map(|l| (l.accept(), listening.mode))
        };
        match attempt {
            Some((Ok((stream, _)), mode)) => handle_new(shared, stream, mode),
            Some((Err(e), _)) if e.kind() == ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Some((Err(e), _)) => {
                eprintln!("fault-proxy: accept failed: {e}");
                thread::sleep(ACCEPT_POLL);
            }
            None => thread::sleep(ACCEPT_POLL),
        }
    }
}

fn handle_new(shared: &Arc<Shared>, client: TcpStream, mode: NewConns) {
    shared.accepted.fetch_add(1, Ordering::SeqCst);
    if mode == NewConns::Refuse {
        // Accepted just before the listener was closed: refuse it after all.
        return;
    }
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let state = if mode == NewConns::Strand {
        STRANDED
    } else {
        FORWARDING
    };
    let ctl = Arc::new(ConnCtl {
        state: AtomicU8::new(state),
        active: AtomicUsize::new(0),
    });
    if mode == NewConns::Strand {
        lock(&shared.conns).insert(
            id,
            Conn {
                ctl,
                client,
                upstream: None,
            },
        );
        return;
    }
    let registry_client = match client.try_clone() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fault-proxy: try_clone failed: {e}");
            return;
        }
    };
    ctl.active.store(1, Ordering::SeqCst);
    lock(&shared.conns).insert(
        id,
        Conn {
            ctl: Arc::clone(&ctl),
            client: registry_client,
            upstream: None,
        },
    );
    let thread_shared = Arc::clone(shared);
    let thread_ctl = Arc::clone(&ctl);
    let spawned = spawn_tracked(shared, move || {
        connect_and_pump(&thread_shared, id, &thread_ctl, client);
        finish(&thread_shared, id, &thread_ctl);
    });
    if !spawned {
        ctl.state.store(CLOSED, Ordering::SeqCst);
        finish(shared, id, &ctl);
    }
}

/// Called when a thread of connection `id` ends: the last one out removes a
/// connection that ended normally from the registry (a stranded one stays).
fn finish(shared: &Shared, id: u64, ctl: &ConnCtl) {
    let mut conns = lock(&shared.conns);
    let last = ctl.active.fetch_sub(1, Ordering::SeqCst) == 1;
    if last && matches!(ctl.state(), FORWARDING | CLOSED) {
        let conn = conns.remove(&id);
        drop(conns);
        if let Some(conn) = conn {
            conn.shutdown();
        }
    }
}

fn connect_upstream(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last_err = None;
    for addr in addrs {
        match TcpStream::connect_timeout(addr, UPSTREAM_CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("no upstream address")))
}

/// Runs on the connection's first thread: connects upstream, starts the
/// upstream->client pump, then pumps client->upstream itself.
fn connect_and_pump(shared: &Arc<Shared>, id: u64, ctl: &Arc<ConnCtl>, client: TcpStream) {
    let upstream = match connect_upstream(&shared.upstream) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fault-proxy: cannot connect upstream: {e}");
            let _ =
                ctl.state
                    .compare_exchange(FORWARDING, CLOSED, Ordering::SeqCst, Ordering::SeqCst);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let clones = (|| {
        Some((
            upstream.try_clone().ok()?,
            upstream.try_clone().ok()?,
            client.try_clone().ok()?,
        ))
    })();
    let Some((registry_upstream, u2c_from, u2c_to)) = clones else {
        eprintln!("fault-proxy: try_clone failed");
        let _ = ctl
            .state
            .compare_exchange(FORWARDING, CLOSED, Ordering::SeqCst, Ordering::SeqCst);
        return;
    };
    // Socket-level options, shared by all handles: reads and writes time out
    // so that every pump notices state changes promptly.
    for s in [&client, &upstream] {
        let _ = s.set_read_timeout(Some(PUMP_POLL));
        let _ = s.set_write_timeout(Some(PUMP_POLL));
    }
    {
        let mut conns = lock(&shared.conns);
        match conns.get_mut(&id) {
            // Keep the upstream socket open as long as the entry lives
            // (in particular if the connection was stranded meanwhile).
            Some(conn) => conn.upstream = Some(registry_upstream),
            // Reset or proxy dropped while connecting.
            None => return,
        }
    }
    if !ctl.forwarding() || shared.stopping.load(Ordering::SeqCst) {
        return;
    }
    ctl.active.fetch_add(1, Ordering::SeqCst);
    let thread_shared = Arc::clone(shared);
    let thread_ctl = Arc::clone(ctl);
    let u2c_delay = Arc::clone(&shared.delay_ms);
    let spawned = spawn_tracked(shared, move || {
        pump(&thread_ctl, u2c_from, u2c_to, &u2c_delay);
        finish(&thread_shared, id, &thread_ctl);
    });
    if !spawned {
        ctl.active.fetch_sub(1, Ordering::SeqCst);
        let _ = ctl
            .state
            .compare_exchange(FORWARDING, CLOSED, Ordering::SeqCst, Ordering::SeqCst);
        return;
    }
    pump(ctl, client, upstream, &shared.delay_ms);
}

/// Copies `from` -> `to` while the connection is forwarding. Never touches
/// the sockets once the state has changed (stranded, reset, closed).
fn pump(ctl: &ConnCtl, mut from: TcpStream, mut to: TcpStream, delay_ms: &AtomicU64) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !ctl.forwarding() {
            return;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                // Orderly close: pass the FIN on, let the other direction drain.
                if ctl.forwarding() {
                    let _ = to.shutdown(Shutdown::Write);
                }
                return;
            }
            Ok(n) => {
                let delay = delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    thread::sleep(Duration::from_millis(delay));
                }
                if !write_all(ctl, &mut to, &buf[..n]) {
                    break;
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(_) => break,
        }
    }
    // IO error (reset by a peer...): end the whole connection, both ways.
    if ctl
        .state
        .compare_exchange(FORWARDING, CLOSED, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    }
}

/// Writes all of `data` unless the connection stops forwarding or fails.
fn write_all(ctl: &ConnCtl, to: &mut TcpStream, data: &[u8]) -> bool {
    let mut off = 0;
    while off < data.len() {
        if !ctl.forwarding() {
            return false;
        }
        match to.write(&data[off..]) {
            Ok(0) => return false,
            Ok(n) => off += n,
            Err(e) if is_timeout(&e) => {}
            Err(_) => return false,
        }
    }
    true
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}
