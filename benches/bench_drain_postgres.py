"""Drain N no-op jobs with one process on Postgres: gnl's worker vs pgqueuer, side by side.

The work is the peerbench's ``drain.py`` (``../shared/peerbench``): N jobs of type ``noop``
with payload ``{}``, already enqueued, drained by one process whose handler does nothing.
Before every drain the ``public`` schema is dropped and created again, and the jobs are
enqueued (not timed).

* gnl: ``gnl.enqueue_many`` of the N jobs, then ``gnl.create_worker(storage, {"noop":
  handler}, concurrency=C)`` and ``await worker.drain()``, timed until it returns (every
  outcome written). Leases, attempts, fencing tokens and fair lanes are on. C from env ``C``
  (default ``100,10``). Checked: ``DrainResult`` counts N processed and succeeded, and N rows
  are ``done``. Layouts (env ``ORGS``, default ``1,10``): every job in one organization, and
  the jobs spread over 10 organizations, enqueued organization by organization (all of
  ``org0``'s jobs, then all of ``org1``'s, ...): a FIFO queue would finish ``org0`` before it
  starts ``org9``, fair lanes serve them in turn. The handler appends ``ctx.org_id`` to a list
  (completion order); printed: how many jobs of each organization were done when 10% and
  50% of all jobs were.
* pgqueuer (the anchor): as ``drain.py`` does it: ``Queries.install()``, ``enqueue(["noop"] *
  N, [b"{}"] * N, [0] * N)``, a ``QueueManager`` with a no-op entrypoint, ``run(batch_size=B,
  mode=drain, dequeue_timeout=1 s)``, timed. B from env ``PGQ_BATCH`` (default ``100,10``; the
  bar is checked against 100). pgqueuer has no organizations: one FIFO.

A warm-up drain of ``min(N, 2000)`` jobs per contender, then R repetitions, contenders
alternating. Figures are jobs/s (medians); ratio = gnl / pgqueuer batch 100. Issue bar: gnl at
least 2x pgqueuer (batch 100), with the organizations served fairly.

Afterwards one more drain per layout and C (not timed against anything) counts the worker's
claims (a call of the native claim, which also writes the outcomes finished since the last
one), the statements per claim and the share of the drain spent awaiting claims.

    N=30000 R=3 .venv/bin/python benches/bench_drain_postgres.py
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import _common as c
import _servers as s
import gnl

N = c.env_int("N", 30_000)
R = c.env_int("R", 3)
CONCURRENCY = c.env_ints("C", "100,10")
ORGS = c.env_ints("ORGS", "1,10")
PGQ_BATCH = c.env_ints("PGQ_BATCH", "100,10")
BAR_BATCH = 100
BAR = 2.0


def make_jobs(n: int, orgs: int) -> list[dict[str, Any]]:
    """N no-op jobs; with several organizations, in blocks: org0's jobs first, then org1's..."""
    per = -(-n // orgs)
    return [
        {
            "type": "noop",
            "payload": {},
            "options": {"id": f"job:{i}", "org_id": "acme" if orgs == 1 else f"org{i // per}"},
        }
        for i in range(n)
    ]


# -- gnl -------------------------------------------------------------------------------------


class ClaimProbe:
    """Wraps the worker's native handle (diagnostic drains only): counts claim calls and the
    time spent awaiting them."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.calls = 0
        self.jobs = 0
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    async def claim(self, n: int) -> Any:
        t0 = time.perf_counter()
        jobs = await self._native.claim(n)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.jobs += len(jobs)
        return jobs


async def gnl_drain(
    jobs: list[dict[str, Any]], conc: int, probe: bool = False
) -> tuple[float, list[str | None], dict[str, float]]:
    """Seconds to drain, the organizations in completion order, and counters."""
    await s.pg_fresh()
    storage = await gnl.connect(s.PG_URL)
    ids = await gnl.enqueue_many(storage.work, jobs)
    assert len(ids) == len(jobs)
    order: list[str | None] = []

    async def noop(payload: Any, ctx: gnl.JobContext) -> None:
        order.append(ctx.org_id)

    worker = gnl.create_worker(storage, {"noop": noop}, concurrency=conc)
    wrap: ClaimProbe | None = None
    if probe:
        wrap = ClaimProbe(worker._ensure_native())
        worker._native = wrap  # type: ignore[assignment]
    q0 = storage.query_count
    t0 = time.perf_counter()
    res = await worker.drain()
    dt = time.perf_counter() - t0
    queries = storage.query_count - q0
    # drain() closed its native half and let go of it (the wrapper included): nothing to
    # restore. (Putting the closed handle back made stop() try to flush it.)
    assert worker._native is None
    await worker.stop()
    await storage.close()
    n = len(jobs)
    assert res.processed == n and res.succeeded == n and res.failed == 0, res
    assert len(order) == n, (len(order), n)
    done = await s.pg_scalar("SELECT count(*) FROM gnl_jobs WHERE state = 'done'")
    assert done == n, (done, n)
    info = {"queries": queries}
    if wrap is not None:
        info.update(claims=wrap.calls, claim_s=wrap.seconds, claimed=wrap.jobs, seconds=dt)
    return dt, order, info


def fairness(order: list[str | None], orgs: int) -> list[str]:
    n = len(order)
    names = [f"org{k}" for k in range(orgs)]
    out = []
    for frac in (0.1, 0.5):
        cut = Counter(order[: int(n * frac)])
        counts = [cut.get(o, 0) for o in names]
        out.append(
            f"after {frac:.0%} of the jobs ({int(n * frac):,}): per org min {min(counts):,}, "
            f"max {max(counts):,} [{' '.join(str(x) for x in counts)}]"
        )
    per = -(-n // orgs)
    fifo = [min(per, max(0, n // 2 - k * per)) for k in range(orgs)]
    out.append(f"(a FIFO would have done, after 50%: [{' '.join(str(x) for x in fifo)}])")
    return out


# -- pgqueuer --------------------------------------------------------------------------------


async def pgq_drain(n: int, batch: int) -> float:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await s.pg_connect()
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        q = Queries(AsyncpgDriver(conn))
        await q.install()
        await q.enqueue(["noop"] * n, [b"{}"] * n, [0] * n)
        qm = QueueManager(q)
        done = 0

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        t0 = time.perf_counter()
        await qm.run(
            batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1)
        )
        dt = time.perf_counter() - t0
        assert done == n, (done, n)
        left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
        assert left == 0, left
    finally:
        await conn.close()
    return dt


# -- main ------------------------------------------------------------------------------------


async def main() -> None:
    c.header(
        "drain no-op jobs on Postgres, one process: gnl worker vs pgqueuer",
        anchor=False,
        N=N,
        R=R,
        C=CONCURRENCY,
        ORGS=ORGS,
        PGQ_BATCH=PGQ_BATCH,
        url=s.PG_URL,
    )
    print(
        f"  PostgreSQL {await s.pg_version()}, asyncpg {s.pkg_version('asyncpg')}, "
        f"pgqueuer {s.pkg_version('pgqueuer')}",
        flush=True,
    )
    nw = min(N, 2000)
    for b in PGQ_BATCH:
        await pgq_drain(nw, b)
    for orgs in ORGS:
        for k in CONCURRENCY:
            await gnl_drain(make_jobs(nw, orgs), k)
    c.collect()

    pq: dict[int, list[float]] = {b: [] for b in PGQ_BATCH}
    g: dict[tuple[int, int], list[float]] = {(o, k): [] for o in ORGS for k in CONCURRENCY}
    qpj: dict[tuple[int, int], float] = {}
    orders: dict[tuple[int, int], list[str | None]] = {}
    layouts = {o: make_jobs(N, o) for o in ORGS}
    for i in range(R):
        parts = []
        for b in PGQ_BATCH:
            pq[b].append(N / await pgq_drain(N, b))
            parts.append(f"pgqueuer b={b} {pq[b][-1]:,.0f}")
        for o in ORGS:
            for k in CONCURRENCY:
                dt, order, info = await gnl_drain(layouts[o], k)
                g[(o, k)].append(N / dt)
                qpj[(o, k)] = info["queries"] / N
                orders[(o, k)] = order
                c.collect()
                parts.append(f"gnl orgs={o} C={k} {g[(o, k)][-1]:,.0f}")
        print(f"  rep {i + 1}/{R}: " + ", ".join(parts) + " jobs/s", flush=True)

    pm = {b: c.summary(v) for b, v in pq.items()}
    for b in PGQ_BATCH:
        print(f"pgqueuer batch={b:<4} {c.fmt_rate(*pm[b])}")
    anchor = pm[BAR_BATCH][0] if BAR_BATCH in pm else None
    for o in ORGS:
        for k in CONCURRENCY:
            m = c.summary(g[(o, k)])
            line = f"gnl orgs={o:<2} C={k:<4} {c.fmt_rate(*m)}; {qpj[(o, k)]:.3f} statements/job"
            if anchor is not None:
                r = m[0] / anchor
                met = "MET" if r >= BAR else "NOT MET"
                line += f"; ratio vs pgqueuer b={BAR_BATCH} {r:.2f}x (bar >= {BAR:.0f}x: {met})"
            print(line)
            if o > 1:
                for f in fairness(orders[(o, k)], o):
                    print(f"    {f}")
    print("where a drain's time goes (one more drain each, claims counted):", flush=True)
    for o in ORGS:
        for k in CONCURRENCY:
            _, _, info = await gnl_drain(layouts[o], k, probe=True)
            calls = info["claims"]
            print(
                f"  orgs={o} C={k}: {calls:,.0f} claims, {info['claimed'] / calls:.1f} jobs/claim, "
                f"{info['queries'] / calls:.2f} statements/claim, "
                f"{1e3 * info['claim_s'] / calls:.2f} ms/claim, awaiting claims "
                f"{100 * info['claim_s'] / info['seconds']:.0f}% of the drain",
                flush=True,
            )
            c.collect()


if __name__ == "__main__":
    asyncio.run(main())
    c.collect()
