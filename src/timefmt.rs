//! Instants as text: RFC 3339 in UTC for the admin API's JSON, the CLI and the dashboard,
//! and the serde serializers that write them.

use std::time::SystemTime;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// An instant in RFC 3339, UTC, to the microsecond: `2024-05-01T12:00:00.123456Z`
/// (`"infinity"` or `"-infinity"` past chrono's range of ±262,000 years).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    match to_chrono(t) {
        Some(d) => d.to_rfc3339_opts(SecondsFormat::Micros, true),
        None if t > SystemTime::UNIX_EPOCH => "infinity".to_owned(),
        None => "-infinity".to_owned(),
    }
}

/// `SystemTime` to chrono without the panic of chrono's `From` out of its range.
fn to_chrono(t: SystemTime) -> Option<DateTime<Utc>> {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => DateTime::from_timestamp(i64::try_from(d.as_secs()).ok()?, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).ok()?;
            match d.subsec_nanos() {
                0 => DateTime::from_timestamp(-secs, 0),
                n => DateTime::from_timestamp(-secs - 1, 1_000_000_000 - n),
            }
        }
    }
}

pub(crate) fn ser_time<S: Serializer>(
    t: &SystemTime,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

pub(crate) fn ser_opt_time<S: Serializer>(
    t: &Option<SystemTime>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&rfc3339(*t)),
        None => s.serialize_none(),
    }
}
