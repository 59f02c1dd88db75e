"""A process of the event log's proofs (``python _events_proc.py MODE URL DIR [ARGS...]``).

Every side effect appends one line ``<epoch_ms> <pid> <KIND> <fields...>`` to ``DIR/log`` with
one ``write(2)`` on an ``O_APPEND`` descriptor: it is in the file once the call returns, even
if the process is SIGKILLed right after. Topic ``t`` throughout.

Modes:
  produce P N  connect, write ``R P``, wait for ``DIR/go``, then emit N events ``p<P>-<k>``
        (payload ``{"p": P, "k": k}``) in order: every 5th call an ``emit_many`` of 3
        (``p<P>-<k>`` … ``p<P>-<k+2>``), the others single ``emit`` calls, a random pause of
        0-3 ms between calls. Writes
        ``E id`` after each call returned for each of its events, ``D P`` at the end.
  emit ID...  emit one event per ID (payload ``{"id": ID}``), in order, each its own call;
        writes ``E id`` after each returned.
  consume NAME  run consumer NAME of ``t`` (poll 20 ms, lease ``GNL_TEST_LEASE_MS``, default
        1,500 ms, ``max_attempts`` ``GNL_MAX_ATTEMPTS``, default 8, retry delay 0) until
        ``DIR/stop`` exists. Its handler writes ``H NAME id attempt`` first, then:
        with ``GNL_HOLD=<id>``, on event ``<id>`` it writes ``B NAME id`` and blocks (the test
        kills the process); with ``GNL_CRASH=<id>``, on event ``<id>`` it SIGKILLs its own
        process. Writes ``S NAME`` once the consumer is started.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import gnl
from _proclog import exists, open_log, record, wait_file

TOPIC = "t"


async def produce(url: str, tmp: Path, p: int, n: int) -> None:
    async with await gnl.connect(url) as st:
        record("R", p)
        await wait_file(tmp / "go")
        k, call = 0, 0
        while k < n:
            if call % 5 == 4 and k + 3 <= n:
                ids = [f"p{p}-{k + j}" for j in range(3)]
                await gnl.emit_many(
                    st.work,
                    TOPIC,
                    [{"payload": {"p": p, "k": k + j}, "id": i} for j, i in enumerate(ids)],
                )
            else:
                ids = [await gnl.emit(st.work, TOPIC, {"p": p, "k": k}, id=f"p{p}-{k}")]
            for i in ids:
                record("E", i)
            k += len(ids)
            call += 1
            await asyncio.sleep(random.random() * 0.003)
        record("D", p)


async def emit(url: str, ids: list[str]) -> None:
    async with await gnl.connect(url) as st:
        for i in ids:
            await gnl.emit(st.work, TOPIC, {"id": i}, id=i)
            record("E", i)


async def consume(url: str, tmp: Path, name: str) -> None:
    hold = os.environ.get("GNL_HOLD")
    crash = os.environ.get("GNL_CRASH")
    lease_ms = int(os.environ.get("GNL_TEST_LEASE_MS", "1500"))
    max_attempts = int(os.environ.get("GNL_MAX_ATTEMPTS", "8"))

    async def handler(payload: Any, meta: gnl.EventMeta) -> None:
        record("H", name, meta.id, meta.attempt)
        if meta.id == hold:
            record("B", name, meta.id)
            await asyncio.sleep(3600)
        if meta.id == crash:
            os.kill(os.getpid(), signal.SIGKILL)

    async with await gnl.connect(url) as st:
        c = gnl.create_consumer(
            st.work,
            TOPIC,
            handler,
            name=name,
            poll_ms=20,
            lease_ms=lease_ms,
            max_attempts=max_attempts,
            retry_delay_ms=0,
        )
        c.start()
        record("S", name)
        while True:
            if exists(tmp / "stop"):
                break
            await asyncio.sleep(0.05)
        await c.stop()


def main() -> None:
    mode, url, tmp = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    open_log(tmp / "log")
    if mode == "produce":
        asyncio.run(produce(url, tmp, int(sys.argv[4]), int(sys.argv[5])))
    elif mode == "emit":
        asyncio.run(emit(url, sys.argv[4:]))
    elif mode == "consume":
        asyncio.run(consume(url, tmp, sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
