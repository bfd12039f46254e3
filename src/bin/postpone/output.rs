//! Output for people: aligned tables, short times and ages, and text made safe for a
//! terminal (control characters escaped: a newline cannot split a row, an escape sequence
//! stored in a job cannot reach the terminal). JSON output is left exact.

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

    /// Adds a row; control characters in its cells are escaped.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.iter().map(|c| clean(c)).collect());
    }

    /// Writes the header and the rows.
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

/// `850ms`, `12.3s`, `5m12s`, `3h05m`, `2d03h`; `infinite` past a million years (a job
/// due at `-infinity`).
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 1_000_000 * 365 * 86_400 {
        "infinite".to_owned()
    } else if s < 1 {
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

/// `s` with every control character (C0, DEL, C1) and every bidirectional override
/// written as an escape: `\n`, `\t`, `\r`, `\x1b`, `\u{202e}`. Safe to print on a terminal,
/// one line.
pub fn clean(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x100 && needs_escape(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A duration to the millisecond for tables: `-` for none.
pub fn opt_age(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), age)
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
        assert_eq!(age(Duration::MAX), "infinite");
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

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(clean("plain é"), "plain é");
        assert_eq!(clean("a\nb\tc\r"), "a\\nb\\tc\\r");
        assert_eq!(clean("\u{1b}[2Jx"), "\\x1b[2Jx");
        assert_eq!(clean("\u{7f}\u{9b}"), "\\x7f\\x9b");
        assert_eq!(clean("\u{202e}evil"), "\\u{202e}evil");
        let mut t = Table::new(&["A"]);
        t.row(vec!["x\ny".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "A\nx\\ny\n");
    }
}
