"""API.md "Queue": get_job, list_jobs, list_all_jobs, cursors and snapshots."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gnl
from _support import noop


async def pages(
    fn: Callable[..., Any], work: gnl.Storage, limit: int, **filters: Any
) -> list[list[gnl.JobInfo]]:
    out: list[list[gnl.JobInfo]] = []
    cursor = None
    while True:
        page = await fn(work, limit=limit, cursor=cursor, **filters)
        assert isinstance(page, gnl.Page)
        out.append(page.items)
        if page.next_cursor is None:
            return out
        assert page.items, "a page with a next cursor must not be empty"
        cursor = page.next_cursor


def ids(jobs: list[gnl.JobInfo]) -> list[str]:
    return [j.id for j in jobs]


async def test_get_job_unknown_is_none(storage: gnl.Storage) -> None:
    assert await gnl.get_job(storage, "nope") is None
    assert await gnl.get_job(storage, "nope", org_id="acme") is None


async def test_get_job_wrong_types(storage: gnl.Storage) -> None:
    with pytest.raises(TypeError):
        await gnl.get_job(storage, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await gnl.get_job(storage, "x", org_id=5)  # type: ignore[arg-type]


async def test_list_jobs_without_org_lists_only_no_org_jobs(storage: gnl.Storage) -> None:
    none_ids = [await gnl.enqueue(storage, "t", i) for i in range(3)]
    await gnl.enqueue(storage, "t", "a", org_id="acme")
    none_ids.append(await gnl.enqueue(storage, "t", 3))
    page = await gnl.list_jobs(storage.work)
    assert ids(page.items) == none_ids
    assert page.next_cursor is None
    assert all(j.org_id is None for j in page.items)
    acme = await gnl.list_jobs(storage.work, org_id="acme")
    assert [j.payload for j in acme.items] == ["a"]
    assert (await gnl.list_jobs(storage.work, org_id="nobody")).items == []


async def test_list_jobs_in_enqueue_order_not_id_order(storage: gnl.Storage) -> None:
    order = ["z", "a", "m", "b"]
    for job_id in order:
        await gnl.enqueue(storage, "t", None, id=job_id, org_id="acme")
    await gnl.enqueue(storage, "t", None, id="c", org_id="acme", delay_ms=60_000)
    assert ids((await gnl.list_jobs(storage, org_id="acme")).items) == [*order, "c"]


async def test_state_and_type_filters(storage: gnl.Storage) -> None:
    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        if payload == "fail":
            raise RuntimeError("x")

    a = await gnl.enqueue(storage, "alpha", "ok", org_id="o")
    b = await gnl.enqueue(storage, "beta", "fail", org_id="o")
    c = await gnl.enqueue(storage, "alpha", "ok", org_id="o")
    await gnl.create_worker(storage, {"alpha": handler, "beta": handler}, max_attempts=1).drain()
    d = await gnl.enqueue(storage, "alpha", "later", org_id="o")
    e = await gnl.enqueue(storage, "beta", "later", org_id="o")
    await gnl.cancel_job(storage, e, org_id="o")

    async def listed(**f: Any) -> list[str]:
        return ids((await gnl.list_jobs(storage, org_id="o", **f)).items)

    assert await listed() == [a, b, c, d, e]
    assert await listed(state="done") == [a, c]
    assert await listed(state="dead") == [b]
    assert await listed(state="pending") == [d]
    assert await listed(state="canceled") == [e]
    assert await listed(state="running") == []
    assert await listed(type="alpha") == [a, c, d]
    assert await listed(type="beta", state="canceled") == [e]
    assert await listed(type="gamma") == []
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.list_jobs(storage, state="finished")


async def test_pagination_visits_each_job_once_in_order(storage: gnl.Storage) -> None:
    expected = await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(23)])
    await gnl.enqueue_many(
        storage, [{"type": "t", "payload": i, "options": {"org_id": "x"}} for i in range(5)]
    )
    for limit in (1, 2, 5, 7, 22, 23, 24, 100):
        got = await pages(gnl.list_jobs, storage, limit)
        assert [len(p) for p in got[:-1]] == [limit] * (len(got) - 1)
        assert ids([j for p in got for j in p]) == expected, limit
    # Filters carry over the pages.
    got = await pages(gnl.list_jobs, storage, 2, org_id="x", type="t", state="pending")
    assert [j.payload for p in got for j in p] == [0, 1, 2, 3, 4]


async def test_list_all_jobs_order(storage: gnl.Storage) -> None:
    created: dict[str | None, list[str]] = {}
    for org in ("charlie", None, "alpha", "Bravo", "alpha", None, "charlie", "bravo", "ä", "alpha"):
        created.setdefault(org, []).append(await gnl.enqueue(storage, "t", org, org_id=org))
    expected = list(created[None])
    for org in sorted(o for o in created if o is not None):
        expected += created[org]
    for limit in (1, 3, 100):
        everything = [j for p in await pages(gnl.list_all_jobs, storage, limit) for j in p]
        assert ids(everything) == expected, limit
        assert [j.payload for j in everything] == [j.org_id for j in everything]


async def test_list_all_jobs_same_id_in_many_orgs(storage: gnl.Storage) -> None:
    for org in ("b", None, "a"):
        await gnl.enqueue(storage, "t", org, id="same", org_id=org)
    everything = [j for p in await pages(gnl.list_all_jobs, storage, 1) for j in p]
    assert [(j.org_id, j.id) for j in everything] == [(None, "same"), ("a", "same"), ("b", "same")]


async def test_snapshot_excludes_jobs_enqueued_during_a_listing(storage: gnl.Storage) -> None:
    first = await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(6)])
    page = await gnl.list_jobs(storage, limit=2)
    listed = ids(page.items)
    all_page = await gnl.list_all_jobs(storage, limit=2)
    all_listed = ids(all_page.items)
    late = [await gnl.enqueue(storage, "t", "late") for _ in range(3)]
    late.append(await gnl.enqueue(storage, "t", "late", org_id="zzz"))
    cursor, all_cursor = page.next_cursor, all_page.next_cursor
    while cursor:
        page = await gnl.list_jobs(storage, limit=2, cursor=cursor)
        listed += ids(page.items)
        cursor = page.next_cursor
        await gnl.enqueue(storage, "t", "later still")
    while all_cursor:
        all_page = await gnl.list_all_jobs(storage, limit=2, cursor=all_cursor)
        all_listed += ids(all_page.items)
        all_cursor = all_page.next_cursor
    assert listed == first
    assert all_listed == first
    # The next listing includes them.
    fresh = ids((await gnl.list_jobs(storage, limit=100)).items)
    assert fresh[: len(first) + 3] == first + late[:3]


async def test_a_listing_sees_state_changes_of_its_jobs(storage: gnl.Storage) -> None:
    ids_ = await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(4)])
    page = await gnl.list_jobs(storage, limit=2)
    await gnl.create_worker(storage, {"t": noop}).drain()
    assert page.next_cursor is not None
    rest = await gnl.list_jobs(storage, limit=2, cursor=page.next_cursor)
    assert ids(page.items + rest.items) == ids_
    assert [j.state for j in rest.items] == ["done", "done"]


async def _cursor_of(storage: gnl.Storage, fn: Any, **filters: Any) -> str:
    page = await fn(storage, limit=1, **filters)
    assert page.next_cursor is not None
    return str(page.next_cursor)


async def test_cursor_only_valid_for_its_function_and_filters(storage: gnl.Storage) -> None:
    await gnl.enqueue_many(
        storage,
        [
            {"type": "t", "payload": i, "options": {"org_id": o}}
            for i in range(3)
            for o in (None, "acme")
        ],
    )
    lane = await _cursor_of(storage, gnl.list_jobs)
    acme = await _cursor_of(storage, gnl.list_jobs, org_id="acme")
    typed = await _cursor_of(storage, gnl.list_jobs, org_id="acme", type="t")
    pending = await _cursor_of(storage, gnl.list_jobs, org_id="acme", state="pending")
    every = await _cursor_of(storage, gnl.list_all_jobs)

    bad_uses: list[tuple[Any, str, dict[str, Any]]] = [
        (gnl.list_all_jobs, lane, {}),
        (gnl.list_jobs, every, {}),
        (gnl.list_jobs, lane, {"org_id": "acme"}),
        (gnl.list_jobs, acme, {}),
        (gnl.list_jobs, acme, {"org_id": "other"}),
        (gnl.list_jobs, acme, {"org_id": "acme", "type": "t"}),
        (gnl.list_jobs, typed, {"org_id": "acme"}),
        (gnl.list_jobs, typed, {"org_id": "acme", "type": "u"}),
        (gnl.list_jobs, pending, {"org_id": "acme", "state": "done"}),
        (gnl.list_jobs, pending, {"org_id": "acme"}),
    ]
    for fn, cursor, filters in bad_uses:
        with pytest.raises(gnl.InvalidArgumentError):
            await fn(storage, cursor=cursor, **filters)
    # Each works with what it came from.
    assert (await gnl.list_jobs(storage, cursor=lane)).items
    assert (await gnl.list_jobs(storage, org_id="acme", cursor=acme)).items
    assert (await gnl.list_jobs(storage, org_id="acme", type="t", cursor=typed)).items
    assert (await gnl.list_jobs(storage, org_id="acme", state="pending", cursor=pending)).items
    assert (await gnl.list_all_jobs(storage, cursor=every)).items
    # A different page size is fine.
    assert len((await gnl.list_jobs(storage, cursor=lane, limit=100)).items) == 2


@pytest.mark.parametrize(
    "garble",
    [
        lambda c: "",
        lambda c: "garbage",
        lambda c: c[:-3],
        lambda c: c[: len(c) // 2],
        lambda c: c + "AAAA",
        lambda c: c[:-2] + ("A" if c[-2] != "A" else "B") + c[-1],
        lambda c: c.upper(),
        lambda c: "!!" + c,
        lambda c: c[::-1],
    ],
)
async def test_garbled_cursor_is_refused(
    storage: gnl.Storage, garble: Callable[[str], str]
) -> None:
    await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(3)])
    cursor = await _cursor_of(storage, gnl.list_jobs)
    bad = garble(cursor)
    assert bad != cursor
    for fn in (gnl.list_jobs, gnl.list_all_jobs):
        with pytest.raises(gnl.InvalidArgumentError):
            await fn(storage, cursor=bad)


async def test_limit_below_one_is_refused(storage: gnl.Storage) -> None:
    for limit in (0, -1):
        for fn in (gnl.list_jobs, gnl.list_all_jobs):
            with pytest.raises(gnl.InvalidArgumentError):
                await fn(storage, limit=limit)
    for bad in ("5", 2.0, None):
        with pytest.raises(TypeError):
            await gnl.list_jobs(storage, limit=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await gnl.list_jobs(storage, cursor=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# property: a listing is its snapshot, once each, in order, whatever is enqueued meanwhile

ORGS = [None, "a", "b", "c"]

enqueue_step = st.lists(
    st.tuples(st.sampled_from(ORGS), st.sampled_from([None, "k1", "k2", "k3"])), max_size=4
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    initial=st.lists(
        st.tuples(st.sampled_from(ORGS), st.sampled_from([None, "k1", "k2"])), max_size=25
    ),
    limits=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    between=st.lists(enqueue_step, max_size=30),
    scope=st.sampled_from(["all", *ORGS]),
)
def test_listing_is_its_snapshot(
    store_url: Callable[[], str],
    initial: list[tuple[str | None, str | None]],
    limits: list[int],
    between: list[list[tuple[str | None, str | None]]],
    scope: str | None,
) -> None:
    # The model: each (org, id) once, in enqueue order, built from what enqueue returned.
    model: list[tuple[str | None, str]] = []

    async def enqueue(storage: gnl.Storage, org: str | None, job_id: str | None) -> None:
        got = await gnl.enqueue(storage, "t", None, org_id=org, id=job_id)
        if job_id is not None:
            assert got == job_id
        if (org, got) not in model:
            model.append((org, got))

    async def run() -> None:
        async with await gnl.connect(store_url()) as storage:
            for org, job_id in initial:
                await enqueue(storage, org, job_id)
            snapshot = list(model)
            if scope == "all":
                expected = [k for k in snapshot if k[0] is None]
                for org in sorted({k[0] for k in snapshot if k[0] is not None}):
                    expected += [k for k in snapshot if k[0] == org]
            else:
                expected = [k for k in snapshot if k[0] == scope]
            seen: list[tuple[str | None, str]] = []
            cursor = None
            step = 0
            while True:
                limit = limits[step % len(limits)]
                if scope == "all":
                    page = await gnl.list_all_jobs(storage, limit=limit, cursor=cursor)
                else:
                    page = await gnl.list_jobs(storage, org_id=scope, limit=limit, cursor=cursor)
                assert len(page.items) <= limit
                seen += [(j.org_id, j.id) for j in page.items]
                if page.next_cursor is None:
                    break
                assert len(page.items) == limit
                cursor = page.next_cursor
                for org, job_id in between[step] if step < len(between) else []:
                    await enqueue(storage, org, job_id)
                step += 1
            assert seen == expected
            # A new listing has every job, the late ones included.
            if scope == "all":
                final = [
                    (j.org_id, j.id) for p in await pages(gnl.list_all_jobs, storage, 50) for j in p
                ]
                assert sorted(final, key=repr) == sorted(model, key=repr)

    asyncio.run(run())
