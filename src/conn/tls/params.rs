//! Taking the TLS parameters out of a connection string, before tokio-postgres parses it.
//!
//! Owns the two syntaxes tokio-postgres accepts, read by its own rules: a URL, whose query
//! string is split on `&` and percent-decoded, and a key=value string, with libpq's quoting.
//! What is ours goes into [`Raw`], unchecked (later settings win, as in libpq); everything
//! else is kept verbatim, in its order, for tokio-postgres. No state beyond one call.
//!
//! Fails with `Config` for a parameter postpone rejects (`sslpassword`, `sslcrl`, ...), a
//! protocol version out of range, or one of our values that is not UTF-8 once decoded. A
//! string whose syntax is broken is not an error here: it is handed back untouched for
//! tokio-postgres to report.

use percent_encoding::percent_decode_str;

use super::config_error;
use crate::error::Result;

/// The TLS parameters as written, before they are checked.
#[derive(Clone, Default)]
pub(super) struct Raw {
    pub(super) sslmode: Option<String>,
    pub(super) sslrootcert: Option<String>,
    pub(super) sslcert: Option<String>,
    pub(super) sslkey: Option<String>,
    pub(super) sslsni: Option<String>,
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
    pub(super) fn versions(&self) -> Result<Vec<&'static rustls::SupportedProtocolVersion>> {
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

/// Splits the TLS parameters off a connection string: what they say, and the rest of the
/// string. None when the string's syntax is broken.
pub(super) fn take_tls_params(url: &str) -> Result<Option<(Raw, Rest<'_>)>> {
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
pub(super) enum Rest<'a> {
    Url { head: &'a str, kept: Vec<&'a str> },
    KeyValue { kept: Vec<&'a str> },
}

impl Rest<'_> {
    /// The string for tokio-postgres, with `sslmode=<mode>` added.
    pub(super) fn with_mode(self, mode: &str) -> String {
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

pub(crate) fn decode(s: &str) -> Option<String> {
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// For a URL, the part before its query string and the query string (empty if none), split
/// where tokio-postgres splits them: the credentials end at the first `@`, the query starts
/// at the first `?` after them. None for a key=value string.
pub(crate) fn split_url(url: &str) -> Option<(&str, &str)> {
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
pub(crate) struct Param<'a> {
    pub(crate) key: &'a str,
    pub(crate) value: String,
    pub(crate) span: (usize, usize),
}

/// Splits a key=value string by the rules tokio-postgres applies (libpq's: whitespace around
/// `=` allowed, values quoted with `'`, a backslash escaping the next character, in or out
/// of quotes). None where tokio-postgres would report a syntax error.
pub(crate) fn parse_key_values(s: &str) -> Option<Vec<Param<'_>>> {
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

#[cfg(test)]
mod tests {
    use super::super::{SslMode, TlsSettings};
    use super::*;

    fn split(url: &str) -> (Raw, String) {
        let (raw, rest) = take_tls_params(url).unwrap().expect("valid syntax");
        (raw, rest.with_mode("MODE"))
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
}
