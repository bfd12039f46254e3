#!/bin/sh
# A --hook for benches/wal.rs: profiles the PostgreSQL cluster during the drain.
#   PGDATA_DIR=<cluster>/data PGPORT_X=<port> [PERF=1] \
#     target/release/deps/wal-* --n 200000 --c 4 --hook benches/profile/hook.sh
# start: resets pg_stat_statements (installed in database postgres) and, with PERF=1, starts
# `perf record -a -g` into $OUT/perf.data; stop: writes the cluster's backend pids to
# $OUT/pids, stops perf, and the statements' times to $OUT/pss.txt. OUT defaults to /tmp.
OUT=${OUT:-/tmp}
Q="psql -h 127.0.0.1 -p $PGPORT_X -U postgres -d postgres -XAtq"
case "$1" in
start)
    $Q -c "SELECT pg_stat_statements_reset()" >/dev/null
    if [ -n "$PERF" ]; then
        perf record -F 1999 -a -g -o "$OUT/perf.data" -- sleep 600 >"$OUT/perf.log" 2>&1 &
        echo $! >"$OUT/perf.pid"
        sleep 1
    fi
    ;;
stop)
    if [ -n "$PERF" ]; then
        pm=$(head -1 "$PGDATA_DIR/postmaster.pid")
        ps -o pid= --ppid "$pm" | tr -d ' ' | paste -sd, >"$OUT/pids"
        kill -INT "$(cat "$OUT/perf.pid")"
        sleep 3
    fi
    $Q -F '|' -c "SELECT toplevel, calls, rows, round(total_exec_time::numeric, 1),
                         round(total_plan_time::numeric, 1), plans,
                         left(regexp_replace(query, '\s+', ' ', 'g'), 150)
                    FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 60" >"$OUT/pss.txt"
    ;;
esac
