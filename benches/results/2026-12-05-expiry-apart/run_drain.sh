#!/usr/bin/env bash
# Drains of 30,000 no-op jobs at concurrency 4, old (3682677) and new (this branch) release
# builds alternating (ABBAAB).
out=/work/wt-claim/benches/results/2026-12-05-expiry-apart/drain.txt
: > $out
for b in old new new old old new; do
  dir=$([ $b = old ] && echo /work/wt-claim-old || echo /work/wt-claim)
  echo "== $b" >> $out
  (cd $dir && nice /tmp/claim-bins/$b-throughput --bench --only work --n-work 30000 --concurrency 4 --repeats 3 >> $out 2>&1)
done
echo DONE >> $out
