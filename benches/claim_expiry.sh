#!/usr/bin/env bash
# What jobs with a deadline cost the claim: the server time of one `postpone_claim_jobs`
# (the five-argument claim workers send, holding what it takes) taking 64 of 10,000 due
# jobs without a deadline, rolled back each time, on two databases side by side: one at
# schema OLD_VERSION and one at NEW_VERSION (defaults: 24, before expiry, and 25, expiry
# itself; `OLD_VERSION=29 NEW_VERSION=30` compares the claim before and after the jobs
# with a deadline got due indexes of their own).
# ROUNDS rounds of CALLS claims, alternating the two databases; medians printed, never
# asserted. Then the same claim with EXPIRED jobs past their deadline (a minute to live)
# due before the 10,000 (the head of the claim's order: up to schema 29 every claim steps
# over them until the workers' sweep has ended them), and with them due after, on both
# databases in turn (the expired cases need OLD_VERSION 25 or later).
#
#   bash benches/claim_expiry.sh                       # 7 rounds of 200 claims
#   ROUNDS=9 CALLS=500 EXPIRED="10000 100000" bash benches/claim_expiry.sh
#   OLD_VERSION=29 NEW_VERSION=30 CALLS=20 bash benches/claim_expiry.sh
#
# Needs PostgreSQL on 127.0.0.1:5432 (user postgres) and psql; reads the migrations from
# src/schema.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-7}
CALLS=${CALLS:-200}
EXPIRED=${EXPIRED:-"10000 100000"}
OLD_VERSION=${OLD_VERSION:-24}
NEW_VERSION=${NEW_VERSION:-25}
OLD=postpone_claim_old_$$
NEW=postpone_claim_new_$$
PG="psql -h 127.0.0.1 -U postgres -q -X"
$PG -c "CREATE DATABASE $OLD" -c "CREATE DATABASE $NEW"
trap '$PG -c "DROP DATABASE IF EXISTS $OLD" -c "DROP DATABASE IF EXISTS $NEW" >/dev/null 2>&1' EXIT
# Each database gets the migrations up to its version, in one transaction (as `migrate`).
install() {
  local db=$1 last=$2
  { for f in src/schema/0*.sql; do
      v=$(basename "$f" | cut -c1-4)
      if [ "$((10#$v))" -le "$last" ]; then cat "$f"; echo; fi
    done; } | $PG -d "$db" -1 -v ON_ERROR_STOP=1 >/dev/null 2>&1
}
install "$OLD" "$OLD_VERSION"
install "$NEW" "$NEW_VERSION"
setup() {
  local sql=""
  if [ "$2" -gt 0 ]; then
    sql="INSERT INTO postpone_jobs (queue, task, args, scheduled_at, expires_at)
SELECT 'default', 'noop', 'null', s.at, s.at + interval '1 minute'
  FROM (SELECT CASE WHEN $3 THEN now() - interval '2 hours' + random() * interval '1 hour'
                    ELSE now() - interval '20 minutes' + random() * interval '10 minutes' END AS at
          FROM generate_series(1, $2)) s;"
  fi
  $PG -d "$1" -v expired_sql="$sql" <<'SQL'
\set ON_ERROR_STOP on
TRUNCATE postpone_jobs, postpone_workers;
INSERT INTO postpone_workers (id, name) OVERRIDING SYSTEM VALUE VALUES (1, 'bench');
SELECT setseed(0.43);
INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
SELECT 'default', 'noop', 'null', now() - interval '30 minutes' FROM generate_series(1, 10000);
-- Expired jobs of the same task, if any: an hour before the live ones (first), or just
-- after them.
:expired_sql
VACUUM ANALYZE postpone_jobs;
CREATE OR REPLACE FUNCTION public.bench_claim(n int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; got int;
BEGIN
  t0 := clock_timestamp();
  FOR i IN 1..n LOOP
    BEGIN
      SELECT count(*) INTO got FROM postpone_claim_jobs(1, 64, NULL, ARRAY['noop'], 64);
      IF got <> 64 THEN RAISE EXCEPTION 'claimed % jobs, not 64', got; END IF;
      RAISE SQLSTATE 'P0001';  -- roll the claim back
    EXCEPTION WHEN SQLSTATE 'P0001' THEN NULL;
    END;
  END LOOP;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1000 / n;
END $$;
SELECT public.bench_claim(20);  -- warm up
SQL
}
cost() { $PG -d "$1" -t -A -c "SELECT round(public.bench_claim($CALLS)::numeric, 4)"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "-- no job has a deadline: ms per claim of 64 jobs (schema $OLD_VERSION | schema $NEW_VERSION), $ROUNDS rounds of $CALLS"
setup "$OLD" 0 true >/dev/null
setup "$NEW" 0 true >/dev/null
old=(); new=()
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then o=$(cost "$OLD"); n=$(cost "$NEW"); else n=$(cost "$NEW"); o=$(cost "$OLD"); fi
  old+=("$o"); new+=("$n"); echo "round $r: $o | $n"
done
echo "median: $(printf '%s\n' "${old[@]}" | median) | $(printf '%s\n' "${new[@]}" | median)"
echo "range:  $(printf '%s\n' "${old[@]}" | sort -g | head -1)-$(printf '%s\n' "${old[@]}" | sort -g | tail -1) | $(printf '%s\n' "${new[@]}" | sort -g | head -1)-$(printf '%s\n' "${new[@]}" | sort -g | tail -1)"

[ "$OLD_VERSION" -ge 25 ] && dbs="$OLD:$OLD_VERSION $NEW:$NEW_VERSION" || dbs="$NEW:$NEW_VERSION"
for e in $EXPIRED; do
  for first in true false; do
    where=$([ "$first" = true ] && echo "due before the live jobs" || echo "due after them")
    for d in $dbs; do
      setup "${d%%:*}" "$e" "$first" >/dev/null
      v=(); for r in $(seq "$ROUNDS"); do v+=("$(cost "${d%%:*}")"); done
      echo "-- $e expired jobs $where (schema ${d#*:}): median $(printf '%s\n' "${v[@]}" | median) ms per claim (runs: ${v[*]})"
    done
  done
done
