"""Helpers shared by the tests (public API only)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
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


def outdated_sqlite_store(path: str) -> str:
    """A SQLite store at ``path`` one schema version behind this package; returns its URL.

    Made by two child processes, one per library: the native core's SQLite and Python's
    ``sqlite3`` are two libraries, and two libraries on one file in one process break each
    other's POSIX locks (``disk I/O error``, lost writes).
    """
    import subprocess
    import sys

    url = f"sqlite:///{path}"
    steps = (
        "import asyncio, sys, gnl; asyncio.run(gnl.upgrade(sys.argv[1]))",
        "import sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[2])\n"
        "con.execute('update gnl_schema set version = version - 1')\n"
        "con.commit()\n"
        "assert con.execute('select version from gnl_schema').fetchone()[0] >= 1\n"
        "con.close()\n",
    )
    for code in steps:
        subprocess.run([sys.executable, "-c", code, url, path], check=True, timeout=60)
    return url


@contextmanager
def processes(
    script: str, tmp: Path, stop_timeout: float = 30
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Child processes of a multi-process proof: ``spawn(mode, url, *args, **env)`` starts
    ``python script mode url tmp *args`` with ``env`` added to this process's environment.
    On exit ``tmp/stop`` is created and every child is waited for (killed after
    ``stop_timeout`` s)."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(mode: str, url: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            [sys.executable, script, mode, url, str(tmp), *args],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
        )
        procs.append(p)
        return p

    try:
        yield spawn
    finally:
        (tmp / "stop").touch()
        for p in procs:
            try:
                p.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
