// graphile-worker's side of benches/compare.sh: defer rate, drain rate, steady state and
// defer-to-start latency, printed as JSON lines (the same figure names as postpone's bench)
// and a median summary.
//
// Run from a folder where graphile-worker and pg are installed (ESM resolves imports next to
// the script, so compare.sh copies this file into /tmp/gw):
//   node graphile_bench.mjs [--n-defer 5000] [--n-work 20000] [--concurrency 1,4,16]
//        [--repeats 3] [--skip-defer] [--skip-work] [--local-queue [--local-queue-size 200]]
//        [--steady-seconds 30 [--interval 10] [--pending 20000]] [--latency 300]
//        [--args-kb N] [--cost C]
//   env DATABASE_URL (default postgres://postgres@127.0.0.1:5432/anchor_graphile)
//
// Figures:
// - defer_one_by_one: await addJob one after the other; defer_batch1000: addJobs of 1,000.
// - worker_cC (drain): empty the table, add --n-work no-op jobs in batches, start run()
//   (concurrency C, maxPoolSize C+4, pollInterval 1 s), wall time from run() to the n-th
//   "job:success"; then check that the table is empty (succeeded jobs are deleted).
// - steady_cC: --pending jobs added, then run() starts and a producer adds batches of 1,000
//   whenever fewer than --pending are waiting, for --steady-seconds; one line per --interval
//   (jobs/s of the interval) and an overall line.
// - latency_defer_to_start_ms: an idle run() (concurrency 4, LISTEN/NOTIFY as by default);
//   --latency jobs added one at a time, 5 ms apart, each carrying the time it was added;
//   p50/p90/p99/p99.9/max of (task start - add).
// - --args-kb N: every job's payload is {"pad": "<N KiB of hex digits>"} (text pglz cannot
//   compress, as postpone's bench's --args-kb), and the figures' names end in _args_N_KiB.
//   graphile-worker stores no output (a finished job is deleted), so there is no --output-kb.
// - --cost C (alone: no other figure): the per-job costs beside the Rust peers' harness
//   (benches/compare.sh, COST_C): --n-work jobs added in batches of 1,000, then drained at
//   concurrency C; for each part (cost_defer_batch1000, cost_drain) and both (cost_total), the
//   server's WAL bytes (pg_current_wal_lsn before and after, with the LSNs) and this
//   process's CPU time (process.cpuUsage), per job, in the harness's field names.
// --local-queue: graphile-worker at its best for throughput, preset.worker.localQueue.size
// (--local-queue-size, default 200) and completeJobBatchDelay = 0 (batched completion).
import { run, makeWorkerUtils, runMigrations, Logger } from "graphile-worker";
import pg from "pg";

const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : dflt;
};
const connectionString =
  process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/anchor_graphile";
const nDefer = +arg("n-defer", 5000);
const nWork = +arg("n-work", 20000);
const concs = arg("concurrency", "1,4,16").split(",").map(Number);
const repeats = +arg("repeats", 3);
const skipDefer = argv.includes("--skip-defer");
const skipWork = argv.includes("--skip-work");
const localQueue = argv.includes("--local-queue");
const localQueueSize = +arg("local-queue-size", 200);
const steadySeconds = +arg("steady-seconds", 0);
const interval = +arg("interval", 10);
const pending = +arg("pending", 20000);
const nLatency = +arg("latency", 0);
const argsKb = +arg("args-kb", 0);
const costC = +arg("cost", 0);
const suffix = argsKb > 0 ? `_args_${argsKb}_KiB` : "";
// N KiB of hex digits from a xorshift stream: nothing pglz can shorten.
const pad = (bytes) => {
  let x = 0x9e3779b9 | 0;
  const hex = "0123456789abcdef";
  const out = new Array(bytes);
  for (let i = 0; i < bytes; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = hex[(x >>> 28) & 15];
  }
  return out.join("");
};
const payload = argsKb > 0 ? { pad: pad(argsKb * 1024) } : {};

const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[gw ${level}] ${message}`);
});
const pool = new pg.Pool({ connectionString, max: 2 });
const q = async (sql) => (await pool.query(sql)).rows;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const clear = async () => {
  await q("TRUNCATE graphile_worker._private_jobs CASCADE");
  await q("DELETE FROM graphile_worker._private_job_queues");
  await q("VACUUM ANALYZE graphile_worker._private_jobs");
};
const results = {};
const emit = (rec) => console.log(JSON.stringify(rec));
const record = (what, rep, n, s) => {
  const rate = n / s;
  (results[what] ??= []).push(rate);
  emit({ what, rep, n, s: +s.toFixed(3), jobs_per_s: +rate.toFixed(1) });
};
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const bulkAdd = async (utils, n) => {
  for (let left = n; left > 0; left -= 1000) {
    const k = Math.min(1000, left);
    await utils.addJobs(Array.from({ length: k }, () => ({ identifier: "noop", payload })));
  }
};
const runnerOpts = (c, taskList) => ({
  connectionString,
  concurrency: c,
  maxPoolSize: c + 4,
  noHandleSignals: true,
  pollInterval: 1000,
  logger,
  taskList,
  ...(localQueue
    ? { preset: { worker: { localQueue: { size: localQueueSize }, completeJobBatchDelay: 0 } } }
    : {}),
});

await runMigrations({ connectionString, logger });
const utils = await makeWorkerUtils({ connectionString, logger });
const version = (await import("graphile-worker/package.json", { with: { type: "json" } })).default.version;
emit({ graphile_worker: version, node: process.version, local_queue: localQueue ? localQueueSize : 0 });

// The drain of one filled queue at concurrency c: run() until the n-th success, then the
// table checked empty (a success event can fire just before its completion commits).
const drain = async (c, n) => {
  let done = 0;
  let resolveDone;
  const allDone = new Promise((res) => (resolveDone = res));
  const t0 = performance.now();
  const runner = await run(runnerOpts(c, { noop: async () => {} }));
  runner.events.on("job:success", () => {
    if (++done === n) resolveDone();
  });
  await allDone;
  const s = (performance.now() - t0) / 1000;
  let left = -1;
  for (let i = 0; i < 50 && left !== 0; i++) {
    left = +(await q("SELECT count(*) AS n FROM graphile_worker._private_jobs"))[0].n;
    if (left !== 0) await sleep(100);
  }
  await runner.stop();
  if (left !== 0) throw new Error(`${left} jobs left in the table after the drain at concurrency ${c}`);
  return s;
};

if (costC > 0) {
  const mark = async () => {
    const [r] = await q("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS b, pg_current_wal_lsn()::text AS l");
    const u = process.cpuUsage();
    return { t: performance.now(), wal: +r.b, lsn: r.l, cpu: (u.user + u.system) / 1e6 };
  };
  const costLine = (what, a, b, n) => {
    const s = (b.t - a.t) / 1000;
    emit({
      system: "graphile-worker", what, n, c: costC, s: +s.toFixed(3), jobs_per_s: Math.round(n / s),
      wal_bytes: b.wal - a.wal, wal_bytes_per_job: Math.round((b.wal - a.wal) / n),
      client_cpu_s: +(b.cpu - a.cpu).toFixed(3), client_cpu_us_per_job: +(((b.cpu - a.cpu) * 1e6) / n).toFixed(1),
      lsn0: a.lsn, lsn1: b.lsn, config: localQueue ? `local queue ${localQueueSize}, completeJobBatchDelay 0` : "defaults",
    });
  };
  await clear();
  const m0 = await mark();
  await bulkAdd(utils, nWork);
  const m1 = await mark();
  await drain(costC, nWork);
  const m2 = await mark();
  costLine("cost_defer_batch1000", m0, m1, nWork);
  costLine("cost_drain", m1, m2, nWork);
  costLine("cost_total", m0, m2, nWork);
  await utils.release();
  await pool.end();
  process.exit(0);
}

if (!skipDefer) {
  for (let r = 0; r < repeats; r++) {
    await clear();
    let t0 = performance.now();
    for (let i = 0; i < nDefer; i++) await utils.addJob("noop", payload);
    record("defer_one_by_one", r, nDefer, (performance.now() - t0) / 1000);
    await clear();
    t0 = performance.now();
    await bulkAdd(utils, nDefer * 10);
    record("defer_batch1000", r, nDefer * 10, (performance.now() - t0) / 1000);
  }
}

for (const c of skipWork ? [] : concs) {
  for (let r = 0; r < repeats; r++) {
    await clear();
    await bulkAdd(utils, nWork);
    let done = 0;
    let resolveDone;
    const allDone = new Promise((res) => (resolveDone = res));
    const t0 = performance.now();
    const runner = await run(runnerOpts(c, { noop: async () => {} }));
    runner.events.on("job:success", () => {
      if (++done === nWork) resolveDone();
    });
    await allDone;
    const s = (performance.now() - t0) / 1000;
    await runner.stop();
    // A success event can fire just before its completion commits: give the last one 5 s.
    let left = -1;
    for (let i = 0; i < 50 && left !== 0; i++) {
      left = +(await q("SELECT count(*) AS n FROM graphile_worker._private_jobs"))[0].n;
      if (left !== 0) await sleep(100);
    }
    if (left !== 0) throw new Error(`${left} jobs left in the table after the drain at concurrency ${c}`);
    record(`worker_c${c}${suffix}`, r, nWork, s);
  }
}

for (const c of steadySeconds > 0 ? concs : []) {
  await clear();
  await bulkAdd(utils, pending);
  let done = 0;
  let deferred = pending;
  let stop = false;
  const runner = await run(runnerOpts(c, { noop: async () => {} }));
  runner.events.on("job:success", () => void done++);
  const producer = (async () => {
    while (!stop) {
      if (deferred - done + 1000 <= pending) {
        await bulkAdd(utils, 1000);
        deferred += 1000;
      } else await sleep(2);
    }
  })();
  const t0 = performance.now();
  let last = [t0, 0];
  for (let k = 1; k <= Math.ceil(steadySeconds / interval); k++) {
    while (performance.now() < t0 + k * interval * 1000) await sleep(Math.max(1, t0 + k * interval * 1000 - performance.now()));
    const now = performance.now();
    const n = done;
    const rate = (n - last[1]) / ((now - last[0]) / 1000);
    emit({ what: `steady_c${c}${suffix}`, t_s: Math.round((now - t0) / 1000), jobs_per_s: +rate.toFixed(1), waiting: deferred - n });
    last = [now, n];
  }
  stop = true;
  await producer;
  await runner.stop();
  const s = (last[0] - t0) / 1000;
  (results[`steady_c${c}${suffix}`] ??= []).push(last[1] / s);
  emit({ what: `steady_c${c}${suffix}_overall`, n: last[1], s: +s.toFixed(3), jobs_per_s: +(last[1] / s).toFixed(1) });
}

if (nLatency > 0) {
  await clear();
  // One process, one clock: the job carries performance.now() from the moment it was added.
  let started = null;
  const runner = await run(
    runnerOpts(4, { ping: async (payload) => started?.(performance.now() - payload.sent) }),
  );
  await sleep(500);
  const lat = [];
  for (let i = 0; i < nLatency; i++) {
    const got = new Promise((res) => (started = res));
    await utils.addJob("ping", { sent: performance.now() });
    let timer;
    const timeout = new Promise((res) => (timer = setTimeout(() => res(-1), 20000)));
    const ms = await Promise.race([got, timeout]);
    clearTimeout(timer);
    if (ms < 0) throw new Error(`latency job ${i} did not start within 20 s`);
    lat.push(ms);
    await sleep(5);
  }
  await runner.stop();
  lat.sort((a, b) => a - b);
  const pct = (p) => +lat[Math.round((lat.length - 1) * p)].toFixed(2);
  emit({ what: "latency_defer_to_start_ms", n: lat.length, p50: pct(0.5), p90: pct(0.9), p99: pct(0.99), p999: pct(0.999), max: pct(1) });
}

console.log("SUMMARY (median of repeats, jobs/s):");
for (const [k, v] of Object.entries(results))
  console.log(`  ${k.padEnd(26)} median=${median(v).toFixed(1).padStart(9)}  runs=${JSON.stringify(v.map((x) => +x.toFixed(1)))}`);
await utils.release();
await pool.end();
