//! TLS against real servers: the local PostgreSQL (ssl = on with Debian's self-signed
//! "snakeoil" certificate), a temporary cluster of our own with a CA made here (verify-full,
//! channel binding, client certificates, a stranded TLS connection), and two fake servers
//! (one that declines TLS, one that stalls inside the TLS handshake).

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use postpone::{App, ErrorKind, SslMode};
use support::cluster::{self, run, which, write};
use support::*;

const SSL_IN_USE: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
const SNAKEOIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

fn build(url: &str) -> postpone::Result<App> {
    App::builder(url)
        .connect_timeout(Duration::from_secs(5))
        .build()
}

/// Whether the App's connections are encrypted, as the server sees it.
fn encrypted(app: &App) -> bool {
    app.migrate().expect("migrate");
    let mut conn = app.connection().expect("connection");
    conn.query_one(SSL_IN_USE, &[]).expect("pg_stat_ssl").get(0)
}

fn connects_encrypted(url: &str) -> bool {
    let app = build(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    encrypted(&app)
}

/// The error of building an App on `url`, which must fail.
fn build_error(url: &str) -> postpone::Error {
    match build(url) {
        Ok(_) => panic!("{url}: connected, but it should have failed"),
        Err(e) => e,
    }
}

/// A key=value string for the test database, with `extra` appended.
fn key_value(db: &TestDb, extra: &str) -> String {
    let s = db.server();
    let mut out = format!(
        "host={} port={} user={} dbname={}",
        s.host,
        s.port,
        s.user,
        db.name()
    );
    if let Some(pw) = &s.password {
        out.push_str(&format!(
            " password='{}'",
            pw.replace('\\', "\\\\").replace('\'', "\\'")
        ));
    }
    out.push(' ');
    out.push_str(extra);
    out
}

#[test]
fn sslmode_disable_prefer_require_against_the_local_server() {
    let db = TestDb::new();
    let url = db.url();
    assert!(
        !connects_encrypted(&format!("{url}?sslmode=disable")),
        "disable"
    );
    assert!(
        connects_encrypted(&url),
        "no sslmode (prefer is the default)"
    );
    assert!(
        connects_encrypted(&format!("{url}?sslmode=prefer")),
        "prefer"
    );
    assert!(
        connects_encrypted(&format!("{url}?sslmode=allow")),
        "allow (read as prefer)"
    );
    assert!(
        connects_encrypted(&format!("{url}?sslmode=require")),
        "require"
    );
    assert!(
        connects_encrypted(&key_value(&db, "sslmode=require")),
        "require, key=value form"
    );
    assert!(
        !connects_encrypted(&key_value(&db, "sslmode='disable'")),
        "disable, key=value form"
    );
}

#[test]
fn unix_sockets_never_use_tls_as_in_libpq() {
    let db = TestDb::new();
    let server = db.server();
    let Some(dir) = server.socket_dir() else {
        skip(&format!(
            "no socket of the test server's port {} in /var/run/postgresql or /tmp",
            server.port
        ));
        return;
    };
    let url = format!(
        "host={dir} port={} user={} dbname={} sslmode=require",
        server.port,
        server.user,
        db.name()
    );
    assert!(!connects_encrypted(&url), "require over a Unix socket");
}

#[test]
fn verify_modes_against_the_self_signed_local_certificate() {
    // The snakeoil certificate is self-signed, CA:FALSE, for DNS:localhost only.
    let db = TestDb::new();
    let url = db.url();
    let host = &db.server().host;

    // verify-full, system roots, by address: never valid (the certificate names no address).
    let e = build_error(&format!("{url}?sslmode=verify-full"));
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("tls: certificate of {host} not trusted")),
        "{msg}"
    );
    println!("verify-full, system roots: {msg}");

    if !Path::new(SNAKEOIL).exists() {
        skip(&format!("the rest of this test: no {SNAKEOIL}"));
        return;
    }
    // A self-signed leaf given as the root: the chain is itself, and holds.
    let verify_ca = format!("{url}?sslmode=verify-ca&sslrootcert={SNAKEOIL}");
    assert!(
        connects_encrypted(&verify_ca),
        "verify-ca with the snakeoil root"
    );
    // libpq: require with a root file checks the chain like verify-ca.
    assert!(connects_encrypted(&format!(
        "{url}?sslmode=require&sslrootcert={SNAKEOIL}"
    )));

    // verify-full by address fails on the name, even with the right root.
    let e = build_error(&format!("{url}?sslmode=verify-full&sslrootcert={SNAKEOIL}"));
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "tls: certificate of {host} not trusted: it is not valid for the name {host}"
        )),
        "{msg}"
    );
    assert!(
        msg.contains("localhost"),
        "names what the certificate is for: {msg}"
    );
    println!("verify-full by address, snakeoil root: {msg}");

    // ... and succeeds by the name it was made for, connecting to the same address.
    if db.server().host == "127.0.0.1" {
        let by_name = key_value(&db, &format!("sslmode=verify-full sslrootcert={SNAKEOIL}"))
            .replacen("host=127.0.0.1", "host=localhost hostaddr=127.0.0.1", 1);
        assert!(connects_encrypted(&by_name), "{by_name}");

        // Debian links the snakeoil certificate into /etc/ssl/certs, a directory the system's
        // store is read from on Linux (as OpenSSL, and so libpq's sslrootcert=system, read it):
        // there verify-full by name succeeds with the system roots too.
        let system = key_value(&db, "sslrootcert=system").replacen(
            "host=127.0.0.1",
            "host=localhost hostaddr=127.0.0.1",
            1,
        );
        let store_has_etc_ssl_certs = match std::env::var("SSL_CERT_DIR") {
            Ok(dirs) if !dirs.is_empty() => dirs.split(':').any(|d| d == "/etc/ssl/certs"),
            _ => std::env::var_os("SSL_CERT_FILE").is_none_or(|f| f.is_empty()),
        };
        match build(&system) {
            Ok(app) => {
                assert!(
                    store_has_etc_ssl_certs,
                    "trusted, but /etc/ssl/certs is not read"
                );
                assert!(encrypted(&app));
                println!("sslrootcert=system by name: trusted (snakeoil is in /etc/ssl/certs)");
            }
            Err(e) => {
                assert!(
                    !store_has_etc_ssl_certs,
                    "not trusted from /etc/ssl/certs: {e}"
                );
                assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
                println!("sslrootcert=system by name: {e}");
            }
        }
    }

    // require with a root file that does not hold the snakeoil: fails like verify-ca.
    let bundle = "/etc/ssl/certs/ca-certificates.crt";
    if Path::new(bundle).exists() {
        let e = build_error(&format!("{url}?sslmode=require&sslrootcert={bundle}"));
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(
            e.to_string()
                .contains(&format!("not signed by a root in sslrootcert {bundle}")),
            "{e}"
        );
        // prefer with the same root file: the check was asked for, so its failure is not
        // retried in plain text (libpq would; see the TLS module's departures).
        let e = build_error(&format!("{url}?sslmode=prefer&sslrootcert={bundle}"));
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(e.to_string().contains("not signed by a root"), "{e}");
        // Without a root, prefer takes TLS (nothing is checked).
        assert!(connects_encrypted(&format!("{url}?sslmode=prefer")));
    } else {
        skip(&format!("the require/prefer root-file checks: no {bundle}"));
    }
}

#[test]
fn bad_tls_settings_are_config_errors_naming_the_problem() {
    let db = TestDb::new();
    let url = db.url();
    for (params, needle) in [
        ("sslmode=verify_full", "sslmode \"verify_full\""),
        (
            "sslrootcert=/nonexistent/root.pem&sslmode=verify-ca",
            "/nonexistent/root.pem",
        ),
        ("sslrootcert=system&sslmode=require", "sslrootcert=system"),
        ("sslcert=/etc/hostname", "sslcert is given without sslkey"),
        ("sslcrl=/x.pem", "sslcrl is not supported"),
    ] {
        let e = build_error(&format!("{url}?{params}"));
        assert_eq!(e.kind(), ErrorKind::Config, "{params}: {e}");
        let msg = e.to_string();
        assert!(msg.starts_with("invalid database url: "), "{msg}");
        assert!(msg.contains(needle), "{params}: {msg}");
    }
}

/// A server that answers the SSLRequest with `N`, then (for prefer) refuses the plain
/// startup with a FATAL error whose text proves the startup arrived in plain text.
fn no_tls_server() -> (u16, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let handle = thread::spawn(move || {
        for _ in 0..2 {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            let mut request = [0u8; 8];
            if s.read_exact(&mut request).is_err() {
                continue;
            }
            assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47], "an SSLRequest");
            s.write_all(b"N").ok();
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).is_err() {
                continue; // require: the client gives up here
            }
            let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            let _ = s.read_exact(&mut rest);
            let mut body = Vec::new();
            body.extend_from_slice(b"SFATAL\0C28000\0Mplain startup received\0\0");
            let mut msg = vec![b'E'];
            msg.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
            msg.extend_from_slice(&body);
            s.write_all(&msg).ok();
        }
    });
    (port, handle)
}

#[test]
fn a_server_without_tls_fails_require_and_falls_back_under_prefer() {
    let (port, server) = no_tls_server();
    let e = build_error(&format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=require"
    ));
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(
        e.to_string()
            .contains("tls: server does not support TLS but sslmode=require"),
        "{e}"
    );
    let e = build_error(&format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=prefer"
    ));
    assert!(
        e.to_string().contains("plain startup received"),
        "prefer went on in plain text: {e}"
    );
    server.join().expect("fake server");
}

/// A server that agrees to TLS, reads the ClientHello, and then says nothing more.
fn stalling_tls_server() -> (u16, mpsc::Sender<()>, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let handle = thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        let mut request = [0u8; 8];
        if s.read_exact(&mut request).is_ok() {
            s.write_all(b"S").ok();
            let mut hello = [0u8; 5];
            let _ = s.read_exact(&mut hello);
        }
        // Hold the socket open, answering nothing, until the test ends.
        let _ = stop_rx.recv();
        drop(s);
    });
    (port, stop_tx, handle)
}

#[test]
fn a_stalled_tls_handshake_ends_at_connect_timeout() {
    let (port, stop, server) = stalling_tls_server();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=require");
    let started = Instant::now();
    let e = App::builder(&url)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect_err("a stalled handshake cannot connect");
    let took = started.elapsed();
    drop(stop);
    server.join().expect("fake server");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        e.to_string()
            .contains("tls handshake got no answer within 1s connect_timeout"),
        "{e}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    println!("stalled TLS handshake gave up after {took:?}: {e}");
}

/// Whether a TCP socket whose local port is `port` (the proxy's end of a connection) holds
/// bytes that nobody has read (`rx_queue` in /proc/net/tcp).
fn unread_bytes_at(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .any(|text| {
            text.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let local = f
                    .get(1)
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
                let rx = f
                    .get(4)
                    .and_then(|q| q.split_once(':'))
                    .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok());
                local == Some(port) && rx.is_some_and(|rx| rx > 0)
            })
        })
}

// ---------------------------------------------------------------------------------------
// A temporary cluster of our own, with certificates made by the test.

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`<name>.crt`, `<name>.key`) with an EC P-256 key.
fn make_ca(dir: &Path, name: &str, cn: &str) {
    write(
        &dir.join(format!("{name}.ext")),
        "[v3]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\nsubjectKeyIdentifier = hash\n",
    );
    let (key, crt, ext) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
            "-config",
            &ext,
            "-extensions",
            "v3",
        ],
    );
}

/// A certificate `<name>.crt` / `<name>.key` signed by `ca` with SHA-384 (so that channel
/// binding must hash with SHA-384), with the given extensions.
fn make_leaf(dir: &Path, name: &str, cn: &str, ca: &str, extensions: &str) {
    write(&dir.join(format!("{name}.ext")), extensions);
    let (key, csr, crt, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-sha384",
            "-extfile",
            &ext,
        ],
    );
}

/// Our own TLS cluster: a CA, a server certificate for localhost, a client certificate for
/// `certuser`, a `scramuser` with a password; stopped and removed on drop.
fn tls_cluster() -> Cluster {
    let mut cluster = Cluster::prepare("tls");
    let dir = cluster.dir().to_path_buf();
    make_ca(&dir, "ca", "postpone test CA");
    make_ca(&dir, "other-ca", "postpone other CA");
    make_leaf(
        &dir,
        "server",
        "localhost",
        "ca",
        "basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth\nsubjectAltName = DNS:localhost, IP:127.0.0.1\n",
    );
    make_leaf(
        &dir,
        "client",
        "certuser",
        "ca",
        "basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature\nextendedKeyUsage = clientAuth\n",
    );
    run(
        false,
        Path::new("chmod"),
        &["600", &cluster.path("server.key")],
    );
    cluster.init(
        &format!(
            "ssl = on\nssl_cert_file = '{d}/server.crt'\nssl_key_file = '{d}/server.key'\n\
             ssl_ca_file = '{d}/ca.crt'\n",
            d = dir.display()
        ),
        "local all all trust\n\
         hostssl all certuser 127.0.0.1/32 cert\n\
         hostssl all scramuser 127.0.0.1/32 scram-sha-256\n\
         host all postgres 127.0.0.1/32 trust\n",
    );
    cluster.start();
    cluster
        .client("postgres")
        .batch_execute(
            "CREATE ROLE scramuser LOGIN SUPERUSER PASSWORD 'scram secret';
             CREATE ROLE certuser LOGIN SUPERUSER;",
        )
        .expect("creating roles");
    cluster
}

/// key=value string for `user` at host `localhost` (address 127.0.0.1), port `port`.
fn tls_url(port: u16, user: &str, extra: &str) -> String {
    format!("host=localhost hostaddr=127.0.0.1 port={port} user={user} dbname=postgres {extra}")
}

#[test]
fn own_cluster_verify_full_channel_binding_client_certs_and_a_stranded_tls_connection() {
    if let Some(reason) = cluster::skip_reason() {
        skip(&reason);
        return;
    }
    if !which("openssl") {
        skip("the openssl command is not installed (it makes the test certificates)");
        return;
    }
    init_logging();
    let cluster = tls_cluster();
    let port = cluster.port();
    let ca = cluster.path("ca.crt");
    let other_ca = cluster.path("other-ca.crt");

    // verify-full with our CA, by name; measure it against a plain connection.
    let plain = tls_url(port, "postgres", "sslmode=disable");
    let full = tls_url(
        port,
        "postgres",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    );
    let mut plain_times = Vec::new();
    let mut tls_times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        drop(build(&plain).expect("plain connect"));
        plain_times.push(t.elapsed());
        let t = Instant::now();
        drop(build(&full).expect("verify-full connect"));
        tls_times.push(t.elapsed());
    }
    plain_times.sort();
    tls_times.sort();
    println!(
        "App::build (one connection), median of 5: plain {:?}, verify-full {:?}",
        plain_times[2], tls_times[2]
    );
    let app = build(&full).expect("verify-full with our CA");
    assert!(encrypted(&app), "verify-full is encrypted");
    drop(app);

    // By address too: the certificate names IP 127.0.0.1.
    let by_ip = format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        ca.replace('/', "%2F")
    );
    assert!(connects_encrypted(&by_ip), "{by_ip}");

    // The wrong CA, and the system roots (which do not hold our CA): not trusted.
    for (extra, names) in [
        (
            format!("sslmode=verify-full sslrootcert={other_ca}"),
            format!("sslrootcert {other_ca}"),
        ),
        (
            "sslmode=verify-full".to_owned(),
            "the system's root certificates".to_owned(),
        ),
        (
            format!("sslmode=verify-ca sslrootcert='{other_ca}'"),
            format!("sslrootcert {other_ca}"),
        ),
    ] {
        let e = build_error(&tls_url(port, "postgres", &extra));
        assert_eq!(e.kind(), ErrorKind::Tls, "{extra}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains(
                "tls: certificate of localhost not trusted: it is not signed by a root in"
            ) && msg.contains(&names),
            "{extra}: {msg}"
        );
    }

    // verify-ca checks the chain, not the name; verify-full checks both.
    let wrong_name = format!(
        "host=db.invalid hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres sslrootcert={ca}"
    );
    assert!(connects_encrypted(&format!(
        "{wrong_name} sslmode=verify-ca"
    )));
    let e = build_error(&format!("{wrong_name} sslmode=verify-full"));
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(
        e.to_string().contains(
            "tls: certificate of db.invalid not trusted: it is not valid for the name db.invalid"
        ),
        "{e}"
    );

    // SCRAM with channel binding required: only passes if our tls-server-end-point hash
    // (SHA-384 here, from the certificate's signature) equals the server's.
    let scram = tls_url(
        port,
        "scramuser",
        &format!(
            "password='scram secret' channel_binding=require sslmode=verify-full sslrootcert={ca}"
        ),
    );
    assert!(connects_encrypted(&scram), "channel binding");

    // Client certificates.
    let with_cert = tls_url(
        port,
        "certuser",
        &format!(
            "sslmode=verify-full sslrootcert={ca} sslcert={} sslkey={}",
            cluster.path("client.crt"),
            cluster.path("client.key")
        ),
    );
    assert!(connects_encrypted(&with_cert), "client certificate");
    let e = build_error(&tls_url(
        port,
        "certuser",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    ));
    assert_eq!(e.kind(), ErrorKind::Connect, "no client certificate: {e}");
    println!("without a client certificate: {e}");

    // A stranded TLS connection: the io_timeout ends the query, the watchdog severs it.
    let proxy = FaultProxy::start(&format!("127.0.0.1:{port}"));
    let via_proxy = tls_url(
        proxy.port(),
        "postgres",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    );
    let app = App::builder(&via_proxy)
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("verify-full through the proxy");
    assert!(encrypted(&app), "through the proxy");
    let mut conn = app.connection().expect("connection");
    conn.query_one("SELECT 1", &[])
        .expect("a query before the strand");
    proxy.strand_all();
    let started = Instant::now();
    let e = conn
        .query_one("SELECT 1", &[])
        .expect_err("a stranded query cannot succeed");
    let took = started.elapsed();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains("1s io_timeout"), "{e}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    println!("stranded TLS query: {e} after {took:?}");
    drop(conn);

    // sever_all unblocks a stranded TLS query at once, long before its deadline.
    drop(app);
    drop(proxy);
    let proxy = FaultProxy::start(&format!("127.0.0.1:{port}"));
    let via_proxy = tls_url(
        proxy.port(),
        "postgres",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    );
    let app = App::builder(&via_proxy)
        .io_timeout(Duration::from_secs(1))
        .build()
        .expect("verify-full through the second proxy");
    let mut conn = app.connection().expect("connection");
    conn.query_one("SELECT 1", &[])
        .expect("a query before the strand");
    proxy.strand_all();
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        conn.set_io_timeout(Duration::from_secs(30));
        let r = conn.query_one("SELECT 1", &[]);
        let _ = tx.send(Instant::now());
        r.map(|_| ())
    });
    // The query is blocked once its bytes sit unread at the proxy's end.
    assert!(
        wait_until(Duration::from_secs(5), || unread_bytes_at(proxy.port())),
        "the query never reached the stranded proxy"
    );
    let severed_at = Instant::now();
    assert!(app.sever_all() >= 1, "a socket to sever");
    let returned_at = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the stranded query returned after sever_all");
    let e = worker
        .join()
        .expect("query thread")
        .expect_err("a severed query cannot succeed");
    let took = returned_at.saturating_duration_since(severed_at);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(
        matches!(e.kind(), ErrorKind::Shutdown | ErrorKind::Closed),
        "{e}"
    );
    println!("sever_all ended a stranded TLS query in {took:?}: {e}");
    drop(app);
    drop(proxy);
    drop(cluster);
}

#[test]
fn builder_settings_win_over_the_url() {
    let db = TestDb::new();
    let url = db.url();
    let with = |url: &str, f: &dyn Fn(postpone::AppBuilder) -> postpone::AppBuilder| {
        f(App::builder(url).connect_timeout(Duration::from_secs(5))).build()
    };
    // The builder turns TLS off where the URL asks for it, and on where the URL says no.
    let app = with(&format!("{url}?sslmode=require"), &|b| {
        b.ssl_mode(SslMode::Disable)
    })
    .unwrap();
    assert!(!encrypted(&app));
    let app = with(&format!("{url}?sslmode=disable"), &|b| {
        b.ssl_mode(SslMode::Require)
    })
    .unwrap();
    assert!(encrypted(&app));
    // verify-full by address never holds for this certificate: a Tls error from the builder.
    let e = with(&url, &|b| b.ssl_mode(SslMode::VerifyFull)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    if !Path::new(SNAKEOIL).exists() {
        skip(&format!("the root-file part of this test: no {SNAKEOIL}"));
        return;
    }
    let app = with(&url, &|b| {
        b.ssl_mode(SslMode::VerifyCa).ssl_root_cert(SNAKEOIL)
    })
    .unwrap();
    assert!(encrypted(&app));
    // A root file that does not exist is a Config error naming it.
    let e = with(&url, &|b| b.ssl_root_cert("/nonexistent/ca.pem")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    // A client certificate without a readable key file is a Config error too.
    let e = with(&url, &|b| {
        b.ssl_client_cert(SNAKEOIL, "/nonexistent/key.pem")
    })
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
}

#[test]
fn own_cluster_cn_only_certificate_and_prefer_with_a_root() {
    if let Some(reason) = cluster::skip_reason() {
        skip(&reason);
        return;
    }
    if !which("openssl") {
        skip("the openssl command is not installed (it makes the test certificates)");
        return;
    }
    init_logging();
    let cluster = tls_cluster();
    let port = cluster.port();
    let ca = cluster.path("ca.crt");
    let other_ca = cluster.path("other-ca.crt");

    // A server certificate that names its host in the CN only, without a subjectAltName.
    let dir = cluster.dir().to_path_buf();
    make_leaf(
        &dir,
        "cnonly",
        "localhost",
        "ca",
        "basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth\n",
    );
    let key = cluster.path("cnonly.key");
    if cluster::is_root() {
        run(
            false,
            Path::new("chown"),
            &["postgres:", &key, &cluster.path("cnonly.crt")],
        );
    }
    run(false, Path::new("chmod"), &["600", &key]);
    let mut admin = postgres::Client::connect(
        &format!(
            "host={} port={port} user=postgres dbname=postgres",
            dir.display()
        ),
        postgres::NoTls,
    )
    .expect("admin connection over the socket");
    for sql in [
        format!(
            "ALTER SYSTEM SET ssl_cert_file = '{}'",
            cluster.path("cnonly.crt")
        ),
        format!("ALTER SYSTEM SET ssl_key_file = '{key}'"),
        "SELECT pg_reload_conf()".to_owned(),
    ] {
        admin
            .batch_execute(&sql)
            .unwrap_or_else(|e| panic!("switching the server certificate: {sql}: {e}"));
    }
    // verify-full by name: libpq accepts the CN when there is no subjectAltName.
    let full = tls_url(
        port,
        "postgres",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    );
    let mut last = None;
    let accepted = wait_until(Duration::from_secs(10), || match build(&full) {
        Ok(app) => encrypted(&app),
        Err(e) => {
            last = Some(e.to_string());
            false
        }
    });
    assert!(
        accepted,
        "verify-full refused a CN-only certificate: {last:?}"
    );
    // Another name: refused, and the message says what the certificate names.
    let e = build_error(&format!(
        "host=db.invalid hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres \
         sslrootcert={ca} sslmode=verify-full"
    ));
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("not valid for the name db.invalid")
            && msg.contains("localhost (in its subject CN"),
        "{msg}"
    );
    // prefer with a root that does not sign the server's certificate: the check is meant,
    // so no retry in plain text (the server would accept plain text from postgres).
    let e = build_error(&tls_url(
        port,
        "postgres",
        &format!("sslmode=prefer sslrootcert={other_ca}"),
    ));
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(e.to_string().contains("not trusted"), "{e}");
    // Without a root, prefer still takes TLS here (no check).
    assert!(connects_encrypted(&tls_url(
        port,
        "postgres",
        "sslmode=prefer"
    )));

    drop(admin);
    drop(cluster);
}
