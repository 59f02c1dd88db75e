"""Where a gnl SQLite drain spends its time: Python side vs waiting on the native core.

Not a bench (no anchor, no bar): a diagnostic for ``bench_drain_sqlite.py``. It seeds N no-op
jobs (over ``ORGS`` organizations, round-robin; default 1: one lane) and drains them with one
worker at concurrency C, in one of these modes:

* ``split`` (default): times every ``await`` of the native claim (by wrapping the worker's
  private native handle) and reports the share of the drain spent waiting on it, then the
  round trip of a few native calls (``storage.now_ms()``: the asyncio bridge alone, no SQL;
  ``get_job``: one pooled SELECT; ``NativeWorker.claim(1)``) next to the same SELECT and a
  one-row write transaction through Python's ``sqlite3``.
* ``cprofile``: the drain under ``cProfile`` (time in ``select.epoll.poll`` is the loop idle,
  i.e. waiting on native futures); top functions by own time.
* ``pyinstrument``: the drain under pyinstrument (``pip install pyinstrument``), lower
  overhead than cProfile.

* ``drain``: the drain alone (for an outside profiler: ``perf record -g -- ...``), with the
  CPU time it took per job (every thread of the process: Python, tokio, the checkpointer),
  a figure that a loaded machine skews less than the wall time.

    N=10000 C=1 .venv/bin/python benches/profile_drain_sqlite.py split
    N=10000 C=16 ORGS=50 perf record -g -o /tmp/p.data .venv/bin/python \
        benches/profile_drain_sqlite.py drain
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as c
import gnl

N = c.env_int("N", 10_000)
C = c.env_int("C", 1)
ORGS = c.env_int("ORGS", 1)


async def noop(payload: Any, ctx: gnl.JobContext) -> None:
    return None


async def seed(path: Path) -> None:
    jobs = [
        {
            "type": "noop",
            "payload": {"i": i},
            "options": {"id": f"job:{i}", "org_id": f"org{i % ORGS}" if ORGS > 1 else None},
        }
        for i in range(N)
    ]
    async with await gnl.connect(c.sqlite_url(path)) as storage:
        await gnl.enqueue_many(storage.work, jobs)


class TimedClaims:
    """Wraps a NativeWorker: counts and times the awaits of ``claim`` and the calls of
    ``claim_now`` (a claim run at once on the worker's thread; None: it could not)."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.calls = 0
        self.seconds = 0.0
        self.now_calls = 0
        self.now_seconds = 0.0

    def claim_now(self, n: int) -> Any:
        t0 = time.perf_counter()
        jobs = self._native.claim_now(n)
        self.now_seconds += time.perf_counter() - t0
        self.now_calls += jobs is not None
        return jobs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    async def claim(self, n: int, carry: bool = True, per_org: int = 0) -> Any:
        t0 = time.perf_counter()
        jobs = await self._native.claim(n, carry, per_org)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return jobs


async def drain(path: Path, timed: bool) -> tuple[float, TimedClaims | None, float]:
    """Seconds to drain, the claim timer (``timed``) and the CPU seconds of the drain."""
    storage = await gnl.connect(c.sqlite_url(path))
    worker = gnl.create_worker(storage, {"noop": noop}, concurrency=C)
    wrap = None
    if timed:
        # Private: the only way to time the native claim without touching gnl's code.
        wrap = TimedClaims(worker._ensure_native())
        worker._native = wrap  # type: ignore[assignment]
    c0, t0 = time.process_time(), time.perf_counter()
    res = await worker.drain()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    await worker.stop()
    await storage.close()
    assert res.processed == N, res
    return dt, wrap, cpu


async def round_trips(path: Path) -> list[str]:
    out = []
    storage = await gnl.connect(c.sqlite_url(path))
    await gnl.enqueue_many(storage.work, [{"type": "x", "payload": None, "options": {"id": "j"}}])
    worker = gnl.create_worker(storage, {}, concurrency=1)
    native = worker._ensure_native()

    async def per_call(name: str, fn: Callable[[], Awaitable[Any]], n: int = 2000) -> None:
        for _ in range(100):
            await fn()
        q0 = storage.query_count
        t0 = time.perf_counter()
        for _ in range(n):
            await fn()
        dt = (time.perf_counter() - t0) / n
        q = (storage.query_count - q0) / n
        out.append(f"  {name:<44} {dt * 1e6:6.0f} us/call, {q:.1f} SQL statements/call")

    await per_call("storage.now_ms() (bridge only, no SQL)", storage.now_ms)
    await per_call("gnl.get_job (one pooled SELECT)", lambda: gnl.get_job(storage.work, "j"))
    # Enough jobs for every claim to find one (the claims are never completed).
    more = [{"type": "x", "payload": None, "options": {"id": f"k{i}"}} for i in range(2200)]
    await gnl.enqueue_many(storage.work, more)
    await per_call("NativeWorker.claim(1) (no outcomes to write)", lambda: native.claim(1))
    await worker.stop()
    await storage.close()

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute("SELECT * FROM gnl_jobs WHERE org = '' AND id = 'j'").fetchone()
    label = "sqlite3: the same SELECT"
    out.append(f"  {label:<44} {(time.perf_counter() - t0) / n * 1e6:6.0f} us/call")
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE gnl_jobs SET updated_at = updated_at WHERE org = '' AND id = 'j'")
        conn.execute("COMMIT")
    label = "sqlite3: BEGIN IMMEDIATE; UPDATE; COMMIT"
    out.append(f"  {label:<44} {(time.perf_counter() - t0) / n * 1e6:6.0f} us/call")
    conn.close()
    return out


def main(mode: str) -> None:
    c.header(f"profile of a gnl SQLite drain ({mode})", anchor=False, N=N, C=C, ORGS=ORGS)
    work = c.Workdir()
    try:
        tpl = work.fresh("tpl")
        asyncio.run(seed(tpl))
        c.collect()
        path = work.copy_db(tpl, "run")
        if mode == "split":
            dt, wrap, _ = asyncio.run(drain(path, timed=True))
            assert wrap is not None
            print(f"drain: {N / dt:,.0f} jobs/s, {dt:.2f} s")
            print(
                f"  awaiting the native claim: {wrap.seconds:.2f} s = {wrap.seconds / dt:.0%} of "
                f"the drain, {wrap.calls} claims, {wrap.seconds / wrap.calls * 1e6:.0f} us each"
            )
            if wrap.now_calls:
                print(
                    f"  in claim_now (at once on the worker's thread): {wrap.now_seconds:.2f} s = "
                    f"{wrap.now_seconds / dt:.0%} of the drain, {wrap.now_calls} claims, "
                    f"{wrap.now_seconds / wrap.now_calls * 1e6:.0f} us each"
                )
            rest = dt - wrap.seconds - wrap.now_seconds
            print(f"  everything else (Python: loop, tasks, handlers): {rest / N * 1e6:.1f} us/job")
            c.collect()
            print("round trips:")
            print("\n".join(asyncio.run(round_trips(work.fresh("rt")))))
        elif mode == "drain":
            dt, _, cpu = asyncio.run(drain(path, timed=False))
            print(f"drain: {N / dt:,.0f} jobs/s, {dt:.2f} s, {cpu / N * 1e6:.1f} us CPU a job")
        elif mode == "cprofile":
            prof = cProfile.Profile()
            prof.enable()
            dt, _, _ = asyncio.run(drain(path, timed=False))
            prof.disable()
            print(f"drain under cProfile: {N / dt:,.0f} jobs/s, {dt:.2f} s")
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
            print(buf.getvalue())
        elif mode == "pyinstrument":
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005, async_mode="disabled")
            profiler.start()
            dt, _, _ = asyncio.run(drain(path, timed=False))
            profiler.stop()
            print(f"drain under pyinstrument: {N / dt:,.0f} jobs/s, {dt:.2f} s")
            print(profiler.output_text(unicode=False, color=False))
        else:
            raise SystemExit(f"unknown mode {mode!r}: split, drain, cprofile or pyinstrument")
    finally:
        c.collect()
        work.cleanup()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "split")
