"""The queue worker (API.md "Queue"): claims jobs and runs their handlers on the asyncio loop.

Every store round trip, the lease renewal timer and the group-committed outcome writes are
native (``gnl._native.NativeWorker``); this module runs handlers and keeps the poll loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from . import _native
from ._time import MAX_DURATION_MS, check_int
from .durable import run_step
from .errors import ExecutionRevokedError, GnlError, InvalidArgumentError, StoreUnavailableError
from .signal import RevocationSignal
from .storage import Journal, Storage, WorkStore, storage_of

__all__ = ["DrainResult", "Handler", "JobContext", "Worker", "create_worker"]

log = logging.getLogger("gnl")

#: ``async def handler(payload, ctx) -> JSON | None``
Handler = Callable[[Any, "JobContext"], Awaitable[Any]]

#: A claimed job: (seq, token, org_id, id, type, payload_json, attempt).
ClaimedJob = tuple[int, int, str | None, str, str, str, int]

#: The weight of the newest sample in the moving averages of handler and claim times.
_EWMA = 0.2


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What :meth:`Worker.drain` did.

    Attributes:
        processed: Handler runs.
        succeeded: Runs whose handler returned (and whose result was recorded).
        failed: Runs that failed (raised, timed out, or returned a non-JSON result).
    """

    processed: int
    succeeded: int
    failed: int


class JobContext:
    """What a handler gets besides its payload.

    Attributes:
        job_id: The job id.
        type: The job type.
        org_id: Its organization, or None.
        attempt: 1-based attempt number (counted at claim time, so a crash uses one up).
        run_id: The job's durable run id, stable across reclaims and retries of this job.
        journal: The journal (``storage.journal``).
        signal: Aborts when the job is canceled, the lease is lost, or ``max_hold_ms`` runs
            out (see :class:`RevocationSignal`).
    """

    __slots__ = (
        "_native",
        "_run_id",
        "_timer",
        "_warned",
        "attempt",
        "job_id",
        "journal",
        "org_id",
        "signal",
        "type",
    )

    def __init__(
        self,
        native: _native.NativeStore,
        journal: Journal,
        job_id: str,
        type: str,
        org_id: str | None,
        attempt: int,
    ) -> None:
        self._native = native
        self.journal = journal
        self.job_id = job_id
        self.type = type
        self.org_id = org_id
        self.attempt = attempt
        self._run_id: str | None = None
        self.signal = RevocationSignal()
        self._timer: asyncio.TimerHandle | None = None
        self._warned = False

    @property
    def run_id(self) -> str:
        """The job's durable run id, stable across reclaims and retries of this job."""
        run_id = self._run_id
        if run_id is None:
            run_id = self._run_id = _native.job_run_id(self.org_id, self.job_id)
        return run_id

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` once per ``(run_id, name)`` and journal its result.

        The first completed result recorded for ``(run_id, name)`` is kept and returned on
        every later call, so a reclaimed or retried handler does not repeat the side effect.
        Two executors that race converge on the first recorded result.

        Args:
            name: The step's name, unique within the job.
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
        return await run_step(self._native, self.run_id, self.signal, name, fn, *args)

    def __repr__(self) -> str:
        return f"<gnl.JobContext {self.type} id={self.job_id!r} attempt={self.attempt}>"


RetryDelay = int | Callable[[int], int] | None


# The C scanner of a default decoder: what json.loads runs after skipping whitespace.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _decode(text: str) -> Any:
    """``json.loads`` of a payload as the store keeps it (compact JSON), without its two
    whitespace scans; anything else goes through ``json.loads``."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def _default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """A queue worker. Create it with :func:`create_worker`."""

    def __init__(
        self,
        storage: Storage,
        handlers: Mapping[str, Handler],
        *,
        ttl_ms: int,
        max_attempts: int,
        max_hold_ms: int | None,
        concurrency: int,
        poll_ms: int,
        max_poll_ms: int | None,
        retry_delay_ms: RetryDelay,
        name: str | None,
    ) -> None:
        self._storage = storage
        self._handlers = dict(handlers)
        self.ttl_ms = ttl_ms
        self.max_attempts = max_attempts
        self.max_hold_ms = max_hold_ms
        self.concurrency = concurrency
        self.poll_ms = poll_ms
        self.max_poll_ms = max_poll_ms if max_poll_ms is not None else poll_ms * 32
        self.retry_delay_ms = retry_delay_ms
        self.name = name or _default_name()
        self._native: _native.NativeWorker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._active: dict[int, JobContext] = {}
        # Jobs claimed ahead (prefetched), not started yet, in claim order; and the
        # revocations (seq -> why) that reached some of them before they started.
        self._ready: deque[ClaimedJob] = deque()
        self._revoked: dict[int, str] = {}
        self._slot = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopping = False
        self._draining = False
        self._claiming = False  # a claim is in flight
        self._waiting_slot = False  # the claim loop waits for a handler to end
        self._kick_due = False  # a _kick is scheduled
        # Moving averages: how long a handler runs, how long a claim takes (seconds).
        self._hold_s: float | None = None
        self._claim_s = 0.0
        self._counts = [0, 0, 0]  # processed, succeeded, failed

    # -- lifecycle ---------------------------------------------------------------------

    def _ensure_native(self) -> _native.NativeWorker:
        if self._native is None:
            loop = asyncio.get_running_loop()
            self._native = _native.NativeWorker(
                self._storage._native,
                self.name,
                self.ttl_ms,
                self.max_attempts,
                self._on_revoke,
                self._on_log,
                loop,
                list(self._handlers),
            )
            self._loop = loop
        return self._native

    @property
    def running(self) -> bool:
        """True between :meth:`start` and the end of :meth:`stop`."""
        return self._loop_task is not None and not self._loop_task.done()

    def start(self) -> None:
        """Start polling on the current asyncio loop. A second call does nothing.

        Raises:
            RuntimeError: no asyncio loop is running.
        """
        if self.running:
            return
        if self._draining:
            raise GnlError("start() cannot run while drain() is running")
        self._slot = asyncio.Event()
        self._wake = asyncio.Event()
        self._ensure_native()
        self._stopping = False
        self._loop_task = asyncio.get_running_loop().create_task(
            self._pump(drain=False), name=f"gnl-worker-{self.name}"
        )

    async def stop(self) -> None:
        """Stop claiming, wait for the handlers of the jobs this worker has claimed (running,
        or claimed ahead to start next) to return and their outcomes to be written. Releases
        nothing early. Idempotent."""
        self._stopping = True
        self._wake.set()
        self._slot.set()
        if self._loop_task is not None:
            await self._loop_task
            self._loop_task = None
        await self._settle()
        if self._native is not None:
            self._native.close()
            self._native = None

    async def __aenter__(self) -> Worker:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def drain(self) -> DrainResult:
        """Process jobs until none is due, then return what was done.

        Jobs that other workers hold, and retries that are not due yet, are not waited for.

        Raises:
            GnlError: the worker is started (stop it first).
            StoreUnavailableError: the store could not be reached.
        """
        if self.running:
            raise GnlError("drain() cannot run while the worker is started; stop() it first")
        if self._draining:
            raise GnlError("drain() is already running on this worker")
        self._draining = True
        self._slot = asyncio.Event()  # bound to this call's loop
        native = self._ensure_native()
        before = list(self._counts)
        try:
            await self._pump(drain=True)
            await native.flush()
        finally:
            await self._settle()
            # The native half belongs to this loop: a later drain() or start() may run on
            # another one (a new asyncio.run).
            native.close()
            self._native = None
            self._draining = False
        c = self._counts
        return DrainResult(c[0] - before[0], c[1] - before[1], c[2] - before[2])

    async def _settle(self) -> None:
        # Every job this worker claimed runs before this returns: the running ones, then
        # those claimed ahead, which start as slots free.
        while self._tasks or self._ready:
            if not self._tasks:
                self._fill()
                continue
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            # A task cancelled before its first step never ran _run's cleanup.
            for seq in [q for q, t in self._tasks.items() if t.done()]:
                del self._tasks[seq]
        if self._native is not None:
            try:
                await self._native.flush()
            except GnlError as e:
                log.warning("gnl worker %s: could not write job outcomes: %s", self.name, e)

    # -- the claim loop ------------------------------------------------------------------

    def _want(self) -> int:
        """How many jobs to claim now: the free slots, and the slots expected to free up
        before this claim's answer comes back (prefetch), less the jobs claimed ahead. Jobs
        claimed ahead count as started when a slot is free for them (``_fill`` starts them
        right after the claim goes out)."""
        c = self.concurrency
        running = len(self._tasks)
        ready = len(self._ready)
        starting = min(ready, c - running)
        running += starting
        ready -= starting
        ahead = 0
        hold = self._hold_s
        if hold is not None and running:
            claim = self._claim_s
            expected = running if hold <= claim else running * claim / hold
            ahead = min(c, int(expected + 0.5))
        return min(c, c - running + ahead - ready)

    async def _pump(self, drain: bool) -> None:
        """Claim while there is room; with ``drain``, until no job is due.

        The next claim goes out while the handlers of the last one run (the store and Python
        work at the same time): it asks for the free slots and for the slots expected to free
        up before its answer comes back, i.e. the handlers that run shorter than a claim.
        Jobs claimed ahead wait in ``_ready`` (renewed like running ones) and start, in claim
        order, as slots free; a worker with long handlers claims ahead (almost) nothing.
        """
        native = self._native
        assert native is not None
        loop = asyncio.get_running_loop()
        interval = self.poll_ms
        backoff = self.poll_ms
        busy_wait = 0.005
        while drain or not self._stopping:
            want = self._want()
            if want <= 0:
                self._fill()
                await self._wait_slot()
                continue
            self._claiming = True
            t0 = loop.time()
            try:
                # The claim goes out first (a native task), then the jobs of the last one start.
                claimed = native.claim(want)
                self._fill()
                jobs = await claimed
            except StoreUnavailableError as e:
                if drain:
                    raise
                log.warning(
                    "gnl worker %s: store unavailable, retrying in %d ms: %s", self.name, backoff, e
                )
                await self._sleep(backoff)
                backoff = min(backoff * 2, max(self.max_poll_ms, 5_000))
                continue
            except GnlError as e:
                if drain:
                    raise
                log.error(
                    "gnl worker %s: claim failed, retrying in %d ms: %s", self.name, interval, e
                )
                await self._sleep(interval)
                continue
            finally:
                self._claiming = False
            dt = loop.time() - t0
            self._claim_s = (
                dt if self._claim_s == 0.0 else self._claim_s + _EWMA * (dt - self._claim_s)
            )
            backoff = self.poll_ms
            if jobs:
                interval = self.poll_ms
                busy_wait = 0.005
                self._ready.extend(jobs)
                continue
            if not drain:
                await self._sleep(interval)
                interval = min(interval * 2, self.max_poll_ms)
            elif self._tasks or self._ready:
                # A handler that fails may make its job due again: look once it has ended.
                await self._wait_slot()
            elif await native.flush():
                # Outcomes that were still waiting (a failed attempt may be due again).
                continue
            elif await native.has_due():
                # An empty claim while some lane is due met lanes that concurrent claims
                # (other workers, Postgres/MySQL SKIP LOCKED) held: try again shortly.
                await asyncio.sleep(busy_wait)
                busy_wait = min(busy_wait * 2, 0.2)
            else:
                return

    async def _wait_slot(self) -> None:
        self._slot.clear()
        self._waiting_slot = True
        try:
            await self._slot.wait()
        finally:
            self._waiting_slot = False

    async def _sleep(self, ms: int) -> None:
        self._wake.clear()
        if self._stopping:
            return
        try:
            await asyncio.wait_for(self._wake.wait(), ms / 1000)
        except asyncio.TimeoutError:
            pass

    # -- running one job -----------------------------------------------------------------

    def _fill(self) -> None:
        """Start jobs claimed ahead while slots are free."""
        ready = self._ready
        while ready and len(self._tasks) < self.concurrency:
            self._start(ready.popleft())

    def _start(self, job: ClaimedJob) -> None:
        seq = job[0]
        if self._revoked:
            why = self._revoked.pop(seq, None)
            if why is not None:
                # Revoked before it started: its handler never runs. A canceled job is
                # recorded as canceled; a lost lease is no longer ours to write.
                if why == "canceled":
                    assert self._native is not None
                    self._native.done(seq, job[1], None)
                    self._outcome_queued()
                return
        ctx = JobContext(
            self._storage._native, self._storage.journal, job[3], job[4], job[2], job[6]
        )
        self._active[seq] = ctx
        assert self._loop is not None
        task = self._loop.create_task(self._run(job, ctx))
        self._tasks[seq] = task

    async def _run(self, job: ClaimedJob, ctx: JobContext) -> None:
        seq, token, _, _, typ, payload_json, attempt = job
        native = self._native
        loop = self._loop
        assert native is not None and loop is not None
        if self.max_hold_ms is not None:
            ctx._timer = loop.call_later(self.max_hold_ms / 1000, self._revoke, ctx, "timeout")
        counts = self._counts
        counts[0] += 1
        error: str | None = None
        t0 = loop.time()
        try:
            handler = self._handlers.get(typ)
            if handler is None:
                error = f"no handler for job type {typ!r} on worker {self.name!r}"
            else:
                result = await handler(_decode(payload_json), ctx)
                reason = ctx.signal.reason
                if reason is not None and reason.why == "timeout":
                    error = f"timeout: the handler held the job past max_hold_ms={self.max_hold_ms}"
                else:
                    try:
                        native.done(seq, token, result)
                    except (TypeError, ValueError) as e:
                        error = f"{type(e).__name__}: {e}"
        except asyncio.CancelledError:
            # The worker's loop is being torn down: record nothing, the lease expires and the
            # job is reclaimed. No job starts in its place.
            if ctx._timer is not None:
                ctx._timer.cancel()
            self._active.pop(seq, None)
            self._tasks.pop(seq, None)
            raise
        except Exception as e:  # noqa: BLE001 - a handler's failure is data, not a crash
            reason = ctx.signal.reason
            if (
                isinstance(e, ExecutionRevokedError)
                and reason is not None
                and reason.why == "timeout"
            ):
                error = f"timeout: the handler held the job past max_hold_ms={self.max_hold_ms}"
            else:
                error = f"{type(e).__name__}: {e}"
        if ctx._timer is not None:
            ctx._timer.cancel()
        self._active.pop(seq, None)
        try:
            dt = loop.time() - t0
            hold = self._hold_s
            self._hold_s = dt if hold is None else hold + _EWMA * (dt - hold)
            if error is None:
                counts[1] += 1
            else:
                counts[2] += 1
                native.fail(seq, token, error, attempt, self._retry_delay(attempt))
            self._outcome_queued()
        finally:
            # The slot is free: the next job claimed ahead starts at once.
            del self._tasks[seq]
            if self._ready:
                self._fill()
            self._slot.set()

    def _outcome_queued(self) -> None:
        if not self._kick_due:
            self._kick_due = True
            assert self._loop is not None
            self._loop.call_soon(self._kick)

    def _kick(self) -> None:
        """After a burst of outcomes: a claim that is about to go out (the claim loop waits for
        a handler to end) takes them along, in its own statement; otherwise (a claim is in
        flight, or none is coming) the native writer writes them now."""
        self._kick_due = False
        native = self._native
        if native is None:
            return
        if self._claiming or self._stopping or not self._waiting_slot:
            native.kick()

    def _retry_delay(self, attempt: int) -> int | None:
        d = self.retry_delay_ms
        if d is None:
            return None  # native default: exponential from 1 s, capped at 60 s, ±20% jitter
        if isinstance(d, int):
            return d
        try:
            value = d(attempt)
            return check_int(value, "retry_delay_ms(attempt)", 0, MAX_DURATION_MS)
        except Exception as e:  # noqa: BLE001
            log.error(
                "gnl worker %s: retry_delay_ms(%d) failed (%s); using the default",
                self.name,
                attempt,
                e,
            )
            return None

    # -- revocation ----------------------------------------------------------------------

    def _on_revoke(self, seq: int, why: str) -> None:
        ctx = self._active.get(seq)
        if ctx is not None:
            self._revoke(ctx, why)
        elif any(j[0] == seq for j in self._ready):
            # Claimed ahead, not started: _start sees it. A lost lease wins over a cancel.
            if why == "lease-lost" or seq not in self._revoked:
                self._revoked[seq] = why

    def _revoke(self, ctx: JobContext, why: str) -> None:
        if ctx.signal.aborted:
            return
        ctx.signal.abort(why)
        if why in ("lease-lost", "timeout"):
            asyncio.get_running_loop().call_later(
                self.ttl_ms / 1000, self._warn_if_running, ctx, why
            )

    def _warn_if_running(self, ctx: JobContext, why: str) -> None:
        if ctx._warned or ctx not in self._active.values():
            return
        ctx._warned = True
        log.warning(
            "gnl worker %s: handler of job %r (type %r, attempt %d) is still running %d ms after "
            "its signal aborted (%s); it should check ctx.signal",
            self.name,
            ctx.job_id,
            ctx.type,
            ctx.attempt,
            self.ttl_ms,
            why,
        )

    def _on_log(self, message: str) -> None:
        log.warning("%s", message)

    def __repr__(self) -> str:
        return f"<gnl.Worker {self.name!r} concurrency={self.concurrency} running={self.running}>"


def create_worker(
    storage: Storage | WorkStore,
    handlers: Mapping[str, Handler],
    *,
    ttl_ms: int = 30_000,
    max_attempts: int = 5,
    max_hold_ms: int | None = None,
    concurrency: int = 1,
    poll_ms: int = 200,
    max_poll_ms: int | None = None,
    retry_delay_ms: RetryDelay = None,
    name: str | None = None,
) -> Worker:
    """Create a queue worker.

    Args:
        storage: The Storage (or its work store).
        handlers: Job type -> ``async def handler(payload, ctx)``. The worker claims only
            jobs of these types (there is no catch-all): a job of another type stays
            ``pending`` (and listed) for a worker that has its handler, so deployments that
            serve different types can share one store. Empty: the worker claims nothing.
        ttl_ms: The lease, renewed every ``ttl_ms / 3`` off the Python thread (>= 3).
        max_attempts: Attempts (counted at claim time) before a job is ``dead`` (>= 1).
        max_hold_ms: Time limit of one attempt: the signal aborts with ``timeout`` and the
            attempt counts as failed; the lease is kept until the handler returns. None: no
            limit.
        concurrency: Handlers running at once (>= 1); a claim takes up to this many jobs,
            lanes in turn. While handlers that run shorter than a claim takes are running,
            the next claim goes out at once (the store and the handlers work at the same
            time): the worker then holds up to this many jobs more, claimed ahead, which
            start in claim order as slots free (see :meth:`Worker.stop`).
        poll_ms: The poll interval; an empty poll doubles it up to ``max_poll_ms``
            (default ``poll_ms * 32``); a claim resets it.
        retry_delay_ms: Delay before a failed attempt is retried: an int, or a callable
            ``f(attempt) -> ms`` of the 1-based attempt that failed. None: exponential from
            1,000 ms, doubling, capped at 60,000 ms, ±20% jitter.
        name: Recorded as the lease holder; default ``host:pid:random``.

    Raises:
        TypeError: an argument of the wrong type (a handler that is not callable).
        InvalidArgumentError: a value out of range.
    """
    st = storage_of(storage)
    if not isinstance(handlers, Mapping):
        raise TypeError(
            f"handlers must be a mapping of job type to handler, not {type(handlers).__name__}"
        )
    for k, h in handlers.items():
        if not isinstance(k, str):
            raise TypeError(f"handler keys must be job types (str), not {type(k).__name__}")
        if not callable(h):
            raise TypeError(f"the handler for {k!r} is not callable")
    check_int(ttl_ms, "ttl_ms", 3, MAX_DURATION_MS)
    check_int(max_attempts, "max_attempts", 1, 1_000_000)
    if max_hold_ms is not None:
        check_int(max_hold_ms, "max_hold_ms", 1, MAX_DURATION_MS)
    check_int(concurrency, "concurrency", 1, 10_000)
    check_int(poll_ms, "poll_ms", 1, MAX_DURATION_MS)
    if max_poll_ms is not None:
        check_int(max_poll_ms, "max_poll_ms", poll_ms, MAX_DURATION_MS)
    if retry_delay_ms is not None and not callable(retry_delay_ms):
        check_int(retry_delay_ms, "retry_delay_ms", 0, MAX_DURATION_MS)
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if not name:
            raise InvalidArgumentError("name must be a non-empty string")
    return Worker(
        st,
        handlers,
        ttl_ms=ttl_ms,
        max_attempts=max_attempts,
        max_hold_ms=max_hold_ms,
        concurrency=concurrency,
        poll_ms=poll_ms,
        max_poll_ms=max_poll_ms,
        retry_delay_ms=retry_delay_ms,
        name=name,
    )
