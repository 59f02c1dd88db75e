"""One declared app and the process that runs it (``gnl run MODULE:ATTR``).

An :class:`App` names, in one place, the store, the job handlers with their worker options,
the workflows, the schedules and the event consumers. :meth:`App.serve` runs them in one
asyncio process: the queue workers, the scheduler's poll loop, the consumers and the workflow
waker (:data:`ROLES`; ``only`` runs some of them, to split roles across processes).

Stopping (:meth:`App.serve`'s ``stop`` event, or SIGTERM / SIGINT under :meth:`App.run`):
nothing new is claimed, fetched or fired; the handlers that run are given ``grace_ms`` to
return; then their signals abort with ``why="shutdown"`` and they are given ``grace_ms`` more
to return. Under :meth:`App.run` a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import signal as _signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from . import _native
from ._callables import require_async
from ._time import MAX_DURATION_MS, check_int, check_lease
from .durable import Gnl, Workflow, WorkflowWaker, create_workflow_waker
from .errors import (
    GnlError,
    InvalidArgumentError,
    SchemaOutdatedError,
    SchemaTooNewError,
    StoreUnavailableError,
    TriggerConflictError,
    UnsupportedStoreError,
)
from .events import Consumer, EventMeta, _check_consumer, create_consumer
from .scheduler import (
    Scheduler,
    _definition,
    create_scheduler,
    list_triggers,
    schedule_workflow,
)
from .signal import RevocationSignal
from .storage import Storage, connect
from .worker import Handler, JobContext, RetryDelay, Worker, create_worker
from .worker import _check_options as _check_worker_options

__all__ = ["ROLES", "App", "AppError", "load_app"]

log = logging.getLogger("gnl")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: The roles of :meth:`App.serve` (``gnl run --only``).
ROLES = ("worker", "scheduler", "consumers", "waker")

#: The first backoff (ms) of a store that cannot be reached at start; it doubles up to the cap.
_CONNECT_BACKOFF_MS = 250
_CONNECT_BACKOFF_MAX_MS = 10_000


class AppError(GnlError):
    """The app cannot start: a declaration it refuses at start (an unknown workflow in a
    schedule, a schedule whose definition changed), or a store it must not run on (its schema
    is outdated or too new). Nothing was started."""


class AppImportError(AppError):
    """The app's module raised while it was imported, or the function named to make the app
    raised when called (:func:`load_app`); ``__cause__`` is what it raised, with its
    traceback."""


@dataclass(frozen=True)
class _JobDecl:
    type: str
    handler: Handler
    options: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class _ScheduleDecl:
    workflow: str
    kwargs: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.kwargs.get("id") or self.workflow)


@dataclass(frozen=True)
class _ConsumerDecl:
    topic: str
    name: str
    handler: Callable[[Any, EventMeta], Awaitable[Any]]
    options: dict[str, Any]


@dataclass
class _Running:
    """The signals of the handlers, fires and resumed runs in flight (to revoke them)."""

    signals: set[RevocationSignal] = field(default_factory=set)
    revoked: bool = False

    def revoke(self) -> int:
        self.revoked = True
        live = [s for s in self.signals if not s.aborted]
        for s in live:
            s.abort("shutdown", "shutdown: the process is stopping and its grace_ms ran out")
        return len(live)


class _AppGnl(Gnl):
    """The app's runner: every run it executes (fired by the scheduler, resumed by the waker)
    carries a signal the app can revoke at shutdown."""

    __slots__ = ("_app_running",)

    def __init__(self, base: Gnl, running: _Running) -> None:
        super().__init__(base.journal, base.workflows, base.preset, base.lease_ms)
        self._app_running = running

    async def run_workflow(
        self, name: str, *, signal: RevocationSignal | None = None, **kw: Any
    ) -> Any:
        running = self._app_running
        sig = signal if signal is not None else RevocationSignal()
        if running.revoked:
            sig.abort("shutdown", "shutdown: the process is stopping")
        running.signals.add(sig)
        try:
            return await super().run_workflow(name, signal=sig, **kw)
        finally:
            running.signals.discard(sig)


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidArgumentError(f"{what} must be a non-empty string")
    return value


class App:
    """A declared app: a store, job handlers, workflows, schedules and event consumers.

    Declare it at module level and run it with ``gnl run MODULE:ATTR`` (or :meth:`run`)::

        app = gnl.App(url="sqlite:///jobs.db")

        @app.job("email", concurrency=8)
        async def email(payload, ctx): ...

        @app.workflow("report")
        async def report(ctx, input): ...

        app.schedule("report", cron="0 3 * * *")

        @app.consumer("orders", "billing")
        async def bill(payload, meta): ...

    Handlers declared with the same worker options share one worker (one claim loop); each
    distinct set of options gets its own.

    Args:
        url: The store's URL; None: the ``GNL_URL`` environment variable when the app starts
            (``gnl run --url`` overrides both).
        max_connections: The store's connection pool (see :func:`gnl.connect`).
        waker_interval_ms: How often the workflow waker looks for runs to resume (ms).
        scheduler_poll_ms: The scheduler's poll interval (ms).
        run_lease_ms: A running workflow run's lease (ms >= 100, renewed every third of it):
            after a crash, the waker resumes the run once it lapsed (``create_gnl``'s
            ``lease_ms``).
        fire_lock_ttl_ms: A schedule's fire lock (ms >= 100): after a crash, the slot is fired
            again once it lapsed (``create_scheduler``'s ``lock_ttl_ms``).
        fire_retry_ms: How long a fire waits when its run is busy or was stopped by
            shutdown (ms >= 1; ``create_scheduler``'s ``retry_ms``).

    Raises:
        TypeError: an argument of the wrong type.
        InvalidArgumentError: a value out of range.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        max_connections: int = 10,
        waker_interval_ms: int = 5_000,
        scheduler_poll_ms: int = 1_000,
        run_lease_ms: int = 30_000,
        fire_lock_ttl_ms: int = 60_000,
        fire_retry_ms: int = 30_000,
    ) -> None:
        if url is not None:
            _check_name(url, "url")
        check_int(max_connections, "max_connections", 1, 10_000)
        check_int(waker_interval_ms, "waker_interval_ms", 1, MAX_DURATION_MS)
        check_int(scheduler_poll_ms, "scheduler_poll_ms", 1, MAX_DURATION_MS)
        check_lease(run_lease_ms, "run_lease_ms")
        check_lease(fire_lock_ttl_ms, "fire_lock_ttl_ms")
        check_int(fire_retry_ms, "fire_retry_ms", 1, MAX_DURATION_MS)
        self.url = url
        self.max_connections = max_connections
        self.waker_interval_ms = waker_interval_ms
        self.scheduler_poll_ms = scheduler_poll_ms
        self.run_lease_ms = run_lease_ms
        self.fire_lock_ttl_ms = fire_lock_ttl_ms
        self.fire_retry_ms = fire_retry_ms
        self._jobs: dict[str, _JobDecl] = {}
        self._workflows: dict[str, Workflow] = {}
        self._schedules: dict[str, _ScheduleDecl] = {}
        self._consumers: dict[tuple[str, str], _ConsumerDecl] = {}

    # -- declarations ------------------------------------------------------------------

    def job(
        self,
        type: str,
        *,
        concurrency: int = 1,
        ttl_ms: int = 30_000,
        max_attempts: int = 5,
        max_hold_ms: int | None = None,
        poll_ms: int = 200,
        max_poll_ms: int | None = None,
        retry_delay_ms: RetryDelay = None,
    ) -> Callable[[F], F]:
        """Declare the handler of job type ``type`` (a decorator of ``async def h(payload, ctx)``).

        The options are :func:`gnl.create_worker`'s. Handlers declared with equal options run
        on one worker.

        Args:
            type: The job type.
            concurrency: Handlers of this worker running at once.
            ttl_ms: The lease (ms).
            max_attempts: Attempts before a job is dead.
            max_hold_ms: Time limit of one attempt (ms); None: none.
            poll_ms: The poll interval (ms).
            max_poll_ms: The empty-poll backoff's cap (ms).
            retry_delay_ms: Delay before a retry (ms, or ``f(attempt) -> ms``).

        Returns:
            The decorator; it returns the handler unchanged.

        Raises:
            TypeError: ``type`` is not a str, or the decorated object is not an ``async`` function.
            InvalidArgumentError: an empty or already declared type, or an option out of
                range (checked here, as :func:`gnl.create_worker` checks it).
        """
        _check_name(type, "type")
        _native.check_job_type(type)  # what enqueue refuses, no job can have
        if type in self._jobs:
            raise InvalidArgumentError(f"job type {type!r} is declared twice")
        options = {
            "concurrency": concurrency,
            "ttl_ms": ttl_ms,
            "max_attempts": max_attempts,
            "max_hold_ms": max_hold_ms,
            "poll_ms": poll_ms,
            "max_poll_ms": max_poll_ms,
            "retry_delay_ms": retry_delay_ms,
        }
        # create_worker's own checks (no I/O): the same error for the same value.
        _check_worker_options(options)

        def decorate(fn: F) -> F:
            require_async(fn, f"the handler of {type!r}")
            if type in self._jobs:
                raise InvalidArgumentError(f"job type {type!r} is declared twice")
            self._jobs[type] = _JobDecl(type, fn, tuple(options.items()))
            return fn

        return decorate

    def workflow(self, name: str | None = None) -> Callable[[F], F]:
        """Declare a workflow (a decorator of ``async def wf(ctx: gnl.WorkflowContext, input)``).

        Args:
            name: The workflow's name (what schedules and ``run_workflow`` use); default: the
                function's ``__name__``.

        Raises:
            TypeError: ``name`` is not a str, or the decorated object is not an ``async`` function.
            InvalidArgumentError: an empty or already declared name.
        """
        if name is not None:
            _check_name(name, "name")

        def decorate(fn: F) -> F:
            require_async(fn, "a workflow")
            key = name if name is not None else getattr(fn, "__name__", "")
            _check_name(key, "name")
            if key in self._workflows:
                raise InvalidArgumentError(f"workflow {key!r} is declared twice")
            self._workflows[key] = fn
            return fn

        return decorate

    def schedule(
        self,
        workflow: str,
        *,
        id: str | None = None,
        cron: str | None = None,
        every_ms: int | None = None,
        at: int | datetime | None = None,
        misfire: str = "latest",
        max_catchup: int | None = None,
        misfire_grace_ms: int = 60_000,
        input: Any = None,
        max_attempts: int = 5,
    ) -> str:
        """Declare a schedule of ``workflow``: registered with :func:`gnl.schedule_workflow` when
        the app starts (a no-op when the same definition is registered).

        A trigger registered under the same id with another definition stops the start with
        :class:`AppError` (one log line names the trigger and ``gnl triggers unschedule``):
        a changed schedule is never silently kept.

        Args: as :func:`gnl.schedule_workflow` (``workflow`` is its ``name``).

        Returns:
            The trigger's id (``id``, default ``workflow``).

        Raises:
            TypeError: an argument of the wrong type.
            InvalidArgumentError: an id declared twice, or what
                :func:`gnl.schedule_workflow` refuses before any I/O (a bad ``misfire``,
                ``max_catchup``, ``misfire_grace_ms``, ``max_attempts``, ``at``, ...), with
                the same error; :class:`~gnl.CronError` for a refused expression.
        """
        _check_name(workflow, "workflow")
        trigger_id = workflow if id is None else _check_name(id, "id")
        if trigger_id in self._schedules:
            raise InvalidArgumentError(f"schedule {trigger_id!r} is declared twice")
        kwargs = {
            "id": trigger_id,
            "cron": cron,
            "every_ms": every_ms,
            "at": at,
            "misfire": misfire,
            "max_catchup": max_catchup,
            "misfire_grace_ms": misfire_grace_ms,
            "input": input,
            "max_attempts": max_attempts,
        }
        # schedule_workflow's own checks (no I/O): a bad value raises here what `gnl run`
        # would raise, with the input named by its schedule.
        _definition(workflow, **kwargs, input_what=f"the input of schedule {trigger_id!r}")
        self._schedules[trigger_id] = _ScheduleDecl(workflow, kwargs)
        return trigger_id

    def consumer(
        self,
        topic: str,
        name: str,
        *,
        max_attempts: float = 8,
        retry_delay_ms: RetryDelay = None,
        max_hold_ms: int | None = None,
        lease_ms: int = 30_000,
        poll_ms: int = 200,
        max_poll_ms: int | None = None,
    ) -> Callable[[F], F]:
        """Declare consumer ``name`` of ``topic`` (a decorator of
        ``async def h(payload, meta: gnl.EventMeta)``); the options are
        :func:`gnl.create_consumer`'s.

        Raises:
            TypeError: an argument of the wrong type.
            InvalidArgumentError: a (topic, name) declared twice, or what
                :func:`gnl.create_consumer` refuses (a bad ``max_attempts``, ``lease_ms``,
                ...), with the same error, at declaration.
        """
        _check_name(topic, "topic")
        _check_name(name, "name")
        if (topic, name) in self._consumers:
            raise InvalidArgumentError(f"consumer {name!r} of topic {topic!r} is declared twice")
        options = {
            "max_attempts": max_attempts,
            "retry_delay_ms": retry_delay_ms,
            "max_hold_ms": max_hold_ms,
            "lease_ms": lease_ms,
            "poll_ms": poll_ms,
            "max_poll_ms": max_poll_ms,
        }
        # create_consumer's own checks (no I/O): a bad option raises here what `gnl run` would
        # raise, before any role is started.
        _check_consumer(topic, name, options)

        def decorate(fn: F) -> F:
            require_async(fn, f"the handler of consumer {name!r}")
            if (topic, name) in self._consumers:
                raise InvalidArgumentError(
                    f"consumer {name!r} of topic {topic!r} is declared twice"
                )
            self._consumers[(topic, name)] = _ConsumerDecl(topic, name, fn, options)
            return fn

        return decorate

    # -- what is declared --------------------------------------------------------------

    @property
    def job_types(self) -> list[str]:
        """The declared job types."""
        return list(self._jobs)

    @property
    def workflows(self) -> dict[str, Workflow]:
        """The declared workflows by name."""
        return dict(self._workflows)

    @property
    def schedules(self) -> list[str]:
        """The declared schedules' trigger ids."""
        return list(self._schedules)

    @property
    def consumers(self) -> list[tuple[str, str]]:
        """The declared consumers as (topic, name)."""
        return list(self._consumers)

    def __repr__(self) -> str:
        return (
            f"<gnl.App jobs={len(self._jobs)} workflows={len(self._workflows)} "
            f"schedules={len(self._schedules)} consumers={len(self._consumers)}>"
        )

    # -- running -----------------------------------------------------------------------

    def _resolve_url(self, url: str | None) -> str:
        target = url or self.url or os.environ.get("GNL_URL")
        if not target:
            raise InvalidArgumentError("no store: give App(url=...), --url, or set GNL_URL")
        return target

    def _check(self, roles: frozenset[str]) -> None:
        # A schedule of an undeclared workflow first: an app whose only declaration is such a
        # schedule was told "nothing to run", which hid the mistyped name.
        for decl in self._schedules.values():
            if decl.workflow not in self._workflows:
                known = ", ".join(repr(k) for k in sorted(self._workflows)) or "none"
                raise AppError(
                    f"schedule {decl.id!r} names workflow {decl.workflow!r}, which the app does "
                    f"not declare (declared: {known})"
                )
        runs = (
            ("worker" in roles and self._jobs)
            or (roles & {"scheduler", "waker"} and self._workflows)
            or ("consumers" in roles and self._consumers)
        )
        if not runs:
            # A process that would sit idle (a mistyped module, --only a role the app does not
            # use): said at start, not logged as "nothing to run" and left running.
            raise AppError(
                f"nothing to run: the app declares {len(self._jobs)} job type(s), "
                f"{len(self._workflows)} workflow(s) and {len(self._consumers)} consumer(s), "
                f"and the roles {', '.join(sorted(roles))} run none of them"
            )

    async def serve(
        self,
        *,
        url: str | None = None,
        only: Iterable[str] | None = None,
        grace_ms: int = 30_000,
        stop: asyncio.Event | None = None,
    ) -> int:
        """Run the app on the running loop until ``stop`` is set (or the task is cancelled),
        then shut down (see the module docstring).

        At start: connect (a store that cannot be reached is retried with backoff, logged),
        register the schedules (same), start the roles. Each start, stop, failed handler,
        dead job, retried or reclaimed job and quarantined event is one line on logger
        ``gnl``.

        Args:
            url: Overrides the app's URL and ``GNL_URL``.
            only: The roles to run (:data:`ROLES`); default all. ``worker`` runs the job
                handlers, ``scheduler`` the schedules' poll loop, ``consumers`` the event
                consumers, ``waker`` the workflow waker; schedules are registered by the
                process that runs the scheduler.
            grace_ms: How long running handlers get to return once stopping (ms), and again
                once their signals are aborted.
            stop: Set it to stop; None: run until cancelled.

        Returns:
            0 when everything settled (every handler returned and its outcome was written);
            1 when some did not (a handler ignored its aborted signal past the second grace,
            or outcomes could not be written: those jobs are run again after their lease).

        Raises:
            InvalidArgumentError: no URL, an unknown role, a bad ``grace_ms``.
            AppError: the app cannot start (see :class:`AppError`), or its roles have
                nothing to run (no job type for ``worker``, ...); nothing was started.
        """
        roles = _roles(only)
        check_int(grace_ms, "grace_ms", 0, MAX_DURATION_MS)
        target = self._resolve_url(url)
        self._check(roles)
        stop = stop if stop is not None else asyncio.Event()
        storage = await _connect(target, self.max_connections, stop)
        if storage is None:
            return 0
        running = _Running()
        try:
            if "scheduler" in roles:
                if not await self._register(storage, stop):
                    return 0
            parts = self._start(storage, roles, running)
            log.info(
                "gnl run: started on %s (pid %d): %s",
                storage.backend,
                os.getpid(),
                "; ".join(p[0] for p in parts),
            )
            await stop.wait()
            return await _shutdown(parts, running, grace_ms)
        finally:
            await storage.close()

    async def _register(self, storage: Storage, stop: asyncio.Event) -> bool:
        """Register every schedule; False when stopped first."""
        for decl in self._schedules.values():
            backoff = _CONNECT_BACKOFF_MS
            while True:
                try:
                    await schedule_workflow(storage, decl.workflow, **decl.kwargs)
                    break
                except TriggerConflictError as e:
                    # Said once, by whoever catches it (`gnl run` prints it as its last line).
                    raise AppError(
                        f"schedule {decl.id!r} changed: {e} (run `gnl triggers unschedule "
                        f"{decl.id}`, or give the changed schedule a new id)"
                    ) from e
                except StoreUnavailableError as e:
                    log.warning(
                        "gnl run: store unavailable registering schedule %r, retrying in %d ms: %s",
                        decl.id,
                        backoff,
                        e,
                    )
                    if await _wait(stop, backoff):
                        return False
                    backoff = min(backoff * 2, _CONNECT_BACKOFF_MAX_MS)
        if self._schedules:
            # A schedule whose trigger failed fires no more: said at every start.
            for t in await list_triggers(storage):
                if t.id in self._schedules and t.state == "failed":
                    run_id = f"sched:{t.id}:{t.fire_count}"
                    log.warning(
                        "gnl run: schedule %r failed after %d attempts (%s) and fires no more: "
                        "once the cause is fixed, `gnl runs resume %s` runs its failed slot and "
                        "re-arms it; `gnl triggers unschedule %s` and a start register it anew "
                        "from its next slot (a new run)",
                        t.id,
                        t.attempts,
                        t.last_error,
                        run_id,
                        t.id,
                    )
        return True

    def _start(
        self, storage: Storage, roles: frozenset[str], running: _Running
    ) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """Create and start the roles' parts; returns (description, stop) per part."""
        parts: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if "worker" in roles and self._jobs:
            groups: dict[tuple[tuple[str, Any], ...], dict[str, Handler]] = {}
            for job in self._jobs.values():
                groups.setdefault(job.options, {})[job.type] = _job_handler(job, running)
            for options, handlers in groups.items():
                worker: Worker = create_worker(storage, handlers, **dict(options))
                worker._on_failed = _job_failed(dict(options)["max_attempts"])
                worker.start()
                parts.append(
                    (
                        f"worker {worker.name} (types {', '.join(handlers)}; concurrency "
                        f"{worker.concurrency})",
                        worker.stop,
                    )
                )
        gnl_runner: _AppGnl | None = None
        if self._workflows and roles & {"scheduler", "waker"}:
            from .durable import create_gnl

            gnl_runner = _AppGnl(
                create_gnl(storage, self._workflows, lease_ms=self.run_lease_ms), running
            )
        if "scheduler" in roles and gnl_runner is not None:
            scheduler: Scheduler = create_scheduler(
                storage,
                gnl_runner,
                poll_ms=self.scheduler_poll_ms,
                lock_ttl_ms=self.fire_lock_ttl_ms,
                retry_ms=self.fire_retry_ms,
            )
            scheduler.start()
            parts.append((f"scheduler ({len(self._schedules)} schedules)", scheduler.stop))
        if "consumers" in roles:
            for cdecl in self._consumers.values():
                consumer: Consumer = create_consumer(
                    storage.work,
                    cdecl.topic,
                    _event_handler(cdecl, running),
                    name=cdecl.name,
                    **cdecl.options,
                )
                consumer._on_failed = _event_failed(cdecl.options["max_attempts"])
                consumer.start()
                parts.append((f"consumer {cdecl.topic}/{cdecl.name}", consumer.stop))
        if "waker" in roles and gnl_runner is not None:
            waker: WorkflowWaker = create_workflow_waker(gnl_runner, self.waker_interval_ms)
            waker.start()
            parts.append((f"waker ({len(self._workflows)} workflows)", waker.stop))
        return parts

    def run(
        self, *, url: str | None = None, only: Iterable[str] | None = None, grace_ms: int = 30_000
    ) -> int:
        """Run the app in this process until SIGTERM or SIGINT (what ``gnl run`` calls).

        The first signal shuts down as :meth:`serve` says; a second one exits at once with
        code ``128 + signal number`` (the jobs still held are reclaimed once their leases
        lapse).

        Returns:
            :meth:`serve`'s exit code.

        Raises:
            As :meth:`serve`.
        """

        async def main() -> int:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()

            def on_signal(signum: int) -> None:
                name = _signal.Signals(signum).name
                if stop.is_set():
                    log.warning("gnl run: second %s: exiting at once", name)
                    for h in logging.getLogger().handlers + log.handlers:
                        with contextlib.suppress(Exception):
                            h.flush()
                    sys.stderr.flush()
                    os._exit(128 + signum)
                log.info("gnl run: %s received: stopping (grace %d ms)", name, grace_ms)
                stop.set()

            for signum in (_signal.SIGTERM, _signal.SIGINT):
                loop.add_signal_handler(signum, on_signal, signum)
            return await self.serve(url=url, only=only, grace_ms=grace_ms, stop=stop)

        return asyncio.run(main())


# -- helpers --------------------------------------------------------------------------------


def _roles(only: Iterable[str] | None) -> frozenset[str]:
    if only is None:
        return frozenset(ROLES)
    if isinstance(only, str):
        only = [r.strip() for r in only.split(",")]
    roles = frozenset(r for r in only if r)
    unknown = sorted(roles - set(ROLES))
    if unknown or not roles:
        raise InvalidArgumentError(
            f"unknown role(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"the roles are {', '.join(ROLES)}"
        )
    return roles


async def _wait(stop: asyncio.Event, ms: int) -> bool:
    """Sleep ``ms`` unless ``stop`` is set first; True when it is set."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), ms / 1000)
    return stop.is_set()


async def _connect(url: str, max_connections: int, stop: asyncio.Event) -> Storage | None:
    """Open the store, retrying with backoff while it cannot be reached; None when stopped
    first. A store gnl must not run on (outdated or newer schema, unsupported) is AppError."""
    backoff = _CONNECT_BACKOFF_MS
    while True:
        try:
            return await connect(url, max_connections=max_connections)
        except (SchemaOutdatedError, SchemaTooNewError, UnsupportedStoreError) as e:
            raise AppError(f"{type(e).__name__}: {e}") from e
        except StoreUnavailableError as e:
            if stop.is_set():
                # Stopped (SIGTERM) while it was trying: no retry to announce.
                log.info(
                    "gnl run: stopped before the store %s was reached (%s)",
                    _native.redact_url(url),
                    e,
                )
                return None
            log.warning(
                "gnl run: store %s unavailable, retrying in %d ms: %s",
                _native.redact_url(url),
                backoff,
                e,
            )
        if await _wait(stop, backoff):
            log.info("gnl run: stopped before the store %s was reached", _native.redact_url(url))
            return None
        backoff = min(backoff * 2, _CONNECT_BACKOFF_MAX_MS)


async def _call(
    running: _Running, sig: RevocationSignal, call: Callable[[], Awaitable[Any]]
) -> Any:
    """Run one handler call with its signal revocable at shutdown."""
    if running.revoked:
        sig.abort("shutdown", "shutdown: the process is stopping")
    running.signals.add(sig)
    try:
        sig.raise_if_aborted()
        return await call()
    finally:
        running.signals.discard(sig)


def _job_handler(decl: _JobDecl, running: _Running) -> Handler:
    """The declared handler with the app's bookkeeping: its signal is revocable at shutdown,
    and its retries and reclaims are logged (its failures by :func:`_job_failed`)."""
    fn = decl.handler

    async def handler(payload: Any, ctx: JobContext) -> Any:
        if ctx.attempt > 1:
            log.info(
                "gnl run: job %r (type %r) attempt %d starts (a retry, or a reclaim after a "
                "lost lease)",
                ctx.job_id,
                ctx.type,
                ctx.attempt,
            )
        return await _call(running, ctx.signal, lambda: fn(payload, ctx))

    return handler


def _job_failed(max_attempts: int) -> Callable[[JobContext, str], None]:
    """The worker's failure hook: one line per failed attempt, whatever failed it (the handler
    raised, returned a result that is not JSON, returned past ``max_hold_ms``, its task was
    cancelled); for a job canceled while its handler ran, a line that says so."""

    def failed(ctx: JobContext, error: str) -> None:
        reason = ctx.signal.reason
        if reason is not None and reason.why == "canceled":
            log.info(
                "gnl run: job %r (type %r) was canceled during attempt %d; its handler ended: %s",
                ctx.job_id,
                ctx.type,
                ctx.attempt,
                error,
            )
            return
        log.warning(
            "gnl run: job %r (type %r) attempt %d failed%s: %s",
            ctx.job_id,
            ctx.type,
            ctx.attempt,
            " and is dead (max_attempts reached)" if ctx.attempt >= max_attempts else "",
            error,
        )

    return failed


def _event_handler(
    decl: _ConsumerDecl, running: _Running
) -> Callable[[Any, EventMeta], Awaitable[Any]]:
    """The declared consumer handler with its signal revocable at shutdown (its failures are
    logged by :func:`_event_failed`)."""
    fn = decl.handler

    async def handler(payload: Any, meta: EventMeta) -> Any:
        return await _call(running, meta.signal, lambda: fn(payload, meta))

    return handler


def _event_failed(max_attempts: float) -> Callable[[EventMeta, str], None]:
    """The consumer's failure hook: one line per failed delivery (the handler raised or
    returned past ``max_hold_ms``), saying when the event is now quarantined."""

    def failed(meta: EventMeta, error: str) -> None:
        quarantined = meta.attempt >= max_attempts and max_attempts != math.inf
        log.warning(
            "gnl run: event %r of %s/%s attempt %d failed%s: %s",
            meta.id,
            meta.topic,
            meta.consumer,
            meta.attempt,
            " and is quarantined (gnl events dead)" if quarantined else "",
            error,
        )

    return failed


async def _shutdown(
    parts: list[tuple[str, Callable[[], Awaitable[None]]]], running: _Running, grace_ms: int
) -> int:
    """Stop every part: no new work; ``grace_ms`` for the running handlers; then revoke them
    and ``grace_ms`` more. Returns the exit code."""
    log.info(
        "gnl run: stopping: nothing new is claimed; %d handler(s) running get %d ms to return",
        len(running.signals),
        grace_ms,
    )
    tasks = {asyncio.ensure_future(stop()): what for what, stop in parts}
    code = 0
    if not tasks:
        return code
    done, pending = await asyncio.wait(tasks, timeout=grace_ms / 1000)
    if pending:
        n = running.revoke()
        log.warning(
            "gnl run: grace of %d ms ran out: aborted the signals of %d handler(s) "
            "(why='shutdown')",
            grace_ms,
            n,
        )
        more, pending = await asyncio.wait(pending, timeout=max(grace_ms, 1_000) / 1000)
        done |= more
    for t in pending:
        if tasks[t].startswith("waker"):
            log.error(
                "gnl run: %s did not stop (a resumed run ignores its aborted signal): its "
                "runs are cancelled and suspended, due at once to the next process's waker",
                tasks[t],
            )
        elif tasks[t].startswith("scheduler"):
            log.error(
                "gnl run: %s did not stop (a fired workflow ignores its aborted signal between "
                "steps): its fires are cancelled; their runs are resumed by a waker and their "
                "slots fire again under the same run ids (no attempt spent)",
                tasks[t],
            )
        else:
            log.error(
                "gnl run: %s did not stop (a handler ignores its aborted signal): its "
                "handlers are cancelled and those attempts fail (retried as their jobs allow; "
                "a job whose outcome cannot be written is reclaimed once its lease lapses)",
                tasks[t],
            )
        t.cancel()
        code = 1
    for t in done:
        exc = t.exception()
        if exc is None:
            log.info("gnl run: %s stopped", tasks[t])
        elif isinstance(exc, StoreUnavailableError):
            log.error(
                "gnl run: %s stopped, but outcomes could not be written (%s); those jobs run "
                "again once their leases lapse",
                tasks[t],
                exc,
            )
            code = 1
        else:
            log.error("gnl run: %s failed to stop: %s: %s", tasks[t], type(exc).__name__, exc)
            code = 1
    if pending:
        with contextlib.suppress(BaseException):
            await asyncio.wait(pending, timeout=1)
    log.info("gnl run: stopped (exit code %d)", code)
    return code


def load_app(target: str) -> App:
    """The :class:`App` named by ``MODULE:ATTR`` (the working directory is importable, as
    for ``python -m``).

    Raises:
        InvalidArgumentError: ``target`` is not ``MODULE:ATTR``, the module or attribute does
            not exist, or it is not an App (nor a function returning one); an ``async``
            function (no event loop runs yet to await it).
        AppImportError: the module raised while it was imported (a SyntaxError, a missing
            dependency, an error of its own), or the function raised when called;
            ``__cause__`` is what it raised.
    """
    import importlib

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(f"expected MODULE:ATTR (e.g. myapp.tasks:app), got {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        if isinstance(e, ModuleNotFoundError) and e.name and module_name.startswith(e.name):
            raise InvalidArgumentError(f"no module {module_name!r} (from {target!r})") from e
        # The user's code failed (a missing dependency of its own included), not gnl: said as
        # such (gnl run prints its traceback).
        raise AppImportError(
            f"importing {module_name!r} (from {target!r}) raised {type(e).__name__}: {e}"
        ) from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgumentError(
                f"module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not isinstance(obj, App) and callable(obj):
        if inspect.iscoroutinefunction(obj):
            raise InvalidArgumentError(_async_factory(target, "is an async function"))
        try:
            sig: inspect.Signature | None = inspect.signature(obj)
        except (TypeError, ValueError):  # a builtin that does not say: call it
            sig = None
        needed = [
            p.name
            for p in (sig.parameters.values() if sig is not None else ())
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if needed:
            raise InvalidArgumentError(
                f"{target!r} is a {type(obj).__name__} that needs arguments "
                f"({', '.join(needed)}), not a gnl.App nor a function of no arguments "
                f"returning one"
            )
        try:
            made = obj()
        except Exception as e:
            # The user's code failed, as a module that raises on import (gnl run prints its
            # traceback, then this line).
            raise AppImportError(f"calling {target!r} raised {type(e).__name__}: {e}") from e
        if inspect.isawaitable(made):
            if inspect.iscoroutine(made):
                made.close()  # never awaited: no "was never awaited" warning
            what = f"returned a {type(made).__name__}"
            raise InvalidArgumentError(_async_factory(target, what))
        if not isinstance(made, App):
            raise InvalidArgumentError(
                f"{target!r} returned a {type(made).__name__}, not a gnl.App"
            )
        obj = made
    if not isinstance(obj, App):
        raise InvalidArgumentError(f"{target!r} is a {type(obj).__name__}, not a gnl.App")
    return obj


def _async_factory(target: str, what: str) -> str:
    return (
        f"{target!r} {what}: gnl run makes the app before its event loop "
        "starts, so it cannot await it; make it a plain function that returns the gnl.App "
        "(what needs the loop belongs in the handlers)"
    )
