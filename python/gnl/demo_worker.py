"""One worker process of ``gnl demo`` (the orchestrator is :mod:`gnl.demo`).

Each process connects to the demo's store with :func:`gnl.connect`, runs one
:func:`gnl.create_worker` for the ``import-row`` job type, and writes every row to the
``demo_results`` table of the results file through ``ctx.step`` — the side effect that must
happen exactly once per row even though one of these processes kills itself mid-run.

The results file is a separate SQLite file on purpose: the side effect lives outside the
queue's database, like a real one (a search index, another service), so nothing but the step
journal stands between a reclaimed job and a second write. ``demo_results`` has no unique
constraint, so a second write would really show up as a second row.

Messages go through the ``logging`` module to a queue read by the parent, which prints them
above its progress bar.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import random
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Event
from typing import Any

import gnl

__all__ = [
    "CRASH_EXIT_CODE",
    "JOB_TYPE",
    "RESULTS_TABLE",
    "WorkerConfig",
    "WorkerStats",
    "create_results_table",
    "normalise_row",
    "worker_main",
]

#: The job type the demo enqueues and its workers handle.
JOB_TYPE = "import-row"
#: The table of the results file that the handler writes to.
RESULTS_TABLE = "demo_results"
#: The exit code of the worker process that crashes on purpose.
CRASH_EXIT_CODE = 3

#: The geographic centre of the contiguous United States (Lebanon, Kansas).
_CENTRE = (39.8283, -98.5795)
_EARTH_RADIUS_KM = 6371.0088
_LAT_NAMES = ("latitude", "lat")
_LON_NAMES = ("longitude", "lon", "lng", "long")

log = logging.getLogger("gnl.demo")


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker process needs (pickled to it by ``multiprocessing``)."""

    index: int
    name: str
    url: str
    results_path: str
    ttl_ms: int
    concurrency: int
    work_ms: float
    #: Kill this process with ``os._exit`` once this many rows went through ``ctx.step``.
    crash_after: int | None = None
    seed: int = 0


@dataclass
class WorkerStats:
    """What one worker process did (sent to the parent when it stops cleanly)."""

    handled: int = 0  # handler runs that returned
    written: int = 0  # runs whose step ran ``write_row`` (the side effect)
    replayed: int = 0  # runs whose step was already journaled: the recorded result came back
    reruns: int = 0  # runs with ctx.attempt > 1 (the job had been claimed before)
    lost: int = 0  # runs whose signal aborted (lease lost, canceled)
    slow_steps: int = 0  # steps that took more than half the lease
    started: int = 0
    in_window: int = 0  # handlers between their side effect and its journal record
    errors: list[str] = field(default_factory=list)


# -- the result table -----------------------------------------------------------------------------


def open_results(path: str) -> sqlite3.Connection:
    """Open the results file (autocommit, WAL, a generous busy timeout)."""
    db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=30000")
    return db


def create_results_table(path: str) -> None:
    """Create ``demo_results`` (no unique constraint: a duplicate write shows up as a row)."""
    db = open_results(path)
    try:
        db.execute(
            f"""CREATE TABLE IF NOT EXISTS {RESULTS_TABLE} (
                row_key     TEXT    NOT NULL,
                org         TEXT,
                worker      TEXT    NOT NULL,
                attempt     INTEGER NOT NULL,
                run_id      TEXT    NOT NULL,
                name        TEXT,
                distance_km REAL,
                digest      TEXT    NOT NULL,
                problems    TEXT,
                written_at  INTEGER NOT NULL
            )"""
        )
        db.execute(f"CREATE INDEX IF NOT EXISTS {RESULTS_TABLE}_key ON {RESULTS_TABLE} (row_key)")
    finally:
        db.close()


# -- the work a row gets --------------------------------------------------------------------------


def _pick(row: dict[str, str | None], names: tuple[str, ...]) -> str | None:
    lower = {k.lower(): k for k in row}
    for n in names:
        if n in lower:
            return row[lower[n]]
    return None


def _haversine_km(lat: float, lon: float) -> float:
    p1, p2 = math.radians(_CENTRE[0]), math.radians(lat)
    dp, dl = p2 - p1, math.radians(lon - _CENTRE[1])
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * _EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(a)))


def normalise_row(payload: Any) -> dict[str, Any]:
    """Validate and normalise one CSV row.

    Strips whitespace, collapses inner runs of spaces, and when the row has latitude and
    longitude columns checks their range and computes the great-circle distance to the centre
    of the contiguous US. Bad values are reported in ``problems``, never raised: a row is
    imported with its problems noted.
    """
    if not isinstance(payload, dict):
        raise TypeError(f"an import-row payload is a JSON object, not {type(payload).__name__}")
    row: dict[str, str | None] = {}
    for k, v in payload.items():
        row[str(k)] = None if v is None else " ".join(str(v).split())
    problems: list[str] = []
    distance: float | None = None
    lat_s, lon_s = _pick(row, _LAT_NAMES), _pick(row, _LON_NAMES)
    if lat_s and lon_s:
        try:
            lat, lon = float(lat_s), float(lon_s)
        except ValueError:
            problems.append(f"coordinates are not numbers: {lat_s!r}, {lon_s!r}")
        else:
            if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0):
                problems.append(f"coordinates out of range: {lat}, {lon}")
            else:
                distance = round(_haversine_km(lat, lon), 3)
    canonical = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {
        "name": _pick(row, ("name", "title")),
        "distance_km": distance,
        "digest": hashlib.sha256(canonical.encode()).hexdigest()[:16],
        "problems": "; ".join(problems) or None,
    }


# -- the worker process ---------------------------------------------------------------------------


class _PipeHandler(logging.Handler):
    """Sends log records to the parent as plain tuples (synchronously, so a message logged
    right before ``os._exit`` still arrives)."""

    def __init__(self, out: SimpleQueue[Any], worker: str) -> None:
        super().__init__()
        self._out = out
        self._worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._out.put(("log", self._worker, record.levelno, record.name, self.format(record)))
        except Exception:  # noqa: BLE001 - logging must never take the worker down
            self.handleError(record)


def worker_main(cfg: WorkerConfig, go: Event, stop: Event, out: SimpleQueue[Any]) -> None:
    """The entry point of one worker process (``multiprocessing``, spawn context).

    Connects, reports ``ready``, waits for ``go``, works until ``stop``, then sends its stats.
    """
    handler = _PipeHandler(out, cfg.name)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name, level in (("gnl", logging.WARNING), ("gnl.demo", logging.INFO)):
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        lg.setLevel(level)
        lg.propagate = False
    try:
        stats = asyncio.run(_serve(cfg, go, stop, out))
    except BaseException as e:
        log.error("%s stopped on an error: %s: %s", cfg.name, type(e).__name__, e)
        out.put(("failed", cfg.index, f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None
    out.put(("stats", cfg.index, asdict(stats)))


async def _wait_event(event: Event, timeout_s: float | None = None) -> bool:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not event.is_set():
        if deadline is not None and time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _serve(cfg: WorkerConfig, go: Event, stop: Event, out: SimpleQueue[Any]) -> WorkerStats:
    stats = WorkerStats()
    rng = random.Random(cfg.seed)
    results = open_results(cfg.results_path)
    insert = (
        f"INSERT INTO {RESULTS_TABLE} (row_key, org, worker, attempt, run_id, name, distance_km,"
        " digest, problems, written_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )

    async def handle(payload: Any, ctx: gnl.JobContext) -> dict[str, Any]:
        stats.started += 1
        if ctx.attempt > 1:
            stats.reruns += 1
        row = normalise_row(payload)
        # The row's I/O (an HTTP call, a lookup...): what makes several workers worth it.
        await asyncio.sleep(rng.uniform(0.5, 1.5) * cfg.work_ms / 1000)
        wrote = False

        def write_row() -> dict[str, Any]:
            nonlocal wrote
            wrote = True
            stats.in_window += 1
            cur = results.execute(
                insert,
                (
                    ctx.job_id,
                    ctx.org_id,
                    cfg.name,
                    ctx.attempt,
                    ctx.run_id,
                    row["name"],
                    row["distance_km"],
                    row["digest"],
                    row["problems"],
                    int(time.time() * 1000),
                ),
            )
            return {"rowid": cur.lastrowid, "worker": cfg.name, "attempt": ctx.attempt}

        step_started = time.monotonic()
        try:
            recorded = await ctx.step("write-row", write_row)
        except gnl.ExecutionRevokedError as e:
            stats.lost += 1
            log.warning(
                "%s: %s (org %s) revoked before its step: %s",
                cfg.name,
                ctx.job_id,
                ctx.org_id,
                e.why,
            )
            raise
        finally:
            if wrote:
                stats.in_window -= 1
        step_ms = (time.monotonic() - step_started) * 1000
        if step_ms > cfg.ttl_ms / 2:
            stats.slow_steps += 1
            log.warning(
                "%s: the step of %s (org %s) took %.0f ms (lease %d ms)%s",
                cfg.name,
                ctx.job_id,
                ctx.org_id,
                step_ms,
                cfg.ttl_ms,
                f"; its signal aborted: {ctx.signal.reason.why}" if ctx.signal.reason else "",
            )
        if wrote:
            stats.written += 1
        else:
            stats.replayed += 1
            log.info(
                "%s: %s (org %s, attempt %d) was written by %s on attempt %d; step replayed, "
                "not written again",
                cfg.name,
                ctx.job_id,
                ctx.org_id,
                ctx.attempt,
                recorded.get("worker"),
                recorded.get("attempt"),
            )
        stats.handled += 1
        if (
            cfg.crash_after is not None
            and stats.handled >= cfg.crash_after
            and stats.in_window == 0
        ):
            # The step of this job is journaled, its handler has not returned: the job stays
            # `running` under this worker's lease, which nobody renews after os._exit.
            log.warning(
                "%s: crashing on purpose (os._exit) after %d row(s), in the middle of %s "
                "with %d handlers in flight",
                cfg.name,
                stats.handled,
                ctx.job_id,
                stats.started - stats.handled + 1,
            )
            os._exit(CRASH_EXIT_CODE)
        return {"rowid": recorded.get("rowid"), "distance_km": row["distance_km"]}

    storage = await gnl.connect(cfg.url, max_connections=4)
    try:
        worker = gnl.create_worker(
            storage,
            {JOB_TYPE: handle},
            ttl_ms=cfg.ttl_ms,
            concurrency=cfg.concurrency,
            poll_ms=50,
            max_poll_ms=400,
            name=cfg.name,
        )
        out.put(("ready", cfg.index, os.getpid()))
        if not await _wait_event(go, 120.0):
            raise TimeoutError("the demo never said go")
        worker.start()
        await _wait_event(stop)
        await worker.stop()
    finally:
        await storage.close()
        results.close()
    return stats
