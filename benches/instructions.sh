#!/usr/bin/env bash
# PostgreSQL's instructions per job, counted by callgrind: a measure that does not move with
# the machine's load, for changes too small for a timed bench to see (a few percent of the
# server's CPU a job, where two runs of the same timed bench differ by more).
#
#   benches/instructions.sh [--cli PATH] [--n N] [--batch B] [--setup SQL] [--keep]
#
# A cluster of its own (benches/cluster.sh) is migrated by the CLI (`--cli`, default
# target/release/postpone: `cargo build --release --features cli --bin postpone`), then
# stopped; `--setup SQL` runs after the migrations (an experiment). Then four runs of the
# server in single-user mode (`postgres --single`), each under `valgrind --tool=callgrind`
# on a copy of that data directory, each doing one phase more than the last:
#
#   0  a worker row (the claim's fence) and one batch of each statement below, to fill the
#      server's caches (its jobs are not counted)
#   1  + N no-op jobs deferred in batches of B (the batch defer's statement, JOB_INSERT_BATCH)
#   2  + claimed B at a time (the worker's claim statement, JOB_CLAIM, with a byte budget)
#   3  + recorded `succeeded` B at a time (the outcome statement, JOB_FINISH_BATCH)
#
# and prints each phase's instructions per job: the difference between two runs over N.
# Each statement is a transaction of its own, as the worker's are, and returns only how many
# rows it made (single-user mode prints every row returned, in a form of its own: the rows'
# conversion for the client is left out of every phase). What is counted is
# PostgreSQL's own code in user space: the kernel's work (writing and flushing WAL, the
# socket) is not in it, nor the client's. Statements are those of src/store, taken from the
# sources of this tree (so compare builds with the same script); `--keep` keeps the callgrind
# files (cg.0 to cg.3, for callgrind_annotate) and says where.
#
# Statements of B jobs share their fixed costs: a change that costs per statement (a plan
# JIT-compiled, say) can hide in these figures, so look at statements of one job too.
#
# Needs valgrind (Debian's `valgrind`). N = 10,000 takes a minute or two; two runs of the
# same build agree within about 0.03%.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
CLI="$ROOT/target/release/postpone"
N=10000
B=1000
SETUP=""
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
    --cli) CLI=$2; shift 2 ;;
    --n) N=$2; shift 2 ;;
    --batch) B=$2; shift 2 ;;
    --setup) SETUP=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "instructions.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 3; }
[ -x "$CLI" ] || { echo "instructions.sh: no CLI at $CLI (cargo build --release --features cli --bin postpone)" >&2; exit 3; }
[ $((N % B)) = 0 ] || { echo "instructions.sh: --n must be a multiple of --batch" >&2; exit 2; }

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

out=$("$HERE/cluster.sh" start)
read -r DIR PORT <<<"$(echo "$out" | tail -1)"
trap '"$HERE/cluster.sh" stop "$DIR" >/dev/null 2>&1 || true' EXIT
URL="postgres://postgres@127.0.0.1:$PORT/postgres"
"$CLI" --database-url "$URL" migrate >/dev/null
if [ -n "$SETUP" ]; then
    psql -q -X -v ON_ERROR_STOP=1 "$URL" -c "$SETUP" >/dev/null
fi
VERSION=$(psql -X -At "$URL" -c "SELECT max(version) FROM postpone_migrations" 2>/dev/null || echo "?")
BIN=$(psql -X -At "$URL" -c "SELECT setting FROM pg_config() WHERE name = 'BINDIR'" 2>/dev/null || true)
[ -n "$BIN" ] || BIN=$(dirname "$(as_pg sh -c "readlink -f /proc/\$(head -1 $DIR/data/postmaster.pid)/exe")")
PGVERSION=$(psql -X -At "$URL" -c "SHOW server_version")
as_pg "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null

# The statements of this tree, as the worker sends them (with $n parameters).
stmt() {
    python3 - "$ROOT/src/store/$1" "$2" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
m = re.search(r'pub\(crate\) const ' + sys.argv[2] + r': &str = "(.*?)";\n', src, re.S)
if not m:
    sys.exit(f"no {sys.argv[2]} in {sys.argv[1]}")
print(m.group(1).replace('\\"', '"').replace("\\\n", ""))
EOF
}
INSERT_BATCH=$(stmt jobs.rs JOB_INSERT_BATCH)
CLAIM=$(stmt attempts.rs JOB_CLAIM)
FINISH=$(stmt attempts.rs JOB_FINISH_BATCH)

phase_sql() {
    local p=$1 i
    # Single-user mode reads statements ended by a semicolon and a blank line (-j).
    printf '%s\n\n' "INSERT INTO postpone_workers (id, name, host, pid, queues, concurrency) VALUES (1, 'instructions', 'bench', 1, NULL, 4);"
    printf '%s\n\n' "CREATE FUNCTION pg_temp.ids(a bigint, b bigint) RETURNS bigint[] LANGUAGE sql AS 'SELECT array_agg(g ORDER BY g) FROM generate_series(a, b) g';"
    printf '%s\n\n' "PREPARE d(text[], text[], jsonb[], int[], text[], text[], timestamptz[], bigint[], int[], jsonb[], jsonb[], timestamptz[], bigint[]) AS WITH x AS ($INSERT_BATCH) SELECT count(*) FROM x;"
    printf '%s\n\n' "PREPARE c(bigint, int, text[], text[], int, bigint, boolean) AS SELECT count(*) FROM ($CLAIM) x;"
    printf '%s\n\n' "PREPARE f(bigint[], bigint[], int[], text[], text[], jsonb[], bigint[]) AS SELECT count(*) FROM ($FINISH) x;"
    # A warm-up batch in every run, the first: the server's caches (catalogues, plans,
    # PL/pgSQL functions) are filled before what is counted apart.
    defer_stmt
    printf '%s\n\n' "EXECUTE c(1, $B, NULL, NULL, $B, 67108864, true);"
    printf '%s\n\n' "EXECUTE f(pg_temp.ids(1, $B), array_fill(1::bigint, ARRAY[$B]), array_fill(1, ARRAY[$B]), array_fill('succeeded'::text, ARRAY[$B]), NULL, NULL, array_fill(5::bigint, ARRAY[$B]));"
    [ "$p" -ge 1 ] || return 0
    for ((i = 0; i < N / B; i++)); do
        defer_stmt
    done
    [ "$p" -ge 2 ] || return 0
    for ((i = 0; i < N / B; i++)); do
        printf '%s\n\n' "EXECUTE c(1, $B, NULL, NULL, $B, 67108864, true);"
    done
    [ "$p" -ge 3 ] || return 0
    for ((i = 1; i <= N / B; i++)); do
        printf '%s\n\n' "EXECUTE f(pg_temp.ids($((i * B + 1)), $(((i + 1) * B))), array_fill(1::bigint, ARRAY[$B]), array_fill(1, ARRAY[$B]), array_fill('succeeded'::text, ARRAY[$B]), NULL, NULL, array_fill(5::bigint, ARRAY[$B]));"
    done
    printf '%s\n\n' "SELECT 'check', count(*) FILTER (WHERE status = 'succeeded') AS succeeded, count(*) AS jobs FROM postpone_jobs;"
}

defer_stmt() {
    printf '%s\n\n' "EXECUTE d(array_fill('default'::text, ARRAY[$B]), array_fill('noop'::text, ARRAY[$B]), array_fill('{}'::jsonb, ARRAY[$B]), array_fill(0, ARRAY[$B]), NULL, NULL, NULL, array_fill(0::bigint, ARRAY[$B]), NULL, NULL, NULL, NULL, NULL);"
}

WORK=$(mktemp -d /tmp/postpone-instructions.XXXXXX)
chmod 755 "$WORK"
[ "$(id -u)" = 0 ] && chown postgres "$WORK"
trap '"$HERE/cluster.sh" stop "$DIR" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
declare -a IR
for p in 0 1 2 3; do
    rm -rf "$WORK/data"
    as_pg cp -a "$DIR/data" "$WORK/data"
    phase_sql "$p" >"$WORK/phase$p.sql"
    as_pg valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$p" \
        "$BIN/postgres" --single -j -D "$WORK/data" postgres <"$WORK/phase$p.sql" >"$WORK/out.$p" 2>&1 || true
    IR[$p]=$(grep -o 'Collected : [0-9]*' "$WORK/out.$p" | grep -o '[0-9]*$' || true)
    if [ -z "${IR[$p]}" ] || grep -q 'ERROR:' "$WORK/out.$p"; then
        echo "instructions.sh: phase $p failed:" >&2
        grep -m5 -B2 -A2 'ERROR:' "$WORK/out.$p" >&2 || tail -20 "$WORK/out.$p" >&2
        exit 1
    fi
done
if ! grep -q "succeeded = \"$((N + B))\"" "$WORK/out.3"; then
    echo "instructions.sh: phase 3 did not finish every job:" >&2
    grep -A4 '"check"' "$WORK/out.3" >&2 || true
    exit 1
fi
per() { python3 -c "print(f'{($1 - $2) / $N:,.0f}')"; }
echo "PostgreSQL $PGVERSION, schema $VERSION, $N no-op jobs, batches of $B; instructions a job"
echo "  defer  $(per "${IR[1]}" "${IR[0]}")"
echo "  claim  $(per "${IR[2]}" "${IR[1]}")"
echo "  finish $(per "${IR[3]}" "${IR[2]}")"
echo "  total  $(per "${IR[3]}" "${IR[0]}")"
printf '{"what": "instructions", "n": %s, "batch": %s, "schema": "%s", "defer": %s, "claim": %s, "finish": %s}\n' \
    "$N" "$B" "$VERSION" \
    "$(((IR[1] - IR[0]) / N))" "$(((IR[2] - IR[1]) / N))" "$(((IR[3] - IR[2]) / N))"
if [ "$KEEP" = 1 ]; then
    keep=$(mktemp -d /tmp/postpone-instructions-kept.XXXXXX)
    cp "$WORK"/cg.* "$WORK"/out.* "$WORK"/phase*.sql "$keep"/
    echo "callgrind files kept in $keep (callgrind_annotate $keep/cg.3)"
fi
