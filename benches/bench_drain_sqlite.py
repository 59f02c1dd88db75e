"""Drain N no-op jobs with one worker process on SQLite: gnl's worker vs a plain ``sqlite3`` loop.

The work is the peerbench's ``drain.py`` (``../shared/peerbench``) on SQLite: N jobs of type
``noop`` (payload ``{"i": i}``), already enqueued, drained by one process whose handler does
nothing. Layouts: every job in one organization (one lane), and the jobs spread round-robin
over 50 and 1,000 organizations (as many lanes, to show what fair lanes cost). Env ``ORGS``
lists the layouts (default ``1,50,1000``).

* gnl: ``gnl.create_worker(storage, {"noop": handler}, concurrency=C)`` then
  ``await worker.drain()`` (leases, attempts, fencing tokens and fair lanes all on; outcomes
  group-committed). Timed: ``drain()`` until it returns (every outcome written). C from env
  ``C`` (default ``1,10,16,32,100``). The queries gnl sent per job (``storage.query_count``)
  are shown.
* anchor: a plain Python ``sqlite3`` loop on a table with gnl's job columns and indexes and
  the pragmas gnl sets (``_common.py``), one job per claim, two readings:

  - ``2tx`` (the anchor the bar is checked against): ``BEGIN IMMEDIATE``; ``SELECT`` the oldest
    due pending job; ``UPDATE`` it to running (attempts + 1, a new fencing token, a lease of
    30 s, the owner); ``COMMIT``; decode the payload and call the no-op handler; ``BEGIN
    IMMEDIATE``; ``UPDATE`` it to done where the token still matches; ``COMMIT``. The claim is
    committed before the handler runs, as a lease requires.
  - ``1tx``: the same statements with claim and completion in one transaction (the handler
    runs inside it, holding the write lock: no real lease). Shown for reference.

  The loop is one FIFO: no lanes, so the many-organization layouts cost it nothing. Both
  sides decode the same JSON payload of every job.

Jobs are enqueued beforehand with ``gnl.enqueue_many`` (gnl) and ``executemany`` (anchor) into
a template file per layout, not timed; each repetition drains a fresh copy of it. A warm-up
drain of ``min(N, 2000)`` jobs per contender comes first; then R repetitions, contenders
alternating. Figures are jobs/s; ratio = gnl jobs/s / anchor jobs/s. Issue bar: gnl at least
as fast as the plain loop (ratio >= 1).

    N=30000 R=3 .venv/bin/python benches/bench_drain_sqlite.py
    N=10000 R=1 C=1,16,100 ORGS=1,50 .venv/bin/python benches/bench_drain_sqlite.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import _common as c
import gnl

N = c.env_int("N", 30_000)
R = c.env_int("R", 3)
CONCURRENCY = c.env_ints("C", "1,10,16,32,100")
ORGS = c.env_ints("ORGS", "1,50,1000")
ANCHORS = ("2tx", "1tx")
PRIMARY = "2tx"
TTL_MS = 30_000


def job_rows(n: int, orgs: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(org, id, payload) of each job, organizations round-robin."""
    return [(f"org{i % orgs}", f"job:{i}", {"i": i}) for i in range(n)]


# -- templates -------------------------------------------------------------------------------


async def gnl_template(path: Path, n: int, orgs: int) -> None:
    jobs = [
        {"type": "noop", "payload": payload, "options": {"id": jid, "org_id": org}}
        for org, jid, payload in job_rows(n, orgs)
    ]
    async with await gnl.connect(c.sqlite_url(path)) as storage:
        ids = await gnl.enqueue_many(storage.work, jobs)
        assert len(ids) == n


def anchor_template(path: Path, n: int, orgs: int) -> None:
    conn = c.anchor_connect(path, create=True)
    now = c.now_ms()
    rows = [
        (org, jid, "noop", json.dumps(payload), now, now, now)
        for org, jid, payload in job_rows(n, orgs)
    ]
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(c.ANCHOR_INSERT, rows)
    conn.execute("COMMIT")
    conn.close()


def count_done(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        (n,) = conn.execute(f"SELECT count(*) FROM {table} WHERE state = 'done'").fetchone()
    finally:
        conn.close()
    return int(n)


# -- gnl -------------------------------------------------------------------------------------


async def noop(payload: Any, ctx: gnl.JobContext) -> None:
    return None


async def gnl_drain(path: Path, concurrency: int, n: int) -> tuple[float, float]:
    """Seconds to drain, and queries sent per job."""
    storage = await gnl.connect(c.sqlite_url(path))
    return await c.timed_drain(storage, {"noop": noop}, n, concurrency=concurrency, ttl_ms=TTL_MS)


def gnl_run(path: Path, concurrency: int, n: int) -> tuple[float, float]:
    dt, qpj = asyncio.run(gnl_drain(path, concurrency, n))
    c.collect()
    done = count_done(path, "gnl_jobs")
    assert done == n, (done, n)
    return dt, qpj


# -- anchor ----------------------------------------------------------------------------------

CLAIM_SELECT = (
    "SELECT seq, lease_token, type, payload FROM jobs "
    "WHERE state = 'pending' AND run_at <= ? ORDER BY run_at, seq LIMIT 1"
)
CLAIM_UPDATE = (
    "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_token = ?, "
    "lease_expires_at = ?, lease_owner = ?, updated_at = ? WHERE seq = ?"
)
COMPLETE = (
    "UPDATE jobs SET state = 'done', result = NULL, finished_at = ?, updated_at = ?, "
    "lease_expires_at = NULL, lease_owner = NULL "
    "WHERE seq = ? AND lease_token = ? AND state = 'running'"
)


def anchor_handler(payload: Any) -> None:
    return None


def anchor_drain(path: Path, mode: str) -> tuple[float, int]:
    conn = c.anchor_connect(path, create=False)
    owner = f"anchor:{os.getpid()}"
    handlers = {"noop": anchor_handler}
    one_tx = mode == "1tx"
    done = 0
    t0 = time.perf_counter()
    while True:
        now = c.now_ms()
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(CLAIM_SELECT, (now,)).fetchone()
        if row is None:
            conn.execute("COMMIT")
            break
        seq, token, typ, payload = row
        token += 1
        conn.execute(CLAIM_UPDATE, (token, now + TTL_MS, owner, now, seq))
        if not one_tx:
            conn.execute("COMMIT")
        handlers[typ](json.loads(payload))
        now = c.now_ms()
        if not one_tx:
            conn.execute("BEGIN IMMEDIATE")
        conn.execute(COMPLETE, (now, now, seq, token))
        conn.execute("COMMIT")
        done += 1
    dt = time.perf_counter() - t0
    conn.close()
    return dt, done


def anchor_run(path: Path, mode: str, n: int) -> float:
    dt, done = anchor_drain(path, mode)
    assert done == n and count_done(path, "jobs") == n, (done, n)
    return dt


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    c.header(
        "drain no-op jobs on SQLite, one process: gnl worker vs a plain sqlite3 loop",
        N=N,
        R=R,
        C=CONCURRENCY,
        ORGS=ORGS,
    )
    work = c.Workdir()
    try:
        nw = min(N, 2000)
        gt, at = work.fresh("warm-gnl-tpl"), work.fresh("warm-anchor-tpl")
        asyncio.run(gnl_template(gt, nw, 1))
        anchor_template(at, nw, 1)
        c.collect()
        for mode in ANCHORS:
            p = work.copy_db(at, "warm-anchor")
            anchor_run(p, mode, nw)
            work.remove_db(p)
        for conc in CONCURRENCY:
            p = work.copy_db(gt, "warm-gnl")
            gnl_run(p, conc, nw)
            work.remove_db(p)

        lines: list[str] = []
        for orgs in ORGS:
            gt, at = work.fresh(f"gnl-tpl-{orgs}"), work.fresh(f"anchor-tpl-{orgs}")
            asyncio.run(gnl_template(gt, N, orgs))
            anchor_template(at, N, orgs)
            c.collect()
            a: dict[str, list[float]] = {m: [] for m in ANCHORS}
            g: dict[int, list[float]] = {k: [] for k in CONCURRENCY}
            qpj: dict[int, float] = {}
            for i in range(R):
                for mode in ANCHORS:
                    p = work.copy_db(at, "anchor")
                    a[mode].append(N / anchor_run(p, mode, N))
                    work.remove_db(p)
                for conc in CONCURRENCY:
                    p = work.copy_db(gt, "gnl")
                    dt, qpj[conc] = gnl_run(p, conc, N)
                    g[conc].append(N / dt)
                    work.remove_db(p)
                parts = [f"anchor {m} {a[m][-1]:,.0f}" for m in ANCHORS]
                parts += [f"gnl C={k} {g[k][-1]:,.0f}" for k in CONCURRENCY]
                print(f"  orgs={orgs} rep {i + 1}/{R}: " + ", ".join(parts) + " jobs/s", flush=True)
            amed = {m: c.summary(a[m]) for m in ANCHORS}
            lines.append(f"organizations={orgs} ({orgs} lane{'s' if orgs > 1 else ''})")
            for m in ANCHORS:
                lines.append(f"  {'anchor ' + m:<11} {c.fmt_rate(*amed[m])}")
            for k in CONCURRENCY:
                s = c.summary(g[k])
                ratios = ", ".join(f"{s[0] / amed[m][0]:.2f}x vs {m}" for m in ANCHORS)
                met = "MET" if s[0] >= amed[PRIMARY][0] else "NOT MET"
                lines.append(
                    f"  {'gnl C=' + str(k):<11} {c.fmt_rate(*s)}; ratio {ratios} "
                    f"(bar >= 1x {PRIMARY}: {met}); {qpj[k]:.2f} queries/job"
                )
            work.remove_db(gt)
            work.remove_db(at)
        print("\n".join(lines), flush=True)
    finally:
        work.cleanup()
        c.collect()


if __name__ == "__main__":
    main()
