#!/usr/bin/env python3
"""tree.py FOLDED ROOT [MINPCT] [MAXDEPTH]: call tree under ROOT (merged), % of all samples."""
import sys, collections
f, root = sys.argv[1], sys.argv[2]
minp = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
maxd = int(sys.argv[4]) if len(sys.argv) > 4 else 30
rows = []
for l in open(f):
    c, s = l.rstrip("\n").split(" ", 1); rows.append((int(c), s.split(";")))
tot = sum(c for c, _ in rows)
def node(): return [0, collections.defaultdict(node)]
t = node()
for c, st in rows:
    if root not in st: continue
    rest = st[st.index(root):]
    n = t; n[0] += c
    for fr in rest:
        n = n[1][fr]; n[0] += c
def pr(n, name, d):
    if 100 * n[0] / tot < minp or d > maxd: return
    selfc = n[0] - sum(k[0] for k in n[1].values())
    print(f"{'  '*d}{100*n[0]/tot:5.1f}% {name}" + (f"  [self {100*selfc/tot:.1f}%]" if selfc and n[1] else ""))
    for k, v in sorted(n[1].items(), key=lambda kv: -kv[1][0]): pr(v, k, d + 1)
pr(t[1][root], root, 0)
