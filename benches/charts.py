#!/usr/bin/env python3
"""Tables and SVG charts for benches/compare.sh (python3 standard library only).

    python3 benches/charts.py table OUT
        reads the JSON lines that every system's benchmark printed into OUT/<system>.txt and
        writes OUT/throughput.csv (system,figure,concurrency,jobs_per_s,runs),
        OUT/latency.csv (system,rate,p50_ms,p90_ms,p99_ms,p999_ms) and OUT/soak.csv
        (t_seconds,throughput,p99_ms,table_mb,index_mb,dead_tuples: postpone's steady state at
        its highest concurrency), then prints the comparison table (Markdown, ratio =
        postpone / peer) and writes it to OUT/table.md.

    python3 benches/charts.py draw [--throughput CSV] [--latency CSV] [--soak CSV]
                                   [--soak-title TEXT] [--out DIR] [--note TEXT]
        draws DIR/perf-throughput.svg (jobs/s against concurrency, drain and steady state, one
        line per system), DIR/perf-latency.svg (defer-to-start percentiles per system and
        rate) and DIR/perf-soak.svg (a steady run's timeline), each from its CSV; a chart whose
        CSV is not given or is empty is skipped. Empty cells are allowed (a missing percentile
        or series is left out). --note is printed under every chart (machine, date, command).

    python3 benches/charts.py soak CSV OUT.svg [--title TEXT] [--note TEXT]
        draws OUT.svg from the CSV of the soak (`cargo bench --bench throughput -- --only soak
        --csv CSV`): four stacked panels against time, one point per interval: jobs/s sent
        and started; p50, p99 and p99.9 of the jobs started in the interval (log scale);
        table, all indexes and the claim index, MiB; finished rows, dead tuples, todo rows.

Figures in the JSON lines: `{"what": "worker_c4", "jobs_per_s": ...}` per run (median over
runs), `{"what": "steady_c4", "t_s": ..., "jobs_per_s": ...}` per interval (mean over intervals),
`{"what": "latency...", "p50": ..., "p99": ...}` or `..._ms` keys, with an optional `"rate"`
(jobs/s of an open-loop run; none means an idle worker fed one job at a time).
"""

import csv
import json
import math
import re
import statistics
import sys
from pathlib import Path
from xml.sax.saxutils import escape

SYSTEMS = ["postpone", "graphile-rs", "apalis", "fang", "procrastinate", "graphile", "graphile-lq", "pgboss"]
LABELS = {
    "postpone": "postpone",
    "postpone-delete": "postpone, DeleteJobs::Always",
    "graphile-rs": "graphile_worker (Rust)",
    "apalis": "apalis",
    "fang": "fang",
    "procrastinate": "procrastinate",
    "graphile": "graphile-worker (defaults)",
    "graphile-lq": "graphile-worker (Node, local queue 200)",
    "pgboss": "pg-boss (batch fetch)",
}
# The latency figure runs every system in its default configuration but pg-boss, whose queue
# and worker have LISTEN/NOTIFY turned on (its default is polling every 2 s).
LAT_LABELS = {"pgboss": "pg-boss (LISTEN/NOTIFY)"}
COLORS = {
    "postpone": "#d62728",
    "graphile-rs": "#1f77b4",
    "apalis": "#8c564b",
    "fang": "#7f7f7f",
    "procrastinate": "#ff7f0e",
    "graphile": "#2ca02c",
    "graphile-lq": "#17becf",
    "pgboss": "#9467bd",
}
FIGURES = {
    "defer_one_by_one": "defer one by one",
    "defer_batch1000": "defer in batches of 1,000",
}


def figure_label(fig):
    if fig in FIGURES:
        return FIGURES[fig]
    m = re.fullmatch(r"(worker|steady)_c(\d+)(.*)", fig)
    if m:
        kind = "drain" if m.group(1) == "worker" else "steady state"
        rest = re.sub(r"_args_(\d+)_KiB", r", arguments of \1 KiB", m.group(3))
        return f"{kind}, concurrency {m.group(2)}{rest.replace('_', ' ')}"
    return fig


# postpone's figures of realistic jobs carry their output's size (_output_1_KiB); the peers'
# do not (no output, or an empty one): the table puts them on one row and says so below.
OUTPUTS = set()


def without_output(what):
    m = re.search(r"_output_(\d+)_KiB", what)
    if m:
        OUTPUTS.add(m.group(1))
    return re.sub(r"_output_\d+_KiB", "", what)


def figure_order(fig):
    m = re.fullmatch(r"(worker|steady)_c(\d+)(.*)", fig)
    if fig in FIGURES:
        return (0, list(FIGURES).index(fig), 0, "")
    if m:
        return (1 if m.group(1) == "worker" else 2, int(m.group(2)), 0, m.group(3))
    return (3, 0, 0, fig)


def systems_in(names):
    known = [s for s in SYSTEMS if s in names]
    return known + sorted(n for n in names if n not in SYSTEMS)


def json_lines(path):
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("{") and '"what"' in line:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def first(rec, *keys):
    for k in keys:
        if rec.get(k) is not None:
            return rec[k]
    return None


def harness_figure(rec, suffix):
    """A record of the Rust peers' harness (it has a "system" key) under postpone's figure
    names: drain -> worker_cC, steady_interval -> steady_cC (t -> t_s); None to skip it."""
    what = str(rec["what"])
    if what == "drain":
        return dict(rec, what=f"worker_c{rec['c']}{suffix}")
    if what == "steady_interval":
        return dict(rec, what=f"steady_c{rec['c']}{suffix}", t_s=rec.get("t"))
    if what in FIGURES and not suffix:
        return rec
    return None


def collect(out):
    runs, steady, lat, soak = {}, {}, [], {}
    for path in sorted(out.glob("*.txt")):
        system = path.stem
        if system not in SYSTEMS:  # command.txt, or a log someone kept in the folder
            continue
        suffix = ""
        for rec in json_lines(path):
            what = str(rec["what"])
            # compare.sh writes {"what": "job_sizes", "suffix": ...} before a peer's runs of
            # realistic jobs: the harness's figure names do not carry their sizes.
            if what == "job_sizes":
                suffix = rec.get("suffix", "")
                continue
            if what.startswith("cost"):
                continue
            if "_output_" in what:
                rec = dict(rec, what=without_output(what))
                what = rec["what"]
            if "system" in rec:
                rec = harness_figure(rec, suffix)
                if rec is None:
                    continue
                what = rec["what"]
            if what.endswith("_overall"):
                continue
            p50 = first(rec, "p50", "p50_ms")
            if p50 is not None:
                rate = first(rec, "rate", "rate_per_s", "target_rate")
                lat.append({
                    "system": system,
                    "rate": "idle" if rate is None else rate,
                    "p50_ms": p50,
                    "p90_ms": first(rec, "p90", "p90_ms"),
                    "p99_ms": first(rec, "p99", "p99_ms"),
                    "p999_ms": first(rec, "p999", "p99_9", "p999_ms", "p99_9_ms"),
                })
                continue
            if "jobs_per_s" not in rec or what.startswith("openloop"):
                continue
            if "t_s" in rec:
                steady.setdefault((system, what), []).append(float(rec["jobs_per_s"]))
                if system == "postpone" and "dead_tuples" in rec:
                    soak.setdefault(what, []).append(rec)
            else:
                runs.setdefault((system, what), []).append(float(rec["jobs_per_s"]))
    figures = {}
    for key, v in runs.items():
        figures[key] = (statistics.median(v), len(v))
    for key, v in steady.items():
        figures[key] = (statistics.fmean(v), len(v))
    return figures, lat, soak


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow(["" if x is None else x for x in r])


def table(out):
    figures, lat, soak = collect(out)
    if not figures and not lat:
        sys.exit(f"no figures found in {out}/*.txt: did every benchmark fail?")
    rows = []
    for (system, fig), (v, n) in sorted(figures.items(), key=lambda kv: (figure_order(kv[0][1]), kv[0][0])):
        m = re.search(r"_c(\d+)", fig)
        rows.append((system, fig, m.group(1) if m else "", round(v, 1), n))
    write_csv(out / "throughput.csv", ["system", "figure", "concurrency", "jobs_per_s", "runs"], rows)
    write_csv(out / "latency.csv", ["system", "rate", "p50_ms", "p90_ms", "p99_ms", "p999_ms"],
              [(r["system"], r["rate"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["p999_ms"]) for r in lat])
    if soak:
        fig = max(soak, key=lambda f: (int(re.search(r"_c(\d+)", f).group(1)) if re.search(r"_c(\d+)", f) else 0))
        write_csv(out / "soak.csv", ["t_seconds", "throughput", "p99_ms", "table_mb", "index_mb", "dead_tuples"],
                  [(r["t_s"], r["jobs_per_s"], r.get("p99_ms"), r.get("table_mb"),
                    r.get("index_mb", round(r["due_idx_kb"] / 1024, 2) if "due_idx_kb" in r else None),
                    r["dead_tuples"]) for r in soak[fig]])
    systems = systems_in({s for s, _ in figures})
    peers = [s for s in systems if s != "postpone"]
    lines = ["| jobs per second | postpone | " + " | ".join(f"{LABELS.get(p, p)} | ratio" for p in peers) + " |",
             "| --- | ---: |" + " ---: | ---: |" * len(peers)]
    for fig in sorted({f for _, f in figures}, key=figure_order):
        mine = figures.get(("postpone", fig), (None, 0))[0]
        cells = [figure_label(fig), "-" if mine is None else f"{mine:,.0f}"]
        for p in peers:
            theirs = figures.get((p, fig), (None, 0))[0]
            cells.append("-" if theirs is None else f"{theirs:,.0f}")
            cells.append(f"{mine / theirs:.1f}x" if mine is not None and theirs else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if lat:
        lines += ["", "| defer-to-start latency, ms | rate | p50 | p90 | p99 | p99.9 |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in sorted(lat, key=lambda r: systems_in({x["system"] for x in lat}).index(r["system"])):
            cells = [LAT_LABELS.get(r["system"], LABELS.get(r["system"], r["system"])), str(r["rate"])]
            cells += ["-" if r[k] is None else f"{float(r[k]):.2f}" for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms")]
            lines.append("| " + " | ".join(cells) + " |")
    if OUTPUTS and any("_args_" in f for _, f in figures):
        lines.append(f"\nRows with arguments: postpone's task also sets an output of {', '.join(sorted(OUTPUTS))} KiB "
                     "(job.set_output); graphile-worker, graphile_worker and fang store no output, apalis "
                     "stores the harness handler's empty result. The Rust peers' payloads are set by a trigger "
                     "on their job tables (benches/compare.sh), their workers fetch and decode them.")
    lines += cost_table(out)
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    print(text, end="")


def cost_table(out):
    """The per-job costs that benches/costs.py wrote to OUT/costs.txt, as Markdown lines."""
    path = out / "costs.txt"
    recs = [r for r in json_lines(path) if r.get("what") == "cost"] if path.exists() else []
    if not recs:
        return []
    order = ["postpone", "postpone-delete"] + [s for s in SYSTEMS if s != "postpone"]
    recs.sort(key=lambda r: order.index(r["system"]) if r["system"] in order else len(order))
    r0 = recs[0]
    fmt = lambda v, p=0: "-" if v is None else f"{float(v):,.{p}f}"  # noqa: E731
    lines = ["", f"| per job: defer {r0['n']:,} jobs, drain them at concurrency {r0['c']} | defer | WAL bytes, run's database | WAL bytes, whole server | server CPU µs | client CPU µs | vacuum after: WAL bytes | vacuum after: server CPU µs | load average |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in recs:
        lines.append("| " + " | ".join([
            LABELS.get(r["system"], r["system"]), r["defer"], fmt(r["wal_bytes_per_job"]),
            fmt(r["wal_bytes_per_job_server"]), fmt(r["server_cpu_us_per_job"], 1),
            fmt(r["client_cpu_us_per_job"], 1), fmt(r["vacuum_after_wal_bytes_per_job"]),
            fmt(r["vacuum_after_server_cpu_us_per_job"], 1), str(r["load"])]) + " |")
    lines.append(f"\nserver CPU: {r0['server_cpu']}, the difference between a run of {r0['n']:,} jobs and one of {r0['n0']:,}")
    return lines


# ---- SVG ----------------------------------------------------------------------------------

FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


class Svg:
    def __init__(self, w, h):
        self.w, self.h, self.parts = w, h, []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", color="#222", weight="normal", rotate=None):
        rot = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
                 f'font-weight="{weight}" {FONT}{rot}>{escape(str(s))}</text>')

    def line(self, x1, y1, x2, y2, color="#ccc", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" stroke-width="{width}"{d}/>')

    def save(self, path):
        body = "\n".join(self.parts)
        Path(path).write_text(
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
            f'viewBox="0 0 {self.w} {self.h}">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')
        print(f"wrote {path}")


def log_ticks(lo, hi):
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


def nice(v):
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


class Panel:
    """A plotting area with a log or linear y axis and categorical or linear x."""

    def __init__(self, svg, x, y, w, h, ymin, ymax, log=True, title="", ylabel=""):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, w, h
        self.log = log
        if log:
            self.ymin = 10 ** math.floor(math.log10(max(ymin, 1e-3)))
            self.ymax = 10 ** math.ceil(math.log10(max(ymax, self.ymin * 10)))
        else:
            self.ymin, self.ymax = 0.0, nice_ceiling(ymax)
        svg.add(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="#fafafa" stroke="#999"/>')
        ticks = log_ticks(self.ymin, self.ymax) if log else [self.ymax * i / 5 for i in range(6)]
        for t in ticks:
            ty = self.ty(t)
            major = not log or math.log10(t) == int(math.log10(t))
            svg.line(x, ty, x + w, ty, "#ddd" if major else "#eee")
            svg.text(x - 5, ty + 4, nice(t) if log else (f"{t:,.0f}" if t >= 100 else f"{t:g}"), 10, "end", "#555")
        if title:
            svg.text(x + w / 2, y - 8, title, 13, "middle", weight="bold")
        if ylabel:
            svg.text(x - 42, y + h / 2, ylabel, 11, "middle", "#333", rotate=-90)

    def ty(self, v):
        if self.log:
            v = max(v, self.ymin)
            f = (math.log10(v) - math.log10(self.ymin)) / (math.log10(self.ymax) - math.log10(self.ymin))
        else:
            f = (v - self.ymin) / (self.ymax - self.ymin or 1)
        return self.y + self.h - f * self.h


def nice_ceiling(v):
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if v <= m * e:
            return m * e
    return 10 * e


def note_width(svg):
    return max(60, int((svg.w - 24) / 5.8))


def note_lines(svg, note, y):
    for i, line in enumerate(wrap(note, note_width(svg))):
        svg.text(12, y + 14 * i, line, 10, color="#666")


def wrap(text, width):
    out = []
    for para in text.split("\n"):
        line = ""
        for word in para.split(" "):
            if line and len(line) + 1 + len(word) > width:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    return out


def read_csv(path):
    if not path or not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def draw_throughput(rows, path, note):
    data = {}  # kind -> system -> {conc: rate}
    for r in rows:
        m = re.fullmatch(r"(worker|steady)_c(\d+)", r["figure"])
        if m and num(r["jobs_per_s"]):
            data.setdefault(m.group(1), {}).setdefault(r["system"], {})[int(m.group(2))] = num(r["jobs_per_s"])
    if not data:
        return
    kinds = [k for k in ("worker", "steady") if k in data]
    vals = [v for k in kinds for s in data[k].values() for v in s.values()]
    concs = sorted({c for k in kinds for s in data[k].values() for c in s})
    systems = systems_in({s for k in kinds for s in data[k]})
    pw, ph, left, top = 380, 300, 70, 60
    n_note = len(wrap(note, int((left + len(kinds) * (pw + 60) - 14) / 5.8))) if note else 0
    svg = Svg(left + len(kinds) * (pw + 60) + 10, top + ph + 60 + 18 * len(systems) + 14 * n_note + 20)
    svg.text(12, 22, "Throughput against concurrency (no-op jobs, jobs/s, log scale)", 15, weight="bold")
    for i, kind in enumerate(kinds):
        px = left + i * (pw + 60)
        p = Panel(svg, px, top, pw, ph, min(vals), max(vals), True,
                  "drain a filled queue" if kind == "worker" else "steady state (producer keeps N pending)",
                  "jobs per second")
        xs = {c: px + pw * (j + 0.5) / len(concs) for j, c in enumerate(concs)}
        for c, xx in xs.items():
            svg.line(xx, top + ph, xx, top + ph + 4, "#555")
            svg.text(xx, top + ph + 17, str(c), 11, "middle", "#333")
        svg.text(px + pw / 2, top + ph + 34, "concurrency", 11, "middle", "#333")
        for s in systems:
            pts = sorted(data[kind].get(s, {}).items())
            if not pts:
                continue
            color = COLORS.get(s, "#555")
            dash = ' stroke-dasharray="6 3"' if s == "graphile-lq" else ""
            coords = " ".join(f"{xs[c]:.1f},{p.ty(v):.1f}" for c, v in pts)
            svg.add(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            for c, v in pts:
                svg.add(f'<circle cx="{xs[c]:.1f}" cy="{p.ty(v):.1f}" r="3.5" fill="{color}"><title>{escape(LABELS.get(s, s))}, '
                        f'concurrency {c}: {v:,.0f} jobs/s</title></circle>')
                if s == "postpone":
                    svg.text(xs[c] + 6, p.ty(v) - 6, f"{v:,.0f}", 10, color=color)
    ly = top + ph + 56
    for j, s in enumerate(systems):
        color = COLORS.get(s, "#555")
        dash = "6 3" if s == "graphile-lq" else None
        svg.line(left, ly + 18 * j - 4, left + 26, ly + 18 * j - 4, color, 2, dash)
        svg.text(left + 34, ly + 18 * j, LABELS.get(s, s), 11)
    if note:
        note_lines(svg, note, ly + 18 * len(systems) + 10)
    svg.save(path)


def draw_latency(rows, path, note):
    rows = [r for r in rows if num(r.get("p50_ms")) is not None]
    if not rows:
        return
    keys = [("p50_ms", "p50", "#9ecae1"), ("p90_ms", "p90", "#6baed6"), ("p99_ms", "p99", "#3182bd"),
            ("p999_ms", "p99.9", "#08519c")]
    order = systems_in({r["system"] for r in rows})
    rows.sort(key=lambda r: (order.index(r["system"]), num(r["rate"]) or 0))
    vals = [num(r[k]) for r in rows for k, _, _ in keys if num(r.get(k))]
    gw = 110
    left, top, ph = 70, 60, 280
    pw = max(600, gw * len(rows))
    n_note = len(wrap(note, int((left + pw + 6) / 5.8))) if note else 0
    svg = Svg(left + pw + 30, top + ph + 80 + 14 * n_note + 10)
    svg.text(12, 22, "Defer-to-start latency (ms, log scale)", 15, weight="bold")
    p = Panel(svg, left, top, pw, ph, min(vals), max(vals), True, "", "milliseconds")
    slot = pw / len(rows)
    bw = min(18, slot / (len(keys) + 1.5))
    for i, r in enumerate(rows):
        cx = left + slot * (i + 0.5)
        for j, (k, name, color) in enumerate(keys):
            v = num(r.get(k))
            if v is None:
                continue
            bx = cx + (j - len(keys) / 2) * bw
            y = p.ty(v)
            svg.add(f'<rect x="{bx:.1f}" y="{y:.1f}" width="{bw - 1:.1f}" height="{top + ph - y:.1f}" fill="{color}">'
                    f'<title>{escape(r["system"])} {name}: {v:.2f} ms</title></rect>')
        label = LAT_LABELS.get(r["system"], LABELS.get(r["system"], r["system"])).replace(" (", "\n(")
        rate = r.get("rate") or "idle"
        sub = "one job at a time" if rate == "idle" else f"{float(rate):,.0f} jobs/s"
        for k, part in enumerate(label.split("\n") + [sub]):
            svg.text(cx, top + ph + 15 + 12 * k, part, 10, "middle", COLORS.get(r["system"], "#333") if k == 0 else "#555")
    for j, (_, name, color) in enumerate(keys):
        lx = left + pw - 60 * (len(keys) - j)
        svg.add(f'<rect x="{lx}" y="38" width="12" height="12" fill="{color}"/>')
        svg.text(lx + 16, 48, name, 11)
    if note:
        note_lines(svg, note, top + ph + 66)
    svg.save(path)


def draw_soak(rows, path, note, title=""):
    series = [("throughput", "jobs/s", "#d62728"), ("p99_ms", "p99 latency, ms", "#3182bd"),
              ("table_mb", "table, MiB", "#2ca02c"), ("index_mb", "claim index, MiB", "#17becf"),
              ("dead_tuples", "dead tuples", "#7f7f7f")]
    if not rows or any(num(r.get("t_seconds")) is None for r in rows):
        return
    present = [s for s in series if any(num(r.get(s[0])) is not None for r in rows)]
    # table and index share a panel (both MiB)
    panels = []
    for key, label, color in present:
        dash = "5 3" if key == "index_mb" else None
        if key == "index_mb" and any(p[0][0] == "table_mb" for p in panels):
            next(p for p in panels if p[0][0] == "table_mb").append((key, label, color, dash))
        else:
            panels.append([(key, label, color, dash)])
    panels = [(" / ".join(label for _, label, _, _ in group), False, group) for group in panels]
    timeline(rows, "t_seconds", panels, path, note,
             title or "postpone's steady state over time (a producer keeps the queue filled)")


def timeline(rows, tkey, panels, path, note, title, legend=False, nice_ticks=False, pw=620):
    """Stacked panels sharing a time axis (`tkey`, seconds). `panels` is a list of (title,
    log scale, [(column, label, colour, dash or None)]); a column without a number in a row
    leaves that point out. With `legend`, each panel's title is on its left and its series'
    colours on its right."""
    ts = [num(r.get(tkey)) for r in rows]
    left, top, ph, gap = 80, 50, 110, 34
    n_note = len(wrap(note, int((left + pw + 6) / 5.8))) if note else 0
    svg = Svg(left + pw + 30, top + len(panels) * (ph + gap) + 30 + 14 * n_note)
    svg.text(12, 22, title, 15, weight="bold")
    tmax = max(ts) or 1
    if nice_ticks:
        step = nice_ceiling(tmax / 6)
        xticks = [step * j for j in range(int(tmax / step) + 1)]
    else:
        xticks = [tmax * j / 5 for j in range(6)]
    for i, (ptitle, log, group) in enumerate(panels):
        py = top + i * (ph + gap)
        vals = [num(r.get(k)) for k, _, _, _ in group for r in rows if num(r.get(k)) is not None]
        if log:
            vals = [v for v in vals if v > 0]
        lo = min(vals) if vals else 1
        p = Panel(svg, left, py, pw, ph, lo if log else 0, max(vals) if vals else 1, log,
                  "" if legend else ptitle)
        if legend:
            svg.text(left, py - 8, ptitle, 12, weight="bold")
            lx = left + pw
            for k, label, color, dash in reversed(group):
                lx -= 40 + 6 * len(label)
                svg.line(lx, py - 12, lx + 20, py - 12, color, 2, dash)
                svg.text(lx + 24, py - 8, label, 10, color="#333")
        for k, label, color, dash in group:
            pts = [(num(r[tkey]), num(r.get(k))) for r in rows if num(r.get(k)) is not None]
            if log:
                pts = [(t, v) for t, v in pts if v > 0]
            coords = " ".join(f"{left + pw * t / tmax:.1f},{p.ty(v):.1f}" for t, v in pts)
            d = f' stroke-dasharray="{dash}"' if dash else ""
            svg.add(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{d}/>')
            for t, v in pts:
                cx, cy = left + pw * t / tmax, p.ty(v)
                tip = f"<title>{escape(label)} at {t:.0f} s: {v:,.2f}</title>" if legend else ""
                svg.add(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="{color}"'
                        + (f">{tip}</circle>" if tip else "/>"))
        for t in xticks:
            svg.text(left + pw * t / tmax, py + ph + 13, f"{t:.0f}", 10, "middle", "#555")
    svg.text(left + pw / 2, top + len(panels) * (ph + gap) - 4, "seconds since the start", 11, "middle", "#333")
    if note:
        note_lines(svg, note, top + len(panels) * (ph + gap) + 14)
    svg.save(path)


def draw_soak_run(rows, path, note, title=""):
    """The CSV of `cargo bench --bench throughput -- --only soak --csv PATH`: one row per
    interval."""
    rows = [r for r in rows if num(r.get("t_s")) is not None]
    if not rows:
        sys.exit("no rows with a t_s column: is this the CSV of `--only soak`?")
    for r in rows:
        kb = num(r.get("due_idx_kb"))
        r["due_idx_mb"] = None if kb is None else kb / 1024
    panels = [
        ("jobs per second", False, [("started_per_s", "started", "#d62728", None),
                                    ("sent_per_s", "sent", "#7f7f7f", "5 3")]),
        ("latency of the jobs started in the interval, ms (log scale)", True,
         [("p50_ms", "p50", "#9ecae1", None), ("p99_ms", "p99", "#3182bd", None),
          ("p999_ms", "p99.9", "#08519c", "5 3")]),
        ("size, MiB", False, [("table_mb", "table", "#2ca02c", None),
                              ("index_mb", "all indexes", "#17becf", None),
                              ("due_idx_mb", "claim (due) index", "#9467bd", "5 3")]),
        ("rows", False, [("finished", "finished rows", "#2ca02c", None),
                         ("dead_tuples", "dead tuples", "#7f7f7f", None),
                         ("todo", "todo rows", "#d62728", "5 3")]),
    ]
    timeline(rows, "t_s", panels, path, note,
             title or "Soak at a fixed open-loop rate with retention on (one point per interval)",
             legend=True, nice_ticks=True, pw=700)


def main(argv):
    if len(argv) >= 2 and argv[0] == "table":
        table(Path(argv[1]))
        return
    if len(argv) >= 3 and argv[0] == "soak":
        opts, i = {}, 3
        while i < len(argv):
            if argv[i] not in ("--title", "--note") or i + 1 >= len(argv):
                sys.exit(f"unknown or incomplete option {argv[i]!r}; see the top of {__file__}")
            opts[argv[i][2:]] = argv[i + 1]
            i += 2
        Path(argv[2]).parent.mkdir(parents=True, exist_ok=True)
        draw_soak_run(read_csv(argv[1]), argv[2], opts.get("note", ""), opts.get("title", ""))
        return
    if argv and argv[0] == "draw":
        opts, i = {}, 1
        while i < len(argv):
            if argv[i] not in ("--throughput", "--latency", "--soak", "--soak-title", "--out", "--note") or i + 1 >= len(argv):
                sys.exit(f"unknown or incomplete option {argv[i]!r}; see the top of {__file__}")
            opts[argv[i][2:]] = argv[i + 1]
            i += 2
        out = Path(opts.get("out", "."))
        out.mkdir(parents=True, exist_ok=True)
        note = opts.get("note", "")
        draw_throughput(read_csv(opts.get("throughput")), out / "perf-throughput.svg", note)
        draw_latency(read_csv(opts.get("latency")), out / "perf-latency.svg", note)
        draw_soak(read_csv(opts.get("soak")), out / "perf-soak.svg", note, opts.get("soak-title", ""))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
