"""A process that used gnl exits cleanly: the native runtime's threads must not touch the
interpreter while it shuts down (no segfault, no "PyGILState_Release" abort at exit)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import asyncio, sys
import gnl

async def noop(payload, ctx):
    return None

async def main(url, mode):
    storage = await gnl.connect(url)
    await gnl.enqueue(storage, "t", {"n": 1})
    if mode == "worker":
        await gnl.create_worker(storage, {"t": noop}).drain()
    await storage.close()
    print("ok")

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize("mode", ["store", "worker"])
def test_process_exits_cleanly(store_url: Callable[[], str], mode: str) -> None:
    # The crash at exit is intermittent: run several processes at once.
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, store_url(), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(20)
    ]
    outcomes = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        outcomes.append((p.returncode, out.strip(), err.strip()[-300:]))
    bad = [o for o in outcomes if o[0] != 0 or o[1] != "ok"]
    assert not bad, f"{len(bad)} of {len(procs)} processes did not exit cleanly: {bad[:3]}"
