#!/bin/bash
# Before/after of schema 28 (workflows) for jobs outside a workflow: release builds of the
# throughput bench at main before the workflows (59bf96e, OLD) and with them (NEW),
# alternating (ABBA within each session), three sessions.
#   OLD=path/to/throughput-old NEW=path/to/throughput-new bash run.sh > raw.txt
set -u
run() { # label binary args...
    local label=$1 bin=$2; shift 2
    echo "### $label: $*"
    "$bin" "$@" 2>&1 | grep -v '^$'
}
for s in 1 2 3; do
    echo "## session $s $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ $((s % 2)) = 1 ]; then A=OLD; B=NEW; else A=NEW; B=OLD; fi
    for x in $A $B; do
        run "$x work" "${!x}" --only work --n-work 30000 --concurrency 4 --repeats 3
    done
    for x in $B $A; do
        run "$x defer" "${!x}" --only defer --n-defer 3000 --repeats 3
    done
done
