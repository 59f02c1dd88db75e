"""API.md "Queue" fairness: each organization is a lane; a claim serves the lane that has waited
longest, so a big organization cannot starve small ones."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import gnl
from _support import noop


async def _claim_order(storage: gnl.Storage, concurrency: int = 1) -> list[str | None]:
    order: list[str | None] = []

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        order.append(ctx.org_id)

    result = await gnl.create_worker(storage, {"t": handler}, concurrency=concurrency).drain()
    assert result.processed == len(order)
    return order


def _big(org: str, n: int) -> list[dict[str, Any]]:
    return [{"type": "t", "payload": i, "options": {"org_id": org}} for i in range(n)]


@pytest.mark.parametrize("small_first", [False, True], ids=["big-first", "small-first"])
async def test_small_lanes_are_not_starved(storage: gnl.Storage, small_first: bool) -> None:
    small = [
        *_big("bravo", 2),
        *_big("charlie", 2),
        {"type": "t", "payload": 0},
        {"type": "t", "payload": 1},
    ]
    if small_first:
        await gnl.enqueue_many(storage, small)
        await gnl.enqueue_many(storage, _big("alpha", 100))
    else:
        await gnl.enqueue_many(storage, _big("alpha", 100))
        await gnl.enqueue_many(storage, small)
    order = await _claim_order(storage)
    assert len(order) == 106
    # Four lanes in turn: every small lane's 2 jobs are done within the first 2 rounds.
    last_small = max(i for i, org in enumerate(order) if org != "alpha")
    assert last_small < 10, order[:20]
    assert order[10:] == ["alpha"] * 96


async def test_lanes_take_turns_when_many_jobs_each(storage: gnl.Storage) -> None:
    # Separate enqueue calls, so the lanes' first jobs are not created in one instant.
    for org in ("a", "b", "c"):
        await gnl.enqueue_many(storage, _big(org, 30))
        await asyncio.sleep(0.002)
    order = await _claim_order(storage)
    assert len(order) == 90
    # Round robin: in every window of 6 claims each lane appears twice.
    for start in range(0, 90, 6):
        window = order[start : start + 6]
        assert sorted(window, key=str) == ["a", "a", "b", "b", "c", "c"], (start, order)


async def test_a_lane_that_arrives_later_is_served_next(storage: gnl.Storage) -> None:
    order: list[str | None] = []
    late_added = False

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        nonlocal late_added
        order.append(ctx.org_id)
        if len(order) == 20 and not late_added:
            late_added = True
            await gnl.enqueue(storage, "t", None, org_id="late")

    await gnl.enqueue_many(storage, _big("big", 50))
    await gnl.create_worker(storage, {"t": handler}).drain()
    assert order.index("late") <= 21, order


async def test_batch_claims_take_lanes_in_turn(storage: gnl.Storage) -> None:
    batches: list[list[str | None]] = []
    current: list[str | None] = []
    gate = asyncio.Event()

    await gnl.enqueue_many(storage, _big("alpha", 20))
    await gnl.enqueue_many(storage, [*_big("bravo", 5), *_big("charlie", 5)])

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        current.append(ctx.org_id)
        if len(current) == 3:
            batches.append(sorted(current, key=str))
            gate.set()
        await gate.wait()

    worker = gnl.create_worker(storage, {"t": handler}, concurrency=3, poll_ms=10)
    async with worker:
        await asyncio.wait_for(gate.wait(), 5)
    # The first batch of 3 takes one job from each lane, not 3 of alpha's.
    assert batches[0] == ["alpha", "bravo", "charlie"]


async def test_an_empty_poll_costs_the_same_with_many_lanes(storage: gnl.Storage) -> None:
    async def polls_in(seconds: float) -> int:
        worker = gnl.create_worker(storage, {"t": noop}, poll_ms=20, max_poll_ms=20)
        c0 = storage.query_count
        worker.start()
        await asyncio.sleep(seconds)
        await worker.stop()
        return storage.query_count - c0

    few = await polls_in(0.5)
    # 500 lanes, all with only finished/delayed work: nothing is due.
    await gnl.enqueue_many(
        storage,
        [
            {"type": "t", "payload": i, "options": {"org_id": f"org{i}", "delay_ms": 600_000}}
            for i in range(500)
        ],
    )
    many = await polls_in(0.5)
    assert many <= few * 1.5 + 3, (few, many)


async def test_one_worker_keeps_the_shares_through_the_drain(storage: gnl.Storage) -> None:
    # Short handlers at C=10 over 50 organizations, 240 jobs each: at every tenth of the
    # drain each organization has had its share within 4 (the bound of the suite test
    # `concurrent_claims_serve_the_lanes_in_turn`, DECISIONS "Fairness under concurrent
    # claims"), and the deviation does not grow with the drain. On Postgres the worker keeps
    # a second claim in flight here; before migration 0009 two claims in flight drew equal
    # tickets and the same organizations won every tie (125 of 120 at half-way, growing).
    orgs, each = 50, 240
    for i in range(orgs):
        await gnl.enqueue_many(storage, _big(f"o{i}", each))
    order = await _claim_order(storage, concurrency=10)
    assert len(order) == orgs * each
    for tenth in range(1, 10):
        cut = order[: orgs * each * tenth // 10]
        counts = {org: cut.count(org) for org in set(order)}
        fair = len(cut) / orgs
        assert len(counts) == orgs
        assert all(abs(n - fair) <= 4 for n in counts.values()), (tenth, sorted(counts.items()))
