"""API.md "Queue": enqueue_many — one write, all or none."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import datetime
from typing import Any

import pytest

import gnl
from _support import all_jobs, job_count, noop


async def test_ids_come_back_in_call_order(storage: gnl.Storage) -> None:
    jobs: list[Any] = [
        {"type": "a", "payload": 0, "options": {"id": "first"}},
        {"type": "a", "payload": 1},
        gnl.JobSpec(type="b", payload=2, id="third", org_id="acme"),
        {"type": "b", "payload": 3, "options": {"org_id": "acme"}},
        gnl.JobSpec(type="c", payload=4),
        {"type": "c", "payload": 5, "options": {"id": "sixth", "delay_ms": 10}},
    ]
    ids = await gnl.enqueue_many(storage.work, jobs)
    assert len(ids) == 6
    assert ids[0] == "first" and ids[2] == "third" and ids[5] == "sixth"
    for i, (job_id, spec) in enumerate(zip(ids, jobs, strict=True)):
        org = (
            spec.org_id if isinstance(spec, gnl.JobSpec) else spec.get("options", {}).get("org_id")
        )
        job = await gnl.get_job(storage.work, job_id, org_id=org)
        assert job is not None, i
        assert job.payload == i
    assert await job_count(storage) == 6


async def test_empty_call_writes_nothing(storage: gnl.Storage) -> None:
    assert await gnl.enqueue_many(storage.work, []) == []
    assert await job_count(storage) == 0


async def test_any_iterable_of_jobs(storage: gnl.Storage) -> None:
    ids = await gnl.enqueue_many(storage, ({"type": "t", "payload": i} for i in range(5)))
    assert len(ids) == 5
    assert [j.payload for j in await all_jobs(storage)] == [0, 1, 2, 3, 4]


async def test_options_match_enqueue(storage: gnl.Storage) -> None:
    due = await storage.now_ms() + 60_000
    ids = await gnl.enqueue_many(
        storage,
        [
            {"type": "t", "payload": None, "options": {"run_at": due}},
            {"type": "t", "payload": None, "options": {"delay_ms": 60_000}},
            gnl.JobSpec(type="t", run_at=due),
            {"type": "t", "payload": None, "options": None},
            {"type": "t", "payload": None, "options": {}},
        ],
    )
    jobs = [await gnl.get_job(storage, i) for i in ids]
    assert jobs[0] is not None and jobs[0].run_at == due
    assert jobs[1] is not None and jobs[1].run_at - jobs[1].created_at >= 60_000
    assert jobs[2] is not None and jobs[2].run_at == due
    w = gnl.create_worker(storage, {"t": noop})
    assert (await w.drain()).processed == 2


def _bad_jobs() -> list[tuple[str, Any, type[BaseException]]]:
    return [
        ("tuple payload", {"type": "t", "payload": (1, 2)}, TypeError),
        ("set payload", gnl.JobSpec(type="t", payload={1}), TypeError),
        ("nan payload", {"type": "t", "payload": {"x": math.nan}}, gnl.InvalidArgumentError),
        ("int key", {"type": "t", "payload": {1: 2}}, TypeError),
        (
            "empty org",
            {"type": "t", "payload": 1, "options": {"org_id": ""}},
            gnl.InvalidArgumentError,
        ),
        ("long org", gnl.JobSpec(type="t", org_id="o" * 201), gnl.InvalidArgumentError),
        (
            "both",
            {"type": "t", "payload": 1, "options": {"run_at": 1, "delay_ms": 1}},
            gnl.InvalidArgumentError,
        ),
        ("naive", gnl.JobSpec(type="t", run_at=datetime(2020, 1, 1)), gnl.InvalidArgumentError),
        ("type int", {"type": 1, "payload": 1}, TypeError),
        ("delay str", {"type": "t", "payload": 1, "options": {"delay_ms": "5"}}, TypeError),
        ("delay bool", gnl.JobSpec(type="t", delay_ms=True), TypeError),
        ("id int", {"type": "t", "payload": 1, "options": {"id": 5}}, TypeError),
        ("not a job", ("t", 1), TypeError),
        ("not a job", "t", TypeError),
    ]


@pytest.mark.parametrize("index", [0, 3, 6])
@pytest.mark.parametrize("case", _bad_jobs(), ids=lambda c: c[0])
async def test_one_invalid_job_refuses_the_whole_call(
    storage: gnl.Storage, case: tuple[str, Any, type[BaseException]], index: int
) -> None:
    _, bad, cause = case
    await gnl.enqueue(storage, "t", "existing", id="keep")
    before = await all_jobs(storage)
    jobs: list[Any] = [{"type": "t", "payload": i, "options": {"id": f"j{i}"}} for i in range(7)]
    jobs[index] = bad
    with pytest.raises(gnl.InvalidJobError) as info:
        await gnl.enqueue_many(storage.work, jobs)
    err = info.value
    assert err.index == index
    assert isinstance(err, gnl.InvalidArgumentError) and isinstance(err, ValueError)
    assert isinstance(err.__cause__, cause), repr(err.__cause__)
    if cause is TypeError:
        assert not isinstance(err.__cause__, gnl.GnlError)
    assert await all_jobs(storage) == before


@pytest.mark.parametrize(
    "job",
    [
        {"type": "t", "payload": 1, "options": {"orgId": "acme"}},
        {"type": "t", "payload": 1, "options": {"delayMs": 5}},
        {"type": "t", "payload": 1, "options": {"priority": 5}},
        {"type": "t", "payload": 1, "org_id": "acme"},
        {"type": "t", "payload": 1, "opts": {}},
    ],
    ids=repr,
)
async def test_unknown_keys_are_refused(storage: gnl.Storage, job: dict[str, Any]) -> None:
    jobs = [{"type": "t", "payload": 0}, job]
    with pytest.raises(gnl.InvalidJobError) as info:
        await gnl.enqueue_many(storage.work, jobs)
    assert info.value.index == 1
    assert isinstance(info.value.__cause__, (TypeError, gnl.InvalidArgumentError))
    unknown = next(
        k for k in (*job, *job.get("options", {})) if k not in ("type", "payload", "options")
    )
    assert unknown in str(info.value) or unknown in str(info.value.__cause__)
    assert await job_count(storage) == 0


async def test_duplicates_in_the_call_are_one_job(storage: gnl.Storage) -> None:
    ids = await gnl.enqueue_many(
        storage.work,
        [
            {"type": "t", "payload": "first", "options": {"id": "a"}},
            {"type": "t", "payload": "b", "options": {"id": "b"}},
            {"type": "t", "payload": "second", "options": {"id": "a"}},
            {"type": "t", "payload": "other org", "options": {"id": "a", "org_id": "acme"}},
        ],
    )
    assert ids == ["a", "b", "a", "a"]
    assert await job_count(storage) == 3
    job = await gnl.get_job(storage.work, "a")
    assert job is not None and job.payload == "first"
    acme = await gnl.get_job(storage.work, "a", org_id="acme")
    assert acme is not None and acme.payload == "other org"


async def test_already_enqueued_ids_are_one_job(storage: gnl.Storage) -> None:
    await gnl.enqueue(storage, "t", "original", id="x")
    before = await gnl.get_job(storage, "x")
    ids = await gnl.enqueue_many(
        storage,
        [
            {"type": "t", "payload": "new", "options": {"id": "x"}},
            {"type": "t", "payload": "y", "options": {"id": "y"}},
        ],
    )
    assert ids == ["x", "y"]
    assert await gnl.get_job(storage, "x") == before
    assert await job_count(storage) == 2


@pytest.mark.parametrize("n", [3_000, 9_000])
async def test_a_big_call_with_taken_and_repeated_ids(storage: gnl.Storage, n: int) -> None:
    """A big call (Postgres writes it with COPY; 9,000 jobs are also sent in parts while they
    are packed) in which one id is taken and one repeats: the first writer of each id keeps it,
    every other job is added, the ids come back as given."""
    await gnl.enqueue(storage, "t", "original", id="row:1500")
    jobs: list[Any] = [{"type": "t", "payload": i, "options": {"id": f"row:{i}"}} for i in range(n)]
    jobs[n - 1] = {"type": "t", "payload": "again", "options": {"id": "row:7"}}
    ids = await gnl.enqueue_many(storage.work, jobs)
    assert all(got is job["options"]["id"] for got, job in zip(ids, jobs, strict=True))
    assert await job_count(storage) == n - 1
    taken = await gnl.get_job(storage, "row:1500")
    assert taken is not None and taken.payload == "original"
    repeated = await gnl.get_job(storage, "row:7")
    assert repeated is not None and repeated.payload == 7
    worker = gnl.create_worker(storage, {"t": noop}, concurrency=100)
    assert (await worker.drain()).succeeded == n - 1


@pytest.mark.parametrize("taken", [False, True])
async def test_a_bad_job_late_in_a_big_call_writes_nothing(
    storage: gnl.Storage, taken: bool
) -> None:
    """Postgres starts writing a big call before its last jobs are checked: a bad job near
    the end still refuses the whole call (also when the server had already refused the data
    for a taken id), and every later call on the same connections gets its own answers."""
    jobs: list[Any] = [
        {"type": "t", "payload": i, "options": {"id": f"j{i}", "org_id": f"o{i % 3}"}}
        for i in range(10_000)
    ]
    if taken:
        await gnl.enqueue(storage, "t", "first", id="j3", org_id="o0")
    before = await job_count(storage)
    bad = dict(jobs[9_000], payload={1, 2})
    for _ in range(3):
        with pytest.raises(gnl.InvalidJobError) as e:
            await gnl.enqueue_many(storage.work, [*jobs[:9_000], bad, *jobs[9_001:]])
        assert e.value.index == 9_000
        assert await job_count(storage) == before
    ids = await gnl.enqueue_many(storage.work, jobs)
    assert len(ids) == 10_000 and await job_count(storage) == 10_000
    first = await gnl.get_job(storage, "j3", org_id="o0")
    assert first is not None and first.payload == ("first" if taken else 3)
    worker = gnl.create_worker(storage, {"t": noop}, concurrency=100)
    assert (await worker.drain()).succeeded == 10_000


async def test_max_depth_in_a_big_call(storage: gnl.Storage) -> None:
    """max_depth counts the call's own jobs in a call big enough to be sent in parts."""
    jobs = [gnl.JobSpec(type="t", org_id="acme", max_depth=4_999) for _ in range(5_000)]
    with pytest.raises(gnl.QueueFullError):
        await gnl.enqueue_many(storage, jobs)
    assert await job_count(storage) == 0
    jobs = [gnl.JobSpec(type="t", org_id="acme", max_depth=5_000) for _ in range(5_000)]
    assert len(await gnl.enqueue_many(storage, jobs)) == 5_000
    assert await job_count(storage) == 5_000


async def test_max_depth_counts_the_calls_own_jobs(storage: gnl.Storage) -> None:
    await gnl.enqueue(storage, "t", None, org_id="acme")
    before = await all_jobs(storage)
    three = [gnl.JobSpec(type="t", org_id="acme", max_depth=3) for _ in range(3)]
    with pytest.raises(gnl.QueueFullError):
        await gnl.enqueue_many(storage, three)
    assert await all_jobs(storage) == before
    # Jobs of another org in the same call do not count against acme.
    ok = [gnl.JobSpec(type="t", org_id="acme", max_depth=3) for _ in range(2)]
    ok += [gnl.JobSpec(type="t", org_id="globex") for _ in range(5)]
    assert len(await gnl.enqueue_many(storage, ok)) == 7
    assert len((await gnl.list_jobs(storage, org_id="acme")).items) == 3
    # A limit of the no-org lane counts its own call's jobs too.
    with pytest.raises(gnl.QueueFullError):
        await gnl.enqueue_many(storage, [gnl.JobSpec(type="t", max_depth=1)] * 2)
    assert await job_count(storage) == 8


async def test_many_jobs_in_one_call(storage: gnl.Storage) -> None:
    n = 100_000
    jobs = [
        {"type": "row", "payload": {"i": i}, "options": {"id": f"row:{i}", "org_id": f"org{i % 7}"}}
        for i in range(n)
    ]
    t0 = time.perf_counter()
    ids = await gnl.enqueue_many(storage.work, jobs)
    elapsed = time.perf_counter() - t0
    assert ids == [f"row:{i}" for i in range(n)]
    assert elapsed < 30, f"100,000 jobs took {elapsed:.1f} s"
    seen = await all_jobs(storage)
    assert len(seen) == n
    job = await gnl.get_job(storage, "row:99999", org_id=f"org{99999 % 7}")
    assert job is not None and job.payload == {"i": 99999}
    # Generated ids and a second big call with every id already present.
    again = await gnl.enqueue_many(storage.work, jobs[:50_000])
    assert again == ids[:50_000]
    assert await job_count(storage) == n


async def test_a_reader_sees_none_or_all(storage: gnl.Storage) -> None:
    n = 40_000
    jobs = [{"type": "t", "payload": i, "options": {"id": f"j{i}"}} for i in range(n)]
    async with await gnl.connect(storage.url) as reader:
        task = asyncio.ensure_future(gnl.enqueue_many(storage.work, jobs))
        observations = 0
        while not task.done():
            first = await gnl.get_job(reader, "j0")
            last = await gnl.get_job(reader, f"j{n - 1}")
            # Under an atomic commit, seeing the first job means the last one is visible too.
            assert not (first is not None and last is None), "saw part of an enqueue_many call"
            observations += 1
            await asyncio.sleep(0)
        await task
        assert await gnl.get_job(reader, "j0") is not None
        assert await gnl.get_job(reader, f"j{n - 1}") is not None
    assert observations > 0


async def test_enqueue_many_wrong_container_types(storage: gnl.Storage) -> None:
    for bad in ({"type": "t", "payload": 1}, "t", 5, None):
        with pytest.raises(TypeError):
            await gnl.enqueue_many(storage, bad)  # type: ignore[arg-type]
    assert await job_count(storage) == 0
