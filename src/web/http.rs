//! The dashboard's HTTP/1.1 server: one I/O thread that owns every connection, and a fixed
//! number of request threads that answer requests.
//!
//! The I/O thread runs a single-threaded tokio runtime: reading requests and writing
//! responses wait on sockets, never on a thread, so a client that reads slowly, trickles
//! its request or keeps an idle connection open costs a buffer and a task, never a request
//! thread. The request threads run the handler (which makes blocking database calls) and
//! hand the response back; the I/O thread writes it.
//!
//! Bounds, each a setting of [`ServerOptions`]:
//! - a request (head and body) must arrive within `read_timeout` of its first byte, heads
//!   up to 16 KiB, bodies up to 64 KiB (`408`, `431`, `413` otherwise);
//! - a response must be written within `response_timeout` of the request's arrival,
//!   handler time included: a reader too slow for that has its connection closed, and a
//!   handler that has not answered by then gets the client a `504`;
//! - at most `max_connections` connections are open (a `503` for the next, answered without
//!   reading);
//! - at most `threads` requests are handled at once and [`QUEUE`] more wait; the next is
//!   answered `503` at once, and a request still waiting when its deadline passes too;
//! - an idle keep-alive connection is closed after `keep_alive`;
//! - a streamed body ([`Body::Stream`]) is produced one chunk at a time, by a request
//!   thread, only when the previous chunk has been written: memory per connection is one
//!   chunk, whatever the whole body weighs.
//!
//! Parsing is `httparse`'s.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_channel::{bounded, Sender, TrySendError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 64 * 1024;
const MAX_HEADERS: usize = 64;
/// Requests waiting for a request thread, beyond those being handled.
pub(crate) const QUEUE: usize = 32;
/// Requests served on one connection before it is closed.
const MAX_REQUESTS_PER_CONNECTION: usize = 1000;

/// One parsed request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// The path, percent-decoded, without the query.
    pub(crate) path: String,
    /// Query parameters, percent-decoded (the last of repeated names wins, except through
    /// the list itself).
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

    /// A request from its parts: `target` is a path with an optional `?query`.
    pub(crate) fn new(
        method: &str,
        target: &str,
        headers: HashMap<String, String>,
        body: Vec<u8>,
    ) -> Request {
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, parse_pairs(q)),
            None => (target, Vec::new()),
        };
        Request {
            method: method.to_owned(),
            path: decode(path),
            query,
            headers,
            body,
        }
    }
}

/// The next chunk of a streamed body: `Ok(None)` at its end. It runs on a request thread
/// (it may query the database) and is called again only once its chunk is written.
pub(crate) type NextChunk = Box<dyn FnMut() -> io::Result<Option<Vec<u8>>> + Send>;

/// A response body.
pub(crate) enum Body {
    /// The whole body, in memory.
    Full(Vec<u8>),
    /// A body produced a chunk at a time, of this length (sent as `Content-Length`).
    Stream { len: u64, next: NextChunk },
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Body::Full(b) => write!(f, "Full({} bytes)", b.len()),
            Body::Stream { len, .. } => write!(f, "Stream({len} bytes)"),
        }
    }
}

/// A response to write.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Body,
}

impl Response {
    pub(crate) fn html(status: u16, body: String) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", "text/html; charset=utf-8".to_owned())],
            body: Body::Full(body.into_bytes()),
        }
    }

    pub(crate) fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".to_owned())],
            body: Body::Full(body.into().into_bytes()),
        }
    }

    /// `303 See Other` to `location` (a path of ours).
    pub(crate) fn redirect(location: String) -> Response {
        Response {
            status: 303,
            headers: vec![("Location", location)],
            body: Body::Full(Vec::new()),
        }
    }

    pub(crate) fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// The length of the body, as `Content-Length` gives it.
    pub(crate) fn len(&self) -> u64 {
        match &self.body {
            Body::Full(b) => b.len() as u64,
            Body::Stream { len, .. } => *len,
        }
    }
}

pub(crate) fn reason(status: u16) -> &'static str {
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
    pub(crate) response_timeout: Duration,
    pub(crate) keep_alive: Duration,
    pub(crate) max_connections: usize,
}

/// What a request thread runs.
type Job = Box<dyn FnOnce() + Send>;

pub(crate) type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A running server: its threads and the flag that stops them.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Server({})", self.addr)
    }
}

/// Shared by the I/O thread's tasks.
struct Shared {
    opts: ServerOptions,
    handler: Handler,
    jobs: Sender<Job>,
    stop: Arc<AtomicBool>,
    /// Connections being served.
    open: AtomicUsize,
    /// Connections being refused.
    refusing: AtomicUsize,
}

impl Server {
    /// Binds `listen` and starts the threads; `handler` answers each request.
    pub(crate) fn start(
        listen: SocketAddr,
        opts: ServerOptions,
        handler: Handler,
    ) -> io::Result<Server> {
        let listener = StdListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = bounded::<Job>(QUEUE);
        let mut threads = Vec::new();
        for n in 0..opts.threads.max(1) {
            let rx = rx.clone();
            threads.push(
                thread::Builder::new()
                    .name(format!("postpone-web-{n}"))
                    .spawn(move || {
                        for job in rx {
                            job();
                        }
                    })?,
            );
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            opts,
            handler,
            jobs: tx,
            stop: stop.clone(),
            open: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
        });
        threads.push(
            thread::Builder::new()
                .name("postpone-web-io".to_owned())
                .spawn(move || runtime.block_on(serve_all(listener, shared)))?,
        );
        Ok(Server {
            addr,
            stop,
            threads,
        })
    }

    /// Stops accepting, lets requests in progress finish (each is bounded by the response
    /// deadline), closes idle connections, joins the threads.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Serves until the process ends.
    pub(crate) fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How often waiting loops look at the stop flag.
const TICK: Duration = Duration::from_millis(100);

async fn serve_all(listener: StdListener, shared: Arc<Shared>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            log::error!("dashboard: cannot listen: {e}");
            return;
        }
    };
    while !shared.stop.load(Ordering::Acquire) {
        let (stream, _) = match tokio::time::timeout(TICK, listener.accept()).await {
            Err(_) => continue,
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                log::warn!("dashboard: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if shared.open.load(Ordering::Acquire) >= shared.opts.max_connections {
            // Answered 503 without reading the request, within a second; as many refusals
            // at once as connections, past that closed outright.
            if shared.refusing.load(Ordering::Acquire) < shared.opts.max_connections {
                shared.refusing.fetch_add(1, Ordering::AcqRel);
                let s = shared.clone();
                tokio::spawn(async move {
                    refuse(stream).await;
                    s.refusing.fetch_sub(1, Ordering::AcqRel);
                });
            }
            continue;
        }
        shared.open.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        tokio::spawn(async move {
            connection(stream, &s).await;
            s.open.fetch_sub(1, Ordering::AcqRel);
        });
    }
    // Requests in progress finish within their deadline; idle connections see the flag.
    let until = Instant::now() + shared.opts.response_timeout;
    while shared.open.load(Ordering::Acquire) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Dropping `shared` (the job sender) ends the request threads once their queue drains.
}

/// Writes a 503 to a connection past the limit, then reads what it sent (so that closing
/// does not reset the connection before the client has read the answer), all within a
/// second.
async fn refuse(mut stream: TcpStream) {
    let resp = busy("the dashboard has as many connections open as it allows; try again");
    let deadline = Instant::now() + Duration::from_secs(1);
    if write_by(&mut stream, &head_bytes(&resp, false), deadline)
        .await
        .is_err()
    {
        return;
    }
    if let Body::Full(b) = &resp.body {
        if write_by(&mut stream, b, deadline).await.is_err() {
            return;
        }
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    while let Ok(Ok(n)) = timeout_at(deadline, stream.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}

fn busy(msg: &str) -> Response {
    Response::text(503, format!("{msg}\n")).header("Retry-After", "1")
}

/// Serves the requests of one connection, one after another.
async fn connection(mut stream: TcpStream, shared: &Shared) {
    let opts = &shared.opts;
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    for served in 0..MAX_REQUESTS_PER_CONNECTION {
        // Wait for the first byte of the next request: up to the read timeout for the
        // first, the keep-alive time for the others; an idle wait ends at a stop.
        if buf.is_empty() {
            let idle = if served == 0 {
                opts.read_timeout
            } else {
                opts.keep_alive
            };
            let until = Instant::now() + idle;
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                let now = Instant::now();
                if now >= until {
                    if served == 0 {
                        let resp = Response::text(408, "request head too slow\n");
                        let _ = write_response(
                            &mut stream,
                            resp,
                            false,
                            now + opts.read_timeout,
                            shared,
                        )
                        .await;
                    }
                    return;
                }
                match timeout_at(until.min(now + TICK), stream.readable()).await {
                    Err(_) => continue,
                    Ok(Err(_)) => return,
                    Ok(Ok(())) => {}
                }
                let mut chunk = [0u8; 4096];
                match stream.try_read(&mut chunk) {
                    Ok(0) => return,
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(_) => return,
                }
            }
        }
        let arrived = Instant::now();
        let req = match read_request(&mut stream, &mut buf, arrived + opts.read_timeout).await {
            Ok(r) => r,
            Err(ReadError::Io) => return,
            Err(ReadError::Status(status, msg)) => {
                let resp = Response::text(status, msg);
                let _ = write_response(
                    &mut stream,
                    resp,
                    false,
                    arrived + opts.response_timeout,
                    shared,
                )
                .await;
                return;
            }
        };
        let deadline = arrived + opts.response_timeout;
        let keep = wants_keep_alive(&req) && !shared.stop.load(Ordering::Acquire);
        let head = req.method == "HEAD";
        let mut resp = answer(req, deadline, shared).await;
        if head {
            // The length of what a GET would send, no body.
            let len = resp.len();
            resp.body = Body::Full(Vec::new());
            resp.headers.push(("Content-Length", len.to_string()));
        }
        let keep = keep && resp.status < 500;
        match write_response(&mut stream, resp, keep, deadline, shared).await {
            Ok(()) if keep => {}
            Ok(()) => {
                let _ = stream.shutdown().await;
                return;
            }
            Err(_) => {
                // Past its deadline, or a body that ended short: reset the connection, so
                // neither the kernel's buffer goes on feeding a slow reader nor a client
                // takes a cut body for a whole one.
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                return;
            }
        }
    }
}

/// Runs the handler on a request thread and waits for its answer until `deadline`.
async fn answer(req: Request, deadline: Instant, shared: &Shared) -> Response {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let handler = shared.handler.clone();
    let job: Job = Box::new(move || {
        if Instant::now() >= deadline {
            let _ = tx.send(busy(
                "the dashboard was too busy to answer within its deadline",
            ));
            return;
        }
        let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&req)));
        let resp = answered.unwrap_or_else(|_| {
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
        let _ = tx.send(resp);
    });
    match shared.jobs.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            return busy("the dashboard is busy: every request thread is taken; try again")
        }
        Err(TrySendError::Disconnected(_)) => return busy("the dashboard is stopping"),
    }
    match timeout_at(deadline, rx).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(_)) => busy("the dashboard is stopping"),
        Err(_) => Response::text(
            504,
            "the dashboard could not answer within its response deadline; try again\n",
        ),
    }
}

/// The next chunk of a stream, made on a request thread; `Err` when none could be made.
async fn next_chunk(
    next: NextChunk,
    deadline: Instant,
    shared: &Shared,
) -> io::Result<(NextChunk, Option<Vec<u8>>)> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut next = next;
    let mut job: Job = Box::new(move || {
        let chunk = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut next))
            .unwrap_or_else(|_| Err(io::Error::other("the body's producer panicked")));
        let _ = tx.send((next, chunk));
    });
    // A stream waits for a free thread (briefly, until its deadline) rather than fail.
    loop {
        match shared.jobs.try_send(job) {
            Ok(()) => break,
            Err(TrySendError::Full(j)) => {
                if Instant::now() >= deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                job = j;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(TrySendError::Disconnected(_)) => return Err(io::ErrorKind::BrokenPipe.into()),
        }
    }
    match timeout_at(deadline, rx).await {
        Ok(Ok((next, chunk))) => Ok((next, chunk?)),
        Ok(Err(_)) => Err(io::ErrorKind::BrokenPipe.into()),
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

fn wants_keep_alive(req: &Request) -> bool {
    let conn = req.header("connection").unwrap_or("").to_ascii_lowercase();
    !conn.contains("close") && req.header(":version") != Some("1.0") || conn.contains("keep-alive")
}

/// The status line and headers.
fn head_bytes(resp: &Response, keep: bool) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nConnection: {}\r\n\
         X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n\
         Referrer-Policy: no-referrer\r\nCache-Control: no-store\r\n",
        resp.status,
        reason(resp.status),
        if keep { "keep-alive" } else { "close" },
    );
    if !resp.headers.iter().any(|(n, _)| *n == "Content-Length") {
        head.push_str(&format!("Content-Length: {}\r\n", resp.len()));
    }
    for (name, value) in &resp.headers {
        // Values are ours, but a header must never be split by a stray line break.
        let value: String = value.chars().filter(|c| !c.is_control()).collect();
        head.push_str(name);
        head.push_str(": ");
        head.push_str(&value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// Writes `resp` before `deadline`; an error (or the deadline) means the connection is done.
async fn write_response(
    stream: &mut TcpStream,
    resp: Response,
    keep: bool,
    deadline: Instant,
    shared: &Shared,
) -> io::Result<()> {
    let head = head_bytes(&resp, keep);
    match resp.body {
        Body::Full(mut body) => {
            let mut all = head;
            all.append(&mut body);
            write_by(stream, &all, deadline).await?;
        }
        Body::Stream { len, mut next } => {
            write_by(stream, &head, deadline).await?;
            let mut sent = 0u64;
            loop {
                let (n, chunk) = next_chunk(next, deadline, shared).await?;
                next = n;
                let Some(chunk) = chunk else { break };
                // Never more than announced: the connection would be out of step.
                let room = (len - sent).min(chunk.len() as u64) as usize;
                sent += room as u64;
                let mut chunk = chunk;
                chunk.truncate(room);
                write_by(stream, &chunk, deadline).await?;
                if sent == len {
                    break;
                }
            }
            if sent < len {
                // The body ended short (its row changed meanwhile): the client must see a
                // cut connection, not a complete response.
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
    timeout_at(deadline, stream.flush())
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// Writes all of `bytes` before `deadline`.
async fn write_by(stream: &mut TcpStream, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    timeout_at(deadline, stream.write_all(bytes))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

enum ReadError {
    /// The client went away or stalled: nothing worth answering.
    Io,
    Status(u16, &'static str),
}

/// Reads one request from `buf` and the stream; the whole of it must arrive before
/// `deadline`. Bytes past it stay in `buf` (the next request of the connection).
async fn read_request(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Request, ReadError> {
    let mut chunk = [0u8; 4096];
    loop {
        let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut hs);
        match req.parse(buf) {
            Ok(httparse::Status::Complete(len)) => {
                let mut headers: HashMap<String, String> = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                if req.version == Some(0) {
                    headers.insert(":version".to_owned(), "1.0".to_owned());
                }
                let method = req.method.unwrap_or("GET").to_owned();
                let target = req.path.unwrap_or("/").to_owned();
                let body_len: usize = match headers.get("content-length") {
                    None => 0,
                    Some(v) => v
                        .trim()
                        .parse()
                        .map_err(|_| ReadError::Status(400, "bad content-length\n"))?,
                };
                if body_len > MAX_BODY {
                    return Err(ReadError::Status(413, "request body too large\n"));
                }
                if headers.contains_key("transfer-encoding") {
                    return Err(ReadError::Status(400, "chunked bodies are not accepted\n"));
                }
                while buf.len() < len + body_len {
                    read_more(stream, buf, &mut chunk, deadline, "request body too slow\n").await?;
                }
                let rest = buf.split_off(len + body_len);
                let body = buf[len..].to_vec();
                *buf = rest;
                return Ok(Request::new(&method, &target, headers, body));
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
        read_more(stream, buf, &mut chunk, deadline, "request head too slow\n").await?;
    }
}

async fn read_more(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
    deadline: Instant,
    slow: &'static str,
) -> Result<(), ReadError> {
    match timeout_at(deadline, stream.read(chunk)).await {
        Err(_) => Err(ReadError::Status(408, slow)),
        Ok(Ok(0)) | Ok(Err(_)) => Err(ReadError::Io),
        Ok(Ok(n)) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
    }
}

/// Parses `bytes` as the requests of one connection, as the server reads them from a
/// socket, until one fails (`Err` holds the status it is answered with, 0 for none): the
/// fuzz targets' way in (fuzz/fuzz_targets/http_request.rs).
#[cfg(feature = "fuzzing")]
pub(crate) fn requests_from_bytes(bytes: &[u8]) -> Vec<std::result::Result<Request, u16>> {
    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
    }
    RT.with(|rt| {
        rt.block_on(async {
            let mut stream = bytes;
            let mut buf = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut out = Vec::new();
            while out.len() < MAX_REQUESTS_PER_CONNECTION {
                match read_request(&mut stream, &mut buf, deadline).await {
                    Ok(req) => out.push(Ok(req)),
                    Err(e) => {
                        out.push(Err(match e {
                            ReadError::Status(code, _) => code,
                            ReadError::Io => 0,
                        }));
                        break;
                    }
                }
            }
            out
        })
    })
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
    use std::io::{Read, Write};

    fn opts(threads: usize) -> ServerOptions {
        ServerOptions {
            threads,
            read_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            keep_alive: Duration::from_secs(5),
            max_connections: 64,
        }
    }

    /// Sends one GET and returns the response's status line.
    fn status_line(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
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
        let server = Server::start(
            "127.0.0.1:0".parse().unwrap(),
            opts(1),
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
    fn one_connection_serves_requests_one_after_another_and_streams_a_body() {
        let server = Server::start(
            "127.0.0.1:0".parse().unwrap(),
            opts(1),
            Arc::new(|req: &Request| {
                if req.path == "/stream" {
                    let mut n = 0;
                    return Response {
                        status: 200,
                        headers: vec![],
                        body: Body::Stream {
                            len: 9,
                            next: Box::new(move || {
                                n += 1;
                                Ok((n <= 3).then(|| b"abc".to_vec()))
                            }),
                        },
                    };
                }
                Response::text(200, format!("path {}\n", req.path))
            }),
        )
        .unwrap();
        let mut s = std::net::TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Two requests in one write (pipelined), then a third that closes.
        s.write_all(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /stream HTTP/1.1\r\nHost: x\r\n\r\n\
              GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 3, "{out}");
        assert!(
            out.contains("path /a\n") && out.contains("\r\n\r\nabcabcabc"),
            "{out}"
        );
        assert!(
            out.contains("path /c\n") && out.contains("Connection: close"),
            "{out}"
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
