//! Shared helpers for the integration tests: a fault-injecting TCP proxy, an
//! isolated database per test, temporary clusters of our own (primary and standby), a
//! PgBouncer started on demand, network namespaces, child processes, and a few small
//! utilities.
//!
//! Every integration test file includes this with `mod support;` and uses only
//! part of it, hence the blanket `dead_code` allowance.
#![allow(dead_code)]

pub mod child;
pub mod cluster;
pub mod db;
pub mod netns;
pub mod pgbouncer;
pub mod proxy;
pub mod role;
pub mod standin;

// A test file may use neither re-export.
#[allow(unused_imports)]
pub use child::ChildProc;
#[allow(unused_imports)]
pub use cluster::{skip, Cluster};
#[allow(unused_imports)]
pub use db::*;
#[allow(unused_imports)]
pub use netns::Netns;
#[allow(unused_imports)]
pub use pgbouncer::{PgBouncer, PoolMode};
#[allow(unused_imports)]
pub use proxy::*;
#[allow(unused_imports)]
pub use role::TestRole;
#[allow(unused_imports)]
pub use standin::*;

use std::collections::HashSet;
use std::fs;
use std::thread;
use std::time::{Duration, Instant};

/// Number of entries in `/proc/self/fd` (open file descriptors of this process).
pub fn open_fds() -> usize {
    match fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.count(),
        Err(e) => panic!("cannot read /proc/self/fd: {e}"),
    }
}

/// Polls `cond` every 10 ms until it returns true or `timeout` has elapsed.
/// Returns whether it became true. `cond` is always evaluated at least once,
/// and once more at the deadline.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10).min(deadline - now));
    }
}

/// Routes `log` output to the test harness (idempotent).
pub fn init_logging() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// TCP states as numbered in `/proc/net/tcp`.
pub const TCP_ESTABLISHED: u8 = 0x01;
pub const TCP_CLOSE_WAIT: u8 = 0x08;
pub const TCP_LISTEN: u8 = 0x0A;

/// One row of `/proc/net/tcp` or `/proc/net/tcp6` (this network namespace,
/// every process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    pub local_port: u16,
    pub remote_port: u16,
    /// Kernel TCP state, e.g. [`TCP_ESTABLISHED`].
    pub state: u8,
    /// Socket inode (0 for sockets no longer owned by a descriptor, e.g. TIME_WAIT).
    pub inode: u64,
}

/// All TCP sockets of this network namespace, IPv4 and IPv6.
pub fn tcp_sockets() -> Vec<TcpSocket> {
    let mut out = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        out.extend(text.lines().skip(1).filter_map(parse_tcp_line));
    }
    out
}

fn parse_tcp_line(line: &str) -> Option<TcpSocket> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 10 {
        return None;
    }
    let port = |addr: &str| -> Option<u16> {
        let (_, hex) = addr.rsplit_once(':')?;
        u16::from_str_radix(hex, 16).ok()
    };
    Some(TcpSocket {
        local_port: port(fields[1])?,
        remote_port: port(fields[2])?,
        state: u8::from_str_radix(fields[3], 16).ok()?,
        inode: fields[9].parse().ok()?,
    })
}

/// Inodes of the sockets this process holds a descriptor for.
pub fn own_socket_inodes() -> HashSet<u64> {
    let Ok(dir) = fs::read_dir("/proc/self/fd") else {
        return HashSet::new();
    };
    dir.filter_map(|entry| {
        let target = fs::read_link(entry.ok()?.path()).ok()?;
        let target = target.to_str()?;
        target
            .strip_prefix("socket:[")?
            .strip_suffix(']')?
            .parse()
            .ok()
    })
    .collect()
}

/// The TCP sockets this process holds a descriptor for.
pub fn own_tcp_sockets() -> Vec<TcpSocket> {
    let inodes = own_socket_inodes();
    tcp_sockets()
        .into_iter()
        .filter(|s| s.inode != 0 && inodes.contains(&s.inode))
        .collect()
}

/// Number of this process's threads whose name starts with `prefix` (from
/// `/proc/self/task/*/comm`; the kernel keeps only the first 15 bytes of a
/// thread name, so `prefix` should be no longer than that).
pub fn threads_named(prefix: &str) -> usize {
    let Ok(dir) = fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|entry| fs::read_to_string(entry.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end().starts_with(prefix))
        .count()
}
