"""Durable runs (API.md "Durable runs"): steps journaled under a run id.

Today a run is a job's (``JobContext.run_id``) and :func:`run_step` is the mechanism behind
``ctx.step``; workflows, their context and the waker grow here. The store calls are native
(``NativeStore.step_get`` / ``step_put``, the journal's ``gnl_steps`` table).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from . import _native
from .errors import InvalidArgumentError
from .signal import RevocationSignal

__all__ = ["run_step"]


async def run_step(
    native: _native.NativeStore,
    run_id: str,
    signal: RevocationSignal,
    name: str,
    fn: Callable[..., Any],
    *args: Any,
) -> Any:
    """Run ``fn(*args)`` once per ``(run_id, name)`` and journal its result.

    The journal is read first: a recorded result is returned without calling ``fn``. Else
    ``fn`` runs (awaited when it returns an awaitable) and its result is recorded unless
    another executor recorded one first; the first recorded result is returned either way.

    Args:
        native: The store whose journal holds the run.
        run_id: The run's id.
        signal: The run's signal, checked before ``fn`` is called.
        name: The step's name, unique within the run.
        fn: A plain function or a coroutine function; its result must be JSON.
        *args: Passed to ``fn``.

    Returns:
        The recorded result (decoded JSON).

    Raises:
        TypeError: ``name`` is not a str, ``fn`` is not callable, or its result is not JSON
            (nothing is recorded then).
        InvalidArgumentError: ``name`` is empty.
        ExecutionRevokedError: the signal had aborted before the step started.
    """
    if not isinstance(name, str):
        raise TypeError(f"step name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidArgumentError("step name must be a non-empty string")
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    recorded = await native.step_get(run_id, name)
    if recorded is not None:
        return json.loads(recorded)
    signal.raise_if_aborted()
    value = fn(*args)
    if inspect.isawaitable(value):
        value = await value
    kept = await native.step_put(run_id, name, value)
    return json.loads(kept)
