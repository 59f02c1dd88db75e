"""Enqueue N jobs in one call on MySQL / MariaDB: ``gnl.enqueue_many`` vs a hand-written
``pymysql`` ``executemany``.

The work is the peerbench's ``enqueue_30k.py`` row set (``../shared/peerbench``): N jobs of
type ``import-row``, payload ``{"id": i, "name": f"row {i}", "email": f"u{i}@example.org"}``,
id ``import:{i}``, organization ``acme``. Before every run the bench database is dropped and
created again.

* gnl: ``await gnl.enqueue_many(storage.work, jobs)`` with API.md's job dicts. Timed: the
  call. Not timed: ``gnl.connect`` (which creates the schema). Checked: N ids, N rows.
* anchor: ``pymysql`` (autocommit off), the same job list turned into rows (``json.dumps`` of
  each payload included in the timed part), ``executemany`` of ``INSERT … VALUES (…) ON
  DUPLICATE KEY UPDATE seq = seq`` (duplicates ignored, as gnl does), then ``COMMIT``: one
  transaction. pymysql sends an ``executemany`` of an ``INSERT … VALUES (%s, …)`` as
  multi-row inserts of up to 1 MB each (only when every value is a ``%s``: a literal in the
  ``VALUES`` list makes it fall back to one round trip per row, so ``state`` is a parameter
  too; the bench checks that it batched). The table is gnl's ``gnl_jobs`` as
  ``rust/migrations/mysql/0001_queue.sql`` declares it (columns, generated ``id_key``, unique
  ``(org, id_key)``, the due, lease and listing indexes), without the lanes table. Not timed:
  creating the table.

A warm-up of ``min(N, 2000)`` jobs per contender, then R repetitions, contenders alternating;
medians; ratio gnl / anchor. The issue sets no bar here; the SQLite and Postgres enqueue bars
are 2x their anchor, which is shown for comparison.

Then the peak resident memory that one call adds, in a fresh subprocess per side (VmHWM reset
just before the call and read after it; one small call first, so that the pool's first
connection is not counted), against the payloads' JSON size; the id list the call returns is
shown separately. Issue bar (stated for Postgres, shown here too): at most 3x the JSON size.

    N=30000 R=5 .venv/bin/python benches/bench_enqueue_mysql.py
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from typing import Any

import _common as c
import _servers as s
import gnl

N = c.env_int("N", 30_000)
R = c.env_int("R", 5)
REF_BAR = 2.0

#: gnl_jobs of rust/migrations/mysql/0001_queue.sql, under another name.
ANCHOR_TABLE = """
CREATE TABLE rawjobs (
    seq              BIGINT NOT NULL AUTO_INCREMENT,
    org              VARBINARY(800) NOT NULL,
    id               VARBINARY(4000) NOT NULL,
    id_key           BINARY(32) AS (UNHEX(SHA2(id, 256))) STORED,
    type             VARBINARY(800) NOT NULL,
    payload          LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state            VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,
    max_attempts     BIGINT NOT NULL DEFAULT 5,
    last_error       LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    result           LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    run_at           BIGINT NOT NULL,
    finished_at      BIGINT NULL,
    lease_token      BIGINT NOT NULL DEFAULT 0,
    lease_expires_at BIGINT NULL,
    lease_owner      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    cancel_requested TINYINT NOT NULL DEFAULT 0,
    PRIMARY KEY (seq),
    UNIQUE KEY rawjobs_org_id (org, id_key),
    KEY rawjobs_due (org, state, run_at),
    KEY rawjobs_lease (state, lease_expires_at),
    KEY rawjobs_lane_seq (org, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
"""
ANCHOR_INSERT = (
    "INSERT INTO rawjobs (org, id, type, payload, run_at, state, created_at, updated_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE seq = seq"
)


# -- gnl -------------------------------------------------------------------------------------


async def gnl_once(jobs: list[dict[str, Any]]) -> tuple[float, int]:
    url = s.mysql_fresh()
    storage = await gnl.connect(url)
    q0 = storage.query_count
    t0 = time.perf_counter()
    ids = await gnl.enqueue_many(storage.work, jobs)
    dt = time.perf_counter() - t0
    queries = storage.query_count - q0
    await storage.close()
    assert len(ids) == len(jobs), (len(ids), len(jobs))
    count = s.mysql_scalar("SELECT count(*) FROM gnl_jobs")
    assert count == len(jobs), (count, len(jobs))
    return dt, queries


# -- anchor ----------------------------------------------------------------------------------


def anchor_prepare() -> Any:
    from pymysql.cursors import RE_INSERT_VALUES

    # The statement pymysql's executemany sends as multi-row inserts (not one per row).
    assert RE_INSERT_VALUES.match(ANCHOR_INSERT), "executemany would not batch"
    s.mysql_fresh()
    conn = s.mysql_connect()
    with conn.cursor() as cur:
        cur.execute(ANCHOR_TABLE)
    conn.autocommit(False)
    return conn


def anchor_insert(conn: Any, jobs: list[dict[str, Any]]) -> None:
    now = c.now_ms()
    rows = [
        (
            j["options"]["org_id"],
            j["options"]["id"],
            j["type"],
            json.dumps(j["payload"]),
            now,
            "pending",
            now,
            now,
        )
        for j in jobs
    ]
    with conn.cursor() as cur:
        cur.executemany(ANCHOR_INSERT, rows)
    conn.commit()


def anchor_once(jobs: list[dict[str, Any]]) -> float:
    conn = anchor_prepare()
    try:
        t0 = time.perf_counter()
        anchor_insert(conn, jobs)
        dt = time.perf_counter() - t0
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM rawjobs")
            (count,) = cur.fetchone()
        assert count == len(jobs), (count, len(jobs))
    finally:
        conn.close()
    return dt


# -- peak memory (fresh subprocess) ----------------------------------------------------------


def rss_child(which: str) -> dict[str, Any]:
    jobs = s.make_jobs(N)
    warm = [
        {"type": "import-row", "payload": s.payload(i), "options": {"id": f"w{i}", "org_id": "w"}}
        for i in range(10)
    ]
    probe = s.PeakRss()
    if which == "gnl":

        async def run() -> dict[str, Any]:
            storage = await gnl.connect(s.mysql_fresh())
            await gnl.enqueue_many(storage.work, warm)
            gc.collect()
            probe.start()
            ids = await gnl.enqueue_many(storage.work, jobs)
            res = probe.stop()
            res["ids_bytes"] = s.ids_size(ids, jobs)
            assert len(ids) == N
            await storage.close()
            return res

        res = asyncio.run(run())
    else:
        conn = anchor_prepare()
        anchor_insert(conn, warm)
        gc.collect()
        probe.start()
        anchor_insert(conn, jobs)
        res = probe.stop()
        res["ids_bytes"] = 0
        conn.close()
    res["json_bytes"] = s.json_size(jobs)
    return res


def rss_report() -> None:
    res = {w: s.run_child(__file__, ["--rss", w]) for w in ("gnl", "anchor")}
    g = res["gnl"]
    if isinstance(g, str):
        print(f"peak RSS added by enqueue_many: {g}")
        return
    jb = g["json_bytes"]
    print(f"peak RSS added by one call of N={N} (VmHWM, fresh process); payloads' JSON {jb:,} B")
    print(f"  gnl enqueue_many     {s.fmt_rss(g, jb)}")
    ids_kb = g["ids_bytes"] / 1024
    without = dict(g, added_kb=g["added_kb"] - ids_kb)
    print(
        f"  gnl without the {N:,} returned ids ({ids_kb / 1024:.1f} MiB of Python objects): "
        f"{s.fmt_rss(without, jb)}"
    )
    print(f"  anchor (executemany) {s.fmt_rss(res['anchor'], jb)}")
    ratio = g["added_kb"] * 1024 / jb
    ratio_wo = without["added_kb"] * 1024 / jb
    print(
        f"  bar <= 3x JSON: {'MET' if ratio <= 3 else 'NOT MET'} counting the returned ids, "
        f"{'MET' if ratio_wo <= 3 else 'NOT MET'} without them",
        flush=True,
    )


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    c.header(
        "enqueue on MySQL/MariaDB: gnl.enqueue_many vs pymysql executemany",
        anchor=False,
        N=N,
        R=R,
        url=s.MYSQL_URL,
    )
    print(f"  server {s.mysql_version()}, PyMySQL {s.pkg_version('pymysql')}", flush=True)
    warm = s.make_jobs(min(N, 2000))
    asyncio.run(gnl_once(warm))
    anchor_once(warm)
    c.collect()

    jobs = s.make_jobs(N)
    g: list[float] = []
    a: list[float] = []
    qs: set[int] = set()
    for i in range(R):
        dt, q = asyncio.run(gnl_once(jobs))
        g.append(dt)
        qs.add(q)
        c.collect()
        a.append(anchor_once(jobs))
        c.collect()
        print(f"  rep {i + 1}/{R}: gnl {g[-1]:.3f} s, anchor {a[-1]:.3f} s", flush=True)
    s.mysql_fresh()

    gs, as_ = c.summary(g), c.summary(a)
    ratio = gs[0] / as_[0]
    print(f"gnl enqueue_many      {c.fmt_s(*gs)}; statements per call {sorted(qs)}")
    print(f"anchor executemany    {c.fmt_s(*as_)}")
    print(
        f"ratio gnl/anchor      {ratio:.2f}x  (no bar for MySQL; the SQLite/Postgres bar "
        f"<= {REF_BAR:.0f}x would be {'met' if ratio <= REF_BAR else 'not met'})",
        flush=True,
    )
    rss_report()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rss":
        out = rss_child(sys.argv[2])
        c.collect()
        print(json.dumps(out))
    else:
        main()
        c.collect()
