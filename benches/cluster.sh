#!/usr/bin/env bash
# A PostgreSQL cluster of the bench's own, with the server's default settings: the fair ground
# for comparing job queues (autovacuum on, as every peer relies on it; the same shared_buffers
# for every system), where the machine's server at 127.0.0.1:5432 has autovacuum off.
#
#   benches/cluster.sh start        initdb + start; prints "DIR PORT" on its last line
#   benches/cluster.sh stop DIR     stops the cluster in DIR (fast) and removes DIR
#   benches/cluster.sh settings PORT  the settings a result should name, on one line
#
# The cluster lives in a new /tmp/postpone-bench-cluster.XXXXXX (data in DIR/data, its log in
# DIR/log, its Unix socket in DIR), listens on 127.0.0.1 on a port that was free a moment
# before, trusts local connections for user postgres, and changes nothing else from initdb's
# postgresql.conf but `shared_buffers = 128MB` (initdb's default where the kernel allows it,
# and the machine server's value: written out so that every run has it). An experiment can
# add lines of its own: POSTPONE_CLUSTER_CONF='max_wal_size = 8GB' (`;` separates lines);
# a result measured so is not a default-settings figure, and should say so. Server binaries:
# PG_BIN, else the newest /usr/lib/postgresql/*/bin with initdb. As root, initdb and the
# server run as the postgres user (both refuse root). compare.sh and `cargo bench --bench
# throughput -- --cluster` call this; they stop the cluster when they end, also on failure.
set -euo pipefail

pg_bin() {
    if [ -n "${PG_BIN:-}" ]; then
        echo "$PG_BIN"
        return
    fi
    local b
    b=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    [ -n "$b" ] && [ -x "$b/initdb" ] || {
        echo "no PostgreSQL server binaries (no /usr/lib/postgresql/*/bin/initdb; set PG_BIN)" >&2
        exit 3
    }
    echo "$b"
}

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
    bin=$(pg_bin)
    dir=$(mktemp -d /tmp/postpone-bench-cluster.XXXXXX)
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    chmod 700 "$dir"
    if ! as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1; then
        cat "$dir/initdb.log" >&2
        rm -rf "$dir"
        exit 3
    fi
    cat >>"$dir/data/postgresql.conf" <<EOF

# postpone bench cluster: initdb's defaults but for these lines
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_buffers = 128MB
EOF
    if [ -n "${POSTPONE_CLUSTER_CONF:-}" ]; then
        echo "# the experiment's own (POSTPONE_CLUSTER_CONF)" >>"$dir/data/postgresql.conf"
        tr ';' '\n' <<<"$POSTPONE_CLUSTER_CONF" >>"$dir/data/postgresql.conf"
    fi
    if ! as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >/dev/null; then
        cat "$dir/log" >&2
        rm -rf "$dir"
        exit 3
    fi
    echo "$dir $port"
    ;;
stop)
    dir=${2:?usage: cluster.sh stop DIR}
    case "$dir" in
    /tmp/postpone-bench-cluster.*) ;;
    *)
        echo "not a bench cluster's directory: $dir" >&2
        exit 2
        ;;
    esac
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_pg "$(pg_bin)/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null || true
    fi
    rm -rf "$dir"
    ;;
settings)
    port=${2:?usage: cluster.sh settings PORT}
    psql -h 127.0.0.1 -p "$port" -U postgres -XAtq -d postgres -c "SELECT 'PostgreSQL ' || current_setting('server_version') || ', autovacuum ' || current_setting('autovacuum') || ', shared_buffers ' || current_setting('shared_buffers') || ', synchronous_commit ' || current_setting('synchronous_commit') || ', max_wal_size ' || current_setting('max_wal_size') || ', checkpoint_timeout ' || current_setting('checkpoint_timeout') || ', wal_compression ' || current_setting('wal_compression')"
    ;;
*)
    echo "usage: benches/cluster.sh start | stop DIR | settings PORT" >&2
    exit 2
    ;;
esac
