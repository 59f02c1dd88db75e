"""The lane pick: what a claim costs when many lanes hold only future jobs, for 1, 1,000 and
100,000 such lanes, on Postgres, MySQL and SQLite (issue 9, finding 7).

For each backend and each number of idle lanes, a fresh store gets one job per idle
organization with ``delay_ms`` of an hour (every idle lane has a pending job, none due), plus
one more organization, ``due``, with ``WARM + CLAIMS`` jobs due now (``gnl.enqueue_many``, not
timed). Each store lives in its own Postgres schema (``search_path`` in gnl's URL), MySQL
database (``<db>_gnl_pick_<n>``, dropped at the end) or SQLite file.

Then a worker per store (``concurrency=1``) claims one job at a time through its native handle
(``worker._ensure_native().claim(1)``, a private call: what a started worker's poll loop sends
each tick), and each claim is timed on its own and checked to return one job of the ``due``
lane. A claim that came back full skips the empty-poll read, as a busy worker's does, so every
timed claim is the lane pick and the job claim (and, every 250 ms, the look for expired leases).
The claimed jobs are not finished (their leases outlive the run). After ``WARM`` untimed
claims per store, the stores are claimed from in turn, ``ROUNDS`` rounds of ``CLAIMS / ROUNDS``
claims each (so that other load on the machine falls on all of them alike).

Printed per backend and number of idle lanes: the median (and 10th/90th percentile) latency
of a claim in µs and the statements each claim sent. The anchor is the 1-idle-lane figure of
the same backend: ratio = median at 100,000 / median at 1. Issue bar (issue 9): within 2x.

    .venv/bin/python benches/bench_lane_pick.py
    BACKENDS=sqlite CLAIMS=500 .venv/bin/python benches/bench_lane_pick.py

Env: ``BACKENDS`` (default ``postgres,mysql,sqlite``), ``LANE_COUNTS`` (default
``1,1000,100000``), ``CLAIMS`` (default 400), ``WARM`` (default 20), ``ROUNDS`` (default 10),
``PG_URL``, ``MYSQL_URL``, ``BENCH_DIR``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import _common as c
import _servers as s
import gnl

BACKENDS = os.environ.get("BACKENDS", "postgres,mysql,sqlite").replace(",", " ").split()
LANE_COUNTS = c.env_ints("LANE_COUNTS", "1,1000,100000")
CLAIMS = c.env_int("CLAIMS", 400)
WARM = c.env_int("WARM", 20)
ROUNDS = c.env_int("ROUNDS", 10)
HOUR_MS = 3600 * 1000
BAR = 2.0


async def noop(payload: Any, ctx: gnl.JobContext) -> None:
    return None


class Target:
    """One store: a backend and a number of idle lanes, in its own schema, database or file."""

    def __init__(self, backend: str, lanes: int) -> None:
        self.backend, self.lanes = backend, lanes
        self.name = f"gnl_pick_{lanes}"
        self.lat: list[float] = []
        self.queries: set[int] = set()

    async def open(self, work: c.Workdir) -> None:
        url = await s.fresh_store(self.backend, self.name, work)
        self.storage = await gnl.connect(url)
        idle = [
            {
                "type": "noop",
                "payload": {},
                "options": {"id": "later", "org_id": f"idle{k}", "delay_ms": HOUR_MS},
            }
            for k in range(self.lanes)
        ]
        due = [
            {"type": "noop", "payload": {}, "options": {"id": f"due{i}", "org_id": "due"}}
            for i in range(WARM + CLAIMS)
        ]
        for part in range(0, len(idle), 20_000):
            await gnl.enqueue_many(self.storage.work, idle[part : part + 20_000])
        await gnl.enqueue_many(self.storage.work, due)
        self.worker = gnl.create_worker(self.storage, {"noop": noop}, concurrency=1)
        self.native = self.worker._ensure_native()

    async def claim(self, n: int, keep: bool) -> None:
        for _ in range(n):
            q0 = self.storage.query_count
            t0 = time.perf_counter()
            jobs = await self.native.claim(1)
            dt = time.perf_counter() - t0
            assert len(jobs) == 1, (self.backend, self.lanes, jobs)
            if keep:
                self.lat.append(dt * 1e6)
                self.queries.add(self.storage.query_count - q0)

    async def close(self) -> None:
        await self.worker.stop()
        await self.storage.close()
        await s.drop_store(self.backend, self.name)

    def stats(self) -> dict[str, Any]:
        dec = statistics.quantiles(self.lat, n=10)
        return {
            "queries": sorted(self.queries),
            "med": statistics.median(self.lat),
            "p10": dec[0],
            "p90": dec[-1],
        }


async def measure(backend: str, work: c.Workdir) -> list[Target]:
    targets = [Target(backend, n) for n in LANE_COUNTS]
    try:
        for tg in targets:
            await tg.open(work)
            await tg.claim(WARM, keep=False)
        per = max(1, CLAIMS // ROUNDS)
        for _ in range(ROUNDS):
            for tg in targets:
                await tg.claim(per, keep=True)
    finally:
        for tg in targets:
            if hasattr(tg, "storage"):
                await tg.close()
        c.collect()
    return targets


async def main() -> None:
    c.header(
        "lane pick: a claim's cost with idle lanes (only future jobs) beside one due lane",
        anchor=False,
        BACKENDS=BACKENDS,
        LANE_COUNTS=LANE_COUNTS,
        CLAIMS=CLAIMS,
        WARM=WARM,
    )
    await s.print_servers(BACKENDS)
    work = c.Workdir()
    ok = True
    try:
        for backend in BACKENDS:
            targets = await measure(backend, work)
            base = targets[0].stats()["med"]
            print(f"\n{backend}: claim(1) latency, µs (median [p10..p90]), statements per claim")
            for tg in targets:
                m = tg.stats()
                print(
                    f"  {tg.lanes:>7} idle lanes: {m['med']:8.0f} [{m['p10']:.0f}..{m['p90']:.0f}]"
                    f"  x{m['med'] / base:5.2f} of {targets[0].lanes} lane"
                    f"  statements {m['queries']}",
                    flush=True,
                )
            ratio = targets[-1].stats()["med"] / base
            met = ratio <= BAR
            ok = ok and met
            print(
                f"  ratio {targets[-1].lanes} / {targets[0].lanes} idle lanes: {ratio:.2f}"
                f"  (bar <= {BAR}: {'met' if met else 'NOT met'})",
                flush=True,
            )
    finally:
        work.cleanup()
    print(f"\nbar (every backend within {BAR}x): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    asyncio.run(main())
