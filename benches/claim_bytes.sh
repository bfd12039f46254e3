#!/usr/bin/env bash
# What the claim's byte budget (schema 27) costs, before and after it was measured in the
# walk that locks the rows (schema 29): the server time of one seven-argument
# `postpone_claim_jobs` taking 1,024 of 20,000 due jobs of `{"n": N}`, rolled back each
# time, without a budget (NULL) and with 64 MiB, on two databases side by side: one at
# --old (default 28) and one at --new (default: the latest migration).
# ROUNDS rounds; in each, CALLS claims of each of the four (old/new, with/without), the
# order alternating; the server process's CPU time per claim (from /proc/self/stat, read by
# pg_read_file: a superuser's connection; 10 ms ticks, hence many calls) is printed with
# medians and ranges, never asserted. CPU time, not wall time: on a machine loaded by
# others, wall times of one binary vary by 2x from round to round, CPU times by a few %.
#
#   bash benches/claim_bytes.sh                    # 9 rounds of 40 claims
#   ROUNDS=15 CALLS=40 OLD_VERSION=28 bash benches/claim_bytes.sh
#
# Needs PostgreSQL on 127.0.0.1:5432 (user postgres) and psql; reads the migrations from
# src/schema.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-9}
CALLS=${CALLS:-40}
OLD_VERSION=${OLD_VERSION:-28}
NEW_VERSION=${NEW_VERSION:-$(ls src/schema/0*.sql | tail -1 | xargs basename | cut -c1-4 | sed 's/^0*//')}
OLD=postpone_bytes_old_$$
NEW=postpone_bytes_new_$$
PG="psql -h 127.0.0.1 -U postgres -q -X"
$PG -c "CREATE DATABASE $OLD" -c "CREATE DATABASE $NEW"
trap '$PG -c "DROP DATABASE IF EXISTS $OLD" -c "DROP DATABASE IF EXISTS $NEW" >/dev/null 2>&1' EXIT
install() {
  local db=$1 last=$2
  { for f in src/schema/0*.sql; do
      v=$(basename "$f" | cut -c1-4)
      if [ "$((10#$v))" -le "$last" ]; then cat "$f"; echo; fi
    done; } | $PG -d "$db" -1 -v ON_ERROR_STOP=1 >/dev/null 2>&1
}
install "$OLD" "$OLD_VERSION"
install "$NEW" "$NEW_VERSION"
for db in "$OLD" "$NEW"; do
  $PG -d "$db" >/dev/null <<'SQL'
\set ON_ERROR_STOP on
INSERT INTO postpone_workers (id, name) OVERRIDING SYSTEM VALUE VALUES (1, 'bench');
INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
SELECT 'default', 'noop', jsonb_build_object('n', g), now() - interval '30 minutes'
  FROM generate_series(1, 20000) g;
VACUUM ANALYZE postpone_jobs;
-- CPU ticks (user + system, 10 ms) of this server process.
CREATE OR REPLACE FUNCTION public.cpu_ticks() RETURNS bigint LANGUAGE sql AS $f$
  SELECT (split_part(s, ' ', 12))::bigint + (split_part(s, ' ', 13))::bigint
    FROM (SELECT substr(t, strpos(t, ') ') + 2) AS s FROM pg_read_file('/proc/self/stat') t) x
$f$;
CREATE OR REPLACE FUNCTION public.bench_claim(n int, b bigint) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 bigint; got int;
BEGIN
  t0 := public.cpu_ticks();
  FOR i IN 1..n LOOP
    BEGIN
      SELECT count(*) INTO got FROM postpone_claim_jobs(1, 1024, NULL, NULL, 4, b, true);
      IF got <> 1024 THEN RAISE EXCEPTION 'claimed % jobs, not 1024', got; END IF;
      RAISE SQLSTATE 'P0001';  -- roll the claim back
    EXCEPTION WHEN SQLSTATE 'P0001' THEN NULL;
    END;
  END LOOP;
  RETURN (public.cpu_ticks() - t0) * 10.0 / n;
END $$;
SELECT public.bench_claim(3, NULL);  -- warm up
SELECT public.bench_claim(3, 67108864);
SQL
done
cost() { $PG -d "$1" -t -A -c "SELECT round(public.bench_claim($CALLS, $2)::numeric, 3)"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
range() { sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {print lo "-" hi}'; }
declare -A res
echo "-- CPU ms per claim of 1,024 jobs; schema $OLD_VERSION (old) | schema $NEW_VERSION (new); budget NULL | 64 MiB"
for r in $(seq "$ROUNDS"); do
  order="old:NULL new:NULL old:67108864 new:67108864"
  [ $((r % 2)) -eq 0 ] && order="new:67108864 old:67108864 new:NULL old:NULL"
  line="round $r:"
  for k in $order; do
    db=$([ "${k%%:*}" = old ] && echo "$OLD" || echo "$NEW")
    v=$(cost "$db" "${k#*:}")
    res[$k]="${res[$k]:-} $v"
    line="$line $k=$v"
  done
  echo "$line"
done
for k in old:NULL old:67108864 new:NULL new:67108864; do
  echo "$k: median $(printf '%s\n' ${res[$k]} | median) ms, range $(printf '%s\n' ${res[$k]} | range)"
done
