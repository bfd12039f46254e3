#!/bin/sh
# Alternates the throughput bench of main (base) and of the deps branch: drains, then steady states.
BASE=/work/wt-deps-base/target/release/deps/throughput-2ede2b87f9b38aaf
DEPS=/work/wt-deps2/target/release/deps/throughput-2ede2b87f9b38aaf
OUT=/tmp/bench_alt
mkdir -p $OUT
for i in 1 2 3; do
  if [ $((i % 2)) -eq 1 ]; then order="base deps"; else order="deps base"; fi
  for b in $order; do
    if [ $b = base ]; then bin=$BASE; dir=/work/wt-deps-base; else bin=$DEPS; dir=/work/wt-deps2; fi
    echo "== $b work run $i $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/log
    (cd $dir && $bin --only work --n-work 20000 --concurrency 4 --repeats 3) > $OUT/$b-work-$i.txt 2>&1
    grep "SUMMARY" -A3 $OUT/$b-work-$i.txt >> $OUT/log
  done
  for b in $order; do
    if [ $b = base ]; then bin=$BASE; dir=/work/wt-deps-base; else bin=$DEPS; dir=/work/wt-deps2; fi
    echo "== $b steady run $i $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/log
    (cd $dir && $bin --only steady --seconds 40 --interval 10 --concurrency 1) > $OUT/$b-steady-$i.txt 2>&1
    grep "SUMMARY" -A6 $OUT/$b-steady-$i.txt >> $OUT/log
  done
done
echo finished >> $OUT/log
