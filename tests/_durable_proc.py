"""A process of the durable-run proofs (``python _durable_proc.py MODE URL DIR [ARGS...]``).

Every side effect appends one line ``<epoch_ms> <pid> <KIND> <fields...>`` to ``DIR/log`` with
one ``write(2)`` on an ``O_APPEND`` descriptor: it is in the file once the call returns, even
if the process is SIGKILLed right after.

Modes:
  exec RUN_ID PRESET STEPS  run workflow ``steps`` (STEPS steps ``s``; each step's body
        writes ``E run_id i``) as RUN_ID (PRESET ``none`` or ``critical``); in a process with
        ``GNL_HOLD=i`` the body of step i writes ``H run_id i`` and then blocks (the test kills
        the process; the waker processes resume ``steps`` runs too).
        Waits for ``DIR/go`` first; writes ``R run_id <json result>`` or ``B run_id`` (busy).
  start RUN_ID SLEEP_MS  run workflow ``sleeper`` (step ``before``, ``ctx.sleep(SLEEP_MS)``,
        step ``after``, each body writing ``E run_id name``) as RUN_ID until it suspends;
        writes ``S run_id wake_at`` and exits.
  waker  run a waker (interval 50 ms) for ``steps`` and ``sleeper`` until ``DIR/stop`` exists.
  job    run a queue worker (ttl 1,500 ms) whose handler runs ``ctx.run(steps_in_job)``: 5
        steps writing ``E run_id i``; the first body of step 2 (no ``DIR/held`` yet) writes ``H``
        and blocks.
        Until ``DIR/stop`` exists.
  amo FIRST COUNT  run workflow ``pay`` as ``amo-FIRST`` … ``amo-(FIRST+COUNT-1)``, in order,
        skipping runs already done (a run whose killed process's 200 ms lease is live is
        tried again until it lapses): step ``pre``, at-most-once step ``pay`` (body: ``P run_id``,
        a few ms of work, ``Q run_id``), step ``post``. A run that raises
        StepOutcomeUnknownError writes ``U run_id``; one that finishes ``R run_id``.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path
from typing import Any

import gnl
from _proclog import exists, open_log, record, wait_file

HOLD = -1


async def steps(ctx: gnl.WorkflowContext, input: Any) -> Any:
    out = []
    for i in range(int(input["steps"])):

        async def body(i: int = i) -> int:
            record("E", ctx.run_id, i)
            if i == HOLD:
                record("H", ctx.run_id, i)
                await asyncio.sleep(3600)
            return i * 10

        out.append(await ctx.step("s", body))
    return out


async def sleeper(ctx: gnl.WorkflowContext, input: Any) -> Any:
    await ctx.step("before", record, "E", ctx.run_id, "before")
    await ctx.sleep(int(input["sleep_ms"]))
    await ctx.step("after", record, "E", ctx.run_id, "after")
    return "woke"


async def pay(ctx: gnl.WorkflowContext, input: Any) -> Any:
    await ctx.step("pre", lambda: 1)

    async def charge() -> str:
        record("P", ctx.run_id)
        await asyncio.sleep(random.uniform(0, 0.01))
        record("Q", ctx.run_id)
        return "receipt"

    receipt = await ctx.step("pay", charge, at_most_once=True)
    await ctx.step("post", lambda: 2)
    return receipt


WORKFLOWS = {"steps": steps, "sleeper": sleeper, "pay": pay}


async def main(mode: str, url: str, out: Path, args: list[str]) -> int:
    global HOLD
    HOLD = int(os.environ.get("GNL_HOLD", "-1"))
    open_log(out / "log")
    storage = await gnl.connect(url)
    g = gnl.create_gnl(storage, WORKFLOWS, lease_ms=1_500)
    if mode == "exec":
        run_id, preset, n = args[0], args[1], int(args[2])
        await wait_file(out / "go")
        try:
            result = await g.run_workflow(
                "steps",
                run_id=run_id,
                input={"steps": n},
                preset=None if preset == "none" else preset,
            )
            import json

            record("R", run_id, json.dumps(result))
        except gnl.RunBusyError:
            record("B", run_id)
    elif mode == "start":
        got = await g.run_workflow("sleeper", run_id=args[0], input={"sleep_ms": int(args[1])})
        assert isinstance(got, gnl.RunSuspended), got
        record("S", args[0], got.wake_at)
    elif mode == "waker":
        waker = gnl.create_workflow_waker(g, interval_ms=50)
        waker.start()
        await wait_file(out / "stop", 600)
        await waker.stop()
    elif mode == "job":

        async def steps_in_job(ctx: gnl.WorkflowContext, input: Any) -> Any:
            out_ = []
            for i in range(5):

                async def body(i: int = i) -> int:
                    record("E", ctx.run_id, i)
                    if i == 2 and not exists(out / "held"):
                        (out / "held").touch()
                        record("H", ctx.run_id, i)
                        await asyncio.sleep(3600)
                    return i

                out_.append(await ctx.step("s", body))
            return out_

        async def handler(payload: Any, ctx: gnl.JobContext) -> Any:
            return await ctx.run(steps_in_job)

        worker = gnl.create_worker(storage, {"job": handler}, ttl_ms=1_500, poll_ms=50)
        worker.start()
        await wait_file(out / "stop", 600)
        await worker.stop()
    elif mode == "amo":
        first, count = int(args[0]), int(args[1])
        g_amo = gnl.create_gnl(storage, WORKFLOWS, lease_ms=200)
        for i in range(first, first + count):
            run_id = f"amo-{i}"
            while True:
                try:
                    await g_amo.run_workflow("pay", run_id=run_id)
                    record("R", run_id)
                except gnl.StepOutcomeUnknownError:
                    record("U", run_id)
                except gnl.RunBusyError:
                    # The killed process's lease (200 ms) has not lapsed yet.
                    await asyncio.sleep(0.02)
                    continue
                break
    await storage.close()
    return 0


if __name__ == "__main__":
    code = asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4:]))
    os._exit(code)
