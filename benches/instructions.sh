#!/usr/bin/env bash
# PostgreSQL's instructions per job, counted by callgrind: a measure that does not move with
# the machine's load, for changes too small for a timed bench to see (a few percent of the
# server's CPU a job, where two runs of the same timed bench differ by more).
#
#   benches/instructions.sh [--cli PATH] [--n N] [--batch B] [--warm-up W] [--setup SQL]
#                           [--keep] [--outcome succeeded|delete] [--prune] [--queues Q,...]
#                           [--args-kb A] [--output-kb O]
#
# A cluster of its own (benches/cluster.sh) is migrated by the CLI (`--cli`, default
# target/release/postpone: `cargo build --release --features cli --bin postpone`), then
# stopped; `--setup SQL` runs after the migrations (an experiment). Then four runs of the
# server in single-user mode (`postgres --single`), each under `valgrind --tool=callgrind`
# on a copy of that data directory, each doing one phase more than the last:
#
#   0  a worker row (the claim's fence) and W rounds (`--warm-up W`, default 6) of one batch
#      of each statement below, to fill the server's caches (its jobs are not counted): a
#      prepared statement gets custom plans for its first five runs (PostgreSQL's plan
#      cache), then its generic plan, as on a worker's long-lived connections
#   1  + N no-op jobs deferred in batches of B (the batch defer's statement, JOB_INSERT_BATCH)
#   2  + claimed B at a time (the worker's claim statement, JOB_CLAIM, with a byte budget)
#   3  + recorded `succeeded` B at a time (the outcome statement, JOB_FINISH_BATCH)
#   4  with `--prune`: + deleted B at a time as retention deletes finished jobs (JOBS_PRUNE)
#
# `--queues a,b,c` defers each batch's jobs to those queues in turn and claims naming them
# (a worker of named queues, whose claim merges a walk of each); by default every job is
# deferred to `default` and claimed by a worker of every queue.
#
# `--args-kb A` defers jobs whose arguments are a JSON string of A KiB (hex digits, different
# for every job, so that no compression shortens them), `--output-kb O` records each success
# with an output of O KiB made the same way. Each run makes them before what is counted; the
# counted statements read them (an index scan) and parse them (`json`, `jsonb`), as the
# server parses the worker's parameters.
#
# `--outcome delete` records the outcome `DeleteJobs::Always` records (the row deleted
# instead of kept; no `--prune` then). `--outcome succeeded --prune` against `--outcome
# delete` is what retention costs PostgreSQL a job over deleting at once.
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
W=6
SETUP=""
KEEP=0
OUTCOME=succeeded
PRUNE=0
QUEUES=""
ARGS_KB=0
OUTPUT_KB=0
while [ $# -gt 0 ]; do
    case "$1" in
    --cli) CLI=$2; shift 2 ;;
    --n) N=$2; shift 2 ;;
    --batch) B=$2; shift 2 ;;
    --warm-up) W=$2; shift 2 ;;
    --setup) SETUP=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --outcome) OUTCOME=$2; shift 2 ;;
    --prune) PRUNE=1; shift ;;
    --queues) QUEUES=$2; shift 2 ;;
    --args-kb) ARGS_KB=$2; shift 2 ;;
    --output-kb) OUTPUT_KB=$2; shift 2 ;;
    *) echo "instructions.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 3; }
[ -x "$CLI" ] || { echo "instructions.sh: no CLI at $CLI (cargo build --release --features cli --bin postpone)" >&2; exit 3; }
[ $((N % B)) = 0 ] || { echo "instructions.sh: --n must be a multiple of --batch" >&2; exit 2; }
[ "$W" -ge 1 ] || { echo "instructions.sh: --warm-up must be 1 or more" >&2; exit 2; }
case "$ARGS_KB$OUTPUT_KB" in *[!0-9]*) echo "instructions.sh: --args-kb and --output-kb take a whole number of KiB" >&2; exit 2 ;; esac
case "$OUTCOME" in succeeded | delete) ;; *) echo "instructions.sh: --outcome succeeded or delete" >&2; exit 2 ;; esac
[ "$OUTCOME" = succeeded ] || [ "$PRUNE" = 0 ] || { echo "instructions.sh: --prune needs --outcome succeeded" >&2; exit 2; }

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
PRUNE_STMT=$(stmt admin.rs JOBS_PRUNE)

phase_sql() {
    local p=$1 i
    DEFERRED=0
    # Single-user mode reads statements ended by a semicolon and a blank line (-j).
    printf '%s\n\n' "INSERT INTO postpone_workers (id, name, host, pid, queues, concurrency) VALUES (1, 'instructions', 'bench', 1, NULL, 4);"
    printf '%s\n\n' "CREATE FUNCTION pg_temp.ids(a bigint, b bigint) RETURNS bigint[] LANGUAGE sql AS 'SELECT array_agg(g ORDER BY g) FROM generate_series(a, b) g';"
    # Random hex digits (no compression shortens them), made in every run before what is
    # counted: a pool of W + N/B batches of each kind.
    [ "$ARGS_KB" = 0 ] || printf '%s\n\n' "CREATE TEMP TABLE pool_args (i int PRIMARY KEY, h text); INSERT INTO pool_args SELECT g, '\"' || left((SELECT string_agg(md5(g::text || '.' || k::text), '') FROM generate_series(1, 32 * $ARGS_KB) k), 1024 * $ARGS_KB - 2) || '\"' FROM generate_series(1, $(((W + N / B) * B))) g; CREATE FUNCTION pg_temp.args(a int, b int) RETURNS json[] LANGUAGE sql AS 'SELECT array_agg(h::json ORDER BY i) FROM pool_args WHERE i BETWEEN a AND b';"
    [ "$OUTPUT_KB" = 0 ] || printf '%s\n\n' "CREATE TEMP TABLE pool_out (i int PRIMARY KEY, h text); INSERT INTO pool_out SELECT g, '\"' || left((SELECT string_agg(md5(g::text || ',' || k::text), '') FROM generate_series(1, 32 * $OUTPUT_KB) k), 1024 * $OUTPUT_KB - 2) || '\"' FROM generate_series(1, $(((W + N / B) * B))) g; CREATE FUNCTION pg_temp.outs(a int, b int) RETURNS jsonb[] LANGUAGE sql AS 'SELECT array_agg(h::jsonb ORDER BY i) FROM pool_out WHERE i BETWEEN a AND b';"
    printf '%s\n\n' "CREATE FUNCTION pg_temp.queues(n int) RETURNS text[] LANGUAGE sql AS 'SELECT array_agg(q.a[1 + g % cardinality(q.a)] ORDER BY g) FROM generate_series(0, n - 1) g, (SELECT ''$QUEUE_ARRAY''::text[] AS a) q';"
    printf '%s\n\n' "PREPARE d(text[], text[], json[], int[], text[], text[], timestamptz[], bigint[], int[], jsonb[], jsonb[], timestamptz[], bigint[]) AS WITH x AS ($INSERT_BATCH) SELECT count(*) FROM x;"
    printf '%s\n\n' "PREPARE c(bigint, int, text[], text[], int, bigint, boolean) AS SELECT count(*) FROM ($CLAIM) x;"
    printf '%s\n\n' "PREPARE f(bigint[], bigint[], int[], text[], text[], jsonb[], bigint[]) AS SELECT count(*) FROM ($FINISH) x;"
    printf '%s\n\n' "PREPARE p(text[], bigint, int) AS WITH x AS ($PRUNE_STMT RETURNING 1) SELECT count(*) FROM x;"
    # Warm-up rounds in every run, first: the server's caches (catalogues, plans, PL/pgSQL
    # functions) are filled, and each prepared statement has its generic plan, before what
    # is counted apart.
    for ((i = 1; i <= W; i++)); do
        defer_stmt
        claim_stmt
        finish_stmt "$i"
        [ "$PRUNE" = 0 ] || printf '%s\n\n' "EXECUTE p(ARRAY['succeeded'], 0, $B);"
    done
    [ "$p" -ge 1 ] || return 0
    for ((i = 0; i < N / B; i++)); do
        defer_stmt
    done
    [ "$p" -ge 2 ] || return 0
    for ((i = 0; i < N / B; i++)); do
        claim_stmt
    done
    [ "$p" -ge 3 ] || return 0
    for ((i = W + 1; i <= W + N / B; i++)); do
        finish_stmt "$i"
    done
    if [ "$p" -ge 4 ]; then
        for ((i = 1; i <= N / B; i++)); do
            printf '%s\n\n' "EXECUTE p(ARRAY['succeeded'], 0, $B);"
        done
    fi
    printf '%s\n\n' "SELECT 'check', count(*) FILTER (WHERE status = 'succeeded') AS succeeded, count(*) AS jobs FROM postpone_jobs;"
}

claim_stmt() {
    printf '%s\n\n' "EXECUTE c(1, $B, $CLAIM_QUEUES, NULL, $B, 67108864, true, false);"
}

# The outcome of the I-th batch deferred (warm-up rounds included): ids (I-1)*B+1 to I*B.
finish_stmt() {
    local i=$1 outputs=NULL
    [ "$OUTPUT_KB" = 0 ] || outputs="pg_temp.outs($(((i - 1) * B + 1)), $((i * B)))"
    printf '%s\n\n' "EXECUTE f(pg_temp.ids($(((i - 1) * B + 1)), $((i * B))), array_fill(1::bigint, ARRAY[$B]), array_fill(1, ARRAY[$B]), array_fill('$OUTCOME'::text, ARRAY[$B]), NULL, $outputs, array_fill(5::bigint, ARRAY[$B]));"
}

defer_stmt() {
    local args="array_fill('{}'::json, ARRAY[$B])"
    DEFERRED=$((DEFERRED + 1))
    [ "$ARGS_KB" = 0 ] || args="pg_temp.args($(((DEFERRED - 1) * B + 1)), $((DEFERRED * B)))"
    printf '%s\n\n' "EXECUTE d($DEFER_QUEUES, array_fill('noop'::text, ARRAY[$B]), $args, array_fill(0, ARRAY[$B]), NULL, NULL, NULL, array_fill(0::bigint, ARRAY[$B]), NULL, NULL, NULL, NULL, NULL);"
}

if [ -n "$QUEUES" ]; then
    QUEUE_ARRAY="{$QUEUES}"
    CLAIM_QUEUES="'$QUEUE_ARRAY'::text[]"
    DEFER_QUEUES="pg_temp.queues($B)"
else
    QUEUE_ARRAY="{default}"
    CLAIM_QUEUES=NULL
    DEFER_QUEUES="array_fill('default'::text, ARRAY[$B])"
fi

WORK=$(mktemp -d /tmp/postpone-instructions.XXXXXX)
chmod 755 "$WORK"
[ "$(id -u)" = 0 ] && chown postgres "$WORK"
trap '"$HERE/cluster.sh" stop "$DIR" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
declare -a IR
PHASES="0 1 2 3"
[ "$PRUNE" = 0 ] || PHASES="0 1 2 3 4"
for p in $PHASES; do
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
# What phase 3 leaves: every job succeeded and kept (the warm-up's too, unless pruned), or
# none left (deleted at once); phase 4 prunes them all.
if [ "$OUTCOME" = delete ]; then
    want='succeeded = "0"'
elif [ "$PRUNE" = 1 ]; then
    want="succeeded = \"$N\""
else
    want="succeeded = \"$((N + W * B))\""
fi
if ! grep -q "$want" "$WORK/out.3" || { [ "$PRUNE" = 1 ] && ! grep -q 'jobs = "0"' "$WORK/out.4"; }; then
    echo "instructions.sh: the jobs did not end as they should ($want after phase 3; none left after a prune):" >&2
    grep -A4 '"check"' "$WORK/out.3" "$WORK/out.4" >&2 2>/dev/null || true
    exit 1
fi
per() { python3 -c "print(f'{($1 - $2) / $N:,.0f}')"; }
LAST=3
[ "$PRUNE" = 0 ] || LAST=4
echo "PostgreSQL $PGVERSION, schema $VERSION, $N no-op jobs, batches of $B, outcome $OUTCOME, $W warm-up rounds, queues ${QUEUES:-(every queue)}; instructions a job"
echo "  defer  $(per "${IR[1]}" "${IR[0]}")"
echo "  claim  $(per "${IR[2]}" "${IR[1]}")"
echo "  finish $(per "${IR[3]}" "${IR[2]}")"
[ "$PRUNE" = 0 ] || echo "  prune  $(per "${IR[4]}" "${IR[3]}")"
echo "  total  $(per "${IR[$LAST]}" "${IR[0]}")"
prune_json=""
[ "$PRUNE" = 0 ] || prune_json=", \"prune\": $(((IR[4] - IR[3]) / N))"
printf '{"what": "instructions", "n": %s, "batch": %s, "warm_up": %s, "schema": "%s", "outcome": "%s", "queues": "%s", "defer": %s, "claim": %s, "finish": %s%s}\n' \
    "$N" "$B" "$W" "$VERSION" "$OUTCOME" "$QUEUES" \
    "$(((IR[1] - IR[0]) / N))" "$(((IR[2] - IR[1]) / N))" "$(((IR[3] - IR[2]) / N))" "$prune_json"
if [ "$KEEP" = 1 ]; then
    keep=$(mktemp -d /tmp/postpone-instructions-kept.XXXXXX)
    cp "$WORK"/cg.* "$WORK"/out.* "$WORK"/phase*.sql "$keep"/
    echo "callgrind files kept in $keep (callgrind_annotate $keep/cg.3)"
fi
