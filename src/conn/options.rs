//! Connection settings: the parsed connection string plus the deadlines and socket options
//! that postpone adds on top of it.
//!
//! URLs (`postgres://user@host:port/db?...`) and key=value strings (`host=... dbname=...`) are
//! parsed by `tokio_postgres::Config`. Settings written in the string (`connect_timeout`,
//! `keepalives*`, `tcp_user_timeout`) are honoured unless the builder overrides them.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio_postgres::config::Host;

use super::session_attrs::Routing;
use super::time::LONGEST;
use super::tls::TlsSettings;
use crate::error::{Error, ErrorKind, Result};
use crate::namespace::Namespace;

/// Default deadline for every round-trip.
pub(crate) const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Default deadline for a TCP connect plus the TLS and startup handshakes.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything needed to open one connection.
#[derive(Debug)]
pub(crate) struct ConnectOptions {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) tcp_user_timeout: Duration,
    pub(crate) keepalive: bool,
    pub(crate) keepalive_idle: Duration,
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_retries: u32,
    pub(crate) tls: TlsSettings,
    /// `target_session_attrs`, `load_balance_hosts`, `pooler_mode`.
    pub(crate) routing: Routing,
    /// How host names are resolved.
    pub(crate) resolver: super::target::Resolver,
    /// The targets (`host:port`, socket paths) that refused our `options` startup parameter
    /// (a server before 14, a platform without `client_connection_check_interval`, a pooler
    /// that takes no `options`): later connections to them do not send it again. Per target,
    /// so that one old standby does not turn the check off for every other host.
    no_check_interval: Mutex<HashSet<String>>,
    /// Where postpone's objects are; a named schema is set on every new connection.
    pub(crate) namespace: Namespace,
}

/// What a connection string looks like, for the error of one that does not parse.
const URL_FORMS: &str =
    "write a URL, postgres://USER:PASSWORD@HOST:5432/DATABASE?sslmode=require, \
     or key=value pairs, host=HOST port=5432 user=USER dbname=DATABASE";

impl ConnectOptions {
    /// Parses a URL or key=value connection string.
    pub(crate) fn parse(url: &str) -> Result<ConnectOptions> {
        let (url, routing) = Routing::extract(url)?;
        let (url, tls) = TlsSettings::extract(&url)?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            // The driver says what it tripped on, not what it expected.
            Error::with_source(ErrorKind::Config, "invalid database url", e).remedy(URL_FORMS)
        })?;
        if config.get_hosts().is_empty() {
            // `hostaddr` alone says where to connect, as in libpq: the address is the host.
            for ip in config.get_hostaddrs().to_vec() {
                config.host(ip.to_string());
            }
        }
        if config.get_hosts().is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                "invalid database url: it names no host (write one, e.g. postgres://postgres@127.0.0.1:5432/postgres)",
            ));
        }
        let ports = config.get_ports().len();
        if ports > 1 && ports != config.get_hosts().len() {
            return Err(Error::new(
                ErrorKind::Config,
                "invalid database url: give one port, or one port per host",
            ));
        }
        if config.get_application_name().is_none() {
            config.application_name("postpone");
        }
        Ok(ConnectOptions {
            connect_timeout: config
                .get_connect_timeout()
                .copied()
                .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
                .min(LONGEST),
            io_timeout: DEFAULT_IO_TIMEOUT,
            tcp_user_timeout: config
                .get_tcp_user_timeout()
                .copied()
                .unwrap_or(Duration::from_secs(30))
                .min(LONGEST),
            keepalive: config.get_keepalives(),
            // libpq's default of 2 hours is far too long to notice anything: probe after 30 s,
            // unless the string asks for something (2 hours included).
            keepalive_idle: if !names_setting(&url, "keepalives_idle") {
                Duration::from_secs(30)
            } else {
                config.get_keepalives_idle()
            },
            keepalive_interval: config
                .get_keepalives_interval()
                .unwrap_or(Duration::from_secs(10)),
            keepalive_retries: config.get_keepalives_retries().unwrap_or(3),
            tls,
            routing,
            resolver: super::target::system_resolver,
            config,
            no_check_interval: Mutex::new(HashSet::new()),
            namespace: Namespace::DEFAULT,
        })
    }

    /// `user@host:port/dbname`, without the password, for messages and logs.
    pub(crate) fn describe(&self) -> String {
        let c = &self.config;
        let hosts: Vec<String> = c
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let port = match c.get_ports() {
                    [] => 5432,
                    [p] => *p,
                    ps => ps[i],
                };
                match h {
                    Host::Tcp(name) => format!("{name}:{port}"),
                    Host::Unix(dir) => format!("{}:{port}", dir.display()),
                }
            })
            .collect();
        format!(
            "{}@{}/{}",
            c.get_user().unwrap_or(""),
            hosts.join(","),
            c.get_dbname().unwrap_or("")
        )
    }

    /// Whether connections to `target` ask for `client_connection_check_interval`.
    pub(crate) fn wants_check_interval(&self, target: &str) -> bool {
        // Through a transaction pooler, startup options are refused (PgBouncer) or lost.
        !self.routing.transaction_pooler
            && !self
                .no_check_interval
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(target)
    }

    /// `target` refused it: do not ask there again.
    pub(crate) fn disable_check_interval(&self, target: &str) {
        self.no_check_interval
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target.to_owned());
    }

    /// The `client_connection_check_interval` we ask for: the server then notices within about
    /// one `io_timeout` that a client it was serving has vanished, and frees its locks.
    pub(crate) fn check_interval_ms(&self) -> u128 {
        self.io_timeout
            .clamp(Duration::from_secs(1), Duration::from_secs(60))
            .as_millis()
    }
}

/// Whether a URL's query or a key=value string sets `key` (values are not looked at).
fn names_setting(url: &str, key: &str) -> bool {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return url
            .split_once('?')
            .is_some_and(|(_, q)| q.split('&').any(|kv| kv.split('=').next() == Some(key)));
    }
    url.match_indices(key).any(|(at, _)| {
        let starts_word = url[..at]
            .chars()
            .next_back()
            .is_none_or(char::is_whitespace);
        let rest = url[at + key.len()..].trim_start();
        starts_word && rest.starts_with('=')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_key_value_strings() {
        let o = ConnectOptions::parse("postgres://me:secret@db.example:6543/app").unwrap();
        assert_eq!(o.describe(), "me@db.example:6543/app");
        assert_eq!(o.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        let o =
            ConnectOptions::parse("host=a,b port=1,2 user=u dbname=d connect_timeout=3").unwrap();
        assert_eq!(o.describe(), "u@a:1,b:2/d");
        assert_eq!(o.connect_timeout, Duration::from_secs(3));
        assert_eq!(o.config.get_application_name(), Some("postpone"));
    }

    #[test]
    fn hostaddr_without_host_is_the_host() {
        let o = ConnectOptions::parse("hostaddr=127.0.0.1 port=5433 user=u dbname=d").unwrap();
        assert_eq!(o.describe(), "u@127.0.0.1:5433/d");
    }

    #[test]
    fn an_explicit_keepalives_idle_is_kept_even_at_two_hours() {
        let two_hours = Duration::from_secs(7200);
        let o = ConnectOptions::parse("host=a keepalives_idle=7200").unwrap();
        assert_eq!(o.keepalive_idle, two_hours);
        let o = ConnectOptions::parse("postgres://a/d?keepalives_idle=7200").unwrap();
        assert_eq!(o.keepalive_idle, two_hours);
        let o = ConnectOptions::parse("host=a keepalives_idle=45").unwrap();
        assert_eq!(o.keepalive_idle, Duration::from_secs(45));
        let o = ConnectOptions::parse("postgres://a/d?connect_timeout=3").unwrap();
        assert_eq!(o.keepalive_idle, Duration::from_secs(30));
        let o = ConnectOptions::parse("host=a").unwrap();
        assert_eq!(o.keepalive_idle, Duration::from_secs(30));
    }

    #[test]
    fn rejects_malformed_strings_with_a_config_error() {
        for bad in [
            "postgres://host:notaport/db",
            "nonsense without equals",
            "postgres://",
            "host=a,b,c port=1,2",
        ] {
            let e = ConnectOptions::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
            assert!(e.to_string().starts_with("invalid database url"), "{e}");
        }
        // What the driver cannot parse comes with the forms it takes.
        for bad in [
            "postgresql//host/db",
            "nonsense without equals",
            "mysql://u@h/db",
        ] {
            let e = ConnectOptions::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("(write a URL, postgres://USER:PASSWORD@HOST:5432/DATABASE"),
                "{bad}: {e}"
            );
        }
    }
}
