#!/usr/bin/env bash
# Checks, on clusters of its own, what a claim written in the outcome's transaction (docs/wal.md,
# "One status change a job: what it would need") relies on when the server loses that
# transaction while the worker lives: the row locks of `FOR UPDATE SKIP LOCKED` leave the
# locking transaction's id in each row's `xmax`, and once the server has ended it (a restart
# after a crash, a terminated backend, a standby promoted) `txid_status` says `aborted`, so a
# claim can skip exactly the rows of a live worker's lost transaction with a filter on `xmax`,
# without locking them.
#
#   benches/orphan_locks.sh        four cases, one line each: PASS or FAIL and what was seen
#
# Cases:
#   crash      lock 5 rows, commit a note (another session) after the lock, stop the server
#              with `-m immediate`, start it: xmax kept, txid_status aborted, a claim that
#              filters on xmax takes the next rows and leaves the 5 unlocked, VACUUM keeps xmax
#   terminate  the same with pg_terminate_backend of the locking session
#   failover   the same on a streaming standby (pg_basebackup), promoted after the note replayed
#   unflushed  no commit after the lock: the crash loses the lock and the transaction id, and
#              the server hands that id out again (why the note must be committed after the lock)
#
# Server binaries: PG_BIN, else the newest /usr/lib/postgresql/*/bin. Takes about 20 s.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
DIRS=()
cleanup() {
    for d in "${DIRS[@]}"; do
        [ -f "$d/data/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$d/data" -m immediate stop >/dev/null 2>&1 || true
        case "$d" in /tmp/postpone-bench-cluster.*) rm -rf "$d" ;; esac
    done
}
trap cleanup EXIT
FAILED=0

start_cluster() { # prints "DIR PORT"
    local out
    out=$("$HERE/cluster.sh" start | tail -1)
    echo "$out"
}
q() { PGOPTIONS="-c client_min_messages=warning" psql -h 127.0.0.1 -p "$1" -U postgres -XAtq -d postgres -c "$2"; }
restart_immediate() {
    as_pg "$BIN/pg_ctl" -D "$1/data" -m immediate stop >/dev/null
    as_pg "$BIN/pg_ctl" -D "$1/data" -l "$1/log" -w -t 60 start >/dev/null
}
setup() {
    q "$1" "DROP TABLE IF EXISTS j, note; CREATE TABLE j (id bigint PRIMARY KEY, status text);
            INSERT INTO j SELECT g, 'todo' FROM generate_series(1, 20) g; CREATE TABLE note (x bigint)"
}
# Locks rows 1-5 in a session that stays open; prints its transaction id.
hold() {
    local port=$1 out=$2
    (psql -h 127.0.0.1 -p "$port" -U postgres -XAtq -d postgres \
        -c "BEGIN" -c "SELECT txid_current()" \
        -c "SELECT id FROM j ORDER BY id LIMIT 5 FOR UPDATE SKIP LOCKED" \
        -c "SELECT pg_sleep(60)" >"$out" 2>&1 &)
    for _ in $(seq 100); do
        [ "$(wc -l <"$out")" -ge 6 ] && break
        sleep 0.05
    done
    sed -n 1p "$out"
}
judge() { # case port xid
    local name=$1 port=$2 x=$3 kept status claimed after vac
    kept=$(q "$port" "SELECT count(*) FROM j WHERE id <= 5 AND xmax::text::bigint = $x")
    status=$(q "$port" "SELECT txid_status($x)")
    claimed=$(q "$port" "SELECT string_agg(id::text, ',' ORDER BY id) FROM (SELECT id FROM j WHERE xmax::text::bigint <> $x ORDER BY id LIMIT 3 FOR UPDATE SKIP LOCKED) s")
    after=$(q "$port" "SELECT count(*) FROM j WHERE id <= 5 AND xmax::text::bigint = $x")
    q "$port" "VACUUM j"
    vac=$(q "$port" "SELECT count(*) FROM j WHERE id <= 5 AND xmax::text::bigint = $x")
    if [ "$kept" = 5 ] && [ "$status" = aborted ] && [ "$claimed" = "6,7,8" ] && [ "$after" = 5 ] && [ "$vac" = 5 ]; then
        echo "PASS $name: xmax $x kept on 5 rows, txid_status $status, the filtered claim took $claimed and left the 5 unlocked, VACUUM kept xmax"
    else
        echo "FAIL $name: rows with xmax $x: $kept (after the claim $after, after VACUUM $vac), txid_status $status, claimed $claimed"
        FAILED=1
    fi
}

# crash
read -r DIR PORT < <(start_cluster); DIRS+=("$DIR")
setup "$PORT"
X=$(hold "$PORT" "$DIR/holder.out")
q "$PORT" "INSERT INTO note VALUES ($X)"
restart_immediate "$DIR"
judge crash "$PORT" "$X"

# terminate
setup "$PORT"
X=$(hold "$PORT" "$DIR/holder2.out")
q "$PORT" "INSERT INTO note VALUES ($X)"
q "$PORT" "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_xid::text::bigint = $X" >/dev/null
sleep 0.3
judge terminate "$PORT" "$X"

# unflushed: nothing commits after the lock
setup "$PORT"
q "$PORT" "CHECKPOINT"
X=$(hold "$PORT" "$DIR/holder3.out")
restart_immediate "$DIR"
kept=$(q "$PORT" "SELECT count(*) FROM j WHERE id <= 5 AND xmax::text::bigint = $X")
next=$(q "$PORT" "SELECT txid_current()")
if [ "$kept" = 0 ] && [ "$next" -le "$X" ]; then
    echo "PASS unflushed: the crash lost the lock (0 rows with xmax $X) and the server hands out $next again: a note must be committed after the lock"
else
    echo "NOTE unflushed: rows with xmax $X: $kept, next transaction id $next (the WAL writer flushed the lock's records before the crash this time)"
fi

# failover
setup "$PORT"
q "$PORT" "CHECKPOINT"
SDIR=$(mktemp -d /tmp/postpone-bench-cluster.XXXXXX); DIRS+=("$SDIR")
[ "$(id -u)" = 0 ] && chown postgres: "$SDIR"
chmod 700 "$SDIR"
SPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "host replication postgres 127.0.0.1/32 trust" | as_pg tee -a "$DIR/data/pg_hba.conf" >/dev/null
q "$PORT" "SELECT pg_reload_conf()" >/dev/null
as_pg "$BIN/pg_basebackup" -h 127.0.0.1 -p "$PORT" -U postgres -D "$SDIR/data" -R -X stream >/dev/null
as_pg sed -i "s/^port = .*/port = $SPORT/; s|^unix_socket_directories = .*|unix_socket_directories = '$SDIR'|" "$SDIR/data/postgresql.conf"
as_pg "$BIN/pg_ctl" -D "$SDIR/data" -l "$SDIR/log" -w -t 60 start >/dev/null
X=$(hold "$PORT" "$DIR/holder4.out")
q "$PORT" "INSERT INTO note VALUES ($X)"
LSN=$(q "$PORT" "SELECT pg_current_wal_lsn()")
for _ in $(seq 200); do
    [ "$(q "$SPORT" "SELECT pg_last_wal_replay_lsn() >= '$LSN'")" = t ] && break
    sleep 0.05
done
as_pg "$BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null
as_pg "$BIN/pg_ctl" -D "$SDIR/data" -w -t 60 promote >/dev/null
judge failover "$SPORT" "$X"

exit $FAILED
