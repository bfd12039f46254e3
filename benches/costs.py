#!/usr/bin/env python3
"""Per-job costs of one job queue: WAL bytes, server CPU and client CPU per job, for deferring
in batches, claiming and completing (benches/compare.sh runs it for every system; python3
standard library, psql, and pg_waldump for one database's share of the WAL).

    python3 benches/costs.py --system NAME --db DB --port PORT [--cluster-dir DIR]
                             --n N [--n0 N0] [--c C] -- COMMAND ARGS...

COMMAND is a benchmark in the form of the Rust peers' harness (its `cost` mode, or
graphile_bench.mjs --cost): run with every `{n}` in its arguments replaced by the job count, it
defers that many jobs in batches, drains them, and prints JSON lines `cost_defer_...`,
`cost_drain` and `cost_total`, each with `wal_bytes`, `client_cpu_s` (its own CPU time, utime +
stime) and the LSNs at both ends (`lsn0`, `lsn1`). This script runs it twice, with N0 (100)
jobs and with N, and adds what the benchmark cannot see:

- server CPU: with --cluster-dir (a cluster of compare.sh's own, nothing else on it), the
  whole cluster's CPU time from /proc (the postmaster's utime + stime + cutime + cstime, which
  holds every backend that has exited, plus every live child's), read before and after each
  run; without it (the machine's shared server), the CPU time of the backends connected to
  DB, sampled every 20 ms from pg_stat_activity and /proc/<pid>/stat (a backend that lives
  less than 20 ms, such as a psql check, is missed). The figure per job is the difference of
  the two runs over the difference of their job counts: connections, schema checks and
  truncations cost the same in both and drop out.
- WAL of the run's database: pg_waldump over the N run's [lsn0, lsn1], counting the records
  that touch DB's relations and every record of the transactions that wrote them (their
  commits); beside it, the server's whole WAL over the same span (the benchmark's wal_bytes).
- vacuum after: the WAL and server CPU of a plain VACUUM of DB right after the N run (what the
  run left for a vacuum to clean; autovacuum would do it later), per job.

With --cluster-dir, each run starts right after a CHECKPOINT (so that no run pays more full
page images than another) and once no autovacuum worker is busy. Prints the benchmark's lines,
then one line {"what": "cost", "system": NAME, ...} with the figures and the load average.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

TCK = os.sysconf("SC_CLK_TCK")


def psql(args, db, sql, check=True):
    r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(args.port), "-U", "postgres", "-d", db,
                        "-XAtq", "-c", sql], capture_output=True, text=True)
    if check and r.returncode != 0:
        sys.exit(f"costs.py: psql {sql!r} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def proc_cpu(pid, children=False):
    """utime + stime (+ cutime + cstime) of pid, in seconds; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields after the comm: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
    ticks = int(rest[11]) + int(rest[12])
    if children:
        ticks += int(rest[13]) + int(rest[14])
    return ticks / TCK


def ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def cluster_cpu(cluster_dir):
    """The whole cluster's CPU seconds: the postmaster with its reaped children, and every live
    child (backends, autovacuum, checkpointer, WAL writer...)."""
    with open(os.path.join(cluster_dir, "data", "postmaster.pid")) as f:
        pm = int(f.readline())
    total = proc_cpu(pm, children=True) or 0.0
    for d in os.listdir("/proc"):
        if d.isdigit() and ppid(int(d)) == pm:
            total += proc_cpu(int(d), children=True) or 0.0
    return total


class BackendSampler:
    """CPU seconds of the backends connected to one database, sampled every 20 ms through one
    psql session (in database postgres, so it never counts itself)."""

    def __init__(self, args):
        self.args, self.first, self.last, self.stop = args, {}, {}, threading.Event()
        self.psql = subprocess.Popen(
            ["psql", "-h", "127.0.0.1", "-p", str(args.port), "-U", "postgres", "-d", "postgres", "-XAtq"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def pids(self):
        self.psql.stdin.write(f"SELECT pid FROM pg_stat_activity WHERE datname = '{self.args.db}';\n\\echo __end__\n")
        self.psql.stdin.flush()
        out = []
        for line in self.psql.stdout:
            line = line.strip()
            if line == "__end__":
                return out
            if line.isdigit():
                out.append(int(line))
        return out

    def sample(self, initial=False):
        for pid in self.pids():
            cpu = proc_cpu(pid)
            if cpu is None:
                continue
            # A backend seen at the first sample counts from there; a new one from its start.
            self.first.setdefault(pid, cpu if initial else 0.0)
            self.last[pid] = cpu

    def loop(self):
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.02)

    def start(self):
        self.sample(initial=True)
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join()
        self.sample()
        self.psql.stdin.close()
        self.psql.wait()
        return sum(self.last[p] - self.first[p] for p in self.last)


def wait_quiet(args):
    psql(args, "postgres", "CHECKPOINT")
    for _ in range(200):
        busy = psql(args, "postgres", "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
        if busy == "0":
            return
        time.sleep(0.1)


def measure(args, fn):
    """Runs fn(), returns (its result, server CPU seconds spent meanwhile)."""
    if args.cluster_dir:
        c0 = cluster_cpu(args.cluster_dir)
        out = fn()
        time.sleep(0.05)  # let the postmaster reap backends that just exited
        return out, cluster_cpu(args.cluster_dir) - c0
    s = BackendSampler(args)
    s.start()
    out = fn()
    return out, s.finish()


def run_bench(args, n):
    cmd = [a.replace("{n}", str(n)) for a in args.command]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stdout.flush()
    lines = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if str(rec.get("what", "")).startswith("cost_"):
                lines[rec["what"]] = rec
    if "cost_total" not in lines:
        tail = "\n".join(r.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(cmd)} printed no cost_total (exit {r.returncode}): {tail}")
    return lines


def waldump_db_bytes(args, lsn0, lsn1):
    """WAL bytes in [lsn0, lsn1] of the records touching DB's relations and of the transactions
    that wrote them; None when pg_waldump cannot read the WAL."""
    oid = psql(args, "postgres", f"SELECT oid FROM pg_database WHERE datname = '{args.db}'")
    if args.cluster_dir:
        waldir = os.path.join(args.cluster_dir, "data", "pg_wal")
    else:
        waldir = os.path.join(psql(args, "postgres", "SHOW data_directory"), "pg_wal")
    bindir = args.pg_bin or subprocess.run(["sh", "-c", "ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1"],
                                           capture_output=True, text=True).stdout.strip()
    r = subprocess.run([os.path.join(bindir, "pg_waldump"), "-p", waldir, "-s", lsn0, "-e", lsn1],
                       capture_output=True, text=True)
    rec_re = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+),")
    rel_re = re.compile(r"rel \d+/(\d+)/\d+")
    recs = []
    for line in r.stdout.splitlines():
        m = rec_re.search(line)
        if not m:
            continue
        dbs = set(rel_re.findall(line))
        recs.append((int(m.group(1)), int(m.group(2)), oid in dbs))
    if not recs:
        return None
    xids = {tx for _, tx, mine in recs if mine and tx}
    return sum(tot for tot, tx, mine in recs if mine or (tx and tx in xids))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--port", type=int, default=5432)
    p.add_argument("--cluster-dir")
    p.add_argument("--pg-bin")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--c", type=int, default=4)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        sys.exit("costs.py: no benchmark command after --")
    runs = {}
    for n in (args.n0, args.n):
        if args.cluster_dir:
            wait_quiet(args)
        load = open("/proc/loadavg").read().split()[0]
        lines, cpu = measure(args, lambda: run_bench(args, n))
        runs[n] = (lines, cpu, load)
    lines, cpu, load = runs[args.n]
    total = lines["cost_total"]
    defer = next((v for k, v in lines.items() if k.startswith("cost_defer")), {})
    drain = lines.get("cost_drain", {})
    per = lambda v: round(v / args.n, 1)  # noqa: E731
    db_wal = waldump_db_bytes(args, total["lsn0"], total["lsn1"])
    lsn_a = psql(args, "postgres", "SELECT pg_current_wal_lsn()")
    _, vac_cpu = measure(args, lambda: psql(args, args.db, "VACUUM"))
    vac_wal = int(psql(args, "postgres", f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn_a}')::bigint"))
    marginal = (cpu - runs[args.n0][1]) / (args.n - args.n0)
    out = {
        "what": "cost", "system": args.system, "c": args.c, "n": args.n, "n0": args.n0,
        "defer": "one by one" if "one_by_one" in defer.get("what", "") else "batches of 1,000",
        "wal_bytes_per_job": None if db_wal is None else per(db_wal),
        "wal_bytes_per_job_server": per(total["wal_bytes"]),
        "server_cpu_us_per_job": round(marginal * 1e6, 1),
        "server_cpu_us_per_job_whole_run": round(cpu * 1e6 / args.n, 1),
        "server_cpu": "cluster total" if args.cluster_dir else "backends of the database, sampled every 20 ms",
        "client_cpu_us_per_job": total["client_cpu_us_per_job"],
        "defer_wal_bytes_per_job": defer.get("wal_bytes_per_job"),
        "defer_client_cpu_us_per_job": defer.get("client_cpu_us_per_job"),
        "drain_wal_bytes_per_job": drain.get("wal_bytes_per_job"),
        "drain_client_cpu_us_per_job": drain.get("client_cpu_us_per_job"),
        "drain_jobs_per_s": drain.get("jobs_per_s"),
        "vacuum_after_wal_bytes_per_job": per(vac_wal),
        "vacuum_after_server_cpu_us_per_job": round(vac_cpu * 1e6 / args.n, 1),
        "load": load,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit(f"costs.py: {e}")
