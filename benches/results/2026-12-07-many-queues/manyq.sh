#!/usr/bin/env bash
set -e
ROOT=/work/main
NQ=$1; PER=$2; LIMIT=$3; CLI=${CLI:-$ROOT/target/release/postpone}; MODE=${MODE:-named}
stmt() { python3 - "$ROOT/src/store/$1" "$2" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
m = re.search(r'pub\(crate\) const ' + sys.argv[2] + r': &str = "(.*?)";\n', src, re.S)
print(m.group(1).replace('\\"', '"').replace("\\\n", ""))
EOF
}
CLAIM=$(stmt attempts.rs JOB_CLAIM)
QS="{$(seq -s, -f "q%g" 0 $((NQ-1)))}"
U="postgres://postgres@127.0.0.1:5432/manyq"
psql -qX "postgres://postgres@127.0.0.1:5432/postgres" -c "drop database if exists manyq" -c "create database manyq"
$CLI --database-url "$U" migrate >/dev/null
psql -qX "$U" <<EOF
INSERT INTO postpone_workers (id, name, host, pid, queues, concurrency) VALUES (1, 't', 'b', 1, NULL, 4);
INSERT INTO postpone_jobs (queue, task, args, priority) SELECT 'q' || (g % $NQ), 'noop', 'null', (g % 7) - 3 FROM generate_series(1, $NQ * $PER) g;
UPDATE postpone_jobs SET expires_at = now() + interval '1 hour' WHERE id % 4 = 0 AND '${DEADLINES:-yes}' = 'yes';
INSERT INTO postpone_paused_queues (queue) SELECT 'paused-one' WHERE '$MODE' = 'paused';
VACUUM ANALYZE postpone_jobs;
PREPARE c(bigint, int, text[], text[], int, bigint, boolean, boolean) AS SELECT count(*) FROM ($CLAIM) x;
\timing on
BEGIN;
EXECUTE c(1, $LIMIT, CASE WHEN '$MODE' = 'paused' THEN NULL ELSE '$QS'::text[] END, NULL, $LIMIT, 67108864, true, false);
ROLLBACK;
BEGIN;
EXECUTE c(1, $LIMIT, CASE WHEN '$MODE' = 'paused' THEN NULL ELSE '$QS'::text[] END, NULL, $LIMIT, 67108864, true, false);
ROLLBACK;
EOF
