#!/usr/bin/env python3
"""Where postpone's WAL goes, per job: runs benches/wal.rs (defer N jobs in batches of 1,000,
drain them at concurrency C) and breaks the WAL of each phase down with pg_waldump, by kind
of record and relation, full-page images apart, and by the statement each transaction ran.

    python3 benches/wal.py [--port PORT | --cluster] [--bin PATH] [--json FILE] -- ARGS...

ARGS go to the bench (e.g. --n 30000 --c 4 --delete). --cluster starts a cluster of its own
(benches/cluster.sh, default settings; pg_stat_statements loaded, so that the bench can also
print the WAL of each statement) and removes it at the end; --port uses a running server on
127.0.0.1 (its data directory must be readable here, for pg_waldump). --json FILE reads a
bench's output instead of running it (the server's WAL must still be there). The bench is
target/release's `wal-*` binary (`cargo bench --bench wal --no-run` builds it) unless --bin.

A drain transaction is named by what it did to the jobs table: `claim` (it locked rows of
postpone_jobs: the claim's FOR UPDATE), `finish` (it wrote postpone_stats, which only a
final outcome does), `start` (an update of jobs with neither), `other` (anything else:
registration, heartbeats, the worker's vacuum...). Prints a table per phase and a JSON line
with the totals; python3 standard library and pg_waldump only.
"""

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REC = re.compile(r"^rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+), lsn: \S+, prev \S+, desc: (.*)$")
BLK = re.compile(r"blkref #(\d+): rel \d+/(\d+)/(\d+)(?: fork (\w+))? blk (\d+)( FPW)?")


def pg_bin():
    return sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]


def waldump(waldir, start, end):
    """Records in [start, end): (rmgr, type, rec_len, tot_len, xid, [(db, node, fork, blk, fpw)])."""
    r = subprocess.run([os.path.join(pg_bin(), "pg_waldump"), "-p", waldir, "-s", start, "-e", end],
                       capture_output=True, text=True)
    out = []
    for line in r.stdout.splitlines():
        m = REC.match(line)
        if not m:
            continue
        rmgr, rec, tot, xid, desc = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)
        kind = desc.split(" ", 1)[0].rstrip(",;")
        blks = [(b[1], b[2], b[3] or "main", int(b[4]), bool(b[5])) for b in BLK.findall(desc)]
        out.append((rmgr, kind, rec, tot, xid, blks, desc))
    if not out:
        sys.exit(f"wal.py: pg_waldump read nothing in [{start}, {end}): {r.stderr.strip()[:400]}")
    return out


def relname(rels, db_oid, blks):
    if not blks:
        return "-"
    db, node, fork = blks[0][0], blks[0][1], blks[0][2]
    if db != str(db_oid):
        return "(other database)" if db != "0" else "(shared catalog)"
    name = rels.get(node, f"catalog {node}")
    return name if fork == "main" else f"{name} [{fork}]"


def classify(recs, rels, db_oid):
    """Transaction id -> what it did to the jobs table: `defer` (inserted jobs), `claim` (an
    entry in the index of running jobs: a claim), `finish` (an entry in the index of finished
    jobs, or a delete: an outcome), `claim+finish` (both: outcomes riding a claim), `start`
    (other updates of jobs), `other`."""
    role = {}
    for node, name in rels.items():
        if name == "postpone_jobs":
            role[node] = "jobs"
        elif name == "postpone_jobs_doing_idx":
            role[node] = "doing"
        elif name == "postpone_jobs_finished_idx":
            role[node] = "finished"
    seen = collections.defaultdict(set)
    for rmgr, kind, _, _, xid, blks, _ in recs:
        if not xid or not blks or blks[0][1] not in role:
            continue
        r = role[blks[0][1]]
        if r == "jobs":
            if kind.startswith("INSERT") and rmgr == "Heap":
                seen[xid].add("insert")
            elif kind == "DELETE":
                seen[xid].add("finished")
            elif "UPDATE" in kind:
                seen[xid].add("update")
        elif kind.startswith("INSERT"):
            seen[xid].add(r)
    what = {}
    for xid, s in seen.items():
        if "doing" in s and "finished" in s:
            what[xid] = "claim+finish"
        elif "doing" in s:
            what[xid] = "claim"
        elif "finished" in s:
            what[xid] = "finish"
        elif "insert" in s:
            what[xid] = "defer"
        elif "update" in s:
            what[xid] = "start"
    return what


def breakdown(recs, rels, db_oid, n, title):
    what = classify(recs, rels, db_oid)
    rows = collections.defaultdict(lambda: [0, 0, 0])  # (stmt, rel, rmgr, kind) -> count, bytes, fpi bytes
    per_stmt = collections.defaultdict(lambda: [0, 0, 0, set()])
    total = [0, 0, 0]
    for rmgr, kind, rec, tot, xid, blks, desc in recs:
        stmt = what.get(xid, "other" if xid else "no transaction")
        rel = relname(rels, db_oid, blks) if rmgr not in ("Transaction", "XLOG", "Standby") else "-"
        if rmgr == "Transaction":
            kind = kind  # COMMIT / ABORT
        r = rows[(stmt, rel, rmgr, kind)]
        r[0] += 1
        r[1] += tot
        r[2] += tot - rec
        s = per_stmt[stmt]
        s[0] += 1
        s[1] += tot
        s[2] += tot - rec
        if xid:
            s[3].add(xid)
        total[0] += 1
        total[1] += tot
        total[2] += tot - rec
    print(f"\n== {title}: {total[1]:,} bytes of WAL in {total[0]:,} records for {n:,} jobs: "
          f"{total[1] / n:.1f} bytes and {total[0] / n:.2f} records per job, of which full-page images "
          f"{total[2] / n:.1f} bytes")
    print(f"{'statement':<14} {'transactions':>12} {'records/job':>11} {'bytes/job':>10} {'FPI/job':>8}")
    for stmt, s in sorted(per_stmt.items(), key=lambda kv: -kv[1][1]):
        print(f"{stmt:<14} {len(s[3]):>12,} {s[0] / n:>11.2f} {s[1] / n:>10.1f} {s[2] / n:>8.1f}")
    print(f"\n{'statement':<14} {'relation':<36} {'record':<20} {'records/job':>11} {'bytes/job':>10} {'bytes/rec':>9} {'FPI/job':>8}")
    for (stmt, rel, rmgr, kind), (cnt, tot, fpi) in sorted(rows.items(), key=lambda kv: (kv[0][0], -kv[1][1])):
        if tot / n < 0.05:
            continue
        print(f"{stmt:<14} {rel[:36]:<36} {(rmgr + ' ' + kind)[:20]:<20} {cnt / n:>11.3f} {tot / n:>10.1f} {tot / cnt:>9.0f} {fpi / n:>8.1f}")
    return {"bytes_per_job": round(total[1] / n, 1), "records_per_job": round(total[0] / n, 2),
            "fpi_bytes_per_job": round(total[2] / n, 1),
            "by_statement": {k: round(v[1] / n, 1) for k, v in per_stmt.items()}}


def cluster_start():
    out = subprocess.run([os.path.join(HERE, "cluster.sh"), "start"], capture_output=True, text=True, check=True)
    d, port = out.stdout.strip().splitlines()[-1].split()
    with open(os.path.join(d, "data", "postgresql.conf"), "a") as f:
        f.write("shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = all\n"
                "wal_keep_size = 4GB  # the run's WAL stays for pg_waldump (a DROP DATABASE checkpoints)\n")
    as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    subprocess.run(as_pg + [os.path.join(pg_bin(), "pg_ctl"), "-D", os.path.join(d, "data"), "-l",
                            os.path.join(d, "log"), "-w", "restart"], check=True, capture_output=True)
    return d, int(port)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int)
    p.add_argument("--cluster", action="store_true")
    p.add_argument("--bin")
    p.add_argument("--json")
    p.add_argument("--cpu-n0", type=int, help="also run with this many jobs first, for the server's CPU per job "
                   "as the difference of the two runs (needs the cluster's data directory readable here)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    bench_args = a.args[1:] if a.args and a.args[0] == "--" else a.args
    cluster = None
    try:
        if a.json:
            d = json.load(open(a.json))
        else:
            if a.cluster:
                cluster, port = cluster_start()
            else:
                port = a.port or 5432
            exe = a.bin or next((f for f in sorted(glob.glob(os.path.join(ROOT, "target/release/deps/wal-*")),
                                                   key=os.path.getmtime, reverse=True)
                                 if os.access(f, os.X_OK) and not f.endswith(".d")), None)
            if not exe:
                sys.exit("wal.py: no bench binary: cargo bench --bench wal --no-run")
            env = dict(os.environ, DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable")

            def run(args):
                r = subprocess.run([exe] + args, env=env, capture_output=True, text=True)
                line = next((l for l in r.stdout.splitlines() if l.startswith("{")), None)
                if not line:
                    sys.exit(f"wal.py: the bench printed nothing: {r.stderr.strip()[-800:]}")
                return json.loads(line)
            d0 = None
            if a.cpu_n0:
                args0 = list(bench_args)
                if "--n" in args0:
                    args0[args0.index("--n") + 1] = str(a.cpu_n0)
                else:
                    args0 += ["--n", str(a.cpu_n0)]
                d0 = run(args0)
            d = run(bench_args)
        waldir = os.path.join(d["data_directory"], "pg_wal")
        rels, oid, n = d["relations"], d["db_oid"], d["n"]
        load = open("/proc/loadavg").read().split()[0]
        print(f"== n {n}, c {d['c']}, delete {d['delete']}, args {d['args_kb']} KiB, output {d['output_kb']} KiB; "
              f"defer {d['defer_s']:.2f} s, drain {d['drain_s']:.2f} s ({d['claims']} claims); load average {load}; "
              f"jobs table {d.get('jobs_table_kb')} KiB, its indexes {d.get('jobs_indexes_kb')} KiB after the drain")
        res = {"what": "wal", "n": n, "c": d["c"], "delete": d["delete"], "args_kb": d["args_kb"],
               "output_kb": d["output_kb"], "load": load,
               "jobs_table_kb": d.get("jobs_table_kb"), "jobs_indexes_kb": d.get("jobs_indexes_kb")}
        res["defer"] = breakdown(waldump(waldir, d["lsn0"], d["lsn1"]), rels, oid, n, "defer (batches of 1,000)")
        res["drain"] = breakdown(waldump(waldir, d["lsn1b"], d["lsn2"]), rels, oid, n, f"drain (concurrency {d['c']})")
        if d.get("drain_server_cpu_s") is not None:
            for ph in ("defer", "drain"):
                whole = d[f"{ph}_server_cpu_s"]
                res[ph]["server_cpu_us_per_job_whole_run"] = round(whole * 1e6 / n, 1)
                if d0 and d0.get(f"{ph}_server_cpu_s") is not None:
                    res[ph]["server_cpu_us_per_job"] = round((whole - d0[f"{ph}_server_cpu_s"]) * 1e6 / (n - d0["n"]), 1)
            print(f"\n== server CPU (whole cluster) per job: defer {res['defer'].get('server_cpu_us_per_job', '-')} µs, "
                  f"drain {res['drain'].get('server_cpu_us_per_job', '-')} µs (the difference of runs of {n} and "
                  f"{d0['n'] if d0 else '-'} jobs); whole runs over {n}: {res['defer']['server_cpu_us_per_job_whole_run']} + "
                  f"{res['drain']['server_cpu_us_per_job_whole_run']} µs")
        res["total_bytes_per_job"] = round(res["defer"]["bytes_per_job"] + res["drain"]["bytes_per_job"], 1)
        if d.get("statements"):
            print(f"\n== pg_stat_statements (WAL and execution time per job; nested statements counted in their "
                  f"callers too)")
            for s in d["statements"]:
                us = s.get("exec_ms", 0.0) * 1000 / n
                if s["wal_bytes"] / n >= 0.5 or us >= 0.05:
                    print(f"{s['wal_bytes'] / n:>8.1f} B {s['wal_records'] / n:>6.2f} rec {us:>6.2f} µs {s['calls']:>6} calls "
                          f"{'top ' if s['toplevel'] else '    '} {s['query'][:100]}")
        print(json.dumps(res))
    finally:
        if cluster:
            subprocess.run([os.path.join(HERE, "cluster.sh"), "stop", cluster])


if __name__ == "__main__":
    main()
