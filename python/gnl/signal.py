"""``RevocationSignal``: how a handler learns that its right to run has ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .errors import ExecutionRevokedError

__all__ = ["RevocationSignal"]

_WHYS = ("canceled", "lease-lost", "timeout", "shutdown")


class RevocationSignal:
    """Aborted once, with an :class:`ExecutionRevokedError` whose ``why`` says why.

    ``why`` is ``"canceled"`` (``cancel_job``), ``"lease-lost"``, ``"timeout"``
    (``max_hold_ms``) or ``"shutdown"`` (``gnl run``'s grace ran out: :class:`gnl.App`).
    Users may create one and :meth:`abort` it themselves, e.g. to pass it to
    ``run_workflow``. Not thread-safe: use it on its event loop (gnl's native threads reach
    it through ``call_soon_threadsafe``).
    """

    __slots__ = ("_callbacks", "_event", "_reason")

    def __init__(self) -> None:
        self._reason: ExecutionRevokedError | None = None
        self._event: asyncio.Event | None = None
        self._callbacks: list[Callable[[ExecutionRevokedError], None]] = []

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` was called."""
        return self._reason is not None

    @property
    def reason(self) -> ExecutionRevokedError | None:
        """The :class:`ExecutionRevokedError` it aborted with, or None."""
        return self._reason

    def abort(self, why: str = "canceled", message: str | None = None) -> None:
        """Abort with ``why``; later calls change nothing (the first reason is kept).

        Raises:
            InvalidArgumentError: ``why`` is not one of ``canceled``, ``lease-lost``,
                ``timeout``, ``shutdown``.
        """
        if why not in _WHYS:
            from .errors import InvalidArgumentError

            raise InvalidArgumentError(f"why must be one of {', '.join(_WHYS)}, got {why!r}")
        if self._reason is not None:
            return
        self._reason = ExecutionRevokedError(why, message)
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self._reason)

    def add_callback(self, cb: Callable[[ExecutionRevokedError], None]) -> None:
        """Call ``cb(reason)`` when the signal aborts (at once if it has)."""
        if self._reason is not None:
            cb(self._reason)
        else:
            self._callbacks.append(cb)

    async def wait(self) -> ExecutionRevokedError:
        """Wait until the signal aborts; returns its reason."""
        if self._reason is None:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        assert self._reason is not None
        return self._reason

    def raise_if_aborted(self) -> None:
        """Raise the signal's :class:`ExecutionRevokedError` if it has aborted."""
        if self._reason is not None:
            raise self._reason

    def __repr__(self) -> str:
        state = f"aborted why={self._reason.why!r}" if self._reason else "live"
        return f"<gnl.RevocationSignal {state}>"
