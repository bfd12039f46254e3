# 2026-12-05, 20:29-20:34 UTC: schema 32 (main at 99db857, "old") against branch ff50 on
# top of it ("new": the named-queue walks by `= ANY (ARRAY[v_q])`, fillfactor 50; numbered
# 33 then, merged as schema 36 after main's 34 and 35), each binary built in its own worktree. Load average 4.1-5.2 throughout.
cargo bench --bench wal --no-run        # in each worktree
# wal-{old,new,new100}-R.txt: clusters of benches/cluster.sh (PostgreSQL 15.20, defaults),
# alternated old, new, new at fillfactor 100, three rounds
for r in 1 2 3; do
  python3 benches/wal.py --cluster --bin OLD/wal-* -- --n 30000 --c 4
  python3 benches/wal.py --cluster --bin NEW/wal-* -- --n 30000 --c 4
  python3 benches/wal.py --cluster --bin NEW/wal-* -- --n 30000 --c 4 \
      --setup "ALTER TABLE postpone_jobs SET (fillfactor = 100)"
done
# throughput-{old,new}-R.txt: the machine's server (127.0.0.1:5432, autovacuum off),
# alternated old-1, new-1, old-2, new-2, ... new-4
cargo bench --bench throughput -- --only work --n-work 30000 --concurrency 4 --repeats 3
