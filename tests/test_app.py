"""``gnl.App`` and ``gnl run MODULE:ATTR`` (issue 14 deliverables 1 and 5).

``gnl run`` runs tests/_app_sample.py in a subprocess, on SQLite, Postgres and MySQL: it drains the
queue, fires the schedule, consumes the events; a SIGTERM mid-run lets the running handlers
finish and loses nothing; a grace that runs out aborts the handlers' signals; a second SIGTERM
exits at once; a changed schedule and an outdated store stop the start with one clear line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gnl
from _support import outdated_sqlite_store
from conftest import BACKENDS

TESTS = Path(__file__).resolve().parent
RUN_BACKENDS = [b for b in ("sqlite", "postgres", "mysql") if b in BACKENDS]


class Proc:
    """A ``gnl run _app_sample:app`` subprocess and the file its handlers write to."""

    def __init__(self, url: str, tmp: Path, *args: str, **env: str) -> None:
        self.out = tmp / "out.txt"
        self.url = url
        full_env = {
            **os.environ,
            "GNL_URL": url,
            "APP_OUT": str(self.out),
            "PYTHONPATH": str(TESTS),
            **env,
        }
        self.p = subprocess.Popen(
            [sys.executable, "-m", "gnl", "run", "_app_sample:app", *args],
            cwd=tmp,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr = ""

    def lines(self) -> list[str]:
        try:
            return self.out.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []

    def wait_for(self, cond: Callable[[list[str]], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond(self.lines()):
                return
            if self.p.poll() is not None:
                self.finish(0)
                raise AssertionError(
                    f"gnl run exited ({self.p.returncode}) before {what}:\n{self.stderr}"
                )
            time.sleep(0.05)
        self.kill()
        raise AssertionError(
            f"timed out waiting for {what}; lines: {self.lines()[-20:]}\n{self.stderr}"
        )

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.p.send_signal(signum)

    def finish(self, timeout: float = 60) -> int:
        _, err = self.p.communicate(timeout=timeout)
        self.stderr += err
        return self.p.returncode

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.finish()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        if p.p.poll() is None:
            p.kill()


def jobs_of(url: str) -> dict[str, gnl.JobInfo]:
    async def go() -> dict[str, gnl.JobInfo]:
        async with await gnl.connect(url) as st:
            page = await gnl.list_all_jobs(st.work, limit=10_000)
            return {j.id: j for j in page.items}

    return asyncio.run(go())


def seed(url: str, jobs: int, events: int = 0) -> None:
    async def go() -> None:
        async with await gnl.connect(url) as st:
            await gnl.enqueue_many(
                st.work, [gnl.JobSpec("work", {"n": i}, id=f"j{i:03d}") for i in range(jobs)]
            )
            for i in range(events):
                await gnl.emit(st.work, "orders", {"order": i}, id=f"e{i}")

    asyncio.run(go())


def started_and_ended(lines: list[str]) -> tuple[set[str], set[str]]:
    started = {ln.split()[1] for ln in lines if ln.startswith("start ")}
    ended = {ln.split()[1] for ln in lines if ln.startswith("end ")}
    return started, ended


# -- gnl run in a subprocess ----------------------------------------------------------------


@pytest.mark.parametrize("backend", RUN_BACKENDS)
def test_run_drains_fires_and_consumes(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    url = store_url()
    seed(url, jobs=30, events=3)
    p = Proc(url, tmp_path, "--grace-ms", "10000", APP_WORK_MS="20", APP_EVERY_MS="200")
    procs.append(p)
    p.wait_for(
        lambda ls: (
            len(started_and_ended(ls)[1]) == 30
            and sum(ln == "tick" for ln in ls) >= 1
            and sum(ln.startswith("event ") for ln in ls) == 3
        ),
        "30 jobs, a tick and 3 events",
    )
    p.signal()
    assert p.finish() == 0, p.stderr
    jobs = jobs_of(url)
    assert {j.state for j in jobs.values()} == {"done"}
    assert all(j.result == {"n": int(j.id[1:])} for j in jobs.values())
    assert sorted(ln for ln in p.lines() if ln.startswith("event ")) == [
        "event e0",
        "event e1",
        "event e2",
    ]
    # one line per start and stop on logger gnl
    assert "gnl run: started on" in p.stderr and "gnl run: stopped (exit code 0)" in p.stderr

    async def runs() -> list[gnl.RunInfo]:
        async with await gnl.connect(url) as st:
            return await gnl.list_runs(st, workflow="tick", state="done")

    assert asyncio.run(runs()), "the schedule fired no run"


@pytest.mark.parametrize("backend", RUN_BACKENDS)
def test_sigterm_mid_run_lets_handlers_finish_and_loses_nothing(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    url = store_url()
    seed(url, jobs=40)
    p = Proc(url, tmp_path, "--grace-ms", "20000", APP_WORK_MS="400")
    procs.append(p)
    # Mid-run: some jobs done, some handlers running.
    p.wait_for(
        lambda ls: (
            len(started_and_ended(ls)[1]) >= 4
            and len(started_and_ended(ls)[0]) > len(started_and_ended(ls)[1])
        ),
        "handlers mid-run",
    )
    p.signal()
    assert p.finish() == 0, p.stderr
    started, ended = started_and_ended(p.lines())
    assert started == ended, "a running handler did not finish"
    assert not any(ln.startswith("revoked ") for ln in p.lines())
    jobs = jobs_of(url)
    assert len(jobs) == 40
    states = {j.id: j.state for j in jobs.values()}
    assert "running" not in states.values() and "dead" not in states.values()
    assert {i for i, s in states.items() if s == "done"} == ended
    assert len(ended) < 40, "the SIGTERM came after the queue was drained"
    # Nothing lost: a second process drains the rest.
    p2 = Proc(url, tmp_path, APP_WORK_MS="10")
    procs.append(p2)
    p2.wait_for(lambda ls: started_and_ended(ls)[1] >= set(states), "the rest drained")
    p2.signal()
    assert p2.finish() == 0, p2.stderr
    assert {j.state for j in jobs_of(url).values()} == {"done"}


@pytest.mark.parametrize("backend", RUN_BACKENDS)
def test_grace_running_out_aborts_the_signals(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    url = store_url()
    seed(url, jobs=4)
    p = Proc(url, tmp_path, "--grace-ms", "300", APP_WORK_MS="60000")
    procs.append(p)
    p.wait_for(lambda ls: len(started_and_ended(ls)[0]) == 4, "4 handlers running")
    t0 = time.monotonic()
    p.signal()
    assert p.finish() == 0, p.stderr
    assert time.monotonic() - t0 < 30
    revoked = [ln for ln in p.lines() if ln.startswith("revoked ")]
    assert len(revoked) == 4 and all(ln.endswith(" shutdown") for ln in revoked)
    assert "grace of 300 ms ran out" in p.stderr
    jobs = jobs_of(url)
    # The revoked attempts failed: the jobs wait for their retry (nothing running, none lost).
    assert {j.state for j in jobs.values()} == {"pending"}
    assert all(j.attempts == 1 and "shutdown" in (j.last_error or "") for j in jobs.values()), [
        (j.attempts, j.last_error) for j in jobs.values()
    ]


def signalled_with_two_stuck_handlers(
    url: str, tmp_path: Path, procs: list[Proc], grace_ms: int
) -> Proc:
    """`gnl run` with two handlers that ignore their signal, sent SIGTERM once both run."""
    seed(url, jobs=2)
    p = Proc(url, tmp_path, "--grace-ms", str(grace_ms), APP_WORK_MS="60000", APP_IGNORE_SIGNAL="1")
    procs.append(p)
    p.wait_for(lambda ls: len(started_and_ended(ls)[0]) == 2, "2 handlers running")
    p.signal()
    return p


@pytest.mark.parametrize("backend", RUN_BACKENDS[:1])
def test_second_sigterm_exits_at_once(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    url = store_url()
    p = signalled_with_two_stuck_handlers(url, tmp_path, procs, grace_ms=60_000)
    time.sleep(0.5)
    assert p.p.poll() is None, "the first SIGTERM must wait for the handlers"
    t0 = time.monotonic()
    p.signal()
    assert p.finish(timeout=10) == 128 + signal.SIGTERM, p.stderr
    assert time.monotonic() - t0 < 5
    assert "second SIGTERM: exiting at once" in p.stderr


@pytest.mark.parametrize("backend", RUN_BACKENDS[:1])
def test_sigint_stops_like_sigterm(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    url = store_url()
    seed(url, jobs=1)
    p = Proc(url, tmp_path, "--only", "worker", APP_WORK_MS="300")
    procs.append(p)
    p.wait_for(lambda ls: len(started_and_ended(ls)[0]) == 1, "the handler running")
    p.signal(signal.SIGINT)
    assert p.finish() == 0, p.stderr
    assert started_and_ended(p.lines())[1] == {"j000"}
    # --only worker: no scheduler, so no schedule is registered.
    assert "scheduler" not in p.stderr.split("started on", 1)[1].splitlines()[0]


@pytest.mark.parametrize("backend", RUN_BACKENDS)
def test_changed_schedule_stops_the_start(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    url = store_url()

    async def register_other() -> None:
        async with await gnl.connect(url) as st:
            await gnl.schedule_workflow(st, "tick", every_ms=99_000)

    asyncio.run(register_other())
    p = Proc(url, tmp_path)
    procs.append(p)
    assert p.finish() == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("gnl: ") and "gnl triggers unschedule tick" in last, p.stderr
    # It says what changed: the registered definition's field, then the app's.
    assert 'spec: "99000" -> ' in last, last
    # Said once, not logged and then printed again.
    assert p.stderr.count("schedule 'tick' changed") == 1, p.stderr


def test_outdated_store_names_gnl_upgrade(tmp_path: Path, procs: list[Proc]) -> None:
    url = outdated_sqlite_store(str(tmp_path / "old.db"))
    p = Proc(url, tmp_path)
    procs.append(p)
    assert p.finish() == 1
    assert "gnl upgrade" in p.stderr.strip().splitlines()[-1]


def test_unreachable_store_is_retried_not_fatal(tmp_path: Path, procs: list[Proc]) -> None:
    p = Proc("postgres://postgres@127.0.0.1:1/nowhere", tmp_path)
    procs.append(p)
    time.sleep(3)
    assert p.p.poll() is None, "gnl run died on an unreachable store"
    p.signal()
    assert p.finish() == 0
    assert "unavailable, retrying in" in p.stderr
    # Stopped while it retried: said, and no retry announced after the signal.
    after = p.stderr.split("SIGTERM", 1)[-1]
    assert "stopped before the store" in after and "retrying in" not in after, p.stderr


def test_an_app_module_that_raises_on_import_shows_its_own_traceback(tmp_path: Path) -> None:
    # It printed the traceback through click's and gnl's frames; now the module's frames,
    # then one line naming the module and what it raised (exit 1: the app's code failed).
    (tmp_path / "boom_app.py").write_text(
        'def helper():\n    raise RuntimeError("the config is missing")\n\n\nhelper()\n'
    )
    (tmp_path / "dep_app.py").write_text("import no_such_dependency_x\n")
    for module, raised in (
        ("boom_app", "RuntimeError: the config is missing"),
        ("dep_app", "ModuleNotFoundError: No module named 'no_such_dependency_x'"),
    ):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "gnl",
                "run",
                f"{module}:app",
                "--url",
                f"sqlite:///{tmp_path}/x.db",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert r.returncode == 1, r
        lines = r.stderr.strip().splitlines()
        assert lines[-1] == f"gnl: importing {module!r} (from '{module}:app') raised {raised}", (
            r.stderr
        )
        assert f"{module}.py" in r.stderr and lines[0].startswith("Traceback"), r.stderr
        assert "click" not in r.stderr and "gnl/" not in r.stderr and "importlib" not in r.stderr
    assert not (tmp_path / "x.db").exists()  # nothing was opened


def test_an_app_factory_that_raises_or_is_async_is_said_in_one_line(tmp_path: Path) -> None:
    # A factory that raised showed click's whole traceback; an async one warned "coroutine
    # ... was never awaited". Now a raise is said as an import's is (the user's frames, one
    # line, exit 1) and an async factory is refused as bad usage (exit 2): no loop runs yet.
    (tmp_path / "factory_app.py").write_text(
        "import gnl\n\n\n"
        "def make_app():\n    raise RuntimeError('no config')\n\n\n"
        "async def make_async():\n    return gnl.App()\n\n\n"
        "def make_later():\n    return make_async()\n"
    )

    def run(attr: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gnl", "run", f"factory_app:{attr}"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "GNL_URL": f"sqlite:///{tmp_path}/x.db"},
        )

    r = run("make_app")
    assert r.returncode == 1, r
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == ("gnl: calling 'factory_app:make_app' raised RuntimeError: no config"), (
        r.stderr
    )
    assert lines[0].startswith("Traceback") and "factory_app.py" in r.stderr, r.stderr
    assert "click" not in r.stderr and "gnl/" not in r.stderr, r.stderr
    for attr, what in (
        ("make_async", "is an async function"),
        ("make_later", "returned a coroutine"),
    ):
        r = run(attr)
        assert r.returncode == 2, r
        assert r.stderr.strip().splitlines() == [
            f"gnl: InvalidArgumentError: 'factory_app:{attr}' {what}: gnl run "
            "makes the app before its event loop starts, so it cannot await it; make it a "
            "plain function that returns the gnl.App (what needs the loop belongs in the "
            "handlers)"
        ], r.stderr
    assert not (tmp_path / "x.db").exists()  # nothing was opened


async def test_roles_with_nothing_to_run_do_not_start(tmp_path: Path) -> None:
    # `gnl run app --only worker` of an app without jobs logged "nothing to run" and sat
    # idle until stopped (exit 0): a mistyped module or role looked like a healthy process.
    app = gnl.App(url=f"sqlite:///{tmp_path}/x.db")

    @app.job("j")
    async def j(payload: Any, ctx: gnl.JobContext) -> None:
        return None

    for only in (["consumers"], ["scheduler", "waker"]):
        with pytest.raises(gnl.AppError, match="nothing to run: the app declares 1 job type"):
            await app.serve(only=only)
    with pytest.raises(gnl.AppError, match="nothing to run"):
        await gnl.App(url=f"sqlite:///{tmp_path}/x.db").serve()
    assert not (tmp_path / "x.db").exists()  # refused before the store was opened


def test_bad_target_is_usage_error(tmp_path: Path) -> None:
    for target, msg in (
        ("nocolon", "MODULE:ATTR"),
        ("no_such_module_x:app", "no module"),
        ("_app_sample:nope", "no attribute"),
        ("_app_sample:OUT", "not a gnl.App"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "gnl", "run", target, "--url", f"sqlite:///{tmp_path}/x.db"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(TESTS)},
        )
        assert r.returncode == 2, (target, r)
        assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (target, r.stderr)
    r = subprocess.run(
        [sys.executable, "-m", "gnl", "run", "_app_sample:app", "--only", "worker,nope"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(TESTS), "GNL_URL": f"sqlite:///{tmp_path}/x.db"},
    )
    assert r.returncode == 2 and "unknown role(s) 'nope'" in r.stderr, r
    # A SQLite file in a directory that does not exist: a setup error, said at once (not an
    # outage retried forever).
    missing = tmp_path / "no-such-dir"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gnl",
            "run",
            "_app_sample:app",
            "--url",
            f"sqlite:///{missing}/x.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )
    assert r.returncode == 2 and str(missing) in r.stderr and "retrying" not in r.stderr, r
    assert not missing.exists()
    # A directory where the file should be: retried forever as an outage until session 24
    # (SQLite's open fails as CANTOPEN); now said at once, naming the path.
    r = subprocess.run(
        [sys.executable, "-m", "gnl", "run", "_app_sample:app"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(TESTS), "GNL_URL": f"sqlite:///{tmp_path}"},
    )
    assert r.returncode == 2 and "retrying" not in r.stderr, r
    assert r.stderr.strip().splitlines() == [
        f'gnl: InvalidArgumentError: the SQLite path "{tmp_path}" is a directory, not a file: '
        f'name the file in it (e.g. "{tmp_path}/gnl.db")'
    ], r.stderr


# -- the App object in process ----------------------------------------------------------------


def test_declarations_are_checked_when_declared() -> None:
    app = gnl.App(url="sqlite::memory:")

    @app.job("a")
    async def a(payload: Any, ctx: gnl.JobContext) -> None: ...

    with pytest.raises(gnl.InvalidArgumentError, match="declared twice"):
        app.job("a")
    with pytest.raises(gnl.InvalidArgumentError, match="concurrency"):
        app.job("b", concurrency=0)
    with pytest.raises(TypeError):
        app.job(3)  # type: ignore[arg-type]
    with pytest.raises(gnl.InvalidArgumentError, match="exactly one"):
        app.schedule("wf")
    with pytest.raises(gnl.CronError):
        app.schedule("wf", cron="61 * * * *")
    with pytest.raises(TypeError, match="the input of schedule 'wf'"):
        app.schedule("wf", every_ms=1_000, input={1, 2})
    app.schedule("wf", every_ms=1_000)
    with pytest.raises(gnl.InvalidArgumentError, match="declared twice"):
        app.schedule("wf", every_ms=2_000)

    @app.consumer("t", "c")
    async def c(payload: Any, meta: gnl.EventMeta) -> None: ...

    with pytest.raises(gnl.InvalidArgumentError, match="declared twice"):
        app.consumer("t", "c")
    assert app.job_types == ["a"] and app.schedules == ["wf"] and app.consumers == [("t", "c")]
    # A schedule of a workflow the app does not declare: refused at start, nothing started.
    with pytest.raises(gnl.AppError, match="workflow 'wf'"):
        asyncio.run(app.serve(stop=asyncio.Event()))
    with pytest.raises(gnl.InvalidArgumentError, match="roles"):
        asyncio.run(app.serve(only=["workers"]))
    # ... also when that schedule is all the app declares (it was "nothing to run").
    lone = gnl.App(url="sqlite::memory:")
    lone.schedule("nightly", every_ms=1_000)
    with pytest.raises(gnl.AppError, match="workflow 'nightly'.*declared: none"):
        asyncio.run(lone.serve(stop=asyncio.Event()))


BAD_SCHEDULES: list[dict[str, Any]] = [
    {"every_ms": 1_000, "misfire": "sometimes"},
    {"every_ms": 1_000, "misfire": 3},
    {"every_ms": 1_000, "misfire": "catchup", "max_catchup": 0},
    {"every_ms": 1_000, "max_catchup": 2},
    {"every_ms": 1_000, "misfire_grace_ms": -1},
    {"every_ms": 1_000, "max_attempts": 0},
    {"every_ms": 1_000, "max_attempts": "5"},
    {"every_ms": 0},
    {"at": 10**15},
    {"at": datetime(2030, 1, 1)},
    {"at": "tomorrow"},
    {"cron": "*/5 * * *"},
    {"cron": "0 3 * * *", "every_ms": 1_000},
    # The store's limits on trigger ids (they were refused only at registration).
    {"every_ms": 1_000, "id": "x" * 256},
    {"every_ms": 1_000, "id": "a\0b"},
]


@pytest.mark.parametrize("kwargs", BAD_SCHEDULES, ids=[str(k) for k in BAD_SCHEDULES])
async def test_a_bad_schedule_option_raises_at_declaration_what_the_start_would(
    storage: gnl.Storage, kwargs: dict[str, Any]
) -> None:
    # They raised only at `gnl run`; now the declaration raises schedule_workflow's own error
    # (the same type and message, naming the option), and nothing is declared or written.
    with pytest.raises((gnl.InvalidArgumentError, TypeError)) as runtime:
        await gnl.schedule_workflow(storage, "wf", **kwargs)
    app = gnl.App()
    with pytest.raises(type(runtime.value)) as declared:
        app.schedule("wf", **kwargs)
    assert str(declared.value) == str(runtime.value)
    assert app.schedules == [] and await gnl.list_triggers(storage) == []


BAD_CONSUMERS: list[dict[str, Any]] = [
    {"max_attempts": 0},
    {"max_attempts": 1.5},
    {"max_attempts": True},
    {"lease_ms": 2},
    {"lease_ms": "30s"},
    {"max_hold_ms": 0},
    {"retry_delay_ms": -1},
    {"poll_ms": 0},
    {"poll_ms": 100, "max_poll_ms": 50},
]


@pytest.mark.parametrize("job_type", ["z" * 201, "a\tb"])
async def test_a_job_type_no_job_can_have_is_refused_at_declaration(
    storage: gnl.Storage, job_type: str
) -> None:
    # `@app.job("z" * 5000)` was accepted and a worker started for a type that enqueue refuses.
    with pytest.raises(gnl.InvalidArgumentError) as enqueued:
        await gnl.enqueue(storage.work, job_type, {})
    app = gnl.App()
    with pytest.raises(gnl.InvalidArgumentError) as declared:
        app.job(job_type)
    with pytest.raises(gnl.InvalidArgumentError) as created:

        async def h(payload: Any, ctx: gnl.JobContext) -> None: ...

        gnl.create_worker(storage, {job_type: h})
    assert str(declared.value) == str(created.value) == str(enqueued.value)
    assert app.job_types == []


@pytest.mark.parametrize("kwargs", BAD_CONSUMERS, ids=[str(k) for k in BAD_CONSUMERS])
async def test_a_bad_consumer_option_raises_at_declaration_what_the_start_would(
    storage: gnl.Storage, kwargs: dict[str, Any]
) -> None:
    # They raised only at `gnl run`, after the worker and the scheduler had started.
    async def h(payload: Any, meta: gnl.EventMeta) -> None: ...

    with pytest.raises((gnl.InvalidArgumentError, TypeError)) as runtime:
        gnl.create_consumer(storage.work, "orders", h, name="billing", **kwargs)
    app = gnl.App()
    with pytest.raises(type(runtime.value)) as declared:
        app.consumer("orders", "billing", **kwargs)
    assert str(declared.value) == str(runtime.value)
    assert app.consumers == []


async def test_serve_in_process(store_url: Callable[[], str]) -> None:
    url = store_url()
    app = gnl.App(url=url, waker_interval_ms=50, scheduler_poll_ms=50)
    done: list[int] = []
    seen: list[str] = []

    @app.job("add", concurrency=2)
    async def add(payload: Any, ctx: gnl.JobContext) -> Any:
        done.append(payload["n"])
        return payload["n"] + 1

    @app.workflow()
    async def nightly(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return await ctx.step("s", lambda: input)

    app.schedule("nightly", at=0, input={"k": 1})

    @app.consumer("topic", "reader")
    async def read(payload: Any, meta: gnl.EventMeta) -> None:
        seen.append(meta.id)

    stop = asyncio.Event()
    task = asyncio.create_task(app.serve(stop=stop, grace_ms=5_000))
    async with await gnl.connect(url) as st:
        await gnl.enqueue_many(st.work, [gnl.JobSpec("add", {"n": i}) for i in range(10)])
        await gnl.emit(st.work, "topic", {}, id="ev")
        for _ in range(400):
            runs = await gnl.list_runs(st, workflow="nightly", state="done")
            if len(done) == 10 and seen == ["ev"] and runs:
                break
            await asyncio.sleep(0.05)
        stop.set()
        assert await task == 0
        assert sorted(done) == list(range(10)) and seen == ["ev"]
        assert runs and runs[0].result == {"k": 1}
        # Registering again at the next start is a no-op (the same definition).
        stop2 = asyncio.Event()
        stop2.set()
        assert await app.serve(stop=stop2) == 0
        assert [t.id for t in await gnl.list_triggers(st)] == ["nightly"]


async def test_every_failed_attempt_is_logged_however_it_failed(
    store_url: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    # deploy.md promises a line per failed handler attempt: a job whose handler returned a
    # result that is not JSON, or returned past max_hold_ms, and an event whose handler
    # returned past max_hold_ms were failed silently (only a raise was logged). A job
    # canceled while its handler ran said "attempt 1 failed"; it says it was canceled.
    url = store_url()
    app = gnl.App(url=url)
    started = asyncio.Event()

    @app.job("unjson", max_attempts=1)
    async def unjson(payload: Any, ctx: gnl.JobContext) -> Any:
        return {1, 2}

    @app.job("slow", max_hold_ms=50, retry_delay_ms=60_000)
    async def slow(payload: Any, ctx: gnl.JobContext) -> Any:
        await asyncio.sleep(0.3)  # past max_hold_ms, ignoring the signal, then returns
        return "late"

    @app.job("raises", max_hold_ms=60_000, retry_delay_ms=60_000)
    async def raises(payload: Any, ctx: gnl.JobContext) -> Any:
        raise RuntimeError("boom")

    @app.job("waits", ttl_ms=300)
    async def waits(payload: Any, ctx: gnl.JobContext) -> Any:
        started.set()
        await ctx.signal.wait()
        ctx.signal.raise_if_aborted()

    # Its handler sees the cancel and returns all the same: nothing was said. (Options of its
    # own: a worker of its own, so that it runs beside "waits".)
    @app.job("ignores", ttl_ms=400)
    async def ignores(payload: Any, ctx: gnl.JobContext) -> Any:
        started.set()
        await ctx.signal.wait()
        return "finished anyway"

    @app.consumer("topic", "reader", max_hold_ms=50, retry_delay_ms=60_000)
    async def read(payload: Any, meta: gnl.EventMeta) -> None:
        await asyncio.sleep(0.3)

    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="gnl")
    task = asyncio.create_task(app.serve(stop=stop, grace_ms=5_000))
    async with await gnl.connect(url) as st:
        await gnl.enqueue_many(
            st.work,
            [
                gnl.JobSpec("unjson", {}, id="u"),
                gnl.JobSpec("slow", {}, id="s"),
                gnl.JobSpec("raises", {}, id="r"),
                gnl.JobSpec("waits", {}, id="w"),
                gnl.JobSpec("ignores", {}, id="i"),
            ],
        )
        await gnl.emit(st.work, "topic", {}, id="ev")
        await asyncio.wait_for(started.wait(), 30)
        running: set[str | None] = set()
        for _ in range(400):
            running = {getattr(await gnl.get_job(st.work, j), "state", None) for j in "wi"}
            if running == {"running"}:
                break
            await asyncio.sleep(0.05)
        assert running == {"running"}
        assert await gnl.cancel_job(st.work, "w")
        assert await gnl.cancel_job(st.work, "i")
        for _ in range(400):
            jobs = {j: await gnl.get_job(st.work, j) for j in "usrwi"}
            states = {j: (i.state, i.attempts) if i else None for j, i in jobs.items()}
            if (
                states
                == {
                    "u": ("dead", 1),
                    "s": ("pending", 1),
                    "r": ("pending", 1),
                    "w": ("canceled", 1),
                    "i": ("canceled", 1),
                }
                and "event 'ev'" in caplog.text
            ):
                break
            await asyncio.sleep(0.05)
        stop.set()
        assert await task == 0
    assert states["u"] == ("dead", 1) and states["w"] == ("canceled", 1), states
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gnl run: ")]

    def one(start: str) -> str:
        found = [ln for ln in lines if ln.startswith(start)]
        assert len(found) == 1, (start, lines)
        return found[0]

    # Each line says what the job records as its error.
    unjson_line = one("gnl run: job 'u' (type 'unjson') attempt 1 failed and is dead")
    assert unjson_line.endswith(f"(max_attempts reached): {jobs['u'].last_error}")
    assert "which is not JSON" in unjson_line
    assert "max_hold_ms=50" in one("gnl run: job 's' (type 'slow') attempt 1 failed: timeout")
    assert one("gnl run: job 'r' (type 'raises') attempt 1 failed: ").endswith("RuntimeError: boom")
    assert one("gnl run: event 'ev' of topic/reader attempt 1 failed: timeout").endswith(
        "the handler held the event past max_hold_ms=50"
    )
    assert one("gnl run: job 'w' (type 'waits') was canceled during attempt 1")
    assert not [ln for ln in lines if ln.startswith("gnl run: job 'w'") and "failed" in ln]
    assert one("gnl run: job 'i' (type 'ignores') was canceled during attempt 1").endswith(
        "its handler ended: it returned; its result is dropped"
    )


async def test_a_failed_schedule_is_said_at_every_start(
    store_url: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    # A trigger that used up its attempts fires no more: each start says so and how to re-arm.
    url = store_url()
    app = gnl.App(url=url, scheduler_poll_ms=20)

    @app.workflow()
    async def flaky(ctx: gnl.WorkflowContext, input: Any) -> Any:
        raise RuntimeError("the service is down")

    app.schedule("flaky", at=0, max_attempts=1)
    stop = asyncio.Event()
    task = asyncio.create_task(app.serve(stop=stop, only=["scheduler"]))
    async with await gnl.connect(url) as st:
        for _ in range(200):
            states = [t.state for t in await gnl.list_triggers(st)]
            if states == ["failed"]:
                break
            await asyncio.sleep(0.05)
        assert states == ["failed"]
    stop.set()
    assert await task == 0
    assert "failed after 1 attempts and fires no more" in caplog.text
    caplog.clear()
    stop2 = asyncio.Event()
    stop2.set()
    with caplog.at_level("WARNING", logger="gnl"):
        assert await app.serve(stop=stop2, only=["scheduler"]) == 0
    assert "schedule 'flaky' failed after 1 attempts (RuntimeError: the service is down)" in (
        caplog.text
    )
    assert "gnl triggers unschedule flaky" in caplog.text


async def test_recovery_timings_are_set_on_the_app(store_url: Callable[[], str]) -> None:
    # A run's lease and a busy or stopped fire's wait come from the app (they were fixed at
    # 30 s each): here a 120 s lease, and a fire stopped by shutdown retried 45 s on.
    url = store_url()
    app = gnl.App(
        url=url,
        scheduler_poll_ms=20,
        run_lease_ms=120_000,
        fire_lock_ttl_ms=90_000,
        fire_retry_ms=45_000,
    )
    inside = asyncio.Event()

    @app.workflow()
    async def long(ctx: gnl.WorkflowContext, input: Any) -> Any:
        async def wait() -> None:
            inside.set()
            await ctx.signal.wait()  # until the shutdown aborts it

        await ctx.step("wait", wait)
        return await ctx.step("after", lambda: 1)

    app.schedule("long", at=0)
    stop = asyncio.Event()
    task = asyncio.create_task(app.serve(stop=stop, only=["scheduler"], grace_ms=100))
    await asyncio.wait_for(inside.wait(), 30)
    async with await gnl.connect(url) as st:
        (run,) = await gnl.list_runs(st)
        now = await st.now_ms()
        assert run.lease_expires_at is not None
        assert 100_000 < run.lease_expires_at - now <= 120_000, run.lease_expires_at - now
        stop.set()
        await task
        (t,) = await gnl.list_triggers(st)
        assert (t.state, t.deferrals) == ("pending", 1)
        assert t.next_run_at is not None and 40_000 < t.next_run_at - now <= 45_000
    with pytest.raises(gnl.InvalidArgumentError, match="run_lease_ms must be >= 100"):
        gnl.App(run_lease_ms=2)
    with pytest.raises(gnl.InvalidArgumentError, match="fire_lock_ttl_ms"):
        gnl.App(fire_lock_ttl_ms=0)
    with pytest.raises(gnl.InvalidArgumentError, match="fire_retry_ms"):
        gnl.App(fire_retry_ms=0)


async def test_a_lease_too_short_to_be_renewed_is_refused(storage: gnl.Storage) -> None:
    # App(run_lease_ms=3) was accepted: renewed every ms, the lease lapsed between renewals
    # and on SQLite the waker took over its own live run. Every lease has one floor, 100 ms.
    async def h(payload: Any, ctx: Any) -> None: ...

    async def wf(ctx: gnl.WorkflowContext, input: Any) -> None: ...

    class Runner:
        workflows = frozenset({"wf"})

        async def run_workflow(self, name: str, **kw: Any) -> None: ...

    refusals: list[tuple[str, Callable[[int], object]]] = [
        ("run_lease_ms", lambda ms: gnl.App(run_lease_ms=ms)),
        ("fire_lock_ttl_ms", lambda ms: gnl.App(fire_lock_ttl_ms=ms)),
        ("ttl_ms", lambda ms: gnl.App().job("j", ttl_ms=ms)),
        ("lease_ms", lambda ms: gnl.App().consumer("t", "c", lease_ms=ms)),
        ("lease_ms", lambda ms: gnl.create_gnl(storage, {"wf": wf}, lease_ms=ms)),
        ("ttl_ms", lambda ms: gnl.create_worker(storage, {"j": h}, ttl_ms=ms)),
        ("lease_ms", lambda ms: gnl.create_consumer(storage.work, "t", h, name="c", lease_ms=ms)),
        ("lock_ttl_ms", lambda ms: gnl.create_scheduler(storage, Runner(), lock_ttl_ms=ms)),
    ]
    for option, make in refusals:
        for ms in (3, 99):
            with pytest.raises(gnl.InvalidArgumentError) as e:
                make(ms)
            assert str(e.value).startswith(f"{option} must be >= 100 ms, got {ms}: "), e.value
            assert "renewed every third of it" in str(e.value)
        made = make(100)
        assert made is not None, option


@pytest.mark.parametrize("backend", [b for b in RUN_BACKENDS if b == "postgres"])
def test_store_outage_mid_run_is_retried_and_nothing_is_lost(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    from _faults import pg_outage_end, pg_outage_start

    url = store_url()
    seed(url, jobs=60, events=2)
    p = Proc(url, tmp_path, "--grace-ms", "20000", APP_WORK_MS="50")
    procs.append(p)
    p.wait_for(lambda ls: len(started_and_ended(ls)[1]) >= 5, "some jobs done")
    asyncio.run(pg_outage_start(url))
    try:
        time.sleep(3)
        assert p.p.poll() is None, "gnl run died in the outage"
    finally:
        asyncio.run(pg_outage_end(url))
    p.wait_for(
        lambda ls: (
            len(started_and_ended(ls)[1]) == 60 and sum(ln.startswith("event ") for ln in ls) == 2
        ),
        "the queue drained after the outage",
        timeout=120,
    )
    p.signal()
    assert p.finish() == 0, p.stderr
    assert "unavailable" in p.stderr
    assert {j.state for j in jobs_of(url).values()} == {"done"}


@pytest.mark.parametrize("backend", [b for b in RUN_BACKENDS if b == "postgres"])
def test_outcomes_not_written_while_stopping_exit_1_and_are_run_again(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    from _faults import pg_outage_end, pg_outage_start

    url = store_url()
    seed(url, jobs=4)
    p = Proc(url, tmp_path, "--grace-ms", "20000", APP_WORK_MS="1500")
    procs.append(p)
    p.wait_for(lambda ls: len(started_and_ended(ls)[0]) == 4, "4 handlers running")
    asyncio.run(pg_outage_start(url))
    try:
        p.signal()
        code = p.finish(timeout=90)
    finally:
        asyncio.run(pg_outage_end(url))
    assert code == 1, p.stderr
    assert "outcomes could not be written" in p.stderr
    # Nothing lost: their leases lapse and another process runs them again.
    p2 = Proc(url, tmp_path, APP_WORK_MS="10")
    procs.append(p2)
    p2.wait_for(
        lambda _: {j.state for j in jobs_of(url).values()} == {"done"}, "the 4 jobs run again"
    )
    p2.signal()
    assert p2.finish() == 0, p2.stderr


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    durations=st.lists(st.integers(0, 400), min_size=1, max_size=12),
    stop_after_ms=st.integers(0, 500),
    grace_ms=st.integers(0, 300),
    concurrency=st.integers(1, 4),
)
def test_shutdown_at_any_moment_loses_nothing(
    tmp_path: Path, durations: list[int], stop_after_ms: int, grace_ms: int, concurrency: int
) -> None:
    """Stopped at any moment with any grace: serve returns 0 (the handlers heed their signal),
    no job is left running, every job is done or pending again, and a job is done exactly
    when its handler returned."""
    import uuid

    url = f"sqlite:///{tmp_path}/{uuid.uuid4().hex}.db"
    app = gnl.App(url=url)
    returned: set[str] = set()
    revoked: set[str] = set()

    @app.job("w", concurrency=concurrency, retry_delay_ms=60_000, poll_ms=10)
    async def w(payload: Any, ctx: gnl.JobContext) -> None:
        try:
            await asyncio.wait_for(ctx.signal.wait(), payload / 1000)
        except asyncio.TimeoutError:
            returned.add(ctx.job_id)
            return
        revoked.add(ctx.job_id)
        assert ctx.signal.reason is not None and ctx.signal.reason.why == "shutdown"
        ctx.signal.raise_if_aborted()

    async def go() -> None:
        async with await gnl.connect(url) as storage:
            await gnl.enqueue_many(
                storage.work, [gnl.JobSpec("w", d, id=f"j{i}") for i, d in enumerate(durations)]
            )
            stop = asyncio.Event()
            task = asyncio.create_task(app.serve(stop=stop, grace_ms=grace_ms))
            await asyncio.sleep(stop_after_ms / 1000)
            stop.set()
            assert await task == 0
            jobs = {j.id: j for j in (await gnl.list_all_jobs(storage.work, limit=100)).items}
        assert len(jobs) == len(durations)
        assert {j.id for j in jobs.values() if j.state == "done"} == returned
        rest = {j.id: j.state for j in jobs.values() if j.id not in returned}
        assert set(rest.values()) <= {"pending"}, rest
        assert revoked <= set(rest)

    asyncio.run(go())


@pytest.mark.parametrize("backend", RUN_BACKENDS[:1])
def test_a_handler_past_both_graces_is_said_and_its_job_is_not_lost(
    store_url: Callable[[], str], tmp_path: Path, procs: list[Proc]
) -> None:
    url = store_url()
    p = signalled_with_two_stuck_handlers(url, tmp_path, procs, grace_ms=300)
    assert p.finish() == 1, p.stderr
    assert "did not stop (a handler ignores its aborted signal)" in p.stderr
    assert "those attempts fail" in p.stderr
    # As said: the attempts failed (cancelled), the jobs wait for their retry; none is lost.
    jobs = jobs_of(url)
    assert len(jobs) == 2
    assert all(
        j.state == "pending" and j.attempts == 1 and "CancelledError" in (j.last_error or "")
        for j in jobs.values()
    ), [(j.state, j.attempts, j.last_error) for j in jobs.values()]
