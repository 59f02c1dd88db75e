"""The scheduler (API.md "Scheduler"): cron, interval and one-shot triggers that fire durable
workflows, each slot once however many pollers race, crash or run with skewed clocks.

* :func:`schedule_workflow` registers a trigger: an immutable definition (a second registration
  with another one raises :class:`~gnl.TriggerConflictError`) and a state only polls move.
* :func:`poll_scheduler` fires what is due: the misfire plan is the Rust core's
  (``_native.misfire_plan``); each fire takes the fire lock ``<run_id>:fire`` (the journal's
  leased lock, store clock, fencing token), renewed every ``lock_ttl_ms/3`` by the journal's
  native keeper; the run id is ``sched:<id>:<fire_count>``; every state write is a
  compare-and-set against the state read when the fire began, fenced by the lock's token.
* :func:`create_scheduler` polls in a loop (empty polls back off), firing without waiting for
  earlier fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from . import _native, _wake
from ._callables import require_async
from ._time import MAX_DURATION_MS, MAX_INSTANT_MS, age_ms, check_int, check_lease, to_ms
from .durable import _owner
from .errors import (
    ExecutionRevokedError,
    GnlError,
    InvalidArgumentError,
    RunBusyError,
    StepOutcomeUnknownError,
    StoreUnavailableError,
    TriggerConflictError,
)
from .signal import RevocationSignal
from .storage import Journal, Storage, native_of

__all__ = [
    "PollResult",
    "Runner",
    "Scheduler",
    "TriggerInfo",
    "create_scheduler",
    "get_trigger",
    "list_triggers",
    "poll_scheduler",
    "schedule_workflow",
    "unschedule",
]

log = logging.getLogger("gnl")

MISFIRE_POLICIES = ("latest", "earliest", "none", "catchup")

#: Triggers read per statement of a poll.
_PAGE = 1_000

#: Store calls of one poller's fires at once.
_IO = 8
#: The shortest pause (s) between two polls of a scheduler woken by a wake-up.
_WAKE_GAP = 0.05

#: Backoff of a failed fire: min(1 s * 2^(n-1), 60 s).
_BACKOFF_BASE_MS = 1_000
_BACKOFF_MAX_MS = 60_000


class Runner(Protocol):
    """What a poll calls: ``gnl.create_gnl(...)`` returns one.

    A runner that also has a ``workflows`` mapping (``gnl.create_gnl``'s has) is handed only
    the triggers of those workflows: a due trigger of another workflow is left as it is, due,
    for a process whose runner declares it (logged once per trigger and process).
    """

    async def run_workflow(
        self,
        name: str,
        *,
        run_id: str,
        input: Any,
        scheduled_for: int | None,
        signal: RevocationSignal | None,
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class TriggerInfo:
    """A registered trigger (:func:`list_triggers`).

    Attributes:
        id: The trigger's id.
        name: The workflow it fires.
        kind: ``"cron"``, ``"every"`` or ``"at"``.
        spec: The cron expression (str), ``every_ms`` (int) or the ``at`` instant (epoch ms).
        misfire: ``"latest"``, ``"earliest"``, ``"none"`` or ``"catchup"``.
        max_catchup: The catchup cap, or None.
        state: ``"pending"``, ``"done"`` (a fired one-shot) or ``"failed"`` (``max_attempts``
            failed attempts; see ``last_error``).
        fire_count: Fires that finished; the next fire's run id is ``sched:<id>:<fire_count>``.
        next_run_at: When it is next due (epoch ms UTC), or None.
        attempts: Failed attempts of the current fire.
        last_error: The last failed attempt's error (``"Type: message"``), or None.
        last_fired_at: When the last fire finished (epoch ms UTC, the poll's instant), or None.
        last_scheduled_for: The slot of the last finished fire (epoch ms UTC), or None.
        missed: Occurrences missed and never fired.
        deferrals: Fires deferred because the run was busy (``RunBusyError`` at acquisition),
            stopped by shutdown (``ExecutionRevokedError`` with ``why="shutdown"``) or lost its
            lease to another execution (``why="lease-lost"``: this process stalled past it).
        last_deferral_at: When the last deferral happened (epoch ms UTC: the poll's instant
            plus the time the fire ran until it was refused or stopped), or None.
    """

    id: str
    name: str
    kind: str
    spec: str | int
    misfire: str
    max_catchup: int | None
    state: str
    fire_count: int
    next_run_at: int | None
    attempts: int
    last_error: str | None
    last_fired_at: int | None
    last_scheduled_for: int | None
    missed: int
    deferrals: int
    last_deferral_at: int | None


@dataclass(slots=True)
class PollResult:
    """What one poll did (:func:`poll_scheduler`).

    Attributes:
        fired: Runs this poll started.
        failed: Of those, runs whose runner raised (a busy refusal excepted).
        skipped: Due triggers this poll did not run: a busy deferral, or a fire lock held by
            another poller.
        deferred: The deferrals (busy, or stopped by shutdown) among ``skipped``.
        run_ids: The run ids this poll started.
    """

    fired: int = 0
    failed: int = 0
    skipped: int = 0
    deferred: int = 0
    run_ids: list[str] = field(default_factory=list)


def _info(r: _native.RawTrigger) -> TriggerInfo:
    spec: str | int = r.spec if r.kind == "cron" else int(r.spec)
    return TriggerInfo(
        id=r.id,
        name=r.name,
        kind=r.kind,
        spec=spec,
        misfire=r.misfire,
        max_catchup=r.max_catchup,
        state=r.state,
        fire_count=r.fire_count,
        next_run_at=r.next_run_at,
        attempts=r.attempts,
        last_error=r.last_error,
        last_fired_at=r.last_fired_at,
        last_scheduled_for=r.last_scheduled_for,
        missed=r.missed,
        deferrals=r.deferrals,
        last_deferral_at=r.last_deferral_at,
    )


def _state(r: _native.RawTrigger, **changes: Any) -> _native.TriggerStateTuple:
    s: dict[str, Any] = {
        "state": r.state,
        "fire_count": r.fire_count,
        "next_run_at": r.next_run_at,
        "owed_slot": r.owed_slot,
        "retry_slot": r.retry_slot,
        "attempts": r.attempts,
        "last_error": r.last_error,
        "last_fired_at": r.last_fired_at,
        "last_scheduled_for": r.last_scheduled_for,
        "missed": r.missed,
        "deferrals": r.deferrals,
        "last_deferral_at": r.last_deferral_at,
    }
    s.update(changes)
    return (
        s["state"],
        s["fire_count"],
        s["next_run_at"],
        s["owed_slot"],
        s["retry_slot"],
        s["attempts"],
        s["last_error"],
        s["last_fired_at"],
        s["last_scheduled_for"],
        s["missed"],
        s["deferrals"],
        s["last_deferral_at"],
    )


async def schedule_workflow(
    journal: Storage | Journal,
    name: str,
    id: str | None = None,
    cron: str | None = None,
    every_ms: int | None = None,
    at: int | datetime | None = None,
    misfire: str = "latest",
    max_catchup: int | None = None,
    misfire_grace_ms: int = 60_000,
    input: Any = None,
    max_attempts: int = 5,
    now_ms: int | None = None,
) -> str:
    """Register a trigger that fires workflow ``name``; a no-op when ``id`` is registered with
    the same definition.

    Args:
        journal: The store (a :class:`~gnl.Storage` or its journal).
        name: The workflow name handed to the runner (1-255 characters).
        id: The trigger's id (default: ``name``; 1-255 characters).
        cron: A 5-field cron expression (UTC, minute resolution): fires at every match strictly
            after registration.
        every_ms: An interval (ms >= 1): fires at registration + k * every_ms, k >= 1.
        at: One instant (epoch ms UTC or an aware datetime); a past one fires on the first poll.
        misfire: What a poll does with missed occurrences: ``"latest"``, ``"earliest"``,
            ``"none"`` or ``"catchup"``.
        max_catchup: With ``misfire="catchup"`` only: only the n latest missed ones fire.
        misfire_grace_ms: How late (ms >= 0) an occurrence may fire before it counts as missed.
        input: The workflow's input (JSON).
        max_attempts: Failed attempts (>= 1) of one fire before the trigger is ``failed``.
        now_ms: The registration instant (epoch ms; default: the store's clock).

    Returns:
        The trigger's id.

    Raises:
        InvalidArgumentError: not exactly one of ``cron`` / ``every_ms`` / ``at``, a value out
            of range, an unknown ``misfire``, ``max_catchup`` without catchup, a naive
            datetime; :class:`~gnl.CronError` for a refused expression. Nothing is written.
        TypeError: an argument of the wrong type, or ``input`` is not JSON.
        TriggerConflictError: ``id`` is registered with another definition (unschedule it).
    """
    if now_ms is not None:
        check_int(now_ms, "now_ms", 0)
    # The definition's checks, before any I/O (App.schedule makes the same at declaration).
    id, kind, spec, input_json, definition = _definition(
        name,
        id,
        cron,
        every_ms,
        at,
        misfire,
        max_catchup,
        misfire_grace_ms,
        input,
        max_attempts,
        "input",
    )
    native = native_of(journal, "journal")
    anchor = now_ms if now_ms is not None else await native.now_ms()
    first: int | None
    if kind == "cron":
        first = _native.next_cron_time(spec, anchor)
    elif kind == "every":
        first = anchor + int(spec)
    else:
        first = int(spec)
    # A trigger created under an id that an unscheduled one had numbers its fires after that
    # one's runs: `sched:<id>:0` again would read back the old run's recorded result, and
    # the new fire would run nothing (found by a new user, session 21).
    registered = await _native.trigger_get(native, id)
    fires = 0 if registered is not None else await _fires_past(native, id)
    initial: _native.TriggerStateTuple = (
        "pending" if first is not None else "done",
        fires,
        first,
        first,
        None,
        0,
        None,
        None,
        None,
        0,
        0,
        None,
    )
    d = (id, name, kind, spec, anchor, misfire, max_catchup, misfire_grace_ms)
    _created, row = await _native.trigger_register(
        native, (*d, input_json, max_attempts, definition), initial
    )
    if row.definition != definition:
        raise TriggerConflictError(
            f"trigger {id!r} is registered with another definition "
            f"({_changes(row.definition, definition)}); unschedule it first to change it"
        )
    return id


class _Definition(NamedTuple):
    """A trigger's definition, checked (:func:`_definition`)."""

    id: str
    kind: str
    spec: str
    input_json: str | None
    #: The canonical JSON a second registration of the id is compared against.
    text: str


def _definition(
    name: str,
    id: str | None,
    cron: str | None,
    every_ms: int | None,
    at: int | datetime | None,
    misfire: str,
    max_catchup: int | None,
    misfire_grace_ms: int,
    input: Any,
    max_attempts: int,
    input_what: str,
) -> _Definition:
    """Check :func:`schedule_workflow`'s definition arguments, without I/O (also what
    ``App.schedule`` checks at declaration: one set of rules, one set of errors);
    ``input_what`` names the input in its error."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name:
        # Checked here, before ``id`` defaults to it: the empty thing is the name.
        raise InvalidArgumentError("name (the workflow to fire) must be a non-empty string")
    if id is None:
        id = name
    if not isinstance(id, str):
        raise TypeError(f"id must be a str, not {type(id).__name__}")
    # The store's own limits (length, NUL), refused here rather than at registration: a long id
    # also makes run ids (``sched:<id>:<n>``) past theirs.
    _native.check_trigger_key("name", name)
    _native.check_trigger_key("id", id)
    given = [k for k, v in (("cron", cron), ("every_ms", every_ms), ("at", at)) if v is not None]
    if len(given) != 1:
        raise InvalidArgumentError(
            "exactly one of cron, every_ms, at must be given"
            + (f"; got {', '.join(given)}" if given else "")
        )
    if not isinstance(misfire, str):
        raise TypeError(f"misfire must be a str, not {type(misfire).__name__}")
    if misfire not in MISFIRE_POLICIES:
        raise InvalidArgumentError(
            f"misfire must be one of {', '.join(MISFIRE_POLICIES)}, got {misfire!r}"
        )
    if max_catchup is not None:
        check_int(max_catchup, "max_catchup", 1)
        if misfire != "catchup":
            raise InvalidArgumentError(
                f"max_catchup only applies to misfire='catchup', not {misfire!r}"
            )
    check_int(misfire_grace_ms, "misfire_grace_ms", 0, MAX_DURATION_MS)
    check_int(max_attempts, "max_attempts", 1)
    input_json = None if input is None else _native.encode_json(input, input_what)
    kind: str
    spec: str
    if cron is not None:
        if not isinstance(cron, str):
            raise TypeError(f"cron must be a str, not {type(cron).__name__}")
        _native.next_cron_time(cron, 0)  # CronError naming the field, before any I/O
        kind, spec = "cron", cron
    elif every_ms is not None:
        check_int(every_ms, "every_ms", 1, MAX_DURATION_MS)
        kind, spec = "every", str(every_ms)
    else:
        assert at is not None
        at_ms = to_ms(at, "at")
        if not 0 <= at_ms <= MAX_INSTANT_MS:
            # As enqueue's run_at: a microseconds-for-ms slip was stored, then broke listings.
            raise InvalidArgumentError(
                f"at must be between 0 and {MAX_INSTANT_MS} epoch ms (year 9999), got {at_ms}"
            )
        kind, spec = "at", str(at_ms)
    text = json.dumps(
        {
            "name": name,
            "kind": kind,
            "spec": spec,
            "misfire": misfire,
            "max_catchup": max_catchup,
            "misfire_grace_ms": misfire_grace_ms,
            "input": input_json,
            "max_attempts": max_attempts,
        },
        sort_keys=True,
    )
    return _Definition(id, kind, spec, input_json, text)


async def _rearm(native: _native.NativeStore, run_id: str) -> bool:
    """A scheduled run (``sched:<id>:<n>``) handed back to the waker (:func:`gnl.resume_run`):
    when its trigger failed at that fire (fire_count ``n``), the trigger is pending again for
    that slot, its attempts reset: the next poll fires the slot under the same run id (busy
    while the waker executes it: deferred; then done: the trigger goes on with its next
    slots). True when it was re-armed."""
    if not run_id.startswith("sched:"):
        return False
    id, _, n = run_id[len("sched:") :].rpartition(":")
    if not id or not n.isdigit():
        return False
    r = await _native.trigger_get(native, id)
    got = await _native.run_get(native, run_id)
    if r is None or got is None or r.state != "failed" or r.fire_count != int(n):
        return False
    run = got[0]
    slot = run.scheduled_for if run.scheduled_for is not None else r.owed_slot
    if slot is None:
        return False
    now = await native.now_ms()
    st = _state(r, state="pending", attempts=0, retry_slot=slot, next_run_at=now)
    if not await _native.trigger_update(native, r.id, r.version, st, None):
        return False
    log.info(
        "gnl scheduler: trigger %r is pending again for its failed slot (run %r resumed)",
        r.id,
        run_id,
    )
    return True


async def _fires_past(native: _native.NativeStore, id: str) -> int:
    """The first ``n`` with no run ``sched:<id>:<n>``: the runs of earlier triggers of this id
    are ``0 .. m-1`` (each fire that counted has its run), found in O(log m) reads."""

    async def taken(n: int) -> bool:
        return await _native.run_get(native, f"sched:{id}:{n}") is not None

    if not await taken(0):
        return 0
    lo, hi = 0, 1  # run lo exists; hi is probed
    while await taken(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await taken(mid):
            lo = mid
        else:
            hi = mid
    return hi


def _changes(registered: str, given: str) -> str:
    """What differs between two trigger definitions (their JSON texts), field by field:
    ``field: registered -> given``, the input shown as JSON (not as the text it is stored
    as)."""
    try:
        old, new = json.loads(registered), json.loads(given)
    except ValueError:  # written by another version: say it whole
        return f"registered {registered}, given {given}"
    if not isinstance(old, dict) or not isinstance(new, dict):
        return f"registered {registered}, given {given}"

    def shown(d: dict[str, Any], key: str) -> str:
        if key not in d:
            return "(none)"
        v = d[key]
        if key == "input" and isinstance(v, str):
            v = json.loads(v)  # stored as JSON text
        return json.dumps(v, ensure_ascii=False)

    keys = sorted(set(old) | set(new))
    diff = [f"{k}: {shown(old, k)} -> {shown(new, k)}" for k in keys if old.get(k) != new.get(k)]
    return "; ".join(diff) or f"registered {registered}, given {given}"


async def list_triggers(
    journal: Storage | Journal, *, after: str | None = None, limit: int | None = None
) -> list[TriggerInfo]:
    """The registered triggers, by id; a page at a time with ``limit``.

    Args:
        journal: A :class:`~gnl.Storage` or its journal.
        after: The next page: only triggers whose id comes after this one (the last id of
            the previous page); None: from the first.
        limit: At most this many (1 to 10,000); None: all of them.

    Raises:
        InvalidArgumentError: ``limit`` out of range.
        TypeError: ``after`` is not a str.
        StoreUnavailableError: the store cannot be reached.
    """
    if after is not None and not isinstance(after, str):
        raise TypeError(f"after must be a str, not {type(after).__name__}")
    if limit is not None:
        check_int(limit, "limit", 1, 10_000)
    rows = await _native.list_triggers(native_of(journal, "journal"), after, limit)
    return [_info(r) for r in rows]


async def get_trigger(journal: Storage | Journal, trigger_id: str) -> TriggerInfo | None:
    """Trigger ``trigger_id``, or None when there is none.

    Raises:
        TypeError: ``trigger_id`` is not a str.
        StoreUnavailableError: the store cannot be reached.
    """
    if not isinstance(trigger_id, str):
        raise TypeError(f"trigger_id must be a str, not {type(trigger_id).__name__}")
    r = await _native.trigger_get(native_of(journal, "journal"), trigger_id)
    return None if r is None else _info(r)


async def unschedule(journal: Storage | Journal, trigger_id: str) -> bool:
    """Remove trigger ``trigger_id`` (its runs stay in the journal).

    Returns:
        True when it was registered, False when there was none.

    Raises:
        TypeError: ``trigger_id`` is not a str.
    """
    if not isinstance(trigger_id, str):
        raise TypeError(f"trigger_id must be a str, not {type(trigger_id).__name__}")
    return await _native.trigger_delete(native_of(journal, "journal"), trigger_id)


def _check_runner(runner: object) -> None:
    """Refuse a runner that cannot run a workflow (before, each fire spent one of its
    trigger's attempts on an AttributeError until the trigger failed for good)."""
    run = getattr(runner, "run_workflow", None)
    if run is None:
        raise TypeError(
            "runner must have an async run_workflow(name, *, run_id, input, scheduled_for, "
            f"signal) method (gnl.create_gnl(...) returns one), not {type(runner).__name__}"
        )
    require_async(run, "runner.run_workflow")


def _check_poll_args(concurrency: int | None, lock_ttl_ms: int, retry_ms: int) -> None:
    if concurrency is not None:
        check_int(concurrency, "concurrency", 1)
    check_lease(lock_ttl_ms, "lock_ttl_ms")
    check_int(retry_ms, "retry_ms", 1, MAX_DURATION_MS)


def _declared(runner: Runner) -> Collection[str] | None:
    """The workflow names ``runner`` declares (a ``workflows`` mapping, as
    :func:`gnl.create_gnl`'s runner has), or None: a runner that does not say is handed every
    due trigger."""
    workflows = getattr(runner, "workflows", None)
    return workflows if isinstance(workflows, Mapping) else None


#: The (trigger id, workflow) pairs this process left for another one, each logged once.
_LEFT: set[tuple[str, str]] = set()


def _leave(r: _native.RawTrigger, declared: Collection[str]) -> None:
    if (r.id, r.name) in _LEFT:
        return
    _LEFT.add((r.id, r.name))
    log.warning(
        "gnl scheduler: trigger %r fires workflow %r, which this process does not declare "
        "(declared: %s): left for a process that declares it (nothing is fired or spent)",
        r.id,
        r.name,
        ", ".join(repr(k) for k in sorted(declared)) or "none",
    )


class _Poller:
    """The fires of one poller: its runner, options, in-flight fires and concurrency cap."""

    def __init__(
        self,
        journal: Storage | Journal,
        runner: Runner,
        concurrency: int | None,
        lock_ttl_ms: int,
        retry_ms: int,
    ) -> None:
        self.native = native_of(journal, "journal")
        _check_runner(runner)
        self.runner = runner
        self.lock_ttl_ms = lock_ttl_ms
        self.retry_ms = retry_ms
        self.sem = asyncio.Semaphore(concurrency) if concurrency is not None else None
        # Store calls of the fires in flight at once: a poll that finds 10,000 due triggers
        # must not queue 10,000 calls on a pool of ten connections (they would time out
        # waiting for one); runners are not capped by it.
        self.io = asyncio.Semaphore(_IO)
        # The state writes and lock releases of fires that have run: a cap of their own, so a
        # fire that ran is not kept holding its lock behind a poll's new fires.
        self.io_end = asyncio.Semaphore(_IO)
        self.inflight: dict[str, asyncio.Task[None]] = {}
        # The last due read's store clock, and the next instant a pending trigger is due at
        # after it (None: none is), epoch ms UTC.
        self.now = 0
        self.next_due: int | None = None

    async def due(self, now_ms: int | None) -> tuple[int, list[_native.RawTrigger]]:
        """Every due trigger not in flight here (pages of ``_PAGE``). Sets ``next_due``: the
        earliest instant after ``now`` a pending trigger is due at (the last page's read
        gives it), and ``now``."""
        now, rows, nxt = await _native.triggers_due(self.native, now_ms, None, _PAGE)
        out = list(rows)
        while len(rows) == _PAGE:
            last = rows[-1]
            assert last.next_run_at is not None
            _, rows, nxt = await _native.triggers_due(
                self.native, now, (last.next_run_at, last.id), _PAGE
            )
            out.extend(rows)
        self.now, self.next_due = now, nxt
        return now, [r for r in out if r.id not in self.inflight]

    async def poll(self, now_ms: int | None, result: PollResult) -> list[asyncio.Task[None]]:
        """Start a fire for every due trigger of a workflow the runner declares; returns their
        tasks."""
        now, rows = await self.due(now_ms)
        declared = _declared(self.runner)
        tasks = []
        for r in rows:
            if declared is not None and r.name not in declared:
                # Another app's, or a newer deploy's: its fire would fail as an unknown
                # workflow and spend the trigger's attempts. Left due, untouched (no lock, no
                # write) for a process that declares it, as the waker leaves such runs. The
                # due read is not capped (keyset pages to the end), so such triggers cannot
                # crowd out this runner's own.
                _leave(r, declared)
                continue
            t = asyncio.create_task(self._fire_capped(r, now, result))
            self.inflight[r.id] = t
            t.add_done_callback(self._landed(r.id))
            tasks.append(t)
        return tasks

    def _landed(self, id: str) -> Callable[[asyncio.Task[None]], None]:
        def landed(_t: asyncio.Task[None]) -> None:
            self.inflight.pop(id, None)

        return landed

    async def _fire_capped(self, r: _native.RawTrigger, now: int, result: PollResult) -> None:
        try:
            if self.sem is None:
                await self._fire(r, now, result)
            else:
                async with self.sem:
                    await self._fire(r, now, result)
        except Exception as e:  # a store error: the trigger is due again at the next poll
            log.warning("gnl scheduler: trigger %r was not fired this poll: %s", r.id, e)
            result.skipped += 1

    async def _fire(self, r: _native.RawTrigger, now: int, result: PollResult) -> None:
        native = self.native
        began = time.monotonic()
        dropped = 0
        if r.retry_slot is not None:
            slot, owed = r.retry_slot, r.owed_slot
        else:
            if r.owed_slot is None:
                return
            spec: str | int = r.spec if r.kind == "cron" else int(r.spec)
            plan = _native.misfire_plan(
                r.kind,
                spec,
                r.anchor_ms,
                r.owed_slot,
                now,
                r.misfire_grace_ms,
                r.misfire,
                r.max_catchup,
            )
            if plan.skipped and plan.oldest_skipped is not None and r.max_catchup is not None:
                log.warning(
                    _native.max_catchup_warning(
                        r.id, r.max_catchup, plan.skipped, plan.oldest_skipped
                    )
                )
            dropped, owed = plan.dropped, plan.next_slot
            if plan.fire is None:
                if dropped:
                    log.warning(
                        "gnl scheduler: trigger %r missed %d occurrence(s) (misfire=%r): not fired",
                        r.id,
                        dropped,
                        r.misfire,
                    )
                st = _state(
                    r,
                    missed=r.missed + dropped,
                    owed_slot=owed,
                    next_run_at=owed,
                    state="pending" if owed is not None else "done",
                )
                async with self.io:
                    await _native.trigger_update(native, r.id, r.version, st, None)
                return
            slot = plan.fire
        run_id = f"sched:{r.id}:{r.fire_count}"
        key = f"{run_id}:fire"
        # The lock and the re-read in one turn of the store calls' cap: a lock is not held
        # while its fire waits behind a poll's other fires. It is renewed from the moment it is
        # acquired (the keeper's clock starts when the acquisition was sent).
        async with self.io:
            sent = time.monotonic()
            token = await _native.lock_acquire(native, key, _owner(), self.lock_ttl_ms)
            if token is None:
                result.skipped += 1
                return
            signal = RevocationSignal()
            loop = asyncio.get_running_loop()
            done = asyncio.Event()

            def lost(why: str) -> None:
                signal.abort(why, f"fire {run_id!r} lost its fire lock")
                loop.call_later(self.lock_ttl_ms / 1000, warn_still_running)

            def warn_still_running() -> None:
                if not done.is_set():
                    log.warning(
                        "gnl scheduler: fire %r is still running %d ms after it lost its fire "
                        "lock; another poller may fire it too",
                        run_id,
                        self.lock_ttl_ms,
                    )

            keeper = _native.RunKeeper(
                native,
                run_id,
                self.lock_ttl_ms,
                None,
                key,
                token,
                lost,
                loop,
                age_ms(sent),
            )
            try:
                cur = await _native.trigger_get(native, r.id)
            except BaseException:
                await keeper.stop()
                raise
        try:
            if cur is None or cur.version != r.version:
                result.skipped += 1  # another poller fired it meanwhile
                return
            if not keeper.held():
                # The lock lapsed before the fire (the store or this process too slow):
                # another poller may own the slot now. The trigger stays due.
                result.skipped += 1
                return

            input = None if r.input is None else json.loads(r.input)
            base = {"missed": r.missed + dropped, "owed_slot": owed}
            try:
                await self.runner.run_workflow(
                    r.name, run_id=run_id, input=input, scheduled_for=slot, signal=signal
                )
            except Exception as e:
                # Busy elsewhere, stopped by this process's shutdown (the run is suspended for
                # the waker), or its lease lost (this process stalled past it: another
                # execution carries the run on): the slot is retried by the next poller under
                # the same run id, and no attempt is spent: the run did not fail.
                busy = isinstance(e, RunBusyError) and e.at_lock_acquisition
                why = e.why if isinstance(e, ExecutionRevokedError) else None
                # An at-most-once step that an earlier execution (a crashed process) started
                # and never recorded: every retry would stop at it again until an operator
                # resolves it. The slot waits for that, retried every `retry_ms`, spending no
                # attempt (spent, a crash during such a step ended a recurring schedule for
                # good within seconds, and re-arming it fired a new run that repeated the
                # side effect).
                if isinstance(e, StepOutcomeUnknownError):
                    st = _state(
                        r,
                        **base,
                        retry_slot=slot,
                        next_run_at=now + self.retry_ms,
                        deferrals=r.deferrals + 1,
                        last_deferral_at=now + age_ms(began),
                        last_error=f"{type(e).__name__}: {e}",
                    )
                    result.skipped += 1
                    result.deferred += 1
                    log.warning(
                        "gnl scheduler: fire %r of trigger %r waits for an operator: its "
                        "at-most-once step %r (n=%d) started in an earlier execution and has no "
                        "recorded outcome; resolve it (gnl runs resolve %s %s --value JSON, or "
                        "--retry) and the slot runs on; retried every %d ms, no attempt spent",
                        run_id,
                        r.id,
                        e.step,
                        e.n,
                        run_id,
                        e.step,
                        self.retry_ms,
                    )
                elif not (busy or why in ("shutdown", "lease-lost")):
                    st = self._failed(r, now, slot, base, e, run_id)
                    result.fired += 1
                    result.failed += 1
                    result.run_ids.append(run_id)
                else:
                    # Retried `retry_ms` after the poll's instant (`now`); deferred when the
                    # refusal came, which for a fire stopped by shutdown may be a while after
                    # (the time since `now` on this process's clock).
                    st = _state(
                        r,
                        **base,
                        retry_slot=slot,
                        next_run_at=now + self.retry_ms,
                        deferrals=r.deferrals + 1,
                        last_deferral_at=now + age_ms(began),
                    )
                    result.skipped += 1
                    result.deferred += 1
                    log.log(
                        logging.WARNING if why == "lease-lost" else logging.INFO,
                        "gnl scheduler: fire %r of trigger %r deferred %d ms (%s); "
                        "no attempt spent",
                        run_id,
                        r.id,
                        self.retry_ms,
                        "its run is being executed elsewhere"
                        if busy
                        else "stopped by shutdown: its run is suspended for the waker"
                        if why == "shutdown"
                        else "its run lost its lease: this process stalled past it and another "
                        "execution took the run over",
                    )
            else:
                st = _state(
                    r,
                    **base,
                    state="pending" if owed is not None else "done",
                    fire_count=r.fire_count + 1,
                    next_run_at=owed,
                    retry_slot=None,
                    attempts=0,
                    last_fired_at=now,
                    last_scheduled_for=slot,
                )
                result.fired += 1
                result.run_ids.append(run_id)
            finally:
                done.set()
            try:
                async with self.io_end:
                    written = await _native.trigger_update(
                        native, r.id, r.version, st, (key, token)
                    )
            except GnlError as e:
                log.warning(
                    "gnl scheduler: fire %r ran but its state could not be written (%s); the "
                    "slot fires again under the same run id",
                    run_id,
                    e,
                )
                return
            if not written:
                log.warning(
                    "gnl scheduler: fire %r lost its fire lock before its state was written; "
                    "the write was discarded (another poller owns the slot)",
                    run_id,
                )
        finally:
            async with self.io_end:
                await keeper.stop()

    def _failed(
        self,
        r: _native.RawTrigger,
        now: int,
        slot: int,
        base: dict[str, Any],
        e: BaseException,
        run_id: str,
    ) -> _native.TriggerStateTuple:
        attempts = r.attempts + 1
        error = f"{type(e).__name__}: {e}"
        if log.isEnabledFor(logging.DEBUG):
            # Where it failed (the trigger records the error's one line).
            log.debug("gnl scheduler: fire %r of trigger %r raised", run_id, r.id, exc_info=e)
        if attempts >= r.max_attempts:
            log.warning(
                "gnl scheduler: trigger %r failed after %d attempts and fires no more: %s "
                "(once the cause is fixed, gnl runs resume %s runs the slot and re-arms the "
                "trigger; gnl triggers unschedule %s, then registering it again, fires its next "
                "slots as new runs)",
                r.id,
                attempts,
                error,
                run_id,
                r.id,
            )
            return _state(
                r,
                **base,
                state="failed",
                attempts=attempts,
                last_error=error,
                retry_slot=None,
                next_run_at=None,
            )
        delay = min(_BACKOFF_BASE_MS * 2 ** (attempts - 1), _BACKOFF_MAX_MS)
        log.warning(
            "gnl scheduler: fire %r of trigger %r failed (attempt %d of %d), retried in %d ms: %s",
            run_id,
            r.id,
            attempts,
            r.max_attempts,
            delay,
            error,
        )
        return _state(
            r,
            **base,
            attempts=attempts,
            last_error=error,
            retry_slot=slot,
            next_run_at=now + delay,
        )


async def poll_scheduler(
    journal: Storage | Journal,
    runner: Runner,
    concurrency: int | None = None,
    lock_ttl_ms: int = 60_000,
    retry_ms: int = 30_000,
    now_ms: int | None = None,
) -> PollResult:
    """Fire every due trigger once, concurrently, and wait for the fires.

    Args:
        journal: The store.
        runner: An object with ``async run_workflow(name, *, run_id, input, scheduled_for,
            signal)`` (``gnl.create_gnl(...)`` returns one). When it has a ``workflows``
            mapping (as ``create_gnl``'s runner), a due trigger of a workflow not in it is not
            fired nor counted: it stays due for a process that declares that workflow.
        concurrency: At most this many fires at once (default: no cap).
        lock_ttl_ms: The fire lock's TTL (ms >= 100), renewed every third of it.
        retry_ms: How long a busy run (``RunBusyError(at_lock_acquisition=True)``) defers
            its trigger.
        now_ms: The instant due-time and misfire decisions use (epoch ms; default: the store's
            clock). Locks always use the store's clock.

    Returns:
        A :class:`PollResult`.

    Raises:
        InvalidArgumentError / TypeError: a bad argument, e.g. a runner without an async
            ``run_workflow`` (nothing is read or written).
        StoreUnavailableError: the store cannot be reached for the due read.
    """
    _check_poll_args(concurrency, lock_ttl_ms, retry_ms)
    if now_ms is not None:
        check_int(now_ms, "now_ms", 0)
    result = PollResult()
    p = _Poller(journal, runner, concurrency, lock_ttl_ms, retry_ms)
    tasks = await p.poll(now_ms, result)
    if tasks:
        await asyncio.gather(*tasks)
    return result


class Scheduler:
    """A poll loop (:func:`create_scheduler`): :meth:`start`, then ``await`` :meth:`stop`."""

    def __init__(self, poller: _Poller, poll_ms: int, max_poll_ms: int) -> None:
        self._p = poller
        self.poll_ms = poll_ms
        self.max_poll_ms = max_poll_ms
        self._task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None
        #: Totals over the scheduler's polls.
        self.totals = PollResult()

    def start(self) -> None:
        """Start polling on the running event loop (a second call changes nothing)."""
        if self._task is None:
            self._stopping = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        assert self._stopping is not None
        native = self._p.native
        interval = self.poll_ms
        while not self._stopping.is_set():
            # Read before the poll: a trigger registered after this look ends the sleep at
            # once (docs/DECISIONS.md "Wake-ups").
            seen = _wake.version(native, "triggers")
            polled = time.monotonic()
            try:
                started = await self._p.poll(None, self.totals)
                interval = self.poll_ms if started else min(interval * 2, self.max_poll_ms)
                sleep = self._until_due(interval, polled)
            except (StoreUnavailableError, GnlError) as e:
                log.warning("gnl scheduler: poll failed, retrying in %d ms: %s", interval, e)
                interval = min(interval * 2, max(self.max_poll_ms, 5_000))
                sleep = interval
            if await _wake.sleep(native, "triggers", seen, sleep, self._stopping):
                # A trigger was registered: poll now, the backoff starts over. Not sooner
                # than _WAKE_GAP after the last poll: SQLite's watcher wakes on every commit
                # of another connection, whatever it wrote.
                interval = self.poll_ms
                gap = _WAKE_GAP - (time.monotonic() - polled)
                if gap > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), gap)

    def _until_due(self, interval: int, polled: float) -> int:
        """The sleep after a poll (ms): the backoff's ``interval``, but no later than the next
        instant a pending trigger is due at, as the poll's read of the store gave it (its
        clock; the time since the poll began counts): a fire is not late by the backoff."""
        nxt = self._p.next_due
        if nxt is None:
            return interval
        left = nxt - self._p.now - int((time.monotonic() - polled) * 1000)
        return max(1, min(interval, left))

    async def stop(self) -> None:
        """Stop polling and wait for the fires in flight to finish."""
        if self._task is None or self._stopping is None:
            return
        self._stopping.set()
        await self._task
        inflight = list(self._p.inflight.values())
        if inflight:
            await asyncio.gather(*inflight, return_exceptions=True)
        self._task = None

    def __repr__(self) -> str:
        state = "running" if self._task is not None else "stopped"
        return f"<gnl.Scheduler {state} in_flight={len(self._p.inflight)}>"


def create_scheduler(
    journal: Storage | Journal,
    runner: Runner,
    poll_ms: int = 1_000,
    concurrency: int | None = None,
    lock_ttl_ms: int = 60_000,
    retry_ms: int = 30_000,
    max_poll_ms: int | None = None,
) -> Scheduler:
    """A poll loop over :func:`poll_scheduler`'s fires that does not wait for earlier fires
    (a long workflow on one trigger does not delay another trigger).

    Args:
        journal: The store.
        runner: As for :func:`poll_scheduler`.
        poll_ms: The poll interval (ms >= 1); a poll that started nothing doubles it up to
            ``max_poll_ms`` (default ``poll_ms * 4``), a fire resets it. A trigger registered
            meanwhile (this process; another one on Postgres and SQLite) wakes the loop at
            once and resets it too. The loop never sleeps past the next instant a pending
            trigger is due at (each poll's due read gives it): a slot fires on time
            whatever the backoff.
        concurrency: At most this many fires at once.
        lock_ttl_ms: The fire lock's TTL (ms).
        retry_ms: The deferral of a busy or shutdown-stopped fire (ms).
        max_poll_ms: The longest interval of the empty-poll backoff (ms >= ``poll_ms``).

    Returns:
        A stopped :class:`Scheduler`.

    Raises:
        InvalidArgumentError / TypeError: a bad argument, e.g. a runner without an async
            ``run_workflow``.
    """
    check_int(poll_ms, "poll_ms", 1, MAX_DURATION_MS)
    if max_poll_ms is not None:
        check_int(max_poll_ms, "max_poll_ms", poll_ms, MAX_DURATION_MS)
    _check_poll_args(concurrency, lock_ttl_ms, retry_ms)
    poller = _Poller(journal, runner, concurrency, lock_ttl_ms, retry_ms)
    return Scheduler(poller, poll_ms, max_poll_ms if max_poll_ms is not None else poll_ms * 4)
