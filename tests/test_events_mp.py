"""The event log's proofs across processes, on every backend (API.md "Events"; producers and
consumers run ``_events_proc.py``, their emits and handler calls are lines of one append-only
log):

* 3 producer processes x 2 consumer names (2 processes each, one holding the lease): every
  event handled exactly once per name, in log order, all acked; on Postgres and MySQL a
  producer transaction of the test's own connection, numbered from the topic's counter as an
  emit is, is held open again and again meanwhile (committed or rolled back): nothing skipped,
  nothing rolled back delivered;
* gnl's own emit held open mid-transaction (its insert waits behind an uncommitted row of a
  second connection) while later emits queue and consumers poll: nothing past it delivered
  while it is open, then everything once, in order;
* a consumer SIGKILLed mid-handler: its events are redelivered to the standby process after
  the lease (uncharged by the death: attempt 1 again), each acked once, nothing lost;
* a handler that kills its process uses up its attempts: quarantined after ``max_attempts``
  charged deliveries (the last one without a handler call), the rest flow;
* a kill inside a batch is charged to the event it hit only (issue 12's repro,
  ``max_attempts=1``): that event alone is quarantined, every other one handled and acked.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

import _support
import gnl

PROC = str(Path(__file__).with_name("_events_proc.py"))


def lines(tmp: Path, kind: str) -> list[list[str]]:
    """The log's ``kind`` lines, split: ``[ms, pid, kind, fields...]``."""
    log = tmp / "log"
    if not log.exists():
        return []
    out = []
    for ln in log.read_text().splitlines():
        f = ln.split(" ")
        if len(f) > 2 and f[2] == kind:
            out.append(f)
    return out


def handled(tmp: Path, name: str) -> list[list[str]]:
    """Handler calls of consumer ``name``: ``[ms, pid, "H", name, id, attempt]``."""
    return [h for h in lines(tmp, "H") if h[3] == name]


def wait_for(pred: Callable[[], bool], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextmanager
def processes(tmp: Path, url: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``spawn(mode, *args, **env)``: an ``_events_proc.py`` child on ``url``."""
    with _support.processes(PROC, tmp, 60) as spawn:
        yield lambda mode, *args, **env: spawn(mode, url, *args, **env)


class Raw:
    """A connection of the test's own to the store (psycopg, pymysql or sqlite3), not in
    autocommit: a statement opens a transaction that stays open until commit or rollback."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.conn: Any
        if backend == "postgres":
            import psycopg

            self.conn = psycopg.connect(url)
        elif backend == "mysql":
            import pymysql

            u = urlsplit(url)
            self.conn = pymysql.connect(
                host=u.hostname or "127.0.0.1",
                port=u.port or 3306,
                user=unquote(u.username or "root"),
                password=unquote(u.password or ""),
                database=u.path.lstrip("/"),
                autocommit=False,
            )
        else:
            self.conn = sqlite3.connect(url[len("sqlite:///") :])

    def execute(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        if self.backend == "sqlite":
            sql = sql.replace("%s", "?")
        cur = self.conn.cursor()
        cur.execute(sql, params)
        rows = list(cur.fetchall()) if cur.description else []
        cur.close()
        return rows

    def hold_emit(self, id: str) -> None:
        """Open a producer transaction as an emit is: the counter row taken and bumped, event
        ``id`` written with the number it gave. Left open."""
        self.execute("UPDATE gnl_topics SET last_seq = last_seq + 1 WHERE topic = 't'")
        self.execute(
            "INSERT INTO gnl_events (topic, seq, id, org, payload, deliver_at, emitted_at) "
            "SELECT topic, last_seq, %s, '', '{\"raw\": true}', 0, 0 FROM gnl_topics "
            "WHERE topic = 't'",
            id,
        )

    def log(self) -> list[str]:
        """The topic's event ids in log (seq) order, as committed."""
        self.conn.commit()
        rows = self.execute("SELECT id FROM gnl_events WHERE topic = 't' ORDER BY seq")
        self.conn.commit()
        return [r[0].decode() if isinstance(r[0], bytes) else r[0] for r in rows]

    def close(self) -> None:
        self.conn.close()


async def lag(url: str, name: str) -> gnl.ConsumerLag | None:
    async with await gnl.connect(url) as st:
        return await gnl.consumer_lag(st.work, "t", name)


async def emit_ids(url: str, ids: list[str]) -> None:
    async with await gnl.connect(url) as st:
        await gnl.emit_many(st.work, "t", [{"payload": {"id": i}, "id": i} for i in ids])


async def drain_again(url: str, name: str) -> gnl.DrainResult:
    """What a fresh consumer of ``name`` still gets (nothing, when every event was acked)."""

    async def handler(payload: Any, meta: gnl.EventMeta) -> None:
        pass

    async with await gnl.connect(url) as st:
        return await gnl.create_consumer(st.work, "t", handler, name=name).drain()


def producer_ids(p: int, n: int) -> list[str]:
    return [f"p{p}-{k}" for k in range(n)]


def test_three_producers_two_names_each_event_once_in_log_order(
    backend: str, store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    # Migrate the fresh store first: seven processes connecting to an empty MySQL store at
    # once can see its schema half-made (SchemaOutdatedError in the ones that did not migrate).
    assert asyncio.run(lag(url, "a")) is None
    n = 150
    want = {i for p in range(3) for i in producer_ids(p, n)}
    raw = Raw(backend, url)
    held_done = threading.Event()
    committed: list[str] = []

    def hold_producer_transactions() -> None:
        # A producer transaction held open 0.4 s while the others queue, committed or rolled
        # back, four times (SQLite has one writer: there every emit waits, which proves
        # nothing new; the raw transaction would only stall the run).
        try:
            if backend == "sqlite":
                return
            wait_for(lambda: len(lines(tmp_path, "E")) >= 20)
            for i in range(4):
                raw.hold_emit(f"raw-{i}")
                time.sleep(0.4)
                if i % 2 == 0:
                    raw.conn.commit()
                    committed.append(f"raw-{i}")
                else:
                    raw.conn.rollback()
                time.sleep(0.3)
        finally:
            held_done.set()

    with processes(tmp_path, url) as spawn:
        for name in ("a", "b"):
            for _ in range(2):
                spawn("consume", name)
        wait_for(lambda: len(lines(tmp_path, "S")) == 4)
        for p in range(3):
            spawn("produce", str(p), str(n))
        # Every producer connected before any starts (on a loaded machine one process's start-up
        # can outlast another's 150 emits, and the log would not interleave).
        wait_for(lambda: len(lines(tmp_path, "R")) == 3)
        holder = threading.Thread(target=hold_producer_transactions)
        holder.start()
        (tmp_path / "go").touch()
        try:
            wait_for(lambda: len(lines(tmp_path, "D")) == 3 and held_done.is_set())
            total = len(want) + len(committed)
            wait_for(lambda: all(len(handled(tmp_path, c)) >= total for c in ("a", "b")))
            time.sleep(0.5)  # anything handled twice would show now
        finally:
            holder.join()
    assert committed == ([] if backend == "sqlite" else ["raw-0", "raw-2"])
    want |= set(committed)
    log = raw.log()
    raw.close()
    assert set(log) == want and len(log) == len(want), "the log holds every committed emit"
    for name in ("a", "b"):
        got = handled(tmp_path, name)
        ids = [h[4] for h in got]
        assert Counter(ids) == Counter(want), f"{name}: each event handled exactly once"
        assert ids == log, f"{name}: in log order"
        assert all(h[5] == "1" for h in got), f"{name}: no event redelivered"
        lg = asyncio.run(lag(url, name))
        assert lg is not None and (lg.cursor, lg.behind, lg.dead) == (len(want), 0, 0)
        assert asyncio.run(drain_again(url, name)) == gnl.DrainResult(0, 0, 0), "all acked"
    # The producers' emits interleaved in the log.
    assert len({i.split("-")[0] for i in log[:60]}) >= 2


@pytest.mark.parametrize("backend", ["postgres", "mysql"])
def test_an_emit_held_open_mid_transaction_makes_nothing_skip(
    backend: str, store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    asyncio.run(emit_ids(url, ["first"]))
    blocker = Raw(backend, url)
    with processes(tmp_path, url) as spawn:
        for name in ("a", "b"):
            spawn("consume", name)
        wait_for(lambda: all(len(handled(tmp_path, c)) == 1 for c in ("a", "b")))
        # An uncommitted row with id "slow" on a second connection: gnl's emit of "slow" takes
        # the topic's counter and its number, then its insert waits for this transaction.
        blocker.execute(
            "INSERT INTO gnl_events (topic, seq, id, org, payload, deliver_at, emitted_at) "
            "VALUES ('t', -1, 'slow', '', '1', 0, 0)"
        )
        spawn("emit", "slow")
        time.sleep(1.0)
        spawn("emit", *[f"after-{i}" for i in range(5)])
        time.sleep(2.0)
        assert lines(tmp_path, "E") == [], "the held emit and the ones behind it wait"
        for c in ("a", "b"):
            assert [h[4] for h in handled(tmp_path, c)] == ["first"], "nothing delivered past"
        blocker.conn.rollback()
        wait_for(lambda: len(lines(tmp_path, "E")) == 6)
        want = ["first", "slow", *[f"after-{i}" for i in range(5)]]
        wait_for(lambda: all(len(handled(tmp_path, c)) >= len(want) for c in ("a", "b")))
        time.sleep(0.5)
    assert blocker.log() == want
    blocker.close()
    for c in ("a", "b"):
        assert [h[4] for h in handled(tmp_path, c)] == want, f"{c}: once each, in log order"
        lg = asyncio.run(lag(url, c))
        assert lg is not None and (lg.cursor, lg.behind) == (len(want), 0)


def test_a_consumer_killed_mid_handler_is_redelivered_after_the_lease(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    ids = [f"e-{i}" for i in range(30)]
    asyncio.run(emit_ids(url, ids))
    with processes(tmp_path, url) as spawn:
        victim = spawn("consume", "a", GNL_HOLD="e-10")
        wait_for(lambda: len(lines(tmp_path, "B")) == 1)
        standby = spawn("consume", "a")
        wait_for(lambda: len(lines(tmp_path, "S")) == 2)
        time.sleep(0.5)
        assert [h[4] for h in handled(tmp_path, "a")] == ids[:11], "the standby waits"
        killed_at = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        wait_for(lambda: len(handled(tmp_path, "a")) >= 11 + 30)
        time.sleep(0.5)
    got = handled(tmp_path, "a")
    first, second = got[:11], got[11:]
    assert {h[1] for h in first} == {str(victim.pid)}
    assert {h[1] for h in second} == {str(standby.pid)}
    assert [h[4] for h in second] == ids, "every event once more, in log order, none lost"
    # The victim's batch (handled or not, never acked) was not charged for its death: each
    # event comes back as attempt 1 (one at a time).
    assert all(h[5] == "1" for h in second), [h[5] for h in second]
    took_ms = int(second[0][0]) - killed_at * 1000
    assert took_ms >= 900, f"taken over {took_ms:.0f} ms after the kill: before the lease ran out"
    lg = asyncio.run(lag(url, "a"))
    assert lg is not None and (lg.cursor, lg.behind, lg.dead) == (30, 0, 0)
    assert asyncio.run(drain_again(url, "a")) == gnl.DrainResult(0, 0, 0), "acked once"


def run_poison(url: str, tmp: Path, max_attempts: int) -> tuple[list[gnl.DeadEvent], list[str]]:
    """Events ``e-0`` … ``e-19`` consumed by name ``a`` whose handler SIGKILLs its process on
    ``e-5``, a new process taking over each time, until nothing is behind. The quarantine
    records and the attempts of ``e-5``'s handler calls."""
    asyncio.run(emit_ids(url, [f"e-{i}" for i in range(20)]))
    env = {"GNL_CRASH": "e-5", "GNL_MAX_ATTEMPTS": str(max_attempts), "GNL_TEST_LEASE_MS": "600"}

    def settled() -> bool:
        lg = asyncio.run(lag(url, "a"))
        return lg is not None and lg.behind == 0

    with processes(tmp, url) as spawn:
        live = spawn("consume", "a", **env)
        deadline = time.monotonic() + 120
        while not settled():
            assert time.monotonic() < deadline, "timed out"
            assert len(lines(tmp, "S")) < 10, "the poison event keeps killing consumers"
            if live.poll() is not None:  # it killed itself: the next process takes over
                live = spawn("consume", "a", **env)
            time.sleep(0.1)
        time.sleep(0.5)

    async def dead() -> list[gnl.DeadEvent]:
        async with await gnl.connect(url) as st:
            return await gnl.list_dead_events(st.work, "t", "a")

    lg = asyncio.run(lag(url, "a"))
    assert lg is not None and (lg.cursor, lg.behind, lg.dead) == (20, 0, 1)
    got = handled(tmp, "a")
    assert {h[4] for h in got} == {f"e-{i}" for i in range(20)}, "the rest flowed"
    assert asyncio.run(drain_again(url, "a")) == gnl.DrainResult(0, 0, 0), "acked once"
    return asyncio.run(dead()), [h[5] for h in got if h[4] == "e-5"]


def test_a_handler_that_kills_its_process_uses_up_its_attempts(
    store_url: Callable[[], str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (d,), calls = run_poison(store_url(), tmp_path, 2)
    # The process that quarantines it says so (logger "gnl", on its stderr).
    assert "event 'e-5' is quarantined (gnl events dead): attempt 2 never returned" in (
        capfd.readouterr().err
    )
    # The first death, in a batch, is not charged; then max_attempts charged deliveries.
    assert calls == ["1", "1", "2"], "max_attempts charged deliveries, no more"
    # Three deliveries charged: two ran the handler, the third quarantined it unrun.
    assert (d.id, d.attempts) == ("e-5", 3) and "never returned" in d.error, d


def test_a_kill_inside_a_batch_charges_only_the_event_it_hit(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    """Issue 12's repro: a handler kills its process on the 6th event of a fetched batch, with
    ``max_attempts=1``. The batch is not charged for that death: its events come back one at a
    time, each charged, so the next death is charged to the killing event, which alone is
    quarantined (its error true: its attempt never returned); every other event is handled and
    acked."""
    dead, calls = run_poison(store_url(), tmp_path, 1)
    assert [(d.id, d.attempts, "never returned" in d.error) for d in dead] == [("e-5", 2, True)]
    assert calls == ["1", "1"], "killed once in the batch (uncharged), once charged"
