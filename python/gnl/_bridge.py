"""The Python end of the native async bridge (``rust/src/py/mod.rs``: ``spawn``;
``rust/src/py/bridge.rs``).

A native call returns an asyncio future. Its tokio task queues the finished result on its
loop's completion queue (``_native.LoopQueue``, one a loop, made by :func:`queue_for` on the
loop's first native call) and wakes the loop through a descriptor the loop watches
(``add_reader``) when the queue was empty; the queue's ``drain`` runs on the loop thread and
settles the futures. The loop's ``close`` closes its queue (what is queued is dropped, the
descriptor closed); a loop freed without being closed closes it from a finalizer.

A loop that cannot watch a descriptor (Windows' proactor loop) or whose ``close`` cannot be
hooked (a loop class without an instance ``__dict__``) gets no queue: a native thread hands the
outcome over with ``call_soon_threadsafe(resolve, fut, ok, value)``. At interpreter exit,
``quiesce`` stops native threads from entering Python and waits for those inside it (entering
Python while the interpreter finalizes would abort the process).
"""

from __future__ import annotations

import asyncio
import atexit
import weakref
from typing import Any

from . import _native

#: Each loop's queue, None for a loop that has none (the ``call_soon_threadsafe`` path).
_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _native.LoopQueue | None] = (
    weakref.WeakKeyDictionary()
)


def resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Set the outcome of ``fut`` unless it was cancelled meanwhile."""
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def queue_for(loop: asyncio.AbstractEventLoop) -> _native.LoopQueue | None:
    """The completion queue of ``loop`` (made on its first call), or None: no queue."""
    try:
        return _queues[loop]
    except KeyError:
        pass
    except TypeError:  # not weakly referenceable: no finalizer possible
        return None
    q = _attach(loop)
    _queues[loop] = q
    return q


def _attach(loop: asyncio.AbstractEventLoop) -> _native.LoopQueue | None:
    if loop.is_closed():
        return None
    try:
        q = _native.LoopQueue()
    except OSError:
        return None
    try:
        loop.add_reader(q.fileno(), q.drain)
    except (NotImplementedError, AttributeError, ValueError, OSError):
        q.close()
        return None
    # The class's close, reached through a weak reference: no cycle keeps the loop alive.
    cls_close = type(loop).close
    ref = weakref.ref(loop)

    def close() -> None:
        lp = ref()
        try:
            if lp is not None:
                cls_close(lp)
        finally:
            # Not closed: close() raised before closing (a running loop); the queue stays.
            if lp is None or lp.is_closed():
                q.close()

    try:
        loop.close = close  # type: ignore[method-assign]
    except AttributeError:
        loop.remove_reader(q.fileno())
        q.close()
        return None
    weakref.finalize(loop, q.close)
    return q


atexit.register(_native.quiesce, 2_000)
