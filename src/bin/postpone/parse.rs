//! Parsers of command-line values: durations (`30s`, `10m`, `1h30m`, `7d`), RFC 3339
//! times, job ids and statuses. Each returns a message clap shows after `invalid value`.

use std::time::{Duration, SystemTime};

use postpone::{JobId, JobStatus};

/// `500ms`, `30s`, `10m`, `2h`, `7d`, `1w`, or several run together (`1h30m`).
pub fn duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("expected a duration such as 30s, 10m, 2h or 7d".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number then a unit (ms, s, m, h, d, w), as in 30s, 10m, 2h or 7d"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let secs_per = match unit {
            "ms" => None,
            "s" => Some(1),
            "m" => Some(60),
            "h" => Some(3600),
            "d" => Some(86_400),
            "w" => Some(604_800),
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit after {n} (use ms, s, m, h, d or w)"
                ))
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?} (use ms, s, m, h, d or w)"
                ))
            }
        };
        let part = match secs_per {
            None => Some(Duration::from_millis(n)),
            Some(k) => n.checked_mul(k).map(Duration::from_secs),
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .filter(|t| t.as_secs() <= 100 * 365 * 86_400)
            .ok_or_else(|| format!("invalid duration {text:?}: longer than a hundred years"))?;
    }
    Ok(total)
}

/// An RFC 3339 time: `2030-01-02T03:04:05Z`, `2030-01-02T03:04:05+02:00`.
pub fn time(text: &str) -> Result<SystemTime, String> {
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(SystemTime::from)
        .map_err(|e| {
            format!("invalid time {text:?}: {e} (expected RFC 3339, as in 2030-01-02T03:04:05Z)")
        })
}

/// A time: RFC 3339, or an age (`2h`: two hours ago).
pub fn time_or_age(text: &str) -> Result<SystemTime, String> {
    if let Ok(d) = duration(text) {
        return SystemTime::now()
            .checked_sub(d)
            .ok_or_else(|| format!("invalid time {text:?}: too far back"));
    }
    time(text).map_err(|_| {
        format!(
            "invalid time {text:?}: expected RFC 3339 (2030-01-02T03:04:05Z) or an age (30m, 2h, 7d)"
        )
    })
}

/// A job id: a whole number.
pub fn job_id(text: &str) -> Result<JobId, String> {
    text.parse::<JobId>().map_err(|e| e.to_string())
}

/// A batch id.
pub fn batch_id(text: &str) -> Result<postpone::BatchId, String> {
    text.parse::<postpone::BatchId>().map_err(|e| e.to_string())
}

/// A workflow id.
pub fn workflow_id(text: &str) -> Result<postpone::WorkflowId, String> {
    text.parse::<postpone::WorkflowId>()
        .map_err(|e| e.to_string())
}

/// A job status name.
pub fn status(text: &str) -> Result<JobStatus, String> {
    text.parse::<JobStatus>().map_err(|e| e.to_string())
}

/// A finished job status (what `prune` accepts).
pub fn finished_status(text: &str) -> Result<JobStatus, String> {
    let s = status(text)?;
    if s.is_finished() {
        Ok(s)
    } else {
        Err(format!(
            "status {s} is not a finished one: prune accepts succeeded, failed, cancelled, aborted"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(duration("1w"), Ok(Duration::from_secs(604_800)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration(" 0s "), Ok(Duration::ZERO));
        for (bad, says) in [
            ("", "expected a duration"),
            ("10", "missing unit"),
            ("10x", "unknown unit \"x\""),
            ("s", "expected a number"),
            ("-5m", "expected a number"),
            ("1.5h", "missing unit"),
            ("99999999999999999999s", "too large"),
            ("999999999999d", "hundred years"),
        ] {
            let e = duration(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn times_ids_statuses() {
        let t = time("1970-01-01T00:01:00Z").unwrap();
        assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(60));
        let t = time("1970-01-01T01:01:00+01:00").unwrap();
        assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(60));
        assert!(time("tomorrow").unwrap_err().contains("RFC 3339"));
        let t = time_or_age("1h").unwrap();
        let ago = SystemTime::now().duration_since(t).unwrap();
        assert!(ago >= Duration::from_secs(3600) && ago < Duration::from_secs(3660));
        assert_eq!(
            time_or_age("1970-01-01T00:01:00Z"),
            Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(60))
        );
        assert!(time_or_age("yesterday").unwrap_err().contains("or an age"));
        assert_eq!(job_id("42"), Ok(JobId(42)));
        assert!(job_id("4x2").unwrap_err().contains("invalid job id"));
        assert_eq!(status("FAILED"), Ok(JobStatus::Failed));
        assert!(status("done").unwrap_err().contains("unknown job status"));
        assert!(finished_status("doing")
            .unwrap_err()
            .contains("not a finished one"));
        assert_eq!(finished_status("aborted"), Ok(JobStatus::Aborted));
    }
}
