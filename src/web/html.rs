//! HTML building blocks: escaping, the page frame, times and ages, and the throughput chart
//! (an inline SVG drawn here, so the page needs no script).
//!
//! Every value from the database goes through [`esc`] (text and attribute values alike) or
//! [`url_enc`] (inside a link's query); nothing else reaches the output unescaped.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use crate::admin::rfc3339;
use crate::error::fmt_duration;

/// Escapes text for an HTML text node or a quoted attribute value. Control characters
/// (a NUL, say) are shown as `\u{..}` escapes: they would be dropped or replaced by a
/// browser, and hide what the value really holds.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a value for a URL query or path segment.
pub(crate) fn url_enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// An instant as `2024-05-01 12:00:00 UTC` with its full RFC 3339 form as a tooltip.
pub(crate) fn time(t: SystemTime) -> String {
    let full = rfc3339(t);
    let short = full
        .get(..19)
        .map(|s| s.replace('T', " ") + " UTC")
        .unwrap_or_else(|| full.clone());
    format!(
        "<time datetime=\"{0}\" title=\"{0}\">{1}</time>",
        esc(&full),
        esc(&short)
    )
}

pub(crate) fn opt_time(t: Option<SystemTime>) -> String {
    t.map(time)
        .unwrap_or_else(|| "<span class=dim>–</span>".to_owned())
}

/// A duration, rounded for people: `850ms`, `12.3s`, `4m 05s`, `2h 10m`, `3d 4h`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        fmt_duration(Duration::from_millis(
            d.as_millis().min(u64::MAX as u128) as u64
        ))
    } else if s < 3600 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d {}h", s / 86_400, (s % 86_400) / 3600)
    }
}

const STYLE: &str = "
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1f3a5f;color:#fff;padding:.5em 1.2em;display:flex;gap:1.4em;align-items:center}
header a{color:#dfe9f7;text-decoration:none}header a.on{color:#fff;font-weight:600;border-bottom:2px solid #fff}
header .brand{font-weight:700;color:#fff}header .ro{margin-left:auto;font-size:12px;background:#8a5a00;padding:2px 8px;border-radius:3px}
main{padding:1em 1.2em;max-width:1300px}
table{border-collapse:collapse;background:#fff;width:100%;margin:.5em 0 1.2em}
th,td{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #e3e6ea;padding:.6em;overflow:auto;white-space:pre-wrap;word-break:break-all}
.dim{color:#8a939c}.err{color:#a4161a}.stalled{background:#fde8e8}
.s-todo{color:#555}.s-doing{color:#0b63c5}.s-succeeded{color:#1b7f3a}.s-failed{color:#a4161a}
.s-cancelled{color:#7a6a00}.s-aborted{color:#8a2be2}
.flash{background:#e7f4ea;border:1px solid #9fd0ab;padding:.5em .8em}.flash.bad{background:#fde8e8;border-color:#e3a0a0}
form.inline{display:inline}button{cursor:pointer}
.filters input,.filters select{margin-right:.6em}
nav.pages a{margin-right:1em}
";

/// The page frame: head with the style sheet (no script), the navigation, `body`.
/// `refresh`: seconds between automatic reloads (an HTML refresh: works without script).
pub(crate) fn page(
    title: &str,
    active: &str,
    refresh: Option<u32>,
    read_only: bool,
    body: &str,
) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    out.push_str("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>");
    out.push_str("<meta name=viewport content=\"width=device-width,initial-scale=1\">");
    if let Some(s) = refresh {
        let _ = write!(out, "<meta http-equiv=refresh content=\"{s}\">");
    }
    let _ = write!(
        out,
        "<title>{} · postpone</title><style>{STYLE}</style></head><body><header>\
         <span class=brand>postpone</span>",
        esc(title)
    );
    for (href, name) in [
        ("/", "Overview"),
        ("/jobs", "Jobs"),
        ("/workers", "Workers"),
        ("/periodic", "Periodic"),
    ] {
        let on = if name == active { " class=on" } else { "" };
        let _ = write!(out, "<a href=\"{href}\"{on}>{name}</a>");
    }
    if read_only {
        out.push_str("<span class=ro>read-only</span>");
    }
    out.push_str("</header><main>");
    out.push_str(body);
    out.push_str("</main></body></html>\n");
    out
}

/// A status word with its colour.
pub(crate) fn status(s: &str) -> String {
    format!("<span class=\"s-{0}\">{0}</span>", esc(s))
}

/// One minute of the last hour: jobs finished well and badly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Minute {
    pub(crate) succeeded: u64,
    pub(crate) failed: u64,
}

/// Bars per minute over the last hour (oldest left): succeeded in green, failed (failed,
/// cancelled, aborted) in red stacked above; a legend and the peak as text.
pub(crate) fn throughput_svg(minutes: &[Minute]) -> String {
    const W: u32 = 720;
    const H: u32 = 140;
    const PAD: u32 = 24;
    let peak = minutes
        .iter()
        .map(|m| m.succeeded + m.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let n = minutes.len().max(1) as u32;
    let bar = (W - 2 * PAD) / n;
    let plot_h = (H - 2 * PAD) as f64;
    let mut out = String::new();
    let total_ok: u64 = minutes.iter().map(|m| m.succeeded).sum();
    let total_bad: u64 = minutes.iter().map(|m| m.failed).sum();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         role=img aria-label=\"jobs finished per minute over the last hour: {total_ok} succeeded, {total_bad} failed\">\
         <rect x=0 y=0 width=\"{W}\" height=\"{H}\" fill=\"#fff\"/>\
         <line x1=\"{PAD}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"#c8cdd2\"/>",
        y = H - PAD,
        x2 = W - PAD
    );
    for (i, m) in minutes.iter().enumerate() {
        let x = PAD + i as u32 * bar;
        let ok_h = (m.succeeded as f64 / peak as f64 * plot_h).round();
        let bad_h = (m.failed as f64 / peak as f64 * plot_h).round();
        let base = (H - PAD) as f64;
        let ago = minutes.len() - i;
        if m.succeeded > 0 {
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{ok_h}\" fill=\"#2e9d52\">\
                 <title>{ago} min ago: {} succeeded</title></rect>",
                base - ok_h,
                bar.saturating_sub(1).max(1),
                m.succeeded
            );
        }
        if m.failed > 0 {
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{bad_h}\" fill=\"#c9302c\">\
                 <title>{ago} min ago: {} failed</title></rect>",
                base - ok_h - bad_h,
                bar.saturating_sub(1).max(1),
                m.failed
            );
        }
    }
    let _ = write!(
        out,
        "<text x=\"{PAD}\" y=\"15\" font-size=\"12\" fill=\"#444\">peak {peak}/min · \
         <tspan fill=\"#2e9d52\">■ succeeded {total_ok}</tspan> \
         <tspan fill=\"#c9302c\">■ failed, cancelled or aborted {total_bad}</tspan></text>\
         <text x=\"{PAD}\" y=\"{}\" font-size=\"11\" fill=\"#888\">60 min ago</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#888\" text-anchor=\"end\">now</text></svg>",
        H - 6,
        W - PAD,
        H - 6
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup_and_shows_controls() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(esc("a\0b\u{1b}c\nd"), "a\\u{0}b\\u{1b}c\nd");
        assert_eq!(url_enc("a b&c=<"), "a%20b%26c%3D%3C");
    }

    #[test]
    fn ages_round_for_people() {
        assert_eq!(age(Duration::from_millis(850)), "850ms");
        assert_eq!(age(Duration::from_secs(245)), "4m 05s");
        assert_eq!(age(Duration::from_secs(7800)), "2h 10m");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d 4h");
    }

    #[test]
    fn chart_draws_a_bar_per_busy_minute() {
        let mut m = vec![Minute::default(); 60];
        m[59] = Minute {
            succeeded: 10,
            failed: 2,
        };
        let svg = throughput_svg(&m);
        assert_eq!(svg.matches("<rect").count(), 3); // background + 2 bars
        assert!(svg.contains("1 min ago: 10 succeeded"));
        assert!(svg.contains("succeeded 10") && svg.contains("aborted 2"));
    }
}
