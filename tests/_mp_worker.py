"""A worker process of the multi-process tests (``python _mp_worker.py MODE URL DIR``).

The process connects, creates its worker, writes ``DIR/ready-<pid>`` and waits for ``DIR/go``
(so that every process of a test starts claiming at the same moment). Each handler run appends
lines ``<monotonic_ns> <KIND> <job_id> <attempt> [extra...]`` to ``DIR/log-<pid>`` with one
``write(2)`` on an ``O_APPEND`` descriptor: a line is in the file once the call returns, even if
the process is SIGKILLed right after (no user-space buffer). ``time.monotonic_ns`` is the
machine-wide CLOCK_MONOTONIC, so the lines of all processes (and of the test) can be ordered.

Modes:
  drain  the handler writes ``H job_id attempt run_id`` and returns its pid; the process runs
         ``worker.drain()`` once and writes ``[processed, succeeded, failed, pending]`` to
         ``DIR/drained-<pid>``: the DrainResult and the number of jobs pending just after
         ``drain()`` returned.
  step   the handler writes ``S job_id attempt run_id``, then its side effect runs inside
         ``ctx.step("effect", ...)``: the step function writes ``E job_id attempt token`` and
         returns the token; after the step ``J job_id attempt recorded_token`` (the recorded
         token, which differs from this run's own when another run's result was kept), or
         ``F job_id attempt own_token|- error`` when the step raised; then it sleeps
         ``GNL_MP_HOLD_MS``, writes ``D job_id attempt`` and returns ``{"pid", "attempt",
         "token"}``. The process runs ``worker.start()`` until ``DIR/stop`` exists, then
         ``await worker.stop()``.

Configuration (environment): GNL_MP_CONCURRENCY (16), GNL_MP_TTL_MS (30000),
GNL_MP_MAX_ATTEMPTS (5), GNL_MP_RETRY_DELAY_MS (0), GNL_MP_POLL_MS (20), GNL_MP_MAX_POLL_MS
(poll * 8), GNL_MP_HOLD_MS (0).

Logging: the root logger writes every record of level INFO and up to stderr as
``<epoch seconds> <logger> <LEVEL> <message>`` (the tests read the ``gnl`` logger's records there).
Exit codes: 0 done; 3 a ``go``/``stop`` file did not come in time. The process ends with
``os._exit`` (the interpreter's own shutdown is tested in test_process.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import gnl

CONCURRENCY = int(os.environ.get("GNL_MP_CONCURRENCY", "16"))
TTL_MS = int(os.environ.get("GNL_MP_TTL_MS", "30000"))
MAX_ATTEMPTS = int(os.environ.get("GNL_MP_MAX_ATTEMPTS", "5"))
RETRY_DELAY_MS = int(os.environ.get("GNL_MP_RETRY_DELAY_MS", "0"))
POLL_MS = int(os.environ.get("GNL_MP_POLL_MS", "20"))
MAX_POLL_MS = int(os.environ.get("GNL_MP_MAX_POLL_MS", str(POLL_MS * 8)))
HOLD_MS = int(os.environ.get("GNL_MP_HOLD_MS", "0"))
WAIT_S = 120.0


def exists(path: Path) -> bool:
    return path.exists()


async def wait_file(path: Path) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not exists(path):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def count_pending(storage: gnl.Storage) -> int:
    """The jobs pending now (all due: the tests enqueue no delayed job)."""
    n = 0
    cursor: str | None = None
    while True:
        page = await gnl.list_all_jobs(storage, limit=5000, cursor=cursor)
        n += sum(1 for j in page.items if j.state == "pending")
        cursor = page.next_cursor
        if cursor is None:
            return n


async def main(mode: str, url: str, out: Path) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(created).3f %(name)s %(levelname)s %(message)s",
    )
    pid = os.getpid()
    fd = os.open(out / f"log-{pid}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(*fields: object) -> None:
        os.write(fd, (" ".join([str(time.monotonic_ns()), *map(str, fields)]) + "\n").encode())

    tokens = itertools.count()

    async def drain(payload: Any, ctx: gnl.JobContext) -> int:
        record("H", ctx.job_id, ctx.attempt, ctx.run_id)
        return pid

    async def step(payload: Any, ctx: gnl.JobContext) -> dict[str, Any]:
        record("S", ctx.job_id, ctx.attempt, ctx.run_id)
        own: list[str] = []

        def effect(job_id: str) -> str:
            token = f"{pid}.{next(tokens)}"
            own.append(token)
            record("E", job_id, ctx.attempt, token)
            return token

        try:
            kept = await ctx.step("effect", effect, ctx.job_id)
        except BaseException as e:
            record("F", ctx.job_id, ctx.attempt, own[0] if own else "-", type(e).__name__)
            raise
        record("J", ctx.job_id, ctx.attempt, kept)
        if HOLD_MS:
            await asyncio.sleep(HOLD_MS / 1000)
        record("D", ctx.job_id, ctx.attempt)
        return {"pid": pid, "attempt": ctx.attempt, "token": kept}

    storage = await gnl.connect(url)
    worker = gnl.create_worker(
        storage,
        {"job": drain if mode == "drain" else step},
        ttl_ms=TTL_MS,
        max_attempts=MAX_ATTEMPTS,
        retry_delay_ms=RETRY_DELAY_MS,
        concurrency=CONCURRENCY,
        poll_ms=POLL_MS,
        max_poll_ms=MAX_POLL_MS,
    )
    (out / f"ready-{pid}").touch()
    try:
        if not await wait_file(out / "go"):
            return 3
        if mode == "drain":
            result = await worker.drain()
            pending = await count_pending(storage)
            (out / f"drained-{pid}").write_text(
                json.dumps([result.processed, result.succeeded, result.failed, pending])
            )
            return 0
        worker.start()
        if not await wait_file(out / "stop"):
            return 3
        return 0
    finally:
        await worker.stop()
        await storage.close()
        os.close(fd)


if __name__ == "__main__":
    code = asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
