"""The append-only log of the multi-process proofs' child processes (``_durable_proc.py``,
``_events_proc.py``): every side effect is one line ``<epoch_ms> <pid> <KIND> <fields...>``
written with one ``write(2)`` on an ``O_APPEND`` descriptor, so it is in the file once
:func:`record` returns, even if the process is SIGKILLed right after.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

_fd = -1


def open_log(path: Path) -> None:
    """Append this process's lines to ``path``."""
    global _fd
    _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def record(*fields: object) -> None:
    line = " ".join([str(int(time.time() * 1000)), str(os.getpid()), *map(str, fields)])
    os.write(_fd, (line + "\n").encode())


def exists(path: Path) -> bool:
    return path.exists()


async def wait_file(path: Path, timeout: float = 120.0) -> None:
    """Wait until ``path`` exists; exit the process (status 3) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not exists(path):
        if time.monotonic() > deadline:
            os._exit(3)
        await asyncio.sleep(0.01)
