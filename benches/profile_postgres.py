"""Where gnl's time goes on Postgres (diagnostic, no anchor): the server's time per statement
during one ``enqueue_many`` and one drain, against the wall time the Python caller sees.

gnl's connections are opened with ``log_min_duration_statement=0`` (passed in the URL's
``options``, so only gnl's own sessions log; it needs a superuser, as the ``postgres`` user of
the benches is). The server then logs the duration of every parse, bind and execute step of
gnl's statements; this script reads the new lines of the server's log file (``PG_LOG``,
default ``/var/log/postgresql/postgresql-15-main.log``: the script must run on the server's
machine and be able to read it) and sums them per statement. The rest of the wall time is
gnl's client side: the asyncio bridge, the Python handlers, Rust, the wire.

Work: N no-op jobs (payload ``{}``) in ORGS organizations (in blocks), enqueued with one
``enqueue_many``, then drained by one worker with ``concurrency=C``, as in
``bench_drain_postgres.py``.

    N=30000 C=100 ORGS=1 .venv/bin/python benches/profile_postgres.py
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _common as c
import _servers as s
import gnl

N = c.env_int("N", 30_000)
CONCURRENCY = c.env_ints("C", "100,10")
ORGS = c.env_ints("ORGS", "1")
PG_LOG = Path(os.environ.get("PG_LOG", "/var/log/postgresql/postgresql-15-main.log"))
LINE = re.compile(r"duration: ([\d.]+) ms\s+(?:(parse|bind|execute)[^:]*: |statement: )(.{0,50})")


def logged_url() -> str:
    sep = "&" if "?" in s.PG_URL else "?"
    return f"{s.PG_URL}{sep}options=-c%20log_min_duration_statement%3D0"


def log_size() -> int:
    return PG_LOG.stat().st_size


def read_log(off0: int, off1: int) -> tuple[str, str]:
    """The log from off0 to off1, and from off1 to its end."""
    with PG_LOG.open("rb") as f:
        f.seek(off0)
        first = f.read(off1 - off0).decode(errors="replace")
        rest = f.read().decode(errors="replace")
    return first, rest


def per_statement(text: str) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for m in LINE.finditer(text):
        kind = m.group(2) or "simple"
        stmt = " ".join(m.group(3).split())[:44]
        out[(kind, stmt)].append(float(m.group(1)))
    return out


def report(title: str, wall_ms: float, text: str, per: int, unit: str) -> None:
    d = per_statement(text)
    total = sum(sum(v) for v in d.values())
    print(
        f"  {title}: wall {wall_ms:.0f} ms, server {total:.0f} ms ({100 * total / wall_ms:.0f}%), "
        f"client side and wire {wall_ms - total:.0f} ms; per {unit}: "
        f"server {1e3 * total / per:.0f} µs, wall {1e3 * wall_ms / per:.0f} µs"
    )
    for (kind, stmt), v in sorted(d.items(), key=lambda kv: -sum(kv[1]))[:8]:
        print(
            f"    {kind:<7} {len(v):6d} x {sum(v):8.1f} ms = {1e3 * sum(v) / len(v):6.0f} µs each"
            f"  {stmt}"
        )


async def run(conc: int, orgs: int) -> None:
    await s.pg_fresh()
    storage = await gnl.connect(logged_url())
    per = -(-N // orgs)
    jobs = [
        {"type": "noop", "payload": {}, "options": {"id": f"j{i}", "org_id": f"org{i // per}"}}
        for i in range(N)
    ]
    done = 0

    async def noop(payload: Any, ctx: gnl.JobContext) -> None:
        nonlocal done
        done += 1

    off0 = log_size()
    t0 = time.perf_counter()
    await gnl.enqueue_many(storage.work, jobs)
    enq = (time.perf_counter() - t0) * 1e3
    await asyncio.sleep(0.3)  # let the log catch up
    off1 = log_size()
    worker = gnl.create_worker(storage, {"noop": noop}, concurrency=conc)
    q0 = storage.query_count
    t0 = time.perf_counter()
    res = await worker.drain()
    drain = (time.perf_counter() - t0) * 1e3
    queries = storage.query_count - q0
    await worker.stop()
    await storage.close()
    await asyncio.sleep(0.3)
    assert res.processed == N and res.succeeded == N and done == N, res
    enq_text, drain_text = read_log(off0, off1)
    print(f"N={N} C={conc} orgs={orgs}: {queries} statements in the drain ({queries / N:.3f}/job)")
    report("enqueue_many", enq, enq_text, N, "job")
    claims = max(1, -(-N // conc))
    report(f"drain ({N / drain * 1e3:,.0f} jobs/s)", drain, drain_text, claims, "claim")


async def main() -> None:
    c.header("where gnl's time goes on Postgres (server log durations)", anchor=False, N=N)
    if not os.access(PG_LOG, os.R_OK):
        raise SystemExit(f"cannot read the server log {PG_LOG} (set PG_LOG)")
    for orgs in ORGS:
        for conc in CONCURRENCY:
            await run(conc, orgs)
            c.collect()


if __name__ == "__main__":
    asyncio.run(main())
    c.collect()
