//! Namespaces: the PostgreSQL schema that holds postpone's objects, set with
//! [`AppBuilder::schema`](crate::AppBuilder::schema).
//!
//! The default namespace is what postpone has always done: objects are found through the
//! session's own `search_path` (usually `public`), workers listen on the channels `postpone`
//! and `postpone_done`, and the functions take the advisory locks of classes 1886352244
//! (queue limits) and 1886352245 (pauses). Nothing here runs for it.
//!
//! A named namespace keeps an installation apart from every other one in the same database:
//! - every connection the App opens runs `SET search_path TO <schema>` before its first use,
//!   so postpone's unqualified statements reach that schema's tables, and only them;
//! - statements run on a caller's own client (`defer_in`) name the schema explicitly
//!   ([`Namespace::qualify`]);
//! - after each migration, the schema's functions are pinned ([`Namespace::pin_sql`]): their
//!   `search_path` is set to the schema (so `tenant.postpone_defer(...)` called from any
//!   session writes into `tenant`), their notifications go to the schema's own channels and
//!   their advisory locks are keyed by the schema. The pin rewrites what the functions say,
//!   whichever migration defined them, so later migrations are covered by the same step.
//!
//! The channel names and lock keys are derived from the schema name alone
//! ([`Namespace::named`]): every process of an installation computes the same ones.

use std::borrow::Cow;

use crate::error::{Error, ErrorKind, Result};

/// PostgreSQL's longest identifier, in bytes (NAMEDATALEN - 1).
const MAX_IDENT_BYTES: usize = 63;

/// The channel of the default namespace.
pub(crate) const DEFAULT_CHANNEL: &str = "postpone";
/// The channel of finished jobs of the default namespace.
pub(crate) const DEFAULT_DONE_CHANNEL: &str = "postpone_done";
/// Advisory lock class of queue concurrency limits in the default namespace.
const LIMIT_CLASS: i32 = 1886352244;
/// Advisory lock class of pauses (with key 0 in the default namespace).
const PAUSE_CLASS: i32 = 1886352245;

/// Where postpone's objects are: the default (the session's `search_path`) or a named schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Namespace {
    named: Option<Named>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    name: String,
    channel: String,
    done_channel: String,
    limit_class: i32,
    pause_key: i32,
}

impl Namespace {
    /// The default: objects found through the session's `search_path`, as before namespaces.
    pub(crate) const DEFAULT: Namespace = Namespace { named: None };

    /// The schema `name` (taken as written: case and punctuation kept), or a `Config` error
    /// for a name PostgreSQL cannot hold.
    pub(crate) fn named(name: &str) -> Result<Namespace> {
        let bad = |why: &str| {
            Err(Error::new(
                ErrorKind::Config,
                format!("invalid schema name {name:?}: {why}"),
            ))
        };
        if name.is_empty() {
            return bad("it is empty (leave .schema out for the default)");
        }
        if name.len() > MAX_IDENT_BYTES {
            return bad(&format!(
                "it is {} bytes long, PostgreSQL's limit is {MAX_IDENT_BYTES}",
                name.len()
            ));
        }
        if name.contains('\0') {
            return bad("it contains a NUL character");
        }
        if name.starts_with("pg_") {
            return bad("names starting with pg_ are reserved for PostgreSQL's own schemas");
        }
        let hash = fnv1a(name.as_bytes());
        let channel = |prefix: &str| {
            let whole = format!("{prefix}:{name}");
            if whole.len() <= MAX_IDENT_BYTES {
                whole
            } else {
                format!("{prefix}:{hash:016x}")
            }
        };
        // Keys that differ from the default's (and between schemas, but for a 1 in 2^32
        // collision, which only serialises the two schemas' claims a little).
        let mut limit_class = (hash >> 32) as i32;
        if limit_class == LIMIT_CLASS || limit_class == PAUSE_CLASS {
            limit_class ^= 1 << 30;
        }
        let mut pause_key = hash as i32;
        if pause_key == 0 {
            pause_key = 1;
        }
        Ok(Namespace {
            named: Some(Named {
                name: name.to_owned(),
                channel: channel("postpone"),
                done_channel: channel("postpone_done"),
                limit_class,
                pause_key,
            }),
        })
    }

    /// The schema's name, or `None` for the default.
    pub(crate) fn name(&self) -> Option<&str> {
        self.named.as_ref().map(|n| n.name.as_str())
    }

    /// The channel workers listen on for new jobs, pauses and aborts.
    pub(crate) fn channel(&self) -> &str {
        self.named
            .as_ref()
            .map_or(DEFAULT_CHANNEL, |n| n.channel.as_str())
    }

    /// The channel of finished jobs, which waiters listen on.
    pub(crate) fn done_channel(&self) -> &str {
        self.named
            .as_ref()
            .map_or(DEFAULT_DONE_CHANNEL, |n| n.done_channel.as_str())
    }

    /// The statement every new connection runs first, if any.
    pub(crate) fn session_sql(&self) -> Option<String> {
        self.name()
            .map(|n| format!("SET search_path TO {}", quote_ident(n)))
    }

    /// ` in schema "x"` for messages, or nothing for the default.
    pub(crate) fn in_schema(&self) -> String {
        self.name()
            .map(|n| format!(" in schema {}", quote_ident(n)))
            .unwrap_or_default()
    }

    /// The command that migrates this namespace, for messages.
    pub(crate) fn migrate_command(&self) -> String {
        match self.name() {
            None => "`postpone migrate` (or `App::migrate`)".to_owned(),
            Some(n) => format!(
                "`postpone migrate --schema {}` (or `App::migrate` with .schema({n:?}))",
                shell_word(n)
            ),
        }
    }

    /// `sql` with every postpone object it names qualified by the schema, for statements
    /// run on a caller's client (whose `search_path` is the caller's). Unchanged for the
    /// default. Only names outside string literals, starting with `postpone_` and not already
    /// qualified, are touched.
    pub(crate) fn qualify(&self, sql: &'static str) -> Cow<'static, str> {
        let Some(name) = self.name() else {
            return Cow::Borrowed(sql);
        };
        let prefix = format!("{}.", quote_ident(name));
        let bytes = sql.as_bytes();
        let mut out = String::with_capacity(sql.len() + 64);
        let mut in_literal = false;
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            if c == b'\'' {
                in_literal = !in_literal;
            } else if !in_literal
                && sql[i..].starts_with("postpone_")
                && (i == 0 || !is_ident_byte(bytes[i - 1]) && bytes[i - 1] != b'.')
            {
                out.push_str(&prefix);
            }
            // Byte by byte is fine: only ASCII bytes are tested, and every byte is copied.
            let next = sql[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&sql[i..i + next]);
            i += next;
        }
        Cow::Owned(out)
    }

    /// The SQL that creates the schema if it is missing (run under the migration lock).
    pub(crate) fn create_sql(&self) -> Option<String> {
        self.name()
            .map(|n| format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(n)))
    }

    /// The SQL that pins the schema's functions (see the module header), or `None` for the
    /// default. Runs after the migrations, in their transaction; changes nothing when they
    /// are pinned already (so a role that owns nothing can run `migrate` of a current schema).
    pub(crate) fn pin_sql(&self) -> Option<String> {
        let n = self.named.as_ref()?;
        let lit = quote_literal;
        let swaps = [
            (
                format!("pg_notify({},", lit(DEFAULT_CHANNEL)),
                format!("pg_notify({},", lit(&n.channel)),
            ),
            (
                format!("pg_notify({},", lit(DEFAULT_DONE_CHANNEL)),
                format!("pg_notify({},", lit(&n.done_channel)),
            ),
            (
                format!("pg_advisory_xact_lock({LIMIT_CLASS},"),
                format!("pg_advisory_xact_lock({},", n.limit_class),
            ),
            (
                format!("pg_advisory_xact_lock_shared({PAUSE_CLASS}, 0)"),
                format!(
                    "pg_advisory_xact_lock_shared({PAUSE_CLASS}, {})",
                    n.pause_key
                ),
            ),
            (
                format!("pg_advisory_xact_lock({PAUSE_CLASS}, 0)"),
                format!("pg_advisory_xact_lock({PAUSE_CLASS}, {})", n.pause_key),
            ),
        ];
        let mut rewrite = "def".to_owned();
        for (from, to) in &swaps {
            rewrite = format!("replace({rewrite}, {}, {})", lit(from), lit(to));
        }
        let schema = lit(&n.name);
        let body = format!(
            "
DECLARE
    f record;
    def text;
    new text;
    setting text := 'search_path=pg_catalog, ' || quote_ident({schema}) || ', pg_temp';
BEGIN
    FOR f IN SELECT p.oid, p.proconfig FROM pg_proc p
              WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = {schema})
                AND p.prokind = 'f' AND p.proname LIKE 'postpone\\_%'
              ORDER BY p.oid
    LOOP
        def := pg_get_functiondef(f.oid);
        new := {rewrite};
        IF new <> def THEN
            EXECUTE new;
        END IF;
        IF f.proconfig IS NULL OR NOT (setting = ANY (f.proconfig)) THEN
            EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                           f.oid::regprocedure, {schema});
        END IF;
    END LOOP;
END
"
        );
        let mut tag = "$postpone_pin$".to_owned();
        let mut k = 0;
        while body.contains(&tag) {
            k += 1;
            tag = format!("$postpone_pin{k}$");
        }
        Some(format!("DO {tag}{body}{tag}"))
    }
}

/// `s` as a quoted SQL identifier (always quoted: case and punctuation are kept).
pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `s` as a SQL string literal (standard_conforming_strings on, the default since 9.1).
pub(crate) fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// `s` as one shell word, for messages that show a command.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'"' || b >= 0x80
}

/// FNV-1a, 64 bits: stable across releases and platforms (channel names and lock keys of
/// a named schema are derived from it, and every process must agree on them).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store;

    #[test]
    fn bad_names_are_config_errors() {
        let long = "x".repeat(64);
        for bad in ["", long.as_str(), "a\0b", "pg_jobs"] {
            let e = Namespace::named(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{bad:?}");
            assert!(e.to_string().starts_with("invalid schema name"), "{e}");
        }
        assert!(Namespace::named(&"x".repeat(63)).is_ok());
        // 21 three-byte characters: 63 bytes.
        assert!(Namespace::named(&"é".repeat(31)).is_ok());
        assert!(Namespace::named(&"€".repeat(22)).is_err());
    }

    #[test]
    fn channels_fit_and_differ_from_the_default() {
        let d = Namespace::DEFAULT;
        assert_eq!(d.channel(), "postpone");
        assert_eq!(d.done_channel(), "postpone_done");
        assert!(d.session_sql().is_none() && d.pin_sql().is_none());
        let a = Namespace::named("Tenant-1").unwrap();
        assert_eq!(a.channel(), "postpone:Tenant-1");
        assert_eq!(a.done_channel(), "postpone_done:Tenant-1");
        assert_eq!(a.session_sql().unwrap(), "SET search_path TO \"Tenant-1\"");
        let long = Namespace::named(&"y".repeat(63)).unwrap();
        assert!(long.channel().len() <= 63 && long.done_channel().len() <= 63);
        let other = Namespace::named(&format!("{}z", "y".repeat(62))).unwrap();
        assert_ne!(long.channel(), other.channel());
        assert_ne!(a, Namespace::named("tenant-1").unwrap());
    }

    #[test]
    fn qualify_names_the_schema_outside_literals_only() {
        let ns = Namespace::named("a\"b").unwrap();
        assert_eq!(
            ns.qualify("SELECT postpone_x('postpone_y'), s.postpone_z FROM postpone_jobs"),
            "SELECT \"a\"\"b\".postpone_x('postpone_y'), s.postpone_z FROM \"a\"\"b\".postpone_jobs"
        );
        assert_eq!(
            Namespace::DEFAULT.qualify(store::JOB_INSERT),
            store::JOB_INSERT
        );
        for sql in [
            store::JOB_INSERT,
            store::JOB_INSERT_BATCH,
            store::JOB_INSERT_AFTER,
            store::JOB_INSERT_UNIQUE,
            store::JOB_UNIQUE_HOLDER_W,
            store::JOB_UNIQUE_HOLDER_R,
            store::JOB_UNIQUE_HOLDER_S,
            store::JOB_QUEUEING_LOCK_HOLDER,
        ] {
            let q = ns.qualify(sql);
            assert_eq!(
                q.matches("postpone_").count(),
                q.matches("\"a\"\"b\".postpone_").count(),
                "{q}"
            );
        }
    }

    #[test]
    fn the_pin_quotes_the_name_and_its_dollar_tag() {
        let ns = Namespace::named("x$postpone_pin$'y").unwrap();
        let sql = ns.pin_sql().unwrap();
        assert!(sql.starts_with("DO $postpone_pin1$"), "{sql}");
        assert!(sql.contains("'x$postpone_pin$''y'"), "{sql}");
        assert!(
            sql.contains("'pg_notify(''postpone:x$postpone_pin$''''y'','"),
            "{sql}"
        );
    }

    #[test]
    fn shell_words_are_quoted_when_needed() {
        assert_eq!(shell_word("jobs"), "jobs");
        assert_eq!(shell_word("Tenant 1"), "'Tenant 1'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }
}
