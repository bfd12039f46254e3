#!/bin/bash
# Alternates the before and after builds of the throughput bench.
for i in $(seq 1 ${RUNS:-6}); do
  for b in before after; do
    echo "=== $b $i $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    ./$b --only roundtrip,defer --repeats 1 --n-roundtrip 5000 --n-defer 1000 2>&1 | grep '^{'
  done
done
