"""The scheduler on every backend (API.md "Scheduler"): registration (immutable definition,
bad input refused with nothing written), polls (run ids, scheduled_for, misfire end to end
through ``poll_scheduler(now_ms=...)`` with the max_catchup warning), busy deferral versus
failure with backoff, the fire lock held by another poller, listings and unschedule, and the
poll loop."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest

import gnl
from _support import wait_for
from gnl import _native

MIN = 60_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % MIN  # a whole minute


class Recorder:
    """A runner that records its calls and does what it is told."""

    def __init__(self, raises: BaseException | None = None, sleep: float = 0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.raises = raises
        self.sleep = sleep

    async def run_workflow(
        self, name: str, *, run_id: str, input: Any, scheduled_for: int | None, signal: Any
    ) -> Any:
        self.calls.append(
            {"name": name, "run_id": run_id, "input": input, "scheduled_for": scheduled_for}
        )
        if self.sleep:
            await asyncio.sleep(self.sleep)
        if self.raises is not None:
            raise self.raises
        return None


async def trigger(storage: gnl.Storage, id: str) -> gnl.TriggerInfo:
    (t,) = [t for t in await gnl.list_triggers(storage) if t.id == id]
    return t


async def test_a_cron_trigger_fires_each_slot_once_with_its_slot(storage: gnl.Storage) -> None:
    tid = await gnl.schedule_workflow(
        storage, "wf", cron="*/5 * * * *", input={"a": 1}, now_ms=T0 + 1
    )
    assert tid == "wf"
    t = await trigger(storage, "wf")
    assert (t.kind, t.spec, t.state, t.fire_count) == ("cron", "*/5 * * * *", "pending", 0)
    first = _native.next_cron_time("*/5 * * * *", T0 + 1)
    assert first is not None
    assert t.next_run_at == first
    r = Recorder()
    # Not due yet.
    res = await gnl.poll_scheduler(storage, r, now_ms=first - 1)
    assert (res.fired, r.calls) == (0, [])
    res = await gnl.poll_scheduler(storage, r, now_ms=first + 10)
    assert (res.fired, res.run_ids) == (1, ["sched:wf:0"])
    assert r.calls == [
        {"name": "wf", "run_id": "sched:wf:0", "input": {"a": 1}, "scheduled_for": first}
    ]
    res = await gnl.poll_scheduler(storage, r, now_ms=first + 20)
    assert res.fired == 0
    t = await trigger(storage, "wf")
    assert (t.fire_count, t.last_scheduled_for, t.last_fired_at) == (1, first, first + 10)
    assert t.next_run_at == first + 5 * MIN
    res = await gnl.poll_scheduler(storage, r, now_ms=first + 5 * MIN)
    assert res.run_ids == ["sched:wf:1"]


async def test_a_trigger_scheduled_again_after_unschedule_runs_its_fires(
    storage: gnl.Storage,
) -> None:
    # Unschedule, then register the same id again (what a changed schedule asks for): the
    # new trigger counted its fires from 0 again, so its first run id was the old trigger's
    # first run and read back its recorded result: nothing ran, silently.
    seen: list[Any] = []

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return await ctx.step("send", lambda: seen.append(input) or input)

    runner = gnl.create_gnl(storage, {"report": wf})
    await gnl.schedule_workflow(storage, "report", id="tick", every_ms=1_000, input="v1", now_ms=T0)
    for k in range(1, 6):
        res = await gnl.poll_scheduler(storage, runner, now_ms=T0 + k * 1_000)
        assert res.run_ids == [f"sched:tick:{k - 1}"]
    assert seen == ["v1"] * 5
    assert await gnl.unschedule(storage, "tick")
    await gnl.schedule_workflow(
        storage, "report", id="tick", every_ms=2_000, input="v2", now_ms=T0 + 5_500
    )
    assert (await trigger(storage, "tick")).fire_count == 5
    res = await gnl.poll_scheduler(storage, runner, now_ms=T0 + 7_500)
    assert res.run_ids == ["sched:tick:5"] and seen == ["v1"] * 5 + ["v2"]
    run = await gnl.get_run(storage, "sched:tick:5")
    assert run is not None and (run.state, run.result) == ("done", "v2")
    # Registered again with the same definition: a no-op, the count goes on.
    await gnl.schedule_workflow(
        storage, "report", id="tick", every_ms=2_000, input="v2", now_ms=T0 + 5_500
    )
    assert (await trigger(storage, "tick")).fire_count == 6


async def test_every_and_at_triggers(storage: gnl.Storage) -> None:
    await gnl.schedule_workflow(storage, "wf", id="e", every_ms=1_000, now_ms=T0)
    await gnl.schedule_workflow(storage, "wf", id="a", at=T0 + 500, now_ms=T0)
    r = Recorder()
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + 1_000)
    assert sorted(res.run_ids) == ["sched:a:0", "sched:e:0"]
    assert {c["run_id"]: c["scheduled_for"] for c in r.calls} == {
        "sched:a:0": T0 + 500,
        "sched:e:0": T0 + 1_000,
    }
    a = await trigger(storage, "a")
    assert (a.state, a.next_run_at, a.fire_count) == ("done", None, 1)
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + 2_000)
    assert res.run_ids == ["sched:e:1"]
    # A past one-shot fires on the first poll.
    await gnl.schedule_workflow(storage, "wf", id="past", at=5, now_ms=T0)
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + 2_001)
    assert res.run_ids == ["sched:past:0"]


async def test_the_definition_is_immutable(storage: gnl.Storage) -> None:
    await gnl.schedule_workflow(storage, "wf", cron="0 3 * * *", now_ms=T0)
    # The same definition again: a no-op (the anchor is the first registration's).
    await gnl.schedule_workflow(storage, "wf", cron="0 3 * * *", now_ms=T0 + 10 * MIN)
    # The error names what changed, registered -> given, and nothing else.
    with pytest.raises(gnl.TriggerConflictError, match=r"\(spec: \"0 3 \* \* \*\" -> \"0 4 "):
        await gnl.schedule_workflow(storage, "wf", cron="0 4 * * *")
    with pytest.raises(gnl.TriggerConflictError) as caught:
        await gnl.schedule_workflow(storage, "wf", cron="0 3 * * *", max_attempts=2)
    assert "(max_attempts: 5 -> 2)" in str(caught.value), caught.value
    assert (await trigger(storage, "wf")).spec == "0 3 * * *"
    assert await gnl.unschedule(storage, "wf")
    assert not await gnl.unschedule(storage, "wf")
    await gnl.schedule_workflow(storage, "wf", cron="0 4 * * *")
    assert (await trigger(storage, "wf")).spec == "0 4 * * *"
    # An input is shown as the JSON it is, not as the text it is stored as.
    await gnl.schedule_workflow(storage, "wf", id="in", every_ms=MIN, input={"a": 1})
    with pytest.raises(gnl.TriggerConflictError) as caught:
        await gnl.schedule_workflow(storage, "wf", id="in", every_ms=MIN, input={"a": 2})
    assert '(input: {"a": 1} -> {"a": 2})' in str(caught.value), caught.value


async def test_triggers_are_listed_by_id_a_page_at_a_time(storage: gnl.Storage) -> None:
    for id in ("m", "a", "z", "b"):
        await gnl.schedule_workflow(storage, "wf", id=id, every_ms=MIN, now_ms=T0)
    assert [t.id for t in await gnl.list_triggers(storage)] == ["a", "b", "m", "z"]
    pages, after = [], None
    while True:
        page = await gnl.list_triggers(storage, after=after, limit=3)
        if not page:
            break
        pages.append([t.id for t in page])
        after = page[-1].id
    assert pages == [["a", "b", "m"], ["z"]]
    assert [t.id for t in await gnl.list_triggers(storage, after="c", limit=1)] == ["m"]
    got = await gnl.get_trigger(storage, "m")
    assert got is not None and (got.id, got.kind, got.spec) == ("m", "every", MIN)
    assert got == (await gnl.list_triggers(storage, after="b", limit=1))[0]
    assert await gnl.get_trigger(storage, "nope") is None
    with pytest.raises(gnl.InvalidArgumentError, match="limit"):
        await gnl.list_triggers(storage, limit=0)
    with pytest.raises(TypeError, match="after"):
        await gnl.list_triggers(storage, after=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trigger_id"):
        await gnl.get_trigger(storage, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cron": "* * * * * *"}, gnl.CronError, "field"),
        ({"cron": "0 0 30 2 *"}, gnl.CronError, "day-of-month"),
        ({"every_ms": 0}, gnl.InvalidArgumentError, "every_ms"),
        ({"at": datetime(2030, 1, 1)}, gnl.InvalidArgumentError, "naive"),
        # Microseconds for ms: refused as enqueue's run_at is (it was stored, and listings
        # of the trigger then raised).
        ({"at": 10**18}, gnl.InvalidArgumentError, "at must be between 0 and"),
        ({"at": -1}, gnl.InvalidArgumentError, "year 9999"),
        ({"cron": "* * * * *", "max_catchup": 3}, gnl.InvalidArgumentError, "max_catchup"),
        ({"every_ms": "1000"}, TypeError, "every_ms"),
        ({"cron": "* * * * *", "every_ms": 5}, gnl.InvalidArgumentError, "exactly one"),
        ({}, gnl.InvalidArgumentError, "exactly one"),
        ({"cron": "* * * * *", "misfire": "sometimes"}, gnl.InvalidArgumentError, "misfire"),
        ({"cron": "* * * * *", "max_attempts": 0}, gnl.InvalidArgumentError, "max_attempts"),
        ({"cron": "* * * * *", "input": object()}, TypeError, "input"),
        ({"cron": "* * * * *", "id": "x" * 256}, gnl.InvalidArgumentError, "id"),
    ],
)
async def test_bad_input_is_refused_and_nothing_written(
    storage: gnl.Storage, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await gnl.schedule_workflow(storage, "wf", **kwargs)
    assert await gnl.list_triggers(storage) == []


async def test_an_empty_workflow_name_is_named_as_the_name(storage: gnl.Storage) -> None:
    # The id defaults to the name: the error must name the name, not the id.
    with pytest.raises(gnl.InvalidArgumentError, match=r"^name \(the workflow to fire\)"):
        await gnl.schedule_workflow(storage, "", every_ms=1000)
    assert await gnl.list_triggers(storage) == []


async def test_misfire_latest_fires_the_last_due_one_and_counts_the_missed(
    storage: gnl.Storage,
) -> None:
    await gnl.schedule_workflow(storage, "wf", cron="* * * * *", now_ms=T0)
    r = Recorder()
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + 10 * MIN + 5)
    assert res.fired == 1
    assert r.calls[0]["scheduled_for"] == T0 + 10 * MIN
    t = await trigger(storage, "wf")
    assert (t.missed, t.next_run_at) == (9, T0 + 11 * MIN)


async def test_misfire_none_fires_nothing_and_logs(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    await gnl.schedule_workflow(storage, "wf", cron="* * * * *", misfire="none", now_ms=T0)
    r = Recorder()
    with caplog.at_level(logging.WARNING, logger="gnl"):
        res = await gnl.poll_scheduler(storage, r, now_ms=T0 + 3 * MIN + 1)
    assert (res.fired, r.calls) == (0, [])
    t = await trigger(storage, "wf")
    assert (t.missed, t.next_run_at) == (3, T0 + 4 * MIN)
    assert "missed 3" in caplog.text


async def test_catchup_fires_one_per_poll_oldest_first_and_max_catchup_warns(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    await gnl.schedule_workflow(
        storage, "wf", cron="* * * * *", misfire="catchup", max_catchup=2, now_ms=T0
    )
    r = Recorder()
    now = T0 + 5 * MIN + 1
    with caplog.at_level(logging.WARNING, logger="gnl"):
        for _ in range(4):
            await gnl.poll_scheduler(storage, r, now_ms=now)
    assert [c["scheduled_for"] for c in r.calls] == [T0 + 4 * MIN, T0 + 5 * MIN]
    warnings = [m for m in caplog.messages if "max_catchup" in m]
    oldest = datetime.fromtimestamp((T0 + MIN) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert warnings == [
        f'trigger "wf": max_catchup=2 skipped 3 missed occurrences, the oldest at {oldest}'
    ]
    assert (await trigger(storage, "wf")).missed == 3


async def test_a_busy_run_is_a_deferral_not_an_attempt(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, now_ms=T0)
    busy = Recorder(raises=gnl.RunBusyError("busy", at_lock_acquisition=True))
    with caplog.at_level(logging.INFO, logger="gnl"):
        res = await gnl.poll_scheduler(storage, busy, retry_ms=7_000, now_ms=T0 + MIN)
    assert caplog.messages == [
        "gnl scheduler: fire 'sched:wf:0' of trigger 'wf' deferred 7000 ms (its run is being "
        "executed elsewhere); no attempt spent"
    ]
    assert (res.fired, res.skipped, res.deferred, res.run_ids) == (0, 1, 1, [])
    t = await trigger(storage, "wf")
    assert (t.state, t.attempts, t.deferrals) == ("pending", 0, 1)
    # At the refusal: the poll's instant and the few ms this process took since.
    assert t.last_deferral_at is not None and 0 < t.last_deferral_at - (T0 + MIN) < 5_000
    assert t.next_run_at == T0 + MIN + 7_000
    # The retry keeps the slot and the run id.
    r = Recorder()
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + MIN + 7_000)
    assert res.run_ids == ["sched:wf:0"]
    assert r.calls[0]["scheduled_for"] == T0 + MIN


async def test_a_fire_retry_of_a_run_the_waker_resumes_is_deferred_not_run_twice(
    storage: gnl.Storage,
) -> None:
    # After a crash the waker resumes the slot's run (its lease lapsed) and the trigger's fire
    # is retried (its fire lock lapsed): the retry is refused while the waker's execution is
    # live, deferred, and reads the result back later; no step runs twice.
    calls: list[str] = []
    inside = asyncio.Event()
    go_on = asyncio.Event()

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        await ctx.step("a", calls.append, "a")
        inside.set()
        await go_on.wait()
        await ctx.step("b", calls.append, "b")
        return "ok"

    g = gnl.create_gnl(storage, {"wf": wf})
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, now_ms=T0)
    # The crashed process's execution of slot 0: started, lease lapsed.
    await _native.run_start(storage._native, "sched:wf:0", "wf", None, None, T0 + MIN, "dead", 3)
    await asyncio.sleep(0.05)
    resumed = asyncio.create_task(gnl.create_workflow_waker(g).tick())
    await inside.wait()
    res = await gnl.poll_scheduler(storage, g, retry_ms=7_000, now_ms=T0 + MIN)
    assert (res.fired, res.skipped, res.deferred) == (0, 1, 1)
    go_on.set()
    assert await resumed == 1
    res = await gnl.poll_scheduler(storage, g, now_ms=T0 + MIN + 7_000)
    assert (res.fired, res.failed, res.run_ids) == (1, 0, ["sched:wf:0"])
    assert calls == ["a", "b"]
    t = await trigger(storage, "wf")
    assert (t.fire_count, t.attempts, t.deferrals) == (1, 0, 1)


async def test_a_fire_stopped_by_shutdown_is_a_deferral_not_an_attempt(
    storage: gnl.Storage,
) -> None:
    # gnl run's shutdown aborts a fire's run (why="shutdown"; the run is suspended for the
    # waker): the slot is retried by the next poller, and deploys do not use up attempts.
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, max_attempts=1, now_ms=T0)
    # The run went on for 300 ms before the shutdown stopped it.
    stopped = Recorder(raises=gnl.ExecutionRevokedError("shutdown"), sleep=0.3)
    res = await gnl.poll_scheduler(storage, stopped, retry_ms=5_000, now_ms=T0 + MIN)
    assert (res.fired, res.failed, res.skipped, res.deferred) == (0, 0, 1, 1)
    t = await trigger(storage, "wf")
    assert (t.state, t.attempts, t.deferrals) == ("pending", 0, 1)
    # Deferred when it was stopped, not when it started (it read the fire's start).
    assert t.last_deferral_at is not None and 300 <= t.last_deferral_at - (T0 + MIN) < 5_000
    assert t.next_run_at == T0 + MIN + 5_000
    # Another abort is a failed attempt (max_attempts=1: the trigger fails).
    canceled = Recorder(raises=gnl.ExecutionRevokedError("canceled"))
    res = await gnl.poll_scheduler(storage, canceled, now_ms=T0 + MIN + 5_000)
    assert (res.fired, res.failed) == (1, 1)
    assert (await trigger(storage, "wf")).state == "failed"


async def test_a_fire_whose_run_lost_its_lease_is_a_deferral_not_an_attempt(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    # The process stalled past its run's lease (not past the fire lock): another execution
    # took the run over and carries it on. The fire did not fail: with max_attempts=1 it made
    # the trigger "failed" (fires no more) while its run finished elsewhere.
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, max_attempts=1, now_ms=T0)
    lost = Recorder(raises=gnl.ExecutionRevokedError("lease-lost"))
    with caplog.at_level(logging.WARNING, logger="gnl"):
        res = await gnl.poll_scheduler(storage, lost, retry_ms=5_000, now_ms=T0 + MIN)
    assert (res.fired, res.failed, res.skipped, res.deferred) == (0, 0, 1, 1)
    t = await trigger(storage, "wf")
    assert (t.state, t.attempts, t.deferrals, t.last_error) == ("pending", 0, 1, None)
    assert t.next_run_at == T0 + MIN + 5_000
    assert "another execution took the run over" in caplog.text
    # The retry fires the same slot under the same run id (done by then: its result).
    r = Recorder()
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + MIN + 5_000)
    assert res.run_ids == ["sched:wf:0"] and r.calls[0]["scheduled_for"] == T0 + MIN
    assert (await trigger(storage, "wf")).fire_count == 1


async def test_failures_back_off_then_the_trigger_fails(storage: gnl.Storage) -> None:
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, max_attempts=3, now_ms=T0)
    bad = Recorder(raises=RuntimeError("boom"))
    now = T0 + MIN
    res = await gnl.poll_scheduler(storage, bad, now_ms=now)
    assert (res.fired, res.failed) == (1, 1)
    t = await trigger(storage, "wf")
    assert (t.attempts, t.last_error, t.next_run_at) == (1, "RuntimeError: boom", now + 1_000)
    res = await gnl.poll_scheduler(storage, bad, now_ms=now + 1_000)
    t = await trigger(storage, "wf")
    assert (t.attempts, t.next_run_at) == (2, now + 1_000 + 2_000)
    res = await gnl.poll_scheduler(storage, bad, now_ms=now + 3_000)
    t = await trigger(storage, "wf")
    assert (t.state, t.attempts, t.next_run_at) == ("failed", 3, None)
    assert [c["scheduled_for"] for c in bad.calls] == [T0 + MIN] * 3
    assert {c["run_id"] for c in bad.calls} == {"sched:wf:0"}
    res = await gnl.poll_scheduler(storage, bad, now_ms=now + 10 * MIN)
    assert res.fired == 0


async def test_a_held_fire_lock_skips_the_trigger(storage: gnl.Storage) -> None:
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, now_ms=T0)
    native = storage._native
    tok = await _native.lock_acquire(native, "sched:wf:0:fire", "other", 60_000)
    assert tok is not None
    r = Recorder()
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + MIN)
    assert (res.fired, res.skipped, r.calls) == (0, 1, [])
    await _native.lock_release(native, "sched:wf:0:fire", tok)
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + MIN)
    assert res.run_ids == ["sched:wf:0"]


async def test_due_triggers_fire_concurrently_and_concurrency_caps(storage: gnl.Storage) -> None:
    for i in range(6):
        await gnl.schedule_workflow(storage, "wf", id=f"t{i}", every_ms=MIN, now_ms=T0)
    r = Recorder(sleep=0.3)
    loop = asyncio.get_running_loop()
    t = loop.time()
    res = await gnl.poll_scheduler(storage, r, now_ms=T0 + MIN)
    assert res.fired == 6
    assert loop.time() - t < 1.5  # six 0.3 s fires at once, not one after another
    res = await gnl.poll_scheduler(storage, r, concurrency=2, now_ms=T0 + 2 * MIN)
    assert res.fired == 6


async def test_a_durable_runner_and_the_poll_loop(storage: gnl.Storage) -> None:
    seen: list[tuple[str, int | None]] = []

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> None:
        seen.append((ctx.run_id, ctx.scheduled_for))

    async def slow(ctx: gnl.WorkflowContext, input: Any) -> None:
        await asyncio.sleep(3)

    g = gnl.create_gnl(storage, {"wf": wf, "slow": slow})
    await gnl.schedule_workflow(storage, "slow", every_ms=200)
    await gnl.schedule_workflow(storage, "wf", every_ms=200)
    s = gnl.create_scheduler(storage, g, poll_ms=50)
    s.start()
    await asyncio.sleep(1.5)
    await s.stop()
    # The slow workflow does not hold the fast trigger back.
    assert len(seen) >= 3
    assert [r for r, _ in seen[:3]] == ["sched:wf:0", "sched:wf:1", "sched:wf:2"]
    assert all(slot is not None for _, slot in seen)
    assert (await trigger(storage, "slow")).fire_count == 1


async def test_the_critical_preset_nests_inside_the_fire_lock(storage: gnl.Storage) -> None:
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> int:
        return 1

    g = gnl.create_gnl(storage, {"wf": wf}, preset="critical")
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, now_ms=T0)
    res = await gnl.poll_scheduler(storage, g, now_ms=T0 + MIN)
    assert (res.fired, res.failed, res.skipped) == (1, 0, 0)
    assert (await trigger(storage, "wf")).fire_count == 1


def test_the_command_line(store_url: Any) -> None:
    import json
    import subprocess
    import sys

    url = store_url()

    async def setup() -> None:
        async with await gnl.connect(url) as st:
            await gnl.schedule_workflow(st, "wf", cron="0 3 * * *", now_ms=T0)
            await gnl.schedule_workflow(st, "wf", id="e", every_ms=5_000, now_ms=T0)

    asyncio.run(setup())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gnl", *args], capture_output=True, text=True, timeout=60
        )

    listed = [
        json.loads(ln)
        for ln in cli("triggers", "list", "--url", url, "--json").stdout.split("\n")
        if ln
    ]
    assert [(t["id"], t["kind"], t["spec"]) for t in listed] == [
        ("e", "every", 5_000),
        ("wf", "cron", "0 3 * * *"),
    ]
    assert "0 3 * * *" in cli("triggers", "list", "--url", url).stdout
    assert cli("triggers", "unschedule", "e", "--url", url).returncode == 0
    assert cli("triggers", "unschedule", "e", "--url", url).returncode == 1
    out = cli("cron", "0 3 * * *", "-n", "3", "--after", "0", "--json")
    at = [json.loads(ln)["at_ms"] for ln in out.stdout.splitlines()]
    assert at == _native.cron_times("0 3 * * *", 0, 3)
    bad = cli("cron", "0 3 * * * *")
    assert bad.returncode == 2 and "CronError" in bad.stderr


# -- triggers of workflows the runner does not declare -----------------------------------------


async def nop(ctx: gnl.WorkflowContext, input: Any) -> str:
    return "ok"


async def test_a_trigger_of_an_undeclared_workflow_is_left_due_for_a_process_that_declares_it(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rolling deploy, or two apps on one store: a runner that does not declare a trigger's
    # workflow fired it, failed it as an unknown workflow and, after max_attempts, the trigger
    # fired no more for the process that declares it. Now it is left as it was.
    # "Once per process": counted from here (raising=False: absent before the fix).
    monkeypatch.setattr(gnl.scheduler, "_LEFT", set(), raising=False)
    old = gnl.create_gnl(storage, {"mine": nop})
    new = gnl.create_gnl(storage, {"mine": nop, "theirs": nop})
    await gnl.schedule_workflow(storage, "mine", every_ms=MIN, now_ms=T0)
    await gnl.schedule_workflow(storage, "theirs", every_ms=MIN, max_attempts=1, now_ms=T0)
    before = await trigger(storage, "theirs")
    with caplog.at_level(logging.WARNING, logger="gnl"):
        res = await gnl.poll_scheduler(storage, old, now_ms=T0 + MIN)
        assert (res.run_ids, res.failed, res.skipped) == (["sched:mine:0"], 0, 0)
        for _ in range(2):
            res = await gnl.poll_scheduler(storage, old, now_ms=T0 + MIN)
            assert (res.fired, res.skipped) == (0, 0)
    assert (await trigger(storage, "mine")).fire_count == 1
    # Untouched: still due, no attempt, no error, no deferral, no run, no fire lock taken.
    assert await trigger(storage, "theirs") == before
    assert before.state == "pending" and before.next_run_at == T0 + MIN
    assert await gnl.get_run(storage, "sched:theirs:0") is None
    tok = await _native.lock_acquire(storage._native, "sched:theirs:0:fire", "probe", 60_000)
    assert tok is not None
    await _native.lock_release(storage._native, "sched:theirs:0:fire", tok)
    # Said once (not at every poll), naming the trigger and its workflow.
    said = [r.getMessage() for r in caplog.records if "left for a process" in r.getMessage()]
    assert len(said) == 1, said
    assert "trigger 'theirs' fires workflow 'theirs'" in said[0]
    assert "declared: 'mine'" in said[0]
    # The process that declares it fires it.
    res = await gnl.poll_scheduler(storage, new, now_ms=T0 + MIN)
    assert res.run_ids == ["sched:theirs:0"] and res.failed == 0
    t = await trigger(storage, "theirs")
    assert (t.state, t.fire_count, t.attempts) == ("pending", 1, 0)


async def test_triggers_left_for_another_process_do_not_crowd_out_the_runners_own(
    storage: gnl.Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The due read goes on to its last page: earlier-due foreign triggers filling the first
    # pages do not hide this runner's own.
    monkeypatch.setattr(gnl.scheduler, "_PAGE", 2)
    for i in range(5):
        await gnl.schedule_workflow(storage, "theirs", id=f"f{i}", every_ms=MIN, now_ms=T0)
    await gnl.schedule_workflow(storage, "mine", every_ms=MIN, now_ms=T0 + 1)
    g = gnl.create_gnl(storage, {"mine": nop})
    res = await gnl.poll_scheduler(storage, g, now_ms=T0 + MIN + 1)
    assert res.run_ids == ["sched:mine:0"]
    assert {t.id: t.attempts for t in await gnl.list_triggers(storage) if t.id != "mine"} == {
        f"f{i}": 0 for i in range(5)
    }


async def test_a_runner_that_cannot_run_a_workflow_is_refused_before_any_fire(
    storage: gnl.Storage,
) -> None:
    # Before, each fire spent one of the trigger's attempts on an AttributeError until the
    # trigger failed for good.
    await gnl.schedule_workflow(storage, "now", at=0, max_attempts=2)

    class Plain:
        def run_workflow(self, name: str, **kw: Any) -> None:
            return None

    for runner, says in (
        (None, "runner must have an async run_workflow("),
        (storage, "not Storage"),
        (Plain(), "runner.run_workflow must be an async function"),
    ):
        with pytest.raises(TypeError, match=re.escape(says)):
            gnl.create_scheduler(storage, runner)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=re.escape(says)):
            await gnl.poll_scheduler(storage, runner)  # type: ignore[arg-type]
    t = await trigger(storage, "now")
    assert (t.state, t.attempts, t.fire_count) == ("pending", 0, 0)


async def test_a_slot_fires_on_time_whatever_the_backoff(storage: gnl.Storage) -> None:
    # After empty polls the loop sleeps up to max_poll_ms; a slot coming due meanwhile must
    # not wait for that sleep to end (each poll's due read also gives the next due instant).
    # Before, the first slot (1.5 s) was found by the poll at 2.8 s: 1.3 s late.
    late: list[float] = []

    class Timed(Recorder):
        async def run_workflow(
            self, name: str, *, run_id: str, input: Any, scheduled_for: int | None, signal: Any
        ) -> Any:
            assert scheduled_for is not None
            late.append(time.time() * 1000 - scheduled_for)
            return await super().run_workflow(
                name, run_id=run_id, input=input, scheduled_for=scheduled_for, signal=signal
            )

    await gnl.schedule_workflow(storage, "wf", every_ms=1_500)
    s = gnl.create_scheduler(storage, Timed(), poll_ms=200, max_poll_ms=3_000)
    s.start()
    try:
        await wait_for(lambda: len(late) >= 2, timeout=15, what="two slots to fire")
    finally:
        await s.stop()
    assert max(late) < 400, late


async def test_a_trigger_left_for_another_process_does_not_keep_the_poll_loop_busy(
    storage: gnl.Storage,
) -> None:
    # It stays due: the loop must back off as after an empty poll, not poll again at once.
    await gnl.schedule_workflow(storage, "theirs", at=0)
    await gnl.schedule_workflow(storage, "mine", at=0)
    s = gnl.create_scheduler(storage, gnl.create_gnl(storage, {"mine": nop}), poll_ms=10)
    polls = 0
    poll = s._p.poll

    async def counted(now_ms: int | None, result: gnl.PollResult) -> list[asyncio.Task[None]]:
        nonlocal polls
        polls += 1
        return await poll(now_ms, result)

    s._p.poll = counted  # type: ignore[method-assign]
    s.start()
    await asyncio.sleep(1.0)
    await s.stop()
    assert s.totals.run_ids == ["sched:mine:0"]
    # Backing off 10 -> 20 -> 40 ms (max_poll_ms = poll_ms * 4): ~27 polls in 1 s; a loop
    # woken at once by the due trigger would poll hundreds of times.
    assert 5 <= polls <= 45, polls
    t = await trigger(storage, "theirs")
    assert (t.state, t.attempts, t.fire_count) == ("pending", 0, 0)


async def test_a_slot_stopped_at_an_unrecorded_at_most_once_step_waits_for_an_operator(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    # A process died inside an at-most-once step of a scheduled run: every retry of the slot
    # stops at that step (StepOutcomeUnknownError) until an operator resolves it. The slot
    # waits for that, spending no attempt (with max_attempts=1 it was failed at the first
    # retry: a recurring schedule ended for good), then runs on under the same run id without
    # calling the step again.
    calls: list[str] = []

    async def pay() -> str:
        calls.append("pay")
        return "paid"

    async def ship() -> str:
        calls.append("ship")
        return "shipped"

    async def checkout(ctx: gnl.WorkflowContext, input: Any) -> Any:
        paid = await ctx.step("pay", pay, at_most_once=True)
        return [paid, await ctx.step("ship", ship)]

    runner = gnl.create_gnl(storage, {"checkout": checkout})
    await gnl.schedule_workflow(storage, "checkout", id="co", at=T0, max_attempts=1, now_ms=T0)
    # The crashed execution: it recorded the step's intent, then died (its 3 ms lease lapsed).
    native = storage._native
    await _native.run_start(native, "sched:co:0", "checkout", None, None, None, "dead:1:x", 3)
    await _native.step_intent(native, "sched:co:0", "pay", 0, 0, T0)
    await asyncio.sleep(0.05)
    for k in range(2):
        with caplog.at_level(logging.WARNING, logger="gnl"):
            res = await gnl.poll_scheduler(storage, runner, retry_ms=5_000, now_ms=T0 + k * 5_000)
        assert (res.fired, res.failed, res.deferred) == (0, 0, 1)
        t = await trigger(storage, "co")
        assert (t.state, t.attempts, t.deferrals) == ("pending", 0, k + 1)
        assert t.next_run_at == T0 + k * 5_000 + 5_000
        assert t.last_error is not None and "StepOutcomeUnknownError" in t.last_error
    assert calls == []
    said = [m for m in caplog.messages if "waits for an operator" in m]
    assert len(said) == 2 and "gnl runs resolve sched:co:0 pay" in said[0], caplog.messages
    # The operator says it happened; the next retry finishes the run: pay is not called again.
    assert await gnl.resolve_step(storage, "sched:co:0", "pay", value="paid by hand")
    res = await gnl.poll_scheduler(storage, runner, now_ms=T0 + 10_000)
    assert res.run_ids == ["sched:co:0"] and res.failed == 0
    assert calls == ["ship"]
    run = await gnl.get_run(storage, "sched:co:0")
    assert run is not None and (run.state, run.result) == ("done", ["paid by hand", "shipped"])
    t = await trigger(storage, "co")
    assert (t.state, t.fire_count, t.attempts) == ("done", 1, 0)


async def test_each_failed_fire_attempt_is_logged(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    await gnl.schedule_workflow(storage, "wf", every_ms=MIN, max_attempts=3, now_ms=T0)
    r = Recorder(raises=RuntimeError("boom"))
    with caplog.at_level(logging.WARNING, logger="gnl"):
        await gnl.poll_scheduler(storage, r, now_ms=T0 + MIN)
    assert caplog.messages == [
        "gnl scheduler: fire 'sched:wf:0' of trigger 'wf' failed (attempt 1 of 3), retried in "
        "1000 ms: RuntimeError: boom"
    ]


async def test_resuming_a_failed_schedules_run_rearms_its_trigger(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    # A trigger that used up its attempts stayed `failed` after `gnl runs resume` finished its
    # slot's run: the schedule fired no more until it was unscheduled and registered again
    # (which fires a new run). Resuming the run re-arms the trigger for that slot.
    down = [True]
    calls: list[int | None] = []

    async def report(ctx: gnl.WorkflowContext, input: Any) -> Any:
        calls.append(ctx.scheduled_for)
        if down[0]:
            raise RuntimeError("the service is down")
        return "sent"

    runner = gnl.create_gnl(storage, {"report": report})
    await gnl.schedule_workflow(storage, "report", every_ms=MIN, max_attempts=1, now_ms=T0)
    res = await gnl.poll_scheduler(storage, runner, now_ms=T0 + MIN)
    assert res.failed == 1
    t = await trigger(storage, "report")
    assert (t.state, t.fire_count) == ("failed", 0)
    assert not await gnl.resume_run(storage, "sched:report:1")  # no such run
    down[0] = False
    assert await gnl.resume_run(storage, "sched:report:0")
    t = await trigger(storage, "report")
    assert (t.state, t.attempts, t.fire_count) == ("pending", 0, 0)
    # The next poll fires the failed slot under its run id, then the schedule goes on.
    now = await storage.now_ms()
    res = await gnl.poll_scheduler(storage, runner, now_ms=now)
    assert res.run_ids == ["sched:report:0"] and res.failed == 0
    assert calls == [T0 + MIN, T0 + MIN]
    run = await gnl.get_run(storage, "sched:report:0")
    assert run is not None and run.state == "done"
    t = await trigger(storage, "report")
    assert (t.state, t.fire_count) == ("pending", 1) and t.next_run_at is not None
    # A trigger that did not fail at that run is left alone.
    assert not await gnl.resume_run(storage, "sched:report:0")
