//! One TLS session: the connector tokio-postgres calls, the stream it reads and writes, and
//! what to say when the handshake fails.
//!
//! Owns [`RustlsConnect`] (one per connection attempt, consumed by the handshake),
//! [`RustlsStream`] (which gives SCRAM its `tls-server-end-point` channel binding, read from
//! the server's certificate), and [`TlsWatch`], a handle that outlives the connector and
//! records the handshake's stage: not started, started, done.
//!
//! Fails as the handshake fails, with rustls's errors inside an `io::Error`;
//! [`TlsWatch::explain`] turns them into `Tls` errors that say which certificate was not
//! trusted and why, or which alert the server sent, and a deadline that fired mid-handshake
//! into a `Timeout` named "tls handshake".

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect};

use super::{SslMode, Trust};
use crate::conn::target::Stream;
use crate::error::{Error, ErrorKind};

const NOT_STARTED: u8 = 0;
const STARTED: u8 = 1;
const DONE: u8 = 2;

/// Wraps one socket in a TLS session, once the server has agreed to one. tokio-postgres
/// calls it from inside `connect_raw`, so the handshake runs under the connect deadline on a
/// socket the watchdog already holds.
pub(crate) struct RustlsConnect {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    watch: TlsWatch,
}

impl RustlsConnect {
    /// The connector for one attempt to reach `host`; its failures are explained in the
    /// terms of the `mode` and `trust` it was made under.
    pub(super) fn new(
        config: Arc<ClientConfig>,
        server_name: ServerName<'static>,
        host: String,
        mode: SslMode,
        trust: Trust,
    ) -> RustlsConnect {
        RustlsConnect {
            config,
            server_name,
            watch: TlsWatch {
                host,
                mode,
                trust,
                stage: Arc::new(AtomicU8::new(NOT_STARTED)),
            },
        }
    }

    /// A handle that outlives the connector (which the handshake consumes) to tell what
    /// failed.
    pub(crate) fn watch(&self) -> TlsWatch {
        self.watch.clone()
    }
}

impl TlsConnect<Stream> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream>> + Send>>;

    fn connect(self, stream: Stream) -> Self::Future {
        let stage = self.watch.stage;
        stage.store(STARTED, Ordering::Relaxed);
        let handshake =
            tokio_rustls::TlsConnector::from(self.config).connect(self.server_name, stream);
        Box::pin(async move {
            let tls = handshake.await?;
            stage.store(DONE, Ordering::Relaxed);
            Ok(RustlsStream(tls))
        })
    }
}

/// Turns the errors of a TLS connection attempt into messages that say what failed.
#[derive(Clone, Debug)]
pub(crate) struct TlsWatch {
    host: String,
    mode: SslMode,
    trust: Trust,
    stage: Arc<AtomicU8>,
}

impl TlsWatch {
    /// Explains a failed startup: an untrusted certificate, a server without TLS under
    /// `require` or stricter, a refused handshake (kind `Tls`), or a stalled handshake
    /// (kind `Timeout`, "tls handshake"). Other errors pass unchanged.
    pub(crate) fn explain(&self, e: Error) -> Error {
        if e.kind() == ErrorKind::Timeout {
            return if self.stage.load(Ordering::Relaxed) == STARTED {
                Error::new(ErrorKind::Timeout, "tls handshake")
            } else {
                e
            };
        }
        let Some(source) = StdError::source(&e) else {
            return e;
        };
        if let Some(tls) = find_rustls_error(source) {
            return Error::new(ErrorKind::Tls, self.describe(tls));
        }
        let mut cause = Some(source);
        while let Some(c) = cause {
            if c.to_string() == "server does not support TLS" {
                return Error::new(
                    ErrorKind::Tls,
                    format!(
                        "tls: server does not support TLS but sslmode={}",
                        self.mode.as_str()
                    ),
                );
            }
            cause = c.source();
        }
        e
    }

    fn describe(&self, e: &rustls::Error) -> String {
        let host = &self.host;
        match e {
            rustls::Error::InvalidCertificate(ce) => {
                format!(
                    "tls: certificate of {host} not trusted: {}",
                    self.certificate_problem(ce)
                )
            }
            rustls::Error::AlertReceived(alert) => {
                use rustls::AlertDescription as A;
                let hint = match alert {
                    A::CertificateRequired => {
                        ": it wants a client certificate (give sslcert and sslkey)"
                    }
                    A::BadCertificate
                    | A::UnknownCA
                    | A::CertificateUnknown
                    | A::CertificateExpired
                    | A::CertificateRevoked
                    | A::UnsupportedCertificate => ": it does not accept our client certificate",
                    A::NoApplicationProtocol => ": it does not accept the ALPN name postgresql",
                    _ => "",
                };
                format!("tls: {host} refused the handshake ({alert:?} alert){hint}")
            }
            other => format!("tls: handshake with {host} failed: {other}"),
        }
    }

    fn certificate_problem(&self, e: &CertificateError) -> String {
        use CertificateError as C;
        let host = &self.host;
        match e {
            C::UnknownIssuer => format!(
                "it is not signed by a root in {} (it is self-signed, or its authority is unknown)",
                self.trust
            ),
            C::NotValidForName => format!("it is not valid for the name {host}"),
            C::NotValidForNameContext { presented, .. } if presented.is_empty() => {
                format!("it is not valid for the name {host} (it has neither a subjectAltName nor a CN)")
            }
            C::NotValidForNameContext { presented, .. } => format!(
                "it is not valid for the name {host} (it names {})",
                presented
                    .iter()
                    .map(|n| plain_name(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            C::Expired | C::ExpiredContext { .. } => "it has expired".to_owned(),
            C::NotValidYet | C::NotValidYetContext { .. } => "it is not valid yet".to_owned(),
            C::BadSignature => "its signature does not verify".to_owned(),
            C::Revoked => "it has been revoked".to_owned(),
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
                "it is not meant for a TLS server".to_owned()
            }
            other => other.to_string(),
        }
    }
}

/// `localhost` for webpki's `DnsName("localhost")`, `127.0.0.1` for `IpAddress(127.0.0.1)`.
fn plain_name(presented: &str) -> &str {
    presented
        .strip_prefix("DnsName(\"")
        .and_then(|n| n.strip_suffix("\")"))
        .or_else(|| {
            presented
                .strip_prefix("IpAddress(")
                .and_then(|n| n.strip_suffix(')'))
        })
        .unwrap_or(presented)
}

/// The rustls error in a chain of causes (tokio-rustls wraps it in an `io::Error`, whose
/// `source()` skips it).
fn find_rustls_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = c
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        cause = c.source();
    }
    None
}

/// A TLS session over one of our sockets.
pub(crate) struct RustlsStream(tokio_rustls::client::TlsStream<Stream>);

impl AsyncRead for RustlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl tokio_postgres::tls::TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| server_end_point(cert))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

/// The `tls-server-end-point` channel binding (RFC 5929): the server's certificate hashed
/// with the hash of its own signature, SHA-256 standing in for MD5 and SHA-1, as PostgreSQL
/// computes it. None for signatures without a single hash (RSA-PSS, Ed25519): SCRAM then
/// runs without channel binding, unless the URL says `channel_binding=require`.
fn server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    use ring::digest;
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03];
    let oid = signature_algorithm(cert)?;
    let algorithm = if let Some(n) = oid.strip_prefix(RSA) {
        match n {
            // md5, sha1, sha256WithRSAEncryption
            [0x04] | [0x05] | [0x0b] => &digest::SHA256,
            [0x0c] => &digest::SHA384,
            [0x0d] => &digest::SHA512,
            _ => return None,
        }
    } else if oid == ECDSA_SHA1 {
        &digest::SHA256
    } else if let Some(n) = oid.strip_prefix(ECDSA_SHA2) {
        match n {
            [0x02] => &digest::SHA256,
            [0x03] => &digest::SHA384,
            [0x04] => &digest::SHA512,
            _ => return None,
        }
    } else {
        return None;
    };
    Some(digest::digest(algorithm, cert).as_ref().to_vec())
}

/// The OID of `signatureAlgorithm` in a DER certificate:
/// `SEQUENCE { tbsCertificate SEQUENCE, signatureAlgorithm SEQUENCE { OID, .. }, .. }`.
fn signature_algorithm(cert: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (SEQUENCE, certificate, _) = der_element(cert)? else {
        return None;
    };
    let (SEQUENCE, _tbs, rest) = der_element(certificate)? else {
        return None;
    };
    let (SEQUENCE, algorithm, _) = der_element(rest)? else {
        return None;
    };
    let (OID, oid, _) = der_element(algorithm)? else {
        return None;
    };
    Some(oid)
}

/// One DER element: its tag, its contents, and what follows it.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (len, rest) = rest.split_at(n);
        (
            len.iter()
                .fold(0usize, |acc, &b| (acc << 8) | usize::from(b)),
            rest,
        )
    };
    if rest.len() < len {
        return None;
    }
    let (contents, rest) = rest.split_at(len);
    Some((tag, contents, rest))
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    use super::super::fixtures::{ROOT_PEM, ROOT_SHA256};
    use super::*;

    #[test]
    fn errors_are_explained() {
        let watch = TlsWatch {
            host: "db.example".into(),
            mode: SslMode::VerifyFull,
            trust: Trust::System,
            stage: Arc::new(AtomicU8::new(STARTED)),
        };
        let timeout = watch.explain(Error::new(ErrorKind::Timeout, "startup handshake"));
        assert_eq!(timeout.kind(), ErrorKind::Timeout);
        assert_eq!(timeout.to_string(), "tls handshake");
        watch.stage.store(DONE, Ordering::Relaxed);
        let timeout = watch.explain(Error::new(ErrorKind::Timeout, "startup handshake"));
        assert_eq!(timeout.to_string(), "startup handshake");

        let untrusted = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let wrapped = Error::with_source(
            ErrorKind::Connect,
            "",
            io::Error::new(io::ErrorKind::InvalidData, untrusted),
        );
        let e = watch.explain(wrapped);
        assert_eq!(e.kind(), ErrorKind::Tls);
        assert_eq!(
            e.to_string(),
            "tls: certificate of db.example not trusted: it is not signed by a root in the \
             system's root certificates (it is self-signed, or its authority is unknown)"
        );

        let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: ServerName::try_from("db.example").unwrap().to_owned(),
            presented: vec![
                "DnsName(\"other.example\")".into(),
                "IpAddress(10.0.0.1)".into(),
            ],
        });
        let e = watch.explain(Error::with_source(ErrorKind::Connect, "", name));
        assert_eq!(
            e.to_string(),
            "tls: certificate of db.example not trusted: it is not valid for the name \
             db.example (it names other.example, 10.0.0.1)"
        );

        #[derive(Debug)]
        struct Text(&'static str);
        impl fmt::Display for Text {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }
        impl StdError for Text {}
        let e = watch.explain(Error::with_source(
            ErrorKind::Connect,
            "",
            Text("server does not support TLS"),
        ));
        assert_eq!(e.kind(), ErrorKind::Tls);
        assert_eq!(
            e.to_string(),
            "tls: server does not support TLS but sslmode=verify-full"
        );

        let other = Error::new(ErrorKind::Connect, "connection refused");
        assert_eq!(watch.explain(other).kind(), ErrorKind::Connect);
    }

    #[test]
    fn channel_binding_hashes_with_the_signature_hash() {
        let der = CertificateDer::from_pem_slice(ROOT_PEM.as_bytes()).unwrap();
        let hash = server_end_point(&der).expect("ecdsa-with-SHA256 has a hash");
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, ROOT_SHA256);
        assert_eq!(
            signature_algorithm(&der),
            Some(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02][..])
        );
        // Truncated or foreign input: no binding, never a panic.
        for cut in [0, 1, 2, 10, der.len() / 2, der.len() - 1] {
            assert!(server_end_point(&der[..cut]).is_none(), "cut at {cut}");
        }
        assert!(server_end_point(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
    }
}
