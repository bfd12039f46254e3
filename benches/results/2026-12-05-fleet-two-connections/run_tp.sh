#!/bin/sh
# Drains of 30,000 no-op jobs, old (main 1453bdb) and new (fleet) builds alternating.
cd /work/wt-fleet
for round in 1 2 3; do
  for b in old new2; do
    echo "=== round $round build $b $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    /tmp/fleet-$b/throughput --only work --n-work 30000 --concurrency 4,16 --repeats 3 2>&1 | grep -E "^\{|median|worker_c" | grep -v drain_profile
  done
done
