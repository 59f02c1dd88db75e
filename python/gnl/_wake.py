"""Wake-ups (docs/DECISIONS.md, "Wake-ups"): a loop that found nothing to do sleeps until its
poll timer fires or the store says something changed, whichever comes first.

The version of the topic is read *before* the loop looks at the store (``version``) and the
sleep waits for a newer one (``sleep``): a change committed between the look and the sleep
ends the sleep at once. Topics: ``"jobs"`` (enqueue, retry), ``"cancels"`` (cancel_job),
``"events"`` (emit). A change of this process wakes at once; another process's through the
engine's watcher (Postgres LISTEN/NOTIFY, SQLite ``PRAGMA data_version``); on MySQL only the
poll finds it.
"""

from __future__ import annotations

import asyncio

from . import _native


def version(native: _native.NativeStore, topic: str) -> int:
    """The current version of ``topic`` on ``native``'s store."""
    return native.wake_version(topic)


async def sleep(
    native: _native.NativeStore, topic: str, seen: int, ms: int, stop: asyncio.Event
) -> bool:
    """Sleep up to ``ms`` ms, until ``topic`` moved past ``seen`` (returns True) or ``stop``
    is set (False). Returns False on the timeout."""
    if stop.is_set():
        return False
    woke = asyncio.ensure_future(native.wake_wait(topic, seen, ms))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({woke, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not woke.done():
            # The native wait ends on its own (its timeout, or the store's close).
            woke.cancel()
    if woke in done and not woke.cancelled() and woke.exception() is None:
        return bool(woke.result())
    return False
