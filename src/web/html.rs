//! HTML building blocks over maud: the page frame, shown text, times and ages, status words
//! (the charts are in `charts.rs`).
//!
//! Live updates: every page loads one script of ours, `live.js` (the CSP allows scripts
//! from the dashboard's own address and nothing inline). It reads the page again every few
//! seconds and swaps in the new content of each element marked `data-live`, with a switch in
//! the header to turn it off; without script, pages whose figures move reload themselves
//! through a `<noscript>` refresh.
//!
//! maud escapes every value spliced into a template at compile time (`(value)` is text, in
//! an element or an attribute alike); markup that is not escaped must be written
//! `PreEscaped(..)`, and the only such markup here is the style sheet and the SVG text that
//! `charts.rs` builds from numbers. Values from the database go through [`Shown`] so that
//! control characters (a NUL, say) are shown as `\u{..}` escapes rather than dropped or
//! replaced by a browser; [`url_enc`] encodes values inside a link's query.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use maud::{html, Markup, PreEscaped, Render, DOCTYPE};

use crate::admin::rfc3339;
use crate::error::fmt_duration;

/// Text from the database, escaped by maud, with control characters other than line breaks
/// and tabs shown as `\u{..}`.
pub(crate) struct Shown<'a>(pub(crate) &'a str);

impl Render for Shown<'_> {
    fn render_to(&self, buffer: &mut String) {
        let mut esc = maud::Escaper::new(buffer);
        for c in self.0.chars() {
            match c {
                '\n' | '\t' => {
                    let _ = esc.write_char(c);
                }
                c if c.is_control() => {
                    let _ = write!(esc, "\\u{{{:x}}}", c as u32);
                }
                c => {
                    let _ = esc.write_char(c);
                }
            }
        }
    }
}

/// Percent-encodes a value for a URL query or path segment.
pub(crate) fn url_enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// An instant as `2024-05-01 12:00:00 UTC`, with its full RFC 3339 form as a tooltip.
#[derive(Clone, Copy)]
pub(crate) struct Time(pub(crate) SystemTime);

impl Render for Time {
    fn render_to(&self, buffer: &mut String) {
        let full = rfc3339(self.0);
        let short = full
            .get(..19)
            .map(|s| s.replace('T', " ") + " UTC")
            .unwrap_or_else(|| full.clone());
        html! { time datetime=(full) title=(full) { (short) } }.render_to(buffer)
    }
}

/// An optional instant; a dim dash when absent.
pub(crate) fn opt_time(t: Option<SystemTime>) -> Markup {
    html! {
        @match t {
            Some(t) => (Time(t)),
            None => span.dim { "–" },
        }
    }
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

/// A status word with its colour.
pub(crate) fn status(s: &str) -> Markup {
    html! { span class={ "status s-" (s) } { (s) } }
}

/// A dim dash, for an empty cell.
pub(crate) fn dash() -> Markup {
    html! { span.dim { "–" } }
}

const STYLE: &str = include_str!("style.css");

/// The script that updates a page's live regions in place (served as `/static/live.js`).
pub(crate) const LIVE_JS: &str = include_str!("live.js");

/// How often live.js reads a page again.
const LIVE_EVERY_MS: u32 = 3000;

/// What the frame of every page needs to know.
pub(crate) struct Frame<'a> {
    /// The path the dashboard is served under (`""` at the root).
    pub(crate) base: &'a str,
    pub(crate) read_only: bool,
}

/// The page frame: head with the style sheet, the navigation, `body`. `refresh`: seconds
/// between automatic reloads (an HTML refresh: works without script).
pub(crate) fn page(
    frame: &Frame<'_>,
    title: &str,
    active: &str,
    refresh: Option<u32>,
    body: Markup,
) -> Markup {
    let base = frame.base;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width,initial-scale=1";
                @if let Some(s) = refresh {
                    // With script, live.js updates the page in place instead.
                    noscript { meta http-equiv="refresh" content=(s); }
                }
                title { (title) " · postpone" }
                style { (PreEscaped(STYLE)) }
                script src={ (base) "/static/live.js" } defer {}
            }
            body data-live-every=(LIVE_EVERY_MS) {
                header {
                    a.brand href={ (base) "/" } { "postpone" }
                    nav {
                        @for (href, name) in [("/", "Overview"), ("/jobs", "Jobs"),
                                              ("/workers", "Workers"), ("/periodic", "Periodic")] {
                            @if name == active {
                                a.on href={ (base) (href) } aria-current="page" { (name) }
                            } @else {
                                a href={ (base) (href) } { (name) }
                            }
                        }
                    }
                    @if frame.read_only {
                        span.ro { "read-only" }
                    }
                    // Shown by live.js on pages with live regions.
                    label.live hidden {
                        input #live-toggle type="checkbox";
                        " Live updates " span #live-state {}
                    }
                }
                main { (body) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_text_leaves_no_markup_and_shows_controls() {
        let s = |t: &str| html! { (Shown(t)) }.into_string();
        assert_eq!(
            s("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert('x')&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(s("a\0b\u{1b}c\nd"), "a\\u{0}b\\u{1b}c\nd");
        assert_eq!(url_enc("a b&c=<"), "a%20b%26c%3D%3C");
        // In an attribute too.
        let a = html! { a title=(Shown("\"><script>")) {} }.into_string();
        assert_eq!(a, "<a title=\"&quot;&gt;&lt;script&gt;\"></a>");
    }

    #[test]
    fn a_time_is_one_element_whatever_surrounds_it() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(86_400);
        let m = html! { h2 { "Progress " small { "(at " (Time(t)) ")" } } }.into_string();
        assert_eq!(
            m,
            "<h2>Progress <small>(at <time datetime=\"1970-01-02T00:00:00.000000Z\" \
             title=\"1970-01-02T00:00:00.000000Z\">1970-01-02 00:00:00 UTC</time>)</small></h2>"
        );
    }

    #[test]
    fn ages_round_for_people() {
        assert_eq!(age(Duration::from_millis(850)), "850ms");
        assert_eq!(age(Duration::from_secs(245)), "4m 05s");
        assert_eq!(age(Duration::from_secs(7800)), "2h 10m");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d 4h");
    }
}
