"""API.md "Queue" across processes: several worker processes on one store.

* 4 processes drain 20,000 jobs (5,000 on SQLite): each job is handled exactly once.
* One of 4 processes is SIGKILLed mid-run: its jobs are reclaimed after the lease with the same
  run id, none is lost, and a side effect made through ``ctx.step`` is not repeated once the
  step is journaled.
* The database server is stopped and started again mid-run (Postgres, MySQL): the workers log
  the outage, reconnect with backoff and finish every job, the journaled steps once.

The worker processes run ``_mp_worker.py``; its handlers write what they did to per-process
files (see its docstring), which the tests check against the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import pytest

import gnl
import gnl.worker as gnl_worker
from _support import all_jobs
from conftest import missing_server

WORKER = str(Path(__file__).with_name("_mp_worker.py"))
PROCESSES = 4
CONCURRENCY = 16
ORGS = [f"org-{i:02d}" for i in range(20)]

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------------
# worker processes


@dataclass
class Fleet:
    """Worker processes of one test, their output directory and stderr files."""

    out: Path
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    errs: list[Path] = field(default_factory=list)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stderr(self, i: int) -> str:
        path = self.errs[i]
        return path.read_text(errors="replace") if path.exists() else ""

    def report(self, tail: int = 3000) -> str:
        """The exit codes and the tail of every process's stderr, for failure messages."""
        parts = []
        for i, p in enumerate(self.procs):
            err = self.stderr(i)
            parts.append(
                f"--- worker {i} (pid {p.pid}, exit {p.returncode}), stderr "
                f"({len(err)} chars, last {tail}):\n{err[-tail:]}"
            )
        return "\n".join(parts)

    def check_alive(self, what: str) -> None:
        dead = [(p.pid, p.returncode) for p in self.procs if p.returncode is not None]
        assert not dead, f"worker processes exited early {dead} while {what}\n{self.report()}"

    def kill_all(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.kill()


def _open_for_writing(path: Path) -> BinaryIO:
    return open(path, "wb")


async def spawn(fleet: Fleet, mode: str, url: str, n: int = PROCESSES, **env: str) -> None:
    """Start ``n`` worker processes (``_mp_worker.py MODE URL DIR``) into ``fleet``."""
    out = fleet.out
    for i in range(n):
        err = out / f"stderr-{i}"
        with _open_for_writing(err) as f:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                WORKER,
                mode,
                url,
                str(out),
                stdout=f,
                stderr=f,
                env={**os.environ, "GNL_MP_CONCURRENCY": str(CONCURRENCY), **env},
            )
        fleet.procs.append(proc)
        fleet.errs.append(err)


async def start_together(fleet: Fleet, timeout: float = 60) -> None:
    """Wait until every process is connected and ready, then let them all start."""
    deadline = time.monotonic() + timeout
    while not all((fleet.out / f"ready-{pid}").exists() for pid in fleet.pids()):
        fleet.check_alive("starting")
        assert time.monotonic() < deadline, f"workers not ready after {timeout} s\n{fleet.report()}"
        await asyncio.sleep(0.05)
    (fleet.out / "go").touch()


async def wait_exit(fleet: Fleet, timeout: float) -> list[int]:
    """Wait for every process to exit; on timeout kill them and fail with their stderr."""
    try:
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in fleet.procs)), timeout)
    except asyncio.TimeoutError:
        alive = [p.pid for p in fleet.procs if p.returncode is None]
        fleet.kill_all()
        await asyncio.gather(*(p.wait() for p in fleet.procs))
        pytest.fail(
            f"worker processes {alive} did not exit within {timeout} s (hang?)\n{fleet.report()}"
        )
    return [p.returncode for p in fleet.procs if p.returncode is not None]


@contextmanager
def reaping(out: Path) -> Iterator[Fleet]:
    """A fleet whose processes are killed, on any way out, if they are still running."""
    fleet = Fleet(out)
    try:
        yield fleet
    finally:
        fleet.kill_all()


# --------------------------------------------------------------------------------------------
# the handlers' records


@dataclass(frozen=True)
class Line:
    t: int  # CLOCK_MONOTONIC ns
    kind: str
    pid: int
    job: str
    attempt: int
    extra: tuple[str, ...]


def _whole_lines(path: Path) -> list[str]:
    """The complete lines of a handler log: one being written now (a read can see part of a
    ``write(2)``) or cut off by a kill is left out (CI read one cut short, an IndexError)."""
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def read_lines(out: Path) -> list[Line]:
    lines = []
    for path in out.glob("log-*"):
        pid = int(path.name.split("-", 1)[1])
        for raw in _whole_lines(path):
            t, kind, job, attempt, *extra = raw.split(" ")
            lines.append(Line(int(t), kind, pid, job, int(attempt), tuple(extra)))
    lines.sort(key=lambda ln: ln.t)
    return lines


def count_kind(out: Path, kind: str, pid: int | None = None) -> int:
    """How many lines of ``kind`` the handlers (of ``pid``) have written so far."""
    n = 0
    paths = [out / f"log-{pid}"] if pid is not None else list(out.glob("log-*"))
    for path in paths:
        if path.exists():
            n += sum(1 for raw in _whole_lines(path) if raw.split(" ")[1] == kind)
    return n


def in_flight(out: Path, pid: int) -> int:
    """How many attempts the handlers of ``pid`` have started and not yet finished."""
    path = out / f"log-{pid}"
    if not path.exists():
        return 0
    started: set[tuple[str, str]] = set()
    for raw in _whole_lines(path):
        _, kind, job, attempt, *_ = raw.split(" ")
        if kind == "S":
            started.add((job, attempt))
        elif kind == "D":
            started.discard((job, attempt))
    return len(started)


@dataclass
class StepAudit:
    """What the ``step`` handlers' records say about each job's side effect."""

    bugs: list[str] = field(default_factory=list)  # a journaled step that ran again, ...
    windows: list[str] = field(default_factory=list)  # repeats that at-least-once allows
    recorded: dict[str, str] = field(default_factory=dict)  # job -> the kept token


def audit_steps(lines: list[Line], killed: tuple[int, int] | None = None) -> StepAudit:
    """Check that each job's step ran once, or explain every repeat.

    A repeat of the step function (a second ``E`` line for a job) is allowed only when it could
    not have seen a journaled result: its run started the step before any run had the step's
    result back (no ``J`` line yet), and, when the kept result is the one of the SIGKILLed
    process ``killed = (pid, ns)``, before that process died. A run that starts its step after
    either has the journaled result to read, so running the function again is a gnl bug.
    """
    audit = StepAudit()
    by_job: dict[str, list[Line]] = defaultdict(list)
    for ln in lines:
        by_job[ln.job].append(ln)
    for job, evs in by_job.items():
        effects = [e for e in evs if e.kind == "E"]
        journaled = [e for e in evs if e.kind == "J"]
        kept = {e.extra[0] for e in journaled}
        if len(kept) > 1:
            audit.bugs.append(f"{job}: runs got different recorded step results {sorted(kept)}")
            continue
        if not kept:
            continue  # checked against the store by the caller (every job is done)
        token = kept.pop()
        audit.recorded[job] = token
        owners = [e for e in effects if e.extra[0] == token]
        if not owners:
            audit.bugs.append(f"{job}: recorded token {token} that no step function returned")
            continue
        owner = owners[0]
        first_result = min(e.t for e in journaled)
        for e in effects:
            if e is owner:
                continue
            starts = [
                s.t
                for s in evs
                if s.kind == "S" and s.pid == e.pid and s.attempt == e.attempt and s.t <= e.t
            ]
            began = max(starts) if starts else e.t
            history = ", ".join(
                f"{x.kind}@pid{x.pid}/a{x.attempt} {' '.join(x.extra)}" for x in evs
            )
            if began > first_result:
                audit.bugs.append(
                    f"{job}: the step ran again (pid {e.pid}, attempt {e.attempt}) "
                    f"{(began - first_result) / 1e6:.1f} ms after a run had its journaled "
                    f"result {token}: {history}"
                )
            elif killed is not None and owner.pid == killed[0] and began > killed[1]:
                audit.bugs.append(
                    f"{job}: the step ran again (pid {e.pid}, attempt {e.attempt}) after the "
                    f"killed worker's result {token} was journaled: {history}"
                )
            else:
                audit.windows.append(f"{job}: {history}")
    return audit


# --------------------------------------------------------------------------------------------
# the store


async def enqueue_jobs(st: gnl.Storage, n: int) -> list[str]:
    ids = [f"j{i}" for i in range(n)]
    specs = [
        {
            "type": "job",
            "payload": {"n": i},
            "options": {"id": ids[i], "org_id": ORGS[i % len(ORGS)]},
        }
        for i in range(n)
    ]
    assert await gnl.enqueue_many(st, specs) == ids
    return ids


async def unfinished(st: gnl.Storage) -> bool:
    """True while any job is pending or running (raises while the store is unreachable)."""
    for org in ORGS:
        for state in ("pending", "running"):
            if (await gnl.list_jobs(st, org_id=org, state=state, limit=1)).items:
                return True
    return False


async def wait_all_done(st: gnl.Storage, fleet: Fleet, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if not await unfinished(st):
                return
        except gnl.GnlError:
            pass  # the server is restarting; ask again
        assert time.monotonic() < deadline, (
            f"jobs still pending or running {timeout} s after {what} "
            f"({count_kind(fleet.out, 'D')} handler runs finished)\n{fleet.report()}"
        )
        await asyncio.sleep(0.25)


# --------------------------------------------------------------------------------------------
# 1. exactly once


async def test_four_processes_handle_each_job_exactly_once(
    backend: str, store_url: Callable[[], str], tmp_path: Path
) -> None:
    n = 5_000 if backend == "sqlite" else 20_000
    url = store_url()
    with reaping(tmp_path) as fleet:
        async with await gnl.connect(url) as st:
            ids = await enqueue_jobs(st, n)
            await spawn(fleet, "drain", url)
            await start_together(fleet)
            began = time.monotonic()
            codes = await wait_exit(fleet, timeout=90)
            took = time.monotonic() - began
            assert codes == [0] * PROCESSES, f"exit codes {codes}\n{fleet.report()}"

            lines = read_lines(tmp_path)
            handled = Counter(ln.job for ln in lines)
            twice = {j: c for j, c in handled.items() if c > 1}
            missed = set(ids) - set(handled)
            assert not twice, f"{len(twice)} jobs handled more than once, e.g. {list(twice)[:10]}"
            assert not missed, f"{len(missed)} jobs never handled, e.g. {sorted(missed)[:10]}"
            assert len(lines) == n
            assert {ln.attempt for ln in lines} == {1}
            # The store agrees: done once, by the process that handled it.
            by_job = {ln.job: ln for ln in lines}
            jobs = await all_jobs(st)
            assert len(jobs) == n
            bad = [
                (j.id, j.state, j.attempts, j.result, by_job[j.id].pid)
                for j in jobs
                if (j.state, j.attempts, j.result) != ("done", 1, by_job[j.id].pid)
            ]
            assert not bad, f"{len(bad)} jobs not done once by their handler: {bad[:10]}"
            assert len({ln.extra[0] for ln in lines}) == n, "run ids are not one per job"

            # Each process's drain() counted what its handlers did, all succeeded, and did not
            # return while jobs were due. Jobs other processes were claiming at that instant
            # may still have looked pending: at most their batches, (PROCESSES-1)*CONCURRENCY.
            per_pid = Counter(ln.pid for ln in lines)
            drained = {
                pid: json.loads((tmp_path / f"drained-{pid}").read_text()) for pid in fleet.pids()
            }
            for pid, (processed, succeeded, failed, _) in drained.items():
                assert (processed, succeeded, failed) == (per_pid[pid], per_pid[pid], 0), pid
            early = {
                pid: f"returned after {d[0]} jobs with {d[3]} of {n} jobs pending"
                for pid, d in drained.items()
                if d[3] > (PROCESSES - 1) * CONCURRENCY
            }
            assert not early, (
                f"drain() returned while jobs were due (API.md: it processes until no job is "
                f"due): {early}\n{fleet.report()}"
            )
            assert set(per_pid) == set(fleet.pids()), f"not every process did work: {per_pid}"
    print(f"\n{backend}: {n} jobs, 4 processes: {took:.1f} s; per process {dict(per_pid)}")


# --------------------------------------------------------------------------------------------
# 2. SIGKILL


async def test_sigkill_mid_run_loses_nothing_and_steps_do_not_repeat(
    backend: str, store_url: Callable[[], str], tmp_path: Path
) -> None:
    n = 4_000
    ttl_ms = 2_000
    url = store_url()
    with reaping(tmp_path) as fleet:
        async with await gnl.connect(url) as st:
            await enqueue_jobs(st, n)
            await spawn(fleet, "step", url, GNL_MP_TTL_MS=str(ttl_ms), GNL_MP_HOLD_MS="20")
            await start_together(fleet)
            victim = fleet.procs[0]

            # Kill it once it has finished some jobs, while it is in the middle of others (a
            # victim caught between claims, holding nothing, would test nothing).
            deadline = time.monotonic() + 60
            while count_kind(tmp_path, "D", victim.pid) < 100 or not in_flight(
                tmp_path, victim.pid
            ):
                fleet.check_alive("waiting to kill one")
                assert time.monotonic() < deadline, f"the victim did no work\n{fleet.report()}"
                await asyncio.sleep(0.01)
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            killed_at = time.monotonic_ns()
            assert victim.returncode == -signal.SIGKILL
            done_at_kill = count_kind(tmp_path, "D")
            assert done_at_kill < n, "every job was done before the kill: nothing tested"

            await wait_all_done(st, fleet, timeout=60, what="the SIGKILL")
            (tmp_path / "stop").touch()
            codes = await wait_exit(fleet, timeout=30)
            assert codes[1:] == [0] * (PROCESSES - 1), f"exit codes {codes}\n{fleet.report()}"

            lines = read_lines(tmp_path)
            jobs = {j.id: j for j in await all_jobs(st)}
            assert len(jobs) == n
            lost = [
                (j.id, j.state, j.attempts, j.last_error)
                for j in jobs.values()
                if j.state != "done"
            ]
            assert not lost, f"{len(lost)} jobs not done: {lost[:10]}"

            # The side effect: once per job, except a repeat that no journal could prevent.
            audit = audit_steps(lines, killed=(victim.pid, killed_at))
            assert not audit.bugs, (
                f"{len(audit.bugs)} side effects written again after their step was "
                "journaled:\n" + "\n".join(audit.bugs[:10])
            )
            effects = Counter(ln.job for ln in lines if ln.kind == "E")
            assert set(effects) == set(jobs), "jobs whose step never ran"
            repeated = {j for j, c in effects.items() if c > 1}
            # Only the killed process's runs can be caught between effect and journal write.
            assert len(repeated) <= CONCURRENCY, audit.windows
            for j in repeated:
                assert any(
                    ln.kind == "E" and ln.pid == victim.pid for ln in lines if ln.job == j
                ), audit.windows

            # The kept result is the one every run of the job saw, and the job's result.
            for j in jobs.values():
                assert j.result["token"] == audit.recorded[j.id], (j.id, j.result)

            # The killed process's unfinished jobs were reclaimed, same run id, new attempt, once
            # their lease ran out. Its jobs are those it started and did not finish in the
            # store, and those it had claimed but not started yet (no trace of the attempt).
            def trace(j: str) -> str:
                return f"{j}: attempts {jobs[j].attempts}, last_error {jobs[j].last_error!r}, " + (
                    ", ".join(
                        f"{ln.kind}@pid{ln.pid}/a{ln.attempt}@{(ln.t - killed_at) / 1e6:+.0f}ms"
                        for ln in lines
                        if ln.job == j
                    )
                )

            runs: dict[str, list[Line]] = defaultdict(list)
            for ln in lines:
                if ln.kind == "S":
                    runs[ln.job].append(ln)
            started = {j for j, rs in runs.items() if any(r.pid == victim.pid for r in rs)}
            reclaimed = {j for j in started if jobs[j].result["pid"] != victim.pid}
            unstarted = {
                j.id for j in jobs.values() if j.attempts > 1 and len(runs[j.id]) < j.attempts
            }
            assert reclaimed | unstarted, "the killed process held no job: nothing tested"
            for j in reclaimed | unstarted:
                assert len({r.extra[0] for r in runs[j]}) == 1, f"run id changed: {trace(j)}"
                later = [r for r in runs[j] if r.pid != victim.pid]
                assert later, trace(j)
                assert all(r.t > killed_at + ttl_ms // 2 * 10**6 for r in later), (
                    f"reclaimed before its lease ran out: {trace(j)}"
                )
                assert jobs[j].attempts == max(r.attempt for r in later), trace(j)
            # A job retried otherwise lost the lease of a live worker (that renews it every
            # ttl/3); and the killed process held at most its slots, the jobs it claimed ahead
            # (on Postgres up to 4C with short handlers: docs/DECISIONS.md "Claims beyond C")
            # and its unwritten outcomes.
            retried = {j.id for j in jobs.values() if j.attempts > 1}
            others = retried - reclaimed - unstarted
            assert not others, "jobs retried that the killed process did not hold:\n" + (
                "\n".join(trace(j) for j in sorted(others)[:10])
            )
            ahead = gnl_worker._AHEAD_MAX if backend == "postgres" else 1
            assert len(unstarted - reclaimed) <= ahead * CONCURRENCY, [trace(j) for j in unstarted]
            per_pid = Counter(ln.pid for ln in lines if ln.kind == "D")
            assert set(per_pid) == set(fleet.pids()), f"not every process did work: {per_pid}"
    print(
        f"\n{backend}: killed pid {victim.pid} after {done_at_kill} of {n} jobs; "
        f"{len(reclaimed)} reclaimed after they started, "
        f"{len(unstarted - reclaimed)} before; {len(audit.windows)} repeats in the effect-journal "
        f"window: {audit.windows}"
    )


# --------------------------------------------------------------------------------------------
# 3. the database server restarts


def _sh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


class _PostgresServer:
    def __init__(self) -> None:
        versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: float(v))
        self.version = versions[-1]

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _sh("pg_ctlcluster", "--skip-systemctl-redirect", self.version, "main", *args)

    def up(self) -> bool:
        return _sh("pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432", timeout=10).returncode == 0

    def stop(self) -> None:
        r = self.ctl("stop", "-m", "fast")
        assert r.returncode == 0, f"pg_ctlcluster stop: {r.stdout} {r.stderr}"

    def start(self) -> None:
        if not self.up():
            self.ctl("start")


class _MariadbServer:
    def up(self) -> bool:
        r = _sh("mariadb-admin", "-h127.0.0.1", "-P3306", "-uroot", "ping", timeout=10)
        return r.returncode == 0

    def running(self) -> bool:
        return _sh("pidof", "mariadbd", timeout=10).returncode == 0

    def stop(self) -> None:
        r = _sh("mariadb-admin", "-h127.0.0.1", "-P3306", "-uroot", "shutdown")
        assert r.returncode == 0, f"mariadb-admin shutdown: {r.stdout} {r.stderr}"
        deadline = time.monotonic() + 60
        while self.running():
            assert time.monotonic() < deadline, "mariadbd did not exit within 60 s"
            time.sleep(0.1)

    def start(self) -> None:
        if self.up():
            return
        deadline = time.monotonic() + 60
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.1)  # still shutting down: starting now would be a no-op
        _sh(
            "start-stop-daemon", "--start", "--oknodo", "--background",
            "--exec", "/usr/sbin/mariadbd",
        )  # fmt: skip


def local_server(backend: str, url: str) -> _PostgresServer | _MariadbServer | None:
    """A handle to stop and start the server of ``url``, when it runs on this machine."""
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
        return None
    if backend == "postgres":
        if shutil.which("pg_ctlcluster") is None or not os.path.isdir("/etc/postgresql"):
            return None
        return _PostgresServer()
    if shutil.which("mariadb-admin") is None or not os.path.exists("/usr/sbin/mariadbd"):
        return None
    return _MariadbServer()


def wait_up(server: _PostgresServer | _MariadbServer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not server.up():
        assert time.monotonic() < deadline, f"the database server is not up after {timeout} s"
        time.sleep(0.2)


GNL_RECORD = re.compile(r"^(\d+\.\d+) gnl (WARNING|ERROR|CRITICAL) (.*)$", re.M)
DOWN_S = 4  # how long the server stays down


def gnl_records(text: str) -> list[tuple[float, str]]:
    """The ``gnl`` logger's records of WARNING and up in a worker's stderr: (epoch s, text)."""
    return [(float(t), f"{level} {msg}") for t, level, msg in GNL_RECORD.findall(text)]


async def test_database_restart_mid_run(
    backend: str, store_url: Callable[[], str], tmp_path: Path
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite has no server to restart")
    if os.environ.get("GNL_TEST_SHARED_SERVERS"):
        # Several checkouts testing against the same servers at once (a developer's machine):
        # a restart here would break the others' runs. CI never sets it.
        pytest.skip("GNL_TEST_SHARED_SERVERS is set: the shared server is not restarted")
    url = store_url()  # skips (or fails under CI) when the server is missing
    server = local_server(backend, url)
    if server is None:
        missing_server(f"the {backend} server of {url} is not on this machine: cannot restart it")
        return
    # Enough work left after the restart (seconds of it at the fleet's ~2,400 jobs/s) that
    # a worker which is back within its 2 s backoff cap still finds jobs: "every worker went
    # on working" below is about the worker, not about who won the last jobs.
    n = 12_000
    try:
        with reaping(tmp_path) as fleet:
            async with await gnl.connect(url) as st:
                await enqueue_jobs(st, n)
                await spawn(
                    fleet,
                    "step",
                    url,
                    GNL_MP_TTL_MS="3000",
                    GNL_MP_HOLD_MS="20",
                    GNL_MP_MAX_ATTEMPTS="100",
                    GNL_MP_RETRY_DELAY_MS="200",
                )
                await start_together(fleet)

                deadline = time.monotonic() + 60
                while count_kind(tmp_path, "D") < n // 5:
                    fleet.check_alive("waiting to restart the server")
                    assert time.monotonic() < deadline, f"no progress\n{fleet.report()}"
                    await asyncio.sleep(0.01)

                down_at = time.monotonic_ns()
                await asyncio.to_thread(server.stop)
                down_wall = time.time()  # the server is gone (its processes exited)
                done_when_down = count_kind(tmp_path, "D")
                await asyncio.sleep(DOWN_S)
                fleet.check_alive("the server was down")
                start_wall = time.time()
                await asyncio.to_thread(server.start)
                await asyncio.to_thread(wait_up, server)
                up_at = time.monotonic_ns()
                outage_s = (up_at - down_at) / 1e9
                assert done_when_down < n, "every job was done before the outage: nothing tested"

                await wait_all_done(st, fleet, timeout=60, what="the server restart")
                (tmp_path / "stop").touch()
                codes = await wait_exit(fleet, timeout=30)
                assert codes == [0] * PROCESSES, f"exit codes {codes}\n{fleet.report()}"

                # No job lost, the journaled side effects once.
                lines = read_lines(tmp_path)
                jobs = {j.id: j for j in await all_jobs(st)}
                assert len(jobs) == n
                lost = [
                    (j.id, j.state, j.attempts, j.last_error)
                    for j in jobs.values()
                    if j.state != "done"
                ]
                assert not lost, f"{len(lost)} jobs not done: {lost[:10]}"
                audit = audit_steps(lines)
                assert not audit.bugs, (
                    f"{len(audit.bugs)} side effects written again after their step was "
                    "journaled:\n" + "\n".join(audit.bugs[:10])
                )
                effects = Counter(ln.job for ln in lines if ln.kind == "E")
                assert set(effects) == set(jobs), "jobs whose step never ran"
                for j in jobs.values():
                    assert j.result["token"] == audit.recorded[j.id], (j.id, j.result)
                failed_steps = [ln for ln in lines if ln.kind == "F"]

                # Every worker reconnected and went on working.
                after = [ln for ln in lines if ln.kind == "D" and ln.t > up_at]
                assert after, "no job was finished after the server came back: nothing tested"
                first_after = {
                    pid: (min(ln.t for ln in after if ln.pid == pid) - up_at) // 10**6
                    for pid in {ln.pid for ln in after}
                }
                assert {ln.pid for ln in after} == set(fleet.pids()), (
                    "not every worker went on working after the restart (ms from the return "
                    f"to each one's first job done: {first_after}, "
                    f"{len(after)} jobs done after it)\n{fleet.report()}"
                )

                # Every worker logged the outage (logger "gnl") and backed off: a store call that
                # cannot reach the server raises StoreUnavailableError, and the worker's loop logs
                # it and retries later, the interval doubling (API.md "Connecting" and the
                # worker's backoff); so it logs again while the server stays down. A retry loop
                # without backoff would log hundreds of records. The window leaves out the first
                # second, when the server was shutting down and cut the open connections.
                quiet = []
                for i in range(PROCESSES):
                    records = gnl_records(fleet.stderr(i))
                    assert records, f"worker {i} logged nothing about the outage\n{fleet.report()}"
                    assert len(records) < 200, (
                        f"worker {i} logged {len(records)} records in a {outage_s:.1f} s outage "
                        f"(no backoff?)\n{fleet.report()}"
                    )
                    if not [r for r in records if down_wall + 1 <= r[0] <= start_wall]:
                        quiet.append(i)
                assert not quiet, (
                    f"workers {quiet} logged nothing from 1 s after the server was down "
                    f"(stopped at {down_wall:.3f}) until it was started again ({start_wall:.3f}): "
                    "their store calls neither failed nor were retried while it was unreachable"
                    f"\n{fleet.report()}"
                )
    finally:
        await asyncio.to_thread(server.start)
        await asyncio.to_thread(wait_up, server)
    retried = sum(1 for j in jobs.values() if j.attempts > 1)
    print(
        f"\n{backend}: outage {outage_s:.1f} s after {done_when_down} of {n} jobs; "
        f"{retried} jobs took more than one attempt; {len(failed_steps)} steps raised; "
        f"{len(audit.windows)} repeated effects (not yet journaled): {audit.windows[:5]}"
    )
