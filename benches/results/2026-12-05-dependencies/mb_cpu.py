# Backend CPU time (utime+stime from /proc, the server being local) of the claim-like and
# finish-like UPDATEs of 4096 rows in mb23, with the dependency triggers enabled and
# disabled, alternating round by round. CPU time, unlike wall time, hardly depends on the
# machine's load.
import subprocess, re, statistics, sys, os
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
tick = os.sysconf("SC_CLK_TCK")
def run(enabled):
    mode = "ENABLE" if enabled else "DISABLE"
    sql = f"""
ALTER TABLE postpone_jobs {mode} TRIGGER postpone_jobs_deps;
ALTER TABLE postpone_jobs {mode} TRIGGER postpone_jobs_deps_delete;
SELECT pg_backend_pid() AS pid \\gset
\\setenv PGPID :pid
TRUNCATE postpone_jobs;
INSERT INTO postpone_jobs (queue, task, args) SELECT 'q', 't', 'null' FROM generate_series(1, 4096);
VACUUM ANALYZE postpone_jobs;
UPDATE postpone_jobs SET status = 'doing' WHERE false;
\\! awk '{{print "CPU", $14+$15}}' /proc/$PGPID/stat
UPDATE postpone_jobs SET status = 'doing', worker_id = 1, attempts = attempts + 1, started_at = now() WHERE status = 'todo';
\\! awk '{{print "CPU", $14+$15}}' /proc/$PGPID/stat
UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE status = 'doing';
\\! awk '{{print "CPU", $14+$15}}' /proc/$PGPID/stat
"""
    out = subprocess.run(["psql", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "mb23"], input=sql,
                         capture_output=True, text=True).stdout
    c = [int(x) for x in re.findall(r"CPU (\d+)", out)]
    return (c[1] - c[0]) * 1000 / tick, (c[2] - c[1]) * 1000 / tick
on, off = [], []
for i in range(rounds):
    pair = [(True, on), (False, off)] if i % 2 == 0 else [(False, off), (True, on)]
    for en, acc in pair:
        acc.append(run(en))
for k, name in [(0, "claim-like"), (1, "finish-like")]:
    a = sum(x[k] for x in on) / rounds; b = sum(x[k] for x in off) / rounds
    print(f"{name} UPDATE of 4096 rows, backend CPU per statement (mean of {rounds}): "
          f"with the triggers {a:.1f} ms, without {b:.1f} ms ({(a - b) / b * 100:+.1f}%)")
