"""Drain N jobs with one worker process on MySQL / MariaDB: gnl's worker vs a plain pymysql loop.

The work is ``bench_drain_postgres.py``'s (issue 15, deliverable 5: the drain per engine): N
jobs of type ``noop`` with the peerbench's payloads (``{"id": i, "name": f"row {i}", "email":
f"u{i}@example.org"}``), already enqueued, drained by one process whose handler decodes its
payload and reads a field. Layouts (env ``ORGS``, default ``1,50,1000``): the jobs in one
organization, or over 50 or 1,000 organizations, enqueued organization by organization. The
bench database is dropped and created again before every drain; the jobs are enqueued before
the timed part.

* gnl: ``gnl.enqueue_many`` of the N jobs, then ``gnl.create_worker(storage, {"noop":
  handler}, concurrency=C)`` and ``await worker.drain()``, timed until it returns (every
  outcome written; leases, attempts, fencing tokens and fair lanes on). Checked: N processed
  and succeeded, N rows ``done``. C from env ``C`` (default ``1,10,100``); printed with the
  statements gnl sent per job (``storage.query_count``).
* anchor: a plain ``pymysql`` loop on one connection (autocommit off, ``READ COMMITTED`` as
  gnl's sessions), on a table with gnl's job columns and indexes
  (``bench_enqueue_mysql.ANCHOR_TABLE``), one job per claim, the ``2tx`` loop of
  ``bench_drain_sqlite.py``: ``SELECT`` the oldest due pending job ``FOR UPDATE SKIP
  LOCKED``; ``UPDATE`` it to running (attempts + 1, a new fencing token, a lease of 30 s, the
  owner); ``COMMIT``; decode the payload and call the handler; ``UPDATE`` it to done where the
  token still matches; ``COMMIT``. One FIFO: no lanes, so the many-organization layouts cost
  it nothing; rows inserted with ``executemany`` before the timed part. MySQL has no peer
  library in the peerbench; the issue sets no MySQL drain bar.

A warm-up drain of ``min(N, 2000)`` jobs per contender, then R repetitions, contenders
alternating. Figures are jobs/s (medians); ratio = gnl / anchor.

    N=30000 R=3 .venv/bin/python benches/bench_drain_mysql.py
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import _common as c
import _servers as s
import gnl
from bench_enqueue_mysql import ANCHOR_INSERT, ANCHOR_TABLE

N = c.env_int("N", 30_000)
R = c.env_int("R", 3)
CONCURRENCY = c.env_ints("C", "1,10,100")
ORGS = c.env_ints("ORGS", "1,50,1000")
TTL_MS = 30_000
SUFFIX = "drain"
DB = f"{s.mysql_params()['database']}_{SUFFIX}"


def rows(n: int, orgs: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(org, id, payload) of each job, in blocks: org0's jobs first, then org1's..."""
    per = -(-n // orgs)
    return [("acme" if orgs == 1 else f"org{i // per}", f"job:{i}", s.payload(i)) for i in range(n)]


# -- gnl -------------------------------------------------------------------------------------


async def gnl_drain(n: int, orgs: int, conc: int) -> tuple[float, float]:
    """Seconds to drain, statements per job."""
    url = s.mysql_fresh(SUFFIX)
    storage = await gnl.connect(url)
    jobs = [
        {"type": "noop", "payload": p, "options": {"id": jid, "org_id": org}}
        for org, jid, p in rows(n, orgs)
    ]
    ids = await gnl.enqueue_many(storage.work, jobs)
    assert len(ids) == n
    seen = 0

    async def noop(payload: Any, ctx: gnl.JobContext) -> None:
        nonlocal seen
        seen += payload["id"] >= 0

    dt, per_job = await c.timed_drain(storage, {"noop": noop}, n, concurrency=conc, ttl_ms=TTL_MS)
    assert seen == n, (seen, n)
    done = s.mysql_scalar(f"SELECT count(*) FROM `{DB}`.gnl_jobs WHERE state = 'done'")
    assert done == n, (done, n)
    return dt, per_job


# -- anchor ----------------------------------------------------------------------------------

CLAIM_SELECT = (
    "SELECT seq, lease_token, type, payload FROM rawjobs "
    "WHERE state = 'pending' AND run_at <= %s ORDER BY run_at, seq LIMIT 1 "
    "FOR UPDATE SKIP LOCKED"
)
CLAIM_UPDATE = (
    "UPDATE rawjobs SET state = 'running', attempts = attempts + 1, lease_token = %s, "
    "lease_expires_at = %s, lease_owner = %s, updated_at = %s WHERE seq = %s"
)
COMPLETE = (
    "UPDATE rawjobs SET state = 'done', result = NULL, finished_at = %s, updated_at = %s, "
    "lease_expires_at = NULL, lease_owner = NULL "
    "WHERE seq = %s AND lease_token = %s AND state = 'running'"
)
#: The anchor's due index: the loop is one FIFO by (run_at, seq) over pending jobs.
ANCHOR_DUE = "CREATE INDEX rawjobs_fifo ON rawjobs (state, run_at, seq)"


def anchor_handler(payload: Any) -> None:
    assert payload["id"] >= 0


def anchor_fill(n: int, orgs: int) -> Any:
    s.mysql_fresh(SUFFIX)
    conn = s.mysql_connect()
    conn.autocommit(False)
    cur = conn.cursor()
    cur.execute(f"USE `{DB}`")
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cur.execute(ANCHOR_TABLE)
    cur.execute(ANCHOR_DUE)
    now = c.now_ms()
    cur.executemany(
        ANCHOR_INSERT,
        [
            (org, jid, "noop", json.dumps(p), now, "pending", now, now)
            for org, jid, p in rows(n, orgs)
        ],
    )
    conn.commit()
    return conn


def anchor_drain(n: int, orgs: int) -> float:
    conn = anchor_fill(n, orgs)
    cur = conn.cursor()
    owner = f"anchor:{os.getpid()}"
    handlers = {"noop": anchor_handler}
    done = 0
    t0 = time.perf_counter()
    while True:
        now = c.now_ms()
        cur.execute(CLAIM_SELECT, (now,))
        row = cur.fetchone()
        if row is None:
            conn.commit()
            break
        seq, token, typ, payload = row
        token += 1
        cur.execute(CLAIM_UPDATE, (token, now + TTL_MS, owner, now, seq))
        conn.commit()
        handlers[typ.decode() if isinstance(typ, bytes) else typ](json.loads(payload))
        now = c.now_ms()
        cur.execute(COMPLETE, (now, now, seq, token))
        conn.commit()
        done += 1
    dt = time.perf_counter() - t0
    cur.execute("SELECT count(*) FROM rawjobs WHERE state = 'done'")
    (count,) = cur.fetchone()
    conn.close()
    assert done == n and count == n, (done, count, n)
    return dt


# -- main ------------------------------------------------------------------------------------


async def main() -> None:
    c.header(
        "drain JSON-payload jobs on MySQL, one process: gnl worker vs a plain pymysql loop",
        N=N,
        R=R,
        C=CONCURRENCY,
        ORGS=ORGS,
        url=s.MYSQL_URL,
    )
    print(f"  {s.mysql_version()}, pymysql {s.pkg_version('pymysql')}", flush=True)
    try:
        nw = min(N, 2000)
        anchor_drain(nw, 1)
        for k in CONCURRENCY:
            await gnl_drain(nw, 1, k)
        c.collect()
        lines: list[str] = []
        for orgs in ORGS:
            a: list[float] = []
            g: dict[int, list[float]] = {k: [] for k in CONCURRENCY}
            spj: dict[int, float] = {}
            for i in range(R):
                a.append(N / anchor_drain(N, orgs))
                c.collect()
                for k in CONCURRENCY:
                    dt, spj[k] = await gnl_drain(N, orgs, k)
                    g[k].append(N / dt)
                    c.collect()
                parts = [f"anchor {a[-1]:,.0f}"] + [f"gnl C={k} {g[k][-1]:,.0f}" for k in g]
                print(f"  orgs={orgs} rep {i + 1}/{R}: " + ", ".join(parts) + " jobs/s", flush=True)
            am = c.summary(a)
            lines.append(f"organizations={orgs}")
            lines.append(f"  {'anchor 2tx':<11} {c.fmt_rate(*am)}")
            for k in CONCURRENCY:
                m = c.summary(g[k])
                lines.append(
                    f"  {'gnl C=' + str(k):<11} {c.fmt_rate(*m)}; ratio {m[0] / am[0]:.2f}x vs "
                    f"the loop; {spj[k]:.3f} statements/job"
                )
        print("\n".join(lines), flush=True)
    finally:
        s.mysql_drop(SUFFIX)


if __name__ == "__main__":
    asyncio.run(main())
    c.collect()
