//! Sockets we create ourselves, so that the watchdog can always reach them.
//!
//! Owns: turning one host of a connection string into targets when its turn comes (resolving
//! its name on a helper thread under that host's deadline, since `getaddrinfo` has no timeout
//! of its own; one lookup per name in flight, at most [`MAX_LOOKUPS`] at once), creating
//! each socket with socket2 (TCP_NODELAY, keepalive, TCP_USER_TIMEOUT, close-on-exec), taking the
//! watchdog's sever handle *before* the connect starts, and the non-blocking connect itself
//! inside the connection's runtime so that both the deadline and a sever end it.
//!
//! Fails with `Connect` (refused, unreachable, no such socket file, a full listen queue, a
//! name that does not resolve or whose lookup thread died), `Timeout` (the
//! `connect_timeout` fired) or `Shutdown` (the watchdog severed the attempt).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};
use tokio_postgres::config::Host;

use super::options::ConnectOptions;
use super::runtime::ConnRuntime;
use super::target::{Stream, Target};
use super::time::deadline_after;
use super::watchdog::{Registration, SeverReason, Watchdog};
use crate::error::{fmt_duration, Error, ErrorKind, Result};

/// How many hosts the connection string names.
pub(crate) fn host_count(opts: &ConnectOptions) -> usize {
    opts.config.get_hosts().len()
}

/// The targets of host `i` of the connection string: its address (`hostaddr`), its socket
/// path, or the addresses its name resolves to before `deadline`. Hosts are resolved one at
/// a time, as they are tried, so that a stalled name costs only its own deadline.
/// `severed` tells whether the caller's watchdog group was severed meanwhile: a name lookup
/// holds no socket, so this is how a shutdown reaches it.
pub(crate) fn resolve_host(
    opts: &ConnectOptions,
    i: usize,
    deadline: &Deadline,
    severed: &dyn Fn() -> bool,
) -> Result<Vec<Target>> {
    let config = &opts.config;
    let hosts = config.get_hosts();
    let ports = config.get_ports();
    let port = match ports.len() {
        0 => 5432,
        1 => ports[0],
        _ => ports[i],
    };
    match &hosts[i] {
        Host::Unix(dir) => Ok(vec![Target::Unix {
            path: dir.join(format!(".s.PGSQL.{port}")),
        }]),
        Host::Tcp(name) => {
            if let Some(ip) = config.get_hostaddrs().get(i) {
                return Ok(vec![Target::Tcp {
                    addr: SocketAddr::new(*ip, port),
                    host: name.clone(),
                }]);
            }
            let addrs = lookup(lookups(), name, port, deadline, severed, opts.resolver)?;
            Ok(addrs
                .into_iter()
                .map(|addr| Target::Tcp {
                    addr,
                    host: name.clone(),
                })
                .collect())
        }
    }
}

/// Most name lookups running at once in the process. getaddrinfo cannot be interrupted, so
/// a lookup that stalls keeps its thread until the resolver gives up; a lookup of a name
/// already being looked up waits for that one instead of starting another, and past this
/// many stalled names new lookups fail at once instead of piling up threads.
pub(crate) const MAX_LOOKUPS: usize = 8;

pub(crate) use super::target::Resolver;

/// One name lookup in flight, shared by every caller that wants that name.
struct Lookup {
    result: Mutex<Option<std::result::Result<Vec<SocketAddr>, String>>>,
    done: Condvar,
}

type Table = Mutex<HashMap<(String, u16), Arc<Lookup>>>;

/// The process's lookups in flight.
fn lookups() -> &'static Table {
    static LOOKUPS: OnceLock<Table> = OnceLock::new();
    LOOKUPS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends a lookup: stores its result (an explanation if the thread died without one),
/// removes it from the table, wakes its waiters. Runs on drop, so also when the lookup
/// thread unwinds.
struct Finish {
    table: &'static Table,
    key: (String, u16),
    lookup: Arc<Lookup>,
    result: Option<std::result::Result<Vec<SocketAddr>, String>>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let result = self
            .result
            .take()
            .unwrap_or_else(|| Err("the name lookup thread ended without an answer".to_owned()));
        *lock(&self.lookup.result) = Some(result);
        let mut table = lock(self.table);
        if table
            .get(&self.key)
            .is_some_and(|l| Arc::ptr_eq(l, &self.lookup))
        {
            table.remove(&self.key);
        }
        drop(table);
        self.lookup.done.notify_all();
    }
}

/// Resolves a host name without blocking past `deadline` (getaddrinfo has no timeout: it runs
/// on a helper thread that is left to finish on its own if the deadline passes; see
/// [`MAX_LOOKUPS`]).
fn lookup(
    table: &'static Table,
    name: &str,
    port: u16,
    deadline: &Deadline,
    severed: &dyn Fn() -> bool,
    resolver: Resolver,
) -> Result<Vec<SocketAddr>> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let key = (name.to_owned(), port);
    let lookup = {
        let table_ref = table;
        let mut table = lock(table_ref);
        match table.get(&key) {
            Some(l) => l.clone(),
            None => {
                if table.len() >= MAX_LOOKUPS {
                    return Err(Error::new(
                        ErrorKind::Connect,
                        format!(
                            "resolving {name}: {} name lookups are already waiting for the resolver; not starting another (check the DNS settings)",
                            table.len()
                        ),
                    ));
                }
                let l = Arc::new(Lookup {
                    result: Mutex::new(None),
                    done: Condvar::new(),
                });
                table.insert(key.clone(), l.clone());
                let finish = Finish {
                    table: table_ref,
                    key: key.clone(),
                    lookup: l.clone(),
                    result: None,
                };
                let owned = name.to_owned();
                let spawned = thread::Builder::new()
                    .name("postpone-dns".into())
                    .spawn(move || {
                        let mut finish = finish;
                        finish.result = Some(resolver(&owned, port).map_err(|e| e.to_string()));
                    });
                if let Err(e) = spawned {
                    // The closure (and its Finish) was dropped: the entry is gone already.
                    drop(table);
                    return Err(Error::with_source(
                        ErrorKind::Other,
                        "spawning a dns thread",
                        e,
                    ));
                }
                l
            }
        }
    };
    // Wait in slices, so that a sever of the caller's group ends the wait within 50 ms.
    let mut slot = lock(&lookup.result);
    loop {
        if let Some(r) = slot.as_ref() {
            return match r {
                Ok(addrs) if addrs.is_empty() => Err(Error::new(
                    ErrorKind::Connect,
                    format!("resolving {name}: no addresses"),
                )),
                Ok(addrs) => Ok(addrs.clone()),
                Err(e) => Err(Error::new(
                    ErrorKind::Connect,
                    format!("resolving {name}: {e}"),
                )),
            };
        }
        if severed() {
            return Err(Error::new(
                ErrorKind::Shutdown,
                format!("resolving {name}: severed by shutdown"),
            ));
        }
        let left = deadline.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("resolving {name}: no answer within {}", deadline.name),
            ));
        }
        slot = lookup
            .done
            .wait_timeout(slot, left.min(Duration::from_millis(50)))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Creates the socket for `target`, registers its sever handle, and connects it before
/// `deadline`. The returned registration must live as long as the stream.
pub(crate) fn connect(
    rt: &ConnRuntime,
    opts: &ConnectOptions,
    target: &Target,
    watchdog: &Watchdog,
    group: u64,
    deadline: &Deadline,
) -> Result<(Stream, Registration)> {
    let (name, deadline) = (&deadline.name, deadline.at);
    let what = format!("connecting to {target}");
    let fail = |e: io::Error| Error::with_source(ErrorKind::Connect, what.clone(), e);
    match target {
        Target::Tcp { addr, .. } => {
            let socket = Socket::new(
                Domain::for_address(*addr),
                Type::STREAM,
                Some(Protocol::TCP),
            )
            .map_err(fail)?;
            configure_tcp(&socket, opts).map_err(fail)?;
            let handle = socket.try_clone().map_err(fail)?;
            let reg = watchdog.register(group, target.to_string(), handle);
            socket.set_nonblocking(true).map_err(fail)?;
            let tcp = {
                let _enter = rt.enter();
                tokio::net::TcpSocket::from_std_stream(socket.into())
            };
            let wait = deadline.saturating_duration_since(Instant::now());
            match rt.block_on(async { tokio::time::timeout(wait, tcp.connect(*addr)).await })? {
                Ok(Ok(stream)) => {
                    check_not_severed(&reg, &what)?;
                    Ok((Stream::Tcp(stream), reg))
                }
                Ok(Err(e)) => {
                    check_not_severed(&reg, &what)?;
                    Err(fail(e))
                }
                Err(_) => {
                    reg.sever();
                    Err(Error::new(
                        ErrorKind::Timeout,
                        format!("{what}: no answer within {name}"),
                    ))
                }
            }
        }
        Target::Unix { path } => {
            let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(fail)?;
            let handle = socket.try_clone().map_err(fail)?;
            let reg = watchdog.register(group, target.to_string(), handle);
            socket.set_nonblocking(true).map_err(fail)?;
            let addr = SockAddr::unix(path).map_err(fail)?;
            let pending = match socket.connect(&addr) {
                Ok(()) => false,
                Err(e) if e.raw_os_error() == Some(EINPROGRESS) => true,
                // A Unix socket answers EAGAIN, not "in progress", when the server's listen
                // queue is full: nothing is pending, the attempt failed.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(Error::with_source(
                        ErrorKind::Connect,
                        format!("{what}: the server's listen queue is full (it accepts no more connections for now)"),
                        e,
                    ))
                }
                Err(e) => return Err(fail(e)),
            };
            let std_stream: std::os::unix::net::UnixStream = socket.into();
            let stream = {
                let _enter = rt.enter();
                tokio::net::UnixStream::from_std(std_stream).map_err(fail)?
            };
            if pending {
                let wait = deadline.saturating_duration_since(Instant::now());
                match rt.block_on(async { tokio::time::timeout(wait, stream.writable()).await })? {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(fail(e)),
                    Err(_) => {
                        reg.sever();
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!("{what}: no answer within {name}"),
                        ));
                    }
                }
                if let Some(e) = stream.take_error().map_err(fail)? {
                    return Err(fail(e));
                }
            }
            check_not_severed(&reg, &what)?;
            Ok((Stream::Unix(stream), reg))
        }
    }
}

fn check_not_severed(reg: &Registration, what: &str) -> Result<()> {
    match reg.severed() {
        SeverReason::None => Ok(()),
        SeverReason::Shutdown => Err(Error::new(
            ErrorKind::Shutdown,
            format!("{what}: connection severed by shutdown"),
        )),
        _ => Err(Error::new(
            ErrorKind::Closed,
            format!("{what}: connection severed"),
        )),
    }
}

/// errno of a non-blocking connect still in progress.
#[cfg(any(target_os = "linux", target_os = "android"))]
const EINPROGRESS: i32 = 115;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const EINPROGRESS: i32 = 36;

/// The longest keepalive idle time or interval Linux accepts.
const KEEPALIVE_MAX: Duration = Duration::from_secs(32767);

fn configure_tcp(socket: &Socket, opts: &ConnectOptions) -> io::Result<()> {
    socket.set_tcp_nodelay(true)?;
    if opts.keepalive {
        socket.set_keepalive(true)?;
        // Linux refuses (EINVAL) more than 32767 s between probes or 127 probes: a huge
        // setting means the longest the kernel takes.
        let ka = TcpKeepalive::new()
            .with_time(opts.keepalive_idle.min(KEEPALIVE_MAX))
            .with_interval(opts.keepalive_interval.min(KEEPALIVE_MAX));
        #[cfg(not(any(target_os = "openbsd", target_os = "windows")))]
        let ka = ka.with_retries(opts.keepalive_retries.min(127));
        socket.set_tcp_keepalive(&ka)?;
    }
    // An int of milliseconds for the kernel: at most about 24 days.
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    socket.set_tcp_user_timeout(Some(
        opts.tcp_user_timeout
            .min(Duration::from_millis(i32::MAX as u64)),
    ))?;
    Ok(())
}

/// The deadline of one connection attempt and how to name it in errors.
#[derive(Clone, Debug)]
pub(crate) struct Deadline {
    pub(crate) at: Instant,
    /// `5s connect_timeout`, or `the 120ms left of the shutdown timeout`.
    pub(crate) name: String,
}

/// The deadline given to one target: the whole `connect_timeout`, as libpq does per host,
/// but never past `overall` (which bounds a shutdown's cleanup).
pub(crate) fn attempt_deadline(
    connect_timeout: Duration,
    overall: Option<(Instant, &str)>,
) -> Deadline {
    let now = Instant::now();
    let own = deadline_after(connect_timeout);
    match overall {
        Some((o, what)) if o < own => Deadline {
            at: o,
            name: format!(
                "the {} left of the {what}",
                fmt_duration(o.saturating_duration_since(now))
            ),
        },
        _ => Deadline {
            at: own,
            name: format!("{} connect_timeout", fmt_duration(connect_timeout)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_deadline_names_what_bounds_it() {
        let d = attempt_deadline(Duration::from_secs(5), None);
        assert_eq!(d.name, "5s connect_timeout");
        let soon = Instant::now() + Duration::from_millis(120);
        let d = attempt_deadline(Duration::from_secs(5), Some((soon, "shutdown timeout")));
        assert_eq!(d.at, soon);
        assert!(
            d.name.ends_with("left of the shutdown timeout"),
            "{}",
            d.name
        );
        let late = Instant::now() + Duration::from_secs(60);
        let d = attempt_deadline(Duration::from_secs(5), Some((late, "shutdown timeout")));
        assert!(d.at < late);
        assert_eq!(d.name, "5s connect_timeout");
    }

    fn far() -> Deadline {
        attempt_deadline(Duration::from_secs(30), None)
    }

    #[test]
    fn a_name_lookup_gives_up_when_its_group_is_severed() {
        let e = lookup(lookups(), "localhost", 5432, &far(), &|| true, stall).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Shutdown);
        assert!(e.to_string().contains("severed by shutdown"), "{e}");
        let addrs = lookup(
            lookups(),
            "localhost",
            5432,
            &far(),
            &|| false,
            crate::conn::target::system_resolver,
        )
        .unwrap();
        assert!(addrs.iter().all(|a| a.port() == 5432));
        let ip = lookup(lookups(), "127.0.0.1", 1, &far(), &|| true, stall).unwrap();
        assert_eq!(ip, vec![SocketAddr::from(([127, 0, 0, 1], 1))]);
    }

    /// A resolver that stalls for 3 s, as one whose server does not answer.
    fn stall(_: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        thread::sleep(Duration::from_secs(3));
        Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
    }

    fn dies(_: &str, _: u16) -> io::Result<Vec<SocketAddr>> {
        panic!("a resolver that dies")
    }

    fn dns_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                    .filter(|c| c.trim_end() == "postpone-dns")
                    .count()
            })
            .unwrap_or(0)
    }

    /// A table of its own, so that the stalled lookups do not refuse other tests'.
    fn own_table() -> &'static Table {
        static T: OnceLock<Table> = OnceLock::new();
        T.get_or_init(|| Mutex::new(HashMap::new()))
    }

    #[test]
    fn stalled_name_lookups_do_not_pile_up_threads() {
        let before = dns_threads();
        let short = || attempt_deadline(Duration::from_millis(30), None);
        // Many callers of one stalled name share one lookup thread.
        for _ in 0..20 {
            let e = lookup(own_table(), "stall-a.test", 1, &short(), &|| false, stall).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
            assert!(e.to_string().contains("30ms connect_timeout"), "{e}");
        }
        // Distinct stalled names: at most MAX_LOOKUPS threads, then a clear refusal.
        let mut refused = 0;
        for i in 0..20 {
            let name = format!("stall-{i}.test");
            let e = lookup(own_table(), &name, 1, &short(), &|| false, stall).unwrap_err();
            if e.kind() == ErrorKind::Connect {
                assert!(e.to_string().contains("already waiting"), "{e}");
                refused += 1;
            }
        }
        assert!(refused >= 20 - MAX_LOOKUPS, "refused {refused}");
        let now = dns_threads();
        assert!(now <= before + MAX_LOOKUPS, "{before} -> {now} dns threads");
    }

    #[test]
    fn a_unix_socket_with_a_full_listen_queue_is_a_clear_connect_error() {
        let dir = std::env::temp_dir().join(format!("postpone-backlog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(".s.PGSQL.5432");
        let _ = std::fs::remove_file(&path);
        let listener = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        listener.bind(&SockAddr::unix(&path).unwrap()).unwrap();
        listener.listen(0).unwrap();
        // Fill the queue: nobody accepts.
        let mut queued = Vec::new();
        loop {
            let c = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
            c.set_nonblocking(true).unwrap();
            match c.connect(&SockAddr::unix(&path).unwrap()) {
                Ok(()) => queued.push(c),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the queue: {e}"),
            }
            assert!(queued.len() < 1000, "the queue never filled");
        }
        let opts = ConnectOptions::parse(&format!("host={} user=u", dir.display())).unwrap();
        let rt = ConnRuntime::new().unwrap();
        let wd = Watchdog::start().unwrap();
        let target = Target::Unix { path: path.clone() };
        let started = Instant::now();
        let Err(e) = connect(&rt, &opts, &target, &wd, wd.new_group(), &far()) else {
            panic!("connected through a full listen queue");
        };
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
        assert!(e.to_string().contains("listen queue is full"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_lookup_thread_that_dies_is_not_reported_as_a_timeout() {
        let e = lookup(own_table(), "dies.test", 1, &far(), &|| false, dies).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
        assert!(e.to_string().contains("ended without an answer"), "{e}");
    }
}
