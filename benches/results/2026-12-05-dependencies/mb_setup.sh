#!/bin/sh
# Two scratch databases: mb19 (migrations up to 19, as on main before this change) and mb23
# (with 23). Run from the repository root; then python3 mb_cpu.py 100 (uses mb23).
set -e
for d in mb19 mb23; do
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $d" -c "CREATE DATABASE $d"
done
for f in src/schema/0*.sql; do
  psql -q -1 -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d mb23 -f "$f" >/dev/null 2>&1
  case "$f" in *0023*) ;; *) psql -q -1 -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d mb19 -f "$f" >/dev/null 2>&1;; esac
done
