import json, re, sys, statistics as st
runs = {}
build = None
for line in open(sys.argv[1]):
    m = re.match(r"=== (\w+) ", line)
    if m: build = m.group(1); continue
    if line.startswith("{"):
        d = json.loads(line)
        w = d["what"]
        for k in ("p50", "mean", "p99", "jobs_per_s"):
            if k in d:
                runs.setdefault((w, k), {}).setdefault(build, []).append(d[k])
for (w, k), b in sorted(runs.items()):
    cells = []
    for name in ("before", "after"):
        v = b.get(name, [])
        if v: cells.append(f"{name} median {st.median(v):9.1f} (n={len(v)}, min {min(v):.1f}, max {max(v):.1f})")
    print(f"{w:<22} {k:<10} " + " | ".join(cells))
