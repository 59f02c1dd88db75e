"""A poller process of the scheduler proofs (``python _sched_proc.py URL DIR``).

Runs ``gnl.create_scheduler`` (poll 20 ms, lock TTL ``GNL_TEST_TTL_MS``, default 1,500 ms)
until ``DIR/stop`` exists. Its runner appends ``F <run_id> <scheduled_for> <store_now>`` to
``DIR/log`` with one ``write(2)`` on an ``O_APPEND`` descriptor, so a line is in the file once
written even if the process is SIGKILLed right after. With ``GNL_HOLD=1`` the runner writes
``H <run_id>`` after its ``F`` line and blocks (the test kills the process).

``GNL_TEST_CLOCK_OFFSET_MS`` (test only) shifts this process's own clock (``time.time``,
``time.time_ns``, ``datetime.now``): a poller on a machine whose clock is off. Due and lock
decisions must not see it (they use the store's clock).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

OFFSET_MS = int(os.environ.get("GNL_TEST_CLOCK_OFFSET_MS", "0"))
if OFFSET_MS:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + OFFSET_MS / 1000
    time.time_ns = lambda: _time_ns() + OFFSET_MS * 1_000_000

import gnl  # noqa: E402

HOLD = os.environ.get("GNL_HOLD") == "1"
TTL_MS = int(os.environ.get("GNL_TEST_TTL_MS", "1500"))


def stopped(tmp: Path) -> bool:
    return (tmp / "stop").exists()


async def main(url: str, tmp: Path) -> None:
    fd = os.open(tmp / "log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    async with await gnl.connect(url) as storage:

        class Runner:
            async def run_workflow(
                self, name: str, *, run_id: str, input: Any, scheduled_for: Any, signal: Any
            ) -> None:
                now = await storage.now_ms()
                os.write(fd, f"F {run_id} {scheduled_for} {now} {os.getpid()}\n".encode())
                if HOLD:
                    os.write(fd, f"H {run_id}\n".encode())
                    await asyncio.sleep(3600)

        s = gnl.create_scheduler(storage, Runner(), poll_ms=20, lock_ttl_ms=TTL_MS)
        s.start()
        while True:
            if stopped(tmp):
                break
            await asyncio.sleep(0.05)
        await s.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
