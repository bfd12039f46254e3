"""procrastinate's side of benches/compare.sh: defer rate, drain rate, steady state and
defer-to-start latency, printed as JSON lines (the same figure names as postpone's bench) and a
median summary.

    /tmp/venv-procrastinate/bin/python procrastinate_bench.py \
        --dsn 'host=127.0.0.1 dbname=anchor_procrastinate user=postgres' \
        [--n-defer 5000] [--n-work 10000] [--concurrency 1,4,16] [--repeats 3] [--skip-defer]
        [--skip-work] [--steady-seconds 30 [--interval 10] [--pending 20000]] [--latency 300]

Figures (the schema `public` of the database is dropped and procrastinate's schema applied):
- defer_one_by_one: await task.defer_async() one after the other; defer_batch1000:
  task.batch_defer_async() of 1,000 jobs.
- worker_cC (drain): --n-work jobs deferred, then run_worker_async(concurrency=C, wait=False)
  until it returns (queue empty, running jobs done); checks every job succeeded.
- steady_cC: --pending jobs deferred, then a worker (concurrency C, wait=True) runs while a
  producer defers batches of 1,000 whenever fewer than --pending are waiting, for
  --steady-seconds; one line per --interval (jobs/s of the interval) and an overall line.
- latency_defer_to_start_ms: an idle worker (concurrency 4, LISTEN/NOTIFY on, as by default);
  --latency jobs deferred one at a time, 5 ms apart, each carrying the time it was deferred;
  p50/p90/p99/p99.9/max of (task start - defer).
The connection pool has C+4 connections, so that the pool is not the bottleneck.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import math
import statistics
import time
from importlib.metadata import version

import procrastinate
import psycopg

# Jobs finished by the no-op task, and the callback the latency task reports to.
DONE = [0]
STARTED: list = [None]


def make_app(dsn: str, pool_size: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(
        conninfo=dsn, min_size=pool_size, max_size=pool_size
    )
    app = procrastinate.App(connector=connector)

    @app.task(name="noop", queue="default")
    async def noop(**kwargs):
        DONE[0] += 1

    @app.task(name="ping", queue="default")
    async def ping(sent: float):
        if STARTED[0] is not None:
            STARTED[0](time.perf_counter() - sent)

    app.noop = noop  # type: ignore[attr-defined]
    app.ping = ping  # type: ignore[attr-defined]
    return app


def reset_schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")


def truncate(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers "
            "RESTART IDENTITY CASCADE"
        )
        conn.execute("VACUUM ANALYZE procrastinate_jobs")


def count(dsn: str, status: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = %s", (status,)
        ).fetchone()[0]


async def batch_defer(app, n: int, batch: int = 1000) -> None:
    left = n
    while left > 0:
        k = min(batch, left)
        await app.noop.batch_defer_async(*([{}] * k))
        left -= k


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


async def stop_worker(task: asyncio.Task) -> None:
    """Cancelling the worker's task makes procrastinate stop it (running jobs finish first)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=30)


async def steady(args, c: int, results: dict) -> None:
    truncate(args.dsn)
    app = make_app(args.dsn, c + 4)
    async with app.open_async():
        await batch_defer(app, args.pending)
        DONE[0] = 0
        deferred = args.pending
        stop = False

        async def producer():
            nonlocal deferred
            while not stop:
                if deferred - DONE[0] + 1000 <= args.pending:
                    await batch_defer(app, 1000)
                    deferred += 1000
                else:
                    await asyncio.sleep(0.002)

        worker = asyncio.create_task(
            app.run_worker_async(
                concurrency=c, wait=True, install_signal_handlers=False, listen_notify=False
            )
        )
        prod = asyncio.create_task(producer())
        t0 = time.perf_counter()
        last = (t0, 0)
        for k in range(1, math.ceil(args.steady_seconds / args.interval) + 1):
            while time.perf_counter() < t0 + k * args.interval:
                await asyncio.sleep(max(0.001, t0 + k * args.interval - time.perf_counter()))
            now, n = time.perf_counter(), DONE[0]
            rate = (n - last[1]) / (now - last[0])
            emit({"what": f"steady_c{c}", "t_s": round(now - t0), "jobs_per_s": round(rate, 1),
                  "waiting": deferred - n})
            last = (now, n)
        stop = True
        await prod
        await stop_worker(worker)
    s = last[0] - t0
    results.setdefault(f"steady_c{c}", []).append(last[1] / s)
    emit({"what": f"steady_c{c}_overall", "n": last[1], "s": round(s, 3),
          "jobs_per_s": round(last[1] / s, 1)})


async def latency(args) -> None:
    truncate(args.dsn)
    app = make_app(args.dsn, 8)
    loop = asyncio.get_running_loop()
    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=4, wait=True, install_signal_handlers=False)
        )
        await asyncio.sleep(0.5)
        lat = []
        for i in range(args.latency):
            fut = loop.create_future()
            STARTED[0] = lambda d, fut=fut: fut.done() or fut.set_result(d)
            await app.ping.defer_async(sent=time.perf_counter())
            try:
                lat.append(await asyncio.wait_for(fut, timeout=20) * 1000)
            except TimeoutError:
                raise SystemExit(f"latency job {i} did not start within 20 s") from None
            await asyncio.sleep(0.005)
        await stop_worker(worker)
    lat.sort()

    def pct(p):
        return round(lat[round((len(lat) - 1) * p)], 2)

    emit({"what": "latency_defer_to_start_ms", "n": len(lat), "p50": pct(0.5), "p90": pct(0.9),
          "p99": pct(0.99), "p999": pct(0.999), "max": pct(1)})


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="host=127.0.0.1 dbname=anchor_procrastinate user=postgres")
    ap.add_argument("--n-defer", type=int, default=5000)
    ap.add_argument("--n-work", type=int, default=10000)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-defer", action="store_true")
    ap.add_argument("--skip-work", action="store_true")
    ap.add_argument("--steady-seconds", type=float, default=0)
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--pending", type=int, default=20000)
    ap.add_argument("--latency", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    concs = [int(c) for c in args.concurrency.split(",")]
    emit({"procrastinate": version("procrastinate"), "psycopg": version("psycopg")})

    reset_schema(args.dsn)
    results: dict[str, list[float]] = {}

    app = make_app(args.dsn, 4)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for r in range(0 if args.skip_defer else args.repeats):
            truncate(args.dsn)
            t0 = time.perf_counter()
            for _ in range(args.n_defer):
                await app.noop.defer_async()
            dt = time.perf_counter() - t0
            rate = args.n_defer / dt
            results.setdefault("defer_one_by_one", []).append(rate)
            emit({"what": "defer_one_by_one", "rep": r, "n": args.n_defer, "s": round(dt, 3),
                  "jobs_per_s": round(rate, 1)})

            truncate(args.dsn)
            t0 = time.perf_counter()
            await batch_defer(app, args.n_defer * 10)
            dt = time.perf_counter() - t0
            rate = args.n_defer * 10 / dt
            results.setdefault("defer_batch1000", []).append(rate)
            emit({"what": "defer_batch1000", "rep": r, "n": args.n_defer * 10,
                  "s": round(dt, 3), "jobs_per_s": round(rate, 1)})

    for c in [] if args.skip_work else concs:
        for r in range(args.repeats):
            truncate(args.dsn)
            app = make_app(args.dsn, c + 4)
            async with app.open_async():
                await batch_defer(app, args.n_work)
                assert count(args.dsn, "todo") == args.n_work
                t0 = time.perf_counter()
                await app.run_worker_async(
                    concurrency=c, wait=False, install_signal_handlers=False,
                    listen_notify=False,
                )
                dt = time.perf_counter() - t0
            done = count(args.dsn, "succeeded")
            rate = done / dt
            key = f"worker_c{c}"
            results.setdefault(key, []).append(rate)
            emit({"what": key, "rep": r, "n": args.n_work, "succeeded": done, "s": round(dt, 3),
                  "jobs_per_s": round(rate, 1)})
            assert done == args.n_work, f"only {done}/{args.n_work} succeeded"

    for c in concs if args.steady_seconds > 0 else []:
        await steady(args, c, results)

    if args.latency > 0:
        await latency(args)

    print("SUMMARY (median of repeats, jobs/s):")
    for k, v in results.items():
        print(f"  {k:24s} median={statistics.median(v):9.1f}  runs={[round(x, 1) for x in v]}")


if __name__ == "__main__":
    asyncio.run(main())
