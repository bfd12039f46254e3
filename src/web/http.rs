//! The dashboard's HTTP/1.1 server: an accept thread, a fixed number of request threads,
//! one request per connection (`Connection: close`).
//!
//! The accept thread never blocks on a client: it hands each connection to the request
//! threads through a bounded channel and, when every thread is busy and the channel is
//! full, answers `503` itself (under a short write timeout) and closes. A request thread
//! reads one request under a deadline for the whole head and body (`read_timeout`), so a
//! client that trickles bytes or goes silent holds one thread for at most that long and
//! never the others; a connection that waited in the queue longer than `read_timeout`
//! (behind a flood of such clients) gets a `503` at once, so no request waits much more
//! than that. Heads are limited to 16 KiB and bodies to 64 KiB.
//!
//! Parsing is `httparse`'s; everything else is `std::net`.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, TrySendError};

const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 64 * 1024;
const MAX_HEADERS: usize = 64;
/// Connections waiting for a request thread, beyond those being served.
const BACKLOG: usize = 32;

/// One parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// The path, percent-decoded, without the query.
    pub(crate) path: String,
    /// Query parameters, percent-decoded (the last of repeated names wins, except through
    /// [`Request::query_all`]).
    pub(crate) query: Vec<(String, String)>,
    /// Header names in lower case.
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    /// The last value of query parameter `name`, if present and not empty.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .rev()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The body as `application/x-www-form-urlencoded` pairs.
    pub(crate) fn form(&self) -> Vec<(String, String)> {
        parse_pairs(&String::from_utf8_lossy(&self.body))
    }
}

/// A response to write.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn html(status: u16, body: String) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", "text/html; charset=utf-8".to_owned())],
            body: body.into_bytes(),
        }
    }

    pub(crate) fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".to_owned())],
            body: body.into().into_bytes(),
        }
    }

    /// `303 See Other` to `location` (a path of ours).
    pub(crate) fn redirect(location: String) -> Response {
        Response {
            status: 303,
            headers: vec![("Location", location)],
            body: Vec::new(),
        }
    }

    pub(crate) fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

/// Settings of the server.
#[derive(Clone, Debug)]
pub(crate) struct ServerOptions {
    pub(crate) threads: usize,
    pub(crate) read_timeout: Duration,
    pub(crate) write_timeout: Duration,
}

/// A running server: its threads and the flag that stops them.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds `listen` and starts the threads; `handle` answers each request.
    pub(crate) fn start(
        listen: SocketAddr,
        opts: ServerOptions,
        handle: Arc<dyn Fn(&Request) -> Response + Send + Sync>,
    ) -> io::Result<Server> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = bounded::<(TcpStream, Instant)>(BACKLOG);
        let mut threads = Vec::new();
        for n in 0..opts.threads.max(1) {
            let rx: Receiver<(TcpStream, Instant)> = rx.clone();
            let handle = handle.clone();
            let opts = opts.clone();
            threads.push(
                thread::Builder::new()
                    .name(format!("postpone-web-{n}"))
                    .spawn(move || {
                        for (stream, accepted) in rx {
                            if accepted.elapsed() > opts.read_timeout {
                                // It waited behind slow clients for longer than a client
                                // may take: answer at once rather than add to the wait.
                                busy(stream, opts.write_timeout);
                            } else {
                                serve(stream, &opts, &*handle);
                            }
                        }
                    })?,
            );
        }
        let stop2 = stop.clone();
        let write_timeout = opts.write_timeout;
        threads.push(
            thread::Builder::new()
                .name("postpone-web-accept".to_owned())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop2.load(Ordering::Acquire) {
                            break;
                        }
                        let stream = match conn {
                            Ok(s) => s,
                            Err(e) => {
                                log::warn!("dashboard: accepting a connection: {e}");
                                thread::sleep(Duration::from_millis(50));
                                continue;
                            }
                        };
                        match tx.try_send((stream, Instant::now())) {
                            Ok(()) => {}
                            Err(TrySendError::Full((stream, _))) => busy(stream, write_timeout),
                            Err(TrySendError::Disconnected(_)) => break,
                        }
                    }
                    // Dropping `tx` ends the request threads once the queue is drained.
                })?,
        );
        Ok(Server {
            addr,
            stop,
            threads,
        })
    }

    /// Stops accepting, lets requests in progress finish (each is bounded by the read and
    /// write timeouts and the App's deadlines), joins the threads.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept thread with a connection of our own.
        let wake = match self.addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => {
                SocketAddr::from(([127, 0, 0, 1], a.port()))
            }
            SocketAddr::V6(a) if a.ip().is_unspecified() => {
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
            }
            a => a,
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Server {
    /// Serves until the process ends.
    pub(crate) fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Answers 503 without reading the request.
fn busy(mut stream: TcpStream, write_timeout: Duration) {
    let _ = stream.set_write_timeout(Some(write_timeout.min(Duration::from_millis(500))));
    let resp = Response::text(
        503,
        "the dashboard is busy: every request thread is taken; try again\n",
    )
    .header("Retry-After", "1");
    let _ = write_response(&mut stream, &resp);
    let _ = stream.shutdown(Shutdown::Both);
}

fn serve(mut stream: TcpStream, opts: &ServerOptions, handle: &dyn Fn(&Request) -> Response) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(opts.write_timeout));
    let resp = match read_request(&mut stream, opts.read_timeout) {
        Ok(req) => {
            // A panic in a handler (a defect, or data it could not read) costs this request
            // a 500, not the server one of its threads.
            let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(&req)));
            let mut resp = answered.unwrap_or_else(|_| {
                log::error!(
                    "dashboard: answering {} {:?} panicked (see the message above); answered 500",
                    req.method,
                    req.path
                );
                Response::text(
                    500,
                    "internal error: the dashboard's handler panicked (see its log)\n",
                )
            });
            if req.method == "HEAD" {
                resp.body.clear();
            }
            resp
        }
        Err(ReadError::Io) => return,
        Err(ReadError::Status(status, msg)) => Response::text(status, msg),
    };
    let _ = write_response(&mut stream, &resp);
    let _ = stream.shutdown(Shutdown::Write);
}

enum ReadError {
    /// The client went away or stalled: nothing worth answering.
    Io,
    Status(u16, &'static str),
}

/// Reads one request; the whole of it must arrive within `timeout`.
fn read_request(stream: &mut TcpStream, timeout: Duration) -> Result<Request, ReadError> {
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    let (head_len, method, target, headers) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Status(408, "request head too slow\n"));
        }
        let _ = stream.set_read_timeout(Some(left));
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(ReadError::Io),
            Ok(n) => n,
            Err(e) if is_timeout(&e) => {
                return Err(ReadError::Status(408, "request head too slow\n"))
            }
            Err(_) => return Err(ReadError::Io),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut hs);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let headers: HashMap<String, String> = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                break (
                    len,
                    req.method.unwrap_or("GET").to_owned(),
                    req.path.unwrap_or("/").to_owned(),
                    headers,
                );
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(ReadError::Status(431, "request head too large\n"))
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(ReadError::Status(431, "too many headers\n"))
            }
            Err(_) => return Err(ReadError::Status(400, "malformed request\n")),
        }
    };
    let len: usize = match headers.get("content-length") {
        None => 0,
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| ReadError::Status(400, "bad content-length\n"))?,
    };
    if len > MAX_BODY {
        return Err(ReadError::Status(413, "request body too large\n"));
    }
    if headers.contains_key("transfer-encoding") {
        return Err(ReadError::Status(400, "chunked bodies are not accepted\n"));
    }
    let mut body = buf.split_off(head_len);
    while body.len() < len {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Status(408, "request body too slow\n"));
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut chunk) {
            Ok(0) => return Err(ReadError::Io),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) => {
                return Err(ReadError::Status(408, "request body too slow\n"))
            }
            Err(_) => return Err(ReadError::Io),
        }
    }
    body.truncate(len);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, parse_pairs(q)),
        None => (target.as_str(), Vec::new()),
    };
    Ok(Request {
        method,
        path: decode(path),
        query,
        headers,
        body,
    })
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn write_response(stream: &mut TcpStream, resp: &Response) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\nConnection: close\r\n\
         X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n\
         Referrer-Policy: no-referrer\r\nCache-Control: no-store\r\n",
        resp.status,
        reason(resp.status),
        resp.body.len()
    );
    for (name, value) in &resp.headers {
        // Values are ours, but a header must never be split by a stray line break.
        let value: String = value.chars().filter(|c| !c.is_control()).collect();
        head.push_str(name);
        head.push_str(": ");
        head.push_str(&value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(&resp.body)?;
    stream.flush()
}

/// `a=1&b=x%20y` into pairs, `+` as a space, percent-decoded.
pub(crate) fn parse_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(&k.replace('+', " ")), decode(&v.replace('+', " ")))
        })
        .collect()
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends one GET and returns the response's status line.
    fn status_line(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.lines().next().unwrap_or_default().to_owned()
    }

    #[test]
    fn a_panicking_handler_costs_its_request_a_500_and_not_the_thread() {
        let opts = ServerOptions {
            threads: 1,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        };
        let server = Server::start(
            "127.0.0.1:0".parse().unwrap(),
            opts,
            Arc::new(|req: &Request| {
                if req.path == "/boom" {
                    panic!("a handler's defect");
                }
                Response::text(200, "fine\n")
            }),
        )
        .unwrap();
        assert_eq!(
            status_line(server.addr, "/boom"),
            "HTTP/1.1 500 Internal Server Error"
        );
        // The server's only thread still answers.
        assert_eq!(status_line(server.addr, "/"), "HTTP/1.1 200 OK");
        assert_eq!(
            status_line(server.addr, "/boom"),
            "HTTP/1.1 500 Internal Server Error"
        );
        server.stop();
    }

    #[test]
    fn pairs_decode_plus_and_percent() {
        let p = parse_pairs("a=1&b=x+y%3Cz&&c&d=%00");
        assert_eq!(
            p,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y<z".into()),
                ("c".into(), "".into()),
                ("d".into(), "\0".into()),
            ]
        );
    }
}
