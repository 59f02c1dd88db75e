"""An interleaved A/B of the Postgres drain (``bench_drain_postgres.py``'s work and shapes).

Env ``AB_ENV`` names a switch the worker reads when it is created (a temporary one, while
a change is measured); each repetition drains every shape with the switch on (``1``) and
off (``0``), on first in even repetitions and off first in odd ones (the second of a pair
read ~10% faster, session 11), then pgqueuer at batch C, so that the machine's load falls
on both variants alike: use an even R. Printed per repetition: jobs/s of each, on / off,
and ``uptime``'s load; then medians, on / off, and each variant against pgqueuer's
median, and the fairness of the last "on" drain of each shape.

    AB_ENV=GNL_AB_CARRY N=30000 R=5 .venv/bin/python benches/ab_drain_postgres.py

A migration is measured with ``AB_SQL`` instead: a ``.sql`` file that the "off" drains run in
their schema once gnl has migrated it (e.g. main's last ``gnl_claim``, so that "on" is the
branch's functions and "off" main's):

    AB_SQL=/tmp/main_0008.sql C=100 ORGS=50,1000 .venv/bin/python benches/ab_drain_postgres.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
from pathlib import Path
from typing import Any

import asyncpg

import _common as c
import _servers as s
import gnl
from bench_drain_postgres import (
    CONCURRENCY,
    ORGS,
    PAIR,
    SCHEMA,
    N,
    R,
    fairness,
    gnl_drain,
    make_jobs,
    pgq_drain,
)

AB_ENV = os.environ.get("AB_ENV", "")
AB_SQL = os.environ.get("AB_SQL", "")
OFF_SQL = Path(AB_SQL).read_text() if AB_SQL else ""
_connect = gnl.connect
_on = True


async def connect(url: str, **kw: Any) -> Any:
    """gnl.connect; for an "off" drain under ``AB_SQL``, then the file's SQL in its schema."""
    storage = await _connect(url, **kw)
    if OFF_SQL and not _on:
        conn = await asyncpg.connect(s.PG_URL, server_settings={"search_path": SCHEMA})
        try:
            await conn.execute(OFF_SQL)
        finally:
            await conn.close()
    return storage


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def drain(jobs: list, conc: int, on: bool) -> tuple[float, list]:
    global _on
    _on = on
    if AB_ENV:
        os.environ[AB_ENV] = "1" if on else "0"
    dt, order, _ = await gnl_drain(jobs, conc)
    return N / dt, order


async def run() -> None:
    nw = min(N, 2000)
    for k in CONCURRENCY:
        await pgq_drain(nw, PAIR[k])
        for o in ORGS:
            for on in (True, False):
                await drain(make_jobs(nw, o), k, on)
    c.collect()
    layouts = {o: make_jobs(N, o) for o in ORGS}
    got: dict[tuple[int, int, bool], list[float]] = {}
    pq: dict[int, list[float]] = {k: [] for k in CONCURRENCY}
    orders: dict[tuple[int, int], list] = {}
    for i in range(R):
        parts = []
        for k in CONCURRENCY:
            for o in ORGS:
                # Alternating which runs first: the second of a pair read ~10% faster here.
                for on in (True, False) if i % 2 == 0 else (False, True):
                    rate, order = await drain(layouts[o], k, on)
                    got.setdefault((o, k, on), []).append(rate)
                    if on:
                        orders[(o, k)] = order
                    c.collect()
                on_, off = got[(o, k, True)][-1], got[(o, k, False)][-1]
                parts.append(f"orgs={o} C={k} {on_:,.0f}/{off:,.0f} ({on_ / off:.2f}x)")
            pq[k].append(N / await pgq_drain(N, PAIR[k]))
            parts.append(f"pgqueuer b={PAIR[k]} {pq[k][-1]:,.0f}")
        print(f"  rep {i + 1}/{R} (load {load()}): on/off jobs/s " + ", ".join(parts), flush=True)
    for k in CONCURRENCY:
        p = statistics.median(pq[k])
        print(f"pgqueuer b={PAIR[k]}: {p:,.0f} jobs/s")
        for o in ORGS:
            on_ = statistics.median(got[(o, k, True)])
            off = statistics.median(got[(o, k, False)])
            pairs = [a / b for a, b in zip(got[(o, k, True)], got[(o, k, False)], strict=True)]
            print(
                f"  orgs={o:<5} C={k:<4} on {on_:,.0f} ({on_ / p:.2f}x pgqueuer), "
                f"off {off:,.0f} ({off / p:.2f}x); on/off medians {on_ / off:.2f}x, "
                f"pairs {' '.join(f'{x:.2f}' for x in pairs)}"
            )
            if o > 1:
                for f in fairness(orders[(o, k)], o):
                    print(f"      on: {f}")


async def main() -> None:
    if not AB_ENV and not AB_SQL:
        raise SystemExit("set AB_ENV to the switch to measure, or AB_SQL")
    gnl.connect = connect  # type: ignore[assignment]
    c.header(
        f"A/B {AB_ENV or 'AB_SQL=' + AB_SQL}=1/0: drain JSON-payload jobs on Postgres, one process",
        anchor=False,
        N=N,
        R=R,
        C=CONCURRENCY,
        ORGS=ORGS,
        PGQ_BATCH=[PAIR[k] for k in CONCURRENCY],
        schema=SCHEMA,
    )
    try:
        await run()
    finally:
        await s.pg_drop_schema(SCHEMA)


if __name__ == "__main__":
    asyncio.run(main())
    c.collect()
