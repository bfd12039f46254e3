//! Output for people: aligned tables, short times and ages.

use std::io::{self, Write};
use std::time::{Duration, SystemTime};

/// Columns left-aligned to their widest cell, two spaces apart; no trailing spaces.
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let cols = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |out: &mut dyn Write, cells: &mut dyn Iterator<Item = &str>| -> io::Result<()> {
            let mut text = String::new();
            for (i, c) in cells.enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                text.push_str(c);
                if i + 1 < cols {
                    let pad = widths[i].saturating_sub(c.chars().count());
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(out, "{}", text.trim_end())
        };
        line(out, &mut self.header.iter().copied())?;
        for r in &self.rows {
            line(out, &mut r.iter().map(String::as_str))?;
        }
        Ok(())
    }
}

/// `2024-05-01 12:00:03` (UTC, to the second; `infinity` past chrono's range).
pub fn time(t: SystemTime) -> String {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).ok(),
        Err(e) => i64::try_from(e.duration().as_secs_f64().ceil() as u64)
            .ok()
            .map(|s| -s),
    };
    match secs.and_then(|s| chrono::DateTime::from_timestamp(s, 0)) {
        Some(d) => d.format("%Y-%m-%d %H:%M:%S").to_string(),
        None if t > SystemTime::UNIX_EPOCH => "infinity".to_owned(),
        None => "-infinity".to_owned(),
    }
}

/// `-` for none.
pub fn opt_time(t: Option<SystemTime>) -> String {
    t.map_or_else(|| "-".to_owned(), time)
}

/// `850ms`, `12.3s`, `5m12s`, `3h05m`, `2d03h`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    if s < 1 {
        format!("{}ms", d.as_millis())
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600)
    }
}

/// Cuts `s` to `max` characters, marking the cut with `…`.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// `-` for none.
pub fn opt(s: Option<&str>) -> String {
    s.unwrap_or("-").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_trim() {
        let mut t = Table::new(&["ID", "TASK", "STATUS"]);
        t.row(vec!["1".into(), "send_email".into(), "todo".into()]);
        t.row(vec!["1234".into(), "x".into(), "succeeded".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ID    TASK        STATUS\n1     send_email  todo\n1234  x           succeeded\n"
        );
    }

    #[test]
    fn ages_times_and_cuts() {
        assert_eq!(age(Duration::from_millis(850)), "850ms");
        assert_eq!(age(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(age(Duration::from_secs(312)), "5m12s");
        assert_eq!(age(Duration::from_secs(3 * 3600 + 5 * 60)), "3h05m");
        assert_eq!(age(Duration::from_secs(2 * 86_400 + 3 * 3600)), "2d03h");
        assert_eq!(
            time(SystemTime::UNIX_EPOCH + Duration::from_secs(90)),
            "1970-01-01 00:01:30"
        );
        assert_eq!(opt_time(None), "-");
        let far = Duration::from_secs(300_000 * 365 * 86_400);
        assert_eq!(time(SystemTime::UNIX_EPOCH + far), "infinity");
        assert_eq!(time(SystemTime::UNIX_EPOCH - far), "-infinity");
        assert_eq!(
            time(SystemTime::UNIX_EPOCH - Duration::from_millis(500)),
            "1969-12-31 23:59:59"
        );
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
