"""A durable workflow of N no-op steps on each engine: gnl beside a plain loop of N committed
single-row inserts through the raw driver, and beside DBOS (SQLite and Postgres), in one run.

The work is the peerbench's ``durable_steps.py`` (``../shared/peerbench``):

* gnl: ``run_workflow`` of a workflow whose body is ``for i in range(N): await
  ctx.step("noop", noop, i)`` (``noop`` returns ``i``), each repetition a new run id on one
  store (the store's schema made before, not timed). Timed: the call (run start, N steps each
  one store write, the run's finish).
* ``plain`` (the anchor of the bar): the raw driver inserts the same N records
  ``(run_id, "noop", i, json.dumps(i))`` into a table keyed ``(run_id, name, n)``, each insert
  its own committed transaction (autocommit): ``sqlite3`` (WAL, synchronous=NORMAL, as gnl's
  engine), ``psycopg`` 3, ``pymysql``.
* ``resume``: a run whose N steps are recorded but which did not finish (its first execution
  raised after step N) is run again: the journal is read back in one store call, the N steps
  are served from memory, the run finishes. Against gnl's own N-step run. It is the cost of
  reading a journal of N steps back.
* ``rerun``: a run that finished (one of the timed N-step runs) is run again: its recorded
  return value is read back, no step is replayed (the issue bar's literal case: "resuming a
  finished 1,000-step run"). Against gnl's own N-step run.
* ``DBOS``: ``@DBOS.workflow`` calling N ``@DBOS.step`` no-ops, as the peer script does
  (``DBOS.launch()``, a warm-up workflow of 10 steps, then the timed workflow), in a
  subprocess per engine (DBOS is a process-wide singleton), SQLite file / Postgres database as
  its system database.

Each contender: one warm-up, then R repetitions (new run ids, new tables), medians. Ratios
printed. Issue bars: gnl at most 1.5x ``plain`` on Postgres and MySQL and 3x on SQLite; DBOS
at least 5x gnl; resuming a finished run under 5% of the run (``rerun``; ``resume``, a run
that did not finish, is printed beside it).

    N=1000 R=5 .venv/bin/python benches/bench_durable.py          # ENGINES=sqlite,postgres,mysql
                                                                  # DBOS=0: without DBOS

Needs ``pip install dbos 'psycopg[binary]' pymysql`` (requirements-dev.txt) and the servers of
``_servers.py`` (``PG_URL``, ``MYSQL_URL``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c
import _servers as srv
import gnl

N = c.env_int("N", 1000)
R = c.env_int("R", 5)
ENGINES = os.environ.get("ENGINES", "sqlite,postgres,mysql").split(",")
#: ``DBOS=0`` leaves DBOS out (an A/B of gnl against the plain loop only).
DBOS = os.environ.get("DBOS", "1") != "0"
PG_SCHEMA = "gnl_bench_durable"


def noop(i: int) -> int:
    return i


async def steps(ctx: gnl.WorkflowContext, input: Any) -> int:
    total = 0
    for i in range(int(input["n"])):
        total += await ctx.step("noop", noop, i)
    if input.get("crash") and not input.get("resumed"):
        # First execution of a "resume" run: all N steps recorded, then it dies.
        raise RuntimeError("crash after the last step")
    return total


async def gnl_times(url: str) -> tuple[list[float], list[float], list[float]]:
    """(N-step runs, resumes of N recorded steps, reruns of finished N-step runs), R of each
    after a warm-up."""
    runs, resumes, reruns = [], [], []
    async with await gnl.connect(url) as st:
        g = gnl.create_gnl(st, {"steps": steps})
        await g.run_workflow("steps", run_id="warm", input={"n": 10})
        for r in range(R):
            t = time.perf_counter()
            total = await g.run_workflow("steps", run_id=f"run-{r}", input={"n": N})
            runs.append(time.perf_counter() - t)
            assert total == N * (N - 1) // 2
        for r in range(R):
            crashed = f"resume-{r}"
            try:
                await g.run_workflow("steps", run_id=crashed, input={"n": N, "crash": True})
            except RuntimeError:
                pass
            g2 = gnl.create_gnl(st, {"steps": resumed_steps})
            t = time.perf_counter()
            total = await g2.run_workflow("steps", run_id=crashed)
            resumes.append(time.perf_counter() - t)
            assert total == N * (N - 1) // 2
        for r in range(R):
            t = time.perf_counter()
            total = await g.run_workflow("steps", run_id=f"run-{r}")
            reruns.append(time.perf_counter() - t)
            assert total == N * (N - 1) // 2
    return runs, resumes, reruns


async def resumed_steps(ctx: gnl.WorkflowContext, input: Any) -> int:
    return await steps(ctx, {**input, "resumed": True})


def plain_times(engine: str, tmp: Path) -> list[float]:
    out = []
    for r in range(R + 1):
        if engine == "sqlite":
            conn: Any = sqlite3.connect(tmp / f"plain-{r}.db", isolation_level=None)
            conn.execute("pragma journal_mode=wal")
            conn.execute("pragma synchronous=normal")
            cur, ph = conn, "?"
        elif engine == "postgres":
            import psycopg

            conn = psycopg.connect(pg_plain_url(), autocommit=True)
            cur, ph = conn, "%s"
        else:
            conn = srv.mysql_connect()
            cur, ph = conn.cursor(), "%s"
        cur.execute("drop table if exists plain_steps")
        cur.execute(
            "create table plain_steps (run_id varchar(200), name varchar(200), n int, "
            "result text, primary key (run_id, name, n))"
        )
        sql = f"insert into plain_steps values ({ph}, {ph}, {ph}, {ph})"
        t = time.perf_counter()
        for i in range(N):
            cur.execute(sql, ("r1", "noop", i, json.dumps(i)))
        dt = time.perf_counter() - t
        conn.close()
        if r > 0:  # the first is the warm-up
            out.append(dt)
    return out


def pg_plain_url() -> str:
    return srv.PG_URL.replace("postgres://", "postgresql://", 1)


def pg_fresh(schema: str) -> str:
    import psycopg

    with psycopg.connect(pg_plain_url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return srv.pg_schema_url(schema)


def pg_drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(pg_plain_url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


DBOS_SCRIPT = r"""
import sys, time, json
from dbos import DBOS, DBOSConfig
url, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
DBOS(config={"name": "bench", "system_database_url": url, "run_admin_server": False})

@DBOS.step()
def noop(i: int) -> int:
    return i

@DBOS.workflow()
def workflow(n: int) -> int:
    return sum(noop(i) for i in range(n))

DBOS.launch()
workflow(10)
times = []
for _ in range(reps):
    t = time.perf_counter(); assert workflow(n) == n * (n - 1) // 2
    times.append(time.perf_counter() - t)
DBOS.destroy()
print(json.dumps(times))
"""


def dbos_times(engine: str, tmp: Path) -> list[float] | None:
    if engine == "sqlite":
        url = f"sqlite:///{tmp}/dbos.sqlite"
    elif engine == "postgres":
        db = "gnl_bench_dbos"
        import psycopg

        with psycopg.connect(pg_plain_url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db}")
        url = pg_plain_url().rsplit("/", 1)[0] + f"/{db}"
    else:
        return None  # DBOS's system database is SQLite or Postgres
    p = subprocess.run(
        [sys.executable, "-c", DBOS_SCRIPT, url, str(N), str(R)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if p.returncode != 0:
        print(f"  DBOS failed: {p.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return [float(x) for x in json.loads(p.stdout.strip().splitlines()[-1])]


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def line(name: str, xs: list[float]) -> str:
    return f"  {name:<8} median {med(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f}), " + (
        f"{med(xs) / N * 1e6:.0f} us/step"
    )


def short(name: str, xs: list[float], run: list[float]) -> str:
    """A line in ms, with its ratio to the run (``resume``, ``rerun``)."""
    return (
        f"  {name:<8} median {med(xs) * 1e3:.3f} ms (min {min(xs) * 1e3:.3f}, max "
        f"{max(xs) * 1e3:.3f}), {med(xs) / med(run) * 100:.2f}% of the run"
    )


def main() -> None:
    c.header(
        "bench_durable: a workflow of N no-op steps (gnl, plain committed inserts, DBOS)",
        anchor=False,
        N=N,
        R=R,
        dbos=srv.pkg_version("dbos"),
        psycopg=srv.pkg_version("psycopg"),
        pymysql=srv.pkg_version("pymysql"),
    )
    for engine in ENGINES:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            if engine == "sqlite":
                url = c.sqlite_url(tmp / "gnl.db")
                version = sqlite3.sqlite_version
            elif engine == "postgres":
                url = pg_fresh(PG_SCHEMA)
                import psycopg

                with psycopg.connect(pg_plain_url()) as conn:
                    row = conn.execute("show server_version").fetchone()
                    version = f"Postgres {row[0] if row else '?'}"
            else:
                url = srv.mysql_fresh("durable")
                version = srv.mysql_version()
            print(f"\n{engine} ({version}):", flush=True)
            try:
                runs, resumes, reruns = asyncio.run(gnl_times(url))
            finally:
                if engine == "postgres":
                    pg_drop(PG_SCHEMA)
                elif engine == "mysql":
                    srv.mysql_drop("durable")
            plain = plain_times(engine, tmp)
            dbos = dbos_times(engine, tmp) if DBOS else None
            print(line("gnl", runs), flush=True)
            print(line("plain", plain), flush=True)
            print(short("resume", resumes, runs), flush=True)
            print(short("rerun", reruns, runs), flush=True)
            if dbos is not None:
                print(line("DBOS", dbos), flush=True)
            print(
                f"  ratios: gnl/plain {med(runs) / med(plain):.2f}x; "
                f"resume/run {med(resumes) / med(runs) * 100:.1f}%; "
                f"rerun/run {med(reruns) / med(runs) * 100:.2f}%"
                + (f"; DBOS/gnl {med(dbos) / med(runs):.1f}x" if dbos else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
