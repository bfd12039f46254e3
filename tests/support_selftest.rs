//! Self-test of the test support code (fault proxy, per-test database)
//! against the real PostgreSQL server.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{mpsc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use support::*;

/// The fd-leak test counts every descriptor of the process, so it runs alone:
/// it takes this lock for writing, every other test for reading.
static FD_ACCOUNTING: RwLock<()> = RwLock::new(());

fn shared_fds() -> RwLockReadGuard<'static, ()> {
    FD_ACCOUNTING.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive_fds() -> RwLockWriteGuard<'static, ()> {
    FD_ACCOUNTING.write().unwrap_or_else(|e| e.into_inner())
}

fn connect(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

fn select_one(client: &mut Client) -> i32 {
    client.query_one("SELECT 1", &[]).expect("SELECT 1").get(0)
}

/// Runs `SELECT 1` on `client` in another thread (the sync client has no
/// deadline); the outcome arrives on the returned channel.
fn select_one_in_thread(
    mut client: Client,
) -> (
    mpsc::Receiver<Result<i32, postgres::Error>>,
    thread::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let res = client.query_one("SELECT 1", &[]).map(|row| row.get(0));
        let _ = tx.send(res);
    });
    (rx, handle)
}

/// TCP sockets held by this process that touch `port` (either end).
fn own_sockets_touching(port: u16) -> usize {
    own_tcp_sockets()
        .iter()
        .filter(|s| s.local_port == port || s.remote_port == port)
        .count()
}

/// A PostgreSQL v3 startup message.
fn startup_message(user: &str, database: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196_608i32.to_be_bytes()); // protocol 3.0
    for s in ["user", user, "database", database] {
        body.extend_from_slice(s.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    msg.extend(body);
    msg
}

/// A PostgreSQL simple-query ('Q') message.
fn query_message(sql: &str) -> Vec<u8> {
    let mut msg = vec![b'Q'];
    msg.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
    msg.extend_from_slice(sql.as_bytes());
    msg.push(0);
    msg
}

/// Reads backend messages until ReadyForQuery ('Z'); returns the message types.
fn read_until_ready(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut types = Vec::new();
    loop {
        let mut header = [0u8; 5];
        stream.read_exact(&mut header).expect("message header");
        let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let mut body = vec![0u8; (len - 4) as usize];
        stream.read_exact(&mut body).expect("message body");
        types.push(header[0]);
        if header[0] == b'Z' {
            return types;
        }
    }
}

/// Asserts that nothing arrives on `stream` within 500 ms.
fn assert_no_reply(stream: &mut TcpStream) {
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("expected no reply (read timeout), got {other:?}"),
    }
}

#[test]
fn forwards_queries_and_tracks_connections() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    assert_eq!(
        proxy.url("x"),
        format!("postgres://postgres@127.0.0.1:{}/x", proxy.port())
    );

    let mut a = connect(&db.url_via(&proxy));
    let mut b = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut a), 1);
    assert_eq!(select_one(&mut b), 1);
    // A larger round trip, both directions.
    let big: String = b
        .query_one("SELECT repeat('x', 1000000)", &[])
        .unwrap()
        .get(0);
    assert_eq!(big.len(), 1_000_000);
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.live_connections(), 2);
    assert_eq!(db.backend_pids().len(), 2);

    // A normal close is passed on and the connection leaves the registry.
    drop(a);
    assert!(wait_until(Duration::from_secs(2), || proxy
        .live_connections()
        == 1));
    assert!(wait_until(Duration::from_secs(2), || db
        .backend_pids()
        .len()
        == 1));
    assert_eq!(select_one(&mut b), 1);
    drop(b);
    assert!(wait_until(Duration::from_secs(2), || proxy
        .live_connections()
        == 0));
    assert_eq!(proxy.accepted(), 2);
}

#[test]
fn strand_all_hangs_existing_connections_but_not_new_ones() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let mut old = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut old), 1);

    proxy.strand_all();
    let (rx, handle) = select_one_in_thread(old);
    let started = Instant::now();
    match rx.recv_timeout(Duration::from_secs(1)) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("a query on a stranded connection answered: {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        proxy.live_connections(),
        1,
        "a stranded connection stays live"
    );
    // Half-open: the server side is still there, idle, unaware.
    assert_eq!(db.backend_pids().len(), 1);

    // New connections are forwarded normally.
    let mut fresh = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut fresh), 1);
    assert_eq!(proxy.live_connections(), 2);
    drop(fresh);
    assert!(wait_until(Duration::from_secs(2), || proxy
        .live_connections()
        == 1));

    // Still no answer; dropping the proxy closes the sockets, which ends the
    // blocked query with an error.
    assert!(rx.try_recv().is_err());
    let dropped = Instant::now();
    drop(proxy);
    assert!(
        dropped.elapsed() < Duration::from_secs(1),
        "drop took {:?}",
        dropped.elapsed()
    );
    let res = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the blocked query ends once the proxy is dropped");
    assert!(res.is_err(), "expected an error, got {res:?}");
    handle.join().unwrap();
}

#[test]
fn strand_all_raw_protocol_no_reply_and_client_close_seen() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let mut raw = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    raw.write_all(&startup_message(&db.server().user, db.name()))
        .unwrap();
    let types = read_until_ready(&mut raw);
    assert_eq!(
        types.first(),
        Some(&b'R'),
        "authentication message first: {types:?}"
    );
    raw.write_all(&query_message("SELECT 1")).unwrap();
    assert!(read_until_ready(&mut raw).contains(&b'D'));

    proxy.strand_all();
    assert_eq!(proxy.peer_closed_stranded(), 0);
    // The write is accepted by the kernel, and no reply ever comes.
    raw.write_all(&query_message("SELECT 1")).unwrap();
    assert_no_reply(&mut raw);
    assert_eq!(proxy.live_connections(), 1);

    // The client gives up: the proxy (which still reads nothing) keeps the
    // connection, and the kernel state shows the client closed its end.
    drop(raw);
    assert!(wait_until(Duration::from_secs(2), || proxy
        .peer_closed_stranded()
        == 1));
    assert_eq!(proxy.live_connections(), 1);
}

#[test]
fn reset_all_makes_the_next_query_fail_quickly() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    // Declared before the proxy so that, if an assertion fails, they are
    // dropped after it: dropping a sync client over a stranded link blocks
    // until the link closes.
    let (mut old, mut stranded, mut other);
    let proxy = FaultProxy::start(&db.server_addr());
    old = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut old), 1);
    stranded = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut stranded), 1);
    proxy.strand_all();
    other = connect(&db.url_via(&proxy));
    assert_eq!(proxy.live_connections(), 3);

    proxy.reset_all();
    assert_eq!(proxy.live_connections(), 0);
    let started = Instant::now();
    let (rx, handle) = select_one_in_thread(old);
    let res = rx
        .recv_timeout(Duration::from_secs(2))
        .expect("a query on a reset connection must fail within 2 s");
    let err = res.expect_err("a query on a reset connection must fail");
    eprintln!("error after reset ({:?}): {err}", started.elapsed());
    handle.join().unwrap();

    // Stranded connections are reset too.
    let (rx, handle) = select_one_in_thread(stranded);
    let res = rx
        .recv_timeout(Duration::from_secs(2))
        .expect("fails within 2 s");
    assert!(res.is_err());
    handle.join().unwrap();
    assert!(other.simple_query("SELECT 1").is_err());

    // The upstream sides were closed: the server's backends go away.
    assert!(
        wait_until(Duration::from_secs(5), || db.backend_pids().is_empty()),
        "backends left: {:?}",
        db.backend_pids()
    );
    // And the proxy still forwards new connections.
    let mut fresh = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut fresh), 1);
}

#[test]
fn reset_all_sends_rst_to_the_client() {
    let _shared = shared_fds();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let mut raw = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    raw.write_all(&startup_message(&db.server().user, db.name()))
        .unwrap();
    read_until_ready(&mut raw);
    proxy.reset_all();
    raw.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 16];
    match raw.read(&mut buf) {
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("expected ECONNRESET, got {other:?}"),
    }
}

#[test]
fn new_conns_strand_accepts_but_never_answers() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    proxy.set_new_conns(NewConns::Strand);

    let mut raw = TcpStream::connect(("127.0.0.1", proxy.port())).expect("TCP connect succeeds");
    raw.write_all(&startup_message(&db.server().user, db.name()))
        .expect("write accepted");
    assert_no_reply(&mut raw);
    assert_eq!(proxy.accepted(), 1);
    assert_eq!(proxy.live_connections(), 1);

    // A postgres client's startup handshake hangs too.
    let url = db.url_via(&proxy);
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let _ = tx.send(Client::connect(&url, NoTls).map(|_| ()));
    });
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(700)),
        Err(mpsc::RecvTimeoutError::Timeout)
    ));
    assert!(wait_until(Duration::from_secs(1), || proxy
        .live_connections()
        == 2));
    assert!(db.backend_pids().is_empty(), "nothing reached the server");

    // Back to Forward: new connections work, the stranded ones stay stranded.
    proxy.set_new_conns(NewConns::Forward);
    let mut fresh = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut fresh), 1);
    assert_no_reply(&mut raw);
    assert_eq!(proxy.live_connections(), 3);

    drop(proxy);
    let res = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("connect ends");
    assert!(res.is_err());
    handle.join().unwrap();
}

#[test]
fn new_conns_refuse_then_forward_again_on_the_same_port() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let proxy = FaultProxy::start(&db.server_addr());
    let port = proxy.port();
    let mut before = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut before), 1);

    proxy.set_new_conns(NewConns::Refuse);
    let err = TcpStream::connect(("127.0.0.1", port)).expect_err("connect must be refused");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    // Established connections are not affected.
    assert_eq!(select_one(&mut before), 1);
    // Idempotent.
    proxy.set_new_conns(NewConns::Refuse);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());

    proxy.set_new_conns(NewConns::Forward);
    assert_eq!(proxy.port(), port);
    let mut after = connect(&db.url_via(&proxy));
    assert_eq!(select_one(&mut after), 1);

    // Refuse -> Strand also re-binds.
    proxy.set_new_conns(NewConns::Refuse);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    proxy.set_new_conns(NewConns::Strand);
    let mut raw = TcpStream::connect(("127.0.0.1", port)).expect("accepted again");
    raw.write_all(b"hello").unwrap();
    assert_no_reply(&mut raw);
    assert_eq!(proxy.accepted(), 3);
}

#[test]
fn test_db_lifecycle() {
    let _shared = shared_fds();
    init_logging();
    let db = TestDb::new();
    let name = db.name().to_string();
    assert!(name.starts_with(&format!("postpone_t_{}_", std::process::id())));
    assert!(name.len() < 64, "identifier too long: {name}");
    assert!(db.url().ends_with(&format!("/{name}")));

    let mut first = db.client();
    let mut second = db.client();
    let current: String = first
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    assert_eq!(current, name);
    let pid1: i32 = first
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let pid2: i32 = second
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let mut expected = vec![pid1, pid2];
    expected.sort_unstable();
    assert_eq!(db.backend_pids(), expected);

    drop(first);
    assert!(wait_until(Duration::from_secs(2), || db.backend_pids() == vec![pid2]));
    assert_eq!(db.terminate_backends(), 1);
    assert!(db.backend_pids().is_empty());
    assert!(
        second.simple_query("SELECT 1").is_err(),
        "terminated backend"
    );
    assert_eq!(db.terminate_backends(), 0);

    // Two databases are distinct.
    let other = TestDb::new();
    assert_ne!(other.name(), db.name());

    // A lingering client does not prevent the drop (WITH (FORCE)).
    let _lingering = db.client();
    drop(db);
    let mut admin = connect(&ServerSpec::from_env().url("postgres"));
    let count: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "database {name} still exists");
    let other_name = other.name().to_string();
    drop(other);
    let count: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&other_name],
        )
        .unwrap()
        .get(0);
    assert_eq!(count, 0);
}

#[test]
fn server_spec_keeps_host_port_user() {
    let _shared = shared_fds();
    let spec =
        ServerSpec::parse("postgres://alice:s3cr%40t@db.example:6543/whatever?sslmode=disable");
    assert_eq!(
        spec,
        ServerSpec {
            user: "alice".into(),
            password: Some("s3cr@t".into()),
            host: "db.example".into(),
            port: 6543,
        }
    );
    assert_eq!(
        spec.url("other"),
        "postgres://alice:s3cr%40t@db.example:6543/other"
    );
    let kv = ServerSpec::parse("host=127.0.0.1 port=5433 user=bob dbname=x");
    assert_eq!(kv.addr(), "127.0.0.1:5433");
    assert_eq!(kv.url("y"), "postgres://bob@127.0.0.1:5433/y");
    let defaults = ServerSpec::parse("postgres://localhost");
    assert_eq!((defaults.user.as_str(), defaults.port), ("postgres", 5432));
}

#[test]
fn wait_until_reports_timeouts() {
    let _shared = shared_fds();
    let started = Instant::now();
    assert!(!wait_until(Duration::from_millis(50), || false));
    assert!(started.elapsed() >= Duration::from_millis(50));
    let mut n = 0;
    assert!(wait_until(Duration::from_secs(1), || {
        n += 1;
        n == 3
    }));
    assert!(open_fds() > 0);
}

/// Dropping a proxy with forwarding, stranded and half-connected links is
/// fast and closes every socket. Two checks: the sockets that touch the
/// proxies' ports (proxy `a` forwards to proxy `b`, which forwards to the
/// server, so that `a`'s upstream sockets are recognisable: remote port = b),
/// and the process-wide fd count, exact since this test runs alone.
#[test]
fn drop_with_stranded_connections_is_fast_and_leaks_no_socket() {
    let _exclusive = exclusive_fds();
    init_logging();
    let db = TestDb::new();
    let fds_before = open_fds();
    // Declared before the proxies: should an assertion fail, it is dropped
    // after them (dropping a sync client over a stranded link blocks until
    // the link closes).
    let mut idle;
    let b = FaultProxy::start(&db.server_addr());
    let a = FaultProxy::start(&format!("127.0.0.1:{}", b.port()));
    let (pa, pb) = (a.port(), b.port());
    let mine = move || own_sockets_touching(pa) + own_sockets_touching(pb);

    let mut blocked = connect(&db.url_via(&a));
    idle = connect(&db.url_via(&a));
    assert_eq!(select_one(&mut blocked), 1);
    assert_eq!(select_one(&mut idle), 1);
    a.strand_all();
    let (rx, handle) = select_one_in_thread(blocked);
    a.set_new_conns(NewConns::Strand);
    let mut raw = TcpStream::connect(("127.0.0.1", pa)).unwrap();
    raw.write_all(b"hello").unwrap();
    assert!(wait_until(Duration::from_secs(1), || a.live_connections() == 3));
    assert_eq!(b.live_connections(), 2);
    assert!(rx.try_recv().is_err());

    // Listeners (2) + on a's port: 3 client ends and 3 accepted ends; a's 2
    // upstream ends and b's 2 accepted ends on b's port.
    let with_proxies = mine();
    assert!(
        with_proxies >= 12,
        "socket accounting looks wrong: {with_proxies}"
    );
    let fds_with = open_fds();
    // 2 accept threads and b's 2 pumps per link; a's stranded links have no
    // pump left.
    assert_eq!(threads_named("fault-proxy-"), 6);
    assert!(fds_with > fds_before);

    let started = Instant::now();
    drop(a);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "dropping the proxy took {took:?}"
    );
    // Only b's threads are left: its accept thread and 2 pumps per link.
    assert!(threads_named("fault-proxy-") <= 5);

    // a's sockets are gone; b sees its upstream links closed and lets go.
    assert!(wait_until(Duration::from_secs(2), || b.live_connections() == 0));
    let res = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("blocked query ends");
    assert!(res.is_err());
    handle.join().unwrap();
    drop(idle);
    drop(raw);
    drop(b);
    assert!(
        wait_until(Duration::from_secs(2), || mine() == 0),
        "sockets left open on the proxies' ports: {:?}",
        own_tcp_sockets()
            .into_iter()
            .filter(|s| [s.local_port, s.remote_port]
                .iter()
                .any(|p| *p == pa || *p == pb))
            .collect::<Vec<_>>()
    );
    // No other test runs meanwhile (FD_ACCOUNTING), so the process-wide
    // count must come back exactly: this also catches sockets that were shut
    // down but whose descriptors leaked (those vanish from /proc/net/tcp).
    let back = wait_until(Duration::from_secs(2), || open_fds() == fds_before);
    eprintln!(
        "open fds: before {fds_before}, with proxies {fds_with}, after {} \
         ({with_proxies} sockets on the proxies' ports; drop took {took:?})",
        open_fds()
    );
    assert!(back, "fd leak: {} open, {fds_before} before", open_fds());
    // Drop joined every proxy thread.
    assert_eq!(threads_named("fault-proxy-"), 0);
}
