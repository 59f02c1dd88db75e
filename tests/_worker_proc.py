"""A worker process for the crash tests (run as ``python _worker_proc.py MODE URL DIR``).

Modes:
  crash  the handler records its attempt in DIR/attempts and kills its own process
         (``os._exit(1)``); the process exits 0 once the job is finished (dead/done).
  hold   the handler runs ``ctx.step("charge", ...)`` (whose side effect appends a line to
         DIR/side-effects), writes DIR/ready with its run id, then hangs (to be SIGKILLed).
  drain  the handler appends its job id to DIR/processed; the process exits once no job is
         pending or running (several such processes share the store).
  lease  the handler writes DIR/ready, waits for its signal, writes the reason to DIR/why and
         returns "stale"; the process exits once the handler has returned.

The process ends with ``os._exit`` so that a crash of the interpreter's own shutdown (tested
separately in test_process.py) does not blur what these tests check.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import gnl

TTL_MS = int(os.environ.get("GNL_TEST_TTL_MS", "500"))


def append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


async def main(mode: str, url: str, out: Path) -> int:
    storage = await gnl.connect(url)
    finished = asyncio.Event()

    async def crash(payload: Any, ctx: gnl.JobContext) -> None:
        append(out / "attempts", json.dumps({"attempt": ctx.attempt, "run_id": ctx.run_id}))
        os._exit(1)

    async def hold(payload: Any, ctx: gnl.JobContext) -> None:
        def charge(amount: int) -> dict[str, Any]:
            append(out / "side-effects", json.dumps({"charged": amount, "pid": os.getpid()}))
            return {"receipt": f"r-{amount}", "pid": os.getpid()}

        receipt = await ctx.step("charge", charge, payload["amount"])
        (out / "ready.tmp").write_text(
            json.dumps({"run_id": ctx.run_id, "attempt": ctx.attempt, "receipt": receipt})
        )
        os.replace(out / "ready.tmp", out / "ready")
        await asyncio.sleep(3600)

    async def lease(payload: Any, ctx: gnl.JobContext) -> str:
        (out / "ready").write_text(json.dumps({"run_id": ctx.run_id, "attempt": ctx.attempt}))
        try:
            reason = await asyncio.wait_for(ctx.signal.wait(), 30)
            (out / "why").write_text(reason.why)
        except asyncio.TimeoutError:
            (out / "why").write_text("no abort within 30 s")
        finished.set()
        return "stale"

    async def drain(payload: Any, ctx: gnl.JobContext) -> int:
        await asyncio.sleep(0.001)
        append(out / "processed", f"{ctx.job_id} {ctx.attempt} {os.getpid()}")
        return os.getpid()

    handlers = {"crash": crash, "hold": hold, "lease": lease, "drain": drain}
    worker = gnl.create_worker(
        storage,
        {"job": handlers[mode]},
        ttl_ms=TTL_MS,
        max_attempts=int(os.environ.get("GNL_TEST_MAX_ATTEMPTS", "3")),
        retry_delay_ms=0,
        concurrency=int(os.environ.get("GNL_TEST_CONCURRENCY", "1")),
        poll_ms=20,
        max_poll_ms=40,
    )
    worker.start()
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if mode == "lease" and finished.is_set():
                return 0
            if mode == "crash":
                jobs = (await gnl.list_all_jobs(storage)).items
                if jobs and all(j.state in ("dead", "done", "canceled") for j in jobs):
                    return 0
            if mode == "drain":
                states = set()
                cursor = None
                while True:
                    page = await gnl.list_all_jobs(storage, limit=1000, cursor=cursor)
                    states |= {j.state for j in page.items}
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                if states and not states & {"pending", "running"}:
                    return 0
            await asyncio.sleep(0.02)
        return 3
    finally:
        await worker.stop()
        await storage.close()


if __name__ == "__main__":
    code = asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
