//! The overview's history: jobs finished per outcome and per queue, and the wait before
//! start (p50 and p99), over the last hour, day or week, read from `postpone_stats` (the
//! rollup a statement trigger keeps, schema version 19) and drawn as inline SVG.
//!
//! Reads are bounded: the rollup holds minutes for 2 hours and hours for 8 days, so the
//! week is at most 168 time buckets per queue and outcome, summed in the database; the
//! wait histograms come back summed per bar.

use std::collections::BTreeMap;
use std::time::Duration;

use maud::{html, Markup};

use super::html::{age, Shown};
use crate::conn::Connection;
use crate::error::Result;
use crate::store;

/// The span of the history shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Range {
    Hour,
    Day,
    Week,
}

impl Range {
    pub(crate) const ALL: [Range; 3] = [Range::Hour, Range::Day, Range::Week];

    pub(crate) fn from_name(s: &str) -> Option<Range> {
        Range::ALL.into_iter().find(|r| r.name() == s)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Week => "week",
        }
    }

    /// The rollup's rows it reads, the number of bars and each bar's width in seconds.
    fn plan(self) -> (&'static str, usize, i64) {
        match self {
            Range::Hour => ("minute", 60, 60),
            Range::Day => ("hour", 24, 3600),
            Range::Week => ("hour", 168, 3600),
        }
    }

    fn oldest_label(self) -> &'static str {
        match self {
            Range::Hour => "60 min ago",
            Range::Day => "24 h ago",
            Range::Week => "7 days ago",
        }
    }

    fn bar_label(self) -> &'static str {
        match self {
            Range::Hour => "min",
            Range::Day | Range::Week => "h",
        }
    }
}

/// Outcomes in the order the charts stack them, with their colours.
pub(crate) const OUTCOMES: [(&str, &str); 4] = [
    ("succeeded", "#2e9d52"),
    ("failed", "#c9302c"),
    ("cancelled", "#c28a00"),
    ("aborted", "#7b4fd0"),
];
/// Colours of the queues' series; past these, queues are summed as "other".
const QUEUE_COLOURS: [&str; 6] = [
    "#2456a6", "#2e9d52", "#c28a00", "#7b4fd0", "#0e8a8a", "#c9302c",
];

/// The history of one range: bar `i` is `i` bars ago counted from the newest (index 0).
#[derive(Debug, Default)]
pub(crate) struct History {
    bars: usize,
    /// Jobs per (queue, outcome), one count per bar.
    counts: BTreeMap<(String, String), Vec<u64>>,
    /// Jobs per wait bucket, per bar.
    waits: Vec<BTreeMap<usize, u64>>,
}

/// Buckets of the wait histograms (`w0` to `w23` in `postpone_stats`).
const BUCKETS: usize = 24;

/// Reads the history of `range` (of one queue, or all).
pub(crate) fn history(conn: &mut Connection, range: Range, queue: Option<&str>) -> Result<History> {
    let (span, bars, width) = range.plan();
    let n = bars as i32;
    let params: [&(dyn postgres::types::ToSql + Sync); 4] = [&span, &n, &width, &queue];
    let mut h = History {
        bars,
        counts: BTreeMap::new(),
        waits: vec![BTreeMap::new(); bars],
    };
    for r in conn.query_named(
        "reading the history of finished jobs",
        store::STATS_HISTORY_COUNTS,
        &params,
    )? {
        let Some(ago) = usize::try_from(r.get::<_, i32>(0))
            .ok()
            .filter(|a| *a < bars)
        else {
            continue;
        };
        let per = h
            .counts
            .entry((r.get(1), r.get(2)))
            .or_insert_with(|| vec![0; bars]);
        per[ago] += r.get::<_, i64>(3).max(0) as u64;
    }
    for r in conn.query_named(
        "reading the history of waits",
        store::STATS_HISTORY_WAITS,
        &params,
    )? {
        let Some(ago) = usize::try_from(r.get::<_, i32>(0))
            .ok()
            .filter(|a| *a < bars)
        else {
            continue;
        };
        for b in 0..BUCKETS {
            let n = r.get::<_, Option<i64>>(b + 1).unwrap_or(0).max(0) as u64;
            if n > 0 {
                *h.waits[ago].entry(b).or_default() += n;
            }
        }
    }
    Ok(h)
}

/// The upper bound of wait bucket `b`: 1 ms for bucket 0 (under a millisecond), else 2^b
/// ms (the last bucket holds every longer wait too).
fn bucket_top(b: usize) -> Duration {
    Duration::from_millis(1u64 << b.min(BUCKETS - 1))
}

/// The `q` quantile of a histogram (the top of the bucket that holds it), if it has jobs.
pub(crate) fn quantile(hist: &BTreeMap<usize, u64>, q: f64) -> Option<Duration> {
    let total: u64 = hist.values().sum();
    if total == 0 {
        return None;
    }
    let want = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (b, n) in hist {
        seen += n;
        if seen >= want {
            return Some(bucket_top(*b));
        }
    }
    hist.keys().last().map(|b| bucket_top(*b))
}

const W: f64 = 720.0;
const H: f64 = 150.0;
const PAD_L: f64 = 8.0;
const PAD_R: f64 = 8.0;
const PAD_T: f64 = 22.0;
const PAD_B: f64 = 20.0;

/// Stacked bars, oldest left: one series per (label, colour, counts by bars ago).
fn stacked(range: Range, title: &str, series: &[(String, &str, Vec<u64>)], bars: usize) -> Markup {
    let totals: Vec<u64> = (0..bars)
        .map(|i| series.iter().map(|s| s.2[i]).sum())
        .collect();
    let peak = totals.iter().copied().max().unwrap_or(0).max(1);
    let plot_h = H - PAD_T - PAD_B;
    let bar_w = (W - PAD_L - PAD_R) / bars as f64;
    let base = H - PAD_B;
    let sum: u64 = totals.iter().sum();
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (W) " " (H) } width=(W) height=(H)
            role="img" aria-label={ (title) ": " (sum) " jobs over the last " (range.name()) } {
            rect x="0" y="0" width=(W) height=(H) fill="#fff" {}
            line x1=(PAD_L) y1=(base) x2=(W - PAD_R) y2=(base) stroke="#c8cdd2" {}
            text x=(PAD_L) y="14" font-size="12" fill="#444" {
                "peak " (peak) "/" (range.bar_label())
            }
            @for i in 0..bars {
                @let x = PAD_L + (bars - 1 - i) as f64 * bar_w;
                @let mut y = base;
                @for s in series {
                    @let n = s.2[i];
                    @if n > 0 {
                        @let h = (n as f64 / peak as f64 * plot_h).max(1.0);
                        @let top = { y -= h; y };
                        rect x=(format!("{x:.1}")) y=(format!("{top:.1}"))
                             width=(format!("{:.1}", (bar_w - 1.0).max(1.0))) height=(format!("{h:.1}"))
                             fill=(s.1) {
                            title { (i) " " (range.bar_label()) " ago: " (n) " " (Shown(&s.0)) }
                        }
                    }
                }
            }
            text x=(PAD_L) y=(H - 5.0) font-size="11" fill="#888" { (range.oldest_label()) }
            text x=(W - PAD_R) y=(H - 5.0) font-size="11" fill="#888" text-anchor="end" { "now" }
        }
        p.legend {
            @for s in series {
                span.key { span.swatch style={ "background:" (s.1) } {} (Shown(&s.0)) " " (s.2.iter().sum::<u64>()) }
            }
        }
    }
}

/// The throughput per outcome of `h`.
pub(crate) fn by_outcome(range: Range, h: &History) -> Markup {
    let series: Vec<(String, &str, Vec<u64>)> = OUTCOMES
        .iter()
        .map(|(o, colour)| {
            let mut v = vec![0u64; h.bars];
            for ((_, outcome), counts) in &h.counts {
                if outcome == o {
                    for (i, n) in counts.iter().enumerate() {
                        v[i] += n;
                    }
                }
            }
            (o.to_string(), *colour, v)
        })
        .collect();
    stacked(range, "jobs finished per outcome", &series, h.bars)
}

/// The throughput per queue of `h`: the busiest queues, the rest as "other".
pub(crate) fn by_queue(range: Range, h: &History) -> Markup {
    let mut per: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for ((queue, _), counts) in &h.counts {
        let v = per.entry(queue).or_insert_with(|| vec![0; h.bars]);
        for (i, n) in counts.iter().enumerate() {
            v[i] += n;
        }
    }
    let mut queues: Vec<(&str, Vec<u64>)> = per.into_iter().collect();
    queues.sort_by_key(|(q, v)| (std::cmp::Reverse(v.iter().sum::<u64>()), q.to_string()));
    let mut series: Vec<(String, &str, Vec<u64>)> = Vec::new();
    let mut other = vec![0u64; h.bars];
    for (i, (q, v)) in queues.into_iter().enumerate() {
        if i < QUEUE_COLOURS.len() - 1 {
            series.push((q.to_owned(), QUEUE_COLOURS[i], v));
        } else {
            for (j, n) in v.iter().enumerate() {
                other[j] += n;
            }
        }
    }
    if other.iter().any(|n| *n > 0) {
        series.push(("other queues".to_owned(), "#98a2b3", other));
    }
    stacked(range, "jobs finished per queue", &series, h.bars)
}

/// The wait before start, p50 and p99 per bar, as two lines; the range's overall figures
/// in the legend.
pub(crate) fn waits(range: Range, h: &History) -> Markup {
    let p = |q: f64| -> Vec<Option<Duration>> { h.waits.iter().map(|w| quantile(w, q)).collect() };
    let (p50, p99) = (p(0.5), p(0.99));
    let mut all: BTreeMap<usize, u64> = BTreeMap::new();
    for w in &h.waits {
        for (b, n) in w {
            *all.entry(*b).or_default() += n;
        }
    }
    let peak = p99
        .iter()
        .flatten()
        .max()
        .copied()
        .unwrap_or(Duration::from_millis(1))
        .as_secs_f64()
        .max(0.001);
    let bars = h.bars;
    let step = (W - PAD_L - PAD_R) / bars as f64;
    let plot_h = H - PAD_T - PAD_B;
    let point = |i: usize, d: Duration| -> String {
        let x = PAD_L + (bars - 1 - i) as f64 * step + step / 2.0;
        let y = H - PAD_B - d.as_secs_f64() / peak * plot_h;
        format!("{x:.1},{y:.1}")
    };
    let line = |v: &[Option<Duration>]| -> String {
        (0..bars)
            .rev()
            .filter_map(|i| v[i].map(|d| point(i, d)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let overall = |q: f64| quantile(&all, q).map(age).unwrap_or_else(|| "–".to_owned());
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (W) " " (H) } width=(W) height=(H)
            role="img" aria-label={ "wait before start over the last " (range.name())
                                    ": p50 " (overall(0.5)) ", p99 " (overall(0.99)) } {
            rect x="0" y="0" width=(W) height=(H) fill="#fff" {}
            line x1=(PAD_L) y1=(H - PAD_B) x2=(W - PAD_R) y2=(H - PAD_B) stroke="#c8cdd2" {}
            text x=(PAD_L) y="14" font-size="12" fill="#444" {
                "top " (age(Duration::from_secs_f64(peak)))
            }
            polyline points=(line(&p99)) fill="none" stroke="#c9302c" stroke-width="1.5" {}
            polyline points=(line(&p50)) fill="none" stroke="#2456a6" stroke-width="1.5" {}
            @for i in 0..bars {
                @if let (Some(a), Some(b)) = (p50[i], p99[i]) {
                    circle cx=(point(i, b).split(',').next().unwrap_or("0"))
                           cy=(point(i, b).split(',').nth(1).unwrap_or("0")) r="1.8" fill="#c9302c" {
                        title { (i) " " (range.bar_label()) " ago: p50 " (age(a)) ", p99 " (age(b)) }
                    }
                }
            }
            text x=(PAD_L) y=(H - 5.0) font-size="11" fill="#888" { (range.oldest_label()) }
            text x=(W - PAD_R) y=(H - 5.0) font-size="11" fill="#888" text-anchor="end" { "now" }
        }
        p.legend {
            span.key { span.swatch style="background:#2456a6" {} "p50 " (overall(0.5)) }
            span.key { span.swatch style="background:#c9302c" {} "p99 " (overall(0.99)) }
            span.dim { " (between being due and starting; to within a factor of 1.4)" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_bucket_tops() {
        let mut h = BTreeMap::new();
        assert_eq!(quantile(&h, 0.5), None);
        h.insert(0, 98); // under 1 ms
        h.insert(10, 2); // 2^9 to 2^10 ms
        assert_eq!(quantile(&h, 0.5), Some(Duration::from_millis(1)));
        assert_eq!(quantile(&h, 0.99), Some(Duration::from_millis(1024)));
        assert_eq!(quantile(&h, 0.98), Some(Duration::from_millis(1)));
    }

    #[test]
    fn bars_stack_per_outcome_oldest_left() {
        let mut h = History {
            bars: 60,
            counts: BTreeMap::new(),
            waits: vec![BTreeMap::new(); 60],
        };
        let mut ok = vec![0; 60];
        ok[0] = 10;
        let mut bad = vec![0; 60];
        bad[0] = 2;
        h.counts.insert(("q".into(), "succeeded".into()), ok);
        h.counts.insert(("q".into(), "failed".into()), bad);
        let svg = by_outcome(Range::Hour, &h).into_string();
        assert_eq!(svg.matches("<rect").count(), 3, "{svg}"); // background + 2
        assert!(svg.contains("0 min ago: 10 succeeded"));
        assert!(svg.contains("0 min ago: 2 failed"));
        assert!(svg.contains("succeeded 10") && svg.contains("failed 2"));
    }
}
