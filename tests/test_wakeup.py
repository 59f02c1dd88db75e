"""Wake-ups (issue 15; docs/DECISIONS.md "Wake-ups"): an idle worker starts a new job, and a
cancel reaches a running handler's signal, long before the poll backoff or the lease renewal.

The workers here poll every 10 s (``poll_ms=10_000``) and renew every 20 s (``ttl_ms=60_000``):
a job that starts, or a signal that aborts, within a few seconds got there by a wake-up.

* same process: every engine (the store's own notifier);
* another store on the same database (its own notifier, as another process has) and another
  process: Postgres (LISTEN/NOTIFY) and SQLite (``PRAGMA data_version``); a cancel also on
  MySQL (a worker looks for cancels every 500 ms while it holds jobs);
* Postgres: the listener's connection killed (``pg_terminate_backend``) is opened again and
  notifications work again;
* idle workers send no more statements than their poll schedule;
* an event consumer wakes on an emit (same Storage; another one on Postgres and SQLite);
* a scheduler's poller wakes on a trigger registered due now (same Storage; another one on
  Postgres and SQLite): it fires long before its next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import gnl

SLOW_POLL = 10_000  # ms: the first empty poll already sleeps this long
LONG_TTL = 60_000  # ms: renewals every 20 s
SOON = 4.0  # s: well before either


def _watching(backend: str) -> None:
    if backend == "mysql":
        pytest.skip("MySQL has no watcher: another process's change is found by the poll")


async def _idle_worker(storage: gnl.Storage, started: asyncio.Queue[str], **kw: Any) -> gnl.Worker:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        started.put_nowait(ctx.job_id)

    worker = gnl.create_worker(storage, {"t": handler}, poll_ms=SLOW_POLL, **kw)
    worker.start()
    await asyncio.sleep(0.5)  # its first poll came back empty: it sleeps 10 s
    return worker


@contextlib.asynccontextmanager
async def _two_storages(url: str) -> AsyncIterator[tuple[gnl.Storage, gnl.Storage]]:
    """Two Storages of ``url``: each has its own wake-ups, as another process has."""
    storage = await gnl.connect(url)
    other = await gnl.connect(url)
    try:
        yield storage, other
    finally:
        await other.close()
        await storage.close()


@contextlib.asynccontextmanager
async def _idle_beside_another_store(
    url: str,
) -> AsyncIterator[tuple[gnl.Storage, asyncio.Queue[str]]]:
    """An idle worker on one Storage of ``url``; yields a second Storage (its own wake-ups,
    as another process has) and the queue of the job ids the worker starts."""
    async with _two_storages(url) as (storage, other):
        started: asyncio.Queue[str] = asyncio.Queue()
        worker = await _idle_worker(storage, started)
        try:
            yield other, started
        finally:
            await worker.stop()


async def test_an_idle_worker_starts_a_job_enqueued_in_its_process_at_once(
    storage: gnl.Storage,
) -> None:
    started: asyncio.Queue[str] = asyncio.Queue()
    worker = await _idle_worker(storage, started)
    try:
        for _ in range(3):
            job_id = await gnl.enqueue(storage, "t", {})
            assert await asyncio.wait_for(started.get(), SOON) == job_id
            await asyncio.sleep(0.3)  # idle again
    finally:
        await worker.stop()


async def test_an_idle_worker_wakes_on_a_job_another_store_enqueued(
    backend: str, store_url: Callable[[], str]
) -> None:
    _watching(backend)
    async with _idle_beside_another_store(store_url()) as (other, started):
        for _ in range(3):
            job_id = await gnl.enqueue(other, "t", {})
            assert await asyncio.wait_for(started.get(), SOON) == job_id
            await asyncio.sleep(0.3)


ENQUEUE_FROM_A_PROCESS = """
import asyncio, sys, gnl
async def main():
    s = await gnl.connect(sys.argv[1])
    print(await gnl.enqueue(s, "t", {}), flush=True)
    await s.close()
asyncio.run(main())
"""


async def test_an_idle_worker_wakes_on_a_job_another_process_enqueued(
    backend: str, store_url: Callable[[], str]
) -> None:
    _watching(backend)
    url = store_url()
    storage = await gnl.connect(url)
    started: asyncio.Queue[str] = asyncio.Queue()
    worker = await _idle_worker(storage, started)
    try:
        for _ in range(2):
            out = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", ENQUEUE_FROM_A_PROCESS, url],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            job_id = out.stdout.strip()
            assert await asyncio.wait_for(started.get(), SOON) == job_id
            await asyncio.sleep(0.3)
        assert storage._native.remote_wakeups > 0
    finally:
        await worker.stop()
        await storage.close()


async def _cancel_reaches_the_signal(storage: gnl.Storage, canceler: gnl.Storage) -> str:
    running = asyncio.Event()
    aborted = asyncio.Event()
    whys: list[str] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        running.set()
        reason = await asyncio.wait_for(ctx.signal.wait(), 30)
        whys.append(reason.why)
        aborted.set()

    worker = gnl.create_worker(storage, {"t": handler}, ttl_ms=LONG_TTL, poll_ms=20)
    job_id = await gnl.enqueue(storage, "t", {})
    async with worker:
        await asyncio.wait_for(running.wait(), 10)
        await asyncio.sleep(0.3)
        assert await gnl.cancel_job(canceler, job_id)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(aborted.wait(), SOON)
        # Before the worker stops (its stop would wait for the handler, i.e. the renewal).
        assert whys == ["canceled"], "the cancel did not reach the signal before the renewal"
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "canceled"
    return whys[0]


async def test_a_cancel_in_the_same_process_reaches_the_signal_at_once(
    storage: gnl.Storage,
) -> None:
    await _cancel_reaches_the_signal(storage, storage)


async def test_a_cancel_from_another_store_reaches_the_signal_long_before_the_renewal(
    store_url: Callable[[], str],
) -> None:
    # MySQL included: without a watcher a worker holding jobs looks every 500 ms.
    url = store_url()
    storage = await gnl.connect(url)
    other = await gnl.connect(url)
    try:
        await _cancel_reaches_the_signal(storage, other)
    finally:
        await other.close()
        await storage.close()


def _psql(url: str, sql: str) -> str:
    out = subprocess.run(
        ["psql", url, "-XAtq", "-c", sql], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout.strip()


LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE application_name = 'gnl-listener' AND datname = current_database()"
)


async def test_postgres_listener_killed_reconnects_and_jobs_still_start(
    backend: str, store_url: Callable[[], str]
) -> None:
    if backend != "postgres":
        pytest.skip("Postgres LISTEN/NOTIFY")
    url = store_url()
    async with _idle_beside_another_store(url) as (other, started):
        assert await asyncio.to_thread(_psql, url, LISTENERS) == "1"
        killed = await asyncio.to_thread(
            _psql,
            url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'gnl-listener' AND datname = current_database()",
        )
        assert killed == "1"
        # Notifications sent while it is away are lost: the job is found anyway (the
        # reconnect wakes the workers once; else the poll).
        job_id = await gnl.enqueue(other, "t", {})
        assert await asyncio.wait_for(started.get(), SLOW_POLL / 1000 + SOON) == job_id
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(_psql, url, LISTENERS) != "1":
            assert time.monotonic() < deadline, "the listener did not reconnect"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        # Notifications reach it again.
        for _ in range(2):
            job_id = await gnl.enqueue(other, "t", {})
            assert await asyncio.wait_for(started.get(), SOON) == job_id
            await asyncio.sleep(0.3)


async def test_idle_workers_send_no_more_statements_than_their_polls(
    backend: str, store_url: Callable[[], str]
) -> None:
    # 10 idle workers at poll_ms=100 (cap 400 ms) over 3 s: each polls at most ~3 s / 400 ms
    # + its first polls, one statement (the empty-poll read) each; the wake-up machinery adds
    # none (its Postgres listener and SQLite data_version check are off the store's count).
    url = store_url()
    storage = await gnl.connect(url)

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        return None

    workers = [
        gnl.create_worker(storage, {"t": handler}, poll_ms=100, max_poll_ms=400) for _ in range(10)
    ]
    for w in workers:
        w.start()
    try:
        await asyncio.sleep(1.5)  # at the cap
        before = storage.query_count
        await asyncio.sleep(3)
        sent = storage.query_count - before
        # At the cap: 10 workers x 3 s / 0.4 s = 75 polls; allow a poll's worth of slack each.
        assert sent <= 10 * (3 / 0.4 + 2), sent
    finally:
        for w in workers:
            await w.stop()
        await storage.close()


async def _consumed_at_once(storage: gnl.Storage, via: gnl.Storage, topic: str) -> None:
    """A consumer of ``topic`` on ``storage`` polling every 10 s, idle; events emitted through
    ``via`` each reach it within SOON."""
    got: asyncio.Queue[Any] = asyncio.Queue()

    async def handler(payload: Any, ctx: Any) -> None:
        got.put_nowait(payload)

    consumer = gnl.create_consumer(storage, topic, handler, name="c1", poll_ms=SLOW_POLL)
    consumer.start()
    try:
        await asyncio.sleep(0.8)  # it found nothing and sleeps 10 s
        for i in range(2):
            await gnl.emit(via, topic, {"i": i})
            assert await asyncio.wait_for(got.get(), SOON) == {"i": i}
            await asyncio.sleep(0.3)
    finally:
        await consumer.stop()


async def test_a_consumer_wakes_on_an_emit_in_its_process(storage: gnl.Storage) -> None:
    await _consumed_at_once(storage, storage, "topic-a")


async def test_a_consumer_wakes_on_an_emit_of_another_store(
    backend: str, store_url: Callable[[], str]
) -> None:
    _watching(backend)
    async with _two_storages(store_url()) as (storage, other):
        await _consumed_at_once(storage, other, "topic-b")


class _Fired:
    """A scheduler's runner that records the workflow name of each fire."""

    def __init__(self) -> None:
        self.names: asyncio.Queue[str] = asyncio.Queue()

    async def run_workflow(
        self, name: str, *, run_id: str, input: Any, scheduled_for: int | None, signal: Any
    ) -> Any:
        self.names.put_nowait(name)


async def _fired_at_once(storage: gnl.Storage, via: gnl.Storage) -> None:
    """A scheduler polling ``storage`` every 10 s, idle; triggers registered due now through
    ``via`` each fire within SOON."""
    runner = _Fired()
    scheduler = gnl.create_scheduler(storage, runner, poll_ms=SLOW_POLL)
    scheduler.start()
    try:
        await asyncio.sleep(0.8)  # its first poll found nothing: it sleeps 10 s
        for i in range(3):
            await gnl.schedule_workflow(via, f"wf{i}", at=int(time.time() * 1000) - 1_000)
            assert await asyncio.wait_for(runner.names.get(), SOON) == f"wf{i}"
            await asyncio.sleep(0.3)  # idle again
    finally:
        await scheduler.stop()


async def test_an_idle_scheduler_fires_a_trigger_registered_in_its_process_at_once(
    storage: gnl.Storage,
) -> None:
    await _fired_at_once(storage, storage)


async def test_an_idle_scheduler_wakes_on_a_trigger_another_store_registered(
    backend: str, store_url: Callable[[], str]
) -> None:
    _watching(backend)
    async with _two_storages(store_url()) as (storage, other):
        await _fired_at_once(storage, other)
