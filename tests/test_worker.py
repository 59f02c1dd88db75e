"""API.md "Queue": the worker — handlers, ctx, outcomes, retries, cancel, timeouts, backoff."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from typing import Any

import pytest

import gnl
from _support import all_jobs, job_state, noop, wait_for


class Boom(Exception):
    pass


# --------------------------------------------------------------------------------------------
# handler, ctx, result


async def test_handler_gets_payload_and_ctx(storage: gnl.Storage) -> None:
    seen: list[tuple[Any, dict[str, Any]]] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        assert isinstance(ctx, gnl.JobContext)
        seen.append(
            (
                payload,
                {
                    "job_id": ctx.job_id,
                    "type": ctx.type,
                    "org_id": ctx.org_id,
                    "attempt": ctx.attempt,
                    "run_id": ctx.run_id,
                    "journal": ctx.journal,
                    "signal": ctx.signal,
                },
            )
        )

    a = await gnl.enqueue(storage, "reindex", {"docId": "d-9"}, id="job-a", org_id="acme")
    b = await gnl.enqueue(storage, "reindex", [1, 2])
    result = await gnl.create_worker(storage, {"reindex": handler}).drain()
    assert result == gnl.DrainResult(processed=2, succeeded=2, failed=0)
    by_id = {c["job_id"]: (p, c) for p, c in seen}
    pa, ca = by_id[a]
    assert pa == {"docId": "d-9"}
    assert (ca["type"], ca["org_id"], ca["attempt"]) == ("reindex", "acme", 1)
    pb, cb = by_id[b]
    assert pb == [1, 2] and cb["org_id"] is None and cb["attempt"] == 1
    assert isinstance(ca["run_id"], str) and ca["run_id"]
    assert ca["run_id"] != cb["run_id"]
    assert isinstance(ca["journal"], gnl.Journal)
    assert ca["journal"].storage is storage
    for _, c in seen:
        assert isinstance(c["signal"], gnl.RevocationSignal)
        assert not c["signal"].aborted and c["signal"].reason is None


async def test_run_ids_differ_across_organizations(storage: gnl.Storage) -> None:
    run_ids: dict[tuple[str | None, str], str] = {}

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        run_ids[(ctx.org_id, ctx.job_id)] = ctx.run_id

    for org, job_id in ((None, "x"), ("a", "x"), ("a:b", "c"), ("a", "b:c"), ("b", "x")):
        await gnl.enqueue(storage, "t", None, id=job_id, org_id=org)
    await gnl.create_worker(storage, {"t": handler}).drain()
    assert len(run_ids) == 5
    assert len(set(run_ids.values())) == 5


@pytest.mark.parametrize(
    "result",
    [None, {"ok": [1, 2, {"n": None}]}, "text", 42, 2**70, 0.5, [], True],
    ids=repr,
)
async def test_result_is_stored(storage: gnl.Storage, result: Any) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
        return result

    job_id = await gnl.enqueue(storage, "t", None)
    t0 = await storage.now_ms()
    await gnl.create_worker(storage, {"t": handler}).drain()
    job = await gnl.get_job(storage, job_id)
    assert job is not None
    assert job.state == "done"
    assert job.result == result
    assert job.attempts == 1
    assert job.last_error is None
    assert job.finished_at is not None and job.finished_at >= t0
    assert job.updated_at >= job.created_at


async def test_non_json_result_fails_the_attempt(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
        return (1, 2)

    job_id = await gnl.enqueue(storage, "t", None)
    result = await gnl.create_worker(storage, {"t": handler}, max_attempts=1).drain()
    assert result == gnl.DrainResult(1, 0, 1)
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "dead" and job.result is None
    assert job.last_error is not None and "tuple" in job.last_error


async def test_state_transitions_pending_running_done(storage: gnl.Storage) -> None:
    states: list[str | None] = []
    job_id = await gnl.enqueue(storage, "t", None)
    states.append(await job_state(storage, job_id))

    async def handler(payload: Any, ctx: gnl.JobContext) -> str:
        states.append(await job_state(storage, job_id))
        running = await gnl.get_job(storage, job_id)
        assert running is not None and running.attempts == 1 and running.finished_at is None
        return "r"

    await gnl.create_worker(storage, {"t": handler}).drain()
    states.append(await job_state(storage, job_id))
    assert states == ["pending", "running", "done"]


async def test_max_attempts_is_recorded_on_claim(storage: gnl.Storage) -> None:
    job_id = await gnl.enqueue(storage, "t", None)
    await gnl.create_worker(storage, {"t": noop}, max_attempts=7).drain()
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.max_attempts == 7


async def test_concurrency_runs_handlers_at_once(storage: gnl.Storage) -> None:
    running = 0
    peak = 0

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.1)
        running -= 1

    await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(9)])
    t0 = time.monotonic()
    result = await gnl.create_worker(storage, {"t": handler}, concurrency=3).drain()
    elapsed = time.monotonic() - t0
    assert result == gnl.DrainResult(9, 9, 0)
    assert peak == 3
    assert elapsed < 0.9  # 3 rounds of 0.1 s, not 9


async def test_drain_result_counts(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        if payload % 3 == 0:
            raise Boom(f"bad {payload}")

    await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(10)])
    worker = gnl.create_worker(storage, {"t": handler}, max_attempts=1)
    result = await worker.drain()
    assert isinstance(result, gnl.DrainResult)
    assert (result.processed, result.succeeded, result.failed) == (10, 6, 4)
    assert await worker.drain() == gnl.DrainResult(0, 0, 0)
    states = sorted(j.state for j in await all_jobs(storage))
    assert states == ["dead"] * 4 + ["done"] * 6


# --------------------------------------------------------------------------------------------
# failures and retries


async def test_failing_handler_is_retried_then_dead(storage: gnl.Storage) -> None:
    attempts: list[int] = []
    run_ids: set[str] = set()

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        attempts.append(ctx.attempt)
        run_ids.add(ctx.run_id)
        raise Boom(f"kaput on attempt {ctx.attempt}")

    job_id = await gnl.enqueue(storage, "t", None)
    result = await gnl.create_worker(
        storage, {"t": handler}, max_attempts=3, retry_delay_ms=0
    ).drain()
    assert result == gnl.DrainResult(3, 0, 3)
    assert attempts == [1, 2, 3]
    assert len(run_ids) == 1
    job = await gnl.get_job(storage, job_id)
    assert job is not None
    assert job.state == "dead" and job.attempts == 3 and job.max_attempts == 3
    assert job.last_error is not None and "kaput on attempt 3" in job.last_error
    assert job.finished_at is not None
    # Dead stays dead.
    assert (
        await gnl.create_worker(storage, {"t": handler}, retry_delay_ms=0).drain()
    ).processed == 0


async def _cancels_its_task(payload: Any, ctx: gnl.JobContext) -> str:
    """Cancels its own task on the first attempt of ``cancel``; raises CancelledError on the
    first attempt of ``raise``, its task not cancelled."""
    if payload == "cancel" and ctx.attempt == 1:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
    if payload == "raise" and ctx.attempt == 1:
        raise asyncio.CancelledError
    return f"{payload} {ctx.attempt}"


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_cancelled_drain_ends_at_once_and_its_jobs_run_again(
    storage: gnl.Storage, concurrency: int
) -> None:
    # A drain whose caller gives up (wait_for's timeout, Ctrl-C, task.cancel()) while a
    # handler hangs: it raises at once; the running handler's signal aborts ("shutdown") and
    # its task is cancelled; its attempt, and those of jobs claimed but not started, fail and
    # are retried: a later drain runs every job.
    started: list[str] = []
    whys: list[str | None] = []
    hang = asyncio.Event()

    async def handler(payload: str, ctx: gnl.JobContext) -> str:
        started.append(payload)
        if payload == "hang" and ctx.attempt == 1:
            try:
                await hang.wait()
            finally:
                whys.append(ctx.signal.reason.why if ctx.signal.reason else None)
        return f"{payload} {ctx.attempt}"

    names = ["hang"] + [f"j{i}" for i in range(6)]
    ids = await gnl.enqueue_many(storage, [{"type": "t", "payload": p} for p in names])
    worker = gnl.create_worker(
        storage, {"t": handler}, concurrency=concurrency, retry_delay_ms=0, max_attempts=3
    )
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(worker.drain(), 0.5)
    assert time.monotonic() - t0 < 5
    assert whys == ["shutdown"], whys
    res = await gnl.create_worker(storage, {"t": handler}, retry_delay_ms=0).drain()
    jobs = [await gnl.get_job(storage, i) for i in ids]
    assert all(j is not None and j.state == "done" for j in jobs), [
        (j.id, j.state, j.last_error) for j in jobs if j is not None
    ]
    hung = jobs[0]
    assert hung is not None and hung.result == "hang 2"
    assert res.processed >= 1


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_handler_whose_task_is_cancelled_fails_its_attempt(
    storage: gnl.Storage, concurrency: int
) -> None:
    # A run that does not return or raise an Exception (its task cancelled, here by the
    # handler itself) still ends: its attempt fails, is retried at once, and the jobs after
    # it run.
    ids = await gnl.enqueue_many(
        storage, [{"type": "t", "payload": p} for p in ("cancel", "raise", "plain")]
    )
    worker = gnl.create_worker(
        storage, {"t": _cancels_its_task}, max_attempts=2, retry_delay_ms=0, concurrency=concurrency
    )
    assert await worker.drain() == gnl.DrainResult(5, 3, 2)
    jobs = [await gnl.get_job(storage, i) for i in ids]
    assert [(j.state, j.attempts, j.result) for j in jobs if j is not None] == [
        ("done", 2, "cancel 2"),
        ("done", 2, "raise 2"),
        ("done", 1, "plain 1"),
    ]
    errors = [j.last_error or "" for j in jobs if j is not None]
    assert "the handler's task was cancelled" in errors[0]
    assert "the handler raised CancelledError" in errors[1]


async def test_a_handler_run_after_quick_ones_whose_task_is_cancelled_fails_its_attempt(
    storage: gnl.Storage,
) -> None:
    # At concurrency 1 quick handlers run two a claim in one task (on a SQLite file): a
    # handler that cancels its task there too fails only its own attempt; the drain goes on.
    names = [f"q{i}" for i in range(30)] + ["cancel"] + [f"r{i}" for i in range(30)]
    ids = await gnl.enqueue_many(storage, [{"type": "t", "payload": p} for p in names])
    worker = gnl.create_worker(storage, {"t": _cancels_its_task}, max_attempts=2, retry_delay_ms=0)
    assert await worker.drain() == gnl.DrainResult(len(names) + 1, len(names), 1)
    jobs = [await gnl.get_job(storage, i) for i in ids]
    assert [(j.state, j.result) for j in jobs if j is not None] == [
        ("done", f"{p} {2 if p == 'cancel' else 1}") for p in names
    ]
    cancelled = jobs[names.index("cancel")]
    assert cancelled is not None and "the handler's task was cancelled" in (
        cancelled.last_error or ""
    )


_SEEN: contextvars.ContextVar[Any] = contextvars.ContextVar("seen", default=None)


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_handlers_context_variables_do_not_reach_the_next_job(
    storage: gnl.Storage, concurrency: int
) -> None:
    # Each run sees the context the worker started in, whatever the run before it set.
    found: list[Any] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        found.append(_SEEN.get())
        _SEEN.set(payload)
        if payload % 5 == 0:
            await asyncio.sleep(0)
            assert _SEEN.get() == payload

    await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(40)])
    worker = gnl.create_worker(storage, {"t": handler}, concurrency=concurrency)
    assert (await worker.drain()).processed == 40
    assert found == [None] * 40
    assert _SEEN.get() is None


async def test_failed_attempt_goes_back_to_pending_with_its_error(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        raise Boom("first failure")

    job_id = await gnl.enqueue(storage, "t", None)
    await gnl.create_worker(storage, {"t": handler}, max_attempts=5, retry_delay_ms=60_000).drain()
    job = await gnl.get_job(storage, job_id)
    assert job is not None
    assert job.state == "pending" and job.attempts == 1
    assert job.last_error is not None and "first failure" in job.last_error
    assert job.finished_at is None


async def test_retry_delay_ms_int(storage: gnl.Storage) -> None:
    calls: list[float] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> str:
        calls.append(time.monotonic())
        if ctx.attempt == 1:
            raise Boom("again")
        return "ok"

    job_id = await gnl.enqueue(storage, "t", None)
    worker = gnl.create_worker(storage, {"t": handler}, retry_delay_ms=300)
    assert await worker.drain() == gnl.DrainResult(1, 0, 1)
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "pending"
    assert 295 <= job.run_at - job.updated_at <= 305
    assert await worker.drain() == gnl.DrainResult(0, 0, 0)  # not due yet
    await asyncio.sleep(max(0, job.run_at - await storage.now_ms()) / 1000 + 0.03)
    assert await worker.drain() == gnl.DrainResult(1, 1, 0)
    assert calls[1] - calls[0] >= 0.28
    done = await gnl.get_job(storage, job_id)
    assert done is not None and done.state == "done" and done.attempts == 2


async def test_retry_delay_ms_callable_gets_the_failed_attempt(storage: gnl.Storage) -> None:
    asked: list[int] = []

    def delay(attempt: int) -> int:
        asked.append(attempt)
        return 0 if attempt == 1 else 50_000

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        raise Boom(str(ctx.attempt))

    job_id = await gnl.enqueue(storage, "t", None)
    result = await gnl.create_worker(
        storage, {"t": handler}, max_attempts=5, retry_delay_ms=delay
    ).drain()
    # Attempt 1 is retried at once; attempt 2's retry is 50 s away.
    assert result == gnl.DrainResult(2, 0, 2)
    assert asked == [1, 2]
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "pending" and job.attempts == 2
    assert 49_900 <= job.run_at - job.updated_at <= 50_100


async def test_default_retry_delay_is_about_one_second(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        raise Boom("x")

    ids = await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(20)])
    await gnl.create_worker(storage, {"t": handler}, concurrency=20).drain()
    delays = []
    for job_id in ids:
        job = await gnl.get_job(storage, job_id)
        assert job is not None and job.state == "pending"
        delays.append(job.run_at - job.updated_at)
    # Exponential from 1,000 ms with ±20% jitter.
    assert all(800 <= d <= 1200 for d in delays), delays
    assert len(set(delays)) > 1, "no jitter"


async def test_unhandled_base_exception_types(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        raise ValueError("plain value error")

    job_id = await gnl.enqueue(storage, "t", None)
    await gnl.create_worker(storage, {"t": handler}, max_attempts=1).drain()
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "dead"
    assert job.last_error is not None and "plain value error" in job.last_error


# --------------------------------------------------------------------------------------------
# retry_job / cancel_job


async def test_retry_job(storage: gnl.Storage) -> None:
    fail = True

    async def handler(payload: Any, ctx: gnl.JobContext) -> str:
        if fail:
            raise Boom("x")
        return "ok"

    job_id = await gnl.enqueue(storage, "t", None, org_id="acme")
    worker = gnl.create_worker(storage, {"t": handler}, max_attempts=2, retry_delay_ms=0)
    await worker.drain()
    dead = await gnl.get_job(storage, job_id, org_id="acme")
    assert dead is not None and dead.state == "dead" and dead.attempts == 2
    # Addressed by org: the no-org scope has no such job.
    assert await gnl.retry_job(storage, job_id) is False
    assert await gnl.retry_job(storage, job_id, org_id="acme") is True
    job = await gnl.get_job(storage, job_id, org_id="acme")
    assert job is not None and job.state == "pending" and job.attempts == 0
    assert job.finished_at is None
    # Pending now: a second retry changes nothing.
    assert await gnl.retry_job(storage, job_id, org_id="acme") is False
    assert await gnl.get_job(storage, job_id, org_id="acme") == job
    fail = False
    assert await worker.drain() == gnl.DrainResult(1, 1, 0)
    done = await gnl.get_job(storage, job_id, org_id="acme")
    assert done is not None and done.state == "done" and done.attempts == 1 and done.result == "ok"
    assert await gnl.retry_job(storage, job_id, org_id="acme") is False
    assert await gnl.get_job(storage, job_id, org_id="acme") == done


async def test_retry_job_false_for_other_states_and_unknown(storage: gnl.Storage) -> None:
    pending = await gnl.enqueue(storage, "t", None)
    canceled = await gnl.enqueue(storage, "t", None)
    assert await gnl.cancel_job(storage, canceled)
    before = await all_jobs(storage)
    for job_id in (pending, canceled, "unknown"):
        assert await gnl.retry_job(storage, job_id) is False
    assert await all_jobs(storage) == before


async def test_cancel_pending_job(storage: gnl.Storage) -> None:
    job_id = await gnl.enqueue(storage, "t", None, org_id="acme")
    other = await gnl.enqueue(storage, "t", None, org_id="acme")
    assert await gnl.cancel_job(storage, job_id, org_id="acme", reason="customer left") is True
    job = await gnl.get_job(storage, job_id, org_id="acme")
    assert job is not None and job.state == "canceled" and job.finished_at is not None
    assert job.last_error is not None and "customer left" in job.last_error
    seen = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        seen.append(ctx.job_id)

    assert await gnl.create_worker(storage, {"t": handler}).drain() == gnl.DrainResult(1, 1, 0)
    assert seen == [other]
    # Finished jobs and unknown ids: False, nothing changes.
    before = await all_jobs(storage)
    assert await gnl.cancel_job(storage, job_id, org_id="acme") is False
    assert await gnl.cancel_job(storage, other, org_id="acme") is False
    assert await gnl.cancel_job(storage, "nope", org_id="acme") is False
    assert await gnl.cancel_job(storage, job_id) is False  # another scope
    assert await all_jobs(storage) == before


async def test_cancel_dead_job_is_false(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        raise Boom("x")

    job_id = await gnl.enqueue(storage, "t", None)
    await gnl.create_worker(storage, {"t": handler}, max_attempts=1).drain()
    before = await gnl.get_job(storage, job_id)
    assert before is not None and before.state == "dead"
    assert await gnl.cancel_job(storage, job_id) is False
    assert await gnl.get_job(storage, job_id) == before


@pytest.mark.parametrize("ending", ["returns", "raises"])
async def test_cancel_running_job_aborts_its_signal(storage: gnl.Storage, ending: str) -> None:
    started = asyncio.Event()
    aborted = asyncio.Event()
    release = asyncio.Event()
    whys: list[str] = []
    attempts: list[int] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> str:
        attempts.append(ctx.attempt)
        started.set()
        reason = await asyncio.wait_for(ctx.signal.wait(), 5)
        assert isinstance(reason, gnl.ExecutionRevokedError)
        assert ctx.signal.aborted and ctx.signal.reason is reason
        whys.append(reason.why)
        aborted.set()
        await release.wait()
        if ending == "raises":
            ctx.signal.raise_if_aborted()
        return "finished anyway"

    job_id = await gnl.enqueue(storage, "t", None)
    worker = gnl.create_worker(
        storage, {"t": handler}, ttl_ms=300, max_attempts=3, retry_delay_ms=0, poll_ms=10
    )
    async with worker:
        await asyncio.wait_for(started.wait(), 5)
        assert await job_state(storage, job_id) == "running"
        assert await gnl.cancel_job(storage, job_id, reason="stop it") is True
        # The renewal (every ttl_ms/3) tells the handler.
        await asyncio.wait_for(aborted.wait(), 2)
        # It becomes canceled when its handler returns, not before.
        assert await job_state(storage, job_id) == "running"
        release.set()
        await wait_for(
            lambda: _is(job_state(storage, job_id), "canceled"), timeout=5, what="canceled"
        )
        await asyncio.sleep(0.2)  # a retry would show up here
    assert whys == ["canceled"]
    assert attempts == [1]
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "canceled" and job.attempts == 1
    assert job.finished_at is not None
    assert await gnl.create_worker(storage, {"t": handler}).drain() == gnl.DrainResult(0, 0, 0)
    assert await gnl.cancel_job(storage, job_id) is False


async def _is(value: Any, expected: Any) -> bool:
    return bool((await value) == expected)


# --------------------------------------------------------------------------------------------
# max_hold_ms and the stuck-handler warning


async def test_max_hold_ms_aborts_with_timeout_and_fails_the_attempt(storage: gnl.Storage) -> None:
    whys: list[str] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> str:
        reason = await asyncio.wait_for(ctx.signal.wait(), 5)
        whys.append(reason.why)
        return "returned after the timeout"

    job_id = await gnl.enqueue(storage, "t", None)
    t0 = time.monotonic()
    result = await gnl.create_worker(
        storage, {"t": handler}, max_hold_ms=150, max_attempts=2, retry_delay_ms=0
    ).drain()
    assert time.monotonic() - t0 >= 0.28
    assert result == gnl.DrainResult(2, 0, 2)
    assert whys == ["timeout", "timeout"]
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "dead" and job.attempts == 2
    assert job.result is None
    assert job.last_error is not None and "timeout" in job.last_error


async def test_max_hold_ms_raising_handler(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        await ctx.signal.wait()
        ctx.signal.raise_if_aborted()

    job_id = await gnl.enqueue(storage, "t", None)
    result = await gnl.create_worker(
        storage, {"t": handler}, max_hold_ms=50, max_attempts=1
    ).drain()
    assert result == gnl.DrainResult(1, 0, 1)
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "dead"
    assert job.last_error is not None and "timeout" in job.last_error


async def test_a_quick_handler_is_not_timed_out(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> str:
        await asyncio.sleep(0.01)
        assert not ctx.signal.aborted
        return "ok"

    await gnl.enqueue(storage, "t", None)
    result = await gnl.create_worker(storage, {"t": handler}, max_hold_ms=2_000).drain()
    assert result == gnl.DrainResult(1, 1, 0)


async def test_handler_still_running_after_abort_is_warned_once(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    async def stubborn(payload: Any, ctx: gnl.JobContext) -> None:
        await asyncio.sleep(0.9)  # ignores its signal

    async def polite(payload: Any, ctx: gnl.JobContext) -> None:
        await ctx.signal.wait()

    caplog.set_level(logging.WARNING, logger="gnl")
    stuck = await gnl.enqueue(storage, "stubborn", None, id="stuck-job")
    await gnl.enqueue(storage, "polite", None, id="polite-job")
    await gnl.create_worker(
        storage,
        {"stubborn": stubborn, "polite": polite},
        max_hold_ms=100,
        ttl_ms=200,
        max_attempts=1,
        concurrency=2,
    ).drain()
    warnings = [r for r in caplog.records if r.name == "gnl" and r.levelno >= logging.WARNING]
    about_stuck = [r for r in warnings if stuck in r.getMessage()]
    assert len(about_stuck) == 1, [r.getMessage() for r in warnings]
    assert not [r for r in warnings if "polite-job" in r.getMessage()]


# --------------------------------------------------------------------------------------------
# lifecycle: start/stop, async with, drain, polling


async def test_async_with_worker_processes_jobs(storage: gnl.Storage) -> None:
    done = asyncio.Event()
    seen: list[Any] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        seen.append(payload)
        if len(seen) == 3:
            done.set()

    await gnl.enqueue(storage, "t", 1)
    async with gnl.create_worker(storage, {"t": handler}, poll_ms=10) as worker:
        assert isinstance(worker, gnl.Worker)
        await gnl.enqueue(storage, "t", 2)
        await asyncio.sleep(0.05)
        await gnl.enqueue(storage, "t", 3)
        await asyncio.wait_for(done.wait(), 5)
    assert sorted(seen) == [1, 2, 3]
    assert all(j.state == "done" for j in await all_jobs(storage))


async def test_stop_waits_for_running_handlers(storage: gnl.Storage) -> None:
    started = asyncio.Event()
    finished: list[bool] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> str:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(True)
        return "done"

    job_id = await gnl.enqueue(storage, "t", None)
    worker = gnl.create_worker(storage, {"t": handler}, poll_ms=10)
    worker.start()
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop()
    assert finished == [True]
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "done" and job.result == "done"


async def test_stop_stops_claiming(storage: gnl.Storage) -> None:
    started = asyncio.Event()
    gate = asyncio.Event()
    seen: list[str] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        seen.append(ctx.job_id)
        started.set()
        await gate.wait()

    await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(5)])
    worker = gnl.create_worker(storage, {"t": handler}, poll_ms=10)
    worker.start()
    await asyncio.wait_for(started.wait(), 5)
    stopping = asyncio.ensure_future(worker.stop())
    await asyncio.sleep(0.05)
    gate.set()
    await stopping
    assert len(seen) == 1
    states = sorted(j.state for j in await all_jobs(storage))
    assert states == ["done"] + ["pending"] * 4
    # stop() is idempotent, and the worker can drain afterwards.
    await worker.stop()
    assert (await worker.drain()).processed == 4


async def test_empty_poll_backoff(storage: gnl.Storage) -> None:
    worker = gnl.create_worker(storage, {"t": noop}, poll_ms=10, max_poll_ms=80)
    c0 = storage.query_count
    worker.start()
    await asyncio.sleep(1.0)
    await worker.stop()
    polls = storage.query_count - c0
    # Without backoff: 100 polls. With 10 -> 20 -> 40 -> 80 ms: about 15.
    assert polls <= 30, polls
    assert polls >= 5, polls


async def test_backoff_resets_when_a_job_is_claimed(storage: gnl.Storage) -> None:
    seen: list[float] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        seen.append(time.monotonic())

    worker = gnl.create_worker(storage, {"t": handler}, poll_ms=20, max_poll_ms=400)
    worker.start()
    try:
        await asyncio.sleep(1.0)  # backed off to 400 ms
        t0 = time.monotonic()
        await gnl.enqueue(storage, "t", 1)
        await wait_for(lambda: len(seen) == 1, timeout=5)
        assert seen[0] - t0 <= 0.6
        # After a claim the interval is poll_ms again: the next job is picked up fast.
        await asyncio.sleep(0.03)
        t1 = time.monotonic()
        await gnl.enqueue(storage, "t", 2)
        await wait_for(lambda: len(seen) == 2, timeout=5)
        assert seen[1] - t1 <= 0.3, seen[1] - t1
    finally:
        await worker.stop()


async def test_drain_does_not_wait_for_jobs_that_are_not_due(storage: gnl.Storage) -> None:
    await gnl.enqueue(storage, "t", None, delay_ms=5_000)
    t0 = time.monotonic()
    assert await gnl.create_worker(storage, {"t": noop}).drain() == gnl.DrainResult(0, 0, 0)
    assert time.monotonic() - t0 < 2


async def test_create_worker_checks_its_arguments(storage: gnl.Storage) -> None:
    h = {"t": noop}
    for kwargs in (
        {"ttl_ms": "30"},
        {"max_attempts": 1.5},
        {"concurrency": True},
        {"poll_ms": None},
        {"name": 5},
    ):
        with pytest.raises(TypeError):
            gnl.create_worker(storage, h, **kwargs)
    for kwargs in ({"max_attempts": 0}, {"concurrency": 0}, {"ttl_ms": 0}, {"poll_ms": 0}):
        with pytest.raises(gnl.InvalidArgumentError):
            gnl.create_worker(storage, h, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        gnl.create_worker(storage, {"t": "not callable"})  # type: ignore[dict-item]
    # No job has type "" (enqueue refuses it): a handler for it could never run.
    with pytest.raises(gnl.InvalidArgumentError, match="non-empty job types"):
        gnl.create_worker(storage, {"t": noop, "": noop})
    with pytest.raises(TypeError):
        gnl.create_worker("sqlite::memory:", h)  # type: ignore[arg-type]
    # The work store is accepted as well as the storage.
    assert isinstance(gnl.create_worker(storage.work, h), gnl.Worker)


# --------------------------------------------------------------------------------------------
# ctx.step


@pytest.mark.parametrize("kind", ["plain", "async"])
async def test_step_runs_once_per_run_across_attempts(storage: gnl.Storage, kind: str) -> None:
    calls: list[tuple[int, int]] = []
    results: list[Any] = []

    def charge_plain(amount: int, attempt: int) -> dict[str, Any]:
        calls.append((amount, attempt))
        return {"charged": amount, "on_attempt": attempt}

    async def charge_async(amount: int, attempt: int) -> dict[str, Any]:
        await asyncio.sleep(0)
        return charge_plain(amount, attempt)

    fn = charge_plain if kind == "plain" else charge_async

    async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
        value = await ctx.step("charge", fn, payload["amount"], ctx.attempt)
        results.append(value)
        if ctx.attempt == 1:
            raise Boom("crash after the step")
        return value

    job_id = await gnl.enqueue(storage, "t", {"amount": 42})
    result = await gnl.create_worker(storage, {"t": handler}, retry_delay_ms=0).drain()
    assert result == gnl.DrainResult(2, 1, 1)
    assert calls == [(42, 1)]
    assert results == [{"charged": 42, "on_attempt": 1}] * 2
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.state == "done" and job.attempts == 2
    assert job.result == {"charged": 42, "on_attempt": 1}


async def test_steps_are_per_name_call_and_per_job(storage: gnl.Storage) -> None:
    # Keyed (run_id, name, n): a second call of "a" is a step of its own (n = 1).
    calls: list[str] = []

    def record(tag: str) -> str:
        calls.append(tag)
        return tag

    async def handler(payload: Any, ctx: gnl.JobContext) -> list[str]:
        a = await ctx.step("a", record, f"{ctx.job_id}:a")
        b = await ctx.step("b", record, f"{ctx.job_id}:b")
        a2 = await ctx.step("a", record, f"{ctx.job_id}:a2")
        return [a, b, a2]

    await gnl.enqueue(storage, "t", None, id="j1")
    await gnl.enqueue(storage, "t", None, id="j1", org_id="acme")  # same id, another run
    await gnl.create_worker(storage, {"t": handler}).drain()
    assert sorted(calls) == ["j1:a", "j1:a", "j1:a2", "j1:a2", "j1:b", "j1:b"]
    for org in (None, "acme"):
        job = await gnl.get_job(storage, "j1", org_id=org)
        assert job is not None and job.result == ["j1:a", "j1:b", "j1:a2"]


async def test_step_result_must_be_json(storage: gnl.Storage) -> None:
    errors: list[BaseException] = []
    later: list[Any] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        try:
            await ctx.step("bad", lambda: {1, 2})
        except TypeError as e:
            errors.append(e)
        try:
            await ctx.step("nan", lambda: float("nan"))
        except ValueError as e:
            errors.append(e)
        # Nothing was recorded: the step runs again and records a JSON value.
        later.append(await ctx.step("bad", lambda: [1, 2]))

    await gnl.enqueue(storage, "t", None)
    assert (await gnl.create_worker(storage, {"t": handler}).drain()).succeeded == 1
    assert len(errors) == 2
    assert isinstance(errors[0], TypeError) and not isinstance(errors[0], gnl.GnlError)
    assert isinstance(errors[1], gnl.InvalidArgumentError)
    assert later == [[1, 2]]


async def test_step_failure_is_not_recorded(storage: gnl.Storage) -> None:
    calls: list[int] = []

    def flaky(attempt: int) -> int:
        calls.append(attempt)
        if attempt == 1:
            raise Boom("step failed")
        return attempt

    async def handler(payload: Any, ctx: gnl.JobContext) -> int:
        value: int = await ctx.step("flaky", flaky, ctx.attempt)
        return value

    job_id = await gnl.enqueue(storage, "t", None)
    result = await gnl.create_worker(storage, {"t": handler}, retry_delay_ms=0).drain()
    assert result == gnl.DrainResult(2, 1, 1)
    assert calls == [1, 2]
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.result == 2


# --------------------------------------------------------------------------------------------
# leases held by a live worker


async def test_a_live_lease_is_renewed_past_ttl(storage: gnl.Storage) -> None:
    started = asyncio.Event()

    async def slow(payload: Any, ctx: gnl.JobContext) -> str:
        started.set()
        await asyncio.sleep(1.0)  # more than 3 x ttl_ms
        assert not ctx.signal.aborted
        return "slow"

    other_seen: list[str] = []

    async def other(payload: Any, ctx: gnl.JobContext) -> None:
        other_seen.append(ctx.job_id)

    job_id = await gnl.enqueue(storage, "t", None)
    async with gnl.create_worker(storage, {"t": slow}, ttl_ms=300, poll_ms=10):
        await asyncio.wait_for(started.wait(), 5)
        for _ in range(4):
            await asyncio.sleep(0.2)
            # Another worker finds nothing to reclaim: the lease is alive.
            assert await gnl.create_worker(
                storage, {"t": other}, ttl_ms=300
            ).drain() == gnl.DrainResult(0, 0, 0)
            assert await job_state(storage, job_id) == "running"
        await wait_for(lambda: _is(job_state(storage, job_id), "done"), timeout=5)
    assert other_seen == []
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.attempts == 1 and job.result == "slow"


async def test_timeout_keeps_the_lease_until_the_handler_returns(storage: gnl.Storage) -> None:
    started = asyncio.Event()

    async def stubborn(payload: Any, ctx: gnl.JobContext) -> None:
        started.set()
        await asyncio.sleep(0.8)

    job_id = await gnl.enqueue(storage, "t", None)
    worker = gnl.create_worker(
        storage,
        {"t": stubborn},
        ttl_ms=300,
        max_hold_ms=50,
        max_attempts=2,
        retry_delay_ms=60_000,
        poll_ms=10,
    )
    async with worker:
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.sleep(0.45)  # timed out, and longer than ttl_ms
        assert await job_state(storage, job_id) == "running"
        assert (await gnl.create_worker(storage, {"t": noop}).drain()).processed == 0
        await wait_for(lambda: _is(job_state(storage, job_id), "pending"), timeout=5)
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.attempts == 1
    assert job.last_error is not None and "timeout" in job.last_error


# --------------------------------------------------------------------------------------------
# races and sizes


async def test_racing_enqueues_of_one_id_make_one_job(storage: gnl.Storage) -> None:
    others = [await gnl.connect(storage.url) for _ in range(3)]
    try:
        stores = [storage, *others]
        results = await asyncio.gather(
            *(gnl.enqueue(stores[i % 4], "t", i, id="same", org_id="acme") for i in range(24)),
            *(
                gnl.enqueue_many(
                    stores[i % 4],
                    [gnl.JobSpec(type="t", payload=100 + i, id="same", org_id="acme")],
                )
                for i in range(8)
            ),
        )
        assert all(r in ("same", ["same"]) for r in results)
        jobs = await all_jobs(storage)
        assert len(jobs) == 1
        payload = jobs[0].payload
        assert payload in range(24) or payload in range(100, 108)
    finally:
        for o in others:
            await o.close()


async def test_big_payload_and_result(storage: gnl.Storage) -> None:
    big = {"blob": "x" * 2_000_000, "list": list(range(50_000))}

    async def echo(payload: Any, ctx: gnl.JobContext) -> Any:
        return payload

    job_id = await gnl.enqueue(storage, "t", big)
    assert await gnl.create_worker(storage, {"t": echo}).drain() == gnl.DrainResult(1, 1, 0)
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.payload == big and job.result == big


async def test_stop_does_not_wait_out_a_backed_off_poll(storage: gnl.Storage) -> None:
    worker = gnl.create_worker(storage, {"t": noop}, poll_ms=2_000)
    worker.start()
    await asyncio.sleep(0.1)  # the first poll found nothing: the next is 2 s away
    t0 = time.monotonic()
    await worker.stop()
    assert time.monotonic() - t0 < 1.0
    assert not worker.running


async def test_a_job_enqueued_while_the_worker_waits_is_picked_up(storage: gnl.Storage) -> None:
    seen = asyncio.Event()

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        seen.set()

    async with gnl.create_worker(storage, {"t": handler}, poll_ms=20, max_poll_ms=100):
        await asyncio.sleep(0.3)
        await gnl.enqueue(storage, "t", None)
        await asyncio.wait_for(seen.wait(), 5)


async def test_out_of_range_durations_are_refused_up_front(storage: gnl.Storage) -> None:
    with pytest.raises(gnl.InvalidArgumentError, match="retry_delay_ms"):
        gnl.create_worker(storage, {"t": noop}, retry_delay_ms=2**63)
    with pytest.raises(gnl.InvalidArgumentError, match="concurrency"):
        gnl.create_worker(storage, {"t": noop}, concurrency=2**64)


def test_a_worker_drains_again_on_a_new_event_loop(store_url: Any) -> None:
    url = store_url()
    held: dict[str, Any] = {}

    async def first() -> int:
        storage = await gnl.connect(url)
        held["storage"] = storage
        held["worker"] = gnl.create_worker(storage, {"t": noop})
        await gnl.enqueue(storage.work, "t", {})
        return (await held["worker"].drain()).processed

    async def second() -> int:
        storage = held["storage"]
        await gnl.enqueue(storage.work, "t", {})
        processed = (await held["worker"].drain()).processed
        await storage.close()
        return processed

    assert asyncio.run(first()) == 1
    assert asyncio.run(second()) == 1


# --------------------------------------------------------------------------------------------
# a worker claims only the job types it has handlers for (issue 15, deliverable 4)


async def test_workers_with_disjoint_handlers_run_only_their_own_types(
    storage: gnl.Storage,
) -> None:
    """Two deployments share one store, each with handlers for its own job types: each runs
    only its own jobs, none is failed or dead-lettered for want of a handler, and a job whose
    type no worker serves stays pending (and listed) for a worker that will."""
    ran: dict[str, list[str]] = {"mail": [], "pdf": []}

    def handler_of(worker: str) -> Any:
        async def handler(payload: Any, ctx: gnl.JobContext) -> None:
            ran[worker].append(ctx.type)

        return handler

    for i in range(12):
        await gnl.enqueue(storage, "email" if i % 2 else "render", {"i": i}, org_id=f"o{i % 3}")
    orphan = await gnl.enqueue(storage, "fax", {}, org_id="o1")
    mail = gnl.create_worker(storage, {"email": handler_of("mail")}, concurrency=2, name="mail")
    pdf = gnl.create_worker(
        storage, {"render": handler_of("pdf"), "ocr": handler_of("pdf")}, concurrency=3, name="pdf"
    )
    done_mail, done_pdf = await asyncio.gather(mail.drain(), pdf.drain())
    assert done_mail == gnl.DrainResult(processed=6, succeeded=6, failed=0)
    assert done_pdf == gnl.DrainResult(processed=6, succeeded=6, failed=0)
    assert ran == {"mail": ["email"] * 6, "pdf": ["render"] * 6}
    jobs = await all_jobs(storage)
    assert sorted(j.state for j in jobs) == ["done"] * 12 + ["pending"]
    fax = await gnl.get_job(storage, orphan, org_id="o1")
    assert fax is not None and (fax.state, fax.attempts, fax.last_error) == ("pending", 0, None)
    # A worker with the handler runs it.
    fax_worker = gnl.create_worker(storage, {"fax": noop})
    assert await fax_worker.drain() == gnl.DrainResult(processed=1, succeeded=1, failed=0)


async def test_a_plain_function_is_refused_as_a_handler_and_nothing_runs(
    storage: gnl.Storage,
) -> None:
    # A plain function where gnl awaits a handler would run its side effect, then fail the
    # attempt ("can't be used in 'await' expression") and repeat the effect on every retry.
    effects: list[str] = []

    def sync_handler(payload: Any, ctx: Any) -> None:
        effects.append("ran")

    async def async_handler(payload: Any, ctx: Any) -> None:
        effects.append("async ran")

    class AsyncCallable:
        async def __call__(self, payload: Any, ctx: Any) -> None:
            effects.append("callable ran")

    await gnl.enqueue(storage, "t", {}, id="sync-1")
    for bad in (sync_handler, lambda p, c: None, print):
        with pytest.raises(TypeError, match=r"the handler for 't' must be an async function"):
            gnl.create_worker(storage, {"t": bad})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="workflow 'w' must be an async function"):
        gnl.create_gnl(storage, {"w": lambda ctx, i: 1})
    with pytest.raises(TypeError, match="the handler of consumer 'c' must be an async function"):
        gnl.create_consumer(storage, "topic", sync_handler, name="c")
    app = gnl.App()
    with pytest.raises(TypeError, match="the handler of 'j' must be an async function"):
        app.job("j")(sync_handler)
    with pytest.raises(TypeError, match="a workflow must be an async function"):
        app.workflow("wf")(lambda ctx, i: 1)
    with pytest.raises(TypeError, match="the handler of consumer 'c' must be an async function"):
        app.consumer("topic", name="c")(sync_handler)
    assert effects == []
    job = await gnl.get_job(storage, "sync-1")
    assert job is not None and (job.state, job.attempts) == ("pending", 0)

    # An async function, a partial of one and an object with an async __call__ are handlers.
    for good in (async_handler, functools.partial(async_handler), AsyncCallable()):
        assert isinstance(gnl.create_worker(storage, {"t": good}), gnl.Worker)
    assert (await gnl.create_worker(storage, {"t": AsyncCallable()}).drain()).succeeded == 1
    assert effects == ["callable ran"]


class _CountingClaims:
    """A worker's native half that counts its claims in flight (the most at once)."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.out = 0
        self.most = 0
        self.waits = 0  # claims that waited for the lanes (one lane or a few)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def claim(self, n: int, carry: bool = True, per_org: int = 0, wait: bool = False) -> Any:
        fut = self._native.claim(n, carry, per_org, wait)
        self.out += 1
        self.most = max(self.most, self.out)
        self.waits += wait

        async def answer() -> Any:
            try:
                return await fut
            finally:
                self.out -= 1

        return answer()


async def _drain_counting(storage: gnl.Storage, orgs: int) -> _CountingClaims:
    """Drain 2,000 jobs over ``orgs`` organizations at C=10 with short handlers, counting the
    claims in flight; every job runs once."""
    await gnl.enqueue_many(
        storage,
        [{"type": "t", "payload": i, "options": {"org_id": f"o{i % orgs}"}} for i in range(2_000)],
    )
    ran: list[int] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        ran.append(payload)

    worker = gnl.create_worker(storage, {"t": handler}, concurrency=10)
    counting = _CountingClaims(worker._ensure_native())
    worker._native = counting  # type: ignore[assignment]
    result = await worker.drain()
    assert result.processed == 2_000
    assert sorted(ran) == list(range(2_000))
    return counting


async def test_short_handlers_keep_a_second_claim_in_flight_on_postgres(
    storage: gnl.Storage,
) -> None:
    # White-box (the worker's native half): 50 organizations, C=10, handlers shorter than a
    # claim. On Postgres the next claim goes out while the last one is in flight (two claims
    # with SKIP LOCKED take different lanes); elsewhere one claim is in flight at a time.
    # Every job runs once either way.
    counting = await _drain_counting(storage, 50)
    assert counting.most == (2 if storage.backend == "postgres" else 1)
    assert counting.waits == 0


async def test_short_handlers_over_one_organization_keep_two_claims_in_flight_on_postgres(
    storage: gnl.Storage,
) -> None:
    # As above, over one organization: a second claim that skipped the lane the first one
    # holds came back empty, so one claim was in flight; on Postgres the two wait for the lane
    # instead (migration 0011) and take consecutive batches. Every job runs once.
    counting = await _drain_counting(storage, 1)
    if storage.backend == "postgres":
        assert counting.most == 2 and counting.waits > 100, (counting.most, counting.waits)
    else:
        assert (counting.most, counting.waits) == (1, 0)


def _deep(payload: Any) -> Any:
    return payload["missing"]


async def test_a_handlers_traceback_is_logged_at_debug(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    # The job records the error's one line; where it failed was said nowhere, at any level.
    async def h(payload: Any, ctx: gnl.JobContext) -> Any:
        return _deep(payload)

    await gnl.enqueue(storage.work, "kerr", {}, id="k")
    with caplog.at_level(logging.DEBUG, logger="gnl"):
        await gnl.create_worker(storage, {"kerr": h}, max_attempts=1).drain()
    (rec,) = [r for r in caplog.records if "attempt 1 raised" in r.getMessage()]
    assert rec.levelno == logging.DEBUG and "job 'k'" in rec.getMessage()
    assert rec.exc_text is not None and "in _deep" in rec.exc_text and "KeyError" in rec.exc_text
