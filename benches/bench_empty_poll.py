"""The empty poll: what a worker's claim costs on a queue with nothing due, for 1, 1,000 and
100,000 organizations (lanes), on Postgres, MySQL and SQLite.

API.md ("Fairness"): "An empty poll costs a constant number of queries whatever the number of
organizations." For each backend and each number of organizations, a fresh store is filled
so that every organization has a lane and nothing is due, in two ways:

* ``drained``: one due job per organization (``gnl.enqueue_many``, one call), then a worker
  (``concurrency=500``) drains them all: every lane exists, every job is ``done``.
* ``delayed``: one job per organization with ``delay_ms`` of 30 days: every lane exists and
  has a pending job, none due.

Each store lives in its own Postgres schema (``search_path`` in gnl's URL), MySQL database
(``<db>_gnl_poll_...``, dropped at the end) or SQLite file; the stores of one backend and
variant (one per number of organizations) are all filled first. Then a new worker per store
(``concurrency=10``) polls the empty queue, two ways:

* ``drain``: ``await worker.drain()`` (the public call; it returns ``DrainResult(0, 0, 0)``,
  checked): the claim, and whatever ``drain`` adds to find that nothing is due.
* ``claim``: one claim of the worker's native handle (``worker._ensure_native().claim(10)``,
  a private call, checked empty): what a started worker's poll loop sends each tick.

After ``WARM`` untimed polls of each kind, the stores are polled in turn, ``ROUNDS`` rounds
of ``POLLS / ROUNDS`` polls of each kind (so that other load on the machine falls on all of
them alike), every poll timed on its own: the median (and 10th/90th percentile) latency, and
the statements each poll sent (``storage.query_count`` before and after; every value seen is
printed). For scale, the median round trip of ``storage.now_ms()`` (one trivial statement
through the same bridge) is printed too.

Issue bars: the same number of statements per poll at 1 and at 100,000 organizations; latency
at 100,000 at most 2x the latency at 1 (per backend, variant and kind of poll).

    .venv/bin/python benches/bench_empty_poll.py
    BACKENDS=postgres POLLS=500 .venv/bin/python benches/bench_empty_poll.py

Env: ``BACKENDS`` (default ``postgres,mysql,sqlite``), ``ORG_COUNTS`` (default
``1,1000,100000``), ``VARIANTS`` (default ``drained,delayed``), ``POLLS`` (default 300),
``WARM`` (default 20), ``ROUNDS`` (default 10), ``PG_URL``, ``MYSQL_URL``, ``BENCH_DIR``.
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
ORG_COUNTS = c.env_ints("ORG_COUNTS", "1,1000,100000")
VARIANTS = os.environ.get("VARIANTS", "drained,delayed").replace(",", " ").split()
POLLS = c.env_int("POLLS", 300)
WARM = c.env_int("WARM", 20)
ROUNDS = c.env_int("ROUNDS", 10)
CONC = 10
DELAY_MS = 30 * 24 * 3600 * 1000
BAR = 2.0


async def noop(payload: Any, ctx: gnl.JobContext) -> None:
    return None


KINDS = ("drain", "claim")


class Target:
    """One store: a backend, a number of organizations and a variant, in its own schema
    (Postgres), database (MySQL) or file (SQLite)."""

    def __init__(self, backend: str, variant: str, orgs: int) -> None:
        self.backend, self.variant, self.orgs = backend, variant, orgs
        self.name = f"gnl_poll_{variant}_{orgs}"
        self.lat: dict[str, list[float]] = {k: [] for k in KINDS}
        self.queries: dict[str, set[int]] = {k: set() for k in KINDS}
        self.rt: list[float] = []

    async def open(self, work: c.Workdir) -> None:
        url = await s.fresh_store(self.backend, self.name, work)
        self.storage = await gnl.connect(url)
        self.setup_s = await fill(self.storage, self.orgs, self.variant)
        self.worker = gnl.create_worker(self.storage, {"noop": noop}, concurrency=CONC)

    async def once(self, kind: str) -> None:
        if kind == "drain":
            res = await self.worker.drain()
            assert res.processed == 0, res
        else:
            # What a started worker's poll loop sends per tick (worker.py: native.claim).
            jobs = await self.worker._ensure_native().claim(CONC)
            assert not jobs, jobs

    async def poll(self, kind: str, n: int, keep: bool) -> None:
        for _ in range(n):
            q0 = self.storage.query_count
            t0 = time.perf_counter()
            await self.once(kind)
            dt = time.perf_counter() - t0
            if keep:
                self.lat[kind].append(dt * 1e6)
                self.queries[kind].add(self.storage.query_count - q0)

    async def round_trip(self, n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            await self.storage.now_ms()
            self.rt.append((time.perf_counter() - t0) * 1e6)

    async def close(self) -> None:
        await self.worker.stop()
        await self.storage.close()
        await s.drop_store(self.backend, self.name)

    def stats(self, kind: str) -> dict[str, Any]:
        lat = self.lat[kind]
        dec = statistics.quantiles(lat, n=10)
        return {
            "queries": sorted(self.queries[kind]),
            "med": statistics.median(lat),
            "p10": dec[0],
            "p90": dec[-1],
            "rt": statistics.median(self.rt),
        }


async def fill(storage: gnl.Storage, orgs: int, variant: str) -> float:
    """Make ``orgs`` lanes with nothing due; returns the seconds it took."""
    t0 = time.perf_counter()
    opts: dict[str, Any] = {"delay_ms": DELAY_MS} if variant == "delayed" else {}
    jobs = [
        {"type": "noop", "payload": {}, "options": {"id": "j", "org_id": f"org{k}", **opts}}
        for k in range(orgs)
    ]
    ids = await gnl.enqueue_many(storage.work, jobs)
    assert len(ids) == orgs
    if variant == "drained":
        w = gnl.create_worker(storage, {"noop": noop}, concurrency=500)
        res = await w.drain()
        await w.stop()
        assert res.processed == orgs and res.succeeded == orgs, (res, orgs)
    return time.perf_counter() - t0


async def measure(backend: str, variant: str, work: c.Workdir) -> list[Target]:
    """Fill one store per number of organizations, then poll them in turn, ROUNDS times, so
    that other load on the machine falls on every store alike."""
    targets = [Target(backend, variant, orgs) for orgs in ORG_COUNTS]
    try:
        for tg in targets:
            await tg.open(work)
            for kind in KINDS:
                await tg.poll(kind, WARM, keep=False)
        per = max(1, POLLS // ROUNDS)
        for _ in range(ROUNDS):
            for tg in targets:
                for kind in KINDS:
                    await tg.poll(kind, per, keep=True)
                await tg.round_trip(max(1, 100 // ROUNDS))
    finally:
        for tg in targets:
            if hasattr(tg, "storage"):
                await tg.close()
        c.collect()
    return targets


async def main() -> None:
    c.header(
        "empty poll: statements and latency of a claim on a queue with nothing due",
        anchor=False,
        BACKENDS=BACKENDS,
        ORG_COUNTS=ORG_COUNTS,
        VARIANTS=VARIANTS,
        POLLS=POLLS,
        WARM=WARM,
    )
    await s.print_servers(BACKENDS)
    work = c.Workdir()
    rows: list[tuple[str, str, str, int, dict[str, Any]]] = []
    try:
        for backend in BACKENDS:
            for variant in VARIANTS:
                for tg in await measure(backend, variant, work):
                    for kind in KINDS:
                        m = tg.stats(kind)
                        rows.append((backend, variant, kind, tg.orgs, m))
                        print(
                            f"  {backend} {variant} orgs={tg.orgs:,} {kind}: {m['queries']} "
                            f"statements/poll, median {m['med']:.0f} µs (p10 {m['p10']:.0f}, "
                            f"p90 {m['p90']:.0f}); now_ms() round trip {m['rt']:.0f} µs; "
                            f"set-up {tg.setup_s:.1f} s",
                            flush=True,
                        )
    finally:
        work.cleanup()

    print()
    print(
        f"{'backend':<9} {'variant':<8} {'poll':<6} {'orgs':>8} {'stmts/poll':>10} "
        f"{'µs/poll':>8} {'p10-p90 µs':>12} {'x orgs=1':>8}"
    )
    base: dict[tuple[str, str, str], dict[str, Any]] = {}
    for backend, variant, kind, orgs, m in sorted(rows, key=lambda r: r[:4]):
        if orgs == min(ORG_COUNTS):
            base[(backend, variant, kind)] = m
        b = base.get((backend, variant, kind))
        ratio = f"{m['med'] / b['med']:.2f}x" if b else "-"
        q = "/".join(str(x) for x in m["queries"])
        print(
            f"{backend:<9} {variant:<8} {kind:<6} {orgs:>8,} {q:>10} {m['med']:>8.0f} "
            f"{m['p10']:>5.0f}-{m['p90']:<6.0f} {ratio:>8}"
        )
    lo, hi = min(ORG_COUNTS), max(ORG_COUNTS)
    print(f"bars ({lo:,} vs {hi:,} organizations): same statements per poll; latency <= {BAR:.0f}x")
    for (backend, variant, kind), b in base.items():
        top = next(m for bk, v, k, o, m in rows if (bk, v, k, o) == (backend, variant, kind, hi))
        same = top["queries"] == b["queries"]
        r = top["med"] / b["med"]
        print(
            f"  {backend:<9} {variant:<8} {kind:<6} statements {b['queries']} -> "
            f"{top['queries']}: {'MET' if same else 'NOT MET'}; latency {r:.2f}x: "
            f"{'MET' if r <= BAR else 'NOT MET'}"
        )


if __name__ == "__main__":
    asyncio.run(main())
    c.collect()
