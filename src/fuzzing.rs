//! Entry points for the fuzz targets in `fuzz/` and the property tests in
//! `tests/suite/fuzz_props.rs` (feature `fuzzing`; hidden, not part of the API, may change).
//!
//! Each function takes what an outsider controls (a connection string, a cron expression
//! and a time zone name, a job filter's texts, the bytes of an HTTP request), runs the
//! crate's own parser on it, and panics only where an oracle is broken: a parse that panics
//! is a finding, and so is a result that breaks a rule stated next to the check. Inputs are
//! split into fields at `0xFF` bytes (no valid UTF-8 contains one).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::admin::filter::Query;
use crate::admin::{JobFilter, JobSort};
use crate::conn::options::ConnectOptions;
use crate::job::{JobId, JobStatus};

/// Splits fuzz input into `n` fields at `0xFF` bytes (missing fields are empty), each read
/// as UTF-8 with invalid sequences replaced.
pub fn fields(data: &[u8], n: usize) -> Vec<String> {
    let mut out: Vec<String> = data
        .splitn(n, |b| *b == 0xFF)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    out.resize(n, String::new());
    out
}

/// A connection string (URL or key=value), as `App::connect` parses it, and the
/// description of it used in messages and logs. Oracle: the same string parses the same
/// way twice. (An oracle that the description never shows the password was tried: it is
/// built from the user, hosts, ports and database name only, and the fuzzer found strings
/// where those spell the password by coincidence, as in
/// `postgresql://u:'x(:5432/@ a='x(`.)
pub fn connection_string(url: &str) {
    let Ok(opts) = ConnectOptions::parse(url) else {
        return;
    };
    let described = opts.describe();
    let again = ConnectOptions::parse(url).map(|o| o.describe()).ok();
    assert_eq!(again.as_deref(), Some(described.as_str()), "{url:?}");
    let _ = opts.check_interval_ms();
}

/// A cron expression, a time zone name and a start time in seconds since 1970, as
/// `Tasks::periodic(..).time_zone(..)` and the periodic deferrer read them. Oracle: the
/// next instant is strictly later than the start.
pub fn schedule(expr: &str, tz: &str, start_secs: u64) {
    let start = UNIX_EPOCH + Duration::from_secs(start_secs % (400 * 366 * 86_400));
    let mut schedules = crate::periodic::Schedules::new();
    let opts = schedules.add("fuzz", expr);
    if !tz.is_empty() {
        opts.time_zone(tz);
    }
    if let Some(next) = opts.next_after(start) {
        assert!(
            next > start,
            "{expr:?} in {tz:?}: {next:?} is not after {start:?}"
        );
    }
    if let Ok(cron) = crate::periodic::parse(expr) {
        if let Some(next) = crate::periodic::next_after(&cron, start) {
            assert!(next > start, "{expr:?}: {next:?} is not after {start:?}");
        }
    }
}

/// A job filter as the CLI and the dashboard build it from their texts: sort name, status
/// names, queue, task, lock, error text, tag, id, cursor. Oracle: the texts travel as
/// parameters, so the statement is the same whatever they say (each replaced by `x`, it
/// must not change).
pub fn job_filter(f: &[String]) {
    let get = |i: usize| f.get(i).map(String::as_str).unwrap_or("");
    let build = |texts: [&str; 5]| {
        let mut filter = JobFilter::new();
        if let Some(sort) = JobSort::from_name(get(0)) {
            filter = filter.sort(sort, get(0).len() % 2 == 0);
        }
        for name in get(1).split(',') {
            if let Ok(s) = name.parse::<JobStatus>() {
                filter = filter.status(s);
            }
        }
        if !texts[0].is_empty() {
            filter = filter.queue(texts[0]);
        }
        if !texts[1].is_empty() {
            filter = filter.task(texts[1]);
        }
        if !texts[2].is_empty() {
            filter = filter.lock(texts[2]);
        }
        if !texts[3].is_empty() {
            filter = filter.error_contains(texts[3]);
        }
        if !texts[4].is_empty() {
            filter = filter.tag(texts[4]);
        }
        if let Ok(id) = get(7).parse::<JobId>() {
            filter = filter.id(id);
        }
        if !get(8).is_empty() {
            filter = filter.after(get(8));
        }
        filter.list_sql(&mut Query::default()).map(|(sql, _)| sql)
    };
    let texts = [get(2), get(3), get(4), get(5), get(6)];
    let plain = texts.map(|t| if t.is_empty() { "" } else { "x" });
    if let (Ok(sql), Ok(same)) = (build(texts), build(plain)) {
        assert_eq!(sql, same, "the texts {texts:?} changed the statement");
    }
}

/// The CLI's duration, time and id texts are parsed in the binary (src/bin/postpone/
/// parse.rs): the fuzz target includes that file itself. This checks what it calls here:
/// job ids and statuses as `FromStr` reads them. Oracle: a parsed id prints back to a
/// text that parses to the same id.
pub fn ids_and_statuses(s: &str) {
    if let Ok(id) = s.parse::<JobId>() {
        assert_eq!(id.to_string().parse::<JobId>().ok(), Some(id), "{s:?}");
    }
    if let Ok(st) = s.parse::<JobStatus>() {
        assert_eq!(st.as_str().parse::<JobStatus>().ok(), Some(st), "{s:?}");
    }
}

/// The bytes of one HTTP request, through the dashboard's parser and access checks.
#[cfg(feature = "web")]
pub fn http_request(bytes: &[u8]) {
    crate::web::fuzz_request(bytes);
}

/// Texts the dashboard's access code reads: a redirect target, basic credentials, a Host.
/// Oracles: a redirect stays on this site (one leading `/`, never `//` or `/\`).
#[cfg(feature = "web")]
pub fn auth_texts(s: &str) {
    crate::web::fuzz_auth_texts(s);
}

/// Now, for callers that need a start time.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
