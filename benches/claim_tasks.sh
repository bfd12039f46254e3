#!/usr/bin/env bash
# What the claim's task filter costs (`only_registered_tasks`, on by default): the server
# time of one `postpone_claim_jobs` taking 64 of 10,000 due jobs, rolled back each time,
# with no filter (a worker that claims every task), one task name, and 200 names (the
# jobs' own name first, 199 others of realistic length), averaged over --calls claims,
# --rounds rounds alternating the three. Then the same with UNKNOWN jobs of other tasks due
# before them at the head of the queue (a rolling deploy: jobs no worker of this version
# knows), which a filtered claim walks past. Printed, never asserted.
#
#   bash benches/claim_tasks.sh                 # 5 rounds of 200 claims, 0 and 10,000 ahead
#   ROUNDS=9 CALLS=500 AHEAD="0 1000 10000" bash benches/claim_tasks.sh
#
# Needs PostgreSQL on 127.0.0.1:5432 (user postgres) and a built `postpone` binary.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/${PROFILE:-debug}/postpone
[ -x "$BIN" ] || { echo "build $BIN first (cargo build)" >&2; exit 1; }
ROUNDS=${ROUNDS:-5}
CALLS=${CALLS:-200}
AHEAD=${AHEAD:-"0 10000"}
DB=postpone_claim_tasks_$$
PG="psql -h 127.0.0.1 -U postgres -q"
$PG -c "CREATE DATABASE $DB"
trap '$PG -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1' EXIT
"$BIN" --database-url "postgres://postgres@127.0.0.1/$DB" migrate >/dev/null
for ahead in $AHEAD; do
  echo "-- $ahead jobs of other tasks due first; ms per claim of 64 jobs"
  $PG -d "$DB" -v ahead="$ahead" -v rounds="$ROUNDS" -v calls="$CALLS" <<'SQL'
\set ON_ERROR_STOP on
TRUNCATE postpone_jobs, postpone_workers;
INSERT INTO postpone_workers (id, name) VALUES (1, 'bench');
INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
SELECT 'default', 'other_' || (g % 7), 'null', now() - interval '1 hour'
  FROM generate_series(1, :ahead) g;
INSERT INTO postpone_jobs (queue, task, args)
SELECT 'default', 'noop', 'null' FROM generate_series(1, 10000);
VACUUM ANALYZE postpone_jobs;
CREATE FUNCTION pg_temp.cost(p_tasks text[], n int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; got int;
BEGIN
  t0 := clock_timestamp();
  FOR i IN 1..n LOOP
    BEGIN
      SELECT count(*) INTO got FROM postpone_claim_jobs(1, 64, NULL, p_tasks);
      IF got <> 64 THEN RAISE EXCEPTION 'claimed % jobs, not 64', got; END IF;
      RAISE SQLSTATE 'P0001';  -- roll the claim back
    EXCEPTION WHEN SQLSTATE 'P0001' THEN NULL;
    END;
  END LOOP;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1000 / n;
END $$;
CREATE TEMP TABLE r (round int, any_task float8, one_name float8, names_200 float8);
\o /dev/null
SELECT pg_temp.cost(ARRAY['noop'], 20);  -- warm up
\o
INSERT INTO r
SELECT g, CASE WHEN :ahead = 0 THEN pg_temp.cost(NULL, :calls) END,
       pg_temp.cost(ARRAY['noop'], :calls),
       pg_temp.cost(ARRAY['noop'] || ARRAY(SELECT 'billing.invoices.send_reminder_'
                                                  || lpad(n::text, 4, '0')
                                             FROM generate_series(1, 199) n), :calls)
  FROM generate_series(1, :rounds) g;
SELECT round(any_task::numeric, 3) AS any_task, round(one_name::numeric, 3) AS one_name,
       round(names_200::numeric, 3) AS names_200 FROM r ORDER BY round;
SELECT 'median' AS what,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY any_task)::numeric, 3) AS any_task,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY one_name)::numeric, 3) AS one_name,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY names_200)::numeric, 3) AS names_200
  FROM r;
SQL
done
