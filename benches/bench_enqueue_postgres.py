"""Enqueue N jobs in one call on Postgres: ``gnl.enqueue_many`` vs raw asyncpg ``COPY`` and
pgqueuer's batch ``enqueue``, side by side in one run.

The work and the anchors are the peerbench's ``enqueue_30k.py`` (``../shared/peerbench``):
N jobs of type ``import-row``, payload ``{"id": i, "name": f"row {i}", "email":
f"u{i}@example.org"}``, id ``import:{i}``, organization ``acme``. Before every run of every
contender the ``public`` schema is dropped and created again (as the peer script does).

* gnl: ``await gnl.enqueue_many(storage.work, jobs)`` with API.md's job dicts. Timed: the
  call (checking every job, turning payloads into JSON, the statement, the lane update).
  Not timed: ``gnl.connect`` (which creates the schema). Checked: N ids back, N rows.
* ``copy`` (the anchor of the bar): asyncpg ``copy_records_to_table`` of the prebuilt rows
  ``(id, type, json.dumps(payload), org)`` into the peer script's ``rawjobs`` table (id text
  primary key, payload jsonb), in one transaction. As in the peer script, building the rows
  (``json.dumps``) is not timed; ``copy+rows`` is the same with building the rows timed.
* ``unnest``: the peer script's ``INSERT … SELECT FROM unnest($1::text[], …) ON CONFLICT DO
  NOTHING`` of the prebuilt rows into ``rawjobs`` (reference; gnl's statement has this shape).
* ``unnest-gnl``: gnl's own enqueue statement (``ENQUEUE_ONE`` in ``rust/src/store/postgres.rs``:
  the lanes' enqueue locks, the unnest insert into ``gnl_jobs``, the lane upsert), sent
  through asyncpg with the prebuilt rows into the tables ``gnl.connect`` made: the server's
  share of gnl's call, without gnl's client side. A diagnostic, not an anchor.
* ``copy-gnl``: asyncpg ``COPY`` of the prebuilt rows into gnl's ``gnl_jobs`` (its columns,
  indexes and unique key; ``in_order`` true, as gnl writes jobs due at once; no duplicate
  check, no lanes): the floor for gnl's table. A diagnostic.
* ``pgqueuer``: ``Queries(AsyncpgDriver(conn)).enqueue(["import-row"] * N, payload bytes,
  [0] * N, dedupe_key=ids)`` after ``install()``, timed as the peer script times it (the
  argument lists are built inside the timed part), each repetition on a new connection: the
  call a one-off import makes, and what the peer script's median measures (its 5 repetitions
  on one connection are that connection's first 5 executions). Postgres plans those with the
  call's own arrays (a custom plan), which estimates 30,000 rows and so is compiled by the
  JIT (``jit = on`` by default; ~0.3-0.5 s of the call here).
* ``pgqueuer-warm`` (reference): the same call on one connection that has already made it 5
  times, so that Postgres plans it once for any arrays (a generic plan, estimated at a few
  rows: no JIT): what a long-running producer that enqueues batches again and again gets.
  (Before session 4 the bench ran pgqueuer on one connection throughout, so its repetitions
  changed from the first kind to the second after the fifth call and the median depended on
  R.) gnl's calls plan nothing big (``COPY``; its claim function's plans are generic).

A warm-up of ``min(N, 2000)`` jobs per contender, then R repetitions, contenders alternating;
medians. Issue bars: gnl at most 2x ``copy``; pgqueuer at least 5x gnl (judged against
``pgqueuer``, the peer script's measure; ``pgqueuer-warm`` is printed beside it).

Then the peak resident memory that one enqueue_many of N jobs adds, in a fresh subprocess
(gnl, and ``copy+rows`` for reference; and gnl once more under ``tracemalloc``, whose peak
is the Python objects' share), against the payloads' JSON size (sum of
``len(json.dumps(payload))``): VmHWM is reset to the current RSS just before the call and read
just after. The job list is built before (not counted); one small call runs first so that
one-time costs (the pool's first connection, statement preparation) are not counted. The id
list the call returns is built by the call; its size is printed and the figure is shown with
and without it. Issue bar: at most 3x the JSON size.

    N=30000 R=5 .venv/bin/python benches/bench_enqueue_postgres.py
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import _common as c
import _servers as s
import gnl

N = c.env_int("N", 30_000)
R = c.env_int("R", 5)
BAR_COPY = 2.0
BAR_PGQ = 5.0

RAW_TABLE = (
    "DROP TABLE IF EXISTS rawjobs; CREATE TABLE rawjobs(id text PRIMARY KEY, type text, "
    "payload jsonb, org text, created timestamptz DEFAULT now())"
)
RAW_UNNEST = (
    "INSERT INTO rawjobs(id, type, payload, org) SELECT * FROM unnest($1::text[], $2::text[], "
    "$3::jsonb[], $4::text[]) ON CONFLICT (id) DO NOTHING"
)
#: gnl's own enqueue statement (``ENQUEUE_ONE`` in ``rust/src/store/postgres.rs``): the rows,
#: then their lanes, in one statement.
GNL_UNNEST = """
WITH n AS (SELECT floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint AS now_ms),
lk AS (
  SELECT count(pg_advisory_xact_lock(
    hashtextextended('gnl_lane:' || current_schema() || ':' || k.o, 0)))
  FROM (SELECT DISTINCT o FROM unnest($1::text[]) AS o ORDER BY o) AS k
),
ins AS (
  INSERT INTO gnl_jobs (org, id, type, payload, run_at, in_order, state, created_at, updated_at)
  SELECT u.o, u.i, u.t, u.p, coalesce(u.r, n.now_ms + u.d),
         coalesce(u.r, n.now_ms + u.d) = n.now_ms, 'pending', n.now_ms, n.now_ms
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[])
       AS u(o, i, t, p, r, d), n
  WHERE (SELECT * FROM lk) >= 0
  ON CONFLICT (org, id) DO NOTHING
  RETURNING org, run_at
),
ln AS (
  INSERT INTO gnl_lanes (org, next_run_at, served_at)
  SELECT org, min(run_at), 0 FROM ins GROUP BY org ORDER BY org
  ON CONFLICT (org) DO UPDATE SET next_run_at = least(gnl_lanes.next_run_at, excluded.next_run_at)
)
SELECT count(*) FROM ins
"""
GNL_COLS = [
    "org",
    "id",
    "type",
    "payload",
    "run_at",
    "in_order",
    "state",
    "created_at",
    "updated_at",
]

Row = tuple[str, str, str, str]


def make_rows(jobs: list[dict[str, Any]]) -> list[Row]:
    """The peer script's rows: (id, type, payload JSON, org)."""
    return [
        (j["options"]["id"], j["type"], json.dumps(j["payload"]), j["options"]["org_id"])
        for j in jobs
    ]


# -- contenders: each returns the seconds of its timed part, on a fresh schema ------------------


async def run_gnl(jobs: list[dict[str, Any]]) -> tuple[float, int]:
    storage = await gnl.connect(s.PG_URL)
    q0 = storage.query_count
    t0 = time.perf_counter()
    ids = await gnl.enqueue_many(storage.work, jobs)
    dt = time.perf_counter() - t0
    queries = storage.query_count - q0
    await storage.close()
    assert len(ids) == len(jobs), (len(ids), len(jobs))
    count = await s.pg_scalar("SELECT count(*) FROM gnl_jobs")
    assert count == len(jobs), (count, len(jobs))
    return dt, queries


async def run_copy(conn: Any, rows: list[Row], build: list[dict[str, Any]] | None) -> float:
    await conn.execute(RAW_TABLE)
    t0 = time.perf_counter()
    if build is not None:
        rows = make_rows(build)
    async with conn.transaction():
        await conn.copy_records_to_table(
            "rawjobs", records=rows, columns=["id", "type", "payload", "org"]
        )
    dt = time.perf_counter() - t0
    assert await conn.fetchval("SELECT count(*) FROM rawjobs") == len(rows)
    return dt


async def run_unnest(conn: Any, rows: list[Row]) -> float:
    await conn.execute(RAW_TABLE)
    ids, types, payloads, orgs = map(list, zip(*rows, strict=True))
    t0 = time.perf_counter()
    await conn.execute(RAW_UNNEST, ids, types, payloads, orgs)
    dt = time.perf_counter() - t0
    assert await conn.fetchval("SELECT count(*) FROM rawjobs") == len(rows)
    return dt


async def gnl_schema() -> None:
    """gnl's tables, on the fresh ``public``."""
    storage = await gnl.connect(s.PG_URL)
    await storage.close()


async def run_unnest_gnl(conn: Any, rows: list[Row]) -> float:
    await gnl_schema()
    ids, types, payloads, orgs = map(list, zip(*rows, strict=True))
    n = len(rows)
    t0 = time.perf_counter()
    count = await conn.fetchval(GNL_UNNEST, orgs, ids, types, payloads, [None] * n, [0] * n)
    dt = time.perf_counter() - t0
    assert count == n and await conn.fetchval("SELECT count(*) FROM gnl_jobs") == n
    return dt


async def run_copy_gnl(conn: Any, rows: list[Row]) -> float:
    await gnl_schema()
    now = c.now_ms()
    recs = [(r[3], r[0], r[1], r[2], now, True, "pending", now, now) for r in rows]
    t0 = time.perf_counter()
    async with conn.transaction():
        await conn.copy_records_to_table("gnl_jobs", records=recs, columns=GNL_COLS)
    dt = time.perf_counter() - t0
    assert await conn.fetchval("SELECT count(*) FROM gnl_jobs") == len(rows)
    return dt


async def run_pgq(conn: Any | None, rows: list[Row]) -> float:
    """pgqueuer's batch enqueue on ``conn``, or (None) on a new connection."""
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    own = conn is None
    if conn is None:
        conn = await s.pg_connect()
    try:
        q = Queries(AsyncpgDriver(conn))
        await q.install()
        n = len(rows)
        t0 = time.perf_counter()
        await q.enqueue(
            ["import-row"] * n,
            [r[2].encode() for r in rows],
            [0] * n,
            dedupe_key=[r[0] for r in rows],
        )
        dt = time.perf_counter() - t0
        assert await conn.fetchval("SELECT count(*) FROM pgqueuer") == n
    finally:
        if own:
            await conn.close()
    return dt


# -- peak memory (fresh subprocess) ---------------------------------------------------------


async def rss_child(which: str) -> dict[str, Any]:
    jobs = s.make_jobs(N)
    warm = [
        {"type": "import-row", "payload": s.payload(i), "options": {"id": f"w{i}", "org_id": "w"}}
        for i in range(10)
    ]
    await s.pg_fresh()
    probe = s.PeakRss()
    if which in ("gnl", "gnl-py"):
        storage = await gnl.connect(s.PG_URL)
        await gnl.enqueue_many(storage.work, warm)
        gc.collect()
        if which == "gnl-py":  # Python's share only: tracemalloc's peak during the call
            tracemalloc.start()
            ids = await gnl.enqueue_many(storage.work, jobs)
            res = {"py_peak_bytes": tracemalloc.get_traced_memory()[1]}
            tracemalloc.stop()
        else:
            probe.start()
            ids = await gnl.enqueue_many(storage.work, jobs)
            res = probe.stop()
        res["ids_bytes"] = s.ids_size(ids, jobs)
        assert len(ids) == N
        await storage.close()
    else:
        conn = await s.pg_connect()
        await run_copy(conn, make_rows(warm), None)
        await conn.execute(RAW_TABLE)
        gc.collect()
        probe.start()
        rows = make_rows(jobs)
        async with conn.transaction():
            await conn.copy_records_to_table(
                "rawjobs", records=rows, columns=["id", "type", "payload", "org"]
            )
        res = probe.stop()
        res["ids_bytes"] = 0
        await conn.close()
    res["json_bytes"] = s.json_size(jobs)
    return res


# -- main ----------------------------------------------------------------------------------


async def main() -> None:
    c.header(
        "enqueue on Postgres: gnl.enqueue_many vs asyncpg COPY and pgqueuer batch enqueue",
        anchor=False,
        N=N,
        R=R,
        url=s.PG_URL,
    )
    conn = await s.pg_connect()
    warm_conn = await s.pg_connect()
    print(
        f"  PostgreSQL {await s.pg_version()} (jit = {await conn.fetchval('SHOW jit')}), "
        f"asyncpg {s.pkg_version('asyncpg')}, pgqueuer {s.pkg_version('pgqueuer')}",
        flush=True,
    )

    async def fresh() -> None:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")

    names = [
        "gnl",
        "copy",
        "copy+rows",
        "unnest",
        "unnest-gnl",
        "copy-gnl",
        "pgqueuer",
        "pgqueuer-warm",
    ]
    qcount: list[int] = []

    def contenders(
        jobs: list[dict[str, Any]], rows: list[Row]
    ) -> dict[str, Callable[[], Awaitable[float]]]:
        async def g() -> float:
            dt, q = await run_gnl(jobs)
            qcount.append(q)
            return dt

        return {
            "gnl": g,
            "copy": lambda: run_copy(conn, rows, None),
            "copy+rows": lambda: run_copy(conn, rows, jobs),
            "unnest": lambda: run_unnest(conn, rows),
            "unnest-gnl": lambda: run_unnest_gnl(conn, rows),
            "copy-gnl": lambda: run_copy_gnl(conn, rows),
            "pgqueuer": lambda: run_pgq(None, rows),
            "pgqueuer-warm": lambda: run_pgq(warm_conn, rows),
        }

    try:
        warm = s.make_jobs(min(N, 2000))
        for fn in contenders(warm, make_rows(warm)).values():
            await fresh()
            await fn()
        # pgqueuer-warm's connection: 5 more calls, so that its plan is the generic one.
        for _ in range(5):
            await fresh()
            await run_pgq(warm_conn, make_rows(warm))
        c.collect()

        jobs = s.make_jobs(N)
        rows = make_rows(jobs)
        runs = contenders(jobs, rows)
        t: dict[str, list[float]] = {k: [] for k in names}
        for i in range(R):
            for k in names:
                await fresh()
                t[k].append(await runs[k]())
                c.collect()
            print(
                f"  rep {i + 1}/{R}: " + ", ".join(f"{k} {t[k][-1]:.3f}" for k in names) + " s",
                flush=True,
            )
        await fresh()
    finally:
        await conn.close()
        await warm_conn.close()

    m = {k: c.summary(v) for k, v in t.items()}
    for k in names:
        print(f"{k:<12} {c.fmt_s(*m[k])}")
    g = m["gnl"][0]
    r_copy = g / m["copy"][0]
    r_pgq = m["pgqueuer"][0] / g
    print(f"gnl statements per call: {sorted(set(qcount))}")
    print(
        f"ratio gnl/copy       {r_copy:.2f}x  (bar <= {BAR_COPY:.0f}x: "
        f"{'MET' if r_copy <= BAR_COPY else 'NOT MET'})"
    )
    print(f"ratio gnl/copy+rows  {g / m['copy+rows'][0]:.2f}x  (reference)")
    print(f"ratio gnl/unnest     {g / m['unnest'][0]:.2f}x  (reference)")
    print(f"ratio gnl/unnest-gnl {g / m['unnest-gnl'][0]:.2f}x  (gnl's own statement, raw)")
    print(f"ratio gnl/copy-gnl   {g / m['copy-gnl'][0]:.2f}x  (COPY into gnl's table)")
    print(
        f"ratio pgqueuer/gnl   {r_pgq:.2f}x  (bar >= {BAR_PGQ:.0f}x: "
        f"{'MET' if r_pgq >= BAR_PGQ else 'NOT MET'}; a call's first plans, as the peer script)",
        flush=True,
    )
    print(
        f"ratio pgqueuer-warm/gnl {m['pgqueuer-warm'][0] / g:.2f}x  (reference: pgqueuer's "
        "generic plan, after 5 calls on its connection)",
        flush=True,
    )
    rss_report()


def rss_report() -> None:
    res = {w: s.run_child(__file__, ["--rss", w]) for w in ("gnl", "gnl-py", "copy")}
    g = res["gnl"]
    if isinstance(g, str):
        print(f"peak RSS added by enqueue_many: {g}")
        return
    jb = g["json_bytes"]
    print(f"peak RSS added by one call of N={N} (VmHWM, fresh process); payloads' JSON {jb:,} B")
    print(
        f"  gnl enqueue_many     {s.fmt_rss(g, jb)}; still resident after: "
        f"{g['kept_kb'] / 1024:.1f} MiB"
    )
    ids_kb = g["ids_bytes"] / 1024
    without = dict(g, added_kb=g["added_kb"] - ids_kb)
    print(
        f"  gnl without the {N:,} returned ids ({ids_kb / 1024:.1f} MiB of Python objects): "
        f"{s.fmt_rss(without, jb)}"
    )
    py = res["gnl-py"]
    if not isinstance(py, str):
        print(
            f"  of which Python objects (tracemalloc peak, separate run): "
            f"{py['py_peak_bytes'] / 2**20:.1f} MiB; the rest is native (Rust, sqlx buffers)"
        )
    print(f"  copy+rows (anchor)   {s.fmt_rss(res['copy'], jb)}")
    ratio = g["added_kb"] * 1024 / jb
    ratio_wo = without["added_kb"] * 1024 / jb
    print(
        f"  bar <= 3x JSON: {'MET' if ratio <= 3 else 'NOT MET'} counting the returned ids, "
        f"{'MET' if ratio_wo <= 3 else 'NOT MET'} without them",
        flush=True,
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rss":
        out = asyncio.run(rss_child(sys.argv[2]))
        c.collect()
        print(json.dumps(out))
    else:
        asyncio.run(main())
        c.collect()
