"""Shared pieces of the SQLite benches: the anchor's table and pragmas, timing summaries,
peak-memory readings and the machine description.

The anchor is what a user would write by hand with the standard library's ``sqlite3``: the
same job columns and indexes as gnl's ``gnl_jobs`` table (``rust/migrations/sqlite``), on a
connection with the pragmas gnl's SQLite engine sets (``rust/src/store/sqlite.rs``):

* ``journal_mode=WAL`` and ``synchronous=NORMAL`` (``SqliteConnectOptions::journal_mode`` /
  ``synchronous``),
* ``busy_timeout=30000`` (gnl's ``BUSY_TIMEOUT``, 30 s),
* ``foreign_keys=OFF`` (gnl turns off sqlx's default ``ON``; it is SQLite's default anyway).

gnl also installs its own busy handler (retries every ~0.5 ms for up to 30 s). That cannot
matter here: the anchor uses a single connection and never waits for a lock.

Everything else is SQLite's default on both sides (page size 4096, ``cache_size=-2000``). The
anchor keeps no lanes table: it has no fair lanes.
"""

from __future__ import annotations

import gc
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The anchor's jobs table: gnl's columns, its unique (org, id), its lease and listing
#: indexes; the due index is keyed (run_at, seq) because the plain loop is one FIFO.
ANCHOR_SCHEMA = """
CREATE TABLE jobs (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    org              TEXT    NOT NULL,
    id               TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 5,
    last_error       TEXT,
    result           TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,
    finished_at      INTEGER,
    lease_token      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    lease_owner      TEXT,
    UNIQUE (org, id)
);
CREATE INDEX jobs_due ON jobs (run_at, seq) WHERE state = 'pending';
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_lane_seq ON jobs (org, seq);
"""

#: The anchor's insert: the columns gnl's enqueue writes, duplicates ignored as gnl does.
ANCHOR_INSERT = (
    "INSERT INTO jobs (org, id, type, payload, run_at, state, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?) ON CONFLICT (org, id) DO NOTHING"
)

PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000", "foreign_keys=OFF")


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_ints(name: str, default: str) -> list[int]:
    return [int(x) for x in os.environ.get(name, default).replace(",", " ").split()]


def now_ms() -> int:
    return int(time.time() * 1000)


def anchor_connect(path: Path, create: bool) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), with gnl's pragmas."""
    conn = sqlite3.connect(path, isolation_level=None)
    for p in PRAGMAS:
        conn.execute(f"PRAGMA {p}")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode.lower() == "wal", mode
    if create:
        conn.executescript(ANCHOR_SCHEMA)
    return conn


def sqlite_url(path: Path) -> str:
    """gnl's URL for a file: ``sqlite:///`` + an absolute path gives ``sqlite:////abs/path``."""
    return f"sqlite:///{path.resolve()}"


class Workdir:
    """A scratch directory (``BENCH_DIR`` or the system temp dir) with fresh file names."""

    def __init__(self) -> None:
        base = os.environ.get("BENCH_DIR")
        self.path = Path(tempfile.mkdtemp(prefix="gnl-bench-", dir=base))
        self._n = 0

    def fresh(self, stem: str) -> Path:
        self._n += 1
        return self.path / f"{stem}-{self._n}.db"

    def copy_db(self, src: Path, stem: str) -> Path:
        """Copy a closed database (and its -wal file, if one is left) to a fresh name."""
        dst = self.fresh(stem)
        shutil.copyfile(src, dst)
        for suffix in ("-wal", "-shm"):
            side = Path(str(src) + suffix)
            if side.exists():
                shutil.copyfile(side, Path(str(dst) + suffix))
        return dst

    def remove_db(self, path: Path) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


async def timed_drain(storage: Any, handlers: Any, n: int, **options: Any) -> tuple[float, float]:
    """``gnl.create_worker(storage, handlers, **options).drain()`` timed: seconds, and the
    statements the store sent per job; checks that all ``n`` jobs succeeded, then stops the
    worker and closes ``storage``."""
    import gnl

    worker = gnl.create_worker(storage, handlers, **options)
    q0 = storage.query_count
    t0 = time.perf_counter()
    res = await worker.drain()
    dt = time.perf_counter() - t0
    queries = storage.query_count - q0
    await worker.stop()
    await storage.close()
    assert res.processed == n and res.succeeded == n, res
    return dt, queries / n


def collect() -> None:
    """Drop what a run left behind (gnl objects caught in reference cycles included) before
    the next run, and before the interpreter exits."""
    gc.collect()


def summary(values: Iterable[float]) -> tuple[float, float, float]:
    v = list(values)
    return statistics.median(v), min(v), max(v)


def proc_status_kb(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(m.group(1))


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (``echo 5 > /proc/self/clear_refs``)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def sqlite_lib_versions() -> str:
    """The anchor's SQLite (Python's ``sqlite3``) and the one linked into gnl's native module."""
    gnl_ver = "?"
    try:
        import gnl._native as native

        data = Path(native.__file__).read_bytes()
        m = re.search(rb"(?<![\w.])(3\.\d{2}\.\d{1,2})\x00", data)
        if m:
            gnl_ver = m.group(1).decode()
    except (ImportError, OSError):
        pass
    return f"anchor sqlite3 {sqlite3.sqlite_version}, gnl bundled SQLite {gnl_ver}"


def git_commit() -> str:
    """HEAD, marked when gnl's sources (rust/, python/) differ from it, and when the native
    module in use was built: the build, not the commit, is what was measured."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "rust", "python", "Cargo.toml"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    out = head + (" + uncommitted changes in rust/ or python/" if dirty else "")
    try:
        import gnl._native as native

        built = time.gmtime(Path(native.__file__).stat().st_mtime)
        out += f" (native module built {time.strftime('%Y-%m-%d %H:%M UTC', built)})"
    except (ImportError, OSError):
        pass
    return out


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = git_commit()
    return (
        f"{os.cpu_count()} cpus, {cpu}, {platform.platform()}, Python {platform.python_version()}, "
        f"{sqlite_lib_versions()}, commit {commit}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
    )


def header(title: str, anchor: bool = True, **params: object) -> None:
    print(title, flush=True)
    print("  " + machine(), flush=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"  load average at start: {load} (other work on the machine skews the figures)")
    print("  " + ", ".join(f"{k}={v}" for k, v in params.items()), flush=True)
    if anchor:
        print(f"  anchor pragmas: {', '.join(PRAGMAS)}", flush=True)


def fmt_s(med: float, lo: float, hi: float) -> str:
    return f"median {med:.3f} s (min {lo:.3f}, max {hi:.3f})"


def fmt_rate(med: float, lo: float, hi: float) -> str:
    return f"median {med:,.0f} jobs/s (min {lo:,.0f}, max {hi:,.0f})"
