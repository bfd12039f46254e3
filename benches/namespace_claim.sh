#!/usr/bin/env bash
# What a named schema (`App::builder(url).schema(..)`) costs a claim: the server time of one
# `postpone_claim_jobs` taking 64 of 10,000 due jobs, rolled back each time, in the default
# installation (public, functions as the migrations write them) and in a named schema (the
# same functions pinned: `SET search_path`, the schema's channel and lock keys), averaged
# over --calls claims, over --rounds rounds alternating the two. Printed, never asserted.
#
#   bash benches/namespace_claim.sh            # 7 rounds of 200 claims
#   ROUNDS=11 CALLS=500 bash benches/namespace_claim.sh
#
# Needs PostgreSQL on 127.0.0.1:5432 (user postgres) and a built `postpone` binary.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/${PROFILE:-debug}/postpone
[ -x "$BIN" ] || { echo "build $BIN first (cargo build)" >&2; exit 1; }
ROUNDS=${ROUNDS:-7}
CALLS=${CALLS:-200}
DB=postpone_namespace_claim_$$
PG="psql -h 127.0.0.1 -U postgres -q"
$PG -c "CREATE DATABASE $DB"
trap '$PG -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1' EXIT
"$BIN" --database-url "postgres://postgres@127.0.0.1/$DB" migrate >/dev/null
"$BIN" --database-url "postgres://postgres@127.0.0.1/$DB" --schema tenant migrate >/dev/null
echo "-- ms per claim of 64 jobs (server time)"
$PG -d "$DB" -v rounds="$ROUNDS" -v calls="$CALLS" <<'SQL'
\set ON_ERROR_STOP on
TRUNCATE public.postpone_jobs, public.postpone_workers, tenant.postpone_jobs, tenant.postpone_workers;
INSERT INTO public.postpone_workers (id, name) VALUES (1, 'bench');
INSERT INTO tenant.postpone_workers (id, name) VALUES (1, 'bench');
INSERT INTO public.postpone_jobs (queue, task, args)
SELECT 'default', 'noop', 'null' FROM generate_series(1, 10000);
INSERT INTO tenant.postpone_jobs (queue, task, args)
SELECT 'default', 'noop', 'null' FROM generate_series(1, 10000);
VACUUM ANALYZE public.postpone_jobs;
VACUUM ANALYZE tenant.postpone_jobs;
-- The claim as a worker of each sends it: unqualified, under the connection's search_path.
CREATE FUNCTION pg_temp.cost(p_path text, n int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; got int;
BEGIN
  PERFORM set_config('search_path', p_path, true);
  t0 := clock_timestamp();
  FOR i IN 1..n LOOP
    BEGIN
      EXECUTE 'SELECT count(*) FROM postpone_claim_jobs(1, 64, NULL, ARRAY[''noop''], 64)'
         INTO got;
      IF got <> 64 THEN RAISE EXCEPTION 'claimed % jobs, not 64', got; END IF;
      RAISE SQLSTATE 'P0001';  -- roll the claim back
    EXCEPTION WHEN SQLSTATE 'P0001' THEN NULL;
    END;
  END LOOP;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1000 / n;
END $$;
CREATE TEMP TABLE r (round int, default_schema float8, named_schema float8);
\o /dev/null
SELECT pg_temp.cost('public', 20), pg_temp.cost('tenant', 20);  -- warm up
-- Alternating which goes first, round by round.
CREATE FUNCTION pg_temp.rounds(n int, calls int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE d float8; t float8;
BEGIN
  FOR g IN 1..n LOOP
    IF g % 2 = 1 THEN
      d := pg_temp.cost('public', calls); t := pg_temp.cost('tenant', calls);
    ELSE
      t := pg_temp.cost('tenant', calls); d := pg_temp.cost('public', calls);
    END IF;
    INSERT INTO r VALUES (g, d, t);
  END LOOP;
END $$;
SELECT pg_temp.rounds(:rounds, :calls);
\o
SELECT round, round(default_schema::numeric, 3) AS default_schema,
       round(named_schema::numeric, 3) AS named_schema FROM r ORDER BY round;
SELECT 'median' AS what,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY default_schema)::numeric, 3) AS default_schema,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY named_schema)::numeric, 3) AS named_schema
  FROM r;
SQL
