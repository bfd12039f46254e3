//! Sockets we create ourselves, so that the watchdog can always reach them.
//!
//! Owns: turning the hosts of a connection string into targets (resolving names on a helper
//! thread under the connect deadline, since `getaddrinfo` has no timeout of its own), creating
//! each socket with socket2 (TCP_NODELAY, keepalive, TCP_USER_TIMEOUT, close-on-exec), taking the
//! watchdog's sever handle *before* the connect starts, and the non-blocking connect itself
//! inside the connection's runtime so that both the deadline and a sever end it.
//!
//! Fails with `Connect` (refused, unreachable, no such socket file), `Timeout` (the
//! `connect_timeout` fired) or `Shutdown` (the watchdog severed the attempt).

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};
use tokio::runtime::Runtime;
use tokio_postgres::config::Host;

use super::client::deadline_after;
use super::options::ConnectOptions;
use super::target::{Stream, Target};
use super::watchdog::{Registration, SeverReason, Watchdog};
use crate::error::{fmt_duration, Error, ErrorKind, Result};

/// Every target of the connection string, in order: each host, each of its addresses.
/// `severed` tells whether the caller's watchdog group was severed meanwhile: a name lookup
/// holds no socket, so this is how a shutdown reaches it.
pub(crate) fn resolve(
    opts: &ConnectOptions,
    deadline: Instant,
    severed: &dyn Fn() -> bool,
) -> Result<Vec<Target>> {
    let config = &opts.config;
    let hosts = config.get_hosts();
    let ports = config.get_ports();
    let hostaddrs = config.get_hostaddrs();
    let mut targets = Vec::new();
    let mut last_err = None;
    for (i, host) in hosts.iter().enumerate() {
        let port = match ports.len() {
            0 => 5432,
            1 => ports[0],
            _ => ports[i],
        };
        match host {
            Host::Unix(dir) => targets.push(Target::Unix {
                path: dir.join(format!(".s.PGSQL.{port}")),
            }),
            Host::Tcp(name) => {
                if let Some(ip) = hostaddrs.get(i) {
                    targets.push(Target::Tcp {
                        addr: SocketAddr::new(*ip, port),
                        host: name.clone(),
                    });
                    continue;
                }
                match lookup(name, port, deadline, severed) {
                    Ok(addrs) => targets.extend(addrs.into_iter().map(|addr| Target::Tcp {
                        addr,
                        host: name.clone(),
                    })),
                    Err(e) => last_err = Some(e),
                }
            }
        }
    }
    if targets.is_empty() {
        return Err(last_err.unwrap_or_else(|| {
            Error::new(
                ErrorKind::Config,
                "database url names no host to connect to",
            )
        }));
    }
    Ok(targets)
}

/// Resolves a host name without blocking past `deadline` (getaddrinfo has no timeout: it runs
/// on a short-lived thread that is left to finish on its own if the deadline passes).
fn lookup(
    name: &str,
    port: u16,
    deadline: Instant,
    severed: &dyn Fn() -> bool,
) -> Result<Vec<SocketAddr>> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = mpsc::channel();
    let owned = name.to_owned();
    thread::Builder::new()
        .name("postpone-dns".into())
        .spawn(move || {
            let _ = tx.send(
                (owned.as_str(), port)
                    .to_socket_addrs()
                    .map(|a| a.collect()),
            );
        })
        .map_err(|e| Error::with_source(ErrorKind::Other, "spawning a dns thread", e))?;
    // Wait in slices, so that a sever of the caller's group ends the wait within 50 ms.
    let got = loop {
        if severed() {
            return Err(Error::new(
                ErrorKind::Shutdown,
                format!("resolving {name}: severed by shutdown"),
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(50))) {
            Ok(r) => break Ok(r),
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => continue,
            Err(_) => break Err(()),
        }
    };
    match got {
        Ok(Ok(addrs)) => {
            let addrs: Vec<SocketAddr> = addrs;
            if addrs.is_empty() {
                Err(Error::new(
                    ErrorKind::Connect,
                    format!("resolving {name}: no addresses"),
                ))
            } else {
                Ok(addrs)
            }
        }
        Ok(Err(e)) => Err(Error::with_source(
            ErrorKind::Connect,
            format!("resolving {name}"),
            e,
        )),
        Err(()) => Err(Error::new(
            ErrorKind::Timeout,
            format!("resolving {name}: no answer within connect_timeout"),
        )),
    }
}

/// Creates the socket for `target`, registers its sever handle, and connects it before
/// `deadline`. The returned registration must live as long as the stream.
pub(crate) fn connect(
    rt: &Runtime,
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
            match rt.block_on(async { tokio::time::timeout(wait, tcp.connect(*addr)).await }) {
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
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
                Err(e) => return Err(fail(e)),
            };
            let std_stream: std::os::unix::net::UnixStream = socket.into();
            let stream = {
                let _enter = rt.enter();
                tokio::net::UnixStream::from_std(std_stream).map_err(fail)?
            };
            if pending {
                let wait = deadline.saturating_duration_since(Instant::now());
                match rt.block_on(async { tokio::time::timeout(wait, stream.writable()).await }) {
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

    #[test]
    fn a_name_lookup_gives_up_when_its_group_is_severed() {
        let far = Instant::now() + Duration::from_secs(30);
        let e = lookup("localhost", 5432, far, &|| true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Shutdown);
        assert!(e.to_string().contains("severed by shutdown"), "{e}");
        let addrs = lookup("localhost", 5432, far, &|| false).unwrap();
        assert!(addrs.iter().all(|a| a.port() == 5432));
        let ip = lookup("127.0.0.1", 1, far, &|| true).unwrap();
        assert_eq!(ip, vec![SocketAddr::from(([127, 0, 0, 1], 1))]);
    }
}
