"""API.md "Durable runs", in one process, on every backend: the journal's keys and first-writer
rule, run states and results, bad input, the critical preset and signals, durable sleep and the
waker, at-most-once steps and their resolution, divergence, ``claim``, ``ctx.run`` in a job.

Across processes (kill -9, two executors, two wakers): test_durable_mp.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Any

import pytest

import gnl
from _support import wait_for
from gnl import _native


def tally() -> tuple[dict[str, int], Any]:
    calls: dict[str, int] = {}

    def effect(tag: str, value: Any = None) -> Any:
        calls[tag] = calls.get(tag, 0) + 1
        return tag if value is None else value

    return calls, effect


def gated(effect: Any) -> tuple[Any, asyncio.Event, asyncio.Event]:
    """A workflow that runs step ``a``, sets ``inside``, waits for ``go_on``, then runs step
    ``b`` and returns its result; with the two events."""
    inside = asyncio.Event()
    go_on = asyncio.Event()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.step("a", effect, "a")
        inside.set()
        await go_on.wait()
        return await ctx.step("b", effect, "b")

    return wf, inside, go_on


async def test_steps_are_keyed_by_name_and_call(storage: gnl.Storage) -> None:
    calls, effect = tally()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> list[Any]:
        sent = [await ctx.step("send", effect, f"send-{i}") for i in range(3)]
        return [*sent, await ctx.step("other", effect, "other")]

    g = gnl.create_gnl(storage, {"wf": wf})
    assert await g.run_workflow("wf", run_id="r-1") == ["send-0", "send-1", "send-2", "other"]
    assert await g.run_workflow("wf", run_id="r-2") == ["send-0", "send-1", "send-2", "other"]
    assert calls == {"send-0": 2, "send-1": 2, "send-2": 2, "other": 2}
    run = await gnl.get_run(storage, "r-1")
    assert run is not None and run.state == "done"
    assert [(s.name, s.n, s.position, s.result) for s in run.steps] == [
        ("send", 0, 0, "send-0"),
        ("send", 1, 1, "send-1"),
        ("send", 2, 2, "send-2"),
        ("other", 0, 3, "other"),
    ]


async def test_a_finished_run_is_read_back(storage: gnl.Storage) -> None:
    runs = 0

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        nonlocal runs
        runs += 1
        return {"got": input, "n": await ctx.step("s", lambda: 5)}

    g = gnl.create_gnl(storage, {"wf": wf})
    first = await g.run_workflow("wf", run_id="r", input={"x": [1, 2]}, scheduled_for=17)
    again = await g.run_workflow("wf", run_id="r", input={"ignored": True})
    assert first == again == {"got": {"x": [1, 2]}, "n": 5}
    assert runs == 1
    info = await gnl.get_run(storage, "r")
    assert info is not None
    assert (info.state, info.input, info.result, info.scheduled_for) == (
        "done",
        {"x": [1, 2]},
        first,
        17,
    )


async def test_an_executor_whose_lease_lapsed_and_its_successor_converge_on_the_first_result(
    storage: gnl.Storage,
) -> None:
    # Executions overlap only when the first one's lease lapsed while it was still going (a
    # stalled process): the successor takes the run over, and the step that the stalled one
    # records first is the one both go on with.
    native = storage._native
    await _native.run_start(native, "r", "wf", None, None, None, "stalled:1:x", 3)
    await asyncio.sleep(0.05)  # its 3 ms lease lapsed; it is still "running" its step
    in_body = asyncio.Event()
    stalled_wrote = asyncio.Event()
    effects: list[str] = []

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        async def body() -> str:
            effects.append("b")
            in_body.set()
            await stalled_wrote.wait()  # the stalled execution records its result first
            return "b"

        first = await ctx.step("pick", body)
        return [first, await ctx.step("after", lambda: f"{first}-after")]

    g = gnl.create_gnl(storage, {"wf": wf})
    run = asyncio.create_task(g.run_workflow("wf", run_id="r"))
    await in_body.wait()
    assert await _native.step_put(native, "r", "pick", 0, 0, "stalled") is None  # recorded
    stalled_wrote.set()
    assert await run == ["stalled", "stalled-after"]
    assert effects == ["b"]  # a plain step's body: at least once
    got = await gnl.get_run(storage, "r")
    assert got is not None and got.result == ["stalled", "stalled-after"]
    assert [s.result for s in got.steps] == ["stalled", "stalled-after"]


async def test_a_second_executor_of_a_live_run_is_refused_and_runs_nothing(
    storage: gnl.Storage,
) -> None:
    # Two run_workflow calls of one run (two processes, or a scheduler's fire retry beside the
    # waker's resume): the second is refused while the first one's lease is live, so no later
    # step's side effect happens twice.
    other = await gnl.connect(storage.url)
    calls, effect = tally()
    wf, inside, go_on = gated(effect)
    try:
        g = gnl.create_gnl(storage, {"wf": wf})
        first = asyncio.create_task(g.run_workflow("wf", run_id="r"))
        await inside.wait()
        second = gnl.create_gnl(other, {"wf": wf})
        with pytest.raises(gnl.RunBusyError) as busy:
            await second.run_workflow("wf", run_id="r")
        assert busy.value.at_lock_acquisition is True
        assert "being executed elsewhere" in str(busy.value)
        go_on.set()
        assert await first == "b"
        assert calls == {"a": 1, "b": 1}
        # Once it is done, the second executor reads the result back.
        assert await second.run_workflow("wf", run_id="r") == "b"
        assert calls == {"a": 1, "b": 1}
    finally:
        await other.close()


async def test_an_execution_whose_run_was_taken_over_stops_before_its_next_step(
    storage: gnl.Storage,
) -> None:
    # An execution that lost its lease (a stalled process whose run another execution took
    # over) starts no further step: its renewal is refused (owner-fenced) and its signal aborts
    # with lease-lost; nothing is written over the new holder's run.
    calls, effect = tally()
    wf, inside, go_on = gated(effect)
    g = gnl.create_gnl(storage, {"wf": wf}, lease_ms=300)
    run = asyncio.create_task(g.run_workflow("wf", run_id="r"))
    await inside.wait()
    native = storage._native
    assert await _native.run_fail(native, "r", "taken over")
    await _native.run_start(native, "r", "wf", None, None, None, "thief", 60_000)
    await asyncio.sleep(0.4)  # a renewal (every 100 ms) answers that the lease is not ours
    go_on.set()
    with pytest.raises(gnl.ExecutionRevokedError) as revoked:
        await run
    assert revoked.value.why == "lease-lost"
    assert calls == {"a": 1}, "step b was not started"
    got = await gnl.get_run(storage, "r")
    assert got is not None and (got.state, got.lease_owner) == ("running", "thief")


async def test_a_run_the_waker_resumes_refuses_another_executor(storage: gnl.Storage) -> None:
    calls, effect = tally()
    wf, inside, go_on = gated(effect)
    g = gnl.create_gnl(storage, {"wf": wf})
    native = storage._native
    await _native.run_start(native, "r", "wf", None, None, None, "dead:1:x", 3)  # died
    await asyncio.sleep(0.05)
    tick = asyncio.create_task(gnl.create_workflow_waker(g).tick())
    await inside.wait()
    with pytest.raises(gnl.RunBusyError):
        await g.run_workflow("wf", run_id="r")
    go_on.set()
    assert await tick == 1
    assert calls == {"a": 1, "b": 1}
    assert await g.run_workflow("wf", run_id="r") == "b"


async def test_a_raising_step_records_nothing_and_runs_again(storage: gnl.Storage) -> None:
    calls, effect = tally()
    fail = [True]

    def flaky() -> str:
        calls["flaky"] = calls.get("flaky", 0) + 1
        if fail[0]:
            raise RuntimeError("card declined")
        return "charged"

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        before = await ctx.step("before", effect, "before")
        return [before, await ctx.step("charge", flaky)]

    g = gnl.create_gnl(storage, {"wf": wf})
    with pytest.raises(RuntimeError, match="card declined"):
        await g.run_workflow("wf", run_id="r")
    run = await gnl.get_run(storage, "r")
    assert run is not None
    assert run.state == "failed" and "card declined" in (run.error or "")
    assert [s.name for s in run.steps] == ["before"]
    fail[0] = False
    assert await g.run_workflow("wf", run_id="r") == ["before", "charged"]
    assert calls == {"before": 1, "flaky": 2}


async def test_a_non_json_result_is_a_type_error_and_records_nothing(
    storage: gnl.Storage,
) -> None:
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return await ctx.step("bad", lambda: {1, 2})

    async def bad_return(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return object()

    g = gnl.create_gnl(storage, {"wf": wf, "ret": bad_return})
    with pytest.raises(TypeError):
        await g.run_workflow("wf", run_id="r")
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.steps == () and run.state == "failed"
    with pytest.raises(TypeError):
        await g.run_workflow("ret", run_id="r2")
    run = await gnl.get_run(storage, "r2")
    assert run is not None and run.state == "failed" and run.result is None


async def test_bad_input_is_refused_with_nothing_written(storage: gnl.Storage) -> None:
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        raise AssertionError("never runs")

    g = gnl.create_gnl(storage, {"wf": wf, "other": wf})
    with pytest.raises(gnl.InvalidArgumentError, match=r"unknown workflow 'nope'.*'other', 'wf'"):
        await g.run_workflow("nope", run_id="r")
    with pytest.raises(gnl.InvalidArgumentError, match="run_id"):
        await g.run_workflow("wf", run_id="")
    with pytest.raises(TypeError, match="run_id"):
        await g.run_workflow("wf", run_id=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await g.run_workflow("wf", run_id="r", input={"s": {1}})
    with pytest.raises(ValueError):
        await g.run_workflow("wf", run_id="r", input=float("nan"))
    with pytest.raises(gnl.InvalidArgumentError, match="preset"):
        await g.run_workflow("wf", run_id="r", preset="fast")
    with pytest.raises(gnl.InvalidArgumentError, match="naive"):
        import datetime

        await g.run_workflow("wf", run_id="r", scheduled_for=datetime.datetime(2026, 1, 1))
    with pytest.raises(gnl.InvalidArgumentError, match="preset"):
        gnl.create_gnl(storage, {"wf": wf}, preset="fast")
    with pytest.raises(TypeError):
        gnl.create_gnl(storage, {"wf": 3})  # type: ignore[dict-item]
    assert await gnl.list_runs(storage) == []
    with pytest.raises(gnl.InvalidArgumentError, match="^key must be a non-empty string"):
        await gnl.claim(storage, "", 1)
    with pytest.raises(gnl.InvalidArgumentError, match="state"):
        await gnl.list_runs(storage, state="sleeping")


async def test_a_run_of_another_workflow_is_refused(storage: gnl.Storage) -> None:
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return 1

    g = gnl.create_gnl(storage, {"a": wf, "b": wf})
    await g.run_workflow("a", run_id="r")
    with pytest.raises(gnl.InvalidArgumentError, match='workflow "a", not "b"'):
        await g.run_workflow("b", run_id="r")


async def test_critical_runs_refuse_a_second_executor(storage: gnl.Storage) -> None:
    inside = asyncio.Event()
    release = asyncio.Event()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        inside.set()
        await release.wait()
        return await ctx.step("s", lambda: "once")

    g = gnl.create_gnl(storage, {"wf": wf}, preset="critical", lease_ms=600)
    first = asyncio.create_task(g.run_workflow("wf", run_id="r"))
    await inside.wait()
    await asyncio.sleep(0.5)  # past a renewal: the lock is renewed, not expired
    with pytest.raises(gnl.RunBusyError) as busy:
        await g.run_workflow("wf", run_id="r")
    assert busy.value.at_lock_acquisition is True

    # Another run id is not locked; <run_id>:fire is another key.
    async def ok(ctx: gnl.WorkflowContext, input: Any) -> str:
        return "ok"

    plain = gnl.create_gnl(storage, {"wf": ok})
    assert await plain.run_workflow("wf", run_id="r:fire", preset="critical") == "ok"
    release.set()
    assert await first == "once"
    # Released at the end: the next execution reads the result back.
    assert await g.run_workflow("wf", run_id="r") == "once"


async def test_an_aborted_signal_stops_at_the_next_step_and_the_run_resumes(
    storage: gnl.Storage,
) -> None:
    calls, effect = tally()
    signal = gnl.RevocationSignal()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        a = await ctx.step("a", effect, "a")
        if ctx.signal is signal:
            signal.abort("canceled")
        return [a, await ctx.step("b", effect, "b")]

    g = gnl.create_gnl(storage, {"wf": wf})
    with pytest.raises(gnl.ExecutionRevokedError) as revoked:
        await g.run_workflow("wf", run_id="r", signal=signal)
    assert revoked.value is signal.reason
    run = await gnl.get_run(storage, "r")
    assert run is not None and [s.name for s in run.steps] == ["a"]
    assert await g.run_workflow("wf", run_id="r") == ["a", "b"]
    assert calls == {"a": 1, "b": 1}


async def test_a_run_stopped_by_shutdown_is_left_to_the_waker(storage: gnl.Storage) -> None:
    # gnl run's shutdown aborts its runs' signals with why="shutdown": the run stops at its
    # next step boundary and is suspended, due at once, so the waker (the next process's)
    # resumes it; a run stopped by any other abort is failed until someone runs it again.
    calls, effect = tally()
    signal = gnl.RevocationSignal()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        a = await ctx.step("a", effect, "a")
        if ctx.signal is signal:
            signal.abort("shutdown", "shutdown: the process is stopping")
        return [a, await ctx.step("b", effect, "b")]

    g = gnl.create_gnl(storage, {"wf": wf})
    before = await storage.now_ms()
    with pytest.raises(gnl.ExecutionRevokedError) as revoked:
        await g.run_workflow("wf", run_id="r", signal=signal)
    assert revoked.value.why == "shutdown"
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.state == "suspended" and run.error is None
    assert run.wake_at is not None and before <= run.wake_at <= await storage.now_ms()
    assert run.lease_owner is None
    assert await gnl.create_workflow_waker(g).tick() == 1
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.state == "done" and run.result == ["a", "b"]
    assert calls == {"a": 1, "b": 1}


async def test_a_run_cancelled_after_a_shutdown_abort_is_left_to_the_waker(
    storage: gnl.Storage,
) -> None:
    # A step that ignores the shutdown abort is cancelled past gnl run's second grace: the run
    # is suspended, due at once, not left under the exiting process's lease.
    calls, effect = tally()
    inside = asyncio.Event()
    signal = gnl.RevocationSignal()

    async def stubborn() -> str:
        inside.set()
        await asyncio.Event().wait()  # ignores the signal
        return "never"

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        if ctx.signal is signal:
            await ctx.step("slow", stubborn)
        return [await ctx.step("slow", effect, "slow"), await ctx.step("b", effect, "b")]

    g = gnl.create_gnl(storage, {"wf": wf})
    task = asyncio.create_task(g.run_workflow("wf", run_id="r", signal=signal))
    await inside.wait()
    signal.abort("shutdown", "shutdown: the process is stopping")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.state == "suspended" and run.lease_owner is None
    assert await gnl.create_workflow_waker(g).tick() == 1
    assert calls == {"slow": 1, "b": 1}


async def test_a_failed_run_resumes_when_handed_to_the_waker(storage: gnl.Storage) -> None:
    calls, effect = tally()
    broken = True

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        a = await ctx.step("a", effect, "a")
        if broken:
            raise RuntimeError("the service was down")
        return [a, await ctx.step("b", effect, "b")]

    g = gnl.create_gnl(storage, {"wf": wf})
    with pytest.raises(RuntimeError):
        await g.run_workflow("wf", run_id="r")
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.state == "failed" and "service was down" in (run.error or "")
    waker = gnl.create_workflow_waker(g)
    assert await waker.tick() == 0  # a failed run is not run again by itself
    broken = False
    assert await gnl.resume_run(storage, "r") is True
    assert await gnl.resume_run(storage, "r") is False  # suspended now, not failed
    assert await gnl.resume_run(storage, "nope") is False
    run = await gnl.get_run(storage, "r")
    assert run is not None and (run.state, run.error) == ("suspended", None)
    assert await waker.tick() == 1
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.state == "done" and run.result == ["a", "b"]
    assert calls == {"a": 1, "b": 1}
    assert await gnl.resume_run(storage, "r") is False  # done
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.resume_run(storage, "")
    with pytest.raises(TypeError):
        await gnl.resume_run(storage, 7)  # type: ignore[arg-type]


async def test_sleep_suspends_and_the_waker_resumes_once(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    calls, effect = tally()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        before = await ctx.step("before", effect, "before")
        await ctx.sleep(400)
        return [before, await ctx.step("after", effect, "after")]

    g = gnl.create_gnl(storage, {"wf": wf})
    t0 = await storage.now_ms()
    got = await g.run_workflow("wf", run_id="r")
    assert isinstance(got, gnl.RunSuspended)
    assert t0 + 400 <= got.wake_at <= t0 + 400 + 5_000
    run = await gnl.get_run(storage, "r")
    assert run is not None and (run.state, run.wake_at) == ("suspended", got.wake_at)
    # Resumed early: suspends again at the same wake-up, earlier steps not run again.
    assert await g.run_workflow("wf", run_id="r") == got
    waker = gnl.create_workflow_waker(g, interval_ms=50)
    assert await waker.tick() == 0
    await asyncio.sleep(max(0, got.wake_at - await storage.now_ms()) / 1000 + 0.02)
    with caplog.at_level(logging.INFO, logger="gnl"):
        assert await waker.tick() == 1
    assert not [m for m in caplog.messages if "lease" in m], caplog.messages
    assert await waker.tick() == 0
    assert calls == {"before": 1, "after": 1}
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.state == "done" and run.result == ["before", "after"]
    assert await g.run_workflow("wf", run_id="r") == ["before", "after"]


async def test_a_sleep_in_this_process_is_resumed_when_it_ends_not_at_the_next_tick(
    storage: gnl.Storage,
) -> None:
    # The waker ticks every 5 s by default; a run suspended by this process wakes the
    # process's waker when its sleep ends (before, up to a whole interval late). A run
    # suspended by another process is left to the tick.
    resumed: list[float] = []

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> str:
        await ctx.sleep(input)
        resumed.append(time.monotonic())
        return "woke"

    g = gnl.create_gnl(storage, {"wf": wf})
    waker = gnl.create_workflow_waker(g, interval_ms=5_000)
    # One suspended before the waker starts, one after.
    t0 = time.monotonic()
    assert isinstance(await g.run_workflow("wf", run_id="a", input=300), gnl.RunSuspended)
    waker.start()
    try:
        await asyncio.sleep(0.05)  # its first tick found nothing due: it sleeps 5 s
        assert isinstance(await g.run_workflow("wf", run_id="b", input=1_500), gnl.RunSuspended)
        await wait_for(lambda: len(resumed) == 2, timeout=4, what="both runs to resume")
        # (Not at b's wake-up either: a waker started after a's sleep began knows of it.)
        assert 0.3 <= resumed[0] - t0 < 1.2, resumed[0] - t0
        assert 1.5 <= resumed[1] - t0 < 2.8, resumed[1] - t0
        for run_id in ("a", "b"):
            run = await gnl.get_run(storage, run_id)
            assert run is not None and (run.state, run.result) == ("done", "woke")
        # Another process's suspended run: found by a tick, as before.
        other = await gnl.connect(storage.url)
        try:
            g2 = gnl.create_gnl(other, {"wf": wf})
            assert isinstance(await g2.run_workflow("wf", run_id="c", input=100), gnl.RunSuspended)
        finally:
            await other.close()
        await asyncio.sleep(0.5)
        run = await gnl.get_run(storage, "c")
        assert run is not None and run.state == "suspended"
    finally:
        await waker.stop()


async def test_the_waker_loop_resumes_runs_and_two_wakers_resume_each_once(
    storage: gnl.Storage,
) -> None:
    other = await gnl.connect(storage.url)
    calls, effect = tally()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.sleep(200)
        return await ctx.step("after", effect, ctx.run_id)

    try:
        g1 = gnl.create_gnl(storage, {"wf": wf})
        g2 = gnl.create_gnl(other, {"wf": wf})
        for i in range(12):
            assert isinstance(await g1.run_workflow("wf", run_id=f"r{i}"), gnl.RunSuspended)
        w1 = gnl.create_workflow_waker(g1, interval_ms=30, batch=5)
        w2 = gnl.create_workflow_waker(g2, interval_ms=30, batch=5)
        w1.start()
        w2.start()
        for _ in range(200):
            if len(await gnl.list_runs(storage, state="done")) == 12:
                break
            await asyncio.sleep(0.05)
        await w1.stop()
        await w2.stop()
        assert calls == {f"r{i}": 1 for i in range(12)}
    finally:
        await other.close()


async def test_the_waker_loop_resumes_a_run_while_another_one_is_in_a_long_step(
    storage: gnl.Storage,
) -> None:
    # Each resumed run is a task of its own: a run in an hour-long step holds up no other
    # wake-up (the loop awaited its runs, so the second waited for the first to end).
    gate = asyncio.Event()
    done: list[str] = []

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.sleep(input["sleep_ms"])
        if input["long"]:
            await gate.wait()
        done.append(ctx.run_id)
        return ctx.run_id

    g = gnl.create_gnl(storage, {"wf": wf})
    got = await g.run_workflow("wf", run_id="long", input={"sleep_ms": 100, "long": True})
    assert isinstance(got, gnl.RunSuspended)
    waker = gnl.create_workflow_waker(g, interval_ms=20, batch=2)
    waker.start()
    try:
        for _ in range(200):
            run = await gnl.get_run(storage, "long")
            if run is not None and run.state == "running":
                break
            await asyncio.sleep(0.02)
        assert run is not None and run.state == "running"  # resumed, in its long step
        await g.run_workflow("wf", run_id="quick", input={"sleep_ms": 50, "long": False})
        for _ in range(200):
            if done:
                break
            await asyncio.sleep(0.02)
        assert done == ["quick"], "the quick run waited for the long one"
        gate.set()
    finally:
        gate.set()
        await waker.stop()  # waits for the runs it resumes
    assert done == ["quick", "long"]
    run = await gnl.get_run(storage, "long")
    assert run is not None and run.state == "done"


async def test_a_run_whose_process_died_is_resumed_by_the_waker(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    calls, effect = tally()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return [await ctx.step("a", effect, "a"), await ctx.step("b", effect, "b")]

    g = gnl.create_gnl(storage, {"wf": wf})
    native = storage._native
    # A process started the run, recorded step a, and died: its 3 ms lease lapses.
    await _native.run_start(native, "r", "wf", None, None, None, "dead:1:x", 3)
    await _native.step_put(native, "r", "a", 0, 0, "a-from-the-dead")
    await asyncio.sleep(0.05)
    stuck = await gnl.list_runs(storage, state="running")
    assert [r.run_id for r in stuck] == ["r"]
    waker = gnl.create_workflow_waker(g)
    with caplog.at_level(logging.WARNING, logger="gnl"):
        assert await waker.tick() == 1
    assert calls == {"b": 1}
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.result == ["a-from-the-dead", "b"]
    # Said once, as a take-over (a sleep's wake-up is not logged).
    assert [m for m in caplog.messages if "'r'" in m] == [
        "gnl waker: run 'r' (workflow 'wf') was running under a lease that expired (the process "
        "executing it died or stalled); resuming it from its recorded steps"
    ]
    # A live run (renewed lease) is not the waker's.
    g_live = gnl.create_gnl(storage, {"wf": wf}, lease_ms=300)
    gate = asyncio.Event()

    async def slow(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await gate.wait()
        return 1

    g_live = gnl.create_gnl(storage, {"slow": slow}, lease_ms=300)
    live = asyncio.create_task(g_live.run_workflow("slow", run_id="live"))
    await asyncio.sleep(0.8)
    assert await gnl.create_workflow_waker(g_live).tick() == 0
    gate.set()
    assert await live == 1


async def test_a_run_that_no_longer_matches_its_journal_fails_naming_the_step(
    storage: gnl.Storage,
) -> None:
    calls, effect = tally()

    async def v1(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.step("reserve", effect, "reserve")
        raise RuntimeError("crash after reserve")

    async def v2(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.step("validate", effect, "validate")
        return await ctx.step("reserve", effect, "reserve")

    with pytest.raises(RuntimeError):
        await gnl.create_gnl(storage, {"wf": v1}).run_workflow("wf", run_id="r")
    with pytest.raises(gnl.GnlError, match=r"step 0 is recorded as 'reserve'.*'validate'"):
        await gnl.create_gnl(storage, {"wf": v2}).run_workflow("wf", run_id="r")
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.state == "failed" and "validate" in (run.error or "")
    assert calls == {"reserve": 1}


async def test_at_most_once_never_calls_fn_after_an_unfinished_intent(
    storage: gnl.Storage,
) -> None:
    calls, effect = tally()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        paid = await ctx.step("pay", effect, "pay", {"receipt": 1}, at_most_once=True)
        return [paid, await ctx.step("mail", effect, "mail")]

    g = gnl.create_gnl(storage, {"wf": wf})
    assert await g.run_workflow("wf", run_id="ok") == [{"receipt": 1}, "mail"]
    assert calls == {"pay": 1, "mail": 1}
    # An execution recorded the intent and died before the result.
    native = storage._native
    await _native.run_start(native, "r", "wf", None, None, None, "dead:1:x", None)
    await _native.step_intent(native, "r", "pay", 0, 0, 99)
    for _ in range(2):
        with pytest.raises(gnl.StepOutcomeUnknownError) as unknown:
            await g.run_workflow("wf", run_id="r")
        e = unknown.value
        assert (e.run_id, e.step, e.n) == ("r", "pay", 0)
        assert e.started_at > 0
        when = datetime.fromtimestamp(e.started_at / 1000, timezone.utc)
        assert f"was started at {when.isoformat(timespec='milliseconds')} by" in str(e)
        assert isinstance(e, gnl.GnlError)
    assert calls == {"pay": 1, "mail": 1}
    run = await gnl.get_run(storage, "r")
    assert run is not None and run.steps[0].state == "intent"
    # The operator knows the payment went through: its result is recorded.
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.resolve_step(storage, "r", "pay")
    assert await gnl.resolve_step(storage, "r", "pay", value={"receipt": "manual"})
    assert not await gnl.resolve_step(storage, "r", "pay", value=1)
    assert await g.run_workflow("wf", run_id="r") == [{"receipt": "manual"}, "mail"]
    assert calls == {"pay": 1, "mail": 2}
    # ... or that it did not: the step runs again.
    await _native.run_start(native, "r2", "wf", None, None, None, "dead:1:x", None)
    await _native.step_intent(native, "r2", "pay", 0, 0, 98)
    assert await gnl.resolve_step(storage, "r2", "pay", retry=True)
    assert await g.run_workflow("wf", run_id="r2") == [{"receipt": 1}, "mail"]
    assert calls == {"pay": 2, "mail": 3}


async def test_an_intent_is_not_resolved_while_its_run_is_live(storage: gnl.Storage) -> None:
    # The execution that recorded the intent may still record the step's own result: an
    # operator's value would be taken over it.
    native = storage._native
    await _native.run_start(native, "live", "wf", None, None, None, "alive", 60_000)
    await _native.step_intent(native, "live", "pay", 0, 0, 1)
    with pytest.raises(gnl.RunBusyError, match="resolve its step once that execution has ended"):
        await gnl.resolve_step(storage, "live", "pay", value="fake")
    run = await gnl.get_run(storage, "live")
    assert run is not None and [s.state for s in run.steps] == ["intent"]
    # Once its lease lapsed (the process died), the operator resolves it.
    await _native.run_start(native, "dead", "wf", None, None, None, "gone", 3)
    await _native.step_intent(native, "dead", "pay", 0, 0, 1)
    await asyncio.sleep(0.05)
    assert await gnl.resolve_step(storage, "dead", "pay", value="paid") is True


async def test_every_run_busy_message_has_one_form(storage: gnl.Storage) -> None:
    # A live lease (the native core's refusal) said `run "r" ... (by alive, whose lease is
    # live); nothing ran`, a held run lock (Python's) `run 'r' ... (its run lock is held)`.
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> str:
        return "ran"

    native = storage._native
    g = gnl.create_gnl(storage, {"wf": wf})
    await _native.run_start(native, "r", "wf", None, None, None, "alive", 60_000)
    await _native.step_intent(native, "r", "pay", 0, 0, 1)
    assert await _native.lock_acquire(native, "locked", "holder", 60_000) is not None
    said = []
    for busy in (
        g.run_workflow("wf", run_id="r"),
        g.run_workflow("wf", run_id="locked", preset="critical"),
        gnl.resolve_step(storage, "r", "pay", value="fake"),
    ):
        with pytest.raises(gnl.RunBusyError) as e:
            await busy
        assert e.value.at_lock_acquisition is True
        said.append(str(e.value))
    assert said == [
        "run 'r' is being executed elsewhere (by alive, whose lease is live); nothing ran",
        "run 'locked' is being executed elsewhere (its run lock is held by another execution);"
        " nothing ran",
        "run 'r' is being executed elsewhere (by alive, whose lease is live): resolve its step"
        " once that execution has ended; nothing changed",
    ]


async def test_an_at_most_once_step_that_raises_records_nothing(storage: gnl.Storage) -> None:
    attempts = [0]

    def pay() -> str:
        attempts[0] += 1
        if attempts[0] == 1:
            raise ConnectionError("gateway down: nothing charged")
        return "paid"

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return await ctx.step("pay", pay, at_most_once=True)

    async def bad(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return await ctx.step("pay", lambda: {1}, at_most_once=True)

    g = gnl.create_gnl(storage, {"wf": wf, "bad": bad})
    with pytest.raises(ConnectionError):
        await g.run_workflow("wf", run_id="r")
    assert await g.run_workflow("wf", run_id="r") == "paid"
    with pytest.raises(TypeError):
        await g.run_workflow("bad", run_id="b")
    run = await gnl.get_run(storage, "b")
    assert run is not None and run.steps == ()


async def test_claim_keeps_the_first_value(storage: gnl.Storage) -> None:
    assert await gnl.claim(storage, "k", {"v": 1}) == {"v": 1}
    assert await gnl.claim(storage.journal, "k", {"v": 2}) == {"v": 1}
    winners = await asyncio.gather(*(gnl.claim(storage, "race", i) for i in range(10)))
    assert len(set(winners)) == 1
    with pytest.raises(TypeError):
        await gnl.claim(storage, "x", {1})
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.claim(storage, "", 1)


async def test_listing_runs(storage: gnl.Storage) -> None:
    async def done(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return input

    async def sleepy(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.sleep(60_000)

    g = gnl.create_gnl(storage, {"done": done, "sleepy": sleepy})
    await g.run_workflow("done", run_id="a", input=1)
    await asyncio.sleep(0.005)
    await g.run_workflow("sleepy", run_id="b")
    assert [r.run_id for r in await gnl.list_runs(storage)] == ["b", "a"]
    assert [r.run_id for r in await gnl.list_runs(storage, state="suspended")] == ["b"]
    assert [r.run_id for r in await gnl.list_runs(storage, workflow="done")] == ["a"]
    assert [r.run_id for r in await gnl.list_runs(storage, limit=1)] == ["b"]
    assert await gnl.get_run(storage, "nope") is None
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.list_runs(storage, limit=0)


async def test_ctx_run_in_a_job_repeats_no_completed_step(storage: gnl.Storage) -> None:
    calls, effect = tally()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        a = await ctx.step("a", effect, "a")
        if calls.get("attempt-1-failed") is None:
            calls["attempt-1-failed"] = 1
            raise RuntimeError("first attempt dies after a")
        return [input, a, await ctx.step("b", effect, "b")]

    async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
        pre = await ctx.step("pre", effect, "pre")
        return [pre, await ctx.run(wf, payload)]

    async def sleeper(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.sleep(10)

    async def sleeps(payload: Any, ctx: gnl.JobContext) -> Any:
        try:
            await ctx.run(sleeper)
        except gnl.InvalidArgumentError as e:
            return str(e)

    await gnl.enqueue(storage, "t", {"in": 1}, id="j")
    await gnl.enqueue(storage, "s", None, id="s")
    worker = gnl.create_worker(storage, {"t": handler, "s": sleeps}, retry_delay_ms=0)
    await worker.drain()
    job = await gnl.get_job(storage, "j")
    assert job is not None and job.state == "done", job
    assert job.result == ["pre", [{"in": 1}, "a", "b"]]
    assert calls == {"pre": 1, "a": 1, "attempt-1-failed": 1, "b": 1}
    slept = await gnl.get_job(storage, "s")
    assert slept is not None and "ctx.sleep" in slept.result


async def test_a_jobs_failed_run_is_not_handed_to_the_waker(storage: gnl.Storage) -> None:
    # No waker serves a job's run (its workflow is the handler's function): it resumes with
    # the job's retry, and resume_run says so instead of leaving it suspended for nobody.
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        raise RuntimeError("down")

    async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
        return await ctx.run(wf)

    await gnl.enqueue(storage, "t", None, id="j:1", org_id="acme:eu")
    await gnl.create_worker(storage, {"t": handler}, max_attempts=1).drain()
    (run,) = await gnl.list_runs(storage, state="failed")
    with pytest.raises(gnl.InvalidArgumentError, match="resumes when the job is retried"):
        await gnl.resume_run(storage, run.run_id)
    got = await gnl.get_run(storage, run.run_id)
    assert got is not None and got.state == "failed"


def test_gnl_runs_list_show_resolve(store_url: Any) -> None:
    import json
    import subprocess
    import sys

    url = store_url()

    async def setup() -> None:
        async with await gnl.connect(url) as st:

            async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
                return await ctx.step("pay", lambda: 1, at_most_once=True)

            await gnl.create_gnl(st, {"wf": wf}).run_workflow("wf", run_id="ok")
            await _native.run_start(st._native, "stuck", "wf", None, None, None, "dead", None)
            await _native.step_intent(st._native, "stuck", "pay", 0, 0, 5)

    asyncio.run(setup())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gnl", "runs", *args, "--url", url],
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = [json.loads(line) for line in cli("list", "--json").stdout.splitlines()]
    assert sorted((r["run_id"], r["state"]) for r in listed) == [
        ("ok", "done"),
        ("stuck", "running"),
    ]
    shown = json.loads(cli("show", "stuck", "--json").stdout)
    assert [(s["name"], s["state"]) for s in shown["steps"]] == [("pay", "intent")]
    assert "pay" in cli("show", "stuck").stdout
    assert cli("show", "nope").returncode == 1
    assert cli("resolve", "stuck", "pay").returncode == 2  # neither --value nor --retry
    done = cli("resolve", "stuck", "pay", "--value", '{"paid": true}')
    assert done.returncode == 0, done.stderr
    assert cli("resolve", "stuck", "pay", "--retry").returncode == 1  # nothing left to resolve
    shown = json.loads(cli("show", "stuck", "--json").stdout)
    assert shown["steps"][0]["result"] == {"paid": True}
    # The run failed: `runs resume` hands it to the waker; a run that is not failed is not.
    assert "gnl runs resume stuck" in done.stdout
    assert cli("resume", "stuck").returncode == 1  # running, not failed

    async def fail() -> None:
        async with await gnl.connect(url) as st:
            assert await _native.run_fail(st._native, "stuck", "StepOutcomeUnknownError: pay")

    asyncio.run(fail())
    resumed = cli("resume", "stuck", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"run_id": "stuck", "state": "suspended"}
    shown = json.loads(cli("show", "stuck", "--json").stdout)
    assert (shown["state"], shown["error"]) == ("suspended", None)
    again = cli("resume", "stuck")
    assert again.returncode == 1 and "is suspended, not failed" in again.stderr
    assert "no run 'nope'" in cli("resume", "nope").stderr


async def test_a_critical_run_whose_lock_is_taken_stops_with_lease_lost(
    storage: gnl.Storage,
) -> None:
    calls, effect = tally()
    inside = asyncio.Event()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.step("a", effect, "a")
        inside.set()
        await ctx.signal.wait()
        return await ctx.step("b", effect, "b")

    g = gnl.create_gnl(storage, {"wf": wf}, preset="critical", lease_ms=300)
    run = asyncio.create_task(g.run_workflow("wf", run_id="r"))
    await inside.wait()
    # The lock is taken from under the run (its first token is 1): the next renewal answers
    # that it is not this execution's any more.
    native = storage._native
    assert await _native.lock_release(native, "r", 1)
    assert await _native.lock_acquire(native, "r", "thief", 60_000) == 2
    with pytest.raises(gnl.ExecutionRevokedError) as revoked:
        await asyncio.wait_for(run, 10)
    assert revoked.value.why == "lease-lost"
    assert calls == {"a": 1}
    # Nothing was written over the run (another execution may hold it): still running, and
    # the waker's once its lease lapses.
    got = await gnl.get_run(storage, "r")
    assert got is not None and got.state == "running" and got.error is None


async def hold_write_lock(storage: gnl.Storage, seconds: float) -> asyncio.subprocess.Process:
    """Another process holding the SQLite file's write lock for ``seconds``, once it holds it
    (in this process the stdlib's own SQLite would share the process's POSIX locks with gnl's,
    and not block it)."""
    import sys

    path = storage.url.removeprefix("sqlite:///")
    blocker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2])); c.execute('COMMIT')",
        path,
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )
    assert blocker.stdout is not None and await blocker.stdout.readline() == b"held\n"
    return blocker


async def test_sqlite_steps_wait_for_another_writer(storage: gnl.Storage, backend: str) -> None:
    if backend != "sqlite":
        pytest.skip("SQLite's fast path")
    blocker = await hold_write_lock(storage, 1.0)

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return [await ctx.step("s", lambda i=i: i) for i in range(3)]

    g = gnl.create_gnl(storage, {"wf": wf})
    run = asyncio.create_task(g.run_workflow("wf", run_id="r"))
    await asyncio.sleep(0.4)
    assert not run.done()
    assert await asyncio.wait_for(run, 30) == [0, 1, 2]
    assert await asyncio.wait_for(blocker.wait(), 10) == 0


async def test_sqlite_a_run_finishes_and_releases_its_lock_after_another_writer(
    storage: gnl.Storage, backend: str
) -> None:
    # A critical run started on SQLite's fast path ends while another process holds the
    # file's write lock: its finish and its lock's release wait for it on the async path
    # (the event loop runs meanwhile), and the run is done, its lock free. A finished run's
    # result is then read back even while another writer holds the lock.
    if backend != "sqlite":
        pytest.skip("SQLite's fast path")
    reached, go = asyncio.Event(), asyncio.Event()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        a = await ctx.step("a", lambda: 1)
        reached.set()
        await go.wait()
        return {"a": a}

    g = gnl.create_gnl(storage, {"wf": wf}, preset="critical")
    run = asyncio.create_task(g.run_workflow("wf", run_id="r"))
    await asyncio.wait_for(reached.wait(), 30)
    blocker = await hold_write_lock(storage, 1.0)
    go.set()
    await asyncio.sleep(0.4)
    assert not run.done()
    assert await asyncio.wait_for(run, 30) == {"a": 1}
    assert await asyncio.wait_for(blocker.wait(), 10) == 0
    info = await gnl.get_run(storage, "r")
    assert info is not None and (info.state, info.result) == ("done", {"a": 1})
    native = storage._native
    assert await _native.lock_acquire(native, "r", "next", 60_000) is not None, "lock released"
    blocker = await hold_write_lock(storage, 1.0)
    plain = gnl.create_gnl(storage, {"wf": wf})
    assert await asyncio.wait_for(plain.run_workflow("wf", run_id="r"), 30) == {"a": 1}
    assert await asyncio.wait_for(blocker.wait(), 10) == 0


async def test_a_resume_replays_recorded_results_as_they_were(storage: gnl.Storage) -> None:
    # The replay serves each recorded result decoded (nulls, nested values, unicode), in
    # order, without calling the step again; the first new step after them runs.
    calls, effect = tally()
    values: list[Any] = [None, 0, "ünï", [1, {"a": None}], {"k": [True, 1.5]}, 2**53]
    crash = [True]

    def value(tag: str, v: Any) -> Any:
        effect(tag)
        return v

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        got = [await ctx.step("v", value, f"v{i}", v) for i, v in enumerate(values)]
        if crash[0]:
            crash[0] = False
            raise RuntimeError("dies after the recorded steps")
        return [got, await ctx.step("after", effect, "after")]

    g = gnl.create_gnl(storage, {"wf": wf})
    with pytest.raises(RuntimeError):
        await g.run_workflow("wf", run_id="r")
    assert await g.run_workflow("wf", run_id="r") == [values, "after"]
    assert calls == {**{f"v{i}": 1 for i in range(len(values))}, "after": 1}


async def test_a_run_whose_code_changed_fails_loudly_at_the_step_that_differs(
    storage: gnl.Storage,
) -> None:
    # Recorded a, b; the code now calls a, c: the replay passes a and fails at c naming both,
    # without calling c (a run is never silently re-aimed at other side effects).
    calls, effect = tally()
    second = ["b"]

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.step("a", effect, "a")
        await ctx.step(second[0], effect, second[0])
        if second[0] == "b":
            raise RuntimeError("dies after b")
        return "done"

    g = gnl.create_gnl(storage, {"wf": wf})
    with pytest.raises(RuntimeError):
        await g.run_workflow("wf", run_id="r")
    second[0] = "c"
    with pytest.raises(gnl.GnlError, match=r"step 1 is recorded as 'b'.*now calls 'c'"):
        await g.run_workflow("wf", run_id="r")
    assert calls == {"a": 1, "b": 1}


async def test_an_aborted_signal_stops_a_replay_at_the_next_recorded_step(
    storage: gnl.Storage,
) -> None:
    calls, effect = tally()
    crash = [True]

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        a = await ctx.step("a", effect, "a")
        if not crash[0]:
            ctx.signal.abort("canceled")
        b = await ctx.step("b", effect, "b")
        if crash[0]:
            crash[0] = False
            raise RuntimeError("dies after b")
        return [a, b]

    g = gnl.create_gnl(storage, {"wf": wf})
    with pytest.raises(RuntimeError):
        await g.run_workflow("wf", run_id="r")
    with pytest.raises(gnl.ExecutionRevokedError):
        await g.run_workflow("wf", run_id="r", signal=gnl.RevocationSignal())
    assert calls == {"a": 1, "b": 1}


async def test_a_replay_of_interleaved_names_and_a_sleep_counts_each_name(
    storage: gnl.Storage,
) -> None:
    # Recorded a, b, a, (sleep), b, a: the replay serves them in position order (not the
    # journal's key order), passes the sleep, and the new steps after it are the next calls of
    # each name; a run whose code now calls them in another order fails at the first that
    # differs.
    calls, effect = tally()
    crash = [True]
    order = ["a", "b", "a", "sleep", "b", "a"]

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        got = []
        for i, name in enumerate(order):
            if name == "sleep":
                await ctx.sleep(0)
            else:
                got.append(await ctx.step(name, effect, f"{name}{i}"))
        if crash[0]:
            crash[0] = False
            raise RuntimeError("dies after the recorded steps")
        return [*got, await ctx.step("b", effect, "b-new"), await ctx.step("a", effect, "a-new")]

    g = gnl.create_gnl(storage, {"wf": wf})
    with pytest.raises(RuntimeError):
        await g.run_workflow("wf", run_id="r")
    assert await g.run_workflow("wf", run_id="r") == [
        "a0",
        "b1",
        "a2",
        "b4",
        "a5",
        "b-new",
        "a-new",
    ]
    assert calls == {"a0": 1, "b1": 1, "a2": 1, "b4": 1, "a5": 1, "b-new": 1, "a-new": 1}
    run = await gnl.get_run(storage, "r")
    assert run is not None
    assert [(s.name, s.n, s.position) for s in run.steps] == [
        ("a", 0, 0),
        ("b", 0, 1),
        ("a", 1, 2),
        ("gnl.sleep", 0, 3),
        ("b", 1, 4),
        ("a", 2, 5),
        ("b", 2, 6),
        ("a", 3, 7),
    ]
    # Same journal, code that swaps the 5th and 6th calls: b4 is served, then the run fails.
    crash[0] = True
    with pytest.raises(RuntimeError):
        await g.run_workflow("wf", run_id="r2")
    order[4], order[5] = "a", "b"
    with pytest.raises(gnl.GnlError, match=r"step 4 is recorded as 'b' \(call 1\).*'a' \(call 2\)"):
        await g.run_workflow("wf", run_id="r2")
    assert calls["a2"] == 2 and "a4" not in calls and "b5" not in calls


async def test_ctx_run_replays_after_the_jobs_own_steps_of_the_same_name(
    storage: gnl.Storage,
) -> None:
    # A job's ctx.step("x") before ctx.run, whose workflow calls "x" twice: the run's steps are
    # calls 1 and 2 of "x"; a retry replays all three and records call 3 after them.
    calls, effect = tally()
    run_ids: list[str] = []

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        got = [await ctx.step("x", effect, f"x{i}") for i in (1, 2)]
        if calls.get("died") is None:
            calls["died"] = 1
            raise RuntimeError("first attempt dies after x1, x2")
        return [*got, await ctx.step("x", effect, "x3")]

    async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
        run_ids.append(ctx.run_id)
        return [await ctx.step("x", effect, "x0"), await ctx.run(wf)]

    await gnl.enqueue(storage, "t", None, id="j")
    worker = gnl.create_worker(storage, {"t": handler}, retry_delay_ms=0)
    await worker.drain()
    job = await gnl.get_job(storage, "j")
    assert job is not None and job.state == "done", job
    assert job.result == ["x0", ["x1", "x2", "x3"]]
    assert calls == {"x0": 1, "x1": 1, "x2": 1, "died": 1, "x3": 1}
    run = await gnl.get_run(storage, run_ids[0])
    assert run is not None
    assert [(s.name, s.n, s.position) for s in run.steps] == [("x", i, i) for i in range(4)]
