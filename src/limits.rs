//! What the database can store, checked where values enter the library.
//!
//! Names (queues, tasks, locks) are checked when a job is deferred, so a name that a
//! notification payload or a btree index cannot hold is a clear error at `defer`, never a
//! failure later in a statement that touches many jobs. Values the library writes on a job's
//! behalf (error texts, retry delays) are made safe instead: a task cannot be refused its
//! outcome.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Longest queue or task name, in bytes (notification payloads must stay under 8000 bytes).
pub const MAX_NAME_BYTES: usize = 255;

/// Longest `lock` or `queueing_lock`, in bytes (a btree index entry holds at most ~2700).
pub const MAX_LOCK_BYTES: usize = 1024;

/// Longest error text kept for one attempt, in bytes; a longer one is cut and says so.
pub const MAX_ERROR_BYTES: usize = 16 * 1024;

/// Longest delay the library schedules: 100 years. Longer retry delays are clamped to it
/// (PostgreSQL's timestamps end in the year 294276; `Duration::MAX` would not fit).
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600 + 25 * 24 * 3600);

/// Checks a queue or task name: not empty, no NUL, at most [`MAX_NAME_BYTES`].
pub(crate) fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid(format!("{what} must not be empty")));
    }
    check_text(what, name, MAX_NAME_BYTES)
}

/// Checks a lock or queueing lock: no NUL, at most [`MAX_LOCK_BYTES`].
pub(crate) fn check_lock(what: &str, lock: &str) -> Result<()> {
    check_text(what, lock, MAX_LOCK_BYTES)
}

fn check_text(what: &str, value: &str, max: usize) -> Result<()> {
    check_no_nul(what, value)?;
    if value.len() > max {
        return Err(Error::invalid(format!(
            "{what} is {} bytes long; at most {max} are allowed ({:?})",
            value.len(),
            shorten(value)
        )));
    }
    Ok(())
}

fn shorten(s: &str) -> String {
    let mut end = s.len().min(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    if end < s.len() {
        format!("{}...", &s[..end])
    } else {
        s.to_owned()
    }
}

/// Checks that a job scheduled `ahead` of now lies within [`MAX_DELAY`].
pub(crate) fn check_schedule(ahead: Duration) -> Result<()> {
    if ahead > MAX_DELAY {
        return Err(Error::invalid(
            "invalid schedule: more than 100 years ahead (the most a job can be scheduled)",
        ));
    }
    Ok(())
}

/// Seconds from the year 1 (0001-01-01T00:00:00Z) to 1970.
const YEAR_1_SECS: u64 = 62_135_596_800;
/// Seconds from 1970 to the year 10000 (10000-01-01T00:00:00Z).
const YEAR_10000_SECS: u64 = 253_402_300_800;
/// Seconds in a mean Gregorian year (365.2425 days), to say roughly how far a time lies.
const SECS_PER_YEAR: u64 = 31_556_952;

/// Checks that a time given by the caller lies in the years 1 to 9999. PostgreSQL stores
/// times from 4713 BC, but the driver's conversion overflows far outside that range (a time a
/// million years ahead panics, or wraps into the past in a release build), and no job needs
/// a time outside it.
pub(crate) fn check_time(what: &str, t: SystemTime) -> Result<()> {
    let (inside, secs, side) = match t.duration_since(UNIX_EPOCH) {
        Ok(ahead) => (ahead.as_secs() < YEAR_10000_SECS, ahead.as_secs(), "after"),
        Err(e) => {
            let back = e.duration();
            let inside = back.as_secs() < YEAR_1_SECS
                || (back.as_secs() == YEAR_1_SECS && back.subsec_nanos() == 0);
            (inside, back.as_secs(), "before")
        }
    };
    if inside {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {what}: {secs} s {side} 1970 lies outside the years 1 to 9999 \
             (about {} years {side} 1970)",
            secs / SECS_PER_YEAR
        )))
    }
}

/// Checks that a text holds no NUL character (PostgreSQL text cannot hold one, and refuses
/// the statement that sends it).
pub(crate) fn check_no_nul(what: &str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(Error::invalid(format!(
            "{what} {:?} contains a NUL character, which PostgreSQL text cannot hold",
            shorten(value)
        )));
    }
    Ok(())
}

/// An age or a window (how far back from now) in whole milliseconds, clamped to
/// [`MAX_DELAY`]: the database cannot subtract much more from its clock (`Duration::MAX`,
/// "everything", reads as the last 100 years).
pub(crate) fn age_millis(d: Duration) -> i64 {
    clamp_delay(d).as_millis() as i64
}

/// An error text the database can always store: NUL characters become U+FFFD, and a text
/// longer than [`MAX_ERROR_BYTES`] is cut at a character boundary, saying so.
pub(crate) fn safe_text(text: &str) -> String {
    const CUT: &str = "... (cut: the text was longer than 16 KiB)";
    let mut out = if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text.to_owned()
    };
    if out.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES - CUT.len();
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str(CUT);
    }
    out
}

/// A delay the database can add to its clock: at most [`MAX_DELAY`].
pub(crate) fn clamp_delay(d: Duration) -> Duration {
    d.min(MAX_DELAY)
}

/// A delay in whole microseconds, clamped to [`MAX_DELAY`].
pub(crate) fn delay_micros(d: Duration) -> i64 {
    clamp_delay(d).as_micros() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_accepted_in_the_years_1_to_9999() {
        let year_1 = UNIX_EPOCH - Duration::from_secs(YEAR_1_SECS);
        let year_10000 = UNIX_EPOCH + Duration::from_secs(YEAR_10000_SECS);
        assert!(check_time("t", year_1).is_ok());
        assert!(check_time("t", SystemTime::now()).is_ok());
        assert!(check_time("t", year_10000 - Duration::from_nanos(1)).is_ok());
        assert!(check_time("t", year_10000).is_err());
        assert!(check_time("t", year_1 - Duration::from_nanos(1)).is_err());
        let e = check_time("reschedule time", year_10000).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("reschedule time"), "{e}");
    }

    #[test]
    fn texts_lose_their_nuls_and_their_excess_only() {
        assert_eq!(safe_text("a\0b"), "a\u{FFFD}b");
        assert_eq!(safe_text("plain"), "plain");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = safe_text(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES, "{}", cut.len());
        assert!(cut.ends_with("longer than 16 KiB)"));
    }

    #[test]
    fn names_that_the_database_cannot_hold_are_refused() {
        assert!(check_name("queue", "emails").is_ok());
        assert!(check_name("queue", "").is_err());
        assert!(check_name("queue", &"q".repeat(256)).is_err());
        assert!(check_name("task", "a\0").is_err());
        assert!(check_lock("lock", &"l".repeat(1024)).is_ok());
        let e = check_lock("lock", &"l".repeat(1025)).unwrap_err();
        assert!(e.to_string().contains("1025 bytes"), "{e}");
    }

    #[test]
    fn delays_stop_at_a_hundred_years() {
        assert_eq!(clamp_delay(Duration::MAX), MAX_DELAY);
        assert_eq!(delay_micros(Duration::from_secs(1)), 1_000_000);
        assert!(delay_micros(Duration::MAX) < 3_155_760_000_000_001);
    }
}
