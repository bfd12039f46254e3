#!/usr/bin/env bash
# The floor under postpone's throughput: pgbench running the worker's own claim and completion
# statements (benches/floor/claim_complete.sql) on a filled queue, with no client work, no
# channels and no Rust in between. postpone's drain figure divided by this is how close the
# library gets to what the database itself allows for the same statements and batch sizes.
#
#   usage: benches/floor/floor.sh [N_JOBS] [CLIENTS_LIST] [BATCH_LIST] [SECONDS]
#   e.g.   benches/floor/floor.sh 400000 1,2,4 16,64 15
#   env:   SCRIPT (claim_complete.sql; or a model: claim_complete_plain.sql, the same two
#          status changes as plain statements; claim_in_outcome.sql, one status change a job)
#          PGPORT (5432; a benches/cluster.sh cluster's port)
#
# Each pgbench client is one worker's claim-and-complete loop (a worker process has one
# fetcher and one completer connection, so 1 client ~ one process's two statements in turn).
# The migrations are applied from src/schema/*.sql, in order, to a fresh database
# postpone_floor on 127.0.0.1 (port PGPORT or 5432, user postgres); the queue is refilled and
# vacuumed before each run so that every run starts from the same table.
set -euo pipefail
n=${1:-400000}
clients=${2:-1,2,4}
batches=${3:-16,64}
secs=${4:-15}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
script=$here/${SCRIPT:-claim_complete.sql}
[ -f "$script" ] || { echo "no script $script" >&2; exit 2; }
pg() { psql -h 127.0.0.1 -U postgres -XAtq -v ON_ERROR_STOP=1 "$@"; }
pg -d postgres -c "DROP DATABASE IF EXISTS postpone_floor" -c "CREATE DATABASE postpone_floor"
for f in "$root"/src/schema/0*.sql; do pg -1 -d postpone_floor -f "$f" >/dev/null; done
pg -d postpone_floor -c "INSERT INTO postpone_workers (id, name) OVERRIDING SYSTEM VALUE
                         SELECT g, 'floor-' || g FROM generate_series(1, 64) g"
echo "== floor ($(basename "$script")): $(nproc) cores, $(pg -d postgres -c 'SHOW server_version'), synchronous_commit=$(pg -d postgres -c 'SHOW synchronous_commit'), $n jobs, ${secs}s per run"
printf '%-8s %-6s %10s %12s %12s\n' clients batch tps jobs_per_s ms_per_batch
for b in ${batches//,/ }; do
  for c in ${clients//,/ }; do
    pg -d postpone_floor -c "TRUNCATE postpone_jobs" \
       -c "INSERT INTO postpone_jobs (queue, task, args) SELECT 'default', 'noop', 'null' FROM generate_series(1, $n)" \
       -c "VACUUM ANALYZE postpone_jobs"
    out=$(pgbench -h 127.0.0.1 -U postgres -n -f "$script" -D batch="$b" \
            -c "$c" -j "$c" -T "$secs" postpone_floor 2>&1)
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
    lat=$(sed -n 's/^latency average = \([0-9.]*\).*/\1/p' <<<"$out")
    left=$(pg -d postpone_floor -c "SELECT count(*) FROM postpone_jobs WHERE status = 'todo'")
    if [ "$left" -eq 0 ]; then echo "   (the queue ran dry: give more jobs)"; fi
    printf '%-8s %-6s %10s %12.0f %12s\n' "$c" "$b" "$tps" "$(awk -v t="$tps" -v b="$b" 'BEGIN {print t * b}')" "$lat"
  done
done
pg -d postgres -c "DROP DATABASE postpone_floor"
