"""API.md "Queue" leases: crashed, killed and paused workers; reclaims; run ids; fencing.

Each test runs real worker processes (``_worker_proc.py``) against the same store.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gnl
from _support import all_jobs, job_state, wait_for

PROC = str(Path(__file__).with_name("_worker_proc.py"))

pytestmark = pytest.mark.slow


async def spawn(mode: str, url: str, out: Path, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        PROC,
        mode,
        url,
        str(out),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )


async def finish(proc: asyncio.subprocess.Process, timeout: float = 40) -> tuple[int, str]:
    _, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, err.decode(errors="replace")


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_a_handler_that_kills_its_process_uses_up_attempts(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    async with await gnl.connect(url) as st:
        job_id = await gnl.enqueue(st, "job", {"x": 1}, org_id="acme")
    codes = []
    for _ in range(6):
        code, err = await finish(await spawn("crash", url, tmp_path, GNL_TEST_MAX_ATTEMPTS="3"))
        assert code in (0, 1), err
        codes.append(code)
        if code == 0:
            break
    # Three processes ran the handler and died; the fourth found the job dead.
    assert codes == [1, 1, 1, 0]
    runs = [json.loads(line) for line in read_lines(tmp_path / "attempts")]
    assert [r["attempt"] for r in runs] == [1, 2, 3]
    assert len({r["run_id"] for r in runs}) == 1
    async with await gnl.connect(url) as st:
        job = await gnl.get_job(st, job_id, org_id="acme")
        assert job is not None
        assert job.state == "dead"
        assert job.attempts == 3
        assert job.last_error is not None and "lease" in job.last_error.lower()
        assert job.finished_at is not None
        # retry_job brings it back.
        assert await gnl.retry_job(st, job_id, org_id="acme") is True
        assert await job_state(st, job_id, "acme") == "pending"


async def test_a_killed_worker_leaves_its_job_to_another_with_the_same_run_id(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    async with await gnl.connect(url) as st:
        await gnl.enqueue(st, "job", {"amount": 42}, id="order-1", org_id="acme")
        proc = await spawn("hold", url, tmp_path)
        try:
            await wait_for(lambda: (tmp_path / "ready").exists(), timeout=20, what="the handler")
        finally:
            if proc.returncode is None:
                proc.kill()  # SIGKILL: no cleanup, the lease is left to go stale
            await finish(proc)
        assert proc.returncode == -signal.SIGKILL
        first = json.loads((tmp_path / "ready").read_text())
        assert first["attempt"] == 1
        assert await job_state(st, "order-1", "acme") == "running"

        seen: list[dict[str, Any]] = []

        def must_not_run(amount: int) -> dict[str, Any]:
            raise AssertionError("the step ran twice")

        async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
            receipt = await ctx.step("charge", must_not_run, payload["amount"])
            seen.append({"run_id": ctx.run_id, "attempt": ctx.attempt, "receipt": receipt})
            return receipt

        async with gnl.create_worker(storage=st, handlers={"job": handler}, ttl_ms=500, poll_ms=20):
            await wait_for(
                lambda: _eq(job_state(st, "order-1", "acme"), "done"),
                timeout=15,
                what="the reclaim",
            )
        assert seen == [{"run_id": first["run_id"], "attempt": 2, "receipt": first["receipt"]}]
        assert len(read_lines(tmp_path / "side-effects")) == 1
        job = await gnl.get_job(st, "order-1", org_id="acme")
        assert job is not None and job.attempts == 2 and job.result == first["receipt"]


async def test_a_paused_worker_loses_its_lease_and_its_late_write_changes_nothing(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    async with await gnl.connect(url) as st:
        await gnl.enqueue(st, "job", None, id="L")
        proc = await spawn("lease", url, tmp_path)
        resumed = False
        try:
            await wait_for(lambda: (tmp_path / "ready").exists(), timeout=20, what="the handler")
            # Pause the process while it does not hold SQLite's write lock: a write from here
            # must get through quickly.
            for _ in range(20):
                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    await asyncio.wait_for(gnl.cancel_job(st, "probe-no-such-job"), 1)
                    break
                except asyncio.TimeoutError:
                    os.kill(proc.pid, signal.SIGCONT)
                    await asyncio.sleep(0.05)
            else:
                pytest.fail("could not pause the worker outside a write")
            await asyncio.sleep(0.8)  # its 500 ms lease goes stale

            took_over = asyncio.Event()
            release = asyncio.Event()
            attempts: list[int] = []

            async def handler(payload: Any, ctx: gnl.JobContext) -> str:
                attempts.append(ctx.attempt)
                took_over.set()
                await asyncio.wait_for(release.wait(), 30)
                return "fresh"

            async with gnl.create_worker(st, {"job": handler}, ttl_ms=500, poll_ms=20):
                await asyncio.wait_for(took_over.wait(), 15)
                os.kill(proc.pid, signal.SIGCONT)
                resumed = True
                code, err = await finish(proc, timeout=30)
                assert code == 0, err
                # The stale holder's "stale" result was not written.
                job = await gnl.get_job(st, "L")
                assert job is not None and job.state == "running" and job.result is None
                release.set()
        finally:
            if not resumed and proc.returncode is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                await finish(proc)
        assert (tmp_path / "why").read_text() == "lease-lost"
        assert attempts == [2]
        job = await gnl.get_job(st, "L")
        assert job is not None and job.state == "done" and job.result == "fresh"
        assert job.attempts == 2


async def test_worker_processes_share_the_queue_without_double_claims(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    n = 400
    async with await gnl.connect(url) as st:
        await gnl.enqueue_many(
            st,
            [
                {"type": "job", "payload": i, "options": {"id": f"j{i}", "org_id": f"o{i % 5}"}}
                for i in range(n)
            ],
        )
        # A long lease: on a loaded machine a short one may expire between renewals, and the
        # job would (rightly) run twice.
        procs = [
            await spawn("drain", url, tmp_path, GNL_TEST_CONCURRENCY="4", GNL_TEST_TTL_MS="10000")
            for _ in range(3)
        ]
        for p in procs:
            code, err = await finish(p, timeout=60)
            assert code == 0, err
        lines = [line.split() for line in read_lines(tmp_path / "processed")]
        counts = Counter(job_id for job_id, _, _ in lines)
        assert counts == Counter({f"j{i}": 1 for i in range(n)})
        assert all(attempt == "1" for _, attempt, _ in lines)
        assert len({pid for _, _, pid in lines}) >= 2, "one process did all the work"
        jobs = await all_jobs(st)
        assert len(jobs) == n and all(j.state == "done" and j.attempts == 1 for j in jobs)


async def _eq(value: Any, expected: Any) -> bool:
    return bool((await value) == expected)


async def test_canceling_the_job_of_a_dead_worker(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    async with await gnl.connect(url) as st:
        await gnl.enqueue(st, "job", {"amount": 1}, id="c1")
        proc = await spawn("hold", url, tmp_path)
        try:
            await wait_for(lambda: (tmp_path / "ready").exists(), timeout=20, what="the handler")
        finally:
            if proc.returncode is None:
                proc.kill()
            await finish(proc)
        assert await job_state(st, "c1") == "running"
        # Running (its lease not expired yet): the cancel is accepted.
        assert await gnl.cancel_job(st, "c1") is True
        ran: list[str] = []

        async def handler(payload: Any, ctx: gnl.JobContext) -> None:
            ran.append(ctx.job_id)

        async with gnl.create_worker(st, {"job": handler}, ttl_ms=500, poll_ms=20):
            await wait_for(
                lambda: _eq(job_state(st, "c1"), "canceled"), timeout=15, what="canceled"
            )
            await asyncio.sleep(0.1)
        # The reclaim ends it as canceled; it is never run again.
        assert ran == []
        job = await gnl.get_job(st, "c1")
        assert job is not None and job.attempts == 1 and job.finished_at is not None
