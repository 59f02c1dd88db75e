"""The error hierarchy of gnl (API.md "Errors"). Defined once, here; the native core raises
these same classes (``rust/src/py/errors.rs``).

Every error derives from :class:`GnlError`, except an argument of the wrong Python type, which
raises plain :class:`TypeError`.
"""

from __future__ import annotations

__all__ = [
    "CronError",
    "ExecutionRevokedError",
    "GnlError",
    "InvalidArgumentError",
    "InvalidJobError",
    "QueueFullError",
    "RunBusyError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "StepOutcomeUnknownError",
    "StoreUnavailableError",
    "TriggerConflictError",
    "UnsupportedStoreError",
]


class GnlError(Exception):
    """Base class of every gnl error.

    Attributes:
        code: The database's error code (SQLSTATE, MySQL error number or SQLite result code)
            when the error came from the database, else None.
    """

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class InvalidArgumentError(GnlError, ValueError):
    """A bad argument value. Nothing was written."""


class CronError(InvalidArgumentError):
    """A cron expression that gnl refuses; the message names the field."""


class InvalidJobError(InvalidArgumentError):
    """One job of an ``enqueue_many`` call is invalid; nothing was written.

    Attributes:
        index: The position of the invalid job in the call (0-based). ``__cause__`` holds the
            underlying ``TypeError`` or ``InvalidArgumentError``.
    """

    def __init__(self, message: str = "", index: int = -1) -> None:
        super().__init__(message)
        self.index = index


class QueueFullError(GnlError):
    """``max_depth`` would be exceeded by the organization's pending jobs. Nothing was written.

    Attributes:
        org_id: The organization (None: jobs without organization).
        depth: Its pending jobs counting the refused call's own.
        max_depth: The limit that was asked for.
    """

    def __init__(
        self,
        message: str = "",
        org_id: str | None = None,
        depth: int | None = None,
        max_depth: int | None = None,
    ) -> None:
        super().__init__(message)
        self.org_id = org_id
        self.depth = depth
        self.max_depth = max_depth


class TriggerConflictError(GnlError):
    """A trigger id is registered with another definition (unschedule it first)."""


class ExecutionRevokedError(GnlError):
    """A handler's right to run ended.

    Attributes:
        why: ``"canceled"`` (``cancel_job``), ``"lease-lost"`` (a renewal answered that the lease
            is not this worker's, or no renewal held for ``ttl_ms * 5/6`` since the last good
            one: before the lease ends), ``"timeout"`` (``max_hold_ms`` ran out) or ``"shutdown"``
            (the process is stopping and its grace ran out: :meth:`gnl.App.serve`).
    """

    def __init__(self, why: str = "canceled", message: str | None = None) -> None:
        super().__init__(message or f"execution revoked: {why}")
        self.why = why


class RunBusyError(GnlError):
    """A run is locked by another executor.

    Attributes:
        at_lock_acquisition: True when refused while taking the run lock.
    """

    def __init__(self, message: str = "", at_lock_acquisition: bool = False) -> None:
        super().__init__(message)
        self.at_lock_acquisition = at_lock_acquisition


class StepOutcomeUnknownError(GnlError):
    """An at-most-once step was started by an earlier execution that recorded no result.

    Its function may or may not have run to completion (the process died in between), so it is
    not called again. An operator decides: ``gnl.resolve_step(storage, run_id, step, n=n,
    value=...)`` (it happened: record its result) or ``retry=True`` (it did not: run it again);
    also ``gnl runs resolve``.

    Attributes:
        run_id: The run.
        step: The step's name.
        n: The step's number among the run's calls of that name (0-based).
        started_at: When the earlier execution recorded its intent (epoch ms UTC).
    """

    def __init__(
        self, message: str = "", run_id: str = "", step: str = "", n: int = 0, started_at: int = 0
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.step = step
        self.n = n
        self.started_at = started_at


class SchemaOutdatedError(GnlError):
    """The store's schema is older than this package: run ``gnl upgrade <url>``.

    Attributes:
        found: The store's schema version (0: no gnl tables).
        expected: The version this package needs.
    """

    def __init__(self, message: str = "", found: int = 0, expected: int = 0) -> None:
        super().__init__(message)
        self.found = found
        self.expected = expected


class SchemaTooNewError(GnlError):
    """The store's schema is newer than this package: upgrade the ``gnl`` package.

    Attributes:
        found: The store's schema version.
        expected: The newest version this package knows.
    """

    def __init__(self, message: str = "", found: int = 0, expected: int = 0) -> None:
        super().__init__(message)
        self.found = found
        self.expected = expected


class UnsupportedStoreError(GnlError):
    """The server is too old (no SKIP LOCKED) or its kind is not supported by this build."""


class StoreUnavailableError(GnlError):
    """The store cannot be reached (or stayed busy past its timeout).

    Long-running loops (workers) log it, back off and carry on.

    Attributes:
        reason: The driver's reason.
        code: The database's error code, when it gave one.
    """

    def __init__(self, message: str = "", code: str | None = None, reason: str = "") -> None:
        super().__init__(message, code)
        self.reason = reason or message
