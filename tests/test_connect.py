"""API.md "Connecting": URLs, schema checks, upgrade, the store clock, query_count."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import gnl
from _support import all_jobs


def sqlite_only(backend: str) -> None:
    if backend != "sqlite":
        pytest.skip("SQLite URL forms")


async def test_relative_sqlite_url_is_relative_to_the_working_directory(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sqlite_only(backend)
    monkeypatch.chdir(tmp_path)
    async with await gnl.connect("sqlite:///x.db") as st:
        job_id = await gnl.enqueue(st.work, "t", {"n": 1})
    assert (tmp_path / "x.db").is_file()
    # The same file reached through its absolute path holds the job.
    async with await gnl.connect(f"sqlite:///{tmp_path / 'x.db'}") as st:
        job = await gnl.get_job(st.work, job_id)
        assert job is not None and job.payload == {"n": 1}


async def test_relative_sqlite_url_with_a_directory(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sqlite_only(backend)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    async with await gnl.connect("sqlite:///sub/y.db") as st:
        await gnl.enqueue(st, "t", None)
    assert (tmp_path / "sub" / "y.db").is_file()


async def test_absolute_sqlite_url(backend: str, tmp_path: Path) -> None:
    sqlite_only(backend)
    path = tmp_path / "abs.db"
    url = f"sqlite:///{path}"
    assert url.startswith("sqlite:////")
    async with await gnl.connect(url) as st:
        assert st.backend == "sqlite"
        await gnl.enqueue(st, "t", [1, 2])
    assert path.is_file()
    async with await gnl.connect(url, create=False) as st:
        assert [j.payload for j in await all_jobs(st)] == [[1, 2]]


async def test_memory_store_works_and_each_is_its_own(backend: str) -> None:
    sqlite_only(backend)
    async with await gnl.connect("sqlite::memory:") as a, await gnl.connect("sqlite::memory:") as b:
        job_id = await gnl.enqueue(a.work, "t", {"x": 1})
        job = await gnl.get_job(a.work, job_id)
        assert job is not None and job.state == "pending"
        assert await gnl.get_job(b.work, job_id) is None
        assert await all_jobs(b) == []
        # A worker runs on a memory store too.
        seen = []

        async def handler(payload: object, ctx: gnl.JobContext) -> str:
            seen.append(payload)
            return "ok"

        result = await gnl.create_worker(a, {"t": handler}).drain()
        assert result == gnl.DrainResult(1, 1, 0)
        assert seen == [{"x": 1}]


@pytest.mark.parametrize(
    "url", ["redis://localhost/0", "x.db", "http://example.com/db", "sqlite:/x.db", ""]
)
async def test_bad_scheme_names_the_accepted_ones(url: str) -> None:
    with pytest.raises(gnl.InvalidArgumentError) as info:
        await gnl.connect(url)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    for accepted in ("sqlite:", "postgres", "mysql"):
        assert accepted in msg, msg


@pytest.mark.parametrize(
    "url",
    [
        "postgres://",
        "postgresql://postgres@127.0.0.1:5432",
        "postgres://postgres@127.0.0.1:5432/",
        "postgres://postgres@127.0.0.1:5432/?dbname=",
        "mysql://root@127.0.0.1:3306",
        "mariadb://root@127.0.0.1:3306/",
    ],
)
async def test_a_server_url_without_a_database_is_refused(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bare postgres:// connected to the database named after the user and, create=True
    # being the default, made gnl's tables there; MySQL failed at the first statement. Both
    # are refused before any connection (no server is needed for this test).
    for pgdatabase in (None, ""):  # unset, or exported empty (the server's default then too)
        if pgdatabase is None:
            monkeypatch.delenv("PGDATABASE", raising=False)
        else:
            monkeypatch.setenv("PGDATABASE", pgdatabase)
        for create in (True, False):
            with pytest.raises(gnl.InvalidArgumentError, match="names no database"):
                await gnl.connect(url, create=create)
        with pytest.raises(gnl.InvalidArgumentError, match="names no database"):
            await gnl.upgrade(url)


async def test_async_with_closes_the_pool(store_url: Callable[[], str]) -> None:
    url = store_url()
    async with await gnl.connect(url) as st:
        assert isinstance(st, gnl.Storage)
        await gnl.enqueue(st.work, "t", None)
    # Closed: a call fails with a gnl error, it does not hang or panic.
    with pytest.raises(gnl.GnlError):
        await asyncio.wait_for(gnl.enqueue(st.work, "t", None), 10)
    await st.close()  # idempotent
    async with await gnl.connect(url) as again:
        assert len(await all_jobs(again)) == 1


async def test_work_and_journal_share_the_storage(storage: gnl.Storage) -> None:
    assert isinstance(storage.work, gnl.WorkStore)
    assert isinstance(storage.journal, gnl.Journal)
    job_id = await gnl.enqueue(storage.work, "t", 1)
    # The Storage itself is accepted where a work store is asked for.
    job = await gnl.get_job(storage, job_id)
    assert job is not None and job.payload == 1


async def test_now_ms_is_the_clock(storage: gnl.Storage) -> None:
    before = time.time() * 1000
    now = await storage.now_ms()
    after = time.time() * 1000
    assert isinstance(now, int)
    # SQLite: the process clock; a server may differ by a little.
    assert before - 1000 <= now <= after + 1000
    await asyncio.sleep(0.05)
    later = await storage.now_ms()
    assert later - now >= 40


async def test_query_count_increases(storage: gnl.Storage) -> None:
    c0 = storage.query_count
    assert isinstance(c0, int)
    await gnl.enqueue(storage.work, "t", None)
    c1 = storage.query_count
    assert c1 > c0
    await gnl.list_jobs(storage.work)
    assert storage.query_count > c1


def empty_store(backend: str, url: str) -> str:
    """Make the store at ``url`` exist and be empty (SQLite: a zero-byte file)."""
    if backend == "sqlite":
        path = Path(url.removeprefix("sqlite://"))
        assert path.is_absolute()
        path.touch()
    return url


async def test_create_false_on_an_empty_store_names_gnl_upgrade(
    backend: str, store_url: Callable[[], str]
) -> None:
    url = empty_store(backend, store_url())
    with pytest.raises(gnl.SchemaOutdatedError) as info:
        await gnl.connect(url, create=False)
    assert isinstance(info.value, gnl.GnlError)
    assert f"gnl upgrade {url}" in str(info.value)
    # Still refused: the failed connect created no schema.
    with pytest.raises(gnl.SchemaOutdatedError):
        await gnl.connect(url, create=False)
    version = await gnl.upgrade(url)
    assert isinstance(version, int) and version >= 1
    assert await gnl.upgrade(url) == version  # idempotent
    async with await gnl.connect(url, create=False) as st:
        job_id = await gnl.enqueue(st, "t", {"a": 1})
    # Upgrading a store with data keeps the data.
    assert await gnl.upgrade(url) == version
    async with await gnl.connect(url, create=False) as st:
        job = await gnl.get_job(st, job_id)
        assert job is not None and job.payload == {"a": 1}


async def test_create_false_on_a_missing_sqlite_file_creates_nothing(
    backend: str, tmp_path: Path
) -> None:
    sqlite_only(backend)
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    with pytest.raises(gnl.GnlError):
        await gnl.connect(url, create=False)
    assert not (tmp_path / "missing.db").exists()
    # gnl upgrade creates it.
    assert await gnl.upgrade(url) >= 1
    async with await gnl.connect(url, create=False) as st:
        assert await all_jobs(st) == []


async def test_upgrade_of_a_missing_store_creates_it(store_url: Callable[[], str]) -> None:
    url = store_url()
    version = await gnl.upgrade(url)
    async with await gnl.connect(url, create=False) as st:
        await gnl.enqueue(st, "t", None)
    assert await gnl.upgrade(url) == version


async def test_concurrent_upgrades_and_connects_are_safe(store_url: Callable[[], str]) -> None:
    url = store_url()
    versions = await asyncio.gather(*(gnl.upgrade(url) for _ in range(4)))
    assert len(set(versions)) == 1
    url2 = store_url()
    stores = await asyncio.gather(*(gnl.connect(url2) for _ in range(4)))
    try:
        ids = await asyncio.gather(*(gnl.enqueue(s, "t", i) for i, s in enumerate(stores)))
        assert len(set(ids)) == 4
        assert sorted(j.payload for j in await all_jobs(stores[0])) == [0, 1, 2, 3]
    finally:
        for s in stores:
            await s.close()


async def test_a_connect_during_another_ones_first_migration_waits_for_it(
    store_url: Callable[[], str],
) -> None:
    # Connects that arrive while another one is creating the schema (MySQL's DDL commits
    # migration by migration, so the store shows a version below the latest meanwhile) wait
    # for it and open the store, instead of calling a store that is being created outdated.
    url = store_url()

    async def late(i: int) -> gnl.Storage:
        await asyncio.sleep(i * 0.02)
        return await gnl.connect(url)

    results = await asyncio.gather(*(late(i) for i in range(25)), return_exceptions=True)
    try:
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[0]
    finally:
        for r in results:
            if isinstance(r, gnl.Storage):
                await r.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": 123},
        {"url": None},
        {"url": b"sqlite::memory:"},
        {"url": "sqlite::memory:", "max_connections": "3"},
        {"url": "sqlite::memory:", "max_connections": 2.0},
        {"url": "sqlite::memory:", "create": "yes"},
        {"url": "sqlite::memory:", "create": 1},
    ],
)
async def test_connect_wrong_types_raise_type_error(kwargs: dict[str, object]) -> None:
    url = kwargs.pop("url")
    with pytest.raises(TypeError):
        await gnl.connect(url, **kwargs)  # type: ignore[arg-type]


async def test_upgrade_wrong_type_raises_type_error() -> None:
    with pytest.raises(TypeError):
        await gnl.upgrade(42)  # type: ignore[arg-type]


async def test_max_connections_below_one_is_a_bad_value() -> None:
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.connect("sqlite::memory:", max_connections=0)


async def test_unreachable_store_raises_store_unavailable(backend: str, tmp_path: Path) -> None:
    urls = {
        # A file that is not there (a volume not mounted yet, say), and not to be created.
        "sqlite": f"sqlite:///{tmp_path / 'absent.db'}",
        "postgres": "postgresql://gnl:gnl@127.0.0.1:1/gnl",
        "mysql": "mysql://gnl:gnl@127.0.0.1:1/gnl",
    }
    with pytest.raises(gnl.StoreUnavailableError) as info:
        await asyncio.wait_for(gnl.connect(urls[backend], create=backend != "sqlite"), 60)
    assert isinstance(info.value, gnl.GnlError)
    assert str(info.value)
    if backend != "sqlite":
        # The driver's reason, not only the pool's time-out.
        assert "refused" in str(info.value).lower(), str(info.value)
    else:
        assert str(tmp_path / "absent.db") in str(info.value), str(info.value)


async def test_a_sqlite_file_in_a_missing_directory_is_a_bad_url(
    backend: str, tmp_path: Path
) -> None:
    # A setup error, not an outage: InvalidArgumentError (not retried by `gnl run`), naming
    # the directory; nothing is created.
    sqlite_only(backend)
    missing = tmp_path / "no-such-dir"
    for create in (True, False):
        with pytest.raises(gnl.InvalidArgumentError) as info:
            await gnl.connect(f"sqlite:///{missing / 'x.db'}", create=create)
        assert str(missing) in str(info.value) and "does not exist" in str(info.value)
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.upgrade(f"sqlite:///{missing / 'x.db'}")
    assert not missing.exists()


async def test_a_directory_as_the_sqlite_file_is_a_bad_url(backend: str, tmp_path: Path) -> None:
    # SQLite's open of a directory failed as CANTOPEN, an outage that `gnl run` retried
    # forever: a setup error, InvalidArgumentError naming the path (exit 2 from the CLI).
    sqlite_only(backend)
    for create in (True, False):
        with pytest.raises(gnl.InvalidArgumentError) as info:
            await gnl.connect(f"sqlite:///{tmp_path}", create=create)
        assert str(info.value) == (
            f'the SQLite path "{tmp_path}" is a directory, not a file: name the file in it '
            f'(e.g. "{tmp_path}/gnl.db")'
        )
    with pytest.raises(gnl.InvalidArgumentError, match="is a directory"):
        await gnl.upgrade(f"sqlite:///{tmp_path}")


async def test_a_sqlite_file_name_too_long_is_a_bad_url(backend: str, tmp_path: Path) -> None:
    # The open failed as CANTOPEN, an outage that `gnl run` retried forever: a name the file
    # system cannot hold is a setup error, InvalidArgumentError naming the path.
    sqlite_only(backend)
    path = tmp_path / ("x" * 300 + ".db")
    for create in (True, False):
        with pytest.raises(gnl.InvalidArgumentError) as info:
            await gnl.connect(f"sqlite:///{path}", create=create)
        assert str(info.value).startswith(f'the SQLite path "{path}" cannot name a file here: ')
    with pytest.raises(gnl.InvalidArgumentError, match="cannot name a file"):
        await gnl.upgrade(f"sqlite:///{path}")
    assert not os.listdir(tmp_path)


async def test_a_read_timeout_is_checked_and_the_reads_under_it_answer(
    store_url: Callable[[], str],
) -> None:
    # The cut-off itself is the engine suite's (views: dashboard_reads_run_under_the_read_timeout).
    url = store_url()
    for bad in (0, 600_001):
        with pytest.raises(gnl.InvalidArgumentError, match="read_timeout_ms"):
            await gnl.connect(url, read_timeout_ms=bad)
    async with await gnl.connect(url, read_timeout_ms=60_000) as st:
        job_id = await gnl.enqueue(st, "t", {"a": 1}, org_id="o")
        await gnl.schedule_workflow(st, "wf", every_ms=60_000)
        assert await gnl.list_orgs(st) == ["o"]
        assert [j.id for j in (await gnl.scan_jobs(st, org_id="o")).items] == [job_id]
        got = await gnl.get_job(st, job_id, "o")
        assert got is not None and got.payload == {"a": 1}
        assert [t.id for t in await gnl.list_triggers(st, limit=10)] == ["wf"]
        assert (await gnl.get_trigger(st, "wf")) is not None
        assert (await gnl.scan_runs(st)).items == []
        assert await gnl.get_run(st, "nope") is None
        assert await gnl.list_consumers(st) == []
        assert await gnl.consumer_lag(st, "t", "c") is None
        (counts,) = await gnl.count_jobs(st, ["o"])
        assert counts.states == {"pending": 1}
