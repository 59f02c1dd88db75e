"""Drain N jobs with one process on Postgres: gnl's worker vs pgqueuer at equal concurrency.

The work (issue 15 deliverable 3): N jobs, already enqueued, drained by one process whose
handler decodes its payload (JSON) and reads a field. Payloads are the peerbench's rows
(``../shared/peerbench/enqueue_30k.py``: ``{"id": i, "name": f"row {i}", "email":
f"u{i}@example.org"}``), the same on both sides. Each drain runs in a schema of its own
(``drain_<pid>``, dropped and created again before every drain and dropped at the end), so
that other benches on the ``bench`` database are left alone; the jobs are enqueued before the
timed part.

* gnl: ``gnl.enqueue_many`` of the N jobs, then ``gnl.create_worker(storage, {"noop":
  handler}, concurrency=C)`` and ``await worker.drain()``, timed until it returns (every
  outcome written). The worker decodes the payload before the handler runs (its ``payload``
  argument). Leases, attempts, fencing tokens and fair lanes are on. Checked:
  ``DrainResult`` counts N processed and succeeded, and N rows are ``done``. Layouts (env
  ``ORGS``, default ``1,50,1000``): the jobs in one organization, or spread over 50 or 1,000
  organizations, enqueued organization by organization (all of ``org0``'s jobs, then all of
  ``org1``'s, ...): a FIFO queue would finish ``org0`` before it starts the next one, fair
  lanes serve them in turn. The handler appends ``ctx.org_id`` to a list (start order);
  printed: how many jobs of each organization were done when 10% and 50% of all jobs were,
  beside the exact fair share.
* pgqueuer (the anchor), as the peerbench's ``drain.py`` does it with these payloads:
  ``Queries.install()``, ``enqueue(["noop"] * N, payloads, [0] * N)``, a ``QueueManager``
  whose entrypoint ``json.loads`` the payload (bytes) and reads the same field,
  ``run(batch_size=B, mode=drain, dequeue_timeout=1 s)``, timed. pgqueuer has no
  organizations: one FIFO, so one pgqueuer figure per B serves every layout.

Shapes: C (env ``C``, default ``10,100``) against pgqueuer at batch size B = C (the issue's
"equal concurrency"; env ``PGQ_BATCH`` gives other batch sizes, paired in order). A warm-up
drain of ``min(N, 2000)`` jobs per contender and shape, then R repetitions, contenders
alternating. Figures are jobs/s (medians); ratio = gnl C / pgqueuer B. Issue bar: at least 2x
in every shape, organizations served fairly.

Afterwards one more drain per shape (not timed against anything) counts the worker's claims
(a call of the native claim, which also writes the outcomes finished since the last one), the
statements per claim, a claim's time from sending to its answer, and how many claims were in
flight on average (the claims' times over the drain's: the worker sends a second claim
while one is in flight when handlers are short and lanes many).

    N=30000 R=3 .venv/bin/python benches/bench_drain_postgres.py
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import _common as c
import _servers as s
import gnl

N = c.env_int("N", 30_000)
R = c.env_int("R", 3)
CONCURRENCY = c.env_ints("C", "10,100")
ORGS = c.env_ints("ORGS", "1,50,1000")
PGQ_BATCH = c.env_ints("PGQ_BATCH", ",".join(str(k) for k in CONCURRENCY))

PAIR = dict(zip(CONCURRENCY, PGQ_BATCH, strict=True))  # PGQ_BATCH pairs with C, in order
BAR = 2.0
SCHEMA = os.environ.get("PG_SCHEMA", f"drain_{os.getpid()}")


def make_jobs(n: int, orgs: int) -> list[dict[str, Any]]:
    """N jobs with the peerbench's payloads; with several organizations, in blocks: org0's
    jobs first, then org1's..."""
    per = -(-n // orgs)
    return [
        {
            "type": "noop",
            "payload": s.payload(i),
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

    def claim(self, n: int, carry: bool = True, per_org: int = 0, wait: bool = False) -> Any:
        # The claim goes out now, as the native one does (a coroutine would go out only when
        # awaited: a worker's second claim in flight would wait for the first).
        t0 = time.perf_counter()
        fut = self._native.claim(n, carry, per_org, wait)

        async def answer() -> Any:
            jobs = await fut
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            self.jobs += len(jobs)
            return jobs

        return asyncio.ensure_future(answer())

    def claim_now(self, n: int) -> Any:
        return None


async def gnl_drain(
    jobs: list[dict[str, Any]], conc: int, probe: bool = False
) -> tuple[float, list[str | None], dict[str, float]]:
    """Seconds to drain, the organizations in start order, and counters."""
    url = await s.pg_fresh_schema(SCHEMA)
    storage = await gnl.connect(url)
    ids = await gnl.enqueue_many(storage.work, jobs)
    assert len(ids) == len(jobs)
    order: list[str | None] = []
    seen = 0

    async def noop(payload: Any, ctx: gnl.JobContext) -> None:
        nonlocal seen
        seen += payload["id"] >= 0
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
    assert len(order) == n == seen, (len(order), n, seen)
    done = await s.pg_scalar(f"SELECT count(*) FROM \"{SCHEMA}\".gnl_jobs WHERE state = 'done'")
    assert done == n, (done, n)
    info = {"queries": queries}
    if wrap is not None:
        info.update(claims=wrap.calls, claim_s=wrap.seconds, claimed=wrap.jobs, seconds=dt)
    return dt, order, info


def fairness(order: list[str | None], orgs: int) -> list[str]:
    """Jobs done per organization after 10% and 50% of all, against the exact fair share."""
    n = len(order)
    names = [f"org{k}" for k in range(orgs)]
    out = []
    for frac in (0.1, 0.5):
        done = int(n * frac)
        cut = Counter(order[:done])
        counts = [cut.get(o, 0) for o in names]
        share = done / orgs
        listed = f" [{' '.join(str(x) for x in counts)}]" if orgs <= 10 else ""
        out.append(
            f"after {frac:.0%} of the jobs ({done:,}): per org min {min(counts):,}, "
            f"max {max(counts):,} (fair share {share:,.1f}){listed}"
        )
    per = -(-n // orgs)
    served = sum(1 for k in range(orgs) if min(per, max(0, n // 2 - k * per)) > 0)
    out.append(f"(a FIFO would have served {served:,} of the {orgs:,} organizations after 50%)")
    return out


# -- pgqueuer --------------------------------------------------------------------------------


async def pgq_drain(n: int, batch: int) -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    await s.pg_fresh_schema(SCHEMA)
    conn = await asyncpg.connect(s.PG_URL, server_settings={"search_path": SCHEMA})
    try:
        q = Queries(AsyncpgDriver(conn))
        await q.install()
        payloads = [json.dumps(s.payload(i)).encode() for i in range(n)]
        await q.enqueue(["noop"] * n, payloads, [0] * n)  # type: ignore[arg-type]
        qm = QueueManager(q)
        done = 0

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            done += json.loads(job.payload)["id"] >= 0

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
        "drain JSON-payload jobs on Postgres, one process: gnl worker vs pgqueuer",
        anchor=False,
        N=N,
        R=R,
        C=CONCURRENCY,
        ORGS=ORGS,
        PGQ_BATCH=PGQ_BATCH,
        url=s.PG_URL,
        schema=SCHEMA,
    )
    print(
        f"  PostgreSQL {await s.pg_version()}, asyncpg {s.pkg_version('asyncpg')}, "
        f"pgqueuer {s.pkg_version('pgqueuer')}",
        flush=True,
    )
    try:
        await run()
    finally:
        await s.pg_drop_schema(SCHEMA)


async def run() -> None:
    nw = min(N, 2000)
    for k in CONCURRENCY:
        await pgq_drain(nw, PAIR[k])
        for orgs in ORGS:
            await gnl_drain(make_jobs(nw, orgs), k)
    c.collect()

    pq: dict[int, list[float]] = {k: [] for k in CONCURRENCY}
    g: dict[tuple[int, int], list[float]] = {(o, k): [] for o in ORGS for k in CONCURRENCY}
    qpj: dict[tuple[int, int], float] = {}
    orders: dict[tuple[int, int], list[str | None]] = {}
    layouts = {o: make_jobs(N, o) for o in ORGS}
    for i in range(R):
        parts = []
        for k in CONCURRENCY:
            pq[k].append(N / await pgq_drain(N, PAIR[k]))
            parts.append(f"pgqueuer b={PAIR[k]} {pq[k][-1]:,.0f}")
            for o in ORGS:
                dt, order, info = await gnl_drain(layouts[o], k)
                g[(o, k)].append(N / dt)
                qpj[(o, k)] = info["queries"] / N
                orders[(o, k)] = order
                c.collect()
                parts.append(
                    f"gnl orgs={o} C={k} {g[(o, k)][-1]:,.0f} ({g[(o, k)][-1] / pq[k][-1]:.2f}x)"
                )
        print(f"  rep {i + 1}/{R}: " + ", ".join(parts) + " jobs/s", flush=True)

    for k in CONCURRENCY:
        pm = c.summary(pq[k])
        print(f"pgqueuer batch={PAIR[k]:<4} {c.fmt_rate(*pm)}")
        for o in ORGS:
            m = c.summary(g[(o, k)])
            r = m[0] / pm[0]
            met = "MET" if r >= BAR else "NOT MET"
            print(
                f"  gnl orgs={o:<5} C={k:<4} {c.fmt_rate(*m)}; {qpj[(o, k)]:.3f} statements/job; "
                f"ratio vs pgqueuer b={PAIR[k]} {r:.2f}x (bar >= {BAR:.0f}x: {met})"
            )
            if o > 1:
                for f in fairness(orders[(o, k)], o):
                    print(f"      {f}")
    print("where a drain's time goes (one more drain each, claims counted):", flush=True)
    for k in CONCURRENCY:
        for o in ORGS:
            _, _, info = await gnl_drain(layouts[o], k, probe=True)
            calls = info["claims"]
            print(
                f"  orgs={o} C={k}: {calls:,.0f} claims, {info['claimed'] / calls:.1f} jobs/claim, "
                f"{info['queries'] / calls:.2f} statements/claim, "
                f"{1e3 * info['claim_s'] / calls:.2f} ms/claim, "
                f"{info['claim_s'] / info['seconds']:.2f} claims in flight on average",
                flush=True,
            )
            c.collect()


if __name__ == "__main__":
    asyncio.run(main())
    c.collect()
