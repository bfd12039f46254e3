//! Which server a connection may settle on, in which order hosts are tried, what a server may
//! say that ends a session for good, and what a transaction-pooling PgBouncer allows.
//!
//! Owns three connection-string parameters that tokio-postgres does not honour on our connect
//! path (`connect_raw` checks nothing, and knows only `any` and `read-write`), taken out of
//! the string before tokio-postgres parses it:
//! - `target_session_attrs` = `any` | `read-write` | `read-only` | `primary` | `standby` |
//!   `prefer-standby`, with libpq 14's meaning: each host (each address of it) is tried in
//!   turn, within `connect_timeout` each, and kept only if the server's state matches;
//!   `prefer-standby` tries every host for a standby first, then every host again for any.
//! - `load_balance_hosts` = `disable` | `random`: the order of the hosts (and of each host's
//!   addresses), as libpq 16 does.
//! - `pooler_mode` = `session` | `transaction`: ours. `transaction` says the connection goes
//!   through a transaction-pooling PgBouncer, where a server session lasts one transaction:
//!   the library then sends only unnamed statements, and refuses what needs a session
//!   (`LISTEN`, prepared statements) with an error that says so.
//!
//! Stateless: pure functions of the string and of what the server answered.

use crate::error::{Error, ErrorKind, Result};

use super::tls::params::{decode, parse_key_values, split_url};

/// libpq's `target_session_attrs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum SessionAttrs {
    /// Any server.
    #[default]
    Any,
    /// A server whose sessions accept writes (`transaction_read_only` off).
    ReadWrite,
    /// A server whose sessions refuse writes (`transaction_read_only` on).
    ReadOnly,
    /// A server that is not in recovery.
    Primary,
    /// A server in recovery (a hot standby).
    Standby,
    /// A standby if any host is one, else any server.
    PreferStandby,
}

impl SessionAttrs {
    fn parse(value: &str) -> Result<SessionAttrs> {
        Ok(match value {
            "any" => SessionAttrs::Any,
            "read-write" => SessionAttrs::ReadWrite,
            "read-only" => SessionAttrs::ReadOnly,
            "primary" => SessionAttrs::Primary,
            "standby" => SessionAttrs::Standby,
            "prefer-standby" => SessionAttrs::PreferStandby,
            other => {
                return Err(config_error(format!(
                    "target_session_attrs={other:?} is not one of any, read-write, read-only, \
                     primary, standby, prefer-standby"
                )))
            }
        })
    }

    /// The name as written in a connection string.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Primary => "primary",
            SessionAttrs::Standby => "standby",
            SessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// What each pass over the hosts asks for: one pass, except for `prefer-standby` (a
    /// standby first, then anything).
    pub(crate) fn passes(self) -> &'static [SessionAttrs] {
        match self {
            SessionAttrs::PreferStandby => &[SessionAttrs::Standby, SessionAttrs::Any],
            SessionAttrs::Any => &[SessionAttrs::Any],
            SessionAttrs::ReadWrite => &[SessionAttrs::ReadWrite],
            SessionAttrs::ReadOnly => &[SessionAttrs::ReadOnly],
            SessionAttrs::Primary => &[SessionAttrs::Primary],
            SessionAttrs::Standby => &[SessionAttrs::Standby],
        }
    }

    /// Whether the server state must be asked for at all.
    pub(crate) fn needs_check(self) -> bool {
        self != SessionAttrs::Any
    }

    /// Whether a server in `state` is acceptable for one pass asking for `self`.
    pub(crate) fn accepts(self, state: ServerState) -> bool {
        match self {
            SessionAttrs::Any => true,
            SessionAttrs::ReadWrite => !state.read_only,
            SessionAttrs::ReadOnly => state.read_only,
            SessionAttrs::Primary => !state.in_recovery,
            SessionAttrs::Standby | SessionAttrs::PreferStandby => state.in_recovery,
        }
    }
}

/// What a server said about itself right after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServerState {
    /// `pg_is_in_recovery()`.
    pub(crate) in_recovery: bool,
    /// `transaction_read_only` of a new session (on for a standby, or
    /// `default_transaction_read_only`).
    pub(crate) read_only: bool,
}

impl ServerState {
    /// The one statement that asks for the state; answers two text columns `t`/`f`, `on`/`off`.
    pub(crate) const QUERY: &'static str = "SELECT pg_catalog.pg_is_in_recovery()::text, \
         pg_catalog.current_setting('transaction_read_only')";

    /// From the two texts [`QUERY`](Self::QUERY) answers.
    pub(crate) fn from_texts(in_recovery: &str, read_only: &str) -> ServerState {
        ServerState {
            in_recovery: in_recovery == "true" || in_recovery == "t",
            read_only: read_only == "on",
        }
    }

    /// `primary, read-write` or `standby, read-only`, for messages.
    pub(crate) fn describe(self) -> String {
        format!(
            "{}, {}",
            if self.in_recovery {
                "standby"
            } else {
                "primary"
            },
            if self.read_only {
                "read-only"
            } else {
                "read-write"
            }
        )
    }
}

/// The routing parameters of a connection string.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Routing {
    pub(crate) attrs: SessionAttrs,
    /// `load_balance_hosts=random`.
    pub(crate) random: bool,
    /// `pooler_mode=transaction`.
    pub(crate) transaction_pooler: bool,
}

impl Routing {
    /// Takes `target_session_attrs`, `load_balance_hosts` and `pooler_mode` out of a URL or
    /// key=value string; returns the rest of the string and what they say. A string whose
    /// syntax is broken is returned as it is, for tokio-postgres to report.
    pub(crate) fn extract(url: &str) -> Result<(String, Routing)> {
        let mut routing = Routing::default();
        if let Some((head, query)) = split_url(url) {
            let mut kept = Vec::new();
            for segment in query.split('&').filter(|s| !s.is_empty()) {
                let taken = match segment.split_once('=') {
                    Some((k, v)) => match (decode(k), decode(v)) {
                        (Some(k), Some(v)) => routing.take(&k, &v)?,
                        _ => false,
                    },
                    None => false,
                };
                if !taken {
                    kept.push(segment);
                }
            }
            let rest = if kept.is_empty() {
                head.to_owned()
            } else {
                format!("{head}?{}", kept.join("&"))
            };
            return Ok((rest, routing));
        }
        let Some(params) = parse_key_values(url) else {
            return Ok((url.to_owned(), routing));
        };
        let mut kept = Vec::new();
        for p in params {
            if !routing.take(p.key, &p.value)? {
                kept.push(&url[p.span.0..p.span.1]);
            }
        }
        Ok((kept.join(" "), routing))
    }

    fn take(&mut self, key: &str, value: &str) -> Result<bool> {
        match key {
            "target_session_attrs" => self.attrs = SessionAttrs::parse(value)?,
            "load_balance_hosts" => {
                self.random = match value {
                    "disable" => false,
                    "random" => true,
                    other => {
                        return Err(config_error(format!(
                            "load_balance_hosts={other:?} is not one of disable, random"
                        )))
                    }
                }
            }
            "pooler_mode" => {
                self.transaction_pooler = match value {
                    "session" => false,
                    "transaction" => true,
                    other => {
                        return Err(config_error(format!(
                            "pooler_mode={other:?} is not one of session, transaction \
                             (PgBouncer's pool_mode in front of the server)"
                        )))
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Shuffles `items` in place (Fisher-Yates over the jitter generator: the order of hosts
/// needs spread, not secrecy).
pub(crate) fn shuffle<T>(items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = ((crate::retry::jitter_rand() * (i + 1) as f64) as usize).min(i);
        items.swap(i, j);
    }
}

/// True for a SQLSTATE after which a session must never be used again: the server went
/// read-only under it (25006, a primary that became a standby, or a write routed to one),
/// is shutting down or crashed (57P01, 57P02, 57P03), or the link failed (class 08).
/// Whoever holds such a connection drops it and connects again, to whichever host now
/// matches `target_session_attrs`.
pub(crate) fn ends_session(sqlstate: &str) -> bool {
    sqlstate == "25006" || sqlstate.starts_with("57P") || sqlstate.starts_with("08")
}

/// The error for something that needs a server session while `pooler_mode=transaction`.
pub(crate) fn needs_session(what: &str) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "{what} needs a server session of its own, which a transaction-pooling PgBouncer \
             (pooler_mode=transaction in the database url) does not keep between \
             transactions: connect this part directly to the server, or through a \
             session-mode pool"
        ),
    )
}

fn config_error(msg: String) -> Error {
    Error::new(ErrorKind::Config, format!("invalid database url: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_parameters_are_taken_out_of_urls_and_key_value_strings() {
        let (rest, r) = Routing::extract(
            "postgres://u@a:1,b:2/db?connect_timeout=3&target_session_attrs=prefer-standby\
             &load_balance_hosts=random&pooler_mode=transaction",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@a:1,b:2/db?connect_timeout=3");
        assert_eq!(r.attrs, SessionAttrs::PreferStandby);
        assert!(r.random && r.transaction_pooler);

        let (rest, r) =
            Routing::extract("postgres://u@h/db?target_session_attrs=read-write").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(r.attrs, SessionAttrs::ReadWrite);

        let (rest, r) = Routing::extract(
            "host=a,b port=1,2 target_session_attrs=standby user='x y' load_balance_hosts=disable",
        )
        .unwrap();
        assert_eq!(rest, "host=a,b port=1,2 user='x y'");
        assert_eq!(r.attrs, SessionAttrs::Standby);
        assert!(!r.random && !r.transaction_pooler);

        let (rest, r) = Routing::extract("postgres://h/db").unwrap();
        assert_eq!((rest.as_str(), r), ("postgres://h/db", Routing::default()));
        // Broken syntax is left for tokio-postgres.
        let (rest, _) = Routing::extract("host='unterminated").unwrap();
        assert_eq!(rest, "host='unterminated");
    }

    #[test]
    fn bad_values_are_config_errors_naming_the_choices() {
        for (url, needle) in [
            (
                "postgres://h/db?target_session_attrs=master",
                "prefer-standby",
            ),
            ("host=h load_balance_hosts=yes", "disable, random"),
            (
                "postgres://h/db?pooler_mode=statement",
                "session, transaction",
            ),
        ] {
            let e = Routing::extract(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn each_attribute_accepts_the_servers_libpq_accepts() {
        let primary = ServerState::from_texts("false", "off");
        let standby = ServerState::from_texts("true", "on");
        let read_only_primary = ServerState::from_texts("false", "on");
        let table = [
            (SessionAttrs::Any, [true, true, true]),
            (SessionAttrs::ReadWrite, [true, false, false]),
            (SessionAttrs::ReadOnly, [false, true, true]),
            (SessionAttrs::Primary, [true, false, true]),
            (SessionAttrs::Standby, [false, true, false]),
        ];
        for (attrs, want) in table {
            let got = [primary, standby, read_only_primary].map(|s| attrs.accepts(s));
            assert_eq!(got, want, "{}", attrs.as_str());
        }
        assert_eq!(
            SessionAttrs::PreferStandby.passes(),
            &[SessionAttrs::Standby, SessionAttrs::Any]
        );
        assert_eq!(standby.describe(), "standby, read-only");
    }

    #[test]
    fn session_ending_states_and_shuffles() {
        for code in ["25006", "57P01", "57P02", "57P03", "08006", "08P01"] {
            assert!(ends_session(code), "{code}");
        }
        for code in ["23505", "40001", "42P01", "25P02"] {
            assert!(!ends_session(code), "{code}");
        }
        let mut v: Vec<u32> = (0..50).collect();
        shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(
            v, sorted,
            "50 items shuffled into their own order: 1 in 50!"
        );
    }
}
