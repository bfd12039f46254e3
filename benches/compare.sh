#!/usr/bin/env bash
# Side-by-side throughput of postpone, graphile-worker and procrastinate, one after the other,
# on the same PostgreSQL server, with the same job counts and concurrencies.
#
#   usage: benches/compare.sh [N_WORK] [CONCURRENCY_LIST] [REPEATS]
#   e.g.   benches/compare.sh 20000 1,4,16 3
#   env:   N_DEFER (default 5000: defers one by one, and 10x that in batches of 1,000)
#          ANCHORS (default ../shared/anchors: the peers' benchmark scripts)
#          ONLY    (default postpone,procrastinate,graphile: which systems to run)
#          OUT     (default a new /tmp/postpone-compare.* folder; give an earlier one to add
#                   a system to its results: the table covers every system found there)
#          PGHOST/PGPORT/PGUSER are not read: the server is 127.0.0.1:5432, user postgres.
#
# The peers are installed on first use: procrastinate into /tmp/venv-procrastinate (needs
# python3 and PyPI), graphile-worker into /tmp/gw (needs node, npm and the npm registry).
# Without them, postpone runs alone and the script says which peer was skipped and why.
# Figures are medians of REPEATS runs, in jobs per second; ratios are postpone / peer.
set -euo pipefail

n_work=${1:-20000}
conc=${2:-1,4,16}
repeats=${3:-3}
n_defer=${N_DEFER:-5000}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
anchors=${ANCHORS:-$(cd "$root/.." && pwd)/shared/anchors}
only=${ONLY:-postpone,procrastinate,graphile}
out=${OUT:-$(mktemp -d /tmp/postpone-compare.XXXXXX)}
mkdir -p "$out"
wants() { [[ ",$only," == *",$1,"* ]]; }
pg() { psql -h 127.0.0.1 -U postgres -XAtq "$@"; }
mkdb() {
    pg -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$1'" | grep -q 1 ||
        pg -d postgres -c "CREATE DATABASE $1"
}

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(pg -d postgres -c 'SHOW server_version') on 127.0.0.1"
echo "== N_WORK=$n_work N_DEFER=$n_defer CONCURRENCY=$conc REPEATS=$repeats; raw output in $out"

if wants postpone; then
    echo "== postpone"
    (cd "$root" && cargo bench --quiet --bench throughput -- \
        --n-work "$n_work" --n-defer "$n_defer" --concurrency "$conc" --repeats "$repeats" \
        --only defer,work) | tee "$out/postpone.txt"
fi

# A peer whose benchmark fails part-way keeps the figures it printed before failing.
if ! wants procrastinate; then
    :
elif ! command -v python3 >/dev/null; then
    echo "== procrastinate skipped: python3 is not installed"
elif [ ! -f "$anchors/procrastinate_bench.py" ]; then
    echo "== procrastinate skipped: $anchors/procrastinate_bench.py not found (set ANCHORS)"
else
    if [ ! -x /tmp/venv-procrastinate/bin/python ]; then
        echo "== installing procrastinate into /tmp/venv-procrastinate"
        python3 -m venv /tmp/venv-procrastinate
        /tmp/venv-procrastinate/bin/pip install -q procrastinate 'psycopg[binary]'
    fi
    mkdb anchor_procrastinate
    echo "== procrastinate"
    /tmp/venv-procrastinate/bin/python "$anchors/procrastinate_bench.py" \
        --dsn 'host=127.0.0.1 dbname=anchor_procrastinate user=postgres' \
        --n-defer "$n_defer" --n-work "$n_work" --concurrency "$conc" --repeats "$repeats" 2>&1 |
        grep -v 'instantiated in the main' | tee "$out/procrastinate.txt" ||
        echo "== procrastinate's benchmark failed; the figures it printed are kept"
fi

if ! wants graphile; then
    :
elif ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "== graphile-worker skipped: node and npm are not installed"
elif [ ! -f "$anchors/graphile_bench.mjs" ]; then
    echo "== graphile-worker skipped: $anchors/graphile_bench.mjs not found (set ANCHORS)"
else
    if [ ! -d /tmp/gw/node_modules/graphile-worker ]; then
        echo "== installing graphile-worker into /tmp/gw"
        mkdir -p /tmp/gw
        (cd /tmp/gw && npm init -y >/dev/null && npm install -s graphile-worker pg >/dev/null)
    fi
    mkdb anchor_graphile
    cp "$anchors/graphile_bench.mjs" /tmp/gw/
    echo "== graphile-worker"
    (cd /tmp/gw && DATABASE_URL=postgres://postgres@127.0.0.1:5432/anchor_graphile \
        node graphile_bench.mjs --n-defer "$n_defer" --n-work "$n_work" \
        --concurrency "$conc" --repeats "$repeats") 2>&1 | tee "$out/graphile.txt" ||
        echo "== graphile-worker's benchmark failed; the figures it printed are kept"
fi

peers=()
for p in procrastinate graphile; do
    [ -s "$out/$p.txt" ] && peers+=("$p")
done

# Medians per figure and system, from the JSON lines each benchmark printed.
echo
echo "== results (jobs/s, median of $repeats; ratio = postpone / peer)"
awk -v peers="${peers[*]:-}" '
    function median(key,   n, i, j, t, v) {
        n = cnt[key]
        for (i = 1; i <= n; i++) v[i] = val[key, i]
        for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
        if (n == 0) return ""
        return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    FNR == 1 { sys = FILENAME; sub(/.*\//, "", sys); sub(/\.txt$/, "", sys) }
    /^\{"what"/ && /jobs_per_s/ {
        what = $0; sub(/.*"what": *"/, "", what); sub(/".*/, "", what)
        sub(/^defer_bulk/, "defer_batch", what)
        rate = $0; sub(/.*"jobs_per_s": */, "", rate); sub(/[,}].*/, "", rate)
        key = sys SUBSEP what
        cnt[key]++; val[key, cnt[key]] = rate + 0
        if (!(what in seen)) { seen[what] = 1; order[++nw] = what }
    }
    END {
        np = split(peers, p, " ")
        printf "%-18s %12s", "figure", "postpone"
        for (i = 1; i <= np; i++) printf " %14s %8s", p[i], "ratio"
        printf "\n"
        for (k = 1; k <= nw; k++) {
            w = order[k]
            mine = median("postpone" SUBSEP w)
            printf "%-18s %12s", w, (mine == "" ? "-" : sprintf("%.0f", mine))
            for (i = 1; i <= np; i++) {
                theirs = median(p[i] SUBSEP w)
                ratio = (mine != "" && theirs != "" && theirs > 0) ? sprintf("%.1fx", mine / theirs) : "-"
                printf " %14s %8s", (theirs == "" ? "-" : sprintf("%.0f", theirs)), ratio
            }
            printf "\n"
        }
    }' "$out"/*.txt
