#!/usr/bin/env bash
# checkorder.sh NQ PER LIMIT : claim LIMIT naming all NQ queues; compare with the reference top-LIMIT; count locked-not-kept
set -e
ROOT=/work/main
NQ=$1; PER=$2; LIMIT=$3; CLI=${CLI:-$ROOT/target/release/postpone}
stmt() { python3 - "$ROOT/src/store/$1" "$2" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
m = re.search(r'pub\(crate\) const ' + sys.argv[2] + r': &str = "(.*?)";\n', src, re.S)
print(m.group(1).replace('\\"', '"').replace("\\\n", ""))
EOF
}
CLAIM=$(stmt attempts.rs JOB_CLAIM)
QS="{$(seq -s, -f "q%g" 0 $((NQ-1)))}"
U="postgres://postgres@127.0.0.1:5432/chk"
psql -qX "postgres://postgres@127.0.0.1:5432/postgres" -c "drop database if exists chk" -c "create database chk" 2>/dev/null
$CLI --database-url "$U" migrate >/dev/null
psql -qX "$U" <<EOF
INSERT INTO postpone_workers (id, name, host, pid, queues, concurrency) VALUES (1, 't', 'b', 1, NULL, 4);
-- skewed: queue q0 holds many jobs, others few; priorities vary; some scheduled later; some with deadlines
INSERT INTO postpone_jobs (queue, task, args, priority, scheduled_at)
  SELECT 'q' || (CASE WHEN g % 3 = 0 THEN 0 ELSE g % $NQ END), 'noop', 'null', (g * 7919 % 5) - 2,
         now() - (g % 97) * interval '1 second' + CASE WHEN g % 11 = 0 THEN interval '1 hour' ELSE interval '0' END
    FROM generate_series(1, $NQ * $PER) g;
UPDATE postpone_jobs SET expires_at = now() + interval '1 hour' WHERE id % 4 = 0;
UPDATE postpone_jobs SET expires_at = now() - interval '1 second', scheduled_at = now() - interval '2 seconds' WHERE id % 29 = 0;
VACUUM ANALYZE postpone_jobs;
CREATE TABLE ref AS SELECT id FROM postpone_jobs WHERE status = 'todo' AND queue = ANY('$QS'::text[]) AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
   ORDER BY priority DESC, scheduled_at, id LIMIT $LIMIT;
PREPARE c(bigint, int, text[], text[], int, bigint, boolean, boolean) AS $CLAIM;
EOF
psql -qX "$U" <<EOF
PREPARE c(bigint, int, text[], text[], int, bigint, boolean, boolean) AS $CLAIM;
BEGIN;
\\timing on
EXECUTE c(1, $LIMIT, '$QS'::text[], NULL, $LIMIT, 67108864, true, false);
\\timing off
SELECT 'claimed', count(*) FROM postpone_jobs WHERE status = 'doing';
SELECT 'missing from ref', count(*) FROM ref WHERE id NOT IN (SELECT id FROM postpone_jobs WHERE status = 'doing');
SELECT 'extra', count(*) FROM postpone_jobs WHERE status = 'doing' AND id NOT IN (SELECT id FROM ref);
SELECT 'locked not kept', count(*) FROM postpone_jobs WHERE status = 'todo' AND xmax::text::bigint = txid_current() % 4294967296;
COMMIT;
EOF
