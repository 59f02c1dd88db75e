"""The Python end of the native async bridge (``rust/src/py/mod.rs``: ``spawn``).

A native call returns an asyncio future; a native thread hands its outcome to the future's loop
with ``call_soon_threadsafe(resolve, fut, ok, value)``. At interpreter exit, ``quiesce`` stops
native threads from entering Python and waits for those inside it (entering Python while the
interpreter finalizes would abort the process).
"""

from __future__ import annotations

import asyncio
import atexit
from typing import Any

from . import _native


def resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Set the outcome of ``fut`` unless it was cancelled meanwhile."""
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


atexit.register(_native.quiesce, 2_000)
