//! Plain types every layer shares: [`JobId`], [`JobStatus`], raw JSON text and the
//! serialisation of job arguments.
//!
//! This is a leaf: it depends on nothing else in the crate but `error`, so the App, jobs,
//! tasks, periodic schedules, the worker and the admin API can all use it without pointing
//! back at each other.

use std::fmt;
use std::str::FromStr;

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};

use crate::error::{Error, ErrorKind};

/// The id of a job: a newtype over the `bigint` primary key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub i64);

impl JobId {
    /// The id as a number.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<i64> for JobId {
    fn from(id: i64) -> JobId {
        JobId(id)
    }
}

impl From<JobId> for i64 {
    fn from(id: JobId) -> i64 {
        id.0
    }
}

impl FromStr for JobId {
    type Err = Error;
    fn from_str(s: &str) -> Result<JobId, Error> {
        s.trim()
            .parse::<i64>()
            .map(JobId)
            .map_err(|_| Error::invalid(format!("invalid job id {s:?}: expected a whole number")))
    }
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum JobStatus {
    /// Waiting to be claimed (possibly scheduled for later).
    Todo,
    /// Claimed by a worker, running.
    Doing,
    /// Ran and returned `Ok`.
    Succeeded,
    /// Ran and failed with no retry left (or failed without retry).
    Failed,
    /// Cancelled before it ran, or by its task.
    Cancelled,
    /// Aborted on request while it ran.
    Aborted,
}

impl JobStatus {
    /// Every status, in life order.
    pub const ALL: [JobStatus; 6] = [
        JobStatus::Todo,
        JobStatus::Doing,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Cancelled,
        JobStatus::Aborted,
    ];

    /// The status as stored in the database (`"todo"`, `"doing"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Todo => "todo",
            JobStatus::Doing => "doing",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Aborted => "aborted",
        }
    }

    /// True for the statuses a job never leaves by itself.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled | JobStatus::Aborted
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<JobStatus, Error> {
        JobStatus::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "unknown job status {s:?}: expected one of todo, doing, succeeded, failed, cancelled, aborted"
                    ),
                )
            })
    }
}

/// JSON text read from or written to a `json` or `jsonb` column without going through
/// `serde_json::Value`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawJson(pub(crate) String);

impl ToSql for RawJson {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            out.extend_from_slice(&[1]);
        }
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }

    tokio_postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for RawJson {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<RawJson, Box<dyn std::error::Error + Sync + Send>> {
        let body = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, rest)) => rest,
                _ => return Err("unsupported jsonb encoding version".into()),
            }
        } else {
            raw
        };
        Ok(RawJson(std::str::from_utf8(body)?.to_owned()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

/// Serializes job arguments, refusing what PostgreSQL's jsonb cannot store.
pub(crate) fn serialize_args<A: Serialize + ?Sized>(args: &A) -> crate::error::Result<RawJson> {
    let text = serde_json::to_string(args).map_err(|e| {
        Error::with_source(
            ErrorKind::InvalidInput,
            "job arguments do not serialize to JSON",
            e,
        )
    })?;
    if let Some(why) = jsonb_refusal(&text) {
        return Err(Error::invalid(format!("the JSON holds {why}")));
    }
    Ok(RawJson(text))
}

/// Most decimal digits numeric holds after the point (`NUMERIC_DSCALE_MAX`).
const NUMERIC_MAX_SCALE: i64 = 16383;
/// Highest power of ten of a nonzero digit numeric holds (131,072 digits before the point).
const NUMERIC_MAX_POWER: i64 = 131_071;
/// An exponent numeric refuses whatever its digits (`INT_MAX / 2`), on PostgreSQL 15
/// (18 stores a zero with this exponent: the check keeps the lower bound).
const NUMERIC_MAX_EXPONENT: i64 = 1_073_741_823;

/// Deepest nesting of arrays and objects a value may have. PostgreSQL's jsonb parser
/// recurses once a level and refuses a value past its stack (`max_stack_depth`, 2 MB by
/// default: some 13,000 levels in a plain statement, fewer inside functions or with a
/// smaller setting), which made a deeper value a raw "stack depth limit exceeded" error.
/// A thousand levels is far from both that and any real job's arguments.
pub(crate) const JSON_MAX_DEPTH: usize = 1000;

/// What in `json` (valid JSON text) PostgreSQL's jsonb input refuses, if anything, said as
/// what the text holds: a NUL character (`\u0000`), a UTF-16 surrogate escape that is not
/// half of a pair, a number past numeric's range (a raw value can hold `1e1000000`), or
/// arrays and objects nested deeper than [`JSON_MAX_DEPTH`].
pub(crate) fn jsonb_refusal(json: &str) -> Option<&'static str> {
    const NUL: &str = "a NUL character (\\u0000), which PostgreSQL jsonb cannot store";
    const LONE: &str =
        "a UTF-16 surrogate escape that is not half of a pair, which PostgreSQL jsonb cannot store";
    const NUMBER: &str =
        "a number past the range of PostgreSQL's numeric, which PostgreSQL jsonb cannot store";
    const DEEP: &str = "arrays or objects nested more than 1,000 levels deep, more than postpone \
                        stores (PostgreSQL's jsonb parser recurses once a level, up to the \
                        server's max_stack_depth)";
    let b = json.as_bytes();
    let mut i = 0;
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > JSON_MAX_DEPTH {
                    return Some(DEEP);
                }
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'"' => {
                i += 1;
                // A high surrogate escape just read: a low one must follow at once.
                let mut high = false;
                loop {
                    i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
                    if b[i] == b'"' {
                        if high {
                            return Some(LONE);
                        }
                        i += 1;
                        break;
                    }
                    if b.get(i + 1) != Some(&b'u') {
                        if high {
                            return Some(LONE);
                        }
                        i += 2;
                        continue;
                    }
                    let hex = std::str::from_utf8(b.get(i + 2..i + 6)?).ok()?;
                    let code = u16::from_str_radix(hex, 16).ok()?;
                    i += 6;
                    let low = (0xDC00..=0xDFFF).contains(&code);
                    if high != low {
                        return Some(LONE);
                    }
                    if high {
                        high = false;
                        continue;
                    }
                    if code == 0 {
                        return Some(NUL);
                    }
                    high = (0xD800..=0xDBFF).contains(&code);
                    // A high one is half of a pair only with a low escape right after it.
                    if high && b.get(i..i + 2) != Some(b"\\u") {
                        return Some(LONE);
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let (end, refused) = number_refused(b, i);
                if refused {
                    return Some(NUMBER);
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    None
}

/// Reads the JSON number at `b[start..]`; returns where it ends and whether numeric
/// refuses it (as `numeric_in` judges: the written exponent, the digits after the point
/// once it is applied, trailing zeros included, and the power of the first nonzero digit).
fn number_refused(b: &[u8], start: usize) -> (usize, bool) {
    let mut i = start + usize::from(b[start] == b'-');
    let digits = |i: &mut usize| {
        let from = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        from..*i
    };
    let int = digits(&mut i);
    let frac = if b.get(i) == Some(&b'.') {
        i += 1;
        digits(&mut i)
    } else {
        i..i
    };
    let mut exp: i64 = 0;
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        let negative = b.get(i) == Some(&b'-');
        if matches!(b.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        for d in &b[digits(&mut i)] {
            exp = (exp * 10 + i64::from(d - b'0')).min(i64::from(i32::MAX));
        }
        if negative {
            exp = -exp;
        }
    }
    if exp.abs() >= NUMERIC_MAX_EXPONENT {
        return (i, true);
    }
    let scale = frac.len() as i64 - exp;
    // The power of ten of the first nonzero digit, before the exponent.
    let first = b[int.clone()]
        .iter()
        .position(|d| *d != b'0')
        .map(|k| (int.len() - 1 - k) as i64)
        .or_else(|| {
            b[frac.clone()]
                .iter()
                .position(|d| *d != b'0')
                .map(|k| -(k as i64) - 1)
        });
    let too_big = first.is_some_and(|p| p + exp > NUMERIC_MAX_POWER);
    (i, scale > NUMERIC_MAX_SCALE || too_big)
}

/// The arguments of a typed task: a serializable type that knows the name of its task, so
/// that [`App::enqueue`](crate::App::enqueue) defers it without a string name. The task that
/// runs it implements [`Task`](crate::Task) with these as its `Args`.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail { to: String }
///
/// impl postpone::TaskArgs for SendEmail {
///     const TASK: &'static str = "send_email";
/// }
/// ```
pub trait TaskArgs: Serialize {
    /// The task name the jobs of these arguments are deferred under.
    const TASK: &'static str;
}

/// The default queue and priority of each task, as an App applies them to jobs deferred
/// without one; built from a [`Tasks`](crate::Tasks) registry by
/// [`AppBuilder::task_defaults`](crate::AppBuilder::task_defaults).
#[derive(Clone, Debug, Default)]
pub struct TaskDefaults {
    map: std::collections::HashMap<String, (Option<String>, Option<i32>)>,
}

impl TaskDefaults {
    /// Records the defaults of `task` (a `None` leaves that one to the global default).
    pub fn set(&mut self, task: impl Into<String>, queue: Option<String>, priority: Option<i32>) {
        if queue.is_some() || priority.is_some() {
            self.map.insert(task.into(), (queue, priority));
        }
    }

    /// The default queue and priority of `task`, if it has them.
    pub fn get(&self, task: &str) -> (Option<&str>, Option<i32>) {
        match self.map.get(task) {
            Some((q, p)) => (q.as_deref(), *p),
            None => (None, None),
        }
    }

    /// Adds the defaults of `other`, which win over these.
    pub(crate) fn extend(&mut self, other: TaskDefaults) {
        self.map.extend(other.map);
    }
}

/// The impls every id newtype over a `bigint` key shares: `get`, `Display`, `From<i64>`, and
/// `FromStr` with an error naming `$what` ("invalid batch id \"x\": ...").
macro_rules! id_impls {
    ($name:ident, $what:literal) => {
        impl $name {
            /// The id as a number.
            pub fn get(self) -> i64 {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl From<i64> for $name {
            fn from(id: i64) -> $name {
                $name(id)
            }
        }

        impl std::str::FromStr for $name {
            type Err = crate::error::Error;
            fn from_str(s: &str) -> crate::error::Result<$name> {
                s.trim().parse::<i64>().map($name).map_err(|_| {
                    crate::error::Error::invalid(format!(
                        concat!(
                            "invalid ",
                            $what,
                            " id {:?}: expected a whole number, such as 42"
                        ),
                        s
                    ))
                })
            }
        }
    };
}
pub(crate) use id_impls;

/// `column` as an array parameter of a statement that unnests its arrays side by side, or a
/// NULL array of its type when every element is NULL: `unnest` with several arguments reads
/// a NULL array as NULL for every row, and the server receives and unnests one array less
/// of a value per row.
pub(crate) fn array_or_null<T: ToSql + Sync>(column: &Vec<Option<T>>) -> &(dyn ToSql + Sync) {
    if column.iter().all(Option::is_none) {
        &None::<Vec<Option<T>>>
    } else {
        column
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_text() {
        for st in JobStatus::ALL {
            assert_eq!(st.as_str().parse::<JobStatus>().unwrap(), st);
            assert_eq!(st.to_string(), st.as_str());
        }
        assert!(JobStatus::Succeeded.is_finished());
        assert!(!JobStatus::Doing.is_finished());
        let e = "done".parse::<JobStatus>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("unknown job status \"done\""));
    }

    #[test]
    fn job_ids_parse_and_print() {
        assert_eq!("42".parse::<JobId>().unwrap(), JobId(42));
        assert_eq!(JobId(7).to_string(), "7");
        assert_eq!(i64::from(JobId(7)), 7);
        assert_eq!(
            "x".parse::<JobId>().unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(jsonb_refusal(&deep(JSON_MAX_DEPTH)), None);
        assert!(jsonb_refusal(&deep(JSON_MAX_DEPTH + 1))
            .unwrap()
            .contains("nested more than 1,000 levels"));
        // Objects count as arrays do, and closed levels are given back.
        let objects = format!("{}1{}", "{\"a\":".repeat(600), "}".repeat(600));
        assert_eq!(jsonb_refusal(&format!("[{objects},{objects}]")), None);
        let both = format!("{}{objects}{}", "[".repeat(401), "]".repeat(401));
        assert!(jsonb_refusal(&both).is_some());
        // Brackets in strings (escaped quotes among them) are text.
        let text = format!("\"\\\"{}\"", "[{".repeat(3000));
        assert_eq!(
            jsonb_refusal(&format!("[{text}, {{\"{}\": 1}}]", "[".repeat(2000))),
            None
        );
    }
}
