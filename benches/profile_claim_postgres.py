"""What one Postgres claim costs the server, and per lane (issue 15, diagnostic, no anchor).

A schema per variant gets gnl's tables and N jobs over ORGS organizations through gnl's own
``enqueue_many`` (the bench's jobs, ``bench_drain_postgres.make_jobs``); then one asyncpg
connection calls ``gnl_claim`` the way a worker with one claim in flight does: each call
carries the previous claim's jobs as done and asks for C more, until the queue is empty. Each
call is timed at the client (localhost: the server's time plus one round trip). Printed per
variant and shape: the median, 10th and 90th percentile µs of the drain's full claims (C jobs;
the last, short ones left out), and the whole drain's claims summed (the figure to compare
when variants serve different numbers of lanes a claim). Before migration 0010 a full claim
served min(K, C) lanes, and the cost of a lane served beyond a one-lane claim was (median
over K orgs - median over 1) / (min(K, C) - 1); since, a claim of C > 16 serves
max(16, ceil(C / 4)) of them when each has four jobs due.

Variants (``VARIANTS``, default ``current``): ``current`` is the function gnl's migrations
left; a path to a ``.sql`` file replaces ``gnl_claim`` (and anything else it restates) in the
schema after the fill, e.g. ``rust/migrations/postgres/0006_claim_lanes.sql`` to measure 0008's
recheck against 0006. Variants run interleaved, ``ROUNDS`` rounds, one fresh schema each.

``EXPLAIN=1``: one claim in the middle of the drain is run with auto_explain on (analyze,
buffers, WAL, nested statements, sent back as notices) and its plans printed.

    ORGS=1000 C=100 .venv/bin/python benches/profile_claim_postgres.py
    VARIANTS=current,rust/migrations/postgres/0006_claim_lanes.sql ORGS=50 C=100 \
        .venv/bin/python benches/profile_claim_postgres.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import asyncpg

import _common as c
import _servers as s
import gnl
from bench_drain_postgres import make_jobs

N = c.env_int("N", 30_000)
C = c.env_int("C", 100)
ORGS = c.env_ints("ORGS", "1000")
ROUNDS = c.env_int("ROUNDS", 2)
VARIANTS = os.environ.get("VARIANTS", "current").split(",")
EXPLAIN = os.environ.get("EXPLAIN", "") == "1"
#: The claim's per_org argument (0: a quantum at a time; 1: one job an organization, as a
#: worker's claims over many organizations with two in flight).
PER_ORG = c.env_int("PER_ORG", 0)
SCHEMA = f"profclaim_{os.getpid()}"
SQL = {v: Path(v).read_text() for v in VARIANTS if v != "current"}

# Schema 9 gave gnl_claim a 16th argument (per_org, 0: no cap); a variant from before it is
# called with 15, once 9's function is dropped from its schema.
CLAIM_ARGS = (
    "$1::bigint[], $2::bigint[], $3::text[], '{}', '{}', '{}', '{}',"
    " false, $5, 5, 60000, 'profile', $4::text[], '{}', '{noop}'"
)
DROP_9 = (
    "DROP FUNCTION gnl_claim(bigint[], bigint[], text[], bigint[], bigint[], text[], bigint[],"
    " boolean, bigint, bigint, bigint, text, text[], text[], text[], bigint)"
)


def claim_sql(variant: str) -> str:
    """The claim call for a variant: with per_org 0 when its function takes it."""
    if variant == "current" or "per_org" in SQL[variant]:
        return f"SELECT * FROM gnl_claim({CLAIM_ARGS}, {PER_ORG})"
    return f"SELECT * FROM gnl_claim({CLAIM_ARGS})"


async def drain(orgs: int, variant: str) -> tuple[list[float], list[int]]:
    """Per claim: µs and jobs taken."""
    url = await s.pg_fresh_schema(SCHEMA)
    storage = await gnl.connect(url)
    await gnl.enqueue_many(storage.work, make_jobs(N, orgs))
    await storage.close()
    conn = await asyncpg.connect(s.PG_URL, server_settings={"search_path": SCHEMA})
    notes: list[str] = []
    conn.add_log_listener(lambda _c, m: notes.append(m.message))
    try:
        CLAIM = claim_sql(variant)
        if variant != "current":
            if "per_org" not in SQL[variant]:
                await conn.execute(DROP_9)
            await conn.execute(SQL[variant])
        times: list[float] = []
        lanes: list[int] = []
        done: list = []
        left = N
        k = 0
        while left > 0:
            k += 1
            explain = EXPLAIN and k == (N // C) // 2
            if explain:
                await conn.execute(
                    "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
                    " SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on;"
                    " SET auto_explain.log_wal = on; SET auto_explain.log_nested_statements = on;"
                    " SET auto_explain.log_level = notice; SET client_min_messages = notice"
                )
            args = (
                [r["seq"] for r in done],
                [r["lease_token"] for r in done],
                ["null"] * len(done),
                [r["org"] for r in done],
            )
            t0 = time.perf_counter()
            done = await conn.fetch(CLAIM, *args, C)
            dt = time.perf_counter() - t0
            if explain:
                await conn.execute("SET auto_explain.log_min_duration = -1")
                await asyncio.sleep(0.05)
                print(f"--- auto_explain, claim {k} ({len(done)} jobs), {variant}")
                for n in notes:
                    print(n)
                notes.clear()
            left -= len(done)
            assert done or left == 0, left
            times.append(dt * 1e6)
            lanes.append(len(done))
        await conn.fetch(
            CLAIM,
            [r["seq"] for r in done],
            [r["lease_token"] for r in done],
            ["null"] * len(done),
            [r["org"] for r in done],
            0,
        )
        n = await conn.fetchval("SELECT count(*) FROM gnl_jobs WHERE state = 'done'")
        assert n == N, n
        return times, lanes
    finally:
        await conn.close()


async def main() -> None:
    c.header(
        "claim server time per lane, Postgres",
        anchor=False,
        N=N,
        C=C,
        ORGS=ORGS,
        PER_ORG=PER_ORG,
        VARIANTS=VARIANTS,
    )
    got: dict[tuple[int, str], list[float]] = {}
    try:
        for r in range(ROUNDS):
            for o in ORGS:
                for v in VARIANTS:
                    t, ln = await drain(o, v)
                    # The drain's last claims are short; the full ones (C jobs) are its cost.
                    full = [x for x, m in zip(t, ln, strict=True) if m == C][2:]
                    got.setdefault((o, v), []).extend(full)
                    q = statistics.quantiles(full, n=10)
                    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
                    print(
                        f"  round {r + 1} orgs={o} {v}: median {statistics.median(full):,.0f} us"
                        f" (p10 {q[0]:,.0f}, p90 {q[-1]:,.0f}), {len(full)} full claims;"
                        f" first fifth {statistics.median(full[: len(full) // 5]):,.0f},"
                        f" last fifth {statistics.median(full[-(len(full) // 5) :]):,.0f};"
                        f" whole drain {sum(t) / 1e3:,.0f} ms in {len(t)} claims;"
                        f" load {load}",
                        flush=True,
                    )
    finally:
        await s.pg_drop_schema(SCHEMA)
    for v in VARIANTS:
        for o in ORGS:
            print(f"{v} orgs={o} C={C}: median {statistics.median(got[(o, v)]):,.0f} us a claim")


if __name__ == "__main__":
    asyncio.run(main())
