"""The sample app ``gnl run`` runs in tests/test_app.py (``gnl run _app_sample:app``).

Behaviour comes from the environment: ``APP_OUT`` (a file each handler appends a line to),
``APP_WORK_MS`` (how long a job's handler works), ``APP_IGNORE_SIGNAL`` (the handler does not
look at its signal), ``APP_EVERY_MS`` (the schedule's interval).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import gnl

app = gnl.App()  # the store: GNL_URL (or gnl run --url)

OUT = os.environ.get("APP_OUT", "app-out.txt")
WORK_S = int(os.environ.get("APP_WORK_MS", "50")) / 1000
IGNORE_SIGNAL = bool(os.environ.get("APP_IGNORE_SIGNAL"))


def note(line: str) -> None:
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(line + "\n")


@app.job("work", concurrency=4, ttl_ms=3_000, retry_delay_ms=100)
async def work(payload: Any, ctx: gnl.JobContext) -> Any:
    note(f"start {ctx.job_id} {ctx.attempt}")
    if IGNORE_SIGNAL:
        await asyncio.sleep(WORK_S)
    else:
        try:
            await asyncio.wait_for(ctx.signal.wait(), WORK_S)
        except asyncio.TimeoutError:
            pass
        else:
            note(f"revoked {ctx.job_id} {ctx.signal.reason.why if ctx.signal.reason else ''}")
            ctx.signal.raise_if_aborted()
    note(f"end {ctx.job_id}")
    return {"n": payload["n"]}


@app.workflow("tick")
async def tick(ctx: gnl.WorkflowContext, input: Any) -> Any:
    return await ctx.step("note", lambda: note("tick") or "ok")


app.schedule("tick", every_ms=int(os.environ.get("APP_EVERY_MS", "300")))


@app.consumer("orders", "billing", retry_delay_ms=100)
async def bill(payload: Any, meta: gnl.EventMeta) -> None:
    note(f"event {meta.id}")
