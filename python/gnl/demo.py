"""``gnl demo``: a CSV import on real data, with a worker that crashes mid-run.

1. Reads a CSV (by default the packaged ``gnl/demo_data/airports.csv``: 3,376 US airports,
   organizations = the ``state`` column) and enqueues one ``import-row`` job per row with ONE
   :func:`gnl.enqueue_many` call, spread over organizations by one of its columns.
2. Starts several worker processes (:mod:`gnl.demo_worker`, ``multiprocessing`` spawn context)
   on the same store. Each writes its rows to the ``demo_results`` table of a separate SQLite
   results file through ``ctx.step``. One worker kills itself with ``os._exit`` mid-run, right
   after a step was journaled and before its handler returned: its jobs stay ``running`` until
   their leases go stale, then the other workers reclaim them and run them again with the same
   ``run_id`` — the journaled step returns the recorded result instead of writing again.
3. Shows a progress bar (rows in the result table) until every job is finished, then a report:
   rows, jobs done, reclaims, side effects written twice (must be 0), how fairly the
   organizations were served, throughput. Exit code 0 only if every row was imported exactly
   once.
"""

from __future__ import annotations

import asyncio
import csv
import importlib.resources
import logging
import multiprocessing
import queue
import signal
import sqlite3
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

import gnl

from .demo_worker import (
    CRASH_EXIT_CODE,
    JOB_TYPE,
    RESULTS_TABLE,
    WorkerConfig,
    create_results_table,
    worker_main,
)

__all__ = [
    "DEFAULT_URL",
    "DemoError",
    "DemoOptions",
    "default_csv",
    "jain_index",
    "load_csv",
    "max_min_shares",
    "run_demo",
]

DEFAULT_URL = "sqlite:///gnl-demo.db"
#: Organizations with at most this many jobs count as "small" in the fairness report.
SMALL_ORG_JOBS = 10
#: How many of the largest organizations the report compares them with.
BIG_ORGS = 5
#: Org column candidates (when there is no ``state`` column): this many distinct values at most.
MAX_AUTO_ORGS = 500

log = logging.getLogger("gnl.demo")


class DemoError(Exception):
    """A problem with the demo's input or set-up (reported as one line, exit code 2)."""


@dataclass(frozen=True)
class DemoOptions:
    """The options of ``gnl demo``."""

    url: str | None = None
    csv: str | None = None
    workers: int = 4
    concurrency: int = 8
    org_column: str | None = None
    id_column: str | None = None
    crash: bool = True
    keep: bool = False
    ttl_ms: int = 1_500
    work_ms: float = 20.0
    timeout_s: float = 300.0


# -- the input ------------------------------------------------------------------------------------


def default_csv() -> Path | None:
    """The packaged data set, ``gnl/demo_data/airports.csv`` (package data of the wheel).

    Found with :func:`importlib.resources.files`, so it is the copy next to the ``gnl`` package
    that is imported: an installed wheel's, or the source tree's under ``make build``.

    Returns:
        The file's path, or None when this install does not carry it (a package that is not
        on the file system, or a build without package data).
    """
    resource = importlib.resources.files("gnl") / "demo_data" / "airports.csv"
    if isinstance(resource, Path) and resource.is_file():
        return resource
    return None


@dataclass(frozen=True)
class CsvData:
    """A CSV read for the demo: one job per row."""

    path: Path
    columns: list[str]
    rows: list[dict[str, str | None]]
    lines: list[int]  # the line each row starts on (the header is line 1)
    keys: list[str]  # job ids
    orgs: list[str | None]  # organizations (None: no organization)
    org_column: str | None
    id_column: str | None


def _choose_org_column(columns: Sequence[str], rows: Sequence[dict[str, str | None]]) -> str | None:
    if "state" in columns:
        return "state"
    for c in columns:
        values = {(r.get(c) or "").strip() for r in rows} - {""}
        if 2 <= len(values) <= MAX_AUTO_ORGS and len(values) < len(rows):
            return c
    return None


def load_csv(path: Path, org_column: str | None = None, id_column: str | None = None) -> CsvData:
    """Read ``path`` with the ``csv`` module.

    The organization column is ``org_column``, else ``state`` if there is one, else the first
    column with 2 to 500 distinct values that repeat; else no organization. The job id is the
    ``id_column`` value, else ``row:<line number>``.

    Raises:
        DemoError: unreadable file, no header, a repeated column name, a row with more fields
            than the header, an unknown column, or an empty or repeated id.
    """
    try:
        f = path.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise DemoError(f"cannot read {path}: {e.strerror or e}") from None
    with f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if not header:
                raise DemoError(f"{path} is empty (a CSV with a header line is expected)")
            columns = [h.strip() for h in header]
            repeated = [c for c, n in Counter(columns).items() if n > 1]
            if repeated:
                raise DemoError(f"{path}: column {repeated[0]!r} appears twice in the header")
            rows: list[dict[str, str | None]] = []
            lines: list[int] = []
            last = reader.line_num
            for record in reader:
                start, last = last + 1, reader.line_num
                if not record:
                    continue
                if len(record) > len(columns):
                    raise DemoError(
                        f"{path} line {start}: {len(record)} fields, the header has {len(columns)}"
                    )
                row: dict[str, str | None] = dict(zip(columns, record, strict=False))
                for c in columns[len(record) :]:
                    row[c] = None
                rows.append(row)
                lines.append(start)
        except csv.Error as e:
            raise DemoError(f"{path} line {reader.line_num}: {e}") from None
        except UnicodeDecodeError as e:
            raise DemoError(f"{path} is not UTF-8 text: {e}") from None
    if not rows:
        raise DemoError(f"{path} has a header but no rows")
    for opt, col in (("--org-column", org_column), ("--id-column", id_column)):
        if col is not None and col not in columns:
            raise DemoError(
                f"{opt} {col!r}: no such column in {path} (columns: {', '.join(columns)})"
            )
    org_col = org_column if org_column is not None else _choose_org_column(columns, rows)
    orgs = [((r.get(org_col) or "").strip() or None) if org_col else None for r in rows]
    if id_column is None:
        keys = [f"row:{n}" for n in lines]
    else:
        keys = []
        seen: dict[str, int] = {}
        for r, n in zip(rows, lines, strict=True):
            k = (r.get(id_column) or "").strip()
            if not k:
                raise DemoError(f"{path} line {n}: empty {id_column!r} (--id-column)")
            if k in seen:
                raise DemoError(
                    f"{path} line {n}: {id_column} {k!r} repeats line {seen[k]}; "
                    "job ids must be unique"
                )
            seen[k] = n
            keys.append(k)
    return CsvData(path, columns, rows, lines, keys, orgs, org_col, id_column)


# -- store and files ------------------------------------------------------------------------------


def _sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite://`` URL (as gnl reads it), None for other stores.

    Raises:
        DemoError: an in-memory SQLite store (worker processes cannot share it).
    """
    if url in ("sqlite::memory:", "sqlite://:memory:"):
        raise DemoError(
            "the demo's workers are separate processes: use a SQLite file, not :memory:"
        )
    if not url.startswith("sqlite://"):
        return None
    rest = url[len("sqlite://") :]
    return Path(rest[1:] if rest.startswith("/") else rest)


def _remove_sqlite(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)


def _results_path(url: str, db: Path | None) -> Path:
    if db is None:
        return Path("gnl-demo-results.db")
    return db.with_name(f"{db.stem}-results.db")


def _result_counts(path: Path) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    try:
        (n,) = db.execute(f"SELECT COUNT(DISTINCT row_key) FROM {RESULTS_TABLE}").fetchone()
        return int(n)
    finally:
        db.close()


def _result_rows(path: Path) -> list[tuple[str, str | None, str, int]]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    try:
        return [
            (str(k), o, str(w), int(a))
            for k, o, w, a in db.execute(
                f"SELECT row_key, org, worker, attempt FROM {RESULTS_TABLE}"
            )
        ]
    finally:
        db.close()


JobKey = tuple[str | None, str]


async def _list_ours(storage: gnl.Storage, ours: set[JobKey]) -> dict[JobKey, gnl.JobInfo]:
    found: dict[JobKey, gnl.JobInfo] = {}
    cursor: str | None = None
    while True:
        page = await gnl.list_all_jobs(storage.work, limit=10_000, cursor=cursor)
        for job in page.items:
            k = (job.org_id, job.id)
            if k in ours:
                found[k] = job
        cursor = page.next_cursor
        if cursor is None:
            return found


# -- fairness -------------------------------------------------------------------------------------


def max_min_shares(demands: Sequence[int], total: int) -> list[float]:
    """Water-filling: the max-min fair split of ``total`` units among ``demands``.

    Every demand below the common level gets all it asks for; the others get the level.
    """
    shares = [0.0] * len(demands)
    remaining = float(min(total, sum(demands)))
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    for pos, i in enumerate(order):
        level = remaining / (len(order) - pos)
        if demands[i] <= level:
            shares[i] = float(demands[i])
            remaining -= demands[i]
        else:
            for j in order[pos:]:
                shares[j] = level
            break
    return shares


def jain_index(xs: Iterable[float]) -> float | None:
    """Jain's fairness index (Σx)² / (n·Σx²): 1.0 when all are equal, 1/n at worst."""
    v = list(xs)
    sq = sum(x * x for x in v)
    if not v or sq == 0:
        return None
    return sum(v) ** 2 / (len(v) * sq)


@dataclass
class Fairness:
    """How fairly the organizations were served (see :func:`_fairness`)."""

    small_orgs: int = 0
    small_median: float | None = None
    small_fifo: float | None = None
    big_orgs: list[str] = field(default_factory=list)
    big_median: float | None = None
    big_fifo: float | None = None
    jain: float | None = None
    jain_fifo: float | None = None
    orgs: int = 0


def _fairness(done: list[tuple[int, str | None, int]], t0: int, t_end: int) -> Fairness:
    """``done``: (enqueue position, org, finished_at) of the jobs finished in this run.

    *finish* of an organization = when its last job finished, as a fraction of the worker
    phase [t0, t_end]. FIFO = the same jobs served one after another in enqueue order.
    Jain = Jain's index over organizations of (jobs served in the first half of the phase) ÷
    (their max-min fair share of the jobs served in that half).
    """
    fair = Fairness()
    if not done or t_end <= t0:
        return fair
    span = t_end - t0
    by_org: dict[str | None, list[tuple[int, int]]] = defaultdict(list)
    for pos, org, fin in done:
        by_org[org].append((pos, fin))
    fair.orgs = len(by_org)
    fifo_rank = {pos: i + 1 for i, (pos, _, _) in enumerate(sorted(done))}
    n = len(done)
    finish = {o: (max(f for _, f in js) - t0) / span for o, js in by_org.items()}
    finish_fifo = {o: max(fifo_rank[p] for p, _ in js) / n for o, js in by_org.items()}
    small = [o for o, js in by_org.items() if len(js) <= SMALL_ORG_JOBS]
    big = sorted(by_org, key=lambda o: (-len(by_org[o]), o or ""))[:BIG_ORGS]
    fair.small_orgs = len(small)
    if small:
        fair.small_median = statistics.median(finish[o] for o in small)
        fair.small_fifo = statistics.median(finish_fifo[o] for o in small)
    fair.big_orgs = [o or "(none)" for o in big]
    fair.big_median = statistics.median(finish[o] for o in big)
    fair.big_fifo = statistics.median(finish_fifo[o] for o in big)
    half = t0 + span / 2
    orgs = list(by_org)
    served = [sum(1 for _, f in by_org[o] if f <= half) for o in orgs]
    total = sum(served)
    if total:
        shares = max_min_shares([len(by_org[o]) for o in orgs], total)
        first = {p for p, _, _ in sorted(done)[:total]}
        served_fifo = [sum(1 for p, _ in by_org[o] if p in first) for o in orgs]
        fair.jain = jain_index(s / sh for s, sh in zip(served, shares, strict=True) if sh > 0)
        fair.jain_fifo = jain_index(
            s / sh for s, sh in zip(served_fifo, shares, strict=True) if sh > 0
        )
    return fair


# -- the run --------------------------------------------------------------------------------------


class _ConsoleHandler(logging.Handler):
    """Prints log records above the progress bar."""

    _STYLES = {logging.INFO: "dim", logging.WARNING: "yellow", logging.ERROR: "bold red"}

    def __init__(self, console: Console) -> None:
        super().__init__()
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            style = self._STYLES.get(record.levelno, "bold red" if record.levelno > 30 else "")
            self._console.print(Text(self.format(record), style=style), highlight=False)
        except Exception:  # noqa: BLE001
            self.handleError(record)


@dataclass
class _Inbox:
    """What the worker processes sent (filled by the reader thread)."""

    ready: dict[int, int] = field(default_factory=dict)
    stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    events: queue.Queue[str] = field(default_factory=queue.Queue)


def _read_inbox(out: Any, inbox: _Inbox) -> None:
    while True:
        msg = out.get()
        if msg is None:
            return
        kind = msg[0]
        if kind == "log":
            _, _worker, level, name, text = msg
            logging.getLogger(name).log(level, "%s", text)
        elif kind == "ready":
            inbox.ready[msg[1]] = msg[2]
        elif kind == "stats":
            inbox.stats[msg[1]] = msg[2]
        elif kind == "failed":
            inbox.failed[msg[1]] = msg[2]
        inbox.events.put(kind)


@dataclass
class _Outcome:
    jobs: dict[JobKey, gnl.JobInfo]
    t0: int
    crash_seen: bool
    exit_codes: dict[str, int | None]
    stats: dict[int, dict[str, Any]]
    crasher: WorkerConfig | None
    timed_out: bool = False
    problem: str | None = None


def run_demo(opts: DemoOptions, console: Console) -> int:
    """Run the demo; returns the exit code (0: every row imported exactly once).

    Raises:
        DemoError: bad input or set-up (reported as one line).
        gnl.GnlError: from the store.
    """
    if opts.workers < 1 or opts.concurrency < 1:
        raise DemoError("--workers and --concurrency must be at least 1")
    url = opts.url or DEFAULT_URL
    db_file = _sqlite_file(url)
    if opts.csv is not None:
        csv_path = Path(opts.csv)
    else:
        found = default_csv()
        if found is None:
            raise DemoError(
                "this install of gnl does not carry its data set (gnl/demo_data/airports.csv); "
                "pass --csv PATH"
            )
        csv_path = found
    data = load_csv(csv_path, opts.org_column, opts.id_column)
    results = _results_path(url, db_file)
    fresh_default = opts.url is None and not opts.keep
    if fresh_default and db_file is not None:
        _remove_sqlite(db_file)

    handler = _ConsoleHandler(console)
    handler.setFormatter(logging.Formatter("%(message)s"))
    demo_log = logging.getLogger("gnl.demo")
    gnl_log = logging.getLogger("gnl")
    saved = (demo_log.level, demo_log.propagate, gnl_log.level)
    demo_log.addHandler(handler)
    demo_log.setLevel(logging.INFO)
    demo_log.propagate = False
    gnl_log.addHandler(handler)
    gnl_log.setLevel(logging.WARNING)
    try:
        return asyncio.run(_run(opts, console, url, data, results))
    except sqlite3.Error as e:
        raise DemoError(f"results file {results}: {e}") from None
    finally:
        demo_log.removeHandler(handler)
        gnl_log.removeHandler(handler)
        demo_log.setLevel(saved[0])
        demo_log.propagate = saved[1]
        gnl_log.setLevel(saved[2])


async def _run(opts: DemoOptions, console: Console, url: str, data: CsvData, results: Path) -> int:
    n = len(data.rows)
    console.print(
        Text.assemble(
            ("gnl demo", "bold"),
            f": {n:,} rows from ",
            (str(data.path), "cyan"),
            " → ",
            (url, "cyan"),
            f"; {_org_text(data)}; results in ",
            (str(results), "cyan"),
        )
    )
    storage = await gnl.connect(url)
    try:
        if not opts.keep:
            _remove_sqlite(results)
        create_results_table(str(results))
        ours: set[JobKey] = set(zip(data.orgs, data.keys, strict=True))
        if not opts.keep:
            probe = await gnl.get_job(storage.work, data.keys[0], data.orgs[0])
            if probe is not None:
                raise DemoError(
                    f"{url} already holds job {data.keys[0]!r} (org {data.orgs[0]}) from an "
                    "earlier run; use a fresh store, or --keep to resume it"
                )
        existing = len(await _list_ours(storage, ours)) if opts.keep else 0
        specs = [
            {"type": JOB_TYPE, "payload": row, "options": {"id": key, "org_id": org}}
            for row, key, org in zip(data.rows, data.keys, data.orgs, strict=True)
        ]
        started = time.perf_counter()
        try:
            ids = await gnl.enqueue_many(storage.work, specs)
        except gnl.InvalidJobError as e:
            raise DemoError(
                f"{data.path} line {data.lines[e.index]}: {e.__cause__ or e}"
                if 0 <= e.index < n
                else str(e)
            ) from None
        enqueue_s = time.perf_counter() - started
        console.print(
            f"enqueue_many: {len(ids):,} jobs in one call, {enqueue_s:.2f} s "
            f"({len(ids) / max(enqueue_s, 1e-9):,.0f} jobs/s)",
            highlight=False,
        )
        outcome = await _work(opts, console, storage, data, ours, results)
        return _report(opts, console, data, ids, enqueue_s, existing, results, outcome)
    finally:
        await storage.close()


async def _work(
    opts: DemoOptions,
    console: Console,
    storage: gnl.Storage,
    data: CsvData,
    ours: set[JobKey],
    results: Path,
) -> _Outcome:
    n = len(data.rows)
    mp = multiprocessing.get_context("spawn")
    go, stop = mp.Event(), mp.Event()
    out: Any = mp.SimpleQueue()
    inbox = _Inbox()
    reader = threading.Thread(
        target=_read_inbox, args=(out, inbox), name="gnl-demo-inbox", daemon=True
    )
    reader.start()
    crasher: int | None = None
    crash_after: int | None = None
    if opts.crash and opts.workers >= 2:
        crasher = 1  # the second worker
        crash_after = max(1, n // (opts.workers * 3))
    elif opts.crash:
        log.warning("one worker only: nobody would reclaim its jobs, so it does not crash")
    configs = [
        WorkerConfig(
            index=i,
            name=f"worker-{i + 1}",
            url=storage.url,
            results_path=str(results),
            ttl_ms=opts.ttl_ms,
            concurrency=opts.concurrency,
            work_ms=opts.work_ms,
            crash_after=crash_after if i == crasher else None,
            seed=i,
        )
        for i in range(opts.workers)
    ]
    procs: list[BaseProcess] = []
    crash_seen = False
    timed_out = False
    problem: str | None = None
    t0 = await storage.now_ms()
    try:
        for cfg in configs:
            proc = mp.Process(
                target=worker_main, args=(cfg, go, stop, out), name=cfg.name, daemon=True
            )
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + 60
        while len(inbox.ready) + len(inbox.failed) < len(procs):
            if time.monotonic() > deadline or any(
                p.exitcode is not None and i not in inbox.ready for i, p in enumerate(procs)
            ):
                raise DemoError(
                    "the worker processes did not start: "
                    + ("; ".join(inbox.failed.values()) or "no answer within 60 s")
                )
            await asyncio.sleep(0.02)
        if inbox.failed:
            raise DemoError("a worker could not start: " + "; ".join(inbox.failed.values()))
        if crasher is not None:
            log.info(
                "%s will crash (os._exit) once it has handled %s or more; leases last %d ms",
                configs[crasher].name,
                _rows(crash_after or 0),
                opts.ttl_ms,
            )
        t0 = await storage.now_ms()
        go.set()
        reported: set[int] = set()
        jobs: dict[JobKey, gnl.JobInfo] = {}
        last_list = 0.0
        deadline = time.monotonic() + opts.timeout_s
        progress = Progress(
            TextColumn("[bold]importing rows"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
            # Not a terminal (a log, a pipe, CI): no bar cut at 80 columns; a line every 5 s.
            disable=not console.is_terminal,
        )
        last_line, said_all = time.monotonic(), False
        with progress:
            task = progress.add_task("import", total=n, status="")
            while True:
                imported = _result_counts(results)
                for i, p in enumerate(procs):
                    if p.exitcode is None or i in reported:
                        continue
                    reported.add(i)
                    if p.exitcode == CRASH_EXIT_CODE and i == crasher:
                        crash_seen = True
                        log.warning(
                            "%s is gone (exit code %d, the planned crash): the jobs it held stay "
                            "'running' until their %d ms leases go stale, then other workers "
                            "reclaim them",
                            p.name,
                            p.exitcode,
                            opts.ttl_ms,
                        )
                    else:
                        log.error("%s exited unexpectedly (exit code %s)", p.name, p.exitcode)
                now = time.monotonic()
                if now - last_list >= 1.0 or imported >= n:
                    jobs = await _list_ours(storage, ours)
                    last_list = now
                states = Counter(j.state for j in jobs.values())
                reclaims = sum(1 for j in jobs.values() if j.attempts > 1)
                alive = sum(1 for p in procs if p.exitcode is None)
                status = (
                    f"done {states['done']:,} · reclaims {reclaims} · workers {alive}/{len(procs)}"
                )
                progress.update(task, completed=min(imported, n), status=status)
                if progress.disable and (
                    now - last_line >= 5.0 or (imported >= n > 0 and not said_all)
                ):
                    last_line, said_all = now, imported >= n
                    log.info("imported %s of %s rows · %s", f"{imported:,}", f"{n:,}", status)
                if len(jobs) == len(ours) and states["pending"] + states["running"] == 0:
                    break
                if alive == 0:
                    problem = "every worker process exited before the jobs were finished"
                    break
                if now > deadline:
                    timed_out = True
                    problem = f"timed out after {opts.timeout_s:.0f} s: " + ", ".join(
                        f"{k} {v:,}" for k, v in sorted(states.items())
                    )
                    break
                await asyncio.sleep(0.2)
        stop.set()
        for p in procs:
            await asyncio.to_thread(p.join, 30)
        for i, p in enumerate(procs):
            if p.exitcode is not None and p.exitcode < 0 and i in inbox.stats:
                log.warning(
                    "%s stopped cleanly, then died of signal %d while its interpreter exited",
                    p.name,
                    -p.exitcode,
                )
        stuck = [p.name for p in procs if p.exitcode is None]
        if stuck:
            problem = (problem + "; " if problem else "") + (
                f"worker(s) {', '.join(stuck)} did not stop within 30 s"
            )
        jobs = await _list_ours(storage, ours)
    finally:
        stop.set()
        go.set()
        for p in procs:
            if p.exitcode is None:
                p.terminate()
                p.join(5)
        out.put(None)
        reader.join(5)
    return _Outcome(
        jobs=jobs,
        t0=t0,
        crash_seen=crash_seen,
        exit_codes={p.name: p.exitcode for p in procs},
        stats=dict(inbox.stats),
        crasher=None if crasher is None else configs[crasher],
        timed_out=timed_out,
        problem=problem,
    )


def _exit_text(index: int, code: int | None, o: _Outcome) -> str:
    if code == 0:
        return ""
    if code == CRASH_EXIT_CODE and o.crasher is not None and o.crasher.index == index:
        return " (crashed on purpose)"
    if code is not None and code < 0 and index in o.stats:
        # It sent its stats, so it had stopped cleanly: it died while the interpreter exited.
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f" (stopped cleanly, then died of {name} at interpreter exit)"
    return f" (exit code {code})"


def _org_text(data: CsvData) -> str:
    if data.org_column is None:
        return "no organization column: every job in the no-organization lane"
    named = len({o for o in data.orgs if o is not None})
    text = f"{named:,} organizations by column {data.org_column!r}"
    blank = sum(1 for o in data.orgs if o is None)
    if blank:
        text += f" (+ {blank:,} {'row' if blank == 1 else 'rows'} without one)"
    return text


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


def _report(
    opts: DemoOptions,
    console: Console,
    data: CsvData,
    ids: list[str],
    enqueue_s: float,
    existing: int,
    results: Path,
    o: _Outcome,
) -> int:
    n = len(data.rows)
    rows = _result_rows(results)
    per_key = Counter(k for k, _, _, _ in rows)
    expected = set(data.keys)
    missing = [k for k in data.keys if per_key[k] == 0]
    twice = sorted(k for k, c in per_key.items() if c > 1)
    stray = sorted(k for k in per_key if k not in expected)
    imported = sum(1 for k in data.keys if per_key[k] >= 1)
    jobs = o.jobs
    states = Counter(j.state for j in jobs.values())
    ran_now = [j for j in jobs.values() if j.finished_at is not None and j.finished_at >= o.t0]
    reclaimed = [j for j in ran_now if j.attempts > 1]
    replayed = sum(int(s.get("replayed", 0)) for s in o.stats.values())
    reruns = sum(int(s.get("reruns", 0)) for s in o.stats.values())
    written_by = Counter(w for _, _, w, _ in rows)

    pos = {(org, key): i for i, (org, key) in enumerate(zip(data.orgs, data.keys, strict=True))}
    done_now = [
        (pos[k], j.org_id, j.finished_at)
        for k, j in jobs.items()
        if j.state == "done" and j.finished_at is not None and j.finished_at >= o.t0
    ]
    t_end = max((f for _, _, f in done_now), default=o.t0)
    fair = _fairness(done_now, o.t0, t_end)
    phase_s = (t_end - o.t0) / 1000

    table = Table(title="gnl demo — report", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("Rows in CSV", f"{n:,} ({data.path.name}, {len(data.columns)} columns)")
    table.add_row("Organizations", _org_text(data))
    enq = (
        f"{len(set(ids)):,} with one enqueue_many call in {enqueue_s:.2f} s "
        f"({len(ids) / max(enqueue_s, 1e-9):,.0f} jobs/s)"
    )
    if existing:
        enq += f"; {existing:,} of them were already in the store (same id: same job)"
    table.add_row("Jobs enqueued", enq)
    other = ", ".join(f"{s} {c:,}" for s, c in sorted(states.items()) if s != "done")
    table.add_row("Jobs done", f"{states['done']:,}" + (f" ({other})" if other else ""))
    ok_rows = not missing and not twice
    table.add_row(
        "Rows imported",
        Text(
            f"{imported:,} / {n:,}" + (f" — {len(missing):,} MISSING" if missing else ""),
            style="green" if not missing else "bold red",
        ),
    )
    table.add_row(
        "Side effects written twice",
        Text(f"{len(twice):,}", style="bold green" if not twice else "bold red"),
    )
    workers = " · ".join(
        f"{name} {written_by[name]:,}{_exit_text(i, code, o)}"
        for i, (name, code) in enumerate(o.exit_codes.items())
    )
    table.add_row(
        "Workers",
        f"{len(o.exit_codes)} processes × concurrency {opts.concurrency}; rows written: {workers}",
    )
    if o.crasher is not None:
        crasher = o.crasher.name
        crash_after = o.crasher.crash_after or 0
        if o.crash_seen:
            crash_text = (
                f"{crasher} killed itself with os._exit once it had handled "
                f"{_rows(crash_after)} or more (leases of {opts.ttl_ms:,} ms went stale)"
            )
        else:
            crash_text = (
                f"{crasher} was set to crash after {_rows(crash_after)} but did not "
                "get that far (nothing to do?)"
            )
        table.add_row("Crash", crash_text)
    else:
        table.add_row("Crash", "none (--no-crash)" if not opts.crash else "none (one worker)")
    reclaim_text = f"{len(reclaimed):,} jobs ran again after a stale lease (attempts > 1)"
    if len(ran_now) < len(jobs):
        reclaim_text += " in this run"
    if reclaimed:
        reclaim_text += (
            f"; of the {reruns:,} reruns the surviving workers saw, {replayed:,} found their "
            f"step journaled and did not write again, {reruns - replayed:,} had not reached "
            "it before the crash and wrote on the rerun"
        )
    table.add_row("Reclaims", reclaim_text)
    if fair.orgs:
        table.add_row(
            "Fairness: small orgs",
            f"{fair.small_orgs} orgs with ≤ {SMALL_ORG_JOBS} jobs finished at a median "
            f"{_pct(fair.small_median)} of the run (FIFO: {_pct(fair.small_fifo)})",
        )
        table.add_row(
            "Fairness: biggest orgs",
            f"{', '.join(fair.big_orgs)} finished at a median {_pct(fair.big_median)} "
            f"(FIFO: {_pct(fair.big_fifo)})",
        )
        jain = "n/a" if fair.jain is None else f"{fair.jain:.3f}"
        jain_fifo = "n/a" if fair.jain_fifo is None else f"{fair.jain_fifo:.3f}"
        table.add_row(
            "Fairness: Jain index", f"{jain} over the first half of the run (FIFO: {jain_fifo})"
        )
        table.add_row(
            "Throughput",
            f"{len(done_now) / max(phase_s, 1e-9):,.0f} jobs/s ({len(done_now):,} jobs in "
            f"{phase_s:.2f} s of worker phase)",
        )
    else:
        table.add_row("Fairness / throughput", "n/a: no job ran in this run (all were done before)")
    if stray:
        table.add_row(
            "Other rows in results", f"{len(stray):,} keys not in this CSV (an earlier run?)"
        )
    console.print()
    console.print(table)
    if fair.orgs:
        console.print(
            Text(
                "Fairness: each organization's jobs are a lane and lanes are served in turn, so "
                "an organization with a few rows finishes early instead of waiting behind the big "
                "ones. 'finished at' = when an organization's last job finished, as a fraction of "
                "the worker phase; FIFO = the same jobs served in CSV order. Jain index = "
                "(Σx)²/(n·Σx²) over organizations of x = jobs done in the first half ÷ the "
                "organization's max-min fair share of them (1.0 = perfectly fair).",
                style="dim",
            )
        )
    wrong: list[str] = []
    if missing:
        wrong.append(f"{len(missing):,} rows were not imported (e.g. {', '.join(missing[:5])})")
    if twice:
        wrong.append(
            f"{len(twice):,} rows were written more than once (e.g. {', '.join(twice[:5])})"
        )
    if o.problem:
        wrong.append(o.problem)
    dead = [j for j in jobs.values() if j.state == "dead"]
    if dead:
        wrong.append(f"{len(dead):,} jobs are dead, e.g. {dead[0].id}: {dead[0].last_error}")
    if wrong:
        for w in wrong:
            console.print(Text(f"FAILED: {w}", style="bold red"))
        return 1
    console.print(
        Text(
            f"OK: every row imported exactly once ({_rows(n)}, 0 written twice)",
            style="bold green",
        )
    )
    assert ok_rows
    return 0
