#!/usr/bin/env python3
"""µs of server CPU per job by statement and kind of work, from folded stacks (fold.py).

Usage: classify.py JOBS HZ FOLDED[:insert]...  (HZ: perf's -F; :insert marks a defer's backend)
Each sample goes to the first kind (in KINDS order) one of whose functions is on its stack;
its statement is the claim (under ExecSetParamPlan: the claim's CTE), a commit, the outcome
(other function calls), or the defer (a backend marked :insert)."""
import sys, collections
jobs, hz = int(sys.argv[1]), float(sys.argv[2])
KINDS = [
    ("statement triggers (stats, done)", ["AfterTriggerEndQuery"]),
    ("transition tables, row trigger WHEN", ["ExecARUpdateTriggers", "ExecARInsertTriggers", "ExecARDeleteTriggers"]),
    ("index inserts: bottom-up deletion", ["_bt_bottomupdel_pass"]),
    ("index inserts (btree)", ["btinsert"]),
    ("index inserts: partial-index predicates", ["ExecInsertIndexTuples"]),
    ("heap: new row version (+WAL)", ["heap_update", "heap_insert", "heap_delete"]),
    ("row locks (FOR UPDATE SKIP LOCKED)", ["heap_lock_tuple", "heapam_tuple_lock"]),
    ("CHECK constraints", ["ExecConstraints"]),
    ("generated column (args_bytes)", ["ExecComputeStoredGenerated"]),
    ("index scans (walk, lookups by id)", ["index_getnext_slot", "index_getnext_tid", "btgettuple", "index_fetch_heap"]),
    ("sequence (nextval)", ["nextval_internal"]),
    ("hash joins / aggregates", ["MultiExecHash", "ExecScanHashBucket", "ExecHashJoin", "agg_fill_hash_table", "lookup_hash_entries"]),
    ("function results, arrays, unnest", ["tuplestore_puttupleslot", "tuplestore_putvalues", "tuplestore_gettupleslot", "array_unnest", "ExecMakeTableFunctionResult_self", "array_agg_transfn", "makeMdArrayResult", "construct_md_array"]),
    ("planning", ["pg_plan_query", "GetCachedPlan", "SPI_prepare_extended", "standard_planner"]),
    ("protocol: parameters in, rows out", ["OidReceiveFunctionCall", "SendFunctionCall", "printtup", "pq_getmessage", "__send", "secure_write", "pq_getbyte", "internal_flush"]),
    ("executor start/end, plpgsql, other", []),
]
def stmt_of(st, pid_role):
    if "CommitTransactionCommand" in st: return "commit"
    if "ExecSetParamPlan" in st: return "claim"
    if "fmgr_security_definer" in st:
        return "outcome" if pid_role != "insert" else "defer"
    if pid_role == "insert": return "defer"
    return "other"
tab = collections.defaultdict(collections.Counter)
for arg in sys.argv[3:]:
    path, role = (arg.split(":") + ["drain"])[:2]
    for l in open(path):
        c, s = l.rstrip("\n").split(" ", 1); st = s.split(";"); c = int(c)
        sm = stmt_of(st, role)
        kind = next((k for k, ms in KINDS if any(m in st for m in ms)), KINDS[-1][0])
        tab[sm][kind] += c
us = lambda n: n / hz * 1e6 / jobs
stmts = sorted(tab, key=lambda s: -sum(tab[s].values()))
print(f"{'kind':<42}" + "".join(f"{s:>9}" for s in stmts) + f"{'all':>9}")
for k, _ in KINDS:
    row = [us(tab[s][k]) for s in stmts]
    print(f"{k:<42}" + "".join(f"{v:9.2f}" for v in row) + f"{sum(row):9.2f}")
print(f"{'total':<42}" + "".join(f"{us(sum(tab[s].values())):9.2f}" for s in stmts) + f"{us(sum(sum(t.values()) for t in tab.values())):9.2f}")
