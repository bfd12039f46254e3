#!/usr/bin/env python3
"""Folded stacks from `perf script -F pid,tid,ip,sym,dso` for the given pids (comma-separated):
one line per distinct stack, "COUNT root;...;leaf". Unresolved frames (static functions of a
stripped postgres) are kept only as leaves. Usage: fold.py SCRIPT.txt PIDS > folded.txt"""
import sys, collections
path, pids = sys.argv[1], set(sys.argv[2].split(","))
out = collections.Counter(); cur=None; frames=[]
def flush():
    if cur in pids and frames:
        out[";".join(reversed(frames))] += 1
for line in open(path, errors="replace"):
    if not line.strip():
        flush(); cur, frames = None, []; continue
    if not line.startswith("\t") and not line.startswith(" " * 8):
        cur = line.split()[0].split("/")[0]; frames = []; continue
    parts = line.strip().split(None, 1)
    if len(parts) < 2: continue
    sym, _, dso = parts[1].rpartition(" (")
    dso = dso.rstrip(")").rsplit("/", 1)[-1]
    if sym.startswith("[unknown]") or sym.startswith("0x") or not sym: sym = "?" + dso.split(".")[0]
    if sym.startswith("?") and frames: continue  # unresolved (static) frames only as leaves
    if frames and frames[-1] == sym: continue  # collapse runs
    frames.append(sym)
flush()
for k, v in out.items(): print(v, k)
