"""The one check of a user's handler or workflow function, at registration (API.md: handlers
and workflows are ``async def``; a step's function may be either)."""

from __future__ import annotations

import inspect
from typing import Any


def require_async(fn: Any, what: str) -> None:
    """Refuse ``fn`` unless calling it gives a coroutine.

    A plain function passed where gnl awaits a handler would run its side effects, then fail
    the attempt (``object ... can't be used in 'await' expression``) and be retried: each
    attempt repeating those side effects. Accepted: an ``async def`` function, a
    ``functools.partial`` of one, an object whose ``__call__`` is ``async def``.

    Args:
        fn: The object given as the handler or workflow.
        what: What it is, for the message (``"the handler for 'resize'"``).

    Raises:
        TypeError: ``fn`` is not callable, or is a plain (not ``async``) function; the message
            names ``what`` and shows how to wrap a blocking function.
    """
    if not callable(fn):
        raise TypeError(f"{what} is not callable (got {type(fn).__name__})")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    ):
        return
    raise TypeError(
        f"{what} must be an async function (async def), not a plain function: gnl awaits it. "
        "Wrap blocking code: async def h(*args): return await asyncio.to_thread(fn, *args)"
    )
