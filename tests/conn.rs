//! The connection layer against the real PostgreSQL, through the fault proxy: deadlines on
//! stranded (half-open) links, `sever_all`, the pool with every socket stranded, resets,
//! leaks, the kinds of hosts a connection string can name, and the server-side check interval.
//!
//! Run with `--nocapture` to see the measured times (lines starting with `measured:`).

mod support;

use std::fs;
use std::sync::{mpsc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};

use postpone::{App, ErrorKind};
use support::*;

/// The leak test counts every descriptor of the process, so it runs alone: it takes this lock
/// for writing, every other test of this file for reading.
static FD_ACCOUNTING: RwLock<()> = RwLock::new(());

fn shared_fds() -> RwLockReadGuard<'static, ()> {
    FD_ACCOUNTING.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive_fds() -> RwLockWriteGuard<'static, ()> {
    FD_ACCOUNTING.write().unwrap_or_else(|e| e.into_inner())
}

/// A migrated App through `proxy`, with `io_timeout` and a small pool.
fn app_via(db: &TestDb, proxy: &FaultProxy, io_timeout: Duration, pool_size: u32) -> App {
    let app = App::builder(db.url_via(proxy))
        .pool_size(pool_size)
        .io_timeout(io_timeout)
        .build()
        .expect("build the app");
    app.migrate().expect("migrate");
    app
}

fn backend_pid(conn: &mut postpone::Connection) -> i32 {
    conn.query_one("SELECT pg_backend_pid()", &[])
        .expect("SELECT pg_backend_pid()")
        .get(0)
}

/// Bytes that arrived at the proxy from its clients and sit unread in its sockets: a query
/// (or a startup message) written into a stranded link lands here, so a positive count proves
/// that the caller has sent its request and is now waiting for an answer that never comes.
fn unread_at_proxy(proxy: &FaultProxy) -> u64 {
    let mut total = 0;
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 5 || f[3] != "01" {
                continue; // only established sockets (a listener's rx_queue is its backlog)
            }
            let local_port = f[1]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port != Some(proxy.port()) {
                continue;
            }
            if let Some((_, rx)) = f[4].split_once(':') {
                total += u64::from_str_radix(rx, 16).unwrap_or(0);
            }
        }
    }
    total
}

/// True when the thread named `name` (at most 15 bytes) is blocked in `epoll_wait`: a
/// connection's runtime waiting for its socket. (Linux, x86_64 and aarch64 numbering.)
fn thread_blocked_in_epoll(name: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    const EPOLL: &[i64] = &[232, 281, 441]; // epoll_wait, epoll_pwait, epoll_pwait2
    #[cfg(not(target_arch = "x86_64"))]
    const EPOLL: &[i64] = &[22, 441]; // epoll_pwait, epoll_pwait2
    let Ok(dir) = fs::read_dir("/proc/self/task") else {
        return false;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let comm = fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let syscall = fs::read_to_string(path.join("syscall")).unwrap_or_default();
        let nr = syscall
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<i64>().ok());
        return nr.is_some_and(|n| EPOLL.contains(&n));
    }
    false
}

/// TCP sockets of this process connected to the proxy's port (the library's client ends).
fn client_sockets_to(proxy: &FaultProxy) -> usize {
    own_tcp_sockets()
        .iter()
        .filter(|s| s.remote_port == proxy.port() && s.state == TCP_ESTABLISHED)
        .count()
}

#[test]
fn stranded_query_times_out_within_io_timeout_and_the_connection_is_never_reused() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = app_via(&db, &proxy, Duration::from_secs(1), 2);
    let mut conn = app.connection().unwrap();
    let old_pid = backend_pid(&mut conn);
    assert!(!conn.is_broken());

    proxy.strand_all();
    let started = Instant::now();
    let err = conn.query_one("SELECT 1", &[]).unwrap_err();
    let took = started.elapsed();
    eprintln!(
        "measured: stranded query -> {:?} error after {took:?} (io_timeout 1s)",
        err.kind()
    );
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.is_timeout() && err.is_connection_lost());
    assert!(
        took >= Duration::from_millis(900),
        "returned before the deadline: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let text = err.to_string();
    assert!(
        text.contains("io_timeout"),
        "the message names the deadline: {text}"
    );
    assert!(
        text.contains("1s"),
        "the message gives the deadline's value: {text}"
    );

    // Broken for good: the next call fails at once, without touching the network.
    assert!(conn.is_broken());
    let started = Instant::now();
    let again = conn.execute("SELECT 1", &[]).unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(again.kind(), ErrorKind::Closed, "{again}");
    assert!(again.to_string().contains("unusable"), "{again}");
    assert!(conn.ping(Duration::from_secs(5)).is_err());

    // Returned to the pool, it is discarded: the next checkout is a new connection (a new
    // socket through the proxy, a new backend), and it works.
    let accepted = proxy.accepted();
    drop(conn);
    let mut fresh = app.connection().unwrap();
    assert_ne!(backend_pid(&mut fresh), old_pid);
    assert!(proxy.accepted() > accepted, "no new socket was opened");
    assert_eq!(
        app.open_sockets(),
        1,
        "the broken socket is still registered"
    );
}

#[test]
fn sever_all_unblocks_a_stranded_query() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    // io_timeout 30 s: only the sever can end the query within the test's bounds.
    let app = app_via(&db, &proxy, Duration::from_secs(30), 2);
    let mut conn = app.connection().unwrap();
    conn.query_one("SELECT 1", &[]).unwrap();
    proxy.strand_all();
    assert_eq!(unread_at_proxy(&proxy), 0);

    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let res = conn.query_one("SELECT 1", &[]).map(|_| ());
        let broken = conn.is_broken();
        let _ = tx.send((res, broken, Instant::now()));
    });
    assert!(
        wait_until(Duration::from_secs(5), || unread_at_proxy(&proxy) > 0),
        "the query never reached the stranded link"
    );
    let severed_at = Instant::now();
    let n = app.sever_all();
    let (res, broken, returned_at) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the stranded query did not return after sever_all");
    let took = returned_at.duration_since(severed_at);
    eprintln!(
        "measured: sever_all -> stranded query returned after {took:?} ({n} socket(s) severed)"
    );
    worker.join().unwrap();
    let err = res.expect_err("a stranded query cannot succeed");
    assert!(n >= 1);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(broken, "a severed connection must be marked broken");
    assert_ne!(
        err.kind(),
        ErrorKind::Timeout,
        "the deadline fired, not the sever: {err}"
    );
    assert!(
        err.is_connection_lost() || err.kind() == ErrorKind::Shutdown,
        "{err}"
    );
    assert!(
        err.to_string().contains("sever"),
        "the message says why: {err}"
    );
}

#[test]
fn sever_all_unblocks_a_stranded_notification_wait() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = app_via(&db, &proxy, Duration::from_secs(30), 2);
    let mut conn = app.connection().unwrap();
    conn.listen("x").unwrap();
    proxy.strand_all();

    let (tx, rx) = mpsc::channel();
    let worker = thread::Builder::new()
        .name("t-sever-notify".into())
        .spawn(move || {
            let res = conn.wait_notification(Duration::from_secs(30));
            let broken = conn.is_broken();
            let _ = tx.send((res, broken, Instant::now()));
        })
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || thread_blocked_in_epoll(
            "t-sever-notify"
        )),
        "the notification wait never blocked"
    );
    let severed_at = Instant::now();
    let n = app.sever_all();
    let (res, broken, returned_at) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the stranded notification wait did not return after sever_all");
    let took = returned_at.duration_since(severed_at);
    eprintln!("measured: sever_all -> stranded notification wait returned after {took:?}");
    worker.join().unwrap();
    assert!(n >= 1);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let err = res.expect_err("a severed notification wait must be an error, not Ok(None)");
    assert!(broken);
    assert!(err.to_string().contains("sever"), "{err}");
}

#[test]
fn sever_all_unblocks_a_stranded_connect() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    proxy.set_new_conns(NewConns::Strand);
    // connect_timeout 30 s (so pool_timeout 31 s): only the sever can end the checkout.
    let app = App::builder(db.url_via(&proxy))
        .pool_size(2)
        .connect_timeout(Duration::from_secs(30))
        .lazy(true)
        .build()
        .unwrap();
    assert_eq!(proxy.accepted(), 0, "a lazy App connects on first use");

    let (tx, rx) = mpsc::channel();
    let checker = app.clone();
    let worker = thread::spawn(move || {
        let res = checker.connection().map(|_| ());
        let _ = tx.send((res, Instant::now()));
    });
    // The startup message sits unread at the proxy: the handshake is waiting for an answer.
    assert!(
        wait_until(Duration::from_secs(5), || unread_at_proxy(&proxy) > 0),
        "the connect never reached the stranded proxy"
    );
    let severed_at = Instant::now();
    let n = app.sever_all();
    let res = rx.recv_timeout(Duration::from_secs(5));
    let took = severed_at.elapsed();
    eprintln!("measured: sever_all -> stranded connect (pool checkout) returned after {took:?} ({n} socket(s) severed)");
    let (res, returned_at) = res.expect("the stranded connect did not return after sever_all");
    worker.join().unwrap();
    let took = returned_at.duration_since(severed_at);
    assert!(n >= 1);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let err = res.expect_err("a stranded connect cannot succeed");
    assert!(err.to_string().contains("sever"), "{err}");
}

#[test]
fn stranded_connect_at_build_names_connect_timeout() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    proxy.set_new_conns(NewConns::Strand);
    let started = Instant::now();
    let err = App::builder(db.url_via(&proxy))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap_err();
    let took = started.elapsed();
    eprintln!(
        "measured: stranded startup handshake -> {:?} error after {took:?} (connect_timeout 1s)",
        err.kind()
    );
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let text = err.to_string();
    assert!(text.contains("connect_timeout"), "{text}");
    assert!(
        text.contains(&proxy.port().to_string()),
        "the message names the server: {text}"
    );
}

#[test]
fn exhausted_pool_names_pool_timeout() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::builder(db.url())
        .pool_size(1)
        .pool_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    app.migrate().unwrap();
    let held = app.connection().unwrap();
    let started = Instant::now();
    let err = app.connection().unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("pool_timeout"), "{err}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(2),
        "{took:?}"
    );
    drop(held);
    app.connection().unwrap();
}

/// A migrated database, a proxy in front of it, and an App through the proxy with a pool of
/// three, `io_timeout` 1 s and the given `pool_timeout`.
fn pool_of_three_via_proxy(pool_timeout: Duration) -> (TestDb, FaultProxy, App) {
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = App::builder(db.url_via(&proxy))
        .pool_size(3)
        .io_timeout(Duration::from_secs(1))
        .pool_timeout(pool_timeout)
        .build()
        .unwrap();
    app.migrate().unwrap();
    (db, proxy, app)
}

#[test]
fn pool_checkout_is_bounded_when_every_pooled_socket_is_stranded() {
    let _shared = shared_fds();
    let pool_timeout = Duration::from_secs(5);
    let (_db, proxy, app) = pool_of_three_via_proxy(pool_timeout);
    // Fill the pool: three connections at once, then give them back.
    let mut conns: Vec<_> = (0..3).map(|_| app.connection().unwrap()).collect();
    let old_pids: Vec<i32> = conns.iter_mut().map(|c| backend_pid(c)).collect();
    drop(conns);
    assert_eq!(app.open_sockets(), 3);

    proxy.strand_all();
    // A connection used within the last second is handed out without a ping (by design);
    // let that pass so that the checkout has to find out that every idle socket is dead.
    thread::sleep(Duration::from_millis(1100));
    let started = Instant::now();
    let res = app.connection();
    let took = started.elapsed();
    eprintln!(
        "measured: pool checkout with 3 stranded pooled sockets -> {} after {took:?} (pool_timeout {pool_timeout:?}, io_timeout 1s)",
        match &res {
            Ok(_) => "fresh connection".to_owned(),
            Err(e) => format!("{:?} error", e.kind()),
        }
    );
    assert!(
        took < pool_timeout + Duration::from_secs(1),
        "took {took:?}"
    );
    // Half-open sockets come in groups: after the first ping runs out its 1 s, the other
    // idle connections (idle since before it) are discarded without pings of their own.
    assert!(
        took < Duration::from_millis(2500),
        "one ping deadline, not one per stranded socket: took {took:?}"
    );
    match res {
        Ok(mut conn) => {
            let pid = backend_pid(&mut conn);
            assert!(
                !old_pids.contains(&pid),
                "a stranded connection was handed out"
            );
        }
        Err(e) => assert!(e.is_timeout() || e.is_connection_lost(), "{e}"),
    }
    // The stranded ones were discarded and their sockets closed, not kept in the pool.
    assert!(
        wait_until(Duration::from_secs(2), || proxy.peer_closed_stranded() == 3),
        "stranded sockets closed by the library: {}",
        proxy.peer_closed_stranded()
    );
    assert_eq!(
        app.open_sockets(),
        client_sockets_to(&proxy),
        "registered vs open sockets"
    );
}

#[test]
fn pool_checkout_with_a_short_pool_timeout_fails_in_time_when_every_socket_is_stranded() {
    let _shared = shared_fds();
    let pool_timeout = Duration::from_millis(1500);
    let (_db, proxy, app) = pool_of_three_via_proxy(pool_timeout);
    let conns: Vec<_> = (0..3).map(|_| app.connection().unwrap()).collect();
    drop(conns);
    proxy.strand_all();
    // New connections hang too: nothing can be had within pool_timeout.
    proxy.set_new_conns(NewConns::Strand);
    thread::sleep(Duration::from_millis(1100)); // past the no-ping window, as above
    let started = Instant::now();
    let res = app.connection();
    let took = started.elapsed();
    eprintln!(
        "measured: pool checkout, every pooled and every new socket stranded -> {:?} after {took:?} (pool_timeout {pool_timeout:?})",
        res.as_ref().map(|_| ()).map_err(|e| e.kind())
    );
    let err = res.expect_err("no connection can be had");
    assert!(
        took < pool_timeout + Duration::from_secs(1),
        "took {took:?}"
    );
    assert!(err.is_timeout() || err.is_connection_lost(), "{err}");
    assert!(err.to_string().contains("pool_timeout"), "{err}");
}

#[test]
fn reset_gives_a_connection_lost_error_quickly_and_the_next_checkout_works() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = app_via(&db, &proxy, Duration::from_secs(5), 2);
    let mut conn = app.connection().unwrap();
    let old_pid = backend_pid(&mut conn);

    proxy.reset_all();
    let started = Instant::now();
    let err = conn.query_one("SELECT 1", &[]).unwrap_err();
    let took = started.elapsed();
    eprintln!(
        "measured: reset link -> {:?} error after {took:?}",
        err.kind()
    );
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert!(err.is_connection_lost());
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(conn.is_broken());
    drop(conn);

    let mut fresh = app.connection().unwrap();
    assert_ne!(backend_pid(&mut fresh), old_pid);
}

#[test]
fn reset_idle_pooled_connections_are_not_handed_out() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = app_via(&db, &proxy, Duration::from_secs(5), 2);
    let mut conns: Vec<_> = (0..2).map(|_| app.connection().unwrap()).collect();
    let old_pids: Vec<i32> = conns.iter_mut().map(|c| backend_pid(c)).collect();
    drop(conns);
    proxy.reset_all();
    // At once (well within the pool's no-ping window): the checkout must still not hand out
    // a socket the peer has reset.
    let started = Instant::now();
    let mut conn = app.connection().unwrap();
    let res = conn.query_one("SELECT pg_backend_pid()", &[]);
    eprintln!(
        "measured: checkout + query after a reset of every idle socket took {:?}",
        started.elapsed()
    );
    let pid: i32 = res
        .expect("the checkout handed out a reset connection")
        .get(0);
    assert!(!old_pids.contains(&pid));
}

#[test]
fn dropping_a_connection_on_a_stranded_link_returns_at_once() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = app_via(&db, &proxy, Duration::from_millis(500), 3);
    let mut timed_out = app.connection().unwrap();
    let mut unnoticed = app.connection().unwrap();
    timed_out.query_one("SELECT 1", &[]).unwrap();
    unnoticed.query_one("SELECT 1", &[]).unwrap();
    // The connection the App's build opened to check the server is closed; on a loaded
    // machine the proxy may not have seen it go yet, and would strand it too.
    assert!(
        wait_until(Duration::from_secs(5), || proxy.live_connections() == 2),
        "connections through the proxy: {}",
        proxy.live_connections()
    );
    proxy.strand_all();
    // One gave up on a reply that never came; the other has not noticed anything yet.
    assert!(timed_out
        .query_one("SELECT 1", &[])
        .unwrap_err()
        .is_timeout());

    let started = Instant::now();
    drop(timed_out);
    let t1 = started.elapsed();
    let started = Instant::now();
    drop(unnoticed); // back into the pool
    let t2 = started.elapsed();
    let started = Instant::now();
    drop(app); // drops the pooled stranded connection
    let t3 = started.elapsed();
    eprintln!("measured: drop of a timed-out connection {t1:?}, of an unnoticed stranded one {t2:?}, of the App {t3:?}");
    for t in [t1, t2, t3] {
        assert!(t < Duration::from_millis(100), "drop took {t:?}");
    }
    // The library closed its ends: the proxy sees both stranded peers gone.
    assert!(
        wait_until(Duration::from_secs(2), || proxy.peer_closed_stranded() == 2),
        "stranded peers closed: {}",
        proxy.peer_closed_stranded()
    );
}

#[test]
fn nothing_leaks() {
    let _exclusive = exclusive_fds();
    init_logging();
    let db = TestDb::new();
    db.backend_pids(); // opens the admin connection now, so it is part of the baseline
    let baseline_fds = open_fds();
    let proxy = FaultProxy::start(&db.server_addr());
    {
        let app = app_via(&db, &proxy, Duration::from_secs(1), 3);
        let mut a = app.connection().unwrap();
        let mut b = app.connection().unwrap();
        let mut c = app.connection().unwrap();
        a.query_one("SELECT 1", &[]).unwrap();
        b.listen("x").unwrap();
        c.query_one("SELECT 1", &[]).unwrap();
        assert_eq!(app.open_sockets(), 3);
        assert_eq!(client_sockets_to(&proxy), 3);

        proxy.strand_all();
        assert!(a.query_one("SELECT 1", &[]).unwrap_err().is_timeout());
        // A notification wait severed from another thread.
        let waiter = thread::Builder::new()
            .name("t-leak-notify".into())
            .spawn(move || {
                let res = b.wait_notification(Duration::from_secs(30));
                (b, res)
            })
            .unwrap();
        assert!(wait_until(Duration::from_secs(5), || {
            thread_blocked_in_epoll("t-leak-notify")
        }));
        assert!(app.sever_all() >= 1);
        let (b, res) = waiter.join().unwrap();
        assert!(res.is_err());
        drop((a, b, c));
        // New connections after a reset.
        let mut d = app.connection().unwrap();
        d.query_one("SELECT 1", &[]).unwrap();
        proxy.reset_all();
        assert!(d.query_one("SELECT 1", &[]).is_err());
        drop(d);
        let mut e = app.connection().unwrap();
        e.query_one("SELECT 1", &[]).unwrap();
        drop(e);

        // The watchdog's registry matches the sockets that exist.
        assert!(
            wait_until(Duration::from_secs(2), || app.open_sockets()
                == client_sockets_to(&proxy)),
            "registered {} vs open {}",
            app.open_sockets(),
            client_sockets_to(&proxy)
        );
        assert_eq!(
            app.open_sockets(),
            1,
            "only the last, healthy connection is kept"
        );
    }
    assert!(
        wait_until(Duration::from_secs(5), || client_sockets_to(&proxy) == 0),
        "client sockets left open: {}",
        client_sockets_to(&proxy)
    );
    assert!(
        wait_until(Duration::from_secs(5), || threads_named("postpone-watchd")
            == 0),
        "watchdog threads left: {}",
        threads_named("postpone-watchd")
    );
    drop(proxy);
    let ok = wait_until(Duration::from_secs(5), || open_fds() <= baseline_fds);
    eprintln!(
        "measured: open fds before {baseline_fds}, after {}",
        open_fds()
    );
    assert!(ok, "fds: before {baseline_fds}, after {}", open_fds());
}

#[test]
fn unix_socket_host_works() {
    let _shared = shared_fds();
    // The test server's socket (the port of env DATABASE_URL, 5432 by default).
    let server = ServerSpec::from_env();
    let Some(dir) = server.socket_dir() else {
        eprintln!(
            "skipped: no socket of the test server's port {} in /var/run/postgresql or /tmp",
            server.port
        );
        return;
    };
    init_logging();
    let db = TestDb::new();
    let app = App::builder(format!(
        "host={dir} port={} user={} dbname={}",
        server.port,
        server.user,
        db.name()
    ))
    .pool_size(1)
    .build()
    .unwrap();
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    assert!(conn.peer().contains(dir), "peer {}", conn.peer());
    let row = conn
        .query_one("SELECT inet_client_addr() IS NULL, current_database()", &[])
        .unwrap();
    assert!(
        row.get::<_, bool>(0),
        "a Unix-socket session has no client address"
    );
    assert_eq!(row.get::<_, String>(1), db.name());
}

#[test]
fn multi_host_string_tries_the_next_host_when_the_first_refuses() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let started = Instant::now();
    let app = App::builder(format!(
        "host=127.0.0.1,127.0.0.1 port=1,{} user=postgres dbname={}",
        db.server().port,
        db.name()
    ))
    .pool_size(1)
    .build()
    .unwrap();
    eprintln!(
        "measured: multi-host connect (first refuses) took {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    let port: i32 = conn
        .query_one("SELECT inet_server_port()", &[])
        .unwrap()
        .get(0);
    assert_eq!(port, i32::from(db.server().port));
    assert!(
        conn.peer().ends_with(&format!(":{}", db.server().port)),
        "{}",
        conn.peer()
    );
}

#[test]
fn dns_name_localhost_works() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::builder(format!(
        "postgres://{}@localhost:{}/{}",
        db.server().user,
        db.server().port,
        db.name()
    ))
    .pool_size(1)
    .build()
    .unwrap();
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    assert_eq!(conn.query_one("SELECT 1", &[]).unwrap().get::<_, i32>(0), 1);
    assert!(conn.peer().starts_with("localhost"), "{}", conn.peer());
}

#[test]
fn client_connection_check_interval_is_set_on_our_sessions() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let mut plain = db.client();
    let server_version: i32 = plain
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .unwrap()
        .get(0);
    if server_version < 140000 {
        eprintln!("skipped: server {server_version} has no client_connection_check_interval");
        return;
    }
    let unset: String = plain
        .query_one("SHOW client_connection_check_interval", &[])
        .unwrap()
        .get(0);
    assert_eq!(unset, "0", "a plain session does not have it");

    for (io_timeout, expected) in [(None, "10s"), (Some(Duration::from_secs(2)), "2s")] {
        let mut builder = App::builder(db.url()).pool_size(1);
        if let Some(t) = io_timeout {
            builder = builder.io_timeout(t);
        }
        let app = builder.build().unwrap();
        app.migrate().unwrap();
        let mut conn = app.connection().unwrap();
        let value: String = conn
            .query_one("SHOW client_connection_check_interval", &[])
            .unwrap()
            .get(0);
        assert_eq!(value, expected, "io_timeout {io_timeout:?}");
    }
}

/// What the backend `pid` is doing, from `pg_stat_activity` (None once the session is gone).
fn backend_state(db: &TestDb, pid: i32) -> Option<(String, String)> {
    db.client()
        .query_opt(
            "SELECT coalesce(state, ''), query FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .expect("reading pg_stat_activity")
        .map(|r| (r.get(0), r.get(1)))
}

#[test]
fn a_statement_that_times_out_on_a_half_open_link_is_cancelled_on_the_server() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = app_via(&db, &proxy, Duration::from_secs(2), 2);
    let mut conn = app.connection().unwrap();
    let pid = backend_pid(&mut conn);
    let runner = thread::spawn(move || {
        let started = Instant::now();
        let res = conn.query("SELECT pg_sleep(60)", &[]).map(|_| ());
        (res, started.elapsed())
    });
    // The statement reaches the server, then the link goes half-open under it.
    assert!(
        wait_until(Duration::from_secs(5), || backend_state(&db, pid)
            .is_some_and(
                |(state, q)| state == "active" && q.contains("pg_sleep")
            )),
        "the statement never started on the server"
    );
    proxy.strand_all();
    let (res, took) = runner.join().unwrap();
    let err = res.expect_err("a stranded statement cannot succeed");
    assert!(err.is_timeout(), "{err}");
    eprintln!("measured: timed-out statement returned after {took:?} (io_timeout 2s)");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    // The server stopped running it: the CancelRequest arrived on a fresh socket.
    let started = Instant::now();
    let stopped = wait_until(Duration::from_secs(5), || {
        backend_state(&db, pid).is_none_or(|(state, _)| state != "active")
    });
    eprintln!(
        "measured: backend {pid} after the timeout: {:?} ({:?} later)",
        backend_state(&db, pid),
        started.elapsed()
    );
    assert!(
        stopped,
        "the timed-out statement is still running on the server"
    );
    // The cancel's own socket was closed: only the proxy's stranded links remain registered.
    assert!(
        wait_until(Duration::from_secs(2), || app.open_sockets() == 0),
        "sockets left registered: {}",
        app.open_sockets()
    );
}

/// A login role limited to one connection, dropped (with its sessions) at the end.
struct LimitedRole {
    name: String,
    admin: postgres::Client,
}

impl LimitedRole {
    fn new(db: &TestDb) -> LimitedRole {
        let name = format!("{}_lim", db.name());
        let mut admin = db.client();
        admin
            .batch_execute(&format!(
                "CREATE ROLE \"{name}\" LOGIN CONNECTION LIMIT 1; \
                 GRANT ALL ON DATABASE \"{}\" TO \"{name}\"",
                db.name()
            ))
            .expect("create a limited role");
        LimitedRole { name, admin }
    }

    fn url_at(&self, db: &TestDb, host_port: &str) -> String {
        format!("postgres://{}@{host_port}/{}", self.name, db.name())
    }
}

impl Drop for LimitedRole {
    fn drop(&mut self) {
        let _ = self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&self.name],
        );
        for _ in 0..50 {
            if self
                .admin
                .batch_execute(&format!("DROP ROLE IF EXISTS \"{}\"", self.name))
                .is_ok()
            {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_failed_checkout_leaves_no_connect_attempts_behind() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let role = LimitedRole::new(&db);
    // The role's one connection is taken: every connect of the App is refused.
    let holder = postgres::Client::connect(&role.url_at(&db, &db.server_addr()), postgres::NoTls)
        .expect("the role's one connection");
    let proxy = FaultProxy::start(&db.server_addr());
    let app = App::builder(role.url_at(&db, &format!("127.0.0.1:{}", proxy.port())))
        .pool_size(3)
        .pool_timeout(Duration::from_secs(1))
        .lazy(true)
        .build()
        .unwrap();
    let started = Instant::now();
    let err = app
        .connection()
        .expect_err("the role has no connection left");
    let took = started.elapsed();
    let at_return = proxy.accepted();
    eprintln!(
        "measured: failed checkout after {took:?} with {at_return} connect attempt(s): {err}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(err.to_string().contains("too many connections"), "{err}");
    // Nobody waits any more: nothing may go on connecting.
    thread::sleep(Duration::from_secs(3));
    let later = proxy.accepted();
    eprintln!(
        "measured: connect attempts in the 3s after the checkout returned: {}",
        later - at_return
    );
    assert_eq!(later, at_return, "connect attempts went on with no caller");
    // Once the server has room, the next checkout connects.
    drop(holder);
    assert!(
        wait_until(Duration::from_secs(5), || app.schema_version().is_ok()),
        "no connection once the role had room again"
    );
    drop(app);
    drop(role);
}

#[test]
fn a_slow_but_healthy_server_keeps_its_pooled_connections() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = App::builder(db.url_via(&proxy))
        .pool_size(2)
        .io_timeout(Duration::from_secs(6))
        .pool_timeout(Duration::from_secs(8))
        .build()
        .unwrap();
    app.migrate().unwrap();
    let mut conns: Vec<_> = (0..2).map(|_| app.connection().unwrap()).collect();
    let pids: Vec<i32> = conns.iter_mut().map(|c| backend_pid(c)).collect();
    drop(conns);
    let accepted = proxy.accepted();
    // Past the no-ping window, then every round-trip costs about 1.2 s: slow, not dead.
    thread::sleep(Duration::from_millis(1100));
    proxy.set_delay(Duration::from_millis(600));
    let started = Instant::now();
    let mut conn = app.connection().expect("a checkout on a slow server");
    let took = started.elapsed();
    proxy.set_delay(Duration::ZERO);
    let pid = backend_pid(&mut conn);
    eprintln!("measured: checkout with a 1.2s ping round-trip took {took:?}");
    assert!(
        pids.contains(&pid),
        "the pooled connections were dropped as dead: new backend {pid}, old {pids:?}"
    );
    assert_eq!(proxy.accepted(), accepted, "a new connection was opened");
    drop(conn);
    let mut other = app.connection().unwrap();
    assert!(
        pids.contains(&backend_pid(&mut other)),
        "the other idle one was dropped"
    );
}

#[test]
fn a_checkout_ping_cut_short_by_the_checkout_deadline_condemns_nothing() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let app = App::builder(db.url_via(&proxy))
        .pool_size(1)
        .io_timeout(Duration::from_secs(2))
        .pool_timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    app.migrate().unwrap();
    let mut held = app.connection().unwrap();
    let pid = backend_pid(&mut held);
    // Another caller waits for the one connection; it comes back with 0.4 s of that wait
    // left, on a link where a round-trip takes 1.2 s.
    let waiter = {
        let app = app.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let res = app.connection().map(|_| ());
            (res, started.elapsed())
        })
    };
    thread::sleep(Duration::from_millis(1100));
    proxy.set_delay(Duration::from_millis(600));
    drop(held);
    let (res, took) = waiter.join().unwrap();
    eprintln!(
        "measured: the waiting checkout returned {:?} after {took:?}",
        res.as_ref().map_err(|e| e.to_string())
    );
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    proxy.set_delay(Duration::ZERO);
    // Past that ping's whole io_timeout: its answer came long ago (after 1.2 s) and waits
    // in the socket, so the link is judged afresh, not condemned for the old ping.
    thread::sleep(Duration::from_millis(2500));
    // The connection was not severed for a ping that had too little time.
    let mut conn = app
        .connection()
        .expect("the pooled connection is still there");
    assert_eq!(
        backend_pid(&mut conn),
        pid,
        "a healthy connection was discarded"
    );
}

/// A `ToSql` whose encoding panics: user code running inside a round-trip.
#[derive(Debug)]
struct Explodes;

impl postgres::types::ToSql for Explodes {
    fn to_sql(
        &self,
        _: &postgres::types::Type,
        _: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        panic!("a user's ToSql panicked")
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

#[test]
fn a_panic_inside_a_round_trip_does_not_return_the_connection_as_healthy() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::builder(db.url()).pool_size(1).build().unwrap();
    app.migrate().unwrap();
    // Several rounds: before the fix, whether the driver noticed was a matter of timing.
    let mut next = app.connection().unwrap();
    for round in 0..5 {
        let mut conn = next;
        let pid = backend_pid(&mut conn);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = conn.query("SELECT $1::int", &[&Explodes]);
        }));
        assert!(panicked.is_err(), "the ToSql did not panic");
        assert!(
            conn.is_broken(),
            "round {round}: a connection a panic went through is not broken"
        );
        drop(conn);
        // The pool discarded it: the next user gets a working connection, a new session.
        next = app.connection().unwrap();
        let row = next
            .query_one("SELECT 41 + 1", &[])
            .unwrap_or_else(|e| panic!("round {round}: the next user's query: {e}"));
        assert_eq!(row.get::<_, i32>(0), 42);
        assert_ne!(backend_pid(&mut next), pid);
    }

    // A connection dropped by a panicking thread is not pooled either.
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _held = next;
        panic!("task code panicked while holding a connection");
    }));
    assert!(unwound.is_err());
    let mut third = app.connection().unwrap();
    third.query_one("SELECT 1", &[]).unwrap();
}

#[test]
fn dropped_prepared_statements_are_prepared_again() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::builder(db.url()).pool_size(1).build().unwrap();
    app.migrate().unwrap();
    app.defer("t", &serde_json::json!({"n": 0})).unwrap();
    for (i, sql) in ["DEALLOCATE ALL", "DISCARD ALL"].into_iter().enumerate() {
        let mut conn = app.connection().unwrap();
        let pid = backend_pid(&mut conn);
        conn.batch_execute(sql).unwrap();
        drop(conn);
        // The same session (pool of one), whose cached statements are gone.
        app.defer("t", &serde_json::json!({"n": i + 1}))
            .unwrap_or_else(|e| panic!("defer after {sql}: {e}"));
        let mut conn = app.connection().unwrap();
        assert_eq!(backend_pid(&mut conn), pid, "not the same session");
    }
    let n: i64 = db
        .client()
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 3);
}

#[test]
fn huge_timeouts_mean_very_long_and_never_panic() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::builder(db.url())
        .pool_size(2)
        .io_timeout(Duration::MAX)
        .connect_timeout(Duration::MAX)
        .pool_timeout(Duration::MAX)
        .tcp_user_timeout(Duration::MAX)
        .build()
        .expect("an App with huge timeouts");
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    conn.set_io_timeout(Duration::MAX);
    conn.query_one("SELECT 1", &[]).unwrap();
    conn.ping(Duration::MAX).unwrap();
    assert_eq!(conn.wait_notification(Duration::ZERO).unwrap(), None);
    conn.listen("huge").unwrap();
    conn.batch_execute("NOTIFY huge, 'x'").unwrap();
    let n = conn.wait_notification(Duration::MAX).unwrap();
    assert_eq!(n.map(|n| n.payload), Some("x".to_owned()));
    drop(conn);
    // A pooled connection idle past the no-ping window is pinged under the huge io_timeout.
    thread::sleep(Duration::from_millis(1100));
    app.connection()
        .unwrap()
        .query_one("SELECT 1", &[])
        .unwrap();
    let url = format!("{}?connect_timeout=4294967295", db.url());
    let other = App::builder(url)
        .pool_size(1)
        .build()
        .expect("a huge connect_timeout in the URL");
    other.migrate().unwrap();
    // A worker over it, shut down with a huge timeout.
    let mut tasks = postpone::Tasks::new();
    tasks.register("t", |_: &postpone::Job| Ok(()));
    let handle = postpone::Worker::builder(&app, tasks).spawn().unwrap();
    let report = handle.shutdown(Duration::MAX);
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn a_transaction_rolls_back_unless_committed() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::builder(db.url()).pool_size(1).build().unwrap();
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    conn.batch_execute("CREATE TABLE t (n int)").unwrap();
    let count = |conn: &mut postpone::Connection| -> i64 {
        conn.query_one("SELECT count(*) FROM t", &[])
            .unwrap()
            .get(0)
    };

    // Dropped without commit (an early return): rolled back.
    let early = |conn: &mut postpone::Connection| -> postpone::Result<()> {
        let mut tx = conn.transaction()?;
        tx.execute("INSERT INTO t VALUES (1)", &[])?;
        assert!(tx.in_transaction());
        tx.execute("SELECT 1/0", &[])?; // fails: `?` returns, tx drops
        tx.commit()
    };
    assert!(early(&mut conn).is_err());
    assert!(!conn.in_transaction());
    assert_eq!(count(&mut conn), 0);

    // Committed.
    let mut tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
    tx.commit().unwrap();
    assert_eq!(count(&mut conn), 1);

    // Rolled back explicitly.
    let mut tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO t VALUES (3)", &[]).unwrap();
    tx.rollback().unwrap();
    assert_eq!(count(&mut conn), 1);
    assert!(!conn.is_broken());

    // The connection goes back to the pool healthy, on the same session.
    let pid = backend_pid(&mut conn);
    drop(conn);
    let mut again = app.connection().unwrap();
    assert_eq!(backend_pid(&mut again), pid);
}

#[test]
fn hostaddr_without_host_connects() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::builder(format!(
        "hostaddr=127.0.0.1 port={} user={} dbname={}",
        db.server().port,
        db.server().user,
        db.name()
    ))
    .pool_size(1)
    .build()
    .expect("hostaddr alone names the server, as in libpq");
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    assert_eq!(conn.query_one("SELECT 1", &[]).unwrap().get::<_, i32>(0), 1);
    assert!(conn.peer().starts_with("127.0.0.1"), "{}", conn.peer());
}

#[test]
fn an_old_pgbouncer_refusing_the_options_parameter_is_connected_through() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let bouncer = PgBouncerStandIn::start(&db.server_addr());
    let url = db
        .server()
        .url_at(&format!("127.0.0.1:{}", bouncer.port()), db.name());
    let app = App::builder(url)
        .pool_size(2)
        .build()
        .expect("connecting through a pooler that refuses `options`");
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    assert_eq!(conn.query_one("SELECT 1", &[]).unwrap().get::<_, i32>(0), 1);
    assert!(
        bouncer.refused() >= 1,
        "the stand-in was never asked with options"
    );
    assert!(bouncer.relayed() >= 1);
    let asked = bouncer.refused();
    // Later connections to that host do not ask again.
    let _second = app.connection().unwrap();
    drop(conn);
    app.sever_all();
    let mut third = app.connection().unwrap();
    third.query_one("SELECT 1", &[]).unwrap();
    assert_eq!(bouncer.refused(), asked, "asked again with options");
}

#[test]
fn one_host_refusing_the_check_interval_does_not_turn_it_off_for_the_others() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let bouncer = PgBouncerStandIn::start(&db.server_addr());
    let app = App::builder(format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user={} dbname={}",
        bouncer.port(),
        db.server().port,
        db.server().user,
        db.name()
    ))
    .pool_size(1)
    .build()
    .unwrap();
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    let through_bouncer: String = conn
        .query_one("SHOW client_connection_check_interval", &[])
        .unwrap()
        .get(0);
    assert_eq!(through_bouncer, "0");
    drop(conn);
    // The pooler goes away: the next connection goes to the second host, which accepts the
    // setting and must get it.
    drop(bouncer);
    app.sever_all();
    let mut conn = app.connection().unwrap();
    assert!(
        conn.peer().ends_with(&format!(":{}", db.server().port)),
        "{}",
        conn.peer()
    );
    let direct: String = conn
        .query_one("SHOW client_connection_check_interval", &[])
        .unwrap()
        .get(0);
    assert_eq!(direct, "10s", "the second host lost the check interval");
}

#[test]
fn a_reply_out_of_step_breaks_the_connection() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let standin = PgBouncerStandIn::start(&db.server_addr());
    let url = db
        .server()
        .url_at(&format!("127.0.0.1:{}", standin.port()), db.name());
    let app = App::builder(url).pool_size(1).build().unwrap();
    app.migrate().unwrap();
    let mut conn = app.connection().unwrap();
    let pid = backend_pid(&mut conn);
    // A simple query waits for every reply before it (the unprepared statement's Close), so
    // that the stray reply lands on the query below, not on a request nobody awaits.
    conn.batch_execute("SELECT 1").unwrap();
    standin.garble_on("out_of_step");
    let err = conn
        .query("SELECT 'out_of_step'", &[])
        .expect_err("a reply out of step cannot give rows");
    eprintln!("measured: reply out of step: {err}");
    assert!(conn.is_broken(), "still in use after: {err}");
    drop(conn);
    let mut next = app.connection().unwrap();
    assert_ne!(
        backend_pid(&mut next),
        pid,
        "the out-of-step session was reused"
    );
}

/// Any role that can connect can NOTIFY, and the server sends a listening session every
/// pending notification before the answer to its next statement: the driver kept them all
/// in memory until read, and a statement waited behind them for as long as a flood faster
/// than the client lasted. A connection now holds at most 100,000 unread: past that it is
/// dropped, its round-trip fails as closed naming the flood. Under the bound nothing
/// changes.
#[test]
fn a_connection_drops_itself_past_a_hundred_thousand_unread_notifications() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let app = App::connect(&db.url()).unwrap();
    app.migrate().unwrap();
    let mut sender = db.client();
    let send = |sender: &mut postgres::Client, n: i32| {
        sender
            .execute(
                "SELECT count(pg_notify('x', 'n' || g)) FROM generate_series(1, $1) g",
                &[&n],
            )
            .unwrap();
    };

    let mut conn = app.connection().unwrap();
    conn.listen("x").unwrap();
    send(&mut sender, 50_000);
    conn.query_one("SELECT 1", &[]).unwrap();
    let mut read = 0;
    while conn.wait_notification(Duration::ZERO).unwrap().is_some() {
        read += 1;
    }
    assert_eq!(read, 50_000, "under the bound every notification is kept");

    send(&mut sender, 150_000);
    let err = conn.query_one("SELECT 1", &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert!(err.to_string().contains("100000 notifications"), "{err}");
    assert!(conn.is_broken());
}
