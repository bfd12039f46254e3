//! Where a connection goes and what carries it: the plain types shared by the socket code,
//! TLS and the client.
//!
//! Owns: [`Target`] (one address to try: a TCP address with the host name it came from, or a
//! Unix socket path) and [`Stream`] (a connected socket of either family, as tokio-postgres
//! and the TLS layer read and write it). A leaf: it depends on nothing else in `conn`, so
//! that `options`, `tls` and `socket` can all use it without depending on one another.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where one connection attempt goes.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Tcp {
        addr: SocketAddr,
        /// The host name as written in the connection string (for TLS and messages).
        host: String,
    },
    Unix {
        path: PathBuf,
    },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp { addr, host } if host == &addr.ip().to_string() => write!(f, "{addr}"),
            Target::Tcp { addr, host } => write!(f, "{host} ({addr})"),
            Target::Unix { path } => write!(f, "{}", path.display()),
        }
    }
}

/// A connected stream of either family.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Turns a host name and port into addresses (getaddrinfo; tests put in one that stalls).
pub(crate) type Resolver = fn(&str, u16) -> std::io::Result<Vec<std::net::SocketAddr>>;

/// The system's resolver (getaddrinfo).
pub(crate) fn system_resolver(name: &str, port: u16) -> std::io::Result<Vec<std::net::SocketAddr>> {
    use std::net::ToSocketAddrs;
    (name, port).to_socket_addrs().map(|a| a.collect())
}
