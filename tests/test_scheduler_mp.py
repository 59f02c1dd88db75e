"""The scheduler's proofs across processes, on every backend (API.md "Scheduler"; the pollers
run ``_sched_proc.py``, their fires are lines of one append-only log):

* 3 poller processes racing over 1,000 due slots: each slot fired exactly once;
* pollers whose own clocks are 30 s ahead and 30 s behind (a test-only offset): no slot fired
  twice, none before its time on the store's clock;
* a poller SIGKILLed mid-fire: the slot is fired by another poller after the lock TTL, with the
  same run id and slot, and counted once;
* a rolling restart (a poller SIGKILLed and replaced every 0.4 s): no slot lost.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import gnl

PROC = str(Path(__file__).with_name("_sched_proc.py"))


def fires(tmp: Path) -> list[list[str]]:
    log = tmp / "log"
    if not log.exists():
        return []
    return [ln.split(" ") for ln in log.read_text().splitlines() if ln.startswith("F ")]


def wait_for(pred: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextmanager
def pollers(tmp: Path, url: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(**env: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            [sys.executable, PROC, url, str(tmp)],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
        )
        procs.append(p)
        return p

    try:
        yield spawn
    finally:
        (tmp / "stop").touch()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def register(url: str, ats: list[int]) -> int:
    """Register one ``at`` trigger per instant (ids ``t<i>``); returns the store's clock."""
    async with await gnl.connect(url) as st:
        for i, at in enumerate(ats):
            await gnl.schedule_workflow(st, "wf", id=f"t{i}", at=at)
        return await st.now_ms()


async def triggers(url: str) -> list[gnl.TriggerInfo]:
    async with await gnl.connect(url) as st:
        return await gnl.list_triggers(st)


async def store_now(url: str) -> int:
    async with await gnl.connect(url) as st:
        return await st.now_ms()


def check_once(tmp: Path, url: str, n: int) -> list[list[str]]:
    got = fires(tmp)
    runs = Counter(f[1] for f in got)
    assert runs == Counter({f"sched:t{i}:0": 1 for i in range(n)}), "each slot exactly once"
    ts = asyncio.run(triggers(url))
    assert len(ts) == n and all(t.state == "done" and t.fire_count == 1 for t in ts)
    return got


def test_three_pollers_fire_each_of_1000_slots_once(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    # Due together, once every poller has started.
    at = asyncio.run(store_now(url)) + 15_000
    asyncio.run(register(url, [at + i for i in range(1_000)]))
    with pollers(tmp_path, url) as spawn:
        for _ in range(3):
            # A short fire lock (renewed every 167 ms): a lock acquired while a poll's other
            # fires held the store calls' cap lapsed before its fire (slots fired twice on
            # Postgres and MySQL at 300 ms, and once on a loaded MySQL at 1,500 ms).
            spawn(GNL_TEST_TTL_MS="500")
        wait_for(lambda: len(fires(tmp_path)) >= 1_000)
        time.sleep(0.5)
    got = check_once(tmp_path, url, 1_000)
    assert len({f[4] for f in got}) >= 2, "the pollers raced"


def test_skewed_poller_clocks_neither_double_nor_fire_early(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    now = asyncio.run(store_now(url))
    ats = [now + 1_500 + 50 * i for i in range(40)]
    asyncio.run(register(url, ats))
    with pollers(tmp_path, url) as spawn:
        for off in ("30000", "-30000", "0"):
            spawn(GNL_TEST_CLOCK_OFFSET_MS=off)
        wait_for(lambda: len(fires(tmp_path)) >= 40)
        time.sleep(0.5)
    got = check_once(tmp_path, url, 40)
    for _, _run_id, slot, fired_at, _pid in got:
        assert int(fired_at) >= int(slot), "fired before its time on the store's clock"


def test_a_poller_killed_mid_fire_is_taken_over_after_the_lock_ttl(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    asyncio.run(register(url, [1_000]))
    with pollers(tmp_path, url) as spawn:
        victim = spawn(GNL_HOLD="1")
        wait_for(lambda: len(fires(tmp_path)) == 1)
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        spawn()
        wait_for(lambda: len(fires(tmp_path)) == 2)
        took = time.monotonic() - killed_at
        time.sleep(0.3)
    (a, b) = fires(tmp_path)
    assert a[1] == b[1] == "sched:t0:0" and a[2] == b[2] == "1000"
    assert a[4] != b[4]
    assert took >= 1.0, "not before the lock's TTL (1.5 s) ran out"
    (t,) = asyncio.run(triggers(url))
    assert (t.state, t.fire_count) == ("done", 1)


def test_a_rolling_restart_of_pollers_loses_no_slot(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    now = asyncio.run(store_now(url))
    n = 60
    ats = [now + 500 + 60 * i for i in range(n)]
    asyncio.run(register(url, ats))
    with pollers(tmp_path, url) as spawn:
        live = [spawn(GNL_TEST_TTL_MS="600") for _ in range(2)]
        end = time.monotonic() + 5
        while time.monotonic() < end:
            time.sleep(0.4)
            old = live.pop(0)
            old.send_signal(signal.SIGKILL)
            old.wait()
            live.append(spawn(GNL_TEST_TTL_MS="600"))
        wait_for(lambda: {f[1] for f in fires(tmp_path)} >= {f"sched:t{i}:0" for i in range(n)})
        time.sleep(1.5)
    got = fires(tmp_path)
    assert {f[1] for f in got} == {f"sched:t{i}:0" for i in range(n)}, "no slot lost"
    for f in got:
        assert f[2] == str(ats[int(f[1].split(":")[1][1:])]), "the slot it owed"
    ts = asyncio.run(triggers(url))
    assert all(t.state == "done" and t.fire_count == 1 for t in ts)
