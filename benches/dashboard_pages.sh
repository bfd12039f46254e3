#!/usr/bin/env bash
# What the dashboard's pages cost with a million jobs: builds a database of 1,000,000 jobs
# (generate_series: 5 queues, 10 tasks, 1% waiting, 0.5% running, 5% failed with an error,
# 1% cancelled, the rest succeeded; a tag on one job in ten; finished over the last week),
# starts `postpone dashboard` on it, and times each page (curl, 5 requests, median and max,
# after one unrecorded request). Printed, never asserted.
#
#   bash benches/dashboard_pages.sh            # debug build of the postpone binary
#   PROFILE=release bash benches/dashboard_pages.sh
#
# Needs PostgreSQL on 127.0.0.1:5432 (user postgres), curl, and a built `postpone` binary.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-debug}
BIN=target/$PROFILE/postpone
[ -x "$BIN" ] || { echo "build $BIN first (cargo build${PROFILE/debug/})" >&2; exit 1; }
DB=postpone_pages_$$
PG="psql -h 127.0.0.1 -U postgres -qAt"
$PG -c "CREATE DATABASE $DB"
trap '$PG -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1; kill $DASH 2>/dev/null || true' EXIT
URL="postgres://postgres@127.0.0.1:5432/$DB"
$BIN --database-url "$URL" migrate >/dev/null
$PG -d $DB <<'SQL'
INSERT INTO postpone_jobs (queue, task, args, status, attempts, scheduled_at, created_at,
                           started_at, finished_at, errors, tags)
SELECT 'q' || (g % 5), 't' || (g % 10),
       jsonb_build_object('user', g % 1000, 'n', g),
       s.status,
       CASE WHEN s.status = 'todo' THEN 0 ELSE 1 END,
       t.at, t.at,
       CASE WHEN s.status IN ('todo') THEN NULL ELSE t.at + interval '20 milliseconds' END,
       CASE WHEN s.status IN ('todo', 'doing') THEN NULL ELSE t.at + interval '70 milliseconds' END,
       CASE WHEN s.status = 'failed'
            THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'at', t.at,
                   'error', CASE WHEN g % 3 = 0 THEN 'smtp: connection timeout' ELSE 'refused' END))
       END,
       CASE WHEN g % 10 = 0 THEN ARRAY['vip'] END
  FROM generate_series(1, 1000000) g
  CROSS JOIN LATERAL (SELECT now() - (1000000 - g) * interval '600 milliseconds' AS at) t
  CROSS JOIN LATERAL (SELECT CASE WHEN g > 990000 THEN 'todo'
                                  WHEN g % 200 = 7 AND g > 985000 THEN 'doing'
                                  WHEN g % 20 = 3 THEN 'failed'
                                  WHEN g % 100 = 11 THEN 'cancelled'
                                  ELSE 'succeeded' END AS status) s;
VACUUM ANALYZE postpone_jobs;
SQL
ID=$($PG -d $DB -c "SELECT id FROM postpone_jobs WHERE status = 'failed' ORDER BY id DESC LIMIT 1")
OUT=$(mktemp)
$BIN --database-url "$URL" dashboard --listen 127.0.0.1:0 --read-only >"$OUT" 2>/dev/null &
DASH=$!
for _ in $(seq 50); do grep -q http "$OUT" 2>/dev/null && break; sleep 0.2; done
BASE=$(grep -o 'http://[0-9.:]*' "$OUT" | head -1)
echo "1,000,000 jobs; $PROFILE build; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-48s | %8s | %8s | %s |\n' page median max footer
for path in "/" "/?range=week" "/jobs" "/jobs?status=failed" "/jobs?status=todo" \
            "/jobs?queue=q3" "/jobs?task=t7" "/jobs?status=failed&queue=q2" \
            "/jobs?since=1h" "/jobs?tag=vip" "/jobs?status=failed&error=timeout" \
            "/jobs?args=%7B%22user%22%3A7%7D" "/jobs?before=500000" "/jobs/$ID" "/workers" "/periodic"; do
    curl -s -o /dev/null "$BASE$path"
    times=()
    for _ in 1 2 3 4 5; do
        times+=("$(curl -s -o /dev/null -w '%{time_total}' "$BASE$path")")
    done
    sorted=$(printf '%s\n' "${times[@]}" | sort -n)
    med=$(echo "$sorted" | sed -n 3p); max=$(echo "$sorted" | tail -1)
    footer=$(curl -s "$BASE$path" | grep -o '[0-9]* quer[a-z]* in [0-9]* ms' | head -1 || true)
    printf '| %-48s | %6.0f ms | %6.0f ms | %s |\n' "$path" "$(echo "$med * 1000" | bc)" "$(echo "$max * 1000" | bc)" "$footer"
done
