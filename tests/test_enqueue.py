"""API.md "Queue" / "Conventions": enqueue, its checks, and that a refused call writes nothing."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gnl
from _support import all_jobs, job_count, noop


async def assert_nothing_written(storage: gnl.Storage, before: list[gnl.JobInfo]) -> None:
    assert await all_jobs(storage) == before


# --------------------------------------------------------------------------------------------
# ids


async def test_returns_generated_time_ordered_ids(storage: gnl.Storage) -> None:
    ids = []
    for i in range(30):
        ids.append(await gnl.enqueue(storage.work, "t", i))
        if i % 10 == 0:
            await asyncio.sleep(0.002)
    assert all(isinstance(i, str) and i for i in ids)
    assert len(set(ids)) == len(ids)
    # Sorting the ids gives the creation order.
    assert sorted(ids) == ids
    jobs = {j.id: j for j in await all_jobs(storage)}
    assert [jobs[i].payload for i in ids] == list(range(30))


async def test_enqueue_many_generated_ids_are_time_ordered(storage: gnl.Storage) -> None:
    ids = await gnl.enqueue_many(storage, [{"type": "t", "payload": i} for i in range(2000)])
    assert len(set(ids)) == 2000
    assert sorted(ids) == ids
    later = await gnl.enqueue(storage, "t", None)
    assert later > ids[-1]


async def test_same_id_is_the_same_job_and_writes_nothing(storage: gnl.Storage) -> None:
    first = await gnl.enqueue(storage.work, "reindex", {"v": 1}, id="doc-1")
    assert first == "doc-1"
    before = await all_jobs(storage)
    await asyncio.sleep(0.01)
    again = await gnl.enqueue(storage.work, "other-type", {"v": 2}, id="doc-1", delay_ms=50_000)
    assert again == "doc-1"
    assert await all_jobs(storage) == before  # payload, type, run_at, updated_at unchanged
    job = await gnl.get_job(storage.work, "doc-1")
    assert job is not None
    assert (job.type, job.payload, job.state) == ("reindex", {"v": 1}, "pending")


async def test_same_id_in_any_state_is_the_same_job(storage: gnl.Storage) -> None:
    await gnl.enqueue(storage, "t", 1, id="a")
    await gnl.create_worker(storage, {"t": noop}).drain()
    done = await gnl.get_job(storage, "a")
    assert done is not None and done.state == "done"
    assert await gnl.enqueue(storage, "t", 2, id="a") == "a"
    assert await gnl.get_job(storage, "a") == done
    await gnl.enqueue(storage, "t", 3, id="b")
    assert await gnl.cancel_job(storage, "b")
    canceled = await gnl.get_job(storage, "b")
    assert await gnl.enqueue(storage, "t", 4, id="b") == "b"
    assert await gnl.get_job(storage, "b") == canceled


async def test_ids_are_scoped_per_organization(storage: gnl.Storage) -> None:
    w = storage.work
    assert await gnl.enqueue(w, "t", "none", id="x") == "x"
    assert await gnl.enqueue(w, "t", "acme", id="x", org_id="acme") == "x"
    assert await gnl.enqueue(w, "t", "globex", id="x", org_id="globex") == "x"
    assert await job_count(w) == 3
    for org, payload in ((None, "none"), ("acme", "acme"), ("globex", "globex")):
        job = await gnl.get_job(w, "x", org_id=org)
        assert job is not None
        assert (job.org_id, job.payload) == (org, payload)
    assert await gnl.get_job(w, "x", org_id="initech") is None
    # Re-enqueueing in one scope touches only that scope.
    assert await gnl.enqueue(w, "t", "again", id="x", org_id="acme") == "x"
    assert await job_count(w) == 3
    # retry/cancel address the job of their org only.
    assert await gnl.cancel_job(w, "x", org_id="acme")
    states = {j.org_id: j.state for j in await all_jobs(w)}
    assert states == {None: "pending", "acme": "canceled", "globex": "pending"}


async def test_job_info_fields_after_enqueue(storage: gnl.Storage) -> None:
    t0 = await storage.now_ms()
    job_id = await gnl.enqueue(storage.work, "reindex", {"docId": "d-9"}, org_id="acme")
    t1 = await storage.now_ms()
    job = await gnl.get_job(storage.work, job_id, org_id="acme")
    assert isinstance(job, gnl.JobInfo)
    assert job.id == job_id and job.type == "reindex" and job.org_id == "acme"
    assert job.payload == {"docId": "d-9"}
    assert job.state == "pending" and job.attempts == 0
    assert job.last_error is None and job.result is None and job.finished_at is None
    assert t0 <= job.created_at <= t1
    assert job.run_at == job.created_at  # not delayed: due at creation
    assert job.updated_at == job.created_at
    with pytest.raises(AttributeError):
        job.state = "done"  # type: ignore[misc]  # frozen


# --------------------------------------------------------------------------------------------
# run_at / delay_ms


async def test_run_at_int_defers_the_job(storage: gnl.Storage) -> None:
    due = await storage.now_ms() + 400
    job_id = await gnl.enqueue(storage.work, "t", None, run_at=due)
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None and job.run_at == due
    worker = gnl.create_worker(storage, {"t": noop})
    assert (await worker.drain()).processed == 0
    await asyncio.sleep(max(0, due - await storage.now_ms()) / 1000 + 0.05)
    assert (await worker.drain()).processed == 1


@pytest.mark.parametrize("tz", [timezone.utc, timezone(timedelta(hours=5, minutes=30))])
async def test_run_at_aware_datetime(storage: gnl.Storage, tz: timezone) -> None:
    when = datetime.now(tz) + timedelta(hours=1)
    job_id = await gnl.enqueue(storage.work, "t", None, run_at=when)
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None
    assert abs(job.run_at - when.timestamp() * 1000) <= 1
    assert (await gnl.create_worker(storage, {"t": noop}).drain()).processed == 0


async def test_run_at_in_the_past_is_due_now(storage: gnl.Storage) -> None:
    await gnl.enqueue(storage, "t", None, run_at=datetime(2001, 1, 1, tzinfo=timezone.utc))
    await gnl.enqueue(storage, "t", None, run_at=0)
    assert (await gnl.create_worker(storage, {"t": noop}).drain()).processed == 2


async def test_naive_datetime_is_refused(storage: gnl.Storage) -> None:
    with pytest.raises(gnl.InvalidArgumentError) as info:
        await gnl.enqueue(storage.work, "t", None, run_at=datetime.now() + timedelta(hours=1))
    assert isinstance(info.value, ValueError)
    assert await job_count(storage) == 0


async def test_delay_ms(storage: gnl.Storage) -> None:
    job_id = await gnl.enqueue(storage.work, "t", None, delay_ms=300)
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None
    assert 300 <= job.run_at - job.created_at <= 310
    worker = gnl.create_worker(storage, {"t": noop})
    assert (await worker.drain()).processed == 0
    await asyncio.sleep(0.35)
    assert (await worker.drain()).processed == 1
    zero = await gnl.enqueue(storage.work, "t", None, delay_ms=0)
    assert (await worker.drain()).processed == 1
    job = await gnl.get_job(storage.work, zero)
    assert job is not None and job.state == "done"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"run_at": 10_000, "delay_ms": 5},
        {"delay_ms": -1},
        {"run_at": datetime(2020, 1, 1)},
        {"org_id": ""},
        {"org_id": "x" * 201},
        {"org_id": "a\nb"},
        {"org_id": "a\x00b"},
        {"org_id": "tab\there"},
        {"org_id": "del\x7f"},
        {"id": ""},
    ],
)
async def test_bad_values_raise_invalid_argument_and_write_nothing(
    storage: gnl.Storage, kwargs: dict[str, Any]
) -> None:
    await gnl.enqueue(storage, "t", "existing", id="keep")
    before = await all_jobs(storage)
    with pytest.raises(gnl.InvalidArgumentError) as info:
        await gnl.enqueue(storage.work, "t", {"a": 1}, **kwargs)
    assert isinstance(info.value, ValueError)
    await assert_nothing_written(storage, before)


async def test_a_value_past_64_bits_is_named_with_the_value(storage: gnl.Storage) -> None:
    # Past 64 bits is past the limit too: the message says the limit (about ten years), as
    # for 2**62, not only that the value does not fit an integer.
    with pytest.raises(
        gnl.InvalidArgumentError, match=r"delay_ms must be at most .*ten years.*10{20}"
    ):
        await gnl.enqueue(storage.work, "t", None, delay_ms=10**20)
    with pytest.raises(gnl.InvalidArgumentError, match=r"delay_ms must be >= 0 ms, got -10{20}"):
        await gnl.enqueue(storage.work, "t", None, delay_ms=-(10**20))
    assert await job_count(storage) == 0


async def test_an_empty_job_id_is_refused_by_lookups_too(storage: gnl.Storage) -> None:
    # enqueue refuses an empty id, so no job has one: a lookup by "" is a mistake (it
    # returned None / False as if the job were merely missing).
    await gnl.enqueue(storage.work, "t", None, id="keep")
    before = await all_jobs(storage)
    for call in (gnl.get_job, gnl.retry_job, gnl.cancel_job):
        with pytest.raises(gnl.InvalidArgumentError, match="job_id must be a non-empty string"):
            await call(storage.work, "")
    await assert_nothing_written(storage, before)


async def test_an_empty_cancel_reason_is_refused(storage: gnl.Storage) -> None:
    job_id = await gnl.enqueue(storage.work, "t", None)
    with pytest.raises(gnl.InvalidArgumentError, match="reason must be a non-empty string"):
        await gnl.cancel_job(storage.work, job_id, None, "")
    with pytest.raises(gnl.InvalidArgumentError, match="10001 characters long; at most 10000"):
        await gnl.cancel_job(storage.work, job_id, None, "x" * 10_001)
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None and job.state == "pending"
    assert await gnl.cancel_job(storage.work, job_id)
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None and job.last_error == "canceled: cancel_job was called"


async def test_empty_type_is_a_bad_value(storage: gnl.Storage) -> None:
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.enqueue(storage.work, "", None)
    assert await job_count(storage) == 0


async def test_org_id_limits(storage: gnl.Storage) -> None:
    for org in ("x" * 200, "é" * 200, "acme corp/eu-1", "日本"):
        job_id = await gnl.enqueue(storage.work, "t", org, org_id=org)
        job = await gnl.get_job(storage.work, job_id, org_id=org)
        assert job is not None and job.org_id == org and job.payload == org


# --------------------------------------------------------------------------------------------
# max_depth


async def test_max_depth(storage: gnl.Storage) -> None:
    w = storage.work
    for _ in range(3):
        await gnl.enqueue(w, "t", None, org_id="acme", max_depth=3)
    before = await all_jobs(w)
    with pytest.raises(gnl.QueueFullError) as info:
        await gnl.enqueue(w, "t", "too many", org_id="acme", max_depth=3)
    assert isinstance(info.value, gnl.GnlError)
    await assert_nothing_written(storage, before)
    # Another organization's lane, and the no-organization lane, have their own depth.
    await gnl.enqueue(w, "t", None, org_id="globex", max_depth=1)
    await gnl.enqueue(w, "t", None, max_depth=1)
    with pytest.raises(gnl.QueueFullError):
        await gnl.enqueue(w, "t", None, max_depth=1)
    assert await job_count(w) == 5
    # A higher limit lets it in.
    await gnl.enqueue(w, "t", None, org_id="acme", max_depth=4)
    assert len((await gnl.list_jobs(w, org_id="acme")).items) == 4


async def test_max_depth_counts_pending_jobs_only(storage: gnl.Storage) -> None:
    for _ in range(3):
        await gnl.enqueue(storage, "t", None, org_id="acme")
    assert (await gnl.create_worker(storage, {"t": noop}).drain()).processed == 3
    await gnl.enqueue(storage, "t", None, org_id="acme", max_depth=1)
    with pytest.raises(gnl.QueueFullError):
        await gnl.enqueue(storage, "t", None, org_id="acme", max_depth=1)


# --------------------------------------------------------------------------------------------
# payloads


@pytest.mark.parametrize(
    "payload",
    [
        (1, 2),
        {1, 2},
        frozenset([1]),
        b"bytes",
        bytearray(b"x"),
        object(),
        Decimal("1.5"),
        datetime(2020, 1, 1, tzinfo=timezone.utc),
        {"nested": [1, (2, 3)]},
        {"deep": {"deeper": {"x"}}},
        [b"x"],
        {1: "int key"},
        {"ok": {("tuple",): 1}},
        {None: 1},
        1j,
    ],
    ids=repr,
)
async def test_non_json_payload_is_a_type_error(storage: gnl.Storage, payload: Any) -> None:
    with pytest.raises(TypeError) as info:
        await gnl.enqueue(storage.work, "t", payload)
    assert not isinstance(info.value, gnl.GnlError)
    assert await job_count(storage) == 0


async def test_too_deep_or_self_referencing_payloads_are_bad_values_said_briefly(
    storage: gnl.Storage,
) -> None:
    deep: Any = []
    for _ in range(3_000):
        deep = [deep]
    itself: list[Any] = []
    itself.append(itself)
    for payload in (deep, itself):
        with pytest.raises(gnl.InvalidArgumentError) as info:
            await gnl.enqueue(storage.work, "t", payload)
        msg = str(info.value)
        assert msg.startswith("payload[0][0]") and "nested deeper than 256" in msg, msg
        assert len(msg) < 200, msg
    # A wrong type deep down: the path is cut in its middle, the type still named.
    wrong: Any = {"x": b"bytes"}
    for _ in range(200):
        wrong = [wrong]
    with pytest.raises(TypeError) as type_info:
        await gnl.enqueue(storage.work, "t", wrong)
    msg = str(type_info.value)
    assert msg.startswith("payload[0]") and "[0].x is of type bytes" in msg, msg
    assert len(msg) < 200, msg
    assert await job_count(storage) == 0


@pytest.mark.parametrize(
    "payload",
    [math.nan, math.inf, -math.inf, {"x": math.nan}, [1.0, [math.inf]], {"a": {"b": -math.inf}}],
    ids=repr,
)
async def test_nan_and_infinity_are_bad_values(storage: gnl.Storage, payload: Any) -> None:
    with pytest.raises(gnl.InvalidArgumentError) as info:
        await gnl.enqueue(storage.work, "t", payload)
    assert isinstance(info.value, ValueError)
    assert await job_count(storage) == 0


@pytest.mark.parametrize(
    "payload",
    [
        None,
        True,
        False,
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64,
        -(2**100),
        10**40,
        0.1,
        -0.0,
        1e-300,
        1.7976931348623157e308,
        "",
        "héllo wörld 🌍 日本語",
        'quotes " and \\ backslash \n newline \t tab',
        "\u2028\u2029",
        [],
        {},
        [1, "a", None, True, 2.5, [], {}],
        {"a": {"b": {"c": [1, {"d": [None]}]}}, "e": []},
        {"ключ": "значение", "emoji 🎉": ["✓"]},
        list(range(1000)),
    ],
    ids=repr,
)
async def test_json_payloads_round_trip(storage: gnl.Storage, payload: Any) -> None:
    job_id = await gnl.enqueue(storage.work, "t", payload)
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None
    assert job.payload == payload
    assert type(job.payload) is type(payload)


async def test_nul_character_in_a_string_round_trips(storage: gnl.Storage) -> None:
    payload = {"s": "a\x00b", "k\x00": 1}
    job_id = await gnl.enqueue(storage.work, "t", payload)
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None and job.payload == payload


async def test_payload_reaches_the_handler_unchanged(storage: gnl.Storage) -> None:
    payload = {"big": 2**80, "f": 0.1, "u": "ü🌍", "l": [None, True, {"x": []}]}
    seen = []

    async def handler(p: Any, ctx: gnl.JobContext) -> None:
        seen.append(p)

    await gnl.enqueue(storage, "t", payload)
    await gnl.create_worker(storage, {"t": handler}).drain()
    assert seen == [payload]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=st.lists(json_values, min_size=1, max_size=8))
def test_any_json_value_round_trips(store_url: Callable[[], str], values: list[Any]) -> None:
    async def run() -> None:
        async with await gnl.connect(store_url()) as storage:
            ids = await gnl.enqueue_many(storage, [{"type": "t", "payload": v} for v in values])
            for job_id, value in zip(ids, values, strict=True):
                single = await gnl.enqueue(storage, "t", value)
                for i in (job_id, single):
                    job = await gnl.get_job(storage, i)
                    assert job is not None
                    assert job.payload == value

    asyncio.run(run())


# --------------------------------------------------------------------------------------------
# wrong types


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((1, None), {}),
        ((None, None), {}),
        ((b"t", None), {}),
        (("t", None), {"id": 1}),
        (("t", None), {"id": b"x"}),
        (("t", None), {"org_id": 1}),
        (("t", None), {"delay_ms": "5"}),
        (("t", None), {"delay_ms": True}),
        (("t", None), {"delay_ms": 5.0}),
        (("t", None), {"run_at": "2030-01-01T00:00:00Z"}),
        (("t", None), {"run_at": 1.5e12}),
        (("t", None), {"run_at": True}),
        (("t", None), {"max_depth": "3"}),
        (("t", None), {"max_depth": 3.0}),
    ],
    ids=repr,
)
async def test_wrong_argument_types_raise_type_error(
    storage: gnl.Storage, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(TypeError) as info:
        await gnl.enqueue(storage.work, *args, **kwargs)
    assert not isinstance(info.value, gnl.GnlError)
    assert await job_count(storage) == 0


@pytest.mark.parametrize("work", [None, "sqlite::memory:", object()], ids=repr)
async def test_not_a_store_is_a_type_error(work: Any) -> None:
    with pytest.raises(TypeError):
        await gnl.enqueue(work, "t", None)


async def test_journal_is_not_a_work_store(storage: gnl.Storage) -> None:
    with pytest.raises(TypeError):
        await gnl.enqueue(storage.journal, "t", None)  # type: ignore[arg-type]
    assert await job_count(storage) == 0


async def test_enqueue_is_quick(storage: gnl.Storage) -> None:
    # A smoke bound, not a benchmark: one enqueue is one short transaction.
    t0 = time.perf_counter()
    for i in range(200):
        await gnl.enqueue(storage, "t", i)
    assert time.perf_counter() - t0 < 10


class _LyingInt(int):
    def __str__(self) -> str:
        return "not a number"


async def test_an_int_subclass_is_written_as_its_value(storage: gnl.Storage) -> None:
    big = _LyingInt(2**70)
    job_id = await gnl.enqueue(storage.work, "t", {"n": big, "m": _LyingInt(7)})
    job = await gnl.get_job(storage.work, job_id)
    assert job is not None and job.payload == {"n": 2**70, "m": 7}


@pytest.mark.parametrize(
    "options",
    [{"delay_ms": 2**63 - 1}, {"run_at": 2**63 - 1}, {"run_at": 253_402_300_800_000}],
    ids=repr,
)
async def test_instants_beyond_year_9999_are_refused(
    storage: gnl.Storage, options: dict[str, Any]
) -> None:
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.enqueue(storage.work, "t", {}, **options)
    assert await job_count(storage) == 0
