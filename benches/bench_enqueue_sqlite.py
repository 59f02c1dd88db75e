"""Enqueue N jobs in one call on SQLite: ``gnl.enqueue_many`` vs a hand-written ``sqlite3`` insert.

The work is the peerbench's ``enqueue_30k.py`` row set (``../shared/peerbench``): N jobs of
type ``import-row``, payload ``{"id": i, "name": f"row {i}", "email": f"u{i}@example.org"}``,
id ``import:{i}``, organization ``acme``, into a fresh SQLite file.

* gnl: ``await gnl.enqueue_many(storage.work, jobs)`` with the jobs as API.md's dicts
  (``{"type", "payload", "options": {"id", "org_id"}}``). Timed: the call (checking and
  converting every job, one transaction, the lane update). Not timed: ``gnl.connect``, which
  creates the schema.
* anchor: Python's ``sqlite3``, the same job list turned into rows (``json.dumps`` of each
  payload included in the timed part), ``executemany`` of an ``INSERT ... ON CONFLICT (org, id)
  DO NOTHING`` into a table with gnl's job columns and indexes, inside one ``BEGIN IMMEDIATE``
  ... ``COMMIT``, with the pragmas gnl sets (see ``_common.py``). Not timed: creating the table.

Each repetition uses a new database file; gnl and the anchor alternate. A warm-up run of each
(``min(N, 2000)`` jobs) comes first. Then, in a fresh subprocess per contender, the peak
resident memory that the call adds: VmHWM is reset to the current RSS (``echo 5 >
/proc/self/clear_refs``) just before the call and read after it, so Rust allocations, which
``tracemalloc`` does not see, are counted.

Issue bar: gnl's median at most 2x the anchor's.

    N=30000 R=5 .venv/bin/python benches/bench_enqueue_sqlite.py
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common as c
import gnl

N = c.env_int("N", 30_000)
R = c.env_int("R", 5)
BAR = 2.0


def make_jobs(n: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "import-row",
            "payload": {"id": i, "name": f"row {i}", "email": f"u{i}@example.org"},
            "options": {"id": f"import:{i}", "org_id": "acme"},
        }
        for i in range(n)
    ]


# -- gnl -------------------------------------------------------------------------------------


async def gnl_setup(path: Path) -> gnl.Storage:
    return await gnl.connect(c.sqlite_url(path))


async def gnl_check_and_close(storage: gnl.Storage, ids: list[str], n: int) -> None:
    assert len(ids) == n, (len(ids), n)
    await storage.close()


async def gnl_once(path: Path, jobs: list[dict[str, Any]]) -> float:
    storage = await gnl_setup(path)
    t0 = time.perf_counter()
    ids = await gnl.enqueue_many(storage.work, jobs)
    dt = time.perf_counter() - t0
    await gnl_check_and_close(storage, ids, len(jobs))
    return dt


# -- anchor ------------------------------------------------------------------------------------


def anchor_insert(conn: Any, jobs: list[dict[str, Any]]) -> None:
    now = c.now_ms()
    rows = [
        (
            j["options"]["org_id"],
            j["options"]["id"],
            j["type"],
            json.dumps(j["payload"]),
            now,
            now,
            now,
        )
        for j in jobs
    ]
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(c.ANCHOR_INSERT, rows)
    conn.execute("COMMIT")


def anchor_check_and_close(conn: Any, n: int) -> None:
    (count,) = conn.execute("SELECT count(*) FROM jobs").fetchone()
    assert count == n, (count, n)
    conn.close()


def anchor_once(path: Path, jobs: list[dict[str, Any]]) -> float:
    conn = c.anchor_connect(path, create=True)
    t0 = time.perf_counter()
    anchor_insert(conn, jobs)
    dt = time.perf_counter() - t0
    anchor_check_and_close(conn, len(jobs))
    return dt


# -- peak memory (run in a fresh subprocess) ---------------------------------------------------


def rss_child(which: str, path: Path) -> None:
    """Print the peak RSS (kB) that one call adds, in this fresh process."""
    jobs = make_jobs(N)

    async def run_gnl() -> tuple[int, bool]:
        storage = await gnl_setup(path)
        base = c.proc_status_kb("VmRSS")
        exact = c.reset_peak_rss()
        hwm0 = c.proc_status_kb("VmHWM")
        ids = await gnl.enqueue_many(storage.work, jobs)
        added = c.proc_status_kb("VmHWM") - (base if exact else hwm0)
        await gnl_check_and_close(storage, ids, N)
        return added, exact

    if which == "gnl":
        added, exact = asyncio.run(run_gnl())
    else:
        conn = c.anchor_connect(path, create=True)
        base = c.proc_status_kb("VmRSS")
        exact = c.reset_peak_rss()
        hwm0 = c.proc_status_kb("VmHWM")
        anchor_insert(conn, jobs)
        added = c.proc_status_kb("VmHWM") - (base if exact else hwm0)
        anchor_check_and_close(conn, N)
    c.collect()
    print(json.dumps({"added_kb": added, "exact": exact}))


def peak_rss_added(which: str, work: c.Workdir) -> str:
    path = work.fresh(f"rss-{which}")
    out = subprocess.run(
        [sys.executable, __file__, "--rss", which, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    work.remove_db(path)
    if out.returncode != 0 or not out.stdout.strip():
        return f"(measurement failed, exit {out.returncode}: {out.stderr.strip()[-200:]})"
    res = json.loads(out.stdout.strip().splitlines()[-1])
    how = "" if res["exact"] else " (lower bound: VmHWM could not be reset)"
    return f"{res['added_kb'] / 1024:.1f} MiB{how}"


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    c.header("enqueue on SQLite: gnl.enqueue_many vs sqlite3 executemany", N=N, R=R)
    work = c.Workdir()
    try:
        warm = make_jobs(min(N, 2000))
        asyncio.run(gnl_once(work.fresh("warm-gnl"), warm))
        anchor_once(work.fresh("warm-anchor"), warm)
        c.collect()

        jobs = make_jobs(N)
        g: list[float] = []
        a: list[float] = []
        for i in range(R):
            p = work.fresh("gnl")
            g.append(asyncio.run(gnl_once(p, jobs)))
            work.remove_db(p)
            c.collect()
            p = work.fresh("anchor")
            a.append(anchor_once(p, jobs))
            work.remove_db(p)
            c.collect()
            print(f"  rep {i + 1}/{R}: gnl {g[-1]:.3f} s, anchor {a[-1]:.3f} s", flush=True)

        gs, as_ = c.summary(g), c.summary(a)
        ratio = gs[0] / as_[0]
        print(f"gnl enqueue_many      {c.fmt_s(*gs)}")
        print(f"anchor executemany    {c.fmt_s(*as_)}")
        met = "MET" if ratio <= BAR else "NOT MET"
        print(f"ratio gnl/anchor      {ratio:.2f}x  (bar <= {BAR:.0f}x: {met})")
        rss_g, rss_a = peak_rss_added("gnl", work), peak_rss_added("anchor", work)
        print(f"peak RSS added by the call (VmHWM, fresh process): gnl {rss_g}, anchor {rss_a}")
    finally:
        work.cleanup()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--rss":
        rss_child(sys.argv[2], Path(sys.argv[3]))
    else:
        main()
