"""The asyncio <-> tokio bridge's completion queue (``rust/src/py/bridge.rs``, ``gnl._bridge``).

Each loop gets its own queue on its first native call; a closed loop's queue is closed with it
(its descriptor too); a cancelled caller's result is dropped; loops that cannot watch a
descriptor take the ``call_soon_threadsafe`` path. The calls used are native awaitables of a
store: ``wake_wait`` (a timer in tokio, no SQL: it stays in flight as long as asked) and
``now_ms``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import gnl
from gnl import _bridge, _native
from gnl.storage import native_of


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def open_native(url: str) -> Any:
    """A store opened (and its change watcher started) in a loop of its own."""

    async def go() -> Any:
        st = await gnl.connect(url)
        n = native_of(st)
        # Until the watcher has settled (its start may count as a change): from then on the
        # store is quiet and a wait lasts its whole timeout.
        while await n.wake_wait("jobs", n.wake_version("jobs"), 300):
            pass
        return st

    return asyncio.run(go())


def close_store(st: Any) -> None:
    asyncio.run(st.close())


async def many(n: Any, count: int) -> int:
    """``count`` concurrent calls, their timers spread over 1-20 ms: how many resolved."""
    seen = n.wake_version("jobs")
    got = await asyncio.gather(*(n.wake_wait("jobs", seen, 1 + i % 20) for i in range(count)))
    return got.count(False)


def test_each_asyncio_run_gets_its_own_queue_and_every_call_resolves(
    store_url: Callable[[], str],
) -> None:
    st = open_native(store_url())
    n = native_of(st)
    queues: list[Any] = []

    async def run() -> None:
        assert await many(n, 2_000) == 2_000
        assert isinstance(await n.now_ms(), int)
        q = _bridge.queue_for(asyncio.get_running_loop())
        assert q is not None and not q.closed
        queues.append(q)

    try:
        for _ in range(3):
            asyncio.run(run())
    finally:
        close_store(st)
    assert len({id(q) for q in queues}) == 3
    assert all(q.closed for q in queues)


def test_thousands_of_concurrent_calls_on_loops_in_two_threads_all_resolve(
    store_url: Callable[[], str],
) -> None:
    st = open_native(store_url())
    n = native_of(st)
    results: list[int] = []
    errors: list[BaseException] = []

    def thread() -> None:
        try:
            results.append(asyncio.run(many(n, 5_000)))
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=thread) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        close_store(st)
    assert errors == []
    assert results == [5_000, 5_000]


def test_a_loop_closed_with_calls_in_flight_leaks_no_descriptor_and_the_next_loop_works(
    store_url: Callable[[], str],
) -> None:
    st = open_native(store_url())
    n = native_of(st)
    try:
        gc.collect()
        before = fds()
        loop = asyncio.new_event_loop()
        with_loop = fds()  # its selector and self-pipe

        async def start() -> Any:
            seen = n.wake_version("jobs")
            for _ in range(200):
                asyncio.ensure_future(n.wake_wait("jobs", seen, 200))
            await asyncio.sleep(0.02)
            return _bridge.queue_for(asyncio.get_running_loop())

        q = loop.run_until_complete(start())
        assert q is not None and fds() == with_loop + 1  # the queue's descriptor
        loop.close()
        assert q.closed and fds() == before
        time.sleep(0.4)  # the calls finish meanwhile: onto a closed queue, dropped
        assert len(q) == 0 and fds() == before
        assert asyncio.run(many(n, 100)) == 100
        del loop
        gc.collect()
        assert fds() == before
    finally:
        close_store(st)


def test_a_cancelled_call_is_dropped_and_the_others_of_its_batch_resolve(
    store_url: Callable[[], str],
) -> None:
    st = open_native(store_url())
    n = native_of(st)
    problems: list[dict[str, Any]] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: problems.append(ctx))
        # All end at once (one batch); every other one's caller gives up before.
        seen = n.wake_version("jobs")
        tasks = [asyncio.ensure_future(n.wake_wait("jobs", seen, 50)) for _ in range(100)]
        await asyncio.sleep(0.01)
        for t in tasks[::2]:
            t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(d, asyncio.CancelledError) for d in done[::2])
        assert done[1::2] == [False] * 50
        # Cancelled before its result is queued, its result then drained.
        fut = n.now_ms()
        fut.cancel()
        await asyncio.sleep(0.05)
        assert isinstance(await n.now_ms(), int)

    try:
        asyncio.run(run())
    finally:
        close_store(st)
    assert problems == []


class _NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop that cannot watch a descriptor (as Windows' proactor loop)."""

    def add_reader(self, fd: Any, callback: Any, *args: Any) -> None:
        raise NotImplementedError


def test_a_loop_that_cannot_watch_a_descriptor_takes_the_threadsafe_path(
    store_url: Callable[[], str],
) -> None:
    st = open_native(store_url())
    n = native_of(st)

    async def run() -> None:
        assert _bridge.queue_for(asyncio.get_running_loop()) is None
        assert await many(n, 500) == 500
        try:
            await _native.panic_in_task()
        except gnl.GnlError as e:
            assert "panicked" in str(e)
        else:
            raise AssertionError("no GnlError")

    loop = _NoReaderLoop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
        close_store(st)


def test_the_interpreter_exits_cleanly_with_calls_in_flight_on_an_open_loop(
    store_url: Callable[[], str],
) -> None:
    # Calls end after the interpreter began finalizing, queued on a loop never closed: nothing
    # may enter Python then (an abort: "Fatal Python error").
    code = f"""
import asyncio, gnl
from gnl.storage import native_of
loop = asyncio.new_event_loop()
async def main():
    st = await gnl.connect({store_url()!r})
    n = native_of(st)
    seen = n.wake_version("jobs")
    for i in range(500):
        asyncio.ensure_future(n.wake_wait("jobs", seen, 1 + i % 50))
    await asyncio.sleep(0.01)
loop.run_until_complete(main())
print("exiting", flush=True)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "exiting"
    assert "Fatal" not in p.stderr
