"""API.md "Events", in one process, on every backend: emit (idempotent by id per topic, org ids,
delays), emit_many (one write, all or none, InvalidJobError .index, 100,000 events), fan-out
consumers in log order, ack after the handler returns, retry holding the cursor but not the
events behind it, quarantine, list/retry dead events, max_hold_ms timeout, lease takeover, lag,
and bad input refused with nothing written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from typing import Any

import pytest

import gnl


def recorder() -> tuple[list[tuple[str, Any, gnl.EventMeta]], Any]:
    seen: list[tuple[str, Any, gnl.EventMeta]] = []

    async def handler(payload: Any, meta: gnl.EventMeta) -> None:
        seen.append((meta.id, payload, meta))

    return seen, handler


async def test_emit_fans_out_in_log_order_and_is_idempotent_by_id(storage: gnl.Storage) -> None:
    assert await gnl.emit(storage.work, "order.paid", {"n": 0}, id="e-0") == "e-0"
    assert await gnl.emit(storage.work, "order.paid", {"n": 99}, id="e-0") == "e-0"
    gen = await gnl.emit(storage.work, "order.paid", {"n": 1}, org_id="acme")
    assert isinstance(gen, str) and gen
    ids = await gnl.emit_many(
        storage.work, "order.paid", [{"payload": {"n": i}, "id": f"m-{i}"} for i in range(2, 6)]
    )
    assert ids == [f"m-{i}" for i in range(2, 6)]
    await gnl.emit(storage.work, "other", {"n": -1}, id="e-0")
    for name in ("fulfilment", "audit"):
        seen, handler = recorder()
        c = gnl.create_consumer(storage.work, "order.paid", handler, name=name)
        r = await c.drain()
        assert r == gnl.DrainResult(6, 6, 0)
        assert [s[0] for s in seen] == ["e-0", gen, *ids]
        assert [s[1]["n"] for s in seen] == [0, 1, 2, 3, 4, 5]
        m = seen[1][2]
        assert (m.topic, m.consumer, m.org_id, m.attempt) == ("order.paid", name, "acme", 1)
        assert seen[0][2].org_id is None and seen[0][2].emitted_at > 0
        # The consumer builds its EventMeta without the dataclass's __init__: the same value,
        # frozen as ever.
        fields = (m.id, m.topic, m.consumer, m.org_id, m.emitted_at, m.attempt, m.signal)
        assert type(m) is gnl.EventMeta and m == gnl.EventMeta(*fields)
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.attempt = 2  # type: ignore[misc]
        assert await c.drain() == gnl.DrainResult(0, 0, 0)
        lag = await gnl.consumer_lag(storage.work, "order.paid", name)
        assert lag is not None and (lag.behind, lag.oldest_unacked_at, lag.dead) == (0, None, 0)
        assert lag.heartbeat_at is not None


async def test_a_failing_event_is_retried_then_quarantined_and_the_rest_flow(
    storage: gnl.Storage,
) -> None:
    calls: dict[str, int] = {}

    async def handler(payload: Any, meta: gnl.EventMeta) -> None:
        calls[meta.id] = calls.get(meta.id, 0) + 1
        assert meta.attempt == calls[meta.id]
        if payload.get("poison") and not healed:
            raise RuntimeError("ECONNREFUSED")

    healed = False
    await gnl.emit_many(
        storage.work,
        "t",
        [
            {"payload": {}, "id": "a"},
            {"payload": {"poison": True}, "id": "e-3"},
            {"payload": {}, "id": "c"},
        ],
    )
    c = gnl.create_consumer(storage.work, "t", handler, name="f", max_attempts=3, retry_delay_ms=0)
    r = await c.drain()
    assert r == gnl.DrainResult(5, 2, 3)
    assert calls == {"a": 1, "e-3": 3, "c": 1}
    dead = await gnl.list_dead_events(storage.work, "t", "f")
    assert len(dead) == 1
    d = dead[0]
    assert (d.id, d.topic, d.consumer, d.attempts, d.payload) == (
        "e-3",
        "t",
        "f",
        3,
        {"poison": True},
    )
    assert "ECONNREFUSED" in d.error and d.at > 0
    await gnl.emit(storage.work, "t", {}, id="d")
    assert await c.drain() == gnl.DrainResult(1, 1, 0)
    # Handed back once: True, True again while waiting, False when there is none.
    assert await gnl.retry_dead_event(storage.work, "t", "f", "nope") is False
    assert await gnl.retry_dead_event(storage.work, "t", "other", "e-3") is False
    assert await gnl.retry_dead_event(storage.work, "t", "f", "e-3") is True
    assert await gnl.retry_dead_event(storage.work, "t", "f", "e-3") is True
    healed = True
    calls.clear()
    assert await c.drain() == gnl.DrainResult(1, 1, 0)
    assert calls == {"e-3": 1}
    assert await gnl.list_dead_events(storage.work, "t", "f") == []
    assert await gnl.retry_dead_event(storage.work, "t", "f", "e-3") is False


async def test_a_retry_waiting_event_holds_the_cursor_not_the_events_behind_it(
    storage: gnl.Storage,
) -> None:
    async def handler(payload: Any, meta: gnl.EventMeta) -> None:
        if meta.id == "b":
            raise ValueError("not yet")

    await gnl.emit_many(storage.work, "t", [{"payload": i, "id": x} for i, x in enumerate("abc")])
    await gnl.emit(storage.work, "t", 9, id="later", delay_ms=3_600_000)
    c = gnl.create_consumer(storage.work, "t", handler, name="f", max_attempts=math.inf)
    assert await c.drain() == gnl.DrainResult(3, 2, 1)
    lag = await c.lag()
    assert lag is not None and (lag.cursor, lag.behind) == (1, 2)
    assert await c.drain() == gnl.DrainResult(0, 0, 0)  # b waits 60 s, later an hour


async def test_max_hold_ms_aborts_the_signal_with_timeout_and_fails_the_attempt(
    storage: gnl.Storage,
) -> None:
    whys: list[str] = []

    async def handler(payload: Any, meta: gnl.EventMeta) -> None:
        err = await meta.signal.wait()
        whys.append(err.why)

    await gnl.emit(storage.work, "t", 1, id="slow")
    c = gnl.create_consumer(storage.work, "t", handler, name="f", max_attempts=1, max_hold_ms=50)
    assert await c.drain() == gnl.DrainResult(1, 0, 1)
    assert whys == ["timeout"]
    assert [d.id for d in await gnl.list_dead_events(storage.work, "t", "f")] == ["slow"]


async def test_start_stop_and_a_second_process_name_waits_for_the_lease(
    storage: gnl.Storage,
) -> None:
    seen, handler = recorder()
    c = gnl.create_consumer(storage.work, "t", handler, name="f", poll_ms=10, lease_ms=3_000)
    c.start()
    await gnl.emit_many(storage.work, "t", [{"payload": i} for i in range(20)])
    for _ in range(300):
        if len(seen) == 20:
            break
        await asyncio.sleep(0.02)
    other_seen, other = recorder()
    c2 = gnl.create_consumer(storage.work, "t", other, name="f", poll_ms=10)
    c2.start()
    await asyncio.sleep(0.2)
    await c.stop()
    assert len(seen) == 20 and [s[1] for s in seen] == list(range(20))
    await gnl.emit(storage.work, "t", 20)
    for _ in range(300):
        if other_seen:
            break
        await asyncio.sleep(0.02)
    await c2.stop()
    assert [s[1] for s in other_seen] == [20]


async def test_emit_many_takes_100000_events_in_one_call(storage: gnl.Storage) -> None:
    n = 100_000
    ids = await gnl.emit_many(storage.work, "big", ({"payload": {"i": i}} for i in range(n)))
    assert len(ids) == n and len(set(ids)) == n
    await gnl.emit(storage.work, "big", 0, id=ids[5])  # the same event: nothing written
    got: list[int] = []

    async def first(payload: Any, meta: gnl.EventMeta) -> None:
        got.append(payload["i"])
        if len(got) == 150:
            await c.stop()  # after this batch (reading 100,000 is not the point)

    c = gnl.create_consumer(storage.work, "big", first, name="f")
    assert await c.drain() == gnl.DrainResult(200, 200, 0)
    assert got[:150] == list(range(150))
    lag = await c.lag()
    assert lag is not None and lag.behind == n - lag.cursor and lag.cursor >= 100


async def test_stop_from_a_handler_or_another_task_ends_the_loop_after_its_batch(
    storage: gnl.Storage,
) -> None:
    await gnl.emit_many(storage.work, "t", [{"payload": i} for i in range(1_000)])
    got: list[int] = []
    stop_at = [10]

    async def handler(payload: Any, meta: gnl.EventMeta) -> None:
        got.append(payload)
        if payload == stop_at[0]:
            await c.stop()  # from inside: returns at once

    c = gnl.create_consumer(storage.work, "t", handler, name="f", poll_ms=10)
    # drain: the batch in hand finishes, its acks are written, drain returns.
    assert await c.drain() == gnl.DrainResult(100, 100, 0)
    lag = await c.lag()
    assert lag is not None and lag.cursor == 100
    # start: a handler's stop() ends the loop after its batch (no deadlock on itself).
    stop_at[0] = 150
    c.start()
    for _ in range(1_500):
        lag = await c.lag()
        if lag is not None and lag.cursor == 200:
            break
        await asyncio.sleep(0.02)
    assert lag is not None and (lag.cursor, lag.behind) == (200, 800), "all 200 accepted"
    await asyncio.wait_for(c.stop(), 30)
    assert got == list(range(200))
    # From another task while drain runs: stop() returns once drain has returned.

    running = asyncio.Event()

    async def slow(payload: Any, meta: gnl.EventMeta) -> None:
        got.append(payload)
        if len(got) == 210:
            running.set()
        await asyncio.sleep(0.002)

    c2 = gnl.create_consumer(storage.work, "t", slow, name="f")
    task = asyncio.get_running_loop().create_task(c2.drain())
    await asyncio.wait_for(running.wait(), 60)
    await asyncio.wait_for(c2.stop(), 30)
    assert task.done()
    r = task.result()
    lag = await c.lag()
    assert lag is not None and lag.cursor == 200 + r.processed == len(got)
    assert r.processed % 100 == 0 and 0 < r.processed < 800


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"topic": ""}, gnl.InvalidArgumentError),
        ({"payload": {"x": {1, 2}}}, TypeError),
        ({"payload": float("nan")}, gnl.InvalidArgumentError),
        ({"id": ""}, gnl.InvalidArgumentError),
        ({"org_id": ""}, gnl.InvalidArgumentError),
        ({"org_id": "a\nb"}, gnl.InvalidArgumentError),
        ({"delay_ms": -1}, gnl.InvalidArgumentError),
        ({"delay_ms": 1, "deliver_at": 5}, gnl.InvalidArgumentError),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_written(
    storage: gnl.Storage, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    args: dict[str, Any] = {"topic": "t", "payload": 1, **kwargs}
    with pytest.raises(error):
        await gnl.emit(storage.work, args.pop("topic"), args.pop("payload"), **args)
    events: list[dict[str, Any]] = [{"payload": 1}, {"payload": args.get("payload", 1)}]
    bad = {
        "payload": kwargs.get("payload", 1),
        **{k: v for k, v in kwargs.items() if k != "topic" and k != "payload"},
    }
    if "topic" not in kwargs:
        with pytest.raises(gnl.InvalidJobError) as e:
            await gnl.emit_many(storage.work, "t", [{"payload": 1}, bad])
        assert e.value.index == 1 and isinstance(e.value.__cause__, error)
    del events
    seen, handler = recorder()
    assert await gnl.create_consumer(
        storage.work, "t", handler, name="f"
    ).drain() == gnl.DrainResult(0, 0, 0)


async def test_arguments_that_are_not_str_are_named(storage: gnl.Storage) -> None:
    # The native calls said only "'int' object is not an instance of 'str'".
    _, handler = recorder()
    w = storage.work
    for call, name in (
        (lambda: gnl.emit(w, 3, {}), "topic"),  # type: ignore[arg-type]
        (lambda: gnl.emit_many(w, None, [{"payload": 1}]), "topic"),  # type: ignore[arg-type]
        (lambda: gnl.list_dead_events(w, 3, "c"), "topic"),  # type: ignore[arg-type]
        (lambda: gnl.consumer_lag(w, "t", 5), "consumer"),  # type: ignore[arg-type]
        (lambda: gnl.retry_dead_event(w, "t", "c", 7), "id"),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match=f"^{name} must be a str, not "):
            await call()
    with pytest.raises(TypeError, match="^topic must be a str, not int"):
        gnl.create_consumer(w, 3, handler, name="c")  # type: ignore[arg-type]
    # An empty id names no event: said so, not "use None for a generated id".
    with pytest.raises(gnl.InvalidArgumentError, match="no event has an empty id"):
        await gnl.retry_dead_event(w, "t", "c", "")


async def test_create_consumer_checks_its_options(storage: gnl.Storage) -> None:
    _, handler = recorder()
    with pytest.raises(gnl.InvalidArgumentError):
        gnl.create_consumer(storage.work, "t", handler, name="")
    with pytest.raises(gnl.InvalidArgumentError):
        gnl.create_consumer(storage.work, "t", handler, name="f", max_attempts=0)
    with pytest.raises(TypeError):
        gnl.create_consumer(storage.work, "t", handler, name="f", max_attempts="3")  # type: ignore[arg-type]
    with pytest.raises(gnl.InvalidArgumentError):
        gnl.create_consumer(storage.work, "t", handler, name="f", lease_ms=0)
    with pytest.raises(gnl.InvalidJobError) as e:
        await gnl.emit_many(storage.work, "t", [{"payload": 1}, {"payload": 2, "orgId": "x"}])
    assert e.value.index == 1


def _deep(payload: Any) -> Any:
    return payload["missing"]


async def test_a_consumer_handlers_traceback_is_logged_at_debug(
    storage: gnl.Storage, caplog: pytest.LogCaptureFixture
) -> None:
    async def h(payload: Any, meta: gnl.EventMeta) -> None:
        _deep(payload)

    await gnl.emit(storage.work, "t", {}, id="e1")
    c = gnl.create_consumer(storage.work, "t", h, name="tb", max_attempts=1, retry_delay_ms=0)
    with caplog.at_level(logging.DEBUG, logger="gnl"):
        await c.drain()
    (rec,) = [r for r in caplog.records if "attempt 1 raised" in r.getMessage()]
    assert rec.levelno == logging.DEBUG and "event 'e1'" in rec.getMessage()
    assert rec.exc_text is not None and "in _deep" in rec.exc_text and "KeyError" in rec.exc_text
