#!/bin/sh
cd /work/wt-fleet
for round in 1 2; do
  for b in old new2; do
    echo "=== round $round build $b $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    /tmp/fleet-$b/scale --only fleet --processes 10,30 --n-work 10000 --wakes 30 2>&1 | grep -E '"fleet_'
  done
done
