"""The scheduler's store side, per engine (Postgres, MySQL, SQLite):

* ``fire``: one ``gnl.poll_scheduler`` that finds ``FIRE`` (10,000) ``at`` triggers due and fires
  them all with a no-op runner: seconds, fires/s, statements per fire. Anchor: the same
  number of ``storage.now_ms()`` round trips (one trivial statement each, through the same
  bridge), so the ratio says how many round trips' worth one fire costs.
* ``idle``: a poll with nothing due at 1 and at ``IDLE`` (100,000) registered triggers (every
  one due in a day): statements per poll and median latency, the 1-trigger store being the
  anchor of the 100,000 one (API.md: an idle poll costs the same at any number of triggers).

    .venv/bin/python benches/bench_scheduler.py
    BACKENDS=sqlite FIRE=2000 IDLE=10000 .venv/bin/python benches/bench_scheduler.py

Env: ``BACKENDS`` (default ``postgres,mysql,sqlite``), ``FIRE``, ``IDLE``, ``POLLS`` (200).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from typing import Any

import _common as c
import gnl
from gnl import _native

BACKENDS = os.environ.get("BACKENDS", "postgres,mysql,sqlite").replace(",", " ").split()
FIRE = c.env_int("FIRE", 10_000)
IDLE = c.env_int("IDLE", 100_000)
POLLS = c.env_int("POLLS", 200)
DAY = 86_400_000


# Servers through their command-line clients (the bench needs no Python driver): a Postgres
# schema or a MySQL database per store, dropped at the end.
PG = os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:5432/test")
MY = os.environ.get("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


def sql(backend: str, text: str) -> None:
    if backend == "postgres":
        subprocess.run(["psql", PG, "-qc", text], check=True, capture_output=True)
    else:
        subprocess.run(
            ["mysql", "-h127.0.0.1", "-uroot", "-e", text], check=True, capture_output=True
        )


async def fresh_store(backend: str, name: str, work: c.Workdir) -> str:
    if backend == "postgres":
        sql(backend, f"DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}")
        return f"{PG}?options=-c%20search_path%3D{name}"
    if backend == "mysql":
        sql(backend, f"DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}")
        return MY.rsplit("/", 1)[0] + "/" + name
    return c.sqlite_url(work.fresh(name))


async def drop_store(backend: str, name: str) -> None:
    if backend == "postgres":
        sql(backend, f"DROP SCHEMA IF EXISTS {name} CASCADE")
    elif backend == "mysql":
        sql(backend, f"DROP DATABASE IF EXISTS {name}")


class Noop:
    async def run_workflow(
        self, name: str, *, run_id: str, input: Any, scheduled_for: Any, signal: Any
    ) -> None:
        return None


async def fill(storage: gnl.Storage, n: int, at: int | None, now: int) -> float:
    """Register ``n`` triggers: ``at`` ones (due) or ``every_ms`` of a day (idle)."""
    native = storage._native
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        spec = str(at) if at is not None else str(DAY)
        first = at if at is not None else now + DAY
        kind = "at" if at is not None else "every"
        d = (f"t{i}", "wf", kind, spec, now, "latest", None, 60_000, None, 5, f"d{i}")
        st = ("pending", 0, first, first, None, 0, None, None, None, 0, 0, None)
        await _native.trigger_register(native, d, st)

    for k in range(0, n, 64):
        await asyncio.gather(*(one(i) for i in range(k, min(n, k + 64))))
    return time.perf_counter() - t0


async def bench_fire(backend: str, work: c.Workdir) -> str:
    name = "gnl_sched_fire"
    url = await fresh_store(backend, name, work)
    try:
        async with await gnl.connect(url, max_connections=20) as st:
            now = await st.now_ms()
            setup = await fill(st, FIRE, now - 1_000, now)
            q0 = st.query_count
            t0 = time.perf_counter()
            res = await gnl.poll_scheduler(st, Noop())
            dt = time.perf_counter() - t0
            q = st.query_count - q0
            assert res.fired == FIRE, res
            t1 = time.perf_counter()
            for k in range(0, FIRE, 64):
                await asyncio.gather(*(st.now_ms() for _ in range(min(64, FIRE - k))))
            anchor = time.perf_counter() - t1
        return (
            f"{backend:<9} fire  {FIRE:>7,} due: {dt:.2f} s ({FIRE / dt:,.0f} fires/s), "
            f"{q / FIRE:.1f} statements/fire; anchor {FIRE:,} now_ms() round trips "
            f"{anchor:.2f} s; ratio {dt / anchor:.1f}x; set-up {setup:.1f} s"
        )
    finally:
        await drop_store(backend, name)


async def bench_idle(backend: str, n: int, work: c.Workdir) -> dict[str, Any]:
    name = f"gnl_sched_idle_{n}"
    url = await fresh_store(backend, name, work)
    try:
        async with await gnl.connect(url, max_connections=20) as st:
            now = await st.now_ms()
            await fill(st, n, None, now)
            lat, qs = [], set()
            for i in range(POLLS + 20):
                q0 = st.query_count
                t0 = time.perf_counter()
                res = await gnl.poll_scheduler(st, Noop())
                d = time.perf_counter() - t0
                assert res.fired == 0
                if i >= 20:
                    lat.append(d * 1e6)
                    qs.add(st.query_count - q0)
        dec = statistics.quantiles(lat, n=10)
        return {"med": statistics.median(lat), "p10": dec[0], "p90": dec[-1], "q": sorted(qs)}
    finally:
        await drop_store(backend, name)


async def main() -> None:
    c.header("bench_scheduler", anchor=False, FIRE=FIRE, IDLE=IDLE, POLLS=POLLS)
    work = c.Workdir()
    try:
        for backend in BACKENDS:
            print(await bench_fire(backend, work), flush=True)
            one = await bench_idle(backend, 1, work)
            many = await bench_idle(backend, IDLE, work)
            for n, m in ((1, one), (IDLE, many)):
                print(
                    f"{backend:<9} idle  {n:>7,} triggers: {'/'.join(map(str, m['q']))} "
                    f"statements/poll, median {m['med']:.0f} µs (p10 {m['p10']:.0f}, "
                    f"p90 {m['p90']:.0f})",
                    flush=True,
                )
            same = one["q"] == many["q"]
            print(
                f"{backend:<9} idle  {IDLE:,} vs 1: statements {'same' if same else 'DIFFER'}, "
                f"latency {many['med'] / one['med']:.2f}x",
                flush=True,
            )
    finally:
        work.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
    c.collect()
