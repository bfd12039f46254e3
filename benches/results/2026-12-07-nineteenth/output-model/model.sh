#!/usr/bin/env bash
# The outcome's cost with and without a 1-KiB output, as plain statements on postpone_jobs as
# migrated: 30,000 jobs claimed by one UPDATE, then recorded succeeded by 30 UPDATEs of 1,000
# (one psql each: the milliseconds include 30 psql starts), on the machine's server.
#   MODES  (none 1k none 1k): none, no output; 1k, an output of 1 KiB in the row; side, the
#          same output in a table of its own (job id, output), inserted by the outcome's statement
#   SETUP  SQL run after the migrations (e.g. ALTER TABLE postpone_jobs SET (toast_tuple_target = 256))
#   CLI    the postpone binary (cargo build --release --features cli --bin postpone)
set -euo pipefail
CLI=${CLI:-target/release/postpone}
pg() { psql -h 127.0.0.1 -U postgres -XAtq -v ON_ERROR_STOP=1 "$@"; }
for out in ${MODES:-none 1k none 1k}; do
  pg -d postgres -c "DROP DATABASE IF EXISTS outmodel" -c "CREATE DATABASE outmodel"
  "$CLI" --database-url postgres://postgres@127.0.0.1/outmodel migrate >/dev/null
  pg -d outmodel -c "INSERT INTO postpone_workers (id, name) OVERRIDING SYSTEM VALUE VALUES (1, 'm')" \
     -c "INSERT INTO postpone_jobs (queue, task, args) SELECT 'default', 'noop', 'null' FROM generate_series(1, 30000)" \
     -c "CREATE TABLE outs (job_id bigint PRIMARY KEY, output jsonb COMPRESSION lz4)" \
     ${SETUP:+-c "$SETUP"} -c "VACUUM ANALYZE postpone_jobs" -c "CHECKPOINT"
  o="('\"' || repeat('0123456789abcdef', 63) || md5(id::text) || '\"')::jsonb"
  pg -d outmodel -c "UPDATE postpone_jobs SET status = 'doing', worker_id = 1, attempts = 1, claimed_at = now(), started_at = now()" >/dev/null
  l0=$(pg -d outmodel -c "SELECT pg_current_wal_lsn()")
  t0=$(date +%s%N)
  for k in $(seq 0 29); do
    range="id > $((k * 1000)) AND id <= $((k * 1000 + 1000))"
    case $out in
    none) pg -d outmodel -c "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now(), output = NULL WHERE $range" ;;
    1k) pg -d outmodel -c "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now(), output = $o WHERE $range" ;;
    side) pg -d outmodel -c "WITH u AS (UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE $range RETURNING id) INSERT INTO outs SELECT id, $o FROM u" ;;
    esac
  done
  t1=$(date +%s%N)
  l1=$(pg -d outmodel -c "SELECT pg_current_wal_lsn()")
  wal=$(pg -d outmodel -c "SELECT pg_wal_lsn_diff('$l1', '$l0') / 30000")
  size=$(pg -d outmodel -c "SELECT pg_relation_size('postpone_jobs') / 8192 || ' + ' || pg_relation_size('outs') / 8192")
  echo "output=$out outcome WAL bytes a job $wal, ms $(((t1 - t0) / 1000000)), table pages $size"
done
