"""Helpers shared by the tests (public API only)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import gnl


async def all_jobs(work: gnl.Storage | gnl.WorkStore) -> list[gnl.JobInfo]:
    """Every job of the store, via ``list_all_jobs`` pages."""
    out: list[gnl.JobInfo] = []
    cursor: str | None = None
    while True:
        page = await gnl.list_all_jobs(work, limit=5000, cursor=cursor)
        out.extend(page.items)
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


async def job_count(work: gnl.Storage | gnl.WorkStore) -> int:
    return len(await all_jobs(work))


async def wait_for(
    predicate: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` (sync or async) until it is true; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value: Any = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


async def job_state(work: gnl.Storage, job_id: str, org_id: str | None = None) -> str | None:
    job = await gnl.get_job(work, job_id, org_id=org_id)
    return None if job is None else job.state


async def noop(payload: Any, ctx: gnl.JobContext) -> None:
    return None


# The process that holds a SQLite file's write lock (see ``sqlite_outage``).
_LOCK_HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("ROLLBACK")
"""


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///`` URL (relative to the working directory, or absolute)."""
    assert url.startswith("sqlite:///"), url
    return url[len("sqlite:///") :]


async def sqlite_outage(url: str, seconds: float) -> asyncio.subprocess.Process:
    """Start a store outage of the SQLite store at ``url``: another process takes the file's
    write lock (``BEGIN IMMEDIATE``) and holds it for ``seconds``. Returns once the lock is
    held; ``await proc.wait()`` for its end."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _LOCK_HOLDER,
        sqlite_path(url),
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"locked", line
    return proc
