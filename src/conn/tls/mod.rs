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
//!   offers it, plain text when it does not, or when the TLS handshake fails (as libpq:
//!   logged as a warning); the certificate is not checked. With an `sslrootcert`, see below.
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
//! variables and no `~/.postgresql/` defaults; `prefer` with an `sslrootcert` does not retry
//! in plain text after a failed TLS handshake (libpq does, even after the certificate check
//! failed: giving a root asks for the server to be checked, and a check that fails is more
//! likely an impostor than a reason to send the password in clear; the server declining TLS
//! altogether still means plain text, as under libpq); `sslpassword`,
//! `sslcrl`, `sslcrldir`, `sslkeylogfile`, `sslcertmode` other than `allow` and `gssencmode=require`
//! are rejected rather than ignored (`sslcompression` is ignored, as libpq 14+ does). TLS 1.2
//! and 1.3 only (the server's minimum by default since PostgreSQL 13). The ALPN name
//! `postgresql` is always offered, so `sslnegotiation=direct` (PostgreSQL 17) works.
//!
//! Fails with `Config` (bad values or files, when parsing) and `Tls` (certificate not
//! trusted, server declines TLS under `require` or stricter, handshake refused); a handshake
//! that stalls is a `Timeout` naming `connect_timeout`, like the rest of the startup.
//!
//! The files: this one holds the modes and the trust they imply (`TlsSettings`);
//! `params.rs` takes the parameters out of the string, `verify.rs` reads certificate files
//! and builds the rustls configuration, `stream.rs` is the connector, the TLS stream and the
//! explanation of a failed handshake.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;

use self::params::{take_tls_params, Raw};
use self::stream::RustlsConnect;
use self::verify::client_config;
use super::target::Target;
use crate::error::{Error, ErrorKind, Result};

mod cn;
pub(crate) mod params;
mod stream;
mod verify;

#[cfg(test)]
mod fixtures;

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

    /// True for `prefer` (and `allow`) without an `sslrootcert`: a failed TLS handshake is
    /// retried in plain text, as libpq does. With a root the check is meant: no fallback.
    pub(crate) fn falls_back_to_plain(&self) -> bool {
        self.mode == SslMode::Prefer && self.trust == Trust::Any
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
        Ok(Some(RustlsConnect::new(
            config.clone(),
            server_name,
            host.clone(),
            self.mode,
            self.trust.clone(),
        )))
    }
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

#[cfg(test)]
mod tests {
    use super::fixtures::{Files, ROOT_PEM};
    use super::*;

    fn config_err(url: &str) -> String {
        let e = TlsSettings::extract(url).expect_err(url);
        assert_eq!(e.kind(), ErrorKind::Config, "{url}: {e}");
        let msg = e.to_string();
        assert!(msg.starts_with("invalid database url: "), "{msg}");
        msg
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
}
