"""Where the time of a durable step goes on Postgres and MySQL (issue 10's 1.5x bar), in one run.

``bench_durable.py`` times a workflow of N no-op steps against N committed inserts through the
raw driver. This splits a step of that workflow into parts, each timed over N calls, the parts
interleaved round by round (R rounds, medians), on a fresh store:

* ``bridge``: ``await`` of a native call that does no SQL (SQLite's ``now_ms``, the store's
  clock read in Rust): the asyncio -> tokio -> asyncio round trip alone.
* ``step_put``: ``await gnl._native.step_put(...)`` N times (new steps of one run): the native
  step write, bridge included, without the Python step machinery.
* ``step_get``: ``await gnl._native.step_get(...)`` of a missing step N times: a read round trip
  (no commit), bridge included.
* ``run0``: ``run_workflow`` of a workflow with no step (run start, keeper, finish), per run.
* ``workflow``: ``run_workflow`` of N no-op steps (``bench_durable.py``'s gnl figure).
* ``plain``: N committed single-row inserts through the raw driver (psycopg 3 / pymysql),
  ``bench_durable.py``'s anchor; ``plain_rd``: N reads of a missing row through it.

Beside each wall time: this process's CPU time (every thread: user + system, ``getrusage``)
and its context switches, per call: figures that a busy disk or other work on the machine
moves less than the wall time.

Derived, per step (us): Python step machinery = workflow's step - run0 / N - step_put's call;
the native write beyond the raw driver = step_put's call - plain's, of which the bridge is
``bridge``'s call. A difference of two noisy figures: on a busy machine read the CPU and the
context switches rather than these.

    N=1000 R=5 ENGINES=postgres,mysql .venv/bin/python benches/bench_durable_split.py

``PG_OPTIONS`` (e.g. ``-c synchronous_commit=off``) is set on both sides' Postgres sessions: it
takes the commit's flush out of both, to see the overhead on a machine whose disk is busy.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import _common as c
import _servers as srv
import gnl
from bench_durable import steps
from gnl import _native
from gnl.storage import native_of

N = c.env_int("N", 1000)
R = c.env_int("R", 5)
ENGINES = os.environ.get("ENGINES", "postgres,mysql").split(",")
PG_OPTIONS = os.environ.get("PG_OPTIONS", "")
PG_SCHEMA = "gnl_bench_durable_split"


def pg_url(base: str) -> str:
    if not PG_OPTIONS:
        return base
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(PG_OPTIONS)}"


def pg_gnl_url() -> str:
    url = srv.pg_schema_url(PG_SCHEMA)
    if PG_OPTIONS:
        # pg_schema_url's options already set search_path: add ours to it.
        url = url.replace("options=", f"options={quote(PG_OPTIONS)}%20", 1)
    return url


def plain_conn(engine: str) -> Any:
    if engine == "postgres":
        import psycopg

        base = srv.PG_URL.replace("postgres://", "postgresql://", 1)
        conn = psycopg.connect(pg_url(base), autocommit=True)
        return conn, conn.cursor(), "%s"
    conn = srv.mysql_connect()
    return conn, conn.cursor(), "%s"


async def main_engine(engine: str) -> None:
    if engine == "postgres":
        import psycopg

        base = srv.PG_URL.replace("postgres://", "postgresql://", 1)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{PG_SCHEMA}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{PG_SCHEMA}"')
        url = pg_gnl_url()
    else:
        url = srv.mysql_fresh("split")
    tmp = Path(tempfile.mkdtemp())
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    switches: dict[str, list[float]] = {}
    try:
        async with (
            await gnl.connect(url) as st,
            await gnl.connect(c.sqlite_url(tmp / "bridge.db")) as lite,
        ):
            native = native_of(st)
            clock = native_of(lite)
            g = gnl.create_gnl(st, {"steps": steps})
            await g.run_workflow("steps", run_id="warm", input={"n": 10})
            conn, cur, ph = plain_conn(engine)
            cur.execute("drop table if exists plain_steps")
            cur.execute(
                "create table plain_steps (run_id varchar(200), name varchar(200), n int, "
                "result text, primary key (run_id, name, n))"
            )
            ins = f"insert into plain_steps values ({ph}, {ph}, {ph}, {ph})"
            sel = f"select result from plain_steps where run_id = {ph} and name = {ph} and n = {ph}"

            async def bridge(r: int) -> None:
                for _ in range(N):
                    await clock.now_ms()

            async def step_put(r: int) -> None:
                for i in range(N):
                    await _native.step_put(native, f"put-{r}", "noop", i, i, i)

            async def step_get(r: int) -> None:
                for i in range(N):
                    await _native.step_get(native, f"none-{r}", "noop", i)

            async def run0(r: int) -> None:
                for k in range(20):
                    await g.run_workflow("steps", run_id=f"zero-{r}-{k}", input={"n": 0})

            async def workflow(r: int) -> None:
                await g.run_workflow("steps", run_id=f"run-{r}", input={"n": N})

            async def plain(r: int) -> None:
                for i in range(N):
                    cur.execute(ins, (f"r{r}", "noop", i, json.dumps(i)))

            async def plain_rd(r: int) -> None:
                for i in range(N):
                    cur.execute(sel, (f"none{r}", "noop", i))
                    cur.fetchall()

            parts: dict[str, tuple[Callable[[int], Awaitable[None]], int]] = {
                "bridge": (bridge, N),
                "step_put": (step_put, N),
                "step_get": (step_get, N),
                "run0": (run0, 20),
                "workflow": (workflow, N),
                "plain": (plain, N),
                "plain_rd": (plain_rd, N),
            }
            for r in range(R + 1):
                for name, (fn, _) in parts.items():
                    u0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                    await fn(r)
                    dt = time.perf_counter() - t
                    u1 = resource.getrusage(resource.RUSAGE_SELF)
                    if r > 0:  # round 0 is the warm-up
                        times.setdefault(name, []).append(dt)
                        cpu.setdefault(name, []).append(
                            u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime
                        )
                        switches.setdefault(name, []).append(
                            u1.ru_nvcsw + u1.ru_nivcsw - u0.ru_nvcsw - u0.ru_nivcsw
                        )
            conn.close()
    finally:
        if engine == "postgres":
            import psycopg

            base = srv.PG_URL.replace("postgres://", "postgresql://", 1)
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{PG_SCHEMA}" CASCADE')
        else:
            srv.mysql_drop("split")
    us = {k: statistics.median(v) / parts[k][1] * 1e6 for k, v in times.items()}
    for k, v in times.items():
        each = [x / parts[k][1] * 1e6 for x in v]
        k_cpu = statistics.median(cpu[k]) / parts[k][1] * 1e6
        k_sw = statistics.median(switches[k]) / parts[k][1]
        print(
            f"  {k:<9} {us[k]:8.1f} us a call (min {min(each):.1f}, max {max(each):.1f}); "
            f"this process's CPU {k_cpu:.1f} us, context switches {k_sw:.2f} a call",
            flush=True,
        )
    c_us = {k: statistics.median(v) / parts[k][1] * 1e6 for k, v in cpu.items()}
    print(
        f"  CPU split of a step: Python step machinery "
        f"{c_us['workflow'] - c_us['run0'] / N - c_us['step_put']:.1f} us; native write "
        f"{c_us['step_put']:.1f} us (bridge alone {c_us['bridge']:.1f} us) against the raw "
        f"driver's {c_us['plain']:.1f} us",
        flush=True,
    )
    py = us["workflow"] - us["run0"] / N - us["step_put"]
    print(
        f"  split of a step: Python step machinery {py:.1f} us; native write beyond the raw "
        f"driver {us['step_put'] - us['plain']:.1f} us (bridge alone {us['bridge']:.1f} us); "
        f"a read: native - raw {us['step_get'] - us['plain_rd']:.1f} us; run start+finish "
        f"{us['run0']:.0f} us a run; workflow/plain {us['workflow'] / us['plain']:.2f}x",
        flush=True,
    )


def main() -> None:
    c.header(
        "bench_durable_split: where a durable step's time goes (Postgres, MySQL)",
        anchor=False,
        N=N,
        R=R,
        PG_OPTIONS=PG_OPTIONS or "-",
    )
    for engine in ENGINES:
        print(f"\n{engine}:", flush=True)
        asyncio.run(main_engine(engine))


if __name__ == "__main__":
    main()
