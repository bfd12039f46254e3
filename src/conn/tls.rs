//! TLS: the `ssl*` settings of a connection string, and a rustls connector for tokio-postgres.
//!
//! Owns: taking `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `sslsni` and
//! `ssl_min/max_protocol_version` out of a URL or key=value string before tokio-postgres
//! parses it (it knows only `disable`, `prefer` and `require`), building one rustls client
//! configuration per connection string, and the connector that wraps each socket in a TLS
//! session once the server agrees to one.
//!
//! Modes follow libpq:
//! - `disable`: plain text.
//! - `prefer` (the default, like libpq; `allow` is read as `prefer`): TLS when the server
//!   offers it, plain text when it does not; the certificate is not checked.
//! - `require`: TLS or fail; the certificate is not checked. As in libpq, `require` (and
//!   `prefer`) with an `sslrootcert` file check the chain as `verify-ca` does.
//! - `verify-ca`: the chain must lead to a root of `sslrootcert`, or of the system's store
//!   when no `sslrootcert` is given; the host name is not checked.
//! - `verify-full`: `verify-ca`, and the certificate must name the host (`host`, also when
//!   `hostaddr` says where to connect). `sslrootcert=system` means the system's store and, as
//!   in libpq, implies `verify-full` and allows no weaker mode.
//!
//! The system's store is the operating system's (through rustls-native-certs: on Linux the
//! OpenSSL locations, `SSL_CERT_FILE` and `SSL_CERT_DIR` honoured), read once per process.
//! Files named in the string are read when the string is parsed, so that a wrong path is an
//! error of kind `Config` at once, not at the first connect. Unix-socket targets never use
//! TLS (libpq does not either), whatever the mode. With a certificate from `sslcert`/`sslkey`
//! the server can authenticate us (`cert` in pg_hba.conf). SCRAM gets `tls-server-end-point`
//! channel binding, so `channel_binding=require` works.
//!
//! Departures from libpq, all on the side of failing loudly: no `PGSSL*` environment
//! variables and no `~/.postgresql/` defaults; `prefer` does not retry in plain text after a
//! failed TLS handshake (it falls back only when the server declines TLS); `sslpassword`,
//! `sslcrl`, `sslcrldir`, `sslkeylogfile`, `sslcertmode` other than `allow` and `gssencmode=require`
//! are rejected rather than ignored (`sslcompression` is ignored, as libpq 14+ does). TLS 1.2
//! and 1.3 only (the server's minimum by default since PostgreSQL 13). The ALPN name
//! `postgresql` is always offered, so `sslnegotiation=direct` (PostgreSQL 17) works.
//!
//! Fails with `Config` (bad values or files, when parsing) and `Tls` (certificate not
//! trusted, server declines TLS under `require` or stricter, handshake refused); a handshake
//! that stalls is a `Timeout` naming `connect_timeout`, like the rest of the startup.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use percent_encoding::percent_decode_str;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect};

use super::socket::{Stream, Target};
use crate::error::{Error, ErrorKind, Result};

/// How a connection negotiates TLS, as libpq's `sslmode`; set in the URL (`?sslmode=...`) or
/// with [`AppBuilder::ssl_mode`](crate::AppBuilder::ssl_mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS if the server offers it, plain text otherwise; the certificate is not checked
    /// (unless an `sslrootcert` is given). The default.
    Prefer,
    /// TLS or nothing; the certificate is not checked (unless an `sslrootcert` is given).
    Require,
    /// TLS, with a certificate signed by a trusted root (`sslrootcert`, else the system's).
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            // libpq's `allow` tries plain text first; tokio-postgres cannot, and TLS first is
            // the safer of the two orders.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(config_error(format!(
                    "sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to ask for TLS, and whether a refusal is fatal.
    fn for_driver(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => "require",
        }
    }
}

/// Which certificates a server may present.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Trust {
    /// Any certificate (`prefer`, `require`): encryption without authentication, as in libpq.
    Any,
    /// One chaining to the system's roots.
    System,
    /// One chaining to a root in this file.
    File(PathBuf),
}

impl fmt::Display for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trust::Any => f.write_str("any certificate"),
            Trust::System => f.write_str("the system's root certificates"),
            Trust::File(p) => write!(f, "sslrootcert {}", p.display()),
        }
    }
}

/// How a connection negotiates TLS: parsed once per connection string.
#[derive(Clone)]
pub(crate) struct TlsSettings {
    raw: Raw,
    mode: SslMode,
    trust: Trust,
    check_name: bool,
    /// None for `disable`.
    config: Option<Arc<ClientConfig>>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("mode", &self.mode)
            .field("trust", &self.trust)
            .field("check_name", &self.check_name)
            .field(
                "client_cert",
                &self
                    .config
                    .as_ref()
                    .is_some_and(|c| c.client_auth_cert_resolver.has_certs()),
            )
            .finish()
    }
}

/// The TLS parameters as written, before they are checked.
#[derive(Clone, Default)]
struct Raw {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslcert: Option<String>,
    sslkey: Option<String>,
    sslsni: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
}

impl Raw {
    /// Takes `key = value` if the key is ours; returns false for the other keys.
    fn take(&mut self, key: &str, value: String) -> Result<bool> {
        let slot = match key {
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslcert" => &mut self.sslcert,
            "sslkey" => &mut self.sslkey,
            "sslsni" => &mut self.sslsni,
            "ssl_min_protocol_version" => &mut self.min_version,
            "ssl_max_protocol_version" => &mut self.max_version,
            // Ignored by libpq itself since PostgreSQL 14: compression is always off.
            "sslcompression" => return Ok(true),
            // GSSAPI encryption is never used, so `prefer` comes to `disable`.
            "gssencmode" if value == "disable" || value == "prefer" => return Ok(true),
            // A client certificate is sent when one is given and the server asks for it.
            "sslcertmode" if value == "allow" => return Ok(true),
            "gssencmode" | "sslcertmode" => {
                return Err(config_error(format!(
                    "{key}={value} is not supported by postpone"
                )));
            }
            "sslpassword" | "sslcrl" | "sslcrldir" | "requiressl" | "sslkeylogfile" => {
                let hint = match key {
                    "requiressl" => " (write sslmode=require)",
                    "sslpassword" => " (decrypt the key file instead)",
                    _ => "",
                };
                return Err(config_error(format!(
                    "{key} is not supported by postpone{hint}"
                )));
            }
            _ => return Ok(false),
        };
        // Later settings win, as in libpq.
        *slot = Some(value);
        Ok(true)
    }

    /// The TLS versions allowed by `ssl_min_protocol_version` and `ssl_max_protocol_version`
    /// (libpq's names, any case), of the two rustls has: 1.2 and 1.3.
    fn versions(&self) -> Result<Vec<&'static rustls::SupportedProtocolVersion>> {
        fn parse(key: &str, value: Option<&str>) -> Result<Option<u8>> {
            let Some(v) = value.filter(|v| !v.is_empty()) else {
                return Ok(None);
            };
            let minor = ["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"]
                .iter()
                .position(|name| name.eq_ignore_ascii_case(v))
                .ok_or_else(|| {
                    config_error(format!(
                        "{key} {v:?} is not one of TLSv1, TLSv1.1, TLSv1.2, TLSv1.3"
                    ))
                })?;
            Ok(Some(minor as u8))
        }
        let min = parse("ssl_min_protocol_version", self.min_version.as_deref())?.unwrap_or(0);
        let max = parse("ssl_max_protocol_version", self.max_version.as_deref())?.unwrap_or(3);
        if min > max {
            return Err(config_error(
                "ssl_min_protocol_version is above ssl_max_protocol_version",
            ));
        }
        let versions: Vec<_> = [(2, &rustls::version::TLS12), (3, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(minor, _)| (min..=max).contains(minor))
            .map(|(_, v)| v)
            .collect();
        if versions.is_empty() {
            return Err(config_error(
                "ssl_max_protocol_version below TLSv1.2 leaves no version postpone supports \
                 (TLS 1.2 and 1.3)",
            ));
        }
        Ok(versions)
    }
}

impl TlsSettings {
    /// Takes the TLS parameters that tokio-postgres does not know out of a connection string
    /// (URL or key=value), and returns the string that is left, with `sslmode` rewritten to
    /// one that tokio-postgres understands, plus the settings.
    ///
    /// A string whose syntax is broken is returned as it is, for tokio-postgres to report.
    pub(crate) fn extract(url: &str) -> Result<(String, TlsSettings)> {
        let Some((raw, rest)) = take_tls_params(url)? else {
            return Ok((url.to_owned(), TlsSettings::plain_default()));
        };
        let settings = TlsSettings::from_raw(raw)?;
        Ok((rest.with_mode(settings.mode.for_driver()), settings))
    }

    /// The settings of a string that does not parse (it is rejected right after).
    fn plain_default() -> TlsSettings {
        TlsSettings {
            raw: Raw::default(),
            mode: SslMode::Disable,
            trust: Trust::Any,
            check_name: false,
            config: None,
        }
    }

    /// These settings with a mode, root file or client certificate set by the builder, which
    /// win over the connection string's.
    pub(crate) fn with_overrides(
        &self,
        mode: Option<SslMode>,
        root: Option<&Path>,
        client: Option<(&Path, &Path)>,
    ) -> Result<TlsSettings> {
        let mut raw = self.raw.clone();
        if let Some(m) = mode {
            raw.sslmode = Some(m.as_str().to_owned());
        }
        let text = |p: &Path| {
            p.to_str()
                .map(str::to_owned)
                .ok_or_else(|| config_error(format!("path {} is not valid UTF-8", p.display())))
        };
        if let Some(r) = root {
            raw.sslrootcert = Some(text(r)?);
        }
        if let Some((cert, key)) = client {
            raw.sslcert = Some(text(cert)?);
            raw.sslkey = Some(text(key)?);
        }
        TlsSettings::from_raw(raw)
    }

    /// The mode tokio-postgres must be told.
    pub(crate) fn driver_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }

    fn from_raw(raw: Raw) -> Result<TlsSettings> {
        let root = match raw.sslrootcert.as_deref() {
            None | Some("") => None,
            Some(r) => Some(r),
        };
        let mode = match raw.sslmode.as_deref() {
            Some(m) => SslMode::parse(m)?,
            // libpq: sslrootcert=system makes verify-full the default.
            None if root == Some("system") => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        if root == Some("system") && mode != SslMode::VerifyFull {
            return Err(config_error(format!(
                "sslmode {} may not be used with sslrootcert=system (use verify-full)",
                raw.sslmode.as_deref().unwrap_or_default()
            )));
        }
        let sni = match raw.sslsni.as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => {
                return Err(config_error(format!("sslsni {other:?} is not 0 or 1")));
            }
        };
        let client = match (non_empty(&raw.sslcert), non_empty(&raw.sslkey)) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((Path::new(cert), Path::new(key))),
            (Some(_), None) => {
                return Err(config_error(
                    "sslcert is given without sslkey (give both, or neither)",
                ))
            }
            (None, Some(_)) => {
                return Err(config_error(
                    "sslkey is given without sslcert (give both, or neither)",
                ))
            }
        };
        let trust = match (mode, root) {
            (_, Some("system")) => Trust::System,
            (SslMode::Disable, _) => Trust::Any,
            (_, Some(path)) => Trust::File(PathBuf::from(path)),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => Trust::System,
            (_, None) => Trust::Any,
        };
        let check_name = mode == SslMode::VerifyFull;
        let versions = raw.versions()?;
        let config = if mode == SslMode::Disable {
            None
        } else {
            Some(Arc::new(client_config(
                &trust, check_name, client, sni, &versions,
            )?))
        };
        Ok(TlsSettings {
            raw,
            mode,
            trust,
            check_name,
            config,
        })
    }

    /// The TLS connector for one target, or `None` for a plain connection (`disable`, or a
    /// Unix socket).
    pub(crate) fn connector(&self, target: &Target) -> Result<Option<RustlsConnect>> {
        let Some(config) = &self.config else {
            return Ok(None);
        };
        let Target::Tcp { addr, host } = target else {
            return Ok(None);
        };
        let server_name = match ServerName::try_from(host.clone()) {
            Ok(name) => name,
            // A host that is not a valid DNS name for rustls can still be used when the
            // certificate's names are not checked: go by the address, without SNI.
            Err(_) if !self.check_name => ServerName::IpAddress(addr.ip().into()),
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::Tls,
                    format!("tls: host name {host:?} cannot be checked against a certificate (sslmode=verify-full): {e}"),
                ))
            }
        };
        Ok(Some(RustlsConnect {
            config: config.clone(),
            server_name,
            watch: TlsWatch {
                host: host.clone(),
                mode: self.mode,
                trust: self.trust.clone(),
                stage: Arc::new(AtomicU8::new(NOT_STARTED)),
            },
        }))
    }
}

/// Splits the TLS parameters off a connection string: what they say, and the rest of the
/// string. None when the string's syntax is broken.
fn take_tls_params(url: &str) -> Result<Option<(Raw, Rest<'_>)>> {
    let mut raw = Raw::default();
    let rest = match split_url(url) {
        Some((head, query)) => {
            let mut kept = Vec::new();
            for segment in query.split('&').filter(|s| !s.is_empty()) {
                let ours = match segment.split_once('=') {
                    Some((k, v)) => match (decode(k), decode(v)) {
                        (Some(k), Some(v)) => raw.take(&k, v)?,
                        (Some(k), None) if is_ours(&k) => {
                            return Err(config_error(format!(
                                "{k} is not valid UTF-8 once percent-decoded"
                            )))
                        }
                        _ => false,
                    },
                    None => false,
                };
                if !ours {
                    kept.push(segment);
                }
            }
            Rest::Url { head, kept }
        }
        None => {
            let Some(params) = parse_key_values(url) else {
                return Ok(None);
            };
            let mut kept = Vec::new();
            for p in params {
                if !raw.take(p.key, p.value)? {
                    kept.push(&url[p.span.0..p.span.1]);
                }
            }
            Rest::KeyValue { kept }
        }
    };
    Ok(Some((raw, rest)))
}

/// A connection string without its TLS parameters.
enum Rest<'a> {
    Url { head: &'a str, kept: Vec<&'a str> },
    KeyValue { kept: Vec<&'a str> },
}

impl Rest<'_> {
    /// The string for tokio-postgres, with `sslmode=<mode>` added.
    fn with_mode(self, mode: &str) -> String {
        let mode = format!("sslmode={mode}");
        match self {
            Rest::Url { head, mut kept } => {
                kept.push(&mode);
                format!("{head}?{}", kept.join("&"))
            }
            Rest::KeyValue { mut kept } => {
                kept.push(&mode);
                kept.join(" ")
            }
        }
    }
}

fn is_ours(key: &str) -> bool {
    matches!(
        key,
        "sslmode" | "sslrootcert" | "sslcert" | "sslkey" | "sslsni"
    )
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

fn config_error(message: impl fmt::Display) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("invalid database url: {message}"),
    )
}

fn decode(s: &str) -> Option<String> {
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// For a URL, the part before its query string and the query string (empty if none), split
/// where tokio-postgres splits them: the credentials end at the first `@`, the query starts
/// at the first `?` after them. None for a key=value string.
fn split_url(url: &str) -> Option<(&str, &str)> {
    let prefix = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|p| url.starts_with(p))?;
    let rest = &url[prefix.len()..];
    let after_creds = rest.find('@').map_or(0, |i| i + 1);
    Some(match rest[after_creds..].find('?') {
        Some(q) => {
            let at = prefix.len() + after_creds + q;
            (&url[..at], &url[at + 1..])
        }
        None => (url, ""),
    })
}

/// One `key=value` of a key=value string: the value unquoted, the span as written.
struct Param<'a> {
    key: &'a str,
    value: String,
    span: (usize, usize),
}

/// Splits a key=value string by the rules tokio-postgres applies (libpq's: whitespace around
/// `=` allowed, values quoted with `'`, a backslash escaping the next character, in or out
/// of quotes). None where tokio-postgres would report a syntax error.
fn parse_key_values(s: &str) -> Option<Vec<Param<'_>>> {
    let mut it = s.char_indices().peekable();
    let mut params = Vec::new();
    loop {
        while it.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let start = it.peek().map_or(s.len(), |&(i, _)| i);
        while it
            .next_if(|&(_, c)| !c.is_whitespace() && c != '=')
            .is_some()
        {}
        let key_end = it.peek().map_or(s.len(), |&(i, _)| i);
        if key_end == start {
            return Some(params);
        }
        while it.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        it.next_if(|&(_, c)| c == '=')?;
        while it.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match it.next()? {
                    (_, '\'') => break,
                    (_, '\\') => value.push(it.next()?.1),
                    (_, c) => value.push(c),
                }
            }
        } else {
            while let Some((_, c)) = it.next_if(|&(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some((_, escaped)) = it.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return None;
            }
        }
        let end = it.peek().map_or(s.len(), |&(i, _)| i);
        params.push(Param {
            key: &s[start..key_end],
            value,
            span: (start, end),
        });
    }
}

/// The rustls configuration shared by every connection of one connection string.
fn client_config(
    trust: &Trust,
    check_name: bool,
    client: Option<(&Path, &Path)>,
    sni: bool,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        Trust::Any => Arc::new(AcceptAny { algorithms }),
        Trust::System | Trust::File(_) => {
            let roots = match trust {
                Trust::File(path) => Arc::new(load_roots(path)?),
                _ => system_roots()?,
            };
            if check_name {
                WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| Error::with_source(ErrorKind::Tls, "tls: setting up", e))?
            } else {
                Arc::new(ChainOnly { roots, algorithms })
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| Error::with_source(ErrorKind::Tls, "tls: setting up", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = load_certs("sslcert", cert)?;
            let key = load_key(key)?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                config_error(format_args!(
                    "sslcert {} with sslkey {}: {e}",
                    cert.display(),
                    key_path_display(client)
                ))
            })?
        }
    };
    // PostgreSQL 17 checks ALPN on direct TLS (`sslnegotiation=direct`); older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    config.enable_sni = sni;
    Ok(config)
}

fn key_path_display(client: Option<(&Path, &Path)>) -> String {
    client
        .map(|(_, k)| k.display().to_string())
        .unwrap_or_default()
}

/// The system's root certificates, read once per process.
fn system_roots() -> Result<Arc<RootCertStore>> {
    static ROOTS: OnceLock<std::result::Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                log::debug!("reading the system's root certificates: {e}");
            }
            let mut roots = RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if ignored > 0 {
                log::debug!("{ignored} of the system's root certificates are unusable; skipped");
            }
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(format!(
                    "tls: no root certificate found in the system's store{why}: install the \
                     ca-certificates package, set SSL_CERT_FILE, or give sslrootcert=<file>"
                ));
            }
            Ok(Arc::new(roots))
        })
        .clone()
        .map_err(|m| Error::new(ErrorKind::Tls, m))
}

fn load_roots(path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in load_certs("sslrootcert", path)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            config_error(format_args!(
                "sslrootcert {}: certificate {} cannot serve as a root: {e}",
                path.display(),
                i + 1
            ))
        })?;
    }
    Ok(roots)
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        config_error(format_args!(
            "{what} {}: cannot read it: {e}",
            path.display()
        ))
    })
}

fn pem_reason(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as Pem;
    match e {
        Pem::MissingSectionEnd { .. } => "a PEM block has no END line".to_owned(),
        Pem::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".to_owned(),
        Pem::Base64Decode(e) => format!("a PEM block is not valid base64 ({e})"),
        other => other.to_string(),
    }
}

fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read_file(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            config_error(format_args!(
                "{what} {}: not a valid PEM file: {}",
                path.display(),
                pem_reason(&e)
            ))
        })?;
    if certs.is_empty() {
        return Err(config_error(format_args!(
            "{what} {}: no certificate in it (expected PEM with BEGIN CERTIFICATE blocks)",
            path.display()
        )));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = read_file("sslkey", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no private key in it (expected an unencrypted PEM key: PRIVATE KEY, RSA \
                 PRIVATE KEY or EC PRIVATE KEY)"
                    .to_owned()
            }
            other => format!("not a valid PEM file: {}", pem_reason(&other)),
        };
        config_error(format_args!("sslkey {}: {why}", path.display()))
    })
}

/// `prefer` and `require` without a root: any certificate, as libpq does. The handshake's
/// signatures are still checked, so the session is bound to the key of the certificate shown.
#[derive(Debug)]
struct AcceptAny {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca` (and `prefer`/`require` with a root file): the chain must lead to a root; the
/// names in the certificate are not looked at.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

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
                format!("it is not valid for the name {host} (it names no host)")
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
    use super::*;

    /// A self-signed EC P-256 root signed with ecdsa-with-SHA256, made for these tests.
    const ROOT_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBnDCCAUGgAwIBAgIUSYimwUgC5X06lVNvabAkWxQoMUUwCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXcG9zdHBvbmUgdW5pdCB0ZXN0IHJvb3QwIBcNMjYxMTI5MjMw
MDA0WhgPMjEyNjExMDUyMzAwMDRaMCIxIDAeBgNVBAMMF3Bvc3Rwb25lIHVuaXQg
dGVzdCByb290MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEBr3Q+zC8xwKRzmfe
HtaDl5E0cC0XNWdMZbF8werlhr3ZBtJ1IVT9qw+sx1e3jf7llAKjhyZx07RPDLBL
bBpgr6NTMFEwHQYDVR0OBBYEFBSi2aSO0A2h0w0cAabQnoe86XJuMB8GA1UdIwQY
MBaAFBSi2aSO0A2h0w0cAabQnoe86XJuMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI
zj0EAwIDSQAwRgIhAPi9rmv351UNVt/g2VK3ddIb4/mbQLGqUci+RPSAL5fRAiEA
0gMP2xWvCTdSMEMDdRCFrN6UslmNFzxiMIfQyX/Cu4A=
-----END CERTIFICATE-----
";
    /// `openssl x509 -outform DER | sha256sum` of ROOT_PEM.
    const ROOT_SHA256: &str = "32f877c1bdc78991da11c0e82f929fdea57aee2b788006aaa96f211c0b5aab75";

    /// A directory of files for one test, removed on drop.
    struct Files(PathBuf);

    impl Files {
        fn new(test: &str) -> Files {
            let dir = std::env::temp_dir()
                .join(format!("postpone-tls-unit-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Files(dir)
        }

        fn write(&self, name: &str, text: &str) -> String {
            let path = self.0.join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn split(url: &str) -> (Raw, String) {
        let (raw, rest) = take_tls_params(url).unwrap().expect("valid syntax");
        (raw, rest.with_mode("MODE"))
    }

    fn config_err(url: &str) -> String {
        let e = TlsSettings::extract(url).expect_err(url);
        assert_eq!(e.kind(), ErrorKind::Config, "{url}: {e}");
        let msg = e.to_string();
        assert!(msg.starts_with("invalid database url: "), "{msg}");
        msg
    }

    #[test]
    fn url_parameters_are_taken_out_and_the_rest_kept_verbatim() {
        let (raw, rest) = split(
            "postgres://me:p%40ss@db.example:6543/app?application_name=a%20b&sslmode=verify-full\
             &sslrootcert=%2Fetc%2Fmy%20certs%2Froot.pem&connect_timeout=3",
        );
        assert_eq!(raw.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(raw.sslrootcert.as_deref(), Some("/etc/my certs/root.pem"));
        assert_eq!(
            rest,
            "postgres://me:p%40ss@db.example:6543/app?application_name=a%20b&connect_timeout=3&sslmode=MODE"
        );

        // No query string; a `?` in the password does not start one; percent-encoded keys.
        let (raw, rest) = split("postgresql://h/db");
        assert!(raw.sslmode.is_none());
        assert_eq!(rest, "postgresql://h/db?sslmode=MODE");
        let (raw, rest) = split("postgres://u:a?b@h/db?%73slmode=require&sslsni=0");
        assert_eq!(raw.sslmode.as_deref(), Some("require"));
        assert_eq!(raw.sslsni.as_deref(), Some("0"));
        assert_eq!(rest, "postgres://u:a?b@h/db?sslmode=MODE");

        // Later settings win, as in libpq.
        let (raw, _) = split("postgres://h/db?sslmode=disable&sslmode=verify-ca");
        assert_eq!(raw.sslmode.as_deref(), Some("verify-ca"));
    }

    #[test]
    fn key_value_parameters_follow_libpq_quoting() {
        let (raw, rest) = split(
            r"host=h  sslmode = verify-ca sslrootcert='/a b/it\'s.pem' password='x y' dbname=d",
        );
        assert_eq!(raw.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(raw.sslrootcert.as_deref(), Some("/a b/it's.pem"));
        assert_eq!(rest, "host=h password='x y' dbname=d sslmode=MODE");

        let (raw, rest) = split(r"sslcert=/c\ d.pem sslkey='' host=h");
        assert_eq!(raw.sslcert.as_deref(), Some("/c d.pem"));
        assert_eq!(raw.sslkey.as_deref(), Some(""));
        assert_eq!(rest, "host=h sslmode=MODE");

        // The rest parses as tokio-postgres would have parsed the whole.
        let (_, rest) = split(r"host=h user='o\'neil' sslmode=require");
        let config: tokio_postgres::Config = rest.replace("MODE", "require").parse().unwrap();
        assert_eq!(config.get_user(), Some("o'neil"));

        // Broken syntax is left for tokio-postgres to report.
        for broken in ["nonsense without equals", "host='unterminated", "host= "] {
            assert!(take_tls_params(broken).unwrap().is_none(), "{broken}");
            let (s, _) = TlsSettings::extract(broken).unwrap();
            assert_eq!(s, broken);
        }
    }

    #[test]
    fn harmless_libpq_parameters_are_accepted() {
        let (s, settings) = TlsSettings::extract(
            "postgres://h/db?gssencmode=disable&sslcompression=0&sslcertmode=allow\
             &ssl_min_protocol_version=tlsv1.2&ssl_max_protocol_version=TLSv1.3&sslmode=require",
        )
        .unwrap();
        assert_eq!(s, "postgres://h/db?sslmode=require");
        assert_eq!(settings.mode, SslMode::Require);
        let (s, _) = TlsSettings::extract("host=h gssencmode=prefer sslsni=0").unwrap();
        assert_eq!(s, "host=h sslmode=prefer");
        let raw = Raw {
            min_version: Some("TLSv1.3".into()),
            ..Raw::default()
        };
        assert_eq!(raw.versions().unwrap(), vec![&rustls::version::TLS13]);
        let raw = Raw {
            max_version: Some("TLSv1.2".into()),
            ..Raw::default()
        };
        assert_eq!(raw.versions().unwrap(), vec![&rustls::version::TLS12]);
    }

    #[test]
    fn modes_map_to_what_tokio_postgres_knows() {
        for (mode, driver) in [
            ("disable", "disable"),
            ("allow", "prefer"),
            ("prefer", "prefer"),
            ("require", "require"),
        ] {
            let (s, settings) =
                TlsSettings::extract(&format!("postgres://h/db?sslmode={mode}")).unwrap();
            assert_eq!(s, format!("postgres://h/db?sslmode={driver}"));
            assert_eq!(settings.trust, Trust::Any);
            assert!(!settings.check_name);
            assert_eq!(settings.config.is_none(), mode == "disable");
        }
        let (s, settings) = TlsSettings::extract("host=h").unwrap();
        assert_eq!(s, "host=h sslmode=prefer");
        assert_eq!(settings.mode, SslMode::Prefer, "libpq's default");
    }

    #[test]
    fn root_files_are_read_when_parsing() {
        let files = Files::new("roots");
        let root = files.write("root.pem", ROOT_PEM);
        let encoded = root.replace('/', "%2F");

        let (s, settings) = TlsSettings::extract(&format!(
            "postgres://h/db?sslmode=verify-full&sslrootcert={encoded}"
        ))
        .unwrap();
        assert_eq!(s, "postgres://h/db?sslmode=require");
        assert_eq!(settings.mode, SslMode::VerifyFull);
        assert_eq!(settings.trust, Trust::File(PathBuf::from(&root)));
        assert!(settings.check_name);

        let (_, settings) =
            TlsSettings::extract(&format!("host=h sslmode=verify-ca sslrootcert={root}")).unwrap();
        assert_eq!(settings.trust, Trust::File(PathBuf::from(&root)));
        assert!(!settings.check_name);

        // libpq: require (and prefer) with a root file check the chain, not the name.
        for mode in ["require", "prefer"] {
            let (_, settings) =
                TlsSettings::extract(&format!("host=h sslmode={mode} sslrootcert={root}")).unwrap();
            assert_eq!(settings.trust, Trust::File(PathBuf::from(&root)), "{mode}");
            assert!(!settings.check_name);
        }
        // disable reads nothing.
        let (_, settings) =
            TlsSettings::extract("host=h sslmode=disable sslrootcert=/nonexistent.pem").unwrap();
        assert!(settings.config.is_none());

        // The whole string then parses.
        let opts = super::super::options::ConnectOptions::parse(&format!(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert={encoded}&connect_timeout=2"
        ))
        .unwrap();
        assert_eq!(
            opts.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[test]
    fn sslrootcert_system_implies_verify_full_and_allows_nothing_weaker() {
        match TlsSettings::extract("host=h sslrootcert=system") {
            Ok((s, settings)) => {
                assert_eq!(s, "host=h sslmode=require");
                assert_eq!(settings.mode, SslMode::VerifyFull);
                assert_eq!(settings.trust, Trust::System);
            }
            // A machine without a certificate store.
            Err(e) => assert_eq!(e.kind(), ErrorKind::Tls, "{e}"),
        }
        for mode in ["disable", "prefer", "require", "verify-ca"] {
            let msg = config_err(&format!("host=h sslrootcert=system sslmode={mode}"));
            assert!(
                msg.contains(&format!(
                    "sslmode {mode} may not be used with sslrootcert=system"
                )),
                "{msg}"
            );
        }
    }

    #[test]
    fn bad_values_and_files_say_what_is_wrong() {
        let files = Files::new("bad");
        let garbage = files.write("garbage.pem", "not a certificate\n");
        let broken = files.write(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\nMIIB\n", // no END line
        );
        let root = files.write("root.pem", ROOT_PEM);
        for (url, needle) in [
            (
                "host=h sslmode=verify_full".to_owned(),
                "sslmode \"verify_full\" is not one of",
            ),
            (
                "postgres://h/db?sslmode=".to_owned(),
                "sslmode \"\" is not one of",
            ),
            ("host=h sslsni=2".to_owned(), "sslsni \"2\" is not 0 or 1"),
            (
                "host=h sslmode=verify-ca sslrootcert=/nonexistent/root.pem".to_owned(),
                "sslrootcert /nonexistent/root.pem: cannot read it: No such file",
            ),
            (
                format!("host=h sslmode=verify-ca sslrootcert={garbage}"),
                "no certificate in it",
            ),
            (
                format!("host=h sslmode=verify-ca sslrootcert={broken}"),
                "not a valid PEM file: a PEM block has no END line",
            ),
            (
                format!("host=h sslcert={root}"),
                "sslcert is given without sslkey",
            ),
            (
                "host=h sslkey=/k.pem".to_owned(),
                "sslkey is given without sslcert",
            ),
            (
                format!("host=h sslcert={root} sslkey={root}"),
                "no private key in it",
            ),
            (
                format!("host=h sslcert={root} sslkey=/nonexistent/key.pem"),
                "sslkey /nonexistent/key.pem: cannot read it",
            ),
            (
                "host=h sslcrl=/crl.pem".to_owned(),
                "sslcrl is not supported",
            ),
            ("host=h requiressl=1".to_owned(), "write sslmode=require"),
            (
                "host=h gssencmode=require".to_owned(),
                "gssencmode=require is not supported",
            ),
            (
                "host=h sslcertmode=require".to_owned(),
                "sslcertmode=require is not supported",
            ),
            (
                "host=h ssl_min_protocol_version=TLSv2".to_owned(),
                "ssl_min_protocol_version \"TLSv2\" is not one of",
            ),
            (
                "host=h ssl_min_protocol_version=TLSv1.3 ssl_max_protocol_version=TLSv1.2"
                    .to_owned(),
                "ssl_min_protocol_version is above ssl_max_protocol_version",
            ),
            (
                "host=h sslmode=disable ssl_max_protocol_version=TLSv1.1".to_owned(),
                "leaves no version postpone supports",
            ),
            (
                "postgres://h/db?sslrootcert=%FF".to_owned(),
                "not valid UTF-8",
            ),
        ] {
            let msg = config_err(&url);
            assert!(msg.contains(needle), "{url}: {msg}");
        }
    }

    #[test]
    fn connectors_only_for_tcp_targets_that_want_tls() {
        let tcp = Target::Tcp {
            addr: "127.0.0.1:5432".parse().unwrap(),
            host: "localhost".into(),
        };
        let unix = Target::Unix {
            path: "/run/postgresql/.s.PGSQL.5432".into(),
        };
        let (_, disable) = TlsSettings::extract("host=h sslmode=disable").unwrap();
        assert!(disable.connector(&tcp).unwrap().is_none());
        let (_, require) = TlsSettings::extract("host=h sslmode=require").unwrap();
        assert!(require.connector(&tcp).unwrap().is_some());
        assert!(require.connector(&unix).unwrap().is_none());

        // A host name rustls cannot hold: fine unchecked, an error for verify-full.
        let odd = Target::Tcp {
            addr: "127.0.0.1:5432".parse().unwrap(),
            host: "bad name".into(),
        };
        assert!(require.connector(&odd).unwrap().is_some());
        let files = Files::new("connectors");
        let root = files.write("root.pem", ROOT_PEM);
        let (_, full) =
            TlsSettings::extract(&format!("host=h sslmode=verify-full sslrootcert={root}"))
                .unwrap();
        let e = full.connector(&odd).err().expect("no name to check");
        assert_eq!(e.kind(), ErrorKind::Tls);
        assert!(e.to_string().contains("\"bad name\""), "{e}");
    }

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
