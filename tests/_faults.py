"""Real store faults for the tests (issue 9): locks held by another process, a database that
refuses connections, gnl's server connections terminated. Only ever on the test's own store
(its SQLite file, or its own database on a shared server): the servers are never stopped.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from urllib.parse import urlsplit

import conftest

# A process that takes a SQLite file's write lock, creates the file argv[2], holds the lock
# for argv[3] seconds.
_SQLITE_HOLDER = """
import pathlib, sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
pathlib.Path(sys.argv[2]).touch()
time.sleep(float(sys.argv[3]))
con.execute("ROLLBACK")
"""


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///`` URL (relative to the working directory, or absolute)."""
    assert url.startswith("sqlite:///"), url
    return url[len("sqlite:///") :]


def database_of(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _server(backend: str) -> conftest._Postgres | conftest._Mysql:
    server = conftest._server(backend)
    assert not isinstance(server, str), server
    return server


async def _run(*args: str, stdin: str | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _sql_args(backend: str, url: str) -> list[str]:
    """A command line client of ``backend`` on ``url``'s database, as the suite's admin."""
    server = _server(backend)
    if isinstance(server, conftest._Postgres):
        return ["psql", conftest._with_database(server.admin_url, database_of(url)), "-X", "-q"]
    return [*server.args, "-D", database_of(url)]


async def sql(backend: str, url: str, statement: str) -> str:
    """Run ``statement`` on ``url``'s database as the suite's admin; its rows, tab-separated."""
    args = _sql_args(backend, url)
    flags = ["-At", "-v", "ON_ERROR_STOP=1", "-c"] if backend == "postgres" else ["-N", "-B", "-e"]
    return await _run(*args, *flags, statement)


async def sqlite_outage(url: str, seconds: float) -> asyncio.subprocess.Process:
    """A store outage of the SQLite store at ``url``: another process takes the file's write
    lock (``BEGIN IMMEDIATE``) and holds it for ``seconds``. Returns once the lock is held;
    ``await proc.wait()`` for its end."""
    path = sqlite_path(url)
    flag = f"{path}.locked-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SQLITE_HOLDER, path, flag, str(seconds)
    )
    for _ in range(3000):
        if os.path.exists(flag):  # noqa: ASYNC240 - one stat, no I/O to speak of
            return proc
        if proc.returncode is not None:
            break
        await asyncio.sleep(0.01)
    raise AssertionError("the write lock was not taken")


async def row_lock(
    backend: str, url: str, job_id: str, seconds: float
) -> asyncio.subprocess.Process:
    """Another session holds job ``job_id``'s row lock (SQLite: the file's write lock) for
    ``seconds``: the job's renewals and outcome wait for it. Returns once the lock is held;
    ``await proc.wait()`` for its end."""
    if backend == "sqlite":
        return await sqlite_outage(url, seconds)
    return await held_lock(
        backend, url, f"SELECT 1 FROM gnl_jobs WHERE id = '{job_id}' FOR UPDATE", seconds
    )


async def held_lock(
    backend: str, url: str, lock: str, seconds: float
) -> asyncio.subprocess.Process:
    """Another session runs ``lock`` (a statement that takes a lock) in a transaction it keeps
    open for ``seconds`` (Postgres, MySQL). Returns once the lock is held."""
    sleep = f"SELECT pg_sleep({seconds})" if backend == "postgres" else f"DO SLEEP({seconds})"
    script = f"BEGIN; {lock}; {sleep}; COMMIT;\n"
    proc = await asyncio.create_subprocess_exec(
        *_sql_args(backend, url),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    proc.stdin.write(script.encode())
    await proc.stdin.drain()
    proc.stdin.close()
    # Held once the session sleeps.
    if backend == "postgres":
        probe = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'active' AND query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()"
        )
    else:
        probe = (
            "SELECT COUNT(*) FROM information_schema.processlist "
            "WHERE info LIKE 'DO SLEEP%' AND db = DATABASE()"
        )
    for _ in range(600):
        if (await sql(backend, url, probe)).strip() != "0":
            return proc
        await asyncio.sleep(0.02)
    raise AssertionError("the row lock was not taken")


async def lease_expiry(backend: str, url: str, job_id: str) -> int:
    """The lease end (store clock, epoch ms) recorded for job ``job_id``, read directly."""
    if backend == "sqlite":
        import sqlite3

        con = sqlite3.connect(sqlite_path(url), timeout=30)
        try:
            row = con.execute(
                "SELECT lease_expires_at FROM gnl_jobs WHERE id = ?", (job_id,)
            ).fetchone()
        finally:
            con.close()
        return int(row[0])
    return int(
        await sql(backend, url, f"SELECT lease_expires_at FROM gnl_jobs WHERE id = '{job_id}'")
    )


async def pg_outage_start(url: str) -> None:
    """Postgres outage of ``url``'s database (only it): it stops accepting connections, and
    every connection to it (gnl's) is terminated, from a superuser connection."""
    db = database_of(url)
    await sql(
        "postgres",
        url.rsplit("/", 1)[0] + "/postgres",
        f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS false',
    )
    await terminate_backends(url)


async def pg_outage_end(url: str) -> None:
    db = database_of(url)
    await sql(
        "postgres",
        url.rsplit("/", 1)[0] + "/postgres",
        f'ALTER DATABASE "{db}" WITH ALLOW_CONNECTIONS true',
    )


async def terminate_backends(url: str) -> int:
    """Terminate every connection to ``url``'s database but this one; how many."""
    db = database_of(url)
    out = await sql(
        "postgres",
        url.rsplit("/", 1)[0] + "/postgres",
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE datname = '{db}' AND pid <> pg_backend_pid()",
    )
    return int(out.strip() or 0)
