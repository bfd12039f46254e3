#!/usr/bin/env bash
# WAL per job of the claim path under other table designs, as SQL models (docs/wal.md, "Other
# designs, measured as models"). Each model defers N no-op jobs in batches of 1,000, then claims
# them 100 at a time (FOR UPDATE SKIP LOCKED, as postpone's claim does) and records their
# outcomes (succeeded, finished jobs kept), one transaction per statement, on a cluster of its
# own (benches/cluster.sh) right after a CHECKPOINT; bytes come from pg_current_wal_insert_lsn.
#
#   benches/wal_models.sh [N]        (N = 30000; builds `cargo build --features cli --bin postpone` if
#                                    missing; CLI=PATH uses another build of the CLI; MODELS="as-is
#                                    one-txn" runs only those)
#
# Models:
#   as-is         postpone_jobs as migrated (its indexes and triggers), the claim's and the
#                 outcome's updates as plain statements: calibrates the models against
#                 benches/wal.py's figure for the real worker
#   ff50          the same with fillfactor 50
#   ff50-last     fillfactor 50, and the columns the claim and the outcome change (status,
#                 attempts, worker_id, started_at, finished_at) moved to the end of the row
#   queue-table   jobs keep only their primary key (status in no index: HOT updates), the
#                 waiting jobs are rows of a narrow table with the claim's two indexes, the
#                 claim deletes them; fillfactor 50, changed columns last
#   queue-table-1 the same with one claim index (no index per queue)
#   one-txn       postpone_jobs as migrated, the claim only locks its rows (FOR UPDATE SKIP
#                 LOCKED, no update) and the outcome is written in the claim's transaction: a
#                 job changes status once (todo -> succeeded), never showing `doing`
#   hot-claim     postpone_jobs as migrated, the claim sets only columns no index reads
#                 (claimed_at, attempts: a HOT update) and leaves the status `todo`; claims
#                 step over claimed rows still in the index of due jobs (`claimed_at IS NULL`
#                 checked in the row), with 4,000 jobs claimed and not finished at any time
#
# Besides bytes, each round prints the drain's time per job on its one connection with
# synchronous_commit off (the server's work, without waiting for WAL flushes; a timed figure,
# so it moves with the machine's load, unlike the bytes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-30000}
bin=${CLI:-$root/target/debug/postpone}
[ -x "$bin" ] || (cd "$root" && cargo build -q --features cli --bin postpone)
read -r dir port < <(bash "$root/benches/cluster.sh" start | tail -1)
trap 'bash "$root/benches/cluster.sh" stop "$dir" >/dev/null 2>&1 || true' EXIT
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres
q() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
move_last() { # table: the changed columns to the end of the row
    q -d "$1" -c "ALTER TABLE $2 DROP COLUMN status CASCADE, DROP COLUMN attempts CASCADE,
                  DROP COLUMN worker_id CASCADE, DROP COLUMN started_at CASCADE,
                  DROP COLUMN finished_at CASCADE" \
      -c "ALTER TABLE $2 ADD COLUMN status text NOT NULL DEFAULT 'todo',
                  ADD COLUMN attempts integer NOT NULL DEFAULT 0, ADD COLUMN worker_id bigint,
                  ADD COLUMN started_at timestamptz, ADD COLUMN finished_at timestamptz" 2>/dev/null
}
for m in ${MODELS:-as-is ff50 ff50-last queue-table queue-table-1 one-txn hot-claim}; do
    db=m_${m//-/_}
    q -c "CREATE DATABASE $db"
    DATABASE_URL=postgres://postgres@127.0.0.1:$port/$db "$bin" migrate >/dev/null
    q -d "$db" -c "INSERT INTO postpone_workers (name, last_heartbeat) VALUES ('model', now() + interval '1 day')"
    case $m in
    ff50) q -d "$db" -c "ALTER TABLE postpone_jobs SET (fillfactor = 50)" ;;
    ff50-last)
        idx=$(psql -X -At -d "$db" -c "SELECT string_agg(regexp_replace(indexdef, E'\\\\s+', ' ', 'g'), '; ')
                                         FROM pg_indexes WHERE tablename = 'postpone_jobs'
                                          AND indexdef ~ '(status|attempts|worker_id|started_at|finished_at)'")
        q -d "$db" -c "ALTER TABLE postpone_jobs SET (fillfactor = 50)"
        move_last "$db" postpone_jobs
        q -d "$db" -c "$idx" ;;
    queue-table*)
        q -d "$db" -c "CREATE TABLE jobs_h (LIKE postpone_jobs INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING IDENTITY) WITH (fillfactor = 50)" \
            -c "ALTER TABLE jobs_h ADD PRIMARY KEY (id)" \
            -c "CREATE TABLE q (id bigint NOT NULL, queue text NOT NULL, priority integer NOT NULL, scheduled_at timestamptz NOT NULL)" \
            -c "CREATE INDEX q_due ON q (priority DESC, scheduled_at, id)"
        move_last "$db" jobs_h
        [ "$m" = queue-table ] && q -d "$db" -c "CREATE INDEX q_due_queue ON q (queue, priority DESC, scheduled_at, id)" ;;
    esac
    case $m in
    queue-table*)
        defer="WITH ins AS (INSERT INTO jobs_h (queue, task, args) SELECT 'default', 'noop', 'null'
                              FROM generate_series(1, 1000) RETURNING id, queue, priority, scheduled_at)
               INSERT INTO q SELECT id, queue, priority, scheduled_at FROM ins"
        claim="WITH d AS (DELETE FROM q WHERE ctid = ANY(ARRAY(SELECT c.ctid FROM q c
                              ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 100
                              FOR UPDATE SKIP LOCKED)) RETURNING id),
                    u AS (UPDATE jobs_h j SET status = 'doing', worker_id = 1, attempts = j.attempts + 1,
                                 started_at = now() WHERE j.id IN (SELECT id FROM d) RETURNING j.id)
               SELECT array_agg(id) INTO ids FROM u"
        finish="UPDATE jobs_h SET status = 'succeeded', finished_at = now() WHERE id = ANY(ids)" ;;
    *)
        defer="INSERT INTO postpone_jobs (queue, task, args) SELECT 'default', 'noop', 'null' FROM generate_series(1, 1000)"
        claim="WITH u AS (UPDATE postpone_jobs j SET status = 'doing', worker_id = 1, attempts = j.attempts + 1,
                                 started_at = now()
                           WHERE j.id = ANY(ARRAY(SELECT c.id FROM postpone_jobs c
                                 WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.expires_at IS NULL
                                   AND c.scheduled_at <= now()
                                 ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 100
                                 FOR UPDATE SKIP LOCKED)) RETURNING j.id)
               SELECT array_agg(id) INTO ids FROM u"
        finish="UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = ANY(ids)" ;;
    esac
    if [ "$m" = hot-claim ]; then
        claim="WITH u AS (UPDATE postpone_jobs j SET claimed_at = now(), attempts = j.attempts + 1
                           WHERE j.id = ANY(ARRAY(SELECT c.id FROM postpone_jobs c
                                 WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.expires_at IS NULL
                                   AND c.scheduled_at <= now() AND c.claimed_at IS NULL
                                 ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 100
                                 FOR UPDATE SKIP LOCKED)) RETURNING j.id)
               SELECT array_agg(id) INTO ids FROM u"
        finish="UPDATE postpone_jobs SET status = 'succeeded', worker_id = 1, started_at = now(),
                       finished_at = now() WHERE id = ANY(pend[1:100])"
        drain="DO \$\$ DECLARE ids bigint[]; pend bigint[] := '{}'; BEGIN LOOP $claim; COMMIT;
                 pend := pend || coalesce(ids, '{}');
                 EXIT WHEN cardinality(pend) = 0;
                 IF ids IS NULL OR cardinality(pend) > 4000 THEN $finish; pend := pend[101:]; COMMIT; END IF;
               END LOOP; END \$\$"
    elif [ "$m" = one-txn ]; then
        claim="SELECT array_agg(s.id) INTO ids FROM (SELECT c.id FROM postpone_jobs c
                     WHERE c.status = 'todo' AND c.blocked_by IS NULL AND c.expires_at IS NULL
                       AND c.scheduled_at <= now()
                     ORDER BY c.priority DESC, c.scheduled_at, c.id LIMIT 100
                     FOR UPDATE SKIP LOCKED) s"
        finish="UPDATE postpone_jobs SET status = 'succeeded', worker_id = 1, attempts = attempts + 1,
                       started_at = now(), finished_at = now() WHERE id = ANY(ids)"
        drain="DO \$\$ DECLARE ids bigint[]; BEGIN LOOP $claim; EXIT WHEN ids IS NULL; $finish; COMMIT; END LOOP; END \$\$"
    else
        drain="DO \$\$ DECLARE ids bigint[]; BEGIN LOOP $claim; EXIT WHEN ids IS NULL; COMMIT; $finish; COMMIT; END LOOP; END \$\$"
    fi
    for round in 1 2; do
        q -d "$db" -c "TRUNCATE postpone_jobs" -c CHECKPOINT
        case $m in queue-table*) q -d "$db" -c "TRUNCATE jobs_h, q" -c CHECKPOINT ;; esac
        l0=$(psql -X -At -d "$db" -c "SELECT pg_current_wal_insert_lsn()")
        q -d "$db" -c "DO \$\$ BEGIN FOR i IN 1..$n/1000 LOOP $defer; COMMIT; END LOOP; END \$\$"
        l1=$(psql -X -At -d "$db" -c "SELECT pg_current_wal_insert_lsn()")
        t0=$(date +%s%N)
        q -d "$db" -c "SET synchronous_commit = off" -c "$drain"
        t1=$(date +%s%N)
        l2=$(psql -X -At -d "$db" -c "SELECT pg_current_wal_insert_lsn()")
        psql -X -At -d "$db" -c "SELECT format('%-14s round %s: defer %s, drain %s, total %s bytes per job; drain %s µs a job', '$m', $round,
            round(pg_wal_lsn_diff('$l1', '$l0') / $n.0), round(pg_wal_lsn_diff('$l2', '$l1') / $n.0),
            round(pg_wal_lsn_diff('$l2', '$l0') / $n.0), round(($t1 - $t0) / 1000.0 / $n, 1))"
    done
done
