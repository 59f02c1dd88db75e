"""Durable runs (API.md "Durable runs"): workflows whose steps are journaled under a run id.

* :func:`create_gnl` returns a :class:`Gnl`, the runner: ``run_workflow(name, run_id=...)``
  starts a run or resumes it. A run's steps (``ctx.step``) are keyed ``(run_id, name, n)``,
  ``n`` counting the earlier calls of ``name`` in the run; the first recorded result is kept
  and read back by every later execution, so a crash, a resume and an execution that outlived
  its lease converge on one recorded result per step.
* A run has a record (``gnl_runs``) with a state (``running``, ``suspended``, ``done``,
  ``failed``). A running run holds a lease, renewed off the Python thread; while it is live
  another execution of the run is refused (:class:`~gnl.RunBusyError`). The waker
  (:func:`create_workflow_waker`) resumes suspended runs whose sleep has elapsed and running
  runs whose lease expired (their process died), each wake-up once across every waker: its
  claim's lease is the execution's own (``_CLAIMED``). A failed run waits for
  ``run_workflow`` or :func:`resume_run`.
* ``preset="critical"`` adds a run lock on ``run_id`` (fencing token, renewed off the Python
  thread, released when the execution ends or suspends).
* ``ctx.step(..., at_most_once=True)`` records the intent before calling ``fn``; an intent
  without result found by a later execution raises :class:`~gnl.StepOutcomeUnknownError`
  (resolve it with :func:`resolve_step`).
* A job handler's ``ctx.step`` and ``ctx.run`` use the same journal under the job's run id.

Every store call is native (``gnl._native``: ``run_start``, ``step_put``, … and
``RunKeeper``, the renewal task).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import inspect
import json
import json.scanner
import logging
import os
import secrets
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from . import _native
from ._callables import require_async
from ._time import MAX_DURATION_MS, age_ms, check_int, check_lease, to_ms
from .errors import (
    ExecutionRevokedError,
    GnlError,
    InvalidArgumentError,
    RunBusyError,
    StepOutcomeUnknownError,
    StoreUnavailableError,
)
from .queue import Page
from .signal import RevocationSignal
from .storage import Journal, Storage, WorkStore, native_of

__all__ = [
    "Gnl",
    "RunInfo",
    "RunSuspended",
    "StepInfo",
    "Workflow",
    "WorkflowContext",
    "WorkflowWaker",
    "claim",
    "create_gnl",
    "create_workflow_waker",
    "get_run",
    "list_runs",
    "scan_runs",
    "resolve_step",
    "resume_run",
    "run_step",
]

log = logging.getLogger("gnl")

#: ``async def workflow(ctx: WorkflowContext, input) -> JSON``
Workflow = Callable[["WorkflowContext", Any], Awaitable[Any]]

#: The presets ``run_workflow`` knows.
PRESETS = (None, "critical")

#: This process, as a lease owner: ``host:pid``; each execution adds a nonce.
_PROCESS = f"{socket.gethostname()}:{os.getpid()}"

#: The step name of ``ctx.sleep`` (names starting ``gnl.`` are gnl's own).
_SLEEP = "gnl.sleep"
_CLAIM = "gnl.claim"

_MISSING: Any = object()

# A recorded step: (name, n, position, state, result_json, started_at).
_Rec = tuple[str, int, int, str, str | None, int]
# A step of a loaded journal (``Recorded.get``): (name, n, position, state, row, started_at),
# its result ``_Steps.values[row]``.
_Got = tuple[str, int, int, str, int, int]


@dataclass(frozen=True, slots=True)
class RunSuspended:
    """What ``run_workflow`` returns for a run that sleeps (``ctx.sleep``).

    Attributes:
        wake_at: When the sleep ends (epoch ms UTC, store clock); the waker resumes the run
            then, and a ``run_workflow`` before then suspends it again.
    """

    wake_at: int


@dataclass(frozen=True, slots=True)
class StepInfo:
    """A recorded step of a run.

    Attributes:
        name: The step's name.
        n: Its number among the run's calls of that name (0-based).
        position: Its place among the run's steps (0-based).
        state: ``"done"``, or ``"intent"`` (an at-most-once step started, no result yet).
        result: The recorded result (decoded JSON; None while an intent).
        started_at: When it was recorded (an intent: when it started), epoch ms UTC.
    """

    name: str
    n: int
    position: int
    state: str
    result: Any
    started_at: int


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A durable run as recorded.

    Attributes:
        run_id: The run's id.
        workflow: The workflow's name.
        preset: ``"critical"`` or None.
        state: ``"running"``, ``"suspended"``, ``"done"`` or ``"failed"``.
        input: The run's input (decoded JSON).
        result: The workflow's return value once done (decoded JSON), else None.
        error: The last execution's error once failed, else None.
        scheduled_for: The slot it runs for (epoch ms UTC) or None.
        wake_at: When a suspended run's sleep ends (epoch ms UTC) or None.
        lease_owner: The process executing a running run (``host:pid:nonce``) or None.
        lease_expires_at: When its lease lapses unless renewed (epoch ms UTC) or None (a
            job's run: the job's lease covers it).
        created_at: When the run was created (epoch ms UTC).
        updated_at: When its state last changed (epoch ms UTC).
        steps: Its recorded steps in position order (empty in listings).
    """

    run_id: str
    workflow: str
    preset: str | None
    state: str
    input: Any
    result: Any
    error: str | None
    scheduled_for: int | None
    wake_at: int | None
    lease_owner: str | None
    lease_expires_at: int | None
    created_at: int
    updated_at: int
    steps: tuple[StepInfo, ...] = ()

    def stuck(self, now_ms: int) -> str | None:
        """Why no process is executing or waking this run, or None.

        A ``running`` run whose lease lapsed (its process died or stalls: a waker takes it
        over, which it would have done within its poll if one were running) is
        ``"stuck: lease expired"``; a ``suspended`` run more than a minute past its wake-up
        (wakers claim due runs every 5 s by default: with a ``waker_interval_ms`` near a
        minute or more, a healthy run can be marked) is ``"stuck: overdue"``. A job's run
        (``ctx.run``) holds no lease of its own (its job's lease covers it): it is not marked;
        its job is reclaimed once that lease lapses. ``gnl runs
        list|show`` and Studio's runs pages show the mark.

        Args:
            now_ms: The store's time (:meth:`Storage.now_ms`), epoch ms UTC.

        Returns:
            ``"stuck: lease expired"``, ``"stuck: overdue"`` or None.
        """
        if self.state == "running" and self.lease_expires_at is not None:
            if self.lease_expires_at < now_ms:
                return "stuck: lease expired"
        if self.state == "suspended" and self.wake_at is not None:
            if self.wake_at < now_ms - _OVERDUE_MS:
                return "stuck: overdue"
        return None


#: How long past its wake-up a suspended run is marked stuck (``RunInfo.stuck``): wakers
#: claim due runs every ``interval_ms`` (5 s by default), so a minute means none is running.
_OVERDUE_MS = 60_000


#: json's C scanner without ``json.loads``'s whitespace handling (recorded JSON is gnl's
#: own compact text): a replayed step decodes its result in a fraction of the time.
_DECODER: Any = json.JSONDecoder()
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(_DECODER)


def _loads(text: str | None) -> Any:
    return None if text is None else _scan(text, 0)[0]


def _run_info(raw: _native.RawRun, steps: list[_Rec] | None = None) -> RunInfo:
    return RunInfo(
        run_id=raw.run_id,
        workflow=raw.workflow,
        preset=raw.preset,
        state=raw.state,
        input=_loads(raw.input),
        result=_loads(raw.result),
        error=raw.error,
        scheduled_for=raw.scheduled_for,
        wake_at=raw.wake_at,
        lease_owner=raw.lease_owner,
        lease_expires_at=raw.lease_expires_at,
        created_at=raw.created_at,
        updated_at=raw.updated_at,
        steps=tuple(
            StepInfo(
                name=s[0], n=s[1], position=s[2], state=s[3], result=_loads(s[4]), started_at=s[5]
            )
            for s in steps or ()
        ),
    )


class _Suspend(BaseException):
    """Raised by ``ctx.sleep`` to end an execution; ``run_workflow`` returns RunSuspended.

    A BaseException, so a workflow's ``except Exception`` does not swallow it.
    """

    def __init__(self, wake_at: int, in_ms: int) -> None:
        super().__init__(wake_at)
        self.wake_at = wake_at
        #: How long until then from when the sleep was recorded (the store's clock).
        self.in_ms = in_ms


class _Steps:
    """The journal of one execution of a run: counts the calls of each step name and their
    positions, and serves recorded steps (read at start for a workflow; one at a time for a
    job's ``ctx.step``, whose run has no record until ``ctx.run``)."""

    __slots__ = (
        "counted",
        "counts",
        "fast",
        "k",
        "keeper",
        "lean",
        "native",
        "now_ms",
        "pos",
        "recorded",
        "run_id",
        "signal",
        "sleeps",
        "values",
    )

    def __init__(self, native: _native.NativeStore, run_id: str, signal: RevocationSignal) -> None:
        self.native = native
        self.run_id = run_id
        self.signal = signal
        self.counts: dict[str, int] = {}
        self.pos = 0
        #: The run's journal as read at its start (``load``), None until then.
        self.recorded: _native.Recorded | None = None
        #: The decoded results of ``recorded``'s rows, in row order.
        self.values: list[Any] = []
        #: The replay's lean path (``WorkflowContext.step``): ``lean[p]`` (``p < k``) is the
        #: name of the done step recorded at position ``p`` whose call, if every call before it
        #: was the recorded one, is the recorded call of that name (``Recorded.lean``); such a
        #: call is served from ``values[p]`` without the full path's checks and counting.
        self.lean: list[str | None] = []
        self.k = 0
        #: ``counts`` counts the calls before this position; the lean path's calls from here
        #: to ``pos`` are counted when the full path next runs (``_count``).
        self.counted = 0
        self.now_ms = 0
        self.sleeps = False
        #: The execution's lease and lock keeper: a new step is not started once it lapsed.
        self.keeper: _native.RunKeeper | None = None
        # SQLite records a new step at once on this thread (``step_put_now``), without the
        # async round trip that costs several times the insert.
        self.fast = native.backend == "sqlite"

    def load(self, recorded: _native.Recorded) -> None:
        """Serve the run's journal, read at its start, from this call on."""
        self.recorded = recorded
        if len(recorded):
            self.values = _scan(recorded.results, 0)[0]
            self.lean = recorded.lean(self.pos, self.counts)
            self.k = len(self.lean)

    def _count(self, pos: int) -> None:
        """Count the calls the lean path served before ``pos`` (each one the recorded name)."""
        counts = self.counts
        for name in self.lean[self.counted : pos]:
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
        self.counted = pos

    def _next(self, name: str) -> tuple[int, int, _Got | None]:
        """This call's (position, n) and what the loaded journal holds at that position."""
        keeper = self.keeper
        if keeper is not None and not keeper.held():
            # No renewal succeeded for the lease's time (a stalled process: the tokio task
            # may not have said so yet): another execution may own the run now.
            self.signal.abort("lease-lost", f"run {self.run_id!r} lost its lease")
        self.signal.raise_if_aborted()
        pos = self.pos
        if self.counted != pos:
            self._count(pos)
        self.pos = self.counted = pos + 1
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        rec = None
        if self.recorded is not None:
            rec = self.recorded.get(pos)
            if rec is not None and (rec[0] != name or rec[1] != n):
                # The lean path assumes that every earlier call was the recorded one.
                self.k = 0
                raise GnlError(
                    f"run {self.run_id!r} no longer matches its journal: step {pos} is recorded "
                    f"as {rec[0]!r} (call {rec[1]}) but the code now calls {name!r} (call {n}); "
                    "the run fails (finish it with the code it started with, or start a new run)"
                )
        return pos, n, rec

    def _unknown(self, name: str, n: int, started_at: int) -> StepOutcomeUnknownError:
        at = datetime.fromtimestamp(started_at / 1000, timezone.utc)
        at_iso = at.isoformat(timespec="milliseconds")
        return StepOutcomeUnknownError(
            f"step {name!r} (call {n}) of run {self.run_id!r} is at-most-once and was started at "
            f"{at_iso} by an execution that recorded no result: it is not called again; resolve "
            "it with gnl.resolve_step or `gnl runs resolve`",
            run_id=self.run_id,
            step=name,
            n=n,
            started_at=started_at,
        )

    async def step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], at_most_once: bool
    ) -> Any:
        if not isinstance(name, str):
            raise TypeError(f"step name must be a str, not {type(name).__name__}")
        if not name:
            raise InvalidArgumentError("step name must be a non-empty string")
        if name.startswith("gnl."):
            raise InvalidArgumentError(f"step names starting with 'gnl.' are gnl's own: {name!r}")
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        if not isinstance(at_most_once, bool):
            raise TypeError(f"at_most_once must be a bool, not {type(at_most_once).__name__}")
        pos, n, rec = self._next(name)
        native, run_id = self.native, self.run_id
        if self.recorded is None:
            row = await _native.step_get(native, run_id, name, n)
            if row is not None:
                if row[3] == "done":
                    return _loads(row[4])
                raise self._unknown(name, n, row[5])
        elif rec is not None:
            if rec[3] == "done":
                return self.values[rec[4]]
            raise self._unknown(name, n, rec[5])
        if at_most_once:
            return await self._at_most_once(name, n, pos, fn, args)
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
        if self.fast and _native.step_put_now(native, run_id, name, n, pos, value):
            return value
        kept = await _native.step_put(native, run_id, name, n, pos, value)
        if kept is None:
            return value
        if kept[3] == "done":
            return _loads(kept[4])
        raise self._unknown(name, n, kept[5])

    async def _at_most_once(
        self, name: str, n: int, pos: int, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> Any:
        native, run_id = self.native, self.run_id
        token = secrets.randbits(62) + 1
        kept = await _native.step_intent(native, run_id, name, n, pos, token)
        if kept is not None:
            if kept[3] == "done":
                return _loads(kept[4])
            raise self._unknown(name, n, kept[5])
        try:
            value = fn(*args)
            if inspect.isawaitable(value):
                value = await value
            _native.encode_json(value, f"the result of step {name!r}")
        except Exception:
            # It raised (or returned what cannot be recorded): nothing is recorded, a later
            # attempt runs it again.
            await _native.step_resolve(native, run_id, name, n, None, True)
            raise
        if not await _native.step_finish(native, run_id, name, n, token, value):
            row = await _native.step_get(native, run_id, name, n)
            if row is not None and row[3] == "done":
                return _loads(row[4])
            raise GnlError(
                f"step {name!r} (call {n}) of run {run_id!r} was resolved by an operator while it "
                "ran; its result was not recorded"
            )
        return value

    async def sleep(self, ms: int) -> None:
        check_int(ms, "ms", 0, MAX_DURATION_MS)
        if not self.sleeps:
            raise InvalidArgumentError(
                "ctx.sleep is not available in a job's run (the job's retry is its timer); "
                "run the workflow with gnl.create_gnl(...).run_workflow"
            )
        pos, n, rec = self._next(_SLEEP)
        native, run_id = self.native, self.run_id
        if rec is not None:
            wake_at = int(self.values[rec[4]])
        else:
            wake_at = await native.now_ms() + ms
            kept = await _native.step_put(native, run_id, _SLEEP, n, pos, wake_at)
            if kept is not None:
                wake_at = int(_loads(kept[4]))
        if wake_at <= self.now_ms:
            return
        now = await native.now_ms()
        if wake_at <= now:
            return
        await _native.run_suspend(native, run_id, wake_at)
        raise _Suspend(wake_at, wake_at - now)


async def run_step(
    steps: _Steps, name: str, fn: Callable[..., Any], *args: Any, at_most_once: bool = False
) -> Any:
    """Run ``fn(*args)`` as step ``name`` of ``steps``' run (``ctx.step`` of jobs and
    workflows); see :meth:`WorkflowContext.step`."""
    return await steps.step(name, fn, args, at_most_once)


class WorkflowContext:
    """What a workflow gets besides its input.

    Attributes:
        run_id: The run's id.
        scheduled_for: The slot this run is for (epoch ms UTC, kept across resumes), or None.
        signal: Aborts to stop the run at its next step boundary (see
            :class:`~gnl.RevocationSignal`).
        journal: The journal the run is recorded in.
    """

    __slots__ = ("_steps", "journal", "run_id", "scheduled_for", "signal")

    def __init__(
        self,
        steps: _Steps,
        journal: Journal,
        scheduled_for: int | None,
    ) -> None:
        self._steps = steps
        self.run_id = steps.run_id
        self.signal = steps.signal
        self.journal = journal
        self.scheduled_for = scheduled_for

    async def step(
        self, name: str, fn: Callable[..., Any], *args: Any, at_most_once: bool = False
    ) -> Any:
        """Run ``fn(*args)`` once per ``(run_id, name, n)`` and journal its result.

        ``n`` counts the earlier calls of ``name`` in this run, so a loop records one result
        per iteration. The journal is read first: a recorded result is returned without
        calling ``fn``. Else ``fn`` runs and its result is recorded unless another executor
        recorded one first; the first recorded result is returned either way. A step whose
        ``fn`` raises records nothing (a later execution runs it again).

        A plain step is at-least-once for its body (a process that dies between the side
        effect and the record runs it again on resume) and exactly-once for its result. With
        ``at_most_once=True`` the intent is recorded before ``fn`` is called (one more store
        write): a later execution that finds the intent without a result raises
        :class:`~gnl.StepOutcomeUnknownError` instead of calling ``fn`` again. Use it for
        side effects that must never repeat and cannot be made idempotent (a payment without
        an idempotency key); use a plain step for everything else.

        Args:
            name: The step's name (not starting with ``gnl.``).
            fn: A plain function or a coroutine function; its result must be JSON.
            *args: Passed to ``fn``.
            at_most_once: Record the intent first (see above).

        Returns:
            The recorded result (decoded JSON).

        Raises:
            TypeError: ``name`` is not a str, ``fn`` is not callable, or its result is not JSON
                (nothing is recorded then).
            InvalidArgumentError: ``name`` is empty or starts with ``gnl.``.
            ExecutionRevokedError: the run's signal aborted (the run stops here, resumable).
            StepOutcomeUnknownError: an at-most-once step's earlier start left no result.
            GnlError: the run's journal records another step at this position (the code
                changed under a started run); the run fails.
        """
        s = self._steps
        pos = s.pos
        if pos < s.k:
            # Replay of a recorded step, in this one coroutine (a resume of 1,000 recorded
            # steps is mostly this path): ``lean[pos]`` is a done step whose name and call
            # count the journal's order vouches for (``_Steps.lean``), so the checks left are
            # the name (an exact str, not ``gnl.``-prefixed: ``lean`` has none), ``fn`` and
            # the signal; the calls are counted when the full path next runs. Anything else
            # (a new step, a mismatch, an at-most-once intent) takes the full path.
            known = s.lean[pos]
            if (
                (known is name or (known == name and name.__class__ is str))
                and callable(fn)
                and at_most_once.__class__ is bool
            ):
                s.signal.raise_if_aborted()
                s.pos = pos + 1
                return s.values[pos]
        return await s.step(name, fn, args, at_most_once)

    async def sleep(self, ms: int) -> None:
        """Sleep durably: record the wake-up (store clock + ``ms``) and suspend the run.

        ``run_workflow`` then returns :class:`RunSuspended`; the waker resumes the run once
        the wake-up has passed, and the replay passes this call at once. A run resumed
        earlier suspends again here without re-running its earlier steps.

        Args:
            ms: How long to sleep, in ms (``>= 0``).

        Raises:
            TypeError: ``ms`` is not an int.
            InvalidArgumentError: ``ms`` is out of range, or this is a job's ``ctx.run``.
        """
        await self._steps.sleep(ms)

    def __repr__(self) -> str:
        return f"<gnl.WorkflowContext run_id={self.run_id!r}>"


def _journal_of(store: Storage | WorkStore | Journal) -> Journal:
    if isinstance(store, Journal):
        return store
    if isinstance(store, Storage):
        return store.journal
    if isinstance(store, WorkStore):
        return store._storage.journal
    raise TypeError(f"expected a gnl.Storage or gnl.Journal, not {type(store).__name__}")


def _owner() -> str:
    return f"{_PROCESS}:{secrets.token_hex(6)}"


#: ``(run_id, owner)`` of the run a waker claimed for the task resuming it: the execution of
#: that run id takes the claim's lease as its own (any other run id starts under its own owner:
#: a run that another owner executes under a live lease is refused, ``RunBusyError``).
_CLAIMED: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "gnl_claimed", default=None
)


async def execute(
    native: _native.NativeStore,
    journal: Journal,
    workflow: str,
    fn: Workflow,
    *,
    run_id: str,
    input: Any,
    scheduled_for: int | datetime | None,
    signal: RevocationSignal | None,
    preset: str | None,
    lease_ms: int,
    steps: _Steps | None = None,
) -> Any:
    """Run or resume ``fn`` as run ``run_id`` (``run_workflow``; ``ctx.run`` passes the job's
    ``steps``, whose run is the job's: no waker lease and no sleep)."""
    if not isinstance(run_id, str):
        raise TypeError(f"run_id must be a str, not {type(run_id).__name__}")
    if not run_id:
        raise InvalidArgumentError("run_id must be a non-empty string")
    if preset not in PRESETS:
        raise InvalidArgumentError(f"preset must be None or 'critical', got {preset!r}")
    slot = None if scheduled_for is None else to_ms(scheduled_for, "scheduled_for")
    if signal is None:
        signal = steps.signal if steps is not None else RevocationSignal()
    elif not isinstance(signal, RevocationSignal):
        raise TypeError(f"signal must be a gnl.RevocationSignal, not {type(signal).__name__}")
    if input is not None:
        _native.encode_json(input, "input")  # refused before anything is written
    claimed = _CLAIMED.get()
    if claimed is not None and claimed[0] == run_id:
        owner = claimed[1]
        _CLAIMED.set(None)
    else:
        owner = _owner()
    job = steps is not None
    # SQLite starts and finishes a run, and takes and releases its run lock, at once on this
    # thread when it can (``run_start(..., now=True)`` comes back resolved; ``*_now``
    # None/False: not done, nothing written), without the async round trips that cost more
    # than the statements (a finished run's read-back, a resume's start and finish).
    fast = native.backend == "sqlite"
    lock: int | None = None
    sent = time.monotonic()
    if preset == "critical":
        lock = _native.lock_acquire_now(native, run_id, owner, lease_ms) if fast else None
        if lock is None:
            lock = await _native.lock_acquire(native, run_id, owner, lease_ms)
        if lock is None:
            raise RunBusyError(
                f"run {run_id!r} is being executed elsewhere (its run lock is held by another "
                "execution); nothing ran",
                at_lock_acquisition=True,
            )
    keeper: _native.RunKeeper | None = None
    try:
        state, result, rec_input, rec_slot, created, now, recorded = await _native.run_start(
            native, run_id, workflow, preset, input, slot, owner, None if job else lease_ms, fast
        )
        if state == "done":
            return _loads(result)
        if not job or lock is not None:
            loop = asyncio.get_running_loop()
            keeper = _native.RunKeeper(
                native,
                run_id,
                lease_ms,
                None if job else owner,
                run_id if lock is not None else None,
                lock or 0,
                lambda why: signal.abort(why, f"run {run_id!r} lost its lease"),
                loop,
                age_ms(sent),
            )
            if lock is not None and not keeper.held():
                # The run lock lapsed before the body started (a slow store or process):
                # another executor may hold it now.
                raise RunBusyError(
                    f"run {run_id!r} is being executed elsewhere (its run lock lapsed before "
                    "the run started); nothing ran",
                    at_lock_acquisition=True,
                )
        if steps is None:
            steps = _Steps(native, run_id, signal)
            steps.sleeps = True
        else:
            steps.signal = signal
        steps.keeper = keeper
        steps.load(recorded)
        steps.now_ms = now
        if not created:
            input = _loads(rec_input)
        ctx = WorkflowContext(steps, journal, rec_slot)
        try:
            value = await fn(ctx, input)
            if fast and _native.run_finish_now(native, run_id, value):
                kept = None
            else:
                kept = await _native.run_finish(native, run_id, value)
        except _Suspend as s:
            _wake_wakers(native, s.in_ms)
            return RunSuspended(s.wake_at)
        except (Exception, asyncio.CancelledError) as e:
            # The signal's reason when it stopped the run: its ExecutionRevokedError, or a
            # cancel after it (a step that ignored a shutdown past gnl run's second grace).
            cancelled = isinstance(e, asyncio.CancelledError)
            reason = signal.reason if signal.aborted else None
            why = reason.why if reason is not None and (cancelled or e is reason) else None
            with contextlib.suppress(Exception):
                if why == "shutdown" and not job:
                    # Stopped, not failed: due to the waker at once (the next process's).
                    await _native.run_suspend(native, run_id, await native.now_ms())
                elif not cancelled and why != "lease-lost":
                    # The run stays resumable: a later run_workflow (a job's retry) runs it.
                    # (lease-lost: another execution may hold the run now, nothing is written
                    # over it; if none does, its lease lapses and the waker resumes it.)
                    await _native.run_fail(native, run_id, f"{type(e).__name__}: {e}")
            raise
        return value if kept is None else _loads(kept)
    finally:
        if steps is not None:
            steps.keeper = None  # a job's steps go on after its ctx.run
        if keeper is not None:
            if not keeper.stop_now():
                await keeper.stop()
        elif lock is not None and not (fast and _native.lock_release_now(native, run_id, lock)):
            with contextlib.suppress(Exception):
                await _native.lock_release(native, run_id, lock)


class Gnl:
    """The runner of durable workflows (:func:`create_gnl`); the scheduler and the waker call
    its :meth:`run_workflow`."""

    __slots__ = ("_journal", "_native", "_workflows", "lease_ms", "preset")

    def __init__(
        self,
        journal: Journal,
        workflows: Mapping[str, Workflow],
        preset: str | None,
        lease_ms: int,
    ) -> None:
        self._journal = journal
        self._native = native_of(journal, "journal")
        self._workflows = dict(workflows)
        self.preset = preset
        self.lease_ms = lease_ms

    @property
    def journal(self) -> Journal:
        """The journal the runs are recorded in."""
        return self._journal

    @property
    def workflows(self) -> Mapping[str, Workflow]:
        """The workflows by name."""
        return dict(self._workflows)

    async def run_workflow(
        self,
        name: str,
        *,
        run_id: str,
        input: Any = None,
        scheduled_for: int | datetime | None = None,
        signal: RevocationSignal | None = None,
        preset: str | None = _MISSING,
    ) -> Any:
        """Run workflow ``name`` as run ``run_id``, or resume that run.

        A new run records ``input`` and ``scheduled_for`` and starts; an existing one resumes
        with its recorded input and slot (the arguments are ignored then): recorded steps are
        read back in one store call and served without running them again. A finished run's
        recorded return value is returned at once.

        Args:
            name: A workflow given to :func:`create_gnl`.
            run_id: The run's id (non-empty, at most 4,000 characters).
            input: The workflow's input (JSON).
            scheduled_for: The slot this run is for (epoch ms UTC or an aware datetime).
            signal: Aborting it stops the workflow at its next step boundary with the
                signal's :class:`~gnl.ExecutionRevokedError` (the run stays resumable).
            preset: ``"critical"``: take the run lock first (default: the runner's preset).

        Returns:
            The workflow's return value (decoded from the journal for a run that finished
            before), or :class:`RunSuspended` when the run sleeps.

        Raises:
            InvalidArgumentError: unknown workflow (the message names the known ones), empty
                ``run_id``, unknown preset, or ``run_id`` is a run of another workflow;
                nothing is written.
            TypeError: ``input`` or the return value is not JSON (for input: nothing written).
            RunBusyError: another execution holds the run under a live lease (its process is
                alive; the waker's resume, another process), or ``preset="critical"`` and
                another executor holds the run lock (``at_lock_acquisition=True``; nothing
                ran, nothing written).
            ExecutionRevokedError: the signal aborted (the run is then ``failed``; with
                ``why="shutdown"`` ``suspended`` and due at once, for the waker; with
                ``"lease-lost"`` left as it is).
            StepOutcomeUnknownError: an at-most-once step's earlier start left no result.
            Exception: whatever the workflow raised (the run's state is then ``failed``; a
                later ``run_workflow`` runs it again, or :func:`resume_run` hands it to the
                waker).
        """
        if not isinstance(name, str):
            raise TypeError(f"workflow name must be a str, not {type(name).__name__}")
        fn = self._workflows.get(name)
        if fn is None:
            known = ", ".join(repr(k) for k in sorted(self._workflows)) or "none"
            raise InvalidArgumentError(f"unknown workflow {name!r}; known workflows: {known}")
        return await execute(
            self._native,
            self._journal,
            name,
            fn,
            run_id=run_id,
            input=input,
            scheduled_for=scheduled_for,
            signal=signal,
            preset=self.preset if preset is _MISSING else preset,
            lease_ms=self.lease_ms,
        )

    def __repr__(self) -> str:
        return f"<gnl.Gnl workflows={sorted(self._workflows)}>"


def create_gnl(
    storage: Storage | Journal,
    workflows: Mapping[str, Workflow] | None = None,
    preset: str | None = None,
    *,
    lease_ms: int = 30_000,
) -> Gnl:
    """Create the runner of durable workflows.

    Args:
        storage: A :class:`~gnl.Storage` or its journal.
        workflows: Workflows by name: ``async def wf(ctx: gnl.WorkflowContext, input)``.
        preset: The default preset of ``run_workflow``: None or ``"critical"``.
        lease_ms: How long a running run stays alive without a renewal (ms >= 100, renewed
            every third of it, off the Python thread); once it lapses (the process died) the
            waker resumes the run. Also the critical preset's run-lock lease.

    Returns:
        A :class:`Gnl` (the runner the scheduler and :func:`create_workflow_waker` take).

    Raises:
        TypeError: a workflow is not an ``async`` function or a name is not a str.
        InvalidArgumentError: an empty workflow name, an unknown preset, ``lease_ms`` < 100.
    """
    journal = _journal_of(storage)
    wfs = dict(workflows or {})
    for k, v in wfs.items():
        if not isinstance(k, str):
            raise TypeError(f"workflow names must be str, not {type(k).__name__}")
        if not k:
            raise InvalidArgumentError("workflow names must be non-empty")
        require_async(v, f"workflow {k!r}")
    if preset not in PRESETS:
        raise InvalidArgumentError(f"preset must be None or 'critical', got {preset!r}")
    check_lease(lease_ms, "lease_ms")
    return Gnl(journal, wfs, preset, lease_ms)


async def claim(journal: Storage | Journal, key: str, value: Any) -> Any:
    """Record ``value`` under ``key`` unless a value is recorded; return the recorded one.

    The first writer wins: every caller with the same key gets the same (first) value.

    Args:
        journal: A :class:`~gnl.Storage` or its journal.
        key: Non-empty, at most 4,000 characters.
        value: JSON.

    Returns:
        The recorded value (``value`` itself when this call recorded it).

    Raises:
        TypeError: ``key`` is not a str or ``value`` is not JSON (nothing recorded).
        InvalidArgumentError: ``key`` is empty or too long.
    """
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidArgumentError("key must be a non-empty string")
    native = native_of(_journal_of(journal), "journal")
    kept = await _native.step_put(native, key, _CLAIM, 0, 0, value)
    return value if kept is None else _loads(kept[4])


async def list_runs(
    storage: Storage | Journal,
    *,
    state: str | None = None,
    workflow: str | None = None,
    limit: int = 50,
    before: RunInfo | tuple[int, str] | None = None,
) -> list[RunInfo]:
    """Runs, newest first (``gnl runs list``); their ``steps`` are left empty.

    Args:
        storage: A :class:`~gnl.Storage` or its journal.
        state: Only runs in this state (``running``, ``suspended``, ``done``, ``failed``).
        workflow: Only runs of this workflow.
        limit: At most this many (1 to 10,000).
        before: The next page: only runs listed after this one — the last run of the previous
            page, or its ``(created_at, run_id)`` (created_at in epoch ms UTC). The order is
            ``created_at`` then the run's key, both descending, so pages never overlap or skip.

    Raises:
        InvalidArgumentError: an unknown state or a limit out of range.
        TypeError: ``before`` is not a RunInfo nor an ``(int, str)`` pair.
    """
    check_int(limit, "limit", 1, 10_000)
    after: tuple[int, str] | None = None
    if isinstance(before, RunInfo):
        after = (before.created_at, before.run_id)
    elif before is not None:
        if not (
            isinstance(before, tuple)
            and len(before) == 2
            and isinstance(before[0], int)
            and not isinstance(before[0], bool)
            and isinstance(before[1], str)
        ):
            raise TypeError("before must be a RunInfo or a (created_at, run_id) pair")
        after = before
    native = native_of(_journal_of(storage), "journal")
    return [_run_info(r) for r in await _native.list_runs(native, state, workflow, limit, after)]


def _run_cursor(at_id: tuple[int, str] | None) -> str | None:
    return None if at_id is None else f"{at_id[0]}:{at_id[1]}"


async def scan_runs(
    storage: Storage | Journal,
    *,
    state: str | None = None,
    workflow: str | None = None,
    limit: int = 50,
    scan: int = 2_000,
    cursor: str | None = None,
) -> Page[RunInfo]:
    """A bounded page of runs for dashboards: of the next ``scan`` runs in listing order (newest
    first), those that match, up to ``limit``; their ``steps`` are left empty.

    Unlike :func:`list_runs`, a page costs at most ``scan`` rows read whatever the filter, so a
    page can hold fewer than ``limit`` runs — even none — while ``next_cursor`` says more are
    left.

    Args:
        storage: A :class:`~gnl.Storage` or its journal.
        state: Only runs in this state (``running``, ``suspended``, ``done``, ``failed``).
        workflow: Only runs of this workflow.
        limit: At most this many runs (1 to 10,000).
        scan: Examine at most this many runs (``limit`` to 100,000).
        cursor: The previous page's ``next_cursor``; None for the first page.

    Returns:
        The page; its ``next_cursor`` is None at the end of the listing.

    Raises:
        InvalidArgumentError: an unknown state, a limit or scan out of range, a malformed
            cursor.
    """
    check_int(limit, "limit", 1, 10_000)
    check_int(scan, "scan", limit, 100_000)
    before = None
    if cursor is not None:
        at, sep, run_id = cursor.partition(":") if isinstance(cursor, str) else ("", "", "")
        if not sep or not at.isdigit() or not run_id:
            raise InvalidArgumentError("cursor must be a next_cursor of scan_runs")
        before = (int(at), run_id)
    native = native_of(_journal_of(storage), "journal")
    rows, nxt = await _native.scan_runs(native, state, workflow, limit, scan, before)
    return Page([_run_info(r) for r in rows], _run_cursor(nxt))


async def get_run(storage: Storage | Journal, run_id: str) -> RunInfo | None:
    """A run with its recorded steps (``gnl runs show``), or None when there is none.

    Raises:
        TypeError: ``run_id`` is not a str.
        InvalidArgumentError: ``run_id`` is empty.
    """
    if not isinstance(run_id, str):
        raise TypeError(f"run_id must be a str, not {type(run_id).__name__}")
    native = native_of(_journal_of(storage), "journal")
    got = await _native.run_get(native, run_id)
    return None if got is None else _run_info(got[0], got[1])


async def resume_run(storage: Storage | Journal, run_id: str) -> bool:
    """Hand a ``failed`` run to the waker (``gnl runs resume``): it becomes ``suspended``, due
    now, its error cleared, and the next tick of a waker that knows its workflow (``gnl run``'s)
    resumes it; its recorded steps are not run again.

    Nothing else resumes a failed run by itself: a workflow that raised is not run again in a
    loop. In a process that has the workflow, ``run_workflow`` resumes it directly; a job's run
    (``ctx.run``) resumes when its job is retried (:func:`gnl.retry_job`). A schedule's run
    (``sched:<id>:<n>``) whose trigger failed at that fire re-arms the trigger too: it is
    ``pending`` again for that slot with its attempts reset, and goes on with its next slots
    once the slot's run is done.

    Args:
        storage: A :class:`~gnl.Storage` or its journal.
        run_id: The run.

    Returns:
        True when the run was failed and is now due to the waker; False (nothing changed) when
        there is no such run or it is not failed.

    Raises:
        TypeError: ``run_id`` is not a str.
        InvalidArgumentError: ``run_id`` is empty or longer than 4,000 characters, or it is
            a job's run (``ctx.run``; nothing changed).
    """
    if not isinstance(run_id, str):
        raise TypeError(f"run_id must be a str, not {type(run_id).__name__}")
    native = native_of(_journal_of(storage), "journal")
    parts = run_id.split(":")
    if len(parts) == 3 and parts[0] == "job":  # a job's run id (ids.rs: job:<org>:<id>)
        org, job_id = (p.replace("%3A", ":").replace("%25", "%") for p in parts[1:])
        if job_id and await native.get_job(org or None, job_id) is not None:
            # No waker serves a job's run (its workflow is the handler's own function).
            raise InvalidArgumentError(
                f"run {run_id!r} is the run of job {job_id!r}"
                + (f" (organization {org!r})" if org else "")
                + ": it resumes when the job is retried (gnl.retry_job, gnl jobs retry)"
            )
    if not await _native.run_wake(native, run_id):
        return False
    # A schedule's run: its trigger, failed at that slot, fires it again (scheduler._rearm).
    from .scheduler import _rearm

    await _rearm(native, run_id)
    return True


async def resolve_step(
    storage: Storage | Journal,
    run_id: str,
    step: str,
    *,
    n: int = 0,
    value: Any = _MISSING,
    retry: bool = False,
) -> bool:
    """Resolve an at-most-once step left without result (:class:`~gnl.StepOutcomeUnknownError`).

    Give exactly one of ``value`` (the side effect happened: record this as its result, so the
    run goes on with it) and ``retry=True`` (it did not: the next execution calls the step's
    function again). Then resume the run: ``run_workflow``, :func:`resume_run` (a failed run,
    for the waker) or, for a job's run, the job's retry.

    Args:
        storage: A :class:`~gnl.Storage` or its journal.
        run_id: The run.
        step: The step's name.
        n: Which call of that name (0-based; the error's ``.n``).
        value: The result to record (JSON).
        retry: Let the step run again instead.

    Returns:
        True when the step was an intent without result and is now resolved; False (nothing
        changed) when it is unknown or already done.

    Raises:
        InvalidArgumentError: neither or both of ``value`` and ``retry``.
        TypeError: ``value`` is not JSON.
        RunBusyError: the run is running under a live lease (its execution may still record
            the step's result); nothing changed.
    """
    if not isinstance(retry, bool):
        raise TypeError(f"retry must be a bool, not {type(retry).__name__}")
    if (value is _MISSING) == (not retry):
        raise InvalidArgumentError("give exactly one of value=... and retry=True")
    check_int(n, "n", 0)
    native = native_of(_journal_of(storage), "journal")
    got = await _native.run_get(native, run_id) if isinstance(run_id, str) and run_id else None
    if got is not None:
        run = got[0]
        lease = run.lease_expires_at
        if run.state == "running" and lease is not None and lease > await native.now_ms():
            # Its execution may still record the step's own result: an operator's value
            # would be taken over it.
            raise RunBusyError(
                f"run {run_id!r} is being executed elsewhere (by {run.lease_owner}, whose lease "
                "is live): resolve its step once that execution has ended; nothing changed",
                at_lock_acquisition=True,
            )
    return await _native.step_resolve(native, run_id, step, n, None if retry else value, retry)


#: The started wakers of this process: a run suspended here wakes those on its store when its
#: sleep ends (`_wake_wakers`).
_WAKERS: weakref.WeakSet[WorkflowWaker] = weakref.WeakSet()
#: When the sleeps of runs suspended in this process end (``time.monotonic()`` s, a heap), per
#: store (the id of its native half): read by the wakers on that store, started before or
#: after. Past ones are dropped as they are read or added; at most ``_SLEEPS_MAX`` a store
#: (the latest are left to the ticks).
_SLEEPS: dict[int, list[float]] = {}
_SLEEPS_MAX = 10_000


def _wake_wakers(native: _native.NativeStore, in_ms: int) -> None:
    """A run of this process suspended on ``native``'s store until ``in_ms`` ms from now
    (the store's clock): the wakers on that store claim then, not at their next tick."""
    now = time.monotonic()
    # 1 ms past it: the claim compares the store's clock in whole ms.
    at = now + (in_ms + 1) / 1000
    if len(_SLEEPS) > 64:
        # Stores of this process that closed (or whose sleeps all ended): dropped.
        for key in [k for k, v in _SLEEPS.items() if not v or max(v) <= now]:
            del _SLEEPS[key]
    sleeps = _SLEEPS.setdefault(id(native), [])
    while sleeps and sleeps[0] <= now:
        heapq.heappop(sleeps)
    if len(sleeps) < _SLEEPS_MAX:
        heapq.heappush(sleeps, at)
    for w in list(_WAKERS):
        if w._native is native:
            w._poke_soon()


class WorkflowWaker:
    """Resumes runs whose time has come (:func:`create_workflow_waker`): suspended runs whose
    sleep has elapsed and running runs whose lease expired (their process died).

    Each wake-up is claimed with a compare-and-set that gives the run a fresh lease, so of
    several wakers (in several processes) exactly one resumes it. The loop (:meth:`start`)
    claims every ``interval_ms`` and resumes each claimed run in a task of its own, at most
    ``batch`` at once, so a run with a long step holds up no other wake-up; while the store is
    away it backs off (doubling, up to 32 intervals). A run suspended by ``ctx.sleep`` in this
    process (on the same Storage, before or after the waker started) is claimed when its sleep
    ends, not at the next tick; one suspended by another process is found by a tick.
    :meth:`tick` claims at most ``batch`` runs (oldest due first) and awaits them.
    """

    def __init__(self, gnl: Gnl, interval_ms: int, batch: int) -> None:
        self._gnl = gnl
        self._native = native_of(gnl.journal, "journal")
        self.interval_ms = interval_ms
        self.batch = batch
        self._task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None
        #: The loop's resumed runs in flight.
        self._resuming: set[asyncio.Task[None]] = set()
        # Tells the sleeping loop of a new sleep of this process on its store (`_SLEEPS`).
        self._poke = asyncio.Event()

    async def _claim(self, limit: int) -> list[tuple[_native.RawRun, str]]:
        """Claim at most ``limit`` due runs, each with the owner its execution takes over."""
        g = self._gnl
        owner = _owner()  # each claim its own owner (a claim lapsed and taken again by this
        # waker is another execution)
        due = await _native.runs_due(self._native, sorted(g._workflows), owner, g.lease_ms, limit)
        return [(r, owner) for r in due]

    async def tick(self) -> int:
        """Claim the due runs (at most ``batch``) and resume them; return how many.

        Each resumed run runs to its end or its next sleep before this returns; a run that
        raises is logged (logger ``"gnl"``), not raised.

        Raises:
            StoreUnavailableError: the store could not be reached for the claim.
        """
        due = await self._claim(self.batch)
        if due:
            await asyncio.gather(*(self._resume(r, owner) for r, owner in due))
        return len(due)

    async def _resume(self, run: _native.RawRun, owner: str) -> None:
        _CLAIMED.set((run.run_id, owner))  # this task's context only
        if run.wake_at is None:
            # Claimed because its lease expired (the claim keeps a sleeping run's wake_at).
            log.warning(
                "gnl waker: run %r (workflow %r) was running under a lease that expired (the "
                "process executing it died or stalled); resuming it from its recorded steps",
                run.run_id,
                run.workflow,
            )
        try:
            await self._gnl.run_workflow(run.workflow, run_id=run.run_id, preset=run.preset)
        except RunBusyError:
            log.debug("gnl waker: run %r is being executed elsewhere", run.run_id)
        except ExecutionRevokedError as e:
            log.info("gnl waker: resumed run %r stopped (%s): %s", run.run_id, e.why, e)
        except Exception as e:
            log.warning("gnl waker: resumed run %r raised %s: %s", run.run_id, type(e).__name__, e)

    def start(self) -> None:
        """Start ticking on the running loop (every ``interval_ms``)."""
        if self._task is not None and not self._task.done():
            return
        self._stopping = asyncio.Event()
        self._poke = asyncio.Event()  # bound to this loop
        self._task = asyncio.get_running_loop().create_task(self._loop(self._stopping))
        _WAKERS.add(self)

    def _poke_soon(self) -> None:
        """A run of this process suspended on this waker's store (`_wake_wakers`): the loop
        looks at when it wakes. (A waker on another event loop reads `_SLEEPS` when its own
        pause ends.)"""
        task = self._task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            self._poke.set()

    async def _loop(self, stopping: asyncio.Event) -> None:
        pause = self.interval_ms
        loop = asyncio.get_running_loop()
        while not stopping.is_set():
            room = self.batch - len(self._resuming)
            try:
                due = await self._claim(room) if room > 0 else []
                for run, owner in due:
                    task = loop.create_task(self._resume(run, owner))
                    self._resuming.add(task)
                    task.add_done_callback(self._resuming.discard)
                # A full claim: more may be due, claimed again once there is room.
                pause = 0 if room > 0 and len(due) >= room else self.interval_ms
            except StoreUnavailableError as e:
                pause = min(max(pause, self.interval_ms) * 2, self.interval_ms * 32)
                log.warning("gnl waker: store unavailable (%s); next try in %d ms", e, pause)
            except Exception as e:
                pause = self.interval_ms
                log.exception("gnl waker: tick failed: %s", e)
            # Until the pause ends, a stop, (no room left) a resumed run ends, or a run
            # suspended in this process wakes (the pause is cut short for it).
            full = len(self._resuming) >= self.batch
            wait = self.interval_ms / 1000 if full else pause / 1000
            while not stopping.is_set():
                self._poke.clear()
                wakes = _SLEEPS.get(id(self._native), [])
                now = time.monotonic()
                while wakes and wakes[0] <= now:
                    heapq.heappop(wakes)
                    wait = 0
                if wait <= 0:
                    break
                left = min(wait, wakes[0] - now) if wakes and not full else wait
                stop = loop.create_task(stopping.wait())
                poke = loop.create_task(self._poke.wait())
                try:
                    done, _ = await asyncio.wait(
                        [stop, poke, *(self._resuming if full else ())],
                        timeout=left,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    stop.cancel()
                    poke.cancel()
                if poke not in done and (done or left == wait):
                    break  # stopped, a resumed run ended, or the pause ended
                wait -= time.monotonic() - now

    async def stop(self) -> None:
        """Stop claiming; waits for the runs this waker is resuming."""
        _WAKERS.discard(self)
        if self._stopping is not None:
            self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        while self._resuming:
            await asyncio.gather(*self._resuming, return_exceptions=True)


def create_workflow_waker(gnl: Gnl, interval_ms: int = 5_000, *, batch: int = 100) -> WorkflowWaker:
    """Create the waker of ``gnl``'s runs (see :class:`WorkflowWaker`).

    Args:
        gnl: The runner (:func:`create_gnl`); only runs of its workflows are resumed.
        interval_ms: The time between ticks, in ms. A run suspended by ``ctx.sleep`` in this
            process, on the same Storage, is claimed when its sleep ends, not at the next
            tick.
        batch: The most runs one tick resumes.

    Raises:
        TypeError: ``gnl`` is not a :class:`Gnl`.
        InvalidArgumentError: ``interval_ms`` < 1 or ``batch`` < 1.
    """
    if not isinstance(gnl, Gnl):
        raise TypeError(f"gnl must be a gnl.Gnl (gnl.create_gnl), not {type(gnl).__name__}")
    check_int(interval_ms, "interval_ms", 1, MAX_DURATION_MS)
    check_int(batch, "batch", 1, 10_000)
    return WorkflowWaker(gnl, interval_ms, batch)
