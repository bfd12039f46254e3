//! A stand-in for an old PgBouncer (before 1.20) in front of the real server: it refuses
//! every startup message that carries the `options` parameter, with PgBouncer's own words
//! (`FATAL: unsupported startup parameter: options`, SQLSTATE 08P01), and relays every other
//! connection to the upstream server byte for byte, startup message included. It answers
//! an SSLRequest with `N` (no TLS), as a PgBouncer without TLS configured does.
//!
//! Threads: one accept thread polling a non-blocking listener, two relay threads per
//! relayed connection; all joined on drop, after every socket is shut down.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;

struct Shared {
    upstream: String,
    stop: AtomicBool,
    refused: AtomicUsize,
    relayed: AtomicUsize,
    sockets: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// See [`PgBouncerStandIn::garble_on`].
    garble: Mutex<Option<Vec<u8>>>,
}

pub struct PgBouncerStandIn {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl PgBouncerStandIn {
    /// Listens on 127.0.0.1:<ephemeral>, relays to `upstream` (e.g. "127.0.0.1:5432").
    pub fn start(upstream: &str) -> PgBouncerStandIn {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("stand-in: bind");
        listener
            .set_nonblocking(true)
            .expect("stand-in: nonblocking");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream: upstream.to_owned(),
            stop: AtomicBool::new(false),
            refused: AtomicUsize::new(0),
            relayed: AtomicUsize::new(0),
            sockets: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            garble: Mutex::new(None),
        });
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("standin-accept".into())
            .spawn(move || {
                while !s.stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let _ = client.set_nonblocking(false);
                            let s2 = s.clone();
                            let h = thread::spawn(move || serve(&s2, client));
                            s.threads.lock().unwrap().push(h);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(5))
                        }
                        Err(_) => thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
            .expect("stand-in: spawn");
        PgBouncerStandIn {
            port,
            shared,
            accept: Some(accept),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Startup messages refused for carrying `options`.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// From now on, when a client message containing `marker` passes, the client first gets
    /// a BindComplete it never asked for: a reply out of step with its requests.
    pub fn garble_on(&self, marker: &str) {
        *self.shared.garble.lock().unwrap() = Some(marker.as_bytes().to_vec());
    }

    /// Connections relayed to the upstream server.
    pub fn relayed(&self) -> usize {
        self.shared.relayed.load(Ordering::SeqCst)
    }
}

impl Drop for PgBouncerStandIn {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        for s in self.shared.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = self.shared.threads.lock().unwrap().drain(..).collect();
        for h in threads {
            let _ = h.join();
        }
    }
}

/// Reads one length-prefixed startup-phase packet (no type byte): the whole packet.
fn read_packet(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let n = u32::from_be_bytes(len) as usize;
    if !(8..=10_000).contains(&n) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad startup length",
        ));
    }
    let mut packet = len.to_vec();
    packet.resize(n, 0);
    s.read_exact(&mut packet[4..])?;
    Ok(packet)
}

fn startup_params(packet: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut fields = packet[8..].split(|b| *b == 0);
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        if k.is_empty() {
            break;
        }
        out.push((
            String::from_utf8_lossy(k).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    }
    out
}

fn fatal(code: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (t, v) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', code),
        (b'M', message),
    ] {
        body.push(t);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    msg.extend_from_slice(&body);
    msg
}

fn serve(shared: &Shared, mut client: TcpStream) {
    let startup = loop {
        let Ok(packet) = read_packet(&mut client) else {
            return;
        };
        let code = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            if client.write_all(b"N").is_err() {
                return;
            }
            continue;
        }
        break packet;
    };
    if let Some((key, _)) = startup_params(&startup)
        .into_iter()
        .find(|(k, _)| k == "options")
    {
        shared.refused.fetch_add(1, Ordering::SeqCst);
        let _ = client.write_all(&fatal(
            "08P01",
            &format!("unsupported startup parameter: {key}"),
        ));
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let Ok(mut upstream) = TcpStream::connect(&shared.upstream) else {
        return;
    };
    if upstream.write_all(&startup).is_err() {
        return;
    }
    shared.relayed.fetch_add(1, Ordering::SeqCst);
    let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = (
        client.try_clone(),
        upstream.try_clone(),
        client.try_clone(),
        upstream.try_clone(),
    ) else {
        return;
    };
    {
        let mut socks = shared.sockets.lock().unwrap();
        socks.push(c3);
        socks.push(u3);
    }
    let back = thread::spawn(move || {
        let (mut from, mut to) = (u2, c2);
        let _ = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let marker = shared.garble.lock().unwrap().clone();
        if let Some(m) = marker {
            if buf[..n].windows(m.len()).any(|w| w == m.as_slice()) {
                // BindComplete: '2', length 4; nothing was bound.
                let _ = client.write_all(&[b'2', 0, 0, 0, 4]);
            }
        }
        if upstream.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = upstream.shutdown(Shutdown::Both);
    let _ = client.shutdown(Shutdown::Both);
    let _ = back.join();
}
