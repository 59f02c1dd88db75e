"""Studio's pages on a big store: each page's response time (p50/p99 over N requests, ms) on a
store of 1,000,000 jobs over 10,000 organizations, per engine. The bar: every page < 200 ms.

A real ``gnl studio`` process serves the pages over HTTP (loopback, no token); the store is
filled with ``enqueue_many`` in batches of 100,000, then a worker runs ``FINISH`` jobs (half
fail into ``dead``, half ``done``) so the overview's chart and dead counts have data.

The runs, triggers and dead-events pages get their own data on the same store: RUNS durable
runs (each with one step; every 100th failed), TRIGGERS triggers, DEAD quarantined events of
one consumer and CONSUMERS more consumers (one dead event each).

The anchor: the public-API calls a page makes, timed in-process on the same store under the
same read timeout (``list_orgs`` + ``count_jobs`` of one page of organizations for the
overview, ``scan_jobs`` for the jobs pages, ``get_job`` for a job, ``scan_runs`` /
``get_run``, ``list_triggers`` (a page of 51), ``list_consumers``, ``list_dead_events``): the
ratio page ÷ anchor is what the web layer (HTTP, templates, a second process) adds.

Env: BACKENDS (default ``sqlite,postgres,mysql``), JOBS (1,000,000), ORGS (10,000), N (50
requests per page), FINISH (2,000), RUNS (20,000), TRIGGERS (1,000), DEAD (10,000),
CONSUMERS (200). Postgres and MySQL: a database ``gnl_bench_studio`` on the
local servers (``PG_ADMIN_URL`` / ``MYSQL_HOST``), created and dropped by the run.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as c
import gnl

JOBS = c.env_int("JOBS", 1_000_000)
ORGS = c.env_int("ORGS", 10_000)
N = c.env_int("N", 50)
FINISH = c.env_int("FINISH", 2_000)
RUNS = c.env_int("RUNS", 20_000)
TRIGGERS = c.env_int("TRIGGERS", 1_000)
DEAD = c.env_int("DEAD", 10_000)
CONSUMERS = c.env_int("CONSUMERS", 200)
BATCH = 100_000
BACKENDS = [b for b in os.environ.get("BACKENDS", "sqlite,postgres,mysql").split(",") if b]
DB = "gnl_bench_studio"
TYPES = ("email", "report", "sync")
ONE_CONSUMER = "/dead-events/consumer?topic=orders&consumer=billing"


def org(i: int) -> str:
    return f"org{i % ORGS:05d}"


def server_sql(backend: str, sql: str) -> None:
    """Run ``sql`` on the local Postgres (database postgres) or MySQL server."""
    if backend == "postgres":
        cmd = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc", sql]
    else:
        cmd = ["mysql", "-h", "127.0.0.1", "-uroot", "-e", sql]
    subprocess.run(cmd, check=True)


def store_for(backend: str, work: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{work}/studio.db"
    drop_db(backend)
    server_sql(backend, f"CREATE DATABASE {DB}")
    if backend == "postgres":
        return f"postgres://postgres@127.0.0.1:5432/{DB}"
    return f"mysql://root@127.0.0.1:3306/{DB}"


def drop_db(backend: str) -> None:
    if backend == "postgres":
        server_sql(backend, f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    elif backend == "mysql":
        server_sql(backend, f"DROP DATABASE IF EXISTS {DB}")


async def fill(url: str) -> float:
    t0 = time.perf_counter()
    async with await gnl.connect(url) as st:
        for start in range(0, JOBS, BATCH):
            await gnl.enqueue_many(
                st.work,
                [
                    {
                        "type": TYPES[i % 3],
                        "payload": {"i": i, "note": f"row {i}"},
                        "options": {"id": f"j{i}", "org_id": org(i)},
                    }
                    for i in range(start, min(JOBS, start + BATCH))
                ],
            )
        seen = 0
        enough = asyncio.Event()

        async def handler(payload: Any, ctx: gnl.JobContext) -> None:
            nonlocal seen
            seen += 1
            if seen >= FINISH:
                enough.set()
            if payload["i"] % 2:
                raise RuntimeError(f"row {payload['i']} failed")

        worker = gnl.create_worker(
            st, {t: handler for t in TYPES}, ttl_ms=30_000, max_attempts=1, concurrency=32
        )
        worker.start()
        await asyncio.wait_for(enough.wait(), 600)
        await worker.stop()
    return time.perf_counter() - t0


async def fill_ops(url: str) -> float:
    """Runs, triggers and dead events for the runs, triggers and dead-events pages."""
    t0 = time.perf_counter()
    async with await gnl.connect(url) as st:

        async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
            out = await ctx.step("work", lambda: {"i": input, "note": f"run {input}"})
            if input % 100 == 0:
                raise RuntimeError(f"run {input} failed")
            return out

        g = gnl.create_gnl(st, {"wf": wf})
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                try:
                    await g.run_workflow("wf", input=i, run_id=f"run-{i:07d}")
                except RuntimeError:
                    pass

        await asyncio.gather(*(one(i) for i in range(RUNS)))
        for i in range(TRIGGERS):
            await gnl.schedule_workflow(st, "wf", id=f"trig-{i:05d}", every_ms=60_000 + i)

        async def fail(payload: Any, meta: gnl.EventMeta) -> None:
            raise RuntimeError(f"event {meta.id} failed")

        for start in range(0, DEAD, 10_000):
            await gnl.emit_many(
                st.work,
                "orders",
                [
                    {"payload": {"i": i}, "id": f"ev{i}"}
                    for i in range(start, min(DEAD, start + 10_000))
                ],
            )
        await gnl.create_consumer(st.work, "orders", fail, name="billing", max_attempts=1).drain()
        for i in range(CONSUMERS):
            topic = f"topic-{i:04d}"
            await gnl.emit(st.work, topic, {"i": i}, id="only")
            await gnl.create_consumer(st.work, topic, fail, name="c", max_attempts=1).drain()
    return time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
    r = conn.getresponse()
    r.read()
    ms = (time.perf_counter() - t0) * 1000
    conn.close()
    return r.status, ms


def p50_p99(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return statistics.median(s), s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]


async def time_async(fn: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    for _ in range(3):
        await fn()
    xs = []
    for _ in range(N):
        t0 = time.perf_counter()
        await fn()
        xs.append((time.perf_counter() - t0) * 1000)
    return p50_p99(xs)


async def anchors(
    url: str, some: gnl.JobInfo, mid_run: tuple[int, str]
) -> dict[str, tuple[float, float]]:
    # Under Studio's statement timeout (2 s), as the pages read.
    async with await gnl.connect(url, read_timeout_ms=2_000) as st:
        w = st.work

        async def overview() -> None:
            orgs = await gnl.list_orgs(w, limit=26)
            await gnl.count_jobs(w, orgs[:25], scan=1_000, timeout_ms=2_000)

        async def middle() -> None:
            orgs = await gnl.list_orgs(w, limit=26, after=org(ORGS // 2))
            await gnl.count_jobs(w, orgs[:25], scan=1_000, timeout_ms=2_000)

        return {
            "overview": await time_async(overview),
            "overview, middle page": await time_async(middle),
            "jobs": await time_async(lambda: gnl.scan_jobs(w, limit=50, scan=2_000)),
            "jobs, state=dead": await time_async(
                lambda: gnl.scan_jobs(w, state="dead", limit=50, scan=2_000)
            ),
            "jobs, one org, pending": await time_async(
                lambda: gnl.scan_jobs(w, org_id=some.org_id, state="pending", limit=50, scan=2_000)
            ),
            "job": await time_async(lambda: gnl.get_job(w, some.id, some.org_id)),
            "runs": await time_async(lambda: gnl.scan_runs(st)),
            "runs, state=failed": await time_async(lambda: gnl.scan_runs(st, state="failed")),
            "runs, state=suspended (none: 2,000 examined)": await time_async(
                lambda: gnl.scan_runs(st, state="suspended")
            ),
            "runs, a middle page": await time_async(
                lambda: gnl.scan_runs(st, cursor=f"{mid_run[0]}:{mid_run[1]}")
            ),
            "run": await time_async(lambda: gnl.get_run(st, "run-0000001")),
            "triggers": await time_async(lambda: gnl.list_triggers(st, limit=51)),
            "dead events (consumers)": await time_async(lambda: gnl.list_consumers(w, limit=51)),
            "dead events of one consumer": await time_async(
                lambda: gnl.list_dead_events(w, "orders", "billing", limit=51)
            ),
            "dead events of one consumer, a middle page": await time_async(
                lambda: gnl.list_dead_events(w, "orders", "billing", after_seq=DEAD // 2, limit=51)
            ),
        }


async def middle_run(url: str) -> tuple[int, str]:
    async with await gnl.connect(url) as st:
        run = await gnl.get_run(st, f"run-{RUNS // 2:07d}")
        assert run is not None
        return run.created_at, run.run_id


async def one_job(url: str) -> gnl.JobInfo:
    async with await gnl.connect(url) as st:
        page = await gnl.list_jobs(st.work, org_id=org(4242), limit=1)
        return page.items[0]


def bench(backend: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="gnl-bench-studio-"))
    url = store_for(backend, work)
    try:
        secs = asyncio.run(fill(url))
        print(
            f"\n{backend}: filled {JOBS:,} jobs over {ORGS:,} organizations, "
            f"{FINISH:,} run, in {secs:.1f} s",
            flush=True,
        )
        secs = asyncio.run(fill_ops(url))
        print(
            f"{backend}: {RUNS:,} runs, {TRIGGERS:,} triggers, {DEAD:,} + {CONSUMERS:,} dead "
            f"events in {secs:.1f} s",
            flush=True,
        )
        some = asyncio.run(one_job(url))
        middle = asyncio.run(middle_run(url))
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gnl",
                "studio",
                url,
                "--port",
                str(port),
                "--audit-log",
                str(work / "audit.jsonl"),
            ],
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("gnl studio did not start") from None
                    time.sleep(0.1)
            pages = {
                "overview": "/",
                "overview, middle page": f"/?after={org(ORGS // 2)}",
                "overview counts (htmx refresh)": "/overview/counts",
                "jobs": "/jobs",
                "jobs, state=dead": "/jobs?state=dead",
                "jobs, one org, pending": f"/jobs?org={some.org_id}&state=pending",
                "job": f"/job?org={some.org_id}&id={some.id}",
                "audit": "/audit",
                "runs": "/runs",
                "runs, state=failed": "/runs?state=failed",
                "runs, state=suspended (none: 2,000 examined)": "/runs?state=suspended",
                "runs, a middle page": f"/runs?cursor={middle[0]}:{middle[1]}",
                "runs table (htmx refresh)": "/runs/table",
                "run": "/run?id=run-0000001",
                "triggers": "/triggers",
                "triggers, a middle page": f"/triggers?after=trig-{TRIGGERS // 2:05d}",
                "dead events (consumers)": "/dead-events",
                "dead events of one consumer": ONE_CONSUMER,
                "dead events of one consumer, a middle page": (
                    f"{ONE_CONSUMER}&after_seq={DEAD // 2}"
                ),
            }
            anchor = asyncio.run(anchors(url, some, middle))
            print("| page | p50 ms | p99 ms | anchor p50 ms (API calls) | ratio | < 200 ms |")
            print("|---|---|---|---|---|---|")
            for name, path in pages.items():
                for _ in range(3):
                    get(port, path)
                xs = []
                for _ in range(N):
                    status, ms = get(port, path)
                    assert status == 200, (path, status)
                    xs.append(ms)
                p50, p99 = p50_p99(xs)
                a = anchor.get(name)
                a_txt = f"{a[0]:.1f}" if a else "—"
                ratio = f"{p50 / a[0]:.2f}x" if a and a[0] > 0 else "—"
                ok = "met" if p99 < 200 else "NOT met"
                print(
                    f"| {name} | {p50:.1f} | {p99:.1f} | {a_txt} | {ratio} | {ok} (p99) |",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        drop_db(backend)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    c.header(
        "Studio pages on a big store (bench_studio.py)",
        anchor=False,
        jobs=JOBS,
        orgs=ORGS,
        requests_per_page=N,
        runs=RUNS,
        triggers=TRIGGERS,
        dead_events=DEAD,
        consumers=CONSUMERS,
        backends=",".join(BACKENDS),
    )
    for b in BACKENDS:
        bench(b)


if __name__ == "__main__":
    main()
