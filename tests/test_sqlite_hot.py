"""The SQLite queue's hot path (a claim and its outcomes as one call on a raw connection,
at once on the caller's thread when every lock is free): what another process's write lock,
fair lanes and the fencing tokens see of it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import gnl
from _faults import sqlite_path
from _support import all_jobs, job_state

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])


async def test_a_drain_waits_out_another_connections_write_lock(
    store_url: Callable[[], str],
) -> None:
    """While another connection holds the file's write lock, the worker's claims cannot be
    done at once: they wait (async path, busy handler) and the drain still finishes every
    job, each once."""
    url = store_url()
    seen: list[int] = []

    async def handler(payload: dict[str, int], ctx: gnl.JobContext) -> None:
        seen.append(payload["i"])

    async with await gnl.connect(url) as storage:
        jobs = [
            {"type": "t", "payload": {"i": i}, "options": {"id": f"j{i}", "org_id": f"o{i % 3}"}}
            for i in range(60)
        ]
        await gnl.enqueue_many(storage.work, jobs)
        # The lock is held by another process: Python's sqlite3 is another SQLite library
        # than gnl's bundled one, and two of them must not open one file in one process.
        script = (
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('held', flush=True)\n"
            "time.sleep(0.3)\n"
            "c.execute('COMMIT')\n"
        )
        locker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, sqlite_path(url), stdout=asyncio.subprocess.PIPE
        )
        assert locker.stdout is not None and (await locker.stdout.readline()).strip() == b"held"
        held = time.monotonic()
        worker = gnl.create_worker(storage, {"t": handler}, concurrency=1)
        res = await worker.drain()
        await worker.stop()
        assert await asyncio.wait_for(locker.wait(), 30) == 0
        assert time.monotonic() - held >= 0.25
        assert res.processed == 60 and res.succeeded == 60, res
        assert sorted(seen) == list(range(60))
        for i in (0, 31, 59):
            assert await job_state(storage.work, f"j{i}", f"o{i % 3}") == "done"


async def test_one_worker_alone_takes_the_lanes_in_turn(store_url: Callable[[], str]) -> None:
    """One worker at concurrency 1 (its claims done at once, one job each) serves three
    organizations in turn, and an organization that joins later is served next."""
    url = store_url()
    order: list[str] = []

    async with await gnl.connect(url) as storage:

        async def handler(payload: dict[str, str], ctx: gnl.JobContext) -> None:
            order.append(payload["org"])
            if len(order) == 4:
                await gnl.enqueue(storage.work, "t", {"org": "late"}, id="late", org_id="late")

        jobs = [
            {"type": "t", "payload": {"org": o}, "options": {"id": f"{o}{i}", "org_id": o}}
            for o in ("a", "b", "c")
            for i in range(4)
        ]
        await gnl.enqueue_many(storage.work, jobs)
        worker = gnl.create_worker(storage, {"t": handler}, concurrency=1)
        res = await worker.drain()
        await worker.stop()
    assert res.succeeded == 13, res
    # Every round serves each due organization once; the newcomer (ticket 0) comes right
    # after the claim in flight when it arrived (claims run one job ahead).
    assert order.index("late") in (4, 5), order
    rest = [o for o in order if o != "late"]
    assert [set(rest[i : i + 3]) for i in range(0, 12, 3)] == [{"a", "b", "c"}] * 4, order


async def test_a_long_drain_keeps_the_wal_bounded(store_url: Callable[[], str]) -> None:
    """The hot connection's checkpoints run on a thread of their own, and on the committing
    connection only once the WAL holds 8,000 frames, so that it restarts from its start: a
    drain that writes several times as many frames leaves a WAL file (whose size is its
    high-water mark: SQLite does not shrink it) near that bound, with every job done."""
    url = store_url()
    n = 8_000

    async def handler(payload: dict[str, int], ctx: gnl.JobContext) -> None:
        return None

    async with await gnl.connect(url) as storage:
        jobs = [
            {"type": "t", "payload": {"i": i}, "options": {"id": f"j{i}", "org_id": f"o{i % 50}"}}
            for i in range(n)
        ]
        await gnl.enqueue_many(storage.work, jobs)
        worker = gnl.create_worker(storage, {"t": handler}, concurrency=1)
        res = await worker.drain()
        await worker.stop()
        assert res.succeeded == n, res
        frames, done = _wal_frames_and_done(sqlite_path(url))
    assert done == n
    # Over 50 lanes each job's claim and outcome write ~3 pages: ~24,000 frames in all.
    assert frames <= 12_000, frames


def _wal_frames_and_done(path: str) -> tuple[int, int]:
    """The WAL file's size in frames, and the jobs done."""
    # Read first: the last connection to the file to close folds the WAL in and removes it.
    wal = os.path.getsize(path + "-wal")
    # In another process: Python's sqlite3 is another SQLite library than gnl's bundled one,
    # and two of them in one process do not share their POSIX-lock bookkeeping (one may reset
    # the WAL index the other has mapped: a Bus error was seen here).
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1])\n"
        "print(c.execute('PRAGMA page_size').fetchone()[0],\n"
        "      c.execute(\"SELECT count(*) FROM gnl_jobs WHERE state = 'done'\").fetchone()[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, path], capture_output=True, text=True, check=True
    ).stdout.split()
    page, done = int(out[0]), int(out[1])
    return (wal - 32) // (page + 24), done


async def test_short_jobs_at_concurrency_1_run_without_a_task_each(
    store_url: Callable[[], str],
) -> None:
    """One slot, claims at once, handlers that return at once: the worker runs two jobs a
    claim inline, in one task of its own (``Worker._run_pairs``), not in a task per job (and
    a wake-up of its claim loop per job): it made a task or more per job."""
    n = 600

    async def handler(payload: int, ctx: gnl.JobContext) -> int:
        return payload

    async with await gnl.connect(store_url()) as storage:
        await gnl.enqueue_many(storage.work, [{"type": "t", "payload": i} for i in range(n)])
        loop = asyncio.get_running_loop()
        made = 0

        def factory(
            loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
        ) -> asyncio.Task[Any]:
            nonlocal made
            made += 1
            return asyncio.Task(coro, loop=loop, **kw)

        loop.set_task_factory(factory)  # type: ignore[arg-type]
        try:
            res = await gnl.create_worker(storage, {"t": handler}, concurrency=1).drain()
        finally:
            loop.set_task_factory(None)
        assert res == gnl.DrainResult(n, n, 0)
        # A claim that cannot run at once (another lock held) runs its jobs in tasks and a new
        # runner follows: 2-23 tasks in all here (600 before).
        assert made < n / 4, f"{made} tasks for {n} jobs"
        jobs = await all_jobs(storage)
        assert all(j.state == "done" and j.attempts == 1 for j in jobs)
        assert sorted(j.result for j in jobs) == list(range(n))
