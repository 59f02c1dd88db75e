"""The suite's own machinery: a missing database server skips locally and fails under CI."""

from __future__ import annotations

import asyncio

import pytest

import conftest


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_missing_server_skips_locally(monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception):
        conftest.missing_server("no postgres")


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_missing_server_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as info:
        conftest.missing_server("no postgres")
    assert "no postgres" in str(info.value)


def test_an_unreachable_server_is_reported_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    urls = {
        "postgres": "postgres://postgres@127.0.0.1:1/test",
        "mysql": "mysql://root@127.0.0.1:1/test",
    }
    for backend, env in conftest.SERVER_URL_ENV.items():
        monkeypatch.setenv(env, urls[backend])
        conftest._server.cache_clear()
        problem = conftest._server(backend)
        assert isinstance(problem, str), f"{backend} on port 1 was not reported missing"
    conftest._server.cache_clear()


def test_async_tests_run_in_a_fresh_loop() -> None:
    loops = []

    async def probe() -> None:
        loops.append(asyncio.get_running_loop())

    asyncio.run(conftest._run_async_test(probe, {}))
    asyncio.run(conftest._run_async_test(probe, {}))
    assert len(loops) == 2 and loops[0] is not loops[1]
    assert all(loop.is_closed() for loop in loops)


async def test_storage_fixture_is_open_in_the_tests_loop(storage: object) -> None:
    import gnl

    assert isinstance(storage, gnl.Storage)
    assert isinstance(await storage.now_ms(), int)
