//! The dashboard as a plain function from a request to a response
//! ([`DashboardHandler::handle`]), for a program that mounts it in its own web server under
//! a path, beside the standalone server of [`Dashboard::spawn`](super::Dashboard::spawn).
//!
//! The types are the crate's own (no web framework's): a [`DashboardRequest`] built from
//! the method, the path with its query, the headers and the body; a [`DashboardResponse`]
//! with a status, headers and a body that implements `std::io::Read`: bytes in memory for
//! a page, or, for the download of a job's raw arguments, a stream read from the database
//! 256 KiB at a time as the host's server reads it. Every page is bounded as it is under
//! the standalone server (the host's server bounds connections, reads and writes).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use super::http::{self, Body, NextChunk};
use super::pages;

/// A request for [`DashboardHandler::handle`].
///
/// ```
/// let req = postpone::DashboardRequest::new("GET", "/admin/queue/jobs?status=failed")
///     .header("Host", "localhost:3000");
/// assert_eq!(req.method(), "GET");
/// ```
#[derive(Clone, Debug)]
pub struct DashboardRequest {
    method: String,
    target: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl DashboardRequest {
    /// A request for `target`: the path as the client sent it (under the handler's base
    /// path), with its query if any.
    pub fn new(method: &str, target: &str) -> DashboardRequest {
        DashboardRequest {
            method: method.to_ascii_uppercase(),
            target: target.to_owned(),
            headers: HashMap::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header (the names are compared without case; a repeated one replaces the
    /// earlier). The dashboard reads `Host`, `Origin`, `Cookie`, `Authorization`,
    /// `Content-Type` and `Connection`.
    pub fn header(mut self, name: &str, value: &str) -> DashboardRequest {
        self.headers
            .insert(name.to_ascii_lowercase(), value.to_owned());
        self
    }

    /// The body (a form's fields, for the dashboard's POST actions; at most 64 KiB are
    /// read, see [`DashboardHandler::handle`]).
    pub fn body(mut self, body: Vec<u8>) -> DashboardRequest {
        self.body = body;
        self
    }

    /// Its method, in upper case.
    pub fn method(&self) -> &str {
        &self.method
    }
}

/// The answer of [`DashboardHandler::handle`]: a status, headers and a body to read.
pub struct DashboardResponse {
    status: u16,
    headers: Vec<(String, String)>,
    len: u64,
    body: BodyReader,
}

impl std::fmt::Debug for DashboardResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashboardResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("len", &self.len)
            .finish()
    }
}

impl DashboardResponse {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The headers to send (`Content-Type`, the security headers, `Location`...), without
    /// `Content-Length`: see [`len`](Self::len).
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The length of the body in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body, to read to its end (a streamed body makes a database round-trip per
    /// 256 KiB, so read it on a thread that may block). A stream that cannot go on (the
    /// job was deleted meanwhile) ends with an error, never short of
    /// [`len`](Self::len) in silence.
    pub fn into_body(self) -> BodyReader {
        self.body
    }
}

/// The body of a [`DashboardResponse`]; implements `std::io::Read`.
pub struct BodyReader {
    buf: Vec<u8>,
    pos: usize,
    next: Option<NextChunk>,
    left: u64,
}

impl io::Read for BodyReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.buf.len() {
            let Some(next) = self.next.as_mut() else {
                return Ok(0);
            };
            match next()? {
                Some(chunk) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                None => {
                    self.next = None;
                    if self.left > 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the dashboard's body ended before its length",
                        ));
                    }
                    return Ok(0);
                }
            }
        }
        let n = out
            .len()
            .min(self.buf.len() - self.pos)
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if n == 0 && self.left == 0 {
            return Ok(0);
        }
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        self.left -= n as u64;
        Ok(n)
    }
}

/// The dashboard as a function from a request to a response, from
/// [`Dashboard::handler`](super::Dashboard::handler). Cheap to clone; `Send + Sync`.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// use std::io::Read;
/// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let dashboard = postpone::Dashboard::new(&app).base_path("/admin/queue").handler()?;
/// // In the host's server, for every request under /admin/queue:
/// let resp = dashboard.handle(
///     postpone::DashboardRequest::new("GET", "/admin/queue/jobs").header("Host", "localhost"),
/// );
/// let mut page = String::new();
/// resp.into_body().read_to_string(&mut page).unwrap();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DashboardHandler {
    pub(crate) state: Arc<pages::State>,
}

impl std::fmt::Debug for DashboardHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DashboardHandler({:?})", self.state.base)
    }
}

impl DashboardHandler {
    /// Answers one request. Its path must lie under the base path (a 404 otherwise). A
    /// body over 64 KiB is refused (413), as the standalone server does. Blocks for the
    /// database round-trips of the page (each under the App's `io_timeout`).
    pub fn handle(&self, req: DashboardRequest) -> DashboardResponse {
        let resp = if req.body.len() > 64 * 1024 {
            http::Response::text(413, "request body too large\n")
        } else {
            let r = http::Request::new(&req.method, &req.target, req.headers, req.body);
            pages::handle(&self.state, &r)
        };
        let len = resp.len();
        let head = req.method == "HEAD";
        let mut headers: Vec<(String, String)> = vec![
            ("X-Content-Type-Options".into(), "nosniff".into()),
            ("X-Frame-Options".into(), "DENY".into()),
            ("Referrer-Policy".into(), "no-referrer".into()),
            ("Cache-Control".into(), "no-store".into()),
        ];
        headers.extend(resp.headers.into_iter().map(|(k, v)| {
            (
                k.to_owned(),
                v.chars().filter(|c| !c.is_control()).collect(),
            )
        }));
        let body = match resp.body {
            _ if head => BodyReader {
                buf: Vec::new(),
                pos: 0,
                next: None,
                left: 0,
            },
            Body::Full(b) => BodyReader {
                left: b.len() as u64,
                buf: b,
                pos: 0,
                next: None,
            },
            Body::Stream { len, next } => BodyReader {
                buf: Vec::new(),
                pos: 0,
                next: Some(next),
                left: len,
            },
        };
        DashboardResponse {
            status: resp.status,
            headers,
            len: if head { 0 } else { len },
            body,
        }
    }
}
