"""The event log (API.md "Events"): ``emit`` / ``emit_many`` append to a topic's log; each
consumer name keeps its own cursor and ack markers (fan-out), under a leased lock with a
fencing token (``gnl_locks`` key ``events:<topic>:<name>``, renewed off the Python thread by
the native keeper). Acks are written with a compare-and-set after the handler returns
(group-committed per fetched batch): at-least-once delivery, exactly-once marking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from . import _native, _wake
from ._callables import require_async
from ._time import MAX_DURATION_MS, age_ms, check_int, check_lease
from .errors import ExecutionRevokedError, InvalidArgumentError, InvalidJobError
from .queue import JSON, JobSpec
from .signal import RevocationSignal
from .storage import Storage, WorkStore, native_of
from .worker import DrainResult

log = logging.getLogger("gnl")

__all__ = [
    "Consumer",
    "ConsumerInfo",
    "ConsumerLag",
    "DeadEvent",
    "EventMeta",
    "EventSpec",
    "consumer_lag",
    "create_consumer",
    "emit",
    "emit_many",
    "list_consumers",
    "list_dead_events",
    "retry_dead_event",
]

#: Events handed to a consumer per fetch (their acks are written together).
FETCH_BATCH = 100
_DEFAULT_DELAY_MS = 60_000
_MAX_DEFAULT_DELAY_MS = 3_600_000
_EVENT_KEYS = ("payload", "id", "org_id", "deliver_at", "delay_ms")
_ALL = 2**63 - 1


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One event for :func:`emit_many` (a dict with the same keys works too).

    Attributes:
        payload: A JSON value.
        id: The event id within its topic; None generates a time-ordered id.
        org_id: The organization; None: no organization.
        deliver_at: Not delivered before this instant (epoch ms UTC or aware datetime).
        delay_ms: Not delivered before now + this many ms (store clock).
    """

    payload: JSON = None
    id: str | None = None
    org_id: str | None = None
    deliver_at: int | datetime | None = None
    delay_ms: int | None = None


@dataclass(frozen=True, slots=True)
class EventMeta:
    """What a handler is told about the event it handles.

    Attributes:
        id: The event id.
        topic: Its topic.
        consumer: The consumer name delivering it.
        org_id: Its organization, or None.
        emitted_at: When it was emitted (epoch ms UTC, store clock).
        attempt: This delivery's attempt (1-based): the attempts charged before it + 1. A
            delivery whose batch's holder died or lost its lease before settling it is not
            charged, so an event redelivered after that is on the same attempt again.
        signal: Aborts with ``lease-lost`` (another process holds the consumer now) or
            ``timeout`` (``max_hold_ms`` ran out).
    """

    id: str
    topic: str
    consumer: str
    org_id: str | None
    emitted_at: int
    attempt: int
    signal: RevocationSignal


# EventMeta's generated __init__ sets each frozen field through object.__setattr__, most of a
# delivery's Python cost (~1-2 µs of ~3); the consumer fills its slots directly (`_meta`).
_META_SLOTS = tuple(getattr(EventMeta, f.name).__set__ for f in fields(EventMeta))


def _meta(*values: object) -> EventMeta:
    """``EventMeta(*values)``, without the dataclass's __init__."""
    m: EventMeta = object.__new__(EventMeta)
    for put, v in zip(_META_SLOTS, values, strict=True):
        put(m, v)
    return m


@dataclass(frozen=True, slots=True)
class DeadEvent:
    """A quarantined event of one consumer.

    Attributes:
        id: The event id.
        topic: Its topic.
        consumer: The consumer name it was quarantined for.
        attempts: The deliveries charged to it: a failure, or a delivery on its own (charged
            before its handler runs). An event whose handler never returned (its process died
            or lost the lease) in ``max_attempts`` charged deliveries is quarantined at the
            next one without a handler call, so this is ``max_attempts + 1`` then.
        error: The last attempt's error.
        at: When it was quarantined (epoch ms UTC).
        payload: The event's payload.
        seq: Its position in the topic's log (``after_seq`` of :func:`list_dead_events`).
    """

    id: str
    topic: str
    consumer: str
    attempts: int
    error: str
    at: int
    payload: JSON
    seq: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """A consumer in a listing (:func:`list_consumers`).

    Attributes:
        topic: Its topic.
        consumer: Its name.
        heartbeat_at: The last write of its lease holder (epoch ms UTC), or None.
        dead: Its quarantine records (:func:`list_dead_events`).
    """

    topic: str
    consumer: str
    heartbeat_at: int | None
    dead: int


@dataclass(frozen=True, slots=True)
class ConsumerLag:
    """A consumer's position (for Studio and the CLI).

    Attributes:
        cursor: The last log position (seq) the cursor passed.
        behind: Events neither accepted nor quarantined yet.
        oldest_unacked_at: When the oldest of those was emitted (epoch ms), or None.
        heartbeat_at: The last write of its lease holder (epoch ms), or None.
        dead: Its quarantine records. An event handed back by :func:`retry_dead_event`
            keeps its record (and counts in ``behind`` too) until it is delivered again.
    """

    cursor: int
    behind: int
    oldest_unacked_at: int | None
    heartbeat_at: int | None
    dead: int


Handler = Callable[[Any, EventMeta], Awaitable[object]]
RetryDelay = int | Callable[[int], int] | None


def _spec(event: object) -> JobSpec:
    if isinstance(event, EventSpec):
        return JobSpec("e", event.payload, event.id, event.org_id, event.deliver_at, event.delay_ms)
    if isinstance(event, Mapping):
        for k in event:
            if k not in _EVENT_KEYS:
                raise TypeError(f"unknown event key {k!r}; an event has {', '.join(_EVENT_KEYS)}")
        if "payload" not in event:
            raise TypeError("an event needs a 'payload'")
        return JobSpec(
            "e",
            event["payload"],
            event.get("id"),
            event.get("org_id"),
            event.get("deliver_at"),
            event.get("delay_ms"),
        )
    raise TypeError(f"an event must be a dict or a gnl.EventSpec, not {type(event).__name__}")


def _strs(**args: object) -> None:
    """A TypeError naming the first argument that is not a str (the native call's own says
    only "'int' object is not an instance of 'str'")."""
    for name, value in args.items():
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")


def _event_error(e: BaseException) -> BaseException:
    msg = str(e).replace("run_at", "deliver_at").replace("job ", "event ")
    if isinstance(e, InvalidJobError):
        out = InvalidJobError(msg, e.index)
        out.__cause__ = e.__cause__
        return out
    return type(e)(msg)


async def emit(
    work: WorkStore | Storage,
    topic: str,
    payload: JSON,
    *,
    id: str | None = None,
    org_id: str | None = None,
    deliver_at: int | datetime | None = None,
    delay_ms: int | None = None,
) -> str:
    """Append one event to ``topic``'s log.

    Args:
        work: ``storage.work`` (or the Storage).
        topic: The topic (non-empty, at most 200 characters, no control characters).
        payload: A JSON value.
        id: The event id; an id already emitted on the topic is the same event (nothing is
            written). None: a generated time-ordered id.
        org_id: The organization (non-empty, at most 200 characters); None: none.
        deliver_at: Not delivered before this instant (epoch ms UTC or aware datetime).
        delay_ms: Not delivered before now + ``delay_ms`` (store clock, >= 0).

    Returns:
        The event id.

    Raises:
        TypeError: an argument of the wrong type, or a payload that is not JSON.
        InvalidArgumentError: a bad value (empty topic, bad id or org_id, NaN, negative
            delay, both deliver_at and delay_ms); nothing is written.
        StoreUnavailableError: the store cannot be reached.
    """
    _strs(topic=topic)
    spec = JobSpec("e", payload, id, org_id, deliver_at, delay_ms)
    try:
        ids = await _native.event_emit(native_of(work), topic, [spec], True)
    except (TypeError, InvalidArgumentError) as e:
        raise _event_error(e) from e.__cause__
    return str(ids[0])


async def emit_many(
    work: WorkStore | Storage,
    topic: str,
    events: Iterable[Mapping[str, Any] | EventSpec],
) -> list[str]:
    """Append many events to ``topic`` in one write, all or none.

    Args:
        work: ``storage.work`` (or the Storage).
        topic: The topic.
        events: Dicts ``{"payload", "id", "org_id", "deliver_at" | "delay_ms"}`` (only
            ``payload`` required) or :class:`EventSpec`; any number (100,000 and more: no
            parameter or packet limit reaches the caller).

    Returns:
        The event ids in call order (an id already emitted, or repeated, is one event).

    Raises:
        InvalidJobError: an event is invalid (``.index`` its position, ``__cause__`` the
            ``TypeError`` or ``InvalidArgumentError``); nothing is written.
        InvalidArgumentError: a bad topic.
        StoreUnavailableError: the store cannot be reached.
    """
    _strs(topic=topic)
    specs = []
    for i, ev in enumerate(events):
        try:
            specs.append(_spec(ev))
        except TypeError as e:
            err = InvalidJobError(f"event {i} is invalid: {e}", i)
            raise err from e
    try:
        ids = await _native.event_emit(native_of(work), topic, specs, False)
    except InvalidJobError as e:
        raise _event_error(e) from e.__cause__
    return [str(i) for i in ids]


def _payload(text: str) -> JSON:
    return json.loads(text)


async def list_dead_events(
    work: WorkStore | Storage,
    topic: str,
    consumer: str,
    *,
    after_seq: int = 0,
    limit: int | None = None,
) -> list[DeadEvent]:
    """The quarantined events of ``consumer`` on ``topic``, in log order.

    Args:
        work: A :class:`~gnl.Storage` or its work store.
        topic: The topic.
        consumer: The consumer name.
        after_seq: The next page: only records past this log position (the last record's
            :attr:`DeadEvent.seq` of the previous page).
        limit: At most this many (at least 1); None: all of them.

    Raises:
        InvalidArgumentError: a bad topic or consumer name, a negative ``after_seq`` or a
            ``limit`` below 1.
        TypeError: ``topic`` or ``consumer`` is not a str.
        StoreUnavailableError: the store cannot be reached.
    """
    _strs(topic=topic, consumer=consumer)
    check_int(after_seq, "after_seq", 0)
    if limit is not None:
        check_int(limit, "limit", 1)
    n = _ALL if limit is None else limit
    rows = await _native.event_dead(native_of(work), topic, consumer, after_seq, n)
    return [DeadEvent(r[0], topic, consumer, r[3], r[4], r[5], _payload(r[6]), r[1]) for r in rows]


async def list_consumers(
    work: WorkStore | Storage,
    *,
    after: tuple[str, str] | None = None,
    limit: int = 100,
) -> list[ConsumerInfo]:
    """The consumers that ever ran, in ``(topic, consumer)`` order, each with its count of
    quarantined events (Studio's dead-events page; :func:`list_dead_events` lists them).

    Args:
        work: A :class:`~gnl.Storage` or its work store.
        after: The next page: only consumers after this ``(topic, consumer)`` pair.
        limit: At most this many (1 to 10,000).

    Raises:
        InvalidArgumentError: ``limit`` out of range.
        TypeError: ``after`` is not a pair of str.
        StoreUnavailableError: the store cannot be reached.
    """
    check_int(limit, "limit", 1, 10_000)
    if after is not None and not (
        isinstance(after, tuple) and len(after) == 2 and all(isinstance(x, str) for x in after)
    ):
        raise TypeError("after must be a (topic, consumer) pair of str")
    rows = await _native.event_consumers(native_of(work), after, limit)
    return [ConsumerInfo(*r) for r in rows]


async def retry_dead_event(work: WorkStore | Storage, topic: str, consumer: str, id: str) -> bool:
    """Hand quarantined event ``id`` back to ``consumer`` for a fresh series of attempts.

    Returns:
        True when it is handed back (True again, changing nothing, while it waits for its
        redelivery); False when no such quarantine record exists.

    Raises:
        InvalidArgumentError: a bad topic, consumer name or id (an empty id names no event).
        TypeError: an argument that is not a str.
        StoreUnavailableError: the store cannot be reached.
    """
    _strs(topic=topic, consumer=consumer, id=id)
    return bool(await _native.event_dead_retry(native_of(work), topic, consumer, id))


async def consumer_lag(work: WorkStore | Storage, topic: str, consumer: str) -> ConsumerLag | None:
    """Consumer ``(topic, consumer)``'s position and heartbeat; None when it never ran.

    Raises:
        InvalidArgumentError: a bad topic or consumer name.
        TypeError: ``topic`` or ``consumer`` is not a str.
        StoreUnavailableError: the store cannot be reached.
    """
    _strs(topic=topic, consumer=consumer)
    r = await _native.event_lag(native_of(work), topic, consumer)
    return None if r is None else ConsumerLag(*r)


def _default_delay(attempt: int) -> int:
    return int(min(_DEFAULT_DELAY_MS * 2 ** min(attempt - 1, 30), _MAX_DEFAULT_DELAY_MS))


class Consumer:
    """A named consumer of a topic (:func:`create_consumer`). One process at a time runs a
    given (topic, name): it holds the consumer's lease; another takes over when it goes stale.
    """

    def __init__(
        self,
        work: WorkStore | Storage,
        topic: str,
        handler: Handler,
        *,
        name: str,
        max_attempts: float,
        retry_delay_ms: RetryDelay,
        max_hold_ms: int | None,
        lease_ms: int,
        poll_ms: int,
        max_poll_ms: int | None,
    ) -> None:
        self._native = native_of(work)
        self.topic = topic
        self.name = name
        self.handler = handler
        self.max_attempts = max_attempts
        self.retry_delay_ms = retry_delay_ms
        self.max_hold_ms = max_hold_ms
        self.lease_ms = lease_ms
        self.poll_ms = poll_ms
        self.max_poll_ms = max_poll_ms if max_poll_ms is not None else poll_ms * 32
        self._key = _native.event_lease_key(topic, name)
        self._owner = f"{os.getpid()}:{secrets.token_hex(6)}"
        self._task: asyncio.Task[DrainResult] | None = None
        self._runner: asyncio.Task[Any] | None = None
        self._ended: asyncio.Event | None = None
        self._stop = False
        self._wake: asyncio.Event | None = None
        self._signal: RevocationSignal | None = None
        self._lost = False
        #: Called with (meta, error) at the end of each failed delivery, however it failed:
        #: the handler raised or returned past max_hold_ms (``gnl run`` logs each through it).
        self._on_failed: Callable[[EventMeta, str], None] | None = None

    def start(self) -> None:
        """Start consuming on the running loop (until :meth:`stop`)."""
        if self._task is not None and not self._task.done():
            return
        self._stop = False
        self._task = asyncio.get_running_loop().create_task(self._run(drain=False))

    async def stop(self) -> None:
        """Stop consuming: no new fetch; the batch in hand finishes (its handlers run, its
        acks are written), then the lease is released.

        Called from outside the consumer (another task), it returns once that is done, for
        :meth:`start` as for a running :meth:`drain` (which then returns what it ran). Called
        from a handler, it returns at once and the loop ends after the current batch.
        """
        self._stop = True
        if self._wake is not None:
            self._wake.set()
        if self._runner is not None and self._runner is not asyncio.current_task():
            ended = self._ended
            if ended is not None:
                await ended.wait()
        if self._task is not None and self._task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def drain(self) -> DrainResult:
        """Deliver until no event is due for this consumer (or :meth:`stop` is called), then
        return what ran (an event quarantined unrun after ``max_attempts`` deliveries that
        never returned counts as processed and failed).

        Raises:
            StoreUnavailableError: the store cannot be reached.
        """
        self._stop = False
        return await self._run(drain=True)

    async def lag(self) -> ConsumerLag | None:
        """This consumer's position (:func:`consumer_lag`)."""
        r = await _native.event_lag(self._native, self.topic, self.name)
        return None if r is None else ConsumerLag(*r)

    async def __aenter__(self) -> Consumer:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the loop ---------------------------------------------------------------------

    async def _sleep(self, ms: int, seen: int | None = None) -> bool:
        """Sleep ``ms`` ms or until :meth:`stop`; with ``seen`` (the "events" wake-up version
        read before the last look), also until an emit: then True."""
        self._wake = asyncio.Event()
        if self._stop:
            return False
        if seen is not None:
            return await _wake.sleep(self._native, "events", seen, ms, self._wake)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), ms / 1000)
        return False

    def _lose(self, why: str) -> None:
        self._lost = True
        if self._signal is not None:
            self._signal.abort(why, f"consumer {self.name!r} of {self.topic!r} lost its lease")

    async def _run(self, drain: bool) -> DrainResult:
        self._runner, self._ended = asyncio.current_task(), asyncio.Event()
        try:
            return await self._loop(drain)
        finally:
            self._ended.set()
            self._runner = None

    async def _loop(self, drain: bool) -> DrainResult:
        done = [0, 0, 0]
        interval = self.poll_ms
        while not self._stop:
            try:
                sent = time.monotonic()
                token = await _native.lock_acquire(
                    self._native, self._key, self._owner, self.lease_ms
                )
                if token is None or not await _native.event_consumer_open(
                    self._native, self.topic, self.name, token
                ):
                    if token is not None:
                        await _native.lock_release(self._native, self._key, token)
                    if drain:
                        await self._sleep(min(self.poll_ms, 50))
                        continue
                    await self._sleep(interval)
                    interval = min(interval * 2, self.max_poll_ms)
                    continue
            except Exception as e:  # noqa: BLE001
                if drain:
                    raise
                log.warning("gnl consumer %s/%s: %s; retrying", self.topic, self.name, e)
                await self._sleep(interval)
                interval = min(interval * 2, self.max_poll_ms)
                continue
            self._lost = False
            keeper = _native.RunKeeper(
                self._native,
                "",
                self.lease_ms,
                None,
                self._key,
                token,
                self._lose,
                asyncio.get_running_loop(),
                age_ms(sent),
            )
            try:
                while not self._stop and not self._lost:
                    # Read before the fetch looks: an emit after it wakes the sleep below.
                    seen = _wake.version(self._native, "events")
                    try:
                        rows = await self._fetch(token)
                    except Exception as e:  # noqa: BLE001
                        if drain:
                            raise
                        log.warning("gnl consumer %s/%s: %s; retrying", self.topic, self.name, e)
                        await self._sleep(interval)
                        interval = min(interval * 2, self.max_poll_ms)
                        continue
                    if rows is None:
                        break  # another holder took over
                    if not rows:
                        if drain:
                            return DrainResult(*done)
                        if await self._sleep(interval, seen):
                            interval = self.poll_ms  # an emit: the backoff starts over
                        else:
                            interval = min(interval * 2, self.max_poll_ms)
                        continue
                    interval = self.poll_ms
                    outcomes = []
                    for row in rows:
                        if self._lost:
                            break
                        outcomes.append(await self._deliver(row, done))
                    await self._settle(token, outcomes, drain)
            finally:
                await keeper.stop()
        return DrainResult(*done)

    async def _fetch(self, token: int) -> list[tuple[int, str, str, str, int, int]] | None:
        """The next batch (None: another holder took over): at once on this thread when the
        store can (a SQLite file whose locks are free), else through the runtime."""
        now = _native.event_fetch_now(self._native, self.topic, self.name, token, FETCH_BATCH)
        if now is not None:
            return now[0]
        return await _native.event_fetch(self._native, self.topic, self.name, token, FETCH_BATCH)

    async def _settle(
        self, token: int, outcomes: list[tuple[int, str | None, int | None]], drain: bool
    ) -> None:
        delay = self.poll_ms
        while True:
            try:
                args = (self._native, self.topic, self.name, token, outcomes)
                if _native.event_settle_now(*args) is None:
                    await _native.event_settle(*args)
                return
            except Exception as e:  # noqa: BLE001
                if drain or self._lost:
                    raise
                log.warning(
                    "gnl consumer %s/%s: acks not written (%s); retrying", self.topic, self.name, e
                )
                await asyncio.sleep(delay / 1000)
                delay = min(delay * 2, self.max_poll_ms)

    async def _deliver(
        self, row: tuple[int, str, str, str, int, int], done: list[int]
    ) -> tuple[int, str | None, int | None]:
        seq, id, org, payload, emitted_at, attempt = row
        if attempt > self.max_attempts:
            # Its max_attempts deliveries were charged (each alone, counted before its handler
            # ran) and none settled: the handler killed its process (or a holder lost the lease)
            # every time. Quarantined without a handler call.
            done[0] += 1
            done[2] += 1
            why = (
                f"attempt {attempt - 1} never returned: its process ended or lost the lease "
                "before the handler finished"
            )
            log.warning(
                "gnl consumer %s/%s: event %r is quarantined (gnl events dead): %s",
                self.topic,
                self.name,
                id,
                why,
            )
            return (seq, why, None)
        signal = RevocationSignal()
        self._signal = signal
        meta = _meta(id, self.topic, self.name, org or None, emitted_at, attempt, signal)
        timer = None
        if self.max_hold_ms is not None:
            timer = asyncio.get_running_loop().call_later(
                self.max_hold_ms / 1000, signal.abort, "timeout", "max_hold_ms ran out"
            )
        done[0] += 1
        try:
            await self.handler(json.loads(payload), meta)
            if signal.aborted and signal.reason is not None and signal.reason.why == "timeout":
                raise signal.reason
        except Exception as e:  # noqa: BLE001
            done[2] += 1
            reason = signal.reason
            if (
                isinstance(e, ExecutionRevokedError)
                and reason is not None
                and reason.why == "timeout"
            ):
                # Worded as a job's (worker._timed_out): the same limit, the same error.
                err = f"timeout: the handler held the event past max_hold_ms={self.max_hold_ms}"
            else:
                err = f"{type(e).__name__}: {e}"
            if log.isEnabledFor(logging.DEBUG):
                # Where it failed (the event records the error's one line).
                log.debug(
                    "gnl consumer %s/%s: event %r attempt %d raised",
                    self.topic,
                    self.name,
                    meta.id,
                    meta.attempt,
                    exc_info=e,
                )
            if self._on_failed is not None:
                try:
                    self._on_failed(meta, err)
                except Exception:  # noqa: BLE001 - a hook's failure must not end the consumer
                    log.exception(
                        "gnl consumer %s/%s: the failure hook raised", self.topic, self.name
                    )
            if attempt >= self.max_attempts:
                return (seq, err, None)
            return (seq, err, self._delay(attempt))
        finally:
            if timer is not None:
                timer.cancel()
            self._signal = None
        done[1] += 1
        return (seq, None, None)

    def _delay(self, attempt: int) -> int:
        d = self.retry_delay_ms
        if d is None:
            return _default_delay(attempt)
        if isinstance(d, int):
            return d
        try:
            return check_int(d(attempt), "retry_delay_ms(attempt)", 0, MAX_DURATION_MS)
        except Exception as e:  # noqa: BLE001
            log.error(
                "gnl consumer %s: retry_delay_ms(%d) failed (%s); using the default",
                self.name,
                attempt,
                e,
            )
            return _default_delay(attempt)


def create_consumer(
    work: WorkStore | Storage,
    topic: str,
    handler: Handler,
    *,
    name: str,
    max_attempts: float = 8,
    retry_delay_ms: RetryDelay = None,
    max_hold_ms: int | None = None,
    lease_ms: int = 30_000,
    poll_ms: int = 200,
    max_poll_ms: int | None = None,
) -> Consumer:
    """A named consumer of ``topic``: every name sees every event (fan-out), in log order.

    Args:
        work: ``storage.work`` (or the Storage).
        topic: The topic.
        handler: ``async def handler(payload, meta: gnl.EventMeta)``; the event is accepted
            when it returns, failed when it raises.
        name: The consumer name (its cursor and ack markers).
        max_attempts: Quarantine after this many failed attempts (>= 1; ``math.inf``: never).
            A death of the process (or a lost lease) counts for the event it hit only: the
            rest of its batch is redelivered uncharged, one event at a time.
        retry_delay_ms: Delay (ms) before a failed event is delivered again: an int, or a
            callable of the failed attempt (1-based); default exponential from 60,000 ms,
            doubling, capped at 3,600,000 ms.
        max_hold_ms: A handler running longer gets ``meta.signal`` aborted with ``timeout``
            and its attempt counts as failed (default: no limit).
        lease_ms: The consumer's lease (ms >= 100, renewed every third of it off the Python
            thread).
        poll_ms: Poll interval (ms) when nothing is due; doubles up to ``max_poll_ms``
            (default ``poll_ms * 32``). An emit wakes the consumer at once through the same
            Storage (and from another process on Postgres and SQLite), resetting it.
        max_poll_ms: The poll interval's cap.

    Raises:
        TypeError: an argument of the wrong type.
        InvalidArgumentError: a bad value (empty topic or name, max_attempts < 1, ...).
    """
    _strs(topic=topic, name=name)
    require_async(handler, f"the handler of consumer {name!r}")
    options: dict[str, Any] = {
        "max_attempts": max_attempts,
        "retry_delay_ms": retry_delay_ms,
        "max_hold_ms": max_hold_ms,
        "lease_ms": lease_ms,
        "poll_ms": poll_ms,
        "max_poll_ms": max_poll_ms,
    }
    _check_consumer(topic, name, options)
    return Consumer(work, topic, handler, name=name, **options)


def _check_consumer(topic: str, name: str, options: Mapping[str, Any]) -> None:
    """:func:`create_consumer`'s checks of a consumer's key and ``options`` (its keyword
    arguments after ``name``), without I/O: also what ``App.consumer`` checks at declaration
    (one set of rules, one set of errors)."""
    _native.event_lease_key(topic, name)  # checks topic and name
    max_attempts = options["max_attempts"]
    retry_delay_ms = options["retry_delay_ms"]
    max_hold_ms = options["max_hold_ms"]
    poll_ms = options["poll_ms"]
    max_poll_ms = options["max_poll_ms"]
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, (int, float)):
        raise TypeError(
            f"max_attempts must be an int or math.inf, not {type(max_attempts).__name__}"
        )
    if isinstance(max_attempts, float) and max_attempts != math.inf:
        raise InvalidArgumentError("max_attempts must be an int or math.inf")
    if max_attempts < 1:
        raise InvalidArgumentError(f"max_attempts must be >= 1, got {max_attempts}")
    if retry_delay_ms is not None and not callable(retry_delay_ms):
        check_int(retry_delay_ms, "retry_delay_ms", 0, MAX_DURATION_MS)
    if max_hold_ms is not None:
        check_int(max_hold_ms, "max_hold_ms", 1, MAX_DURATION_MS)
    check_lease(options["lease_ms"], "lease_ms")
    check_int(poll_ms, "poll_ms", 1, MAX_DURATION_MS)
    if max_poll_ms is not None:
        check_int(max_poll_ms, "max_poll_ms", poll_ms, MAX_DURATION_MS)
