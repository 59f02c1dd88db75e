"""The queue worker (API.md "Queue"): claims jobs and runs their handlers on the asyncio loop.

Every store round trip, the lease renewal timer and the group-committed outcome writes are
native (``gnl._native.NativeWorker``); this module runs handlers and keeps the poll loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import os
import secrets
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from types import CoroutineType, TracebackType
from typing import Any, NamedTuple

from . import _native, _wake, durable
from ._callables import require_async
from ._time import MAX_DURATION_MS, check_int, check_lease
from .errors import ExecutionRevokedError, GnlError, InvalidArgumentError, StoreUnavailableError
from .signal import RevocationSignal
from .storage import Journal, Storage, WorkStore, storage_of

__all__ = ["DrainResult", "Handler", "JobContext", "Worker", "create_worker"]

log = logging.getLogger("gnl")

#: ``async def handler(payload, ctx) -> JSON | None``
Handler = Callable[[Any, "JobContext"], Awaitable[Any]]

#: A claimed job: (seq, token, org_id, id, type, payload_json, attempt).
ClaimedJob = tuple[int, int, str | None, str, str, str, int]
#: One attempt of a job: (seq, fencing token). A job this worker claims again after its lease
#: was lost is a new attempt (a new token): per-attempt state is keyed by both.
Attempt = tuple[int, int]

#: The weight of the newest sample in the moving averages of handler and claim times.
_EWMA = 0.2
# The cap of a failed claim's backoff (ms), unless max_poll_ms is longer: a worker claims again
# within 2 s of its store's return (docs/DECISIONS.md "Queue").
_STORE_AWAY_MAX_MS = 2_000
# While a claim is in flight, the outcomes queued meanwhile wait for the next claim while they
# are fewer than this: from this many on they go to the native writer at once, on its own
# connection, so that the next claim (which the worker awaits) does not write them
# (docs/DECISIONS.md "Queue": Outcomes).
_CARRY_MAX = 32
# After a second claim in flight that met the first one's lanes, this many claims go out alone.
_ALONE = 16
# A second claim in flight asks for at most this many times `concurrency` jobs, and the jobs
# claimed and not running (claimed ahead, and asked for by the claims in flight) are at most
# `_AHEAD_MAX` times `concurrency` (docs/DECISIONS.md "Queue": Claims beyond C).
_SECOND_MAX = 2
_AHEAD_MAX = 4


class _Claim(NamedTuple):
    """A claim in flight: its answer, how many it asked, when it went out, the wake-up
    version read before it, whether it carries outcomes, whether it went out second."""

    fut: Awaitable[list[ClaimedJob]]
    asked: int
    t0: float
    seen: int
    carry: bool
    second: bool
    wait: bool = False


def _orgs_looked_for(limit: int) -> int:
    """How many organizations a Postgres claim of ``limit`` jobs looks for in its first pass
    (migration 0010's quantum, the native core's ``first_pass_orgs``: ceil(limit / 4), at
    least 16, at most ``limit``): a full claim whose jobs came from fewer took every due lane
    it found."""
    return _native.first_pass_orgs(limit, 0)


def _done(fut: Awaitable[Any]) -> bool:
    """Whether a claim's answer is in (an asyncio future; any other awaitable: not known)."""
    done = getattr(fut, "done", None)
    return bool(done()) if done is not None else False


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


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
        "_steps",
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
        self._steps: durable._Steps | None = None
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

    def _journal_steps(self) -> durable._Steps:
        steps = self._steps
        if steps is None:
            steps = self._steps = durable._Steps(self._native, self.run_id, self.signal)
        return steps

    async def step(
        self, name: str, fn: Callable[..., Any], *args: Any, at_most_once: bool = False
    ) -> Any:
        """Run ``fn(*args)`` once per ``(run_id, name, n)`` and journal its result.

        ``n`` counts the earlier calls of ``name`` in this handler call. The first completed
        result recorded for the step is kept and returned on every later call, so a reclaimed
        or retried handler does not repeat the side effect. Two executors that race converge
        on the first recorded result. A step whose ``fn`` raises records nothing. Same
        journal as :meth:`gnl.WorkflowContext.step` (``at_most_once`` included).

        Args:
            name: The step's name (not starting with ``gnl.``).
            fn: A plain function or a coroutine function; its result must be JSON.
            *args: Passed to ``fn``.
            at_most_once: Record the intent before calling ``fn``; a later attempt that
                finds the intent without a result raises ``StepOutcomeUnknownError``.

        Returns:
            The recorded result (decoded JSON).

        Raises:
            TypeError: ``name`` is not a str, ``fn`` is not callable, or its result is not JSON
                (nothing is recorded then).
            InvalidArgumentError: ``name`` is empty or starts with ``gnl.``.
            ExecutionRevokedError: the signal had aborted before the step started.
            StepOutcomeUnknownError: an at-most-once step's earlier start left no result.
        """
        return await durable.run_step(
            self._journal_steps(), name, fn, *args, at_most_once=at_most_once
        )

    async def run(self, workflow: durable.Workflow, input: Any = None) -> Any:
        """Run ``workflow`` as a durable run under this job's ``run_id``, with its signal.

        ``workflow`` is an ``async (ctx: gnl.WorkflowContext, input)`` function like those
        given to :func:`gnl.create_gnl`, recorded under its qualified name. A reclaimed or
        retried job's run repeats none of its completed steps; the steps share the journal
        (and the count of calls per name) with this handler's ``ctx.step``. The job's lease
        covers the run (the waker never resumes it); ``ctx.sleep`` is refused in it. Call it
        at most once per handler call.

        Args:
            workflow: The workflow function.
            input: Its input (JSON), recorded on the first attempt; later attempts get the
                recorded one.

        Returns:
            The workflow's return value (the recorded one when an earlier attempt finished).

        Raises:
            TypeError: ``workflow`` is not an ``async`` function or ``input`` is not JSON.
            GnlError: ``run`` was called twice in one handler call.
            Exception: whatever the workflow raised (the attempt fails; the next resumes).
        """
        require_async(workflow, "workflow")
        steps = self._journal_steps()
        if steps.recorded is not None:
            raise GnlError("ctx.run may be called once per handler call")
        name = f"{getattr(workflow, '__module__', '?')}.{getattr(workflow, '__qualname__', '?')}"
        return await durable.execute(
            self._native,
            self.journal,
            name,
            workflow,
            run_id=self.run_id,
            input=input,
            scheduled_for=None,
            signal=self.signal,
            preset=None,
            lease_ms=30_000,
            steps=steps,
        )

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


class _Inline:
    """Awaits a handler's coroutine in a context of its own (a copy of the current one), as a
    task of its own would run it: a handler's context variables do not reach the next job.
    ``suspended`` is called when the coroutine first waits for something (see
    ``Worker._run_pairs``)."""

    __slots__ = ("_coro", "_suspended")

    def __init__(self, coro: Coroutine[Any, Any, Any], suspended: Callable[[], None]) -> None:
        # (Only coroutines: any other awaitable is awaited as it is.)
        self._coro = coro
        self._suspended = suspended

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        run = contextvars.copy_context().run
        step: Callable[[Any], Any] = coro.send
        arg: Any = None
        first = True
        while True:
            try:
                future = run(step, arg)
            except StopIteration as end:
                return end.value
            if first:
                first = False
                self._suspended()
            try:
                arg = yield future
                step = coro.send
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # noqa: BLE001 - thrown in by the task: passed on
                step, arg = coro.throw, e


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
        self._tasks: dict[Attempt, asyncio.Task[None]] = {}
        self._active: dict[Attempt, JobContext] = {}
        # The seqs of the running attempts: a job claimed again while an earlier attempt of it
        # still runs here (its lease was lost, its handler ignores the signal) waits for it.
        self._running: set[int] = set()
        # Jobs claimed ahead (prefetched), not started yet, in claim order; and the
        # revocations (attempt -> why) that reached some of them before they started.
        self._ready: deque[ClaimedJob] = deque()
        self._revoked: dict[Attempt, str] = {}
        self._slot = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopping = False
        self._draining = False
        self._claiming = False  # a claim is in flight
        self._waiting_slot = False  # the claim loop waits for a handler to end
        self._kick_due = False  # a _kick is scheduled
        self._since_claim = 0  # outcomes queued since the last claim went out
        # Moving averages: how long a handler runs, how long a claim takes (seconds).
        self._hold_s: float | None = None
        self._claim_s = 0.0
        self._at_once = False  # the last claim ran at once on this thread (claim_now)
        self._late = False  # a handler outlasted a claim while a pair waited for it
        self._spread = False  # the last claim came back full with one job an organization
        # ... or full from fewer organizations than it looked for (one lane or a few, all of
        # them taken): its second claim waits for the lanes the first one holds.
        self._few = False
        self._alone = 0  # claims to send alone (no second claim in flight) before another
        self._ends = 0  # handler runs ended
        self._counts = [0, 0, 0]  # processed, succeeded, failed
        # The task that runs pairs of jobs inline (`_run_pairs`), and its timer for a handler
        # that outlasts a few claims.
        self._runner: asyncio.Task[None] | None = None
        # The claim loop's context (a copy): each run starts in a copy of it, wherever it is
        # started from (a task started by the end of another run must not get its context).
        self._context: contextvars.Context | None = None
        self._late_timer: asyncio.TimerHandle | None = None
        #: Called with (context, error) at the end of each failed attempt, however it failed:
        #: the handler raised, returned a result that is not JSON, returned past max_hold_ms,
        #: or its task was cancelled; and of an attempt whose job was canceled while its
        #: handler ran, even one that returned (``gnl run`` logs each through it).
        self._on_failed: Callable[[JobContext, str], None] | None = None

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
            self._serve(), name=f"gnl-worker-{self.name}"
        )

    async def _serve(self) -> None:
        try:
            await self._pump(drain=False)
        except asyncio.CancelledError:
            # The loop is torn down (or stop() was cancelled): renewals end with the native
            # half, so the leases of the handlers still running lapse and are reclaimed.
            self._close_native()
            raise

    def _close_native(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native = None

    async def stop(self) -> None:
        """Stop claiming, wait for the handlers of the jobs this worker has claimed (running,
        or claimed ahead to start next) to return and their outcomes to be written. Releases
        nothing early. Idempotent.

        Cancelling it (``asyncio.wait_for``'s timeout, ``task.cancel()``) ends it as a
        cancelled :meth:`drain` ends: running handlers get their signal aborted
        (``why="shutdown"``) and their tasks cancelled, so their attempts fail, as do those of
        jobs claimed ahead (each retried by the retry policy, or dead-lettered on its last
        attempt); the outcomes are written, then the ``CancelledError`` propagates. Cancelled
        again meanwhile, it ends at once and the leases of what still runs lapse (those jobs
        are reclaimed after ``ttl_ms``).

        An outcome the store cannot take (it is unavailable) is retried, with backoff, until
        it is written or its lease runs out (``ttl_ms`` after its last good renewal; the lease
        is renewed meanwhile).

        Raises:
            StoreUnavailableError: some outcomes this call waited for could not be written
                before their leases ran out (the message says how many): those jobs are
                reclaimed and run again. The worker is stopped all the same. Outcomes given up
                earlier, while the worker ran (each logged as a warning then, its job
                reclaimed), are not reported again here: a worker that lived through an
                outage stops cleanly once the store is back (docs/DECISIONS.md).
        """
        if self._native is not None and not self._stopping:
            self._native.forget_given_up()
        self._stopping = True
        self._wake.set()
        self._slot.set()
        try:
            if self._loop_task is not None:
                # Shielded: a cancelled stop() abandons the work itself (below), with the
                # native half still open to write the outcomes.
                await asyncio.shield(self._loop_task)
            await self._settle()
        except asyncio.CancelledError:
            self._abandon("stop() was cancelled")
            if self._loop_task is not None:
                # The claim loop ends at its next turn (``_stopping``); jobs a claim in flight
                # brings back fail like those claimed ahead.
                await asyncio.wait((self._loop_task,))
                self._abandon("stop() was cancelled")
            await self._settle()
            raise
        finally:
            # Also when stop() is cancelled again while it abandons: the renewals end, and
            # the leases of handlers still running lapse.
            self._loop_task = None
            self._close_native()

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

        Cancelling it (``asyncio.wait_for``'s timeout, Ctrl-C under ``asyncio.run``,
        ``task.cancel()``) stops it at once: running handlers get their signal aborted
        (``why="shutdown"``) and their tasks cancelled, so their attempts fail, as do those of
        jobs claimed ahead and not started (each retried by the retry policy, or dead-lettered
        on its last attempt); the outcomes are written, then the ``CancelledError``
        propagates.

        Raises:
            GnlError: the worker is started (stop it first).
            StoreUnavailableError: the store could not be reached, or some outcomes could not
                be written before their leases ran out (see :meth:`stop`).
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
        except asyncio.CancelledError:
            self._abandon("drain() was cancelled")
            raise
        finally:
            await self._settle()
            # The native half belongs to this loop: a later drain() or start() may run on
            # another one (a new asyncio.run).
            self._close_native()
            self._draining = False
        c = self._counts
        return DrainResult(c[0] - before[0], c[1] - before[1], c[2] - before[2])

    def _abandon(self, why: str) -> None:
        """Stop now (a cancelled ``drain()``): no more claims; each running handler's signal
        aborts (``shutdown``) and its task is cancelled (its attempt fails, as ``_reap``
        records it); jobs claimed ahead fail without running, their attempts counted."""
        self._stopping = True
        native = self._native
        for ctx in list(self._active.values()):
            ctx.signal.abort("shutdown", f"shutdown: {why}")
        for task in {*self._tasks.values(), *([self._runner] if self._runner else [])}:
            task.cancel()
        while self._ready and native is not None:
            seq, token, *_, attempt = self._ready.popleft()
            native.fail(seq, token, f"not started: {why}", attempt, self._retry_delay(attempt))
            self._outcome_queued()

    async def _settle(self) -> None:
        # Every job this worker claimed runs before this returns: the running ones, then
        # those claimed ahead, which start as slots free.
        while self._tasks or self._ready or self._runner is not None:
            if self._runner is not None:
                await asyncio.wait((self._runner,))
                continue
            if not self._tasks:
                self._fill()
                continue
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._native is not None:
            # Retried until each outcome is written or its lease runs out; raises
            # StoreUnavailableError naming how many could not be written.
            await self._native.flush()

    # -- the claim loop ------------------------------------------------------------------

    def _want(self, pairing: bool) -> int:
        """How many jobs to claim now: the free slots, and the slots expected to free up
        before this claim's answer comes back (prefetch), less the jobs claimed ahead. Jobs
        claimed ahead count as started when a slot is free for them (``_fill`` starts them
        right after the claim goes out). ``pairing``: ``_pairs()`` and not ``_late``, read
        once per turn of the claim loop."""
        c = self.concurrency
        running = len(self._tasks)
        ready = len(self._ready)
        starting = min(ready, c - running)
        running += starting
        ready -= starting
        ahead = 0
        hold = self._hold_s
        if pairing:
            # One slot, claims run at once on this thread (a SQLite file whose locks are free:
            # nothing runs meanwhile, so a claim gains nothing by going out while the handler
            # runs) and handlers shorter than a claim: two jobs a claim, once both are done
            # (the one that runs and the one ahead), their outcomes carried by it: one
            # transaction every two jobs instead of one a job. A handler that outlasts a
            # claim (`_late`) gets the next job claimed ahead, as below.
            return 0 if running or ready else 2
        if hold is not None and running:
            claim = self._claim_s
            expected = running if hold <= claim else running * claim / hold
            ahead = min(c, int(expected + 0.5))
        return min(c, c - running + ahead - ready)

    def _pairs(self) -> bool:
        """Whether claims take two jobs once both earlier ones are done (see ``_want``): a
        handler's time as measured while claims run at once one at a time includes the claim
        that held the loop when it started (up to twice a claim's: the handler is shorter)."""
        hold = self._hold_s
        return (
            self.concurrency == 1
            and self._at_once
            and hold is not None
            and hold <= 2 * self._claim_s
        )

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
        self._context = contextvars.copy_context()
        interval = self.poll_ms
        backoff = self.poll_ms
        busy_wait = 0.005
        # Claims in flight, in send order (at most two: see ``_second``).
        out: deque[_Claim] = deque()
        try:
            while drain or not self._stopping:
                if not out:
                    if self._runner is not None and not self._late:
                        # Pairs run inline (`_run_pairs`): it wakes this loop when it ends, or
                        # when its handler outlasts a few claims (the next job is claimed ahead).
                        await self._wait_slot()
                        continue
                    pairing = self._pairs() and not self._late
                    want = self._want(pairing)
                    if want <= 0:
                        self._fill()
                        if pairing and self._tasks:
                            # Waiting to claim a pair: a handler that outlasts a few claims (or
                            # 2 ms, a loaded machine's pause) gets the next job claimed ahead.
                            self._late = not await self._wait_slot(max(4 * self._claim_s, 0.002))
                        else:
                            await self._wait_slot()
                        continue
                    self._late = False
                self._claiming = True
                now = None
                try:
                    if not out:
                        self._since_claim = 0
                        # Read before the claim looks: a job enqueued after it wakes the sleep
                        # below.
                        seen = _wake.version(self._storage._native, "jobs")
                        t0 = loop.time()
                        # With at most one handler running (little for the loop to do
                        # meanwhile): at once on this thread when the store can (a SQLite file
                        # whose locks are free: one transaction, no hops between threads).
                        # Else the claim goes out first (a native task), then the jobs of the
                        # last one start while it runs.
                        now = native.claim_now(want) if len(self._tasks) <= 1 else None
                        self._at_once = now is not None
                        if now is None:
                            # A second claim may go out beside it: then both take one job an
                            # organization (the two race for the lanes, and the one that finds
                            # some locked by the other must not split its batch among the rest).
                            # Over few lanes both wait for the lanes (the one that gets them
                            # first serves them first: a claim that skipped them would come
                            # back empty).
                            pair = self._may_pair()
                            wait = pair and self._few
                            cap = 1 if pair and not wait and not self._alone else 0
                            claim = native.claim(want, True, cap, wait)
                            out.append(_Claim(claim, want, t0, seen, True, False, wait))
                    # A second claim goes out before the jobs claimed ahead start (their
                    # tasks' creation is off its path): those that free slots will take
                    # count as started.
                    second = self._second(out, self._startable()) if now is None else None
                    if second:
                        self._send_second(out, second)
                    self._fill()
                    if now is None:
                        if second == 0 and self._ready and len(self._tasks) >= self.concurrency:
                            # The last answer was back before it was awaited (no turn of the
                            # loop since): its jobs wait for slots whose short handlers have
                            # not had their turn yet. One turn ends them (slow ones stay, and
                            # the jobs waiting count against the second claim as before), so
                            # it goes out beside the one in flight rather than after it.
                            await asyncio.sleep(0)
                            self._fill()
                            second = self._room(out)
                            if second:
                                self._send_second(out, second)
                                self._fill()
                        c = out.popleft()
                        jobs = await c.fut
                        want, t0, seen = c.asked, c.t0, c.seen
                        self._spread_after(c, jobs)
                        if c.wait and out and out[0].wait and _done(out[0].fut):
                            # Two claims that waited for the same lanes: the one sent second
                            # may have taken them first (the first carried outcomes), and
                            # then its batch is the earlier one: it starts first.
                            jobs = await self._behind(out, jobs, loop.time())
                    else:
                        jobs = now
                except GnlError as e:
                    # The other claims in flight: their jobs are claimed ahead all the same.
                    await self._collect(out)
                    if drain:
                        raise
                    # One backoff for every failed claim; an unavailable store is a warning,
                    # any other store error an error.
                    if isinstance(e, StoreUnavailableError):
                        log.warning(
                            "gnl worker %s: store unavailable, retrying in %d ms: %s",
                            self.name,
                            backoff,
                            e,
                        )
                    else:
                        log.error(
                            "gnl worker %s: claim failed, retrying in %d ms: %s",
                            self.name,
                            backoff,
                            e,
                        )
                    # Back in a second or two when the store returns (docs/DECISIONS.md
                    # "Queue"): the cap is short, and while the store is away a wake-up ends
                    # the sleep (the Postgres listener wakes every topic when it reconnects).
                    # Another error waits its backoff out: wake-ups from a busy store would
                    # make it a retry storm.
                    if isinstance(e, StoreUnavailableError) and not self._stopping:
                        self._wake.clear()
                        await _wake.sleep(self._storage._native, "jobs", seen, backoff, self._wake)
                    else:
                        await self._sleep(backoff)
                    backoff = min(backoff * 2, max(self.max_poll_ms, _STORE_AWAY_MAX_MS))
                    continue
                finally:
                    self._claiming = bool(out)
                self._claimed(loop.time() - t0)
                backoff = self.poll_ms
                if jobs:
                    interval = self.poll_ms
                    busy_wait = 0.005
                    self._ready.extend(jobs)
                    if pairing and now is not None and self._runner is None and not self._tasks:
                        self._runner = loop.create_task(self._run_pairs())
                    continue
                if out:
                    continue  # the next claim in flight may bring some
                if not drain:
                    # No claim follows at once: the outcomes that waited for one are written now.
                    native.kick()
                    self._wake.clear()
                    if self._stopping:
                        continue
                    if await _wake.sleep(self._storage._native, "jobs", seen, interval, self._wake):
                        # A wake-up: something was enqueued; the backoff starts over. Off
                        # SQLite the claim skips the probe (a woken herd's claims do not queue
                        # on a write lock there).
                        interval = self.poll_ms
                        if self._storage.backend != "sqlite":
                            native.expect_jobs()
                    else:
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
        finally:
            # Stopping with a claim still in flight: its jobs are claimed ahead (stop() runs
            # them, a cancelled one fails them). A cancelled drain() leaves them to lapse.
            if out and not _cancelling():
                await self._collect(out)
            self._claiming = False

    def _second(self, out: deque[_Claim], starting: int = 0) -> int | None:
        """How many jobs a second claim in flight asks for: None when none may go out,
        0 when one may but has no room yet. Postgres, two slots or more, handlers shorter
        than a claim, and the last claim came back full: with one job an organization, more
        lanes are likely due beyond those the one in flight holds (it skips them: SKIP
        LOCKED); from one lane or a few, it waits for them (`_few`). Either way the store
        works on the next claim while the round trip and the handlers of the one in flight
        run. ``starting``: jobs claimed ahead about to start in free slots (`_startable`)."""
        if len(out) != 1 or not self._may_pair():
            return None
        if self._alone:
            self._alone -= 1
            return None
        return self._room(out, starting)

    def _room(self, out: deque[_Claim], starting: int = 0) -> int:
        """The jobs a second claim asks for (see `_second`): up to 2C (`_SECOND_MAX`), so
        that the jobs claimed and not running, the ones claimed ahead (less ``starting`` of
        them about to start) and those the one in flight asked for included, are at most 4C
        (`_AHEAD_MAX`): in a steady drain, two claims of 2C each in flight. Handlers shorter
        than a claim run them within about a claim's time, and a larger claim spreads its
        round trip and commit over more jobs."""
        c = self.concurrency
        ahead = len(self._ready) - starting + out[0].asked
        return max(0, min(_SECOND_MAX * c, _AHEAD_MAX * c - ahead))

    def _startable(self) -> int:
        """How many jobs claimed ahead `_fill` would start now (free slots; none while pairs
        run inline)."""
        if self._runner is not None:
            return 0
        return min(len(self._ready), self.concurrency - len(self._tasks))

    def _send_second(self, out: deque[_Claim], second: int) -> None:
        """Send the second claim in flight (`_second`), of ``second`` jobs (`_room`)."""
        native = self._native
        assert native is not None and self._loop is not None
        # Carries outcomes only when the one in flight carries none.
        carry = not out[0].carry
        if carry:
            self._since_claim = 0
        seen = _wake.version(self._storage._native, "jobs")
        # One job an organization: the lanes the one in flight holds are skipped, and the
        # few left must not split the whole batch. Over few lanes it waits for them
        # instead, and takes the next jobs of the same lanes once the one in flight committed.
        wait = self._few
        claim = native.claim(second, carry, 0 if wait else 1, wait)
        out.append(_Claim(claim, second, self._loop.time(), seen, carry, True, wait))

    def _may_pair(self) -> bool:
        """Whether a second claim may follow the next one while it is in flight (``_second``,
        unless the next claims go out alone): Postgres, two slots or more, handlers shorter
        than a claim, and the last claim came back full, with one job an organization
        (``_spread``) or from one lane or a few (``_few``)."""
        hold = self._hold_s
        return (
            (self._spread or self._few)
            and self.concurrency >= 2
            and not self._stopping
            and hold is not None
            and hold <= self._claim_s
            and self._storage.backend == "postgres"
        )

    def _spread_after(self, c: _Claim, jobs: list[ClaimedJob]) -> None:
        """A claim came back: whether it was full with one job an organization, or full from
        fewer organizations than its pick looked for (one lane or a few: it took every due
        lane it found; a second claim may follow either, see ``_second``). A second claim
        that skipped lanes and came back short, or with two jobs of one organization, met
        the lanes the first one held: the next claims go out alone."""
        n = len(jobs)
        # The organizations are counted only for a full claim (on every claim's path).
        orgs = len({j[2] for j in jobs}) if n == c.asked and n > 0 else 0
        self._spread = 0 < orgs == n
        # (Fewer than it looked for is fewer than its jobs: `_orgs_looked_for(n) <= n`.)
        self._few = 0 < orgs < _orgs_looked_for(n)
        if c.second and not c.wait and not self._spread:
            self._alone = _ALONE

    async def _behind(
        self, out: deque[_Claim], jobs: list[ClaimedJob], now: float
    ) -> list[ClaimedJob]:
        """Take the answer of the next claim in flight (done already) with ``jobs``, the one
        before it, in the order the store served them: over the same lanes, the batch that
        holds an organization's earlier job first. A failed claim's jobs are none."""
        d = out.popleft()
        try:
            more = await d.fut
        except GnlError:
            more = []
        self._spread_after(d, more)
        self._claimed(now - d.t0)
        first: dict[str | None, int] = {}
        for j in more:
            first.setdefault(j[2], j[0])
        earlier = any(j[2] in first and first[j[2]] < j[0] for j in jobs)
        return more + jobs if earlier else jobs + more

    async def _collect(self, out: deque[_Claim]) -> None:
        """Await the claims in flight; their jobs are claimed ahead (a failed one's are none)."""
        while out:
            c = out.popleft()
            try:
                self._ready.extend(await c.fut)
            except GnlError:
                pass

    def _claimed(self, dt: float) -> None:
        """A claim took ``dt`` seconds: the moving average of claim times."""
        self._claim_s = dt if self._claim_s == 0.0 else self._claim_s + _EWMA * (dt - self._claim_s)

    async def _run_pairs(self) -> None:
        """One slot, claims at once, short handlers (``_pairs``): run the jobs claimed in this
        task, each handler awaited inline (in a context of its own), then claim the next two
        at once, until that stops paying off. Per job no task, no wake-up of the claim loop:
        one loop turn every two jobs (the ``sleep(0)`` below: the loop's other work runs).

        This task is the handlers' task: a handler that cancels it fails its attempt (as
        ``_reap`` records it) and ends this task; the claim loop carries on. A handler that
        waits for longer than a few claims with no job claimed ahead wakes the claim loop
        (``_late_now``), which claims the next one ahead, as it does for a handler in a task.
        Returns when the claim is empty, cannot run at once or fails (the claim loop claims
        next, with its backoff and error handling), or on stop()."""
        native = self._native
        loop = self._loop
        me = asyncio.current_task()
        assert native is not None and loop is not None and me is not None
        try:
            while True:
                while self._ready:
                    job = self._ready.popleft()
                    if job[0] in self._running:
                        self._ready.appendleft(job)
                        return
                    ctx = self._begin(job)
                    if ctx is None:
                        continue
                    key = (job[0], job[1])
                    self._tasks[key] = me
                    t0 = loop.time()
                    try:
                        await self._run(job, ctx, native, t0, inline=True)
                    except BaseException as e:
                        if self._tasks.get(key) is me:
                            self._ended(job, ctx, native, t0, False, _abandoned(e), 0)
                        raise
                    finally:
                        if self._late_timer is not None:
                            self._late_timer.cancel()
                            self._late_timer = None
                if (
                    self._stopping
                    or self._late
                    or self._claiming
                    or native is not self._native
                    or not self._pairs()
                ):
                    return
                await asyncio.sleep(0)
                if self._ready or self._stopping or self._claiming or self._late:
                    continue
                t0 = loop.time()
                try:
                    jobs = native.claim_now(2)
                except GnlError:
                    return  # the claim loop claims next and handles the error
                if not jobs:
                    return  # busy (None) or empty: the claim loop's claim looks again
                self._claimed(loop.time() - t0)
                self._ready.extend(jobs)
        finally:
            self._runner = None
            self._slot.set()

    def _suspended(self) -> None:
        """A handler run inline waits for something: if it outlasts a few claims (>= 2 ms)
        while no job is claimed ahead, the claim loop claims one (`_late_now`)."""
        if not self._ready and self._late_timer is None and self._loop is not None:
            self._late_timer = self._loop.call_later(max(4 * self._claim_s, 0.002), self._late_now)

    def _late_now(self) -> None:
        self._late_timer = None
        self._late = True
        self._slot.set()

    async def _wait_slot(self, timeout: float | None = None) -> bool:
        """Wait for a handler to end (True), or ``timeout`` seconds (False)."""
        self._slot.clear()
        self._waiting_slot = True
        timer = None
        if timeout is not None:
            assert self._loop is not None
            timer = self._loop.call_later(timeout, self._slot.set)
        ends = self._ends
        try:
            await self._slot.wait()
        finally:
            self._waiting_slot = False
            if timer is not None:
                timer.cancel()
        return timer is None or self._ends != ends

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
        """Start jobs claimed ahead while slots are free, in claim order; a job with an
        attempt still running here waits for it to end."""
        if self._runner is not None:
            return  # it runs them itself
        ready = self._ready
        running = self._running
        waiting: list[ClaimedJob] = []
        while ready and len(self._tasks) < self.concurrency:
            job = ready.popleft()
            if job[0] in running:
                waiting.append(job)
            else:
                self._start(job)
        if waiting:
            ready.extendleft(reversed(waiting))

    def _begin(self, job: ClaimedJob) -> JobContext | None:
        """A claimed job's run begins: its context (None when it was revoked before it
        started: its handler never runs)."""
        seq = job[0]
        key = (seq, job[1])
        native = self._native
        assert native is not None and self._loop is not None
        if self._revoked:
            why = self._revoked.pop(key, None)
            if why is not None:
                # Revoked before it started: its handler never runs. A canceled job is
                # recorded as canceled; a lost lease is no longer ours to write.
                if why == "canceled":
                    native.done(seq, job[1], None)
                    self._outcome_queued()
                return None
        ctx = JobContext(
            self._storage._native, self._storage.journal, job[3], job[4], job[2], job[6]
        )
        if self.max_hold_ms is not None:
            ctx._timer = self._loop.call_later(
                self.max_hold_ms / 1000, self._revoke, ctx, "timeout"
            )
        self._active[key] = ctx
        self._running.add(seq)
        self._counts[0] += 1
        return ctx

    def _start(self, job: ClaimedJob) -> None:
        ctx = self._begin(job)
        if ctx is None:
            return
        native = self._native
        assert native is not None and self._loop is not None
        t0 = self._loop.time()
        coro = self._run(job, ctx, native, t0)
        base = self._context
        # A task copies the context it is created in.
        task = (
            self._loop.create_task(coro) if base is None else base.run(self._loop.create_task, coro)
        )
        self._tasks[(job[0], job[1])] = task
        # A run that returns or fails ends inside its task (`_run`), in the loop turn in which
        # its handler returned: the next job starts and the claim loop wakes in that turn,
        # not in the next one, where a done callback would run. This callback ends the others,
        # however the task ends: cancelled (by the handler itself, a timed-out stop(), the loop
        # torn down), even before its first step, or a BaseException that is no Exception.
        task.add_done_callback(functools.partial(self._reap, job, ctx, native, t0))

    async def _run(
        self,
        job: ClaimedJob,
        ctx: JobContext,
        native: _native.NativeWorker,
        t0: float,
        inline: bool = False,
    ) -> None:
        """Run the handler and end the run (``_ended``): ``ok`` when it returned, else the
        attempt failed. A cancellation of the task itself propagates (see ``_reap``).
        ``inline``: awaited in this task (``_run_pairs``), in a context of its own."""
        typ = job[4]
        handler = self._handlers.get(typ)
        ok = False
        if handler is None:
            value: Any = f"no handler for job type {typ!r} on worker {self.name!r}"
        else:
            try:
                coro = handler(_decode(job[5]), ctx)
                if inline and isinstance(coro, CoroutineType):
                    value = await _Inline(coro, self._suspended)
                else:
                    value = await coro
            except asyncio.CancelledError:
                task = asyncio.current_task()
                cancelling = getattr(task, "cancelling", None)
                if cancelling is None or cancelling():
                    raise  # the task is being cancelled (Python 3.10 cannot tell: treated so)
                value = "CancelledError: the handler raised CancelledError"
            except Exception as e:  # noqa: BLE001 - a handler's failure is data, not a crash
                if log.isEnabledFor(logging.DEBUG):
                    # Where it failed (the job records the error's one line).
                    log.debug(
                        "gnl worker %s: job %r attempt %d raised",
                        self.name,
                        ctx.job_id,
                        ctx.attempt,
                        exc_info=e,
                    )
                reason = ctx.signal.reason
                if (
                    isinstance(e, ExecutionRevokedError)
                    and reason is not None
                    and reason.why == "timeout"
                ):
                    value = self._timed_out()
                else:
                    value = f"{type(e).__name__}: {e}"
            else:
                reason = ctx.signal.reason
                if reason is not None and reason.why == "timeout":
                    value = self._timed_out()
                else:
                    ok = True
        self._ended(job, ctx, native, t0, ok, value, None)

    def _timed_out(self) -> str:
        return f"timeout: the handler held the job past max_hold_ms={self.max_hold_ms}"

    def _reap(
        self,
        job: ClaimedJob,
        ctx: JobContext,
        native: _native.NativeWorker,
        t0: float,
        task: asyncio.Task[None],
    ) -> None:
        """The task's done callback: ends a run that did not end inside it (see ``_start``)."""
        if self._tasks.get((job[0], job[1])) is not task:
            return  # ended by `_run`
        if task.cancelled():
            value = _abandoned(asyncio.CancelledError())
        else:
            value = _abandoned(task.exception())
        self._ended(job, ctx, native, t0, False, value, 0)

    def _ended(
        self,
        job: ClaimedJob,
        ctx: JobContext,
        native: _native.NativeWorker,
        t0: float,
        ok: bool,
        value: Any,
        delay: int | None,
    ) -> None:
        """Record a run's outcome; ``delay`` of a failure: None for ``retry_delay_ms``."""
        seq, token, attempt = job[0], job[1], job[6]
        key = (seq, token)
        if ctx._timer is not None:
            ctx._timer.cancel()
        self._active.pop(key, None)
        self._tasks.pop(key, None)
        self._running.discard(seq)
        loop = self._loop
        if loop is not None:
            dt = loop.time() - t0
            hold = self._hold_s
            self._hold_s = dt if hold is None else hold + _EWMA * (dt - hold)
        counts = self._counts
        # A closed native half (a stop() that timed out, a loop torn down) records nothing: the
        # lease is no longer renewed, so it lapses and the job is reclaimed.
        if native is self._native:
            if ok:
                try:
                    native.done(seq, token, value)
                except (TypeError, ValueError) as e:
                    ok, value = False, f"{type(e).__name__}: {e}"
            if ok:
                counts[1] += 1
            else:
                counts[2] += 1
                if delay is None:
                    delay = self._retry_delay(attempt)
                native.fail(seq, token, value, attempt, delay)
            self._outcome_queued()
        # The slot is free: the next job claimed ahead starts at once.
        if self._ready and native is self._native:
            self._fill()
        self._ends += 1
        if self._runner is None:
            # (A runner goes on with the next job itself: the claim loop sleeps on.)
            self._slot.set()
        hook = self._on_failed
        if hook is not None:
            # A canceled job whose handler returned all the same is told too: its result is
            # dropped (the store records it canceled).
            reason = ctx.signal.reason
            canceled = reason is not None and reason.why == "canceled"
            if not ok or canceled:
                try:
                    hook(ctx, value if not ok else "it returned; its result is dropped")
                except Exception:  # noqa: BLE001 - a hook's failure must not end the worker
                    log.exception("gnl worker %s: the failure hook raised", self.name)

    def _outcome_queued(self) -> None:
        self._since_claim += 1
        # While the next claim will take the outcomes along, the kick would do nothing (see
        # `_kicks`), so none is scheduled.
        if not self._kick_due and self._kicks():
            self._kick_due = True
            assert self._loop is not None
            self._loop.call_soon(self._kick)

    def _kick(self) -> None:
        """After a burst of outcomes: the native writer writes them now, unless the next claim
        takes them along (see `_kicks`)."""
        self._kick_due = False
        native = self._native
        if native is None:
            return
        if self._kicks():
            native.kick()

    def _kicks(self) -> bool:
        """Whether queued outcomes are written now by the native writer rather than by the next
        claim, in its own transaction: not while the claim loop waits for a handler to end (it
        claims then), nor while a claim is in flight (the loop sends the next one as this one
        comes back, or, when it does not, the writer writes them ``WRITE_AFTER`` = 5 ms after
        they were queued), unless ``_CARRY_MAX`` or more were queued during that claim; always
        while stopping."""
        if self._stopping:
            return True
        if self._claiming:
            return self._since_claim >= _CARRY_MAX
        return not self._waiting_slot

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

    def _on_revoke(self, seq: int, token: int, why: str) -> None:
        key = (seq, token)
        ctx = self._active.get(key)
        if ctx is not None:
            self._revoke(ctx, why)
        elif any(j[0] == seq and j[1] == token for j in self._ready):
            # Claimed ahead, not started: _start sees it. A lost lease wins over a cancel.
            if why == "lease-lost" or key not in self._revoked:
                self._revoked[key] = why

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


def _abandoned(exc: BaseException | None) -> str:
    """The error of a run that ended by ``exc``, no Exception: its task was cancelled, or a
    BaseException (KeyboardInterrupt, SystemExit, ...)."""
    if isinstance(exc, asyncio.CancelledError):
        return "CancelledError: the handler's task was cancelled"
    return f"{type(exc).__name__}: {exc}"


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
        ttl_ms: The lease, renewed every ``ttl_ms / 3`` off the Python thread (>= 100).
        max_attempts: Attempts (counted at claim time) before a job is ``dead`` (>= 1).
        max_hold_ms: Time limit of one attempt: the signal aborts with ``timeout`` and the
            attempt counts as failed; the lease is kept until the handler returns. None: no
            limit.
        concurrency: Handlers running at once (>= 1); a claim takes up to this many jobs,
            lanes in turn. While handlers that run shorter than a claim takes are running,
            the next claim goes out at once (the store and the handlers work at the same
            time): the worker then holds up to this many jobs more, claimed ahead, which
            start in claim order as slots free (see :meth:`Worker.stop`). On Postgres, with
            such handlers, a second claim may go out while one is in flight and take up to
            twice this many: the jobs claimed and not running are then at most four times
            this many (docs/DECISIONS.md "Claims beyond C"). At 1, when claims
            run at once on the worker's thread (a SQLite file whose locks are free) and
            handlers are that short, a claim takes two jobs (the next and the one ahead)
            once both earlier ones are done.
        poll_ms: The poll interval (ms); an empty poll doubles it up to ``max_poll_ms``
            (default ``poll_ms * 32``); a claim resets it, and so does a wake-up: an idle
            worker is woken at once by an enqueue or retry through the same Storage, and by
            another process's on Postgres (LISTEN/NOTIFY) and SQLite (``PRAGMA data_version``,
            checked every 15 ms); on MySQL the poll finds those.
        retry_delay_ms: Delay before a failed attempt is retried: an int, or a callable
            ``f(attempt) -> ms`` of the 1-based attempt that failed. None: exponential from
            1,000 ms, doubling, capped at 60,000 ms, ±20% jitter. A callable that raises or
            returns something other than an int from 0 to 315,360,000,000 (ten years) is logged
            as an error (logger ``"gnl"``) and that retry gets the default delay: the attempt's
            outcome is still written.
        name: Recorded as the lease holder; default ``host:pid:random``.

    Raises:
        TypeError: an argument of the wrong type (a handler that is not an ``async``
            function: a plain one would run its side effects, then fail every attempt).
        InvalidArgumentError: a value out of range, or an empty job type as a key.
    """
    st = storage_of(storage)
    if not isinstance(handlers, Mapping):
        raise TypeError(
            f"handlers must be a mapping of job type to handler, not {type(handlers).__name__}"
        )
    for k, h in handlers.items():
        if not isinstance(k, str):
            raise TypeError(f"handler keys must be job types (str), not {type(k).__name__}")
        if not k:
            raise InvalidArgumentError(
                "handler keys must be non-empty job types (no job has type '')"
            )
        # What enqueue refuses as a type (too long, control characters) no job can have.
        _native.check_job_type(k)
        require_async(h, f"the handler for {k!r}")
    options: dict[str, Any] = {
        "ttl_ms": ttl_ms,
        "max_attempts": max_attempts,
        "max_hold_ms": max_hold_ms,
        "concurrency": concurrency,
        "poll_ms": poll_ms,
        "max_poll_ms": max_poll_ms,
        "retry_delay_ms": retry_delay_ms,
    }
    _check_options(options)
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if not name:
            raise InvalidArgumentError("name must be a non-empty string")
    return Worker(st, handlers, name=name, **options)


def _check_options(options: Mapping[str, Any]) -> None:
    """:func:`create_worker`'s checks of a worker's ``options`` (its keyword arguments but
    ``name``), without I/O: also what ``App.job`` checks at declaration (one set of rules, one
    set of errors)."""
    check_lease(options["ttl_ms"], "ttl_ms")
    check_int(options["max_attempts"], "max_attempts", 1, 1_000_000)
    if options["max_hold_ms"] is not None:
        check_int(options["max_hold_ms"], "max_hold_ms", 1, MAX_DURATION_MS)
    check_int(options["concurrency"], "concurrency", 1, 10_000)
    poll_ms = check_int(options["poll_ms"], "poll_ms", 1, MAX_DURATION_MS)
    if options["max_poll_ms"] is not None:
        check_int(options["max_poll_ms"], "max_poll_ms", poll_ms, MAX_DURATION_MS)
    d = options["retry_delay_ms"]
    if d is not None and not callable(d):
        check_int(d, "retry_delay_ms", 0, MAX_DURATION_MS)
