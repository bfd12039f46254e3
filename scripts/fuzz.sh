#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo fuzz, libFuzzer) for a fixed budget each, then
# prints, per target, the inputs tried and the crashes found. Exits 1 if any target crashed.
#
#   scripts/fuzz.sh              # 60 s per target
#   scripts/fuzz.sh 300          # 5 minutes per target
#   scripts/fuzz.sh 30 cron      # some targets only
#
# The machine's stable toolchain is enough: cargo-fuzz's sanitizer flags are nightly-only,
# so the script sets RUSTC_BOOTSTRAP=1 (on a nightly toolchain it changes nothing). It
# installs cargo-fuzz from crates.io when it is missing. Seeds are in fuzz/seeds/TARGET
# (committed); what the fuzzer learns goes to fuzz/corpus/TARGET and crashes to
# fuzz/artifacts/TARGET (both ignored by git). A crash is replayed with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -O TARGET fuzz/artifacts/TARGET/crash-...   (in fuzz/)
# and belongs, once fixed, in tests/fuzz_props.rs's regressions.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

budget="${1:-60}"
shift || true
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^postpone-fuzz$')
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1

echo "== building the targets"
cargo fuzz build -O

summary=()
crashed=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
    before=$(find "artifacts/$t" -type f | wc -l)
    log="$(mktemp)"
    echo "== $t: ${budget}s"
    # -fork would survive crashes; one process keeps the counts simple and the budget exact.
    set +e
    cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$budget" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
        >"$log" 2>&1
    status=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    after=$(find "artifacts/$t" -type f | wc -l)
    new=$((after - before))
    if [ "$status" -ne 0 ] || [ "$new" -gt 0 ]; then
        crashed=1
        grep -E "panicked at|^SUMMARY|Test unit written" "$log" | head -5 || true
    fi
    summary+=("$(printf '%-16s %14s %8s' "$t" "${execs:-?}" "$new")")
    rm -f "$log"
done

echo
printf '%-16s %14s %8s\n' TARGET INPUTS_TRIED CRASHES
printf '%s\n' "${summary[@]}"
echo "(budget ${budget}s per target)"
exit "$crashed"
