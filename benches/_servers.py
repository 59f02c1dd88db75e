"""Shared pieces of the Postgres and MySQL benches: where the servers are, a fresh store per
run, the servers' versions, the job rows of the peerbench, and peak-memory readings.

Servers (env):

* ``PG_URL`` (default ``postgres://postgres@127.0.0.1:5432/bench``): a database the benches
  may wipe. Every run drops and recreates its ``public`` schema, as the peerbench scripts
  (``../shared/peerbench``) do, so gnl, the raw anchors and pgqueuer each start empty.
* ``MYSQL_URL`` (default ``mysql://root@127.0.0.1:3306/bench``): a database the benches may
  drop and create again before every run.

Nothing here times anything; see ``_common.py`` for the summaries and the machine header.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any
from urllib.parse import unquote, urlsplit

import _common as c

PG_URL = os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:5432/bench")
MYSQL_URL = os.environ.get("MYSQL_URL", "mysql://root@127.0.0.1:3306/bench")


# -- the peerbench's job rows (enqueue_30k.py) ----------------------------------------------


def payload(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"row {i}", "email": f"u{i}@example.org"}


def make_jobs(n: int) -> list[dict[str, Any]]:
    """gnl's job list: type ``import-row``, id ``import:{i}``, organization ``acme``."""
    return [
        {
            "type": "import-row",
            "payload": payload(i),
            "options": {"id": f"import:{i}", "org_id": "acme"},
        }
        for i in range(n)
    ]


def json_size(jobs: list[dict[str, Any]]) -> int:
    """Bytes of the payloads as JSON text: sum of ``len(json.dumps(payload))``."""
    return sum(len(json.dumps(j["payload"])) for j in jobs)


# -- Postgres ----------------------------------------------------------------------------------


async def pg_connect() -> Any:
    import asyncpg

    return await asyncpg.connect(PG_URL)


async def pg_fresh() -> None:
    """Drop and recreate ``public`` (every table of a previous run goes with it)."""
    conn = await pg_connect()
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()


def pg_schema_url(schema: str) -> str:
    """``PG_URL`` with ``search_path`` set to ``schema`` (gnl's tables go there)."""
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-c%20search_path%3D{schema}"


async def pg_fresh_schema(schema: str) -> str:
    """Drop and create ``schema``; returns gnl's URL for it."""
    conn = await pg_connect()
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE; CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    return pg_schema_url(schema)


async def pg_drop_schema(schema: str) -> None:
    conn = await pg_connect()
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def pg_scalar(sql: str) -> Any:
    conn = await pg_connect()
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def pg_version() -> str:
    return str(await pg_scalar("SHOW server_version"))


# -- MySQL / MariaDB ---------------------------------------------------------------------------


def mysql_params() -> dict[str, Any]:
    u = urlsplit(MYSQL_URL)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
        "database": u.path.lstrip("/") or "bench",
    }


def mysql_connect(database: bool = True) -> Any:
    import pymysql

    p = mysql_params()
    if not database:
        p.pop("database")
    return pymysql.connect(**p, autocommit=True, charset="utf8mb4")


def mysql_fresh(suffix: str = "") -> str:
    """Drop and create the bench database (or ``<it>_<suffix>``); returns gnl's URL for it."""
    db = mysql_params()["database"] + (f"_{suffix}" if suffix else "")
    conn = mysql_connect(database=False)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
            cur.execute(f"CREATE DATABASE `{db}`")
    finally:
        conn.close()
    u = urlsplit(MYSQL_URL)
    return u._replace(path=f"/{db}").geturl()


def mysql_drop(suffix: str) -> None:
    db = mysql_params()["database"] + f"_{suffix}"
    conn = mysql_connect(database=False)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
    finally:
        conn.close()


def mysql_scalar(sql: str) -> Any:
    conn = mysql_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            row = cur.fetchone()
            return None if row is None else row[0]
    finally:
        conn.close()


def mysql_version() -> str:
    conn = mysql_connect(database=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            return str(cur.fetchone()[0])
    finally:
        conn.close()


# -- one store per backend ---------------------------------------------------------------------


async def fresh_store(backend: str, name: str, work: c.Workdir) -> str:
    """A fresh store called ``name`` (a Postgres schema, a MySQL database ``<db>_<name>``, a
    SQLite file in ``work``); returns gnl's URL for it."""
    if backend == "postgres":
        return await pg_fresh_schema(name)
    if backend == "mysql":
        return mysql_fresh(name)
    return c.sqlite_url(work.fresh(name))


async def drop_store(backend: str, name: str) -> None:
    """Drop what ``fresh_store`` made on a server (SQLite files go with ``work.cleanup()``)."""
    if backend == "postgres":
        await pg_drop_schema(name)
    elif backend == "mysql":
        mysql_drop(name)


async def print_servers(backends: list[str]) -> None:
    """Print the versions and URLs of the servers among ``backends``."""
    if "postgres" in backends:
        print(f"  PostgreSQL {await pg_version()} at {PG_URL}", flush=True)
    if "mysql" in backends:
        print(f"  MySQL/MariaDB {mysql_version()} at {MYSQL_URL}", flush=True)


def pkg_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


# -- peak memory -------------------------------------------------------------------------------


class PeakRss:
    """Peak resident memory a block adds, in this process: VmHWM is reset to the current RSS
    (``_common.reset_peak_rss``) at ``start`` and read at ``stop``. Counts Rust allocations."""

    def start(self) -> None:
        self.base = c.proc_status_kb("VmRSS")
        self.exact = c.reset_peak_rss()
        self.hwm0 = c.proc_status_kb("VmHWM")

    def stop(self) -> dict[str, Any]:
        peak = c.proc_status_kb("VmHWM") - (self.base if self.exact else self.hwm0)
        kept = c.proc_status_kb("VmRSS") - self.base
        return {"added_kb": peak, "kept_kb": kept, "exact": self.exact}


def ids_size(ids: list[str], jobs: list[dict[str, Any]]) -> int:
    """Bytes of the returned id list that the call built: the list, and every id string that
    is not the very object the caller passed in."""
    given = {id(j["options"]["id"]) for j in jobs}
    return sys.getsizeof(ids) + sum(sys.getsizeof(s) for s in ids if id(s) not in given)


def run_child(script: str, args: list[str]) -> dict[str, Any] | str:
    """Run ``script args`` in a fresh interpreter; its last stdout line is a JSON object."""
    out = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0 or not out.stdout.strip():
        return f"(measurement failed, exit {out.returncode}: {out.stderr.strip()[-300:]})"
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def fmt_rss(res: dict[str, Any] | str, json_bytes: int) -> str:
    if isinstance(res, str):
        return res
    how = "" if res["exact"] else " (lower bound: VmHWM could not be reset)"
    mib = res["added_kb"] / 1024
    ratio = res["added_kb"] * 1024 / json_bytes
    return f"{mib:.1f} MiB = {ratio:.2f}x the payloads' JSON{how}"
