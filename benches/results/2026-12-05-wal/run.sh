# 2026-12-05: clusters of benches/cluster.sh (PostgreSQL 15.20, defaults, shared_buffers
# 128MB) with wal_keep_size = 4GB (so that pg_waldump finds the run's WAL after the bench's
# DROP DATABASE checkpoints); one of them with pg_stat_statements loaded.
cargo bench --bench wal --no-run
# fillfactor-alternated.txt (server CPU: the difference of runs of 30,000 and 2,000 jobs)
for i in 1 2 3; do for v in 100 50; do
  python3 benches/wal.py --port PORT --cpu-n0 2000 -- --n 30000 --c 4 \
      --setup "ALTER TABLE postpone_jobs SET (fillfactor = $v)"
done; done
# settings.txt and ff*-*.txt
for ff in 100 50 30; do for mode in "--rounds 3" "--checkpoint-between" "--sleep-ms 10 --c 16" "--delete"; do
  python3 benches/wal.py --port PORT -- --n 20000 --c 4 $mode --setup "ALTER TABLE postpone_jobs SET (fillfactor = $ff)"
done; done
# triggers-cpu-*.txt: the same with --setup "ALTER TABLE postpone_jobs DISABLE TRIGGER ..." (attribution only)
