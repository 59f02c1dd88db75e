"""Fixtures of the gnl conformance suite.

* ``backend`` is parametrised over :data:`BACKENDS` (SQLite, Postgres, MySQL); every test that
  asks for a store runs once per backend. ``GNL_TEST_BACKENDS=sqlite`` runs fewer.
* ``store_url`` is a factory: each call returns the URL of a new, empty store of the backend
  (SQLite: a file in ``tmp_path``; a server: a fresh database, dropped after the test).
* ``storage`` is an open :class:`gnl.Storage` on a fresh store, opened inside the test's own
  event loop and closed after it.

Database servers: the URL of a server the suite may create databases on comes from
``GNL_TEST_POSTGRES_URL`` / ``GNL_TEST_MYSQL_URL``, by default the local servers of this machine
kind. When the server cannot be reached, the test is skipped locally, and FAILS when
``CI=true`` (CI must not pass by skipping).

Async tests: pytest-asyncio is not used. A coroutine test function runs in a fresh event loop
(``asyncio.run``) by :func:`pytest_pyfunc_call` below; a fixture that must live in that loop
returns an :class:`AsyncFixture`, which the hook enters before the test and exits after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import pytest

import gnl

# The backends the conformance suite runs on.
BACKENDS = ["sqlite", "postgres", "mysql"]
# A run may pick fewer: GNL_TEST_BACKENDS=sqlite
if os.environ.get("GNL_TEST_BACKENDS"):
    BACKENDS = [b.strip() for b in os.environ["GNL_TEST_BACKENDS"].split(",") if b.strip()]

SERVER_URL_ENV = {"postgres": "GNL_TEST_POSTGRES_URL", "mysql": "GNL_TEST_MYSQL_URL"}
# The servers this machine kind runs (scripts/services.sh starts them when they are down).
SERVER_URL_DEFAULT = {
    "postgres": "postgres://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


# --------------------------------------------------------------------------------------------
# async tests without a plugin


class AsyncFixture:
    """A fixture value that is opened inside the test's event loop.

    ``factory`` is an async context manager factory; the hook enters it before the test and
    passes what it yields to the test instead of this object.
    """

    def __init__(self, factory: Callable[[], contextlib.AbstractAsyncContextManager[Any]]) -> None:
        self.factory = factory


async def _run_async_test(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        resolved = {}
        for name, value in kwargs.items():
            if isinstance(value, AsyncFixture):
                value = await stack.enter_async_context(value.factory())
            resolved[name] = value
        await fn(**resolved)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    fn = pyfuncitem.obj
    if not inspect.iscoroutinefunction(fn):
        return None
    argnames = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in argnames}
    asyncio.run(_run_async_test(fn, kwargs))
    return True


# --------------------------------------------------------------------------------------------
# database servers


def missing_server(reason: str) -> None:
    """Skip the test locally; fail it under ``CI=true`` (a missing server is a CI defect)."""
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"{reason} (CI=true: a missing database server fails the run)", pytrace=False)
    pytest.skip(reason)


def _run_cli(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def _drop_quietly(run: Callable[[], object], db: str) -> None:
    """Drop a test database; one that is slow to go is left behind with a warning, not an
    error: Postgres' DROP DATABASE waits for a checkpoint, which a busy server can take
    minutes to finish, and the test it served has passed or failed already."""
    try:
        run()
    except subprocess.TimeoutExpired:
        print(
            f"\nnote: test database {db} was not dropped in time; drop it by hand", file=sys.stderr
        )


def _with_database(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + db, parts.query, parts.fragment))


class _Postgres:
    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url

    def _sql(self, sql: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return _run_cli(
            ["psql", self.admin_url, "-v", "ON_ERROR_STOP=1", "-X", "-q", "-c", sql],
            timeout=timeout,
        )

    def check(self) -> str | None:
        if shutil.which("psql") is None:
            return "psql (the Postgres client) is not installed"
        r = self._sql("SELECT 1")
        return (
            None
            if r.returncode == 0
            else f"Postgres at {self.admin_url} unreachable: {r.stderr.strip()}"
        )

    def create(self, db: str) -> str:
        r = self._sql(f'CREATE DATABASE "{db}"')
        assert r.returncode == 0, r.stderr
        return _with_database(self.admin_url, db)

    def drop(self, db: str) -> None:
        _drop_quietly(
            lambda: self._sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)', timeout=45), db
        )


class _Mysql:
    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        p = urlsplit(admin_url)
        self.args = ["mysql", "-h", p.hostname or "127.0.0.1", "-P", str(p.port or 3306)]
        if p.username:
            self.args += ["-u", unquote(p.username)]
        self.env = {"MYSQL_PWD": unquote(p.password)} if p.password else {}

    def _sql(self, sql: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return _run_cli([*self.args, "-e", sql], self.env, timeout=timeout)

    def check(self) -> str | None:
        if shutil.which("mysql") is None:
            return "the mysql client is not installed"
        r = self._sql("SELECT 1")
        return (
            None
            if r.returncode == 0
            else f"MySQL at {self.admin_url} unreachable: {r.stderr.strip()}"
        )

    def create(self, db: str) -> str:
        r = self._sql(f"CREATE DATABASE `{db}`")
        assert r.returncode == 0, r.stderr
        return _with_database(self.admin_url, db)

    def drop(self, db: str) -> None:
        _drop_quietly(lambda: self._sql(f"DROP DATABASE IF EXISTS `{db}`", timeout=45), db)


@functools.cache
def _server(backend: str) -> _Postgres | _Mysql | str:
    """The server of ``backend``, or why it is missing (checked once per session)."""
    env = SERVER_URL_ENV[backend]
    url = os.environ.get(env) or SERVER_URL_DEFAULT[backend]
    server = _Postgres(url) if backend == "postgres" else _Mysql(url)
    problem = server.check()
    return problem if problem is not None else server


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A factory of fresh, empty stores of ``backend``: each call returns a new URL."""
    if backend == "sqlite":
        counter = iter(range(1_000_000))

        def sqlite_url() -> str:
            return f"sqlite:///{tmp_path}/store-{next(counter)}.db"

        yield sqlite_url
        return

    server = _server(backend)
    if isinstance(server, str):
        missing_server(server)
        return
    created: list[str] = []

    def server_url() -> str:
        db = f"gnl_test_{uuid.uuid4().hex[:16]}"
        url = server.create(db)
        created.append(db)
        return url

    try:
        yield server_url
    finally:
        for db in created:
            server.drop(db)


@pytest.fixture
def storage(store_url: Callable[[], str]) -> AsyncFixture:
    """A :class:`gnl.Storage` on a fresh store, open for the test (its own event loop)."""

    @contextlib.asynccontextmanager
    async def open_storage() -> AsyncIterator[gnl.Storage]:
        st = await gnl.connect(store_url())
        try:
            yield st
        finally:
            await st.close()

    return AsyncFixture(open_storage)
