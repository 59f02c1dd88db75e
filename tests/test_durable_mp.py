"""API.md "Durable runs" across processes, on every backend (the processes run
``_durable_proc.py``; their side effects are lines of one append-only log):

* two executors of one run id in two processes: with or without the critical preset every
  step's side effect happens once (the second is refused while the first one's lease is live,
  or reads back the finished run);
* kill -9 mid-run, then the waker of another process resumes the run (its lease lapsed): the
  completed steps are not repeated (only the step in flight runs again);
* a sleep across a process restart resumes on time, once, under two wakers in two processes;
* a job whose handler uses ``ctx.run`` is reclaimed after a SIGKILL and repeats no completed
  step;
* under 100 SIGKILLs an at-most-once step's function never runs twice, and the runs that hit
  the window raise StepOutcomeUnknownError.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import _support
import gnl

PROC = str(Path(__file__).with_name("_durable_proc.py"))


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [ln.split(" ") for ln in self.path.read_text().splitlines() if ln]

    def kinds(self, kind: str, run_id: str | None = None) -> list[list[str]]:
        return [ln for ln in self.lines() if ln[2] == kind and (run_id is None or ln[3] == run_id)]

    def wait(self, pred: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"timed out; log:\n{self.path.read_text()}"
            time.sleep(0.02)


def processes(
    tmp: Path,
) -> contextlib.AbstractContextManager[Callable[..., subprocess.Popen[bytes]]]:
    return _support.processes(PROC, tmp)


def kill9(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait()


async def get_run(url: str, run_id: str) -> gnl.RunInfo | None:
    async with await gnl.connect(url) as st:
        return await gnl.get_run(st, run_id)


def test_two_executors_in_two_processes(store_url: Callable[[], str], tmp_path: Path) -> None:
    url = store_url()
    log = Log(tmp_path / "log")
    with processes(tmp_path) as spawn:
        a = [spawn("exec", url, "crit", "critical", "8") for _ in range(2)]
        b = [spawn("exec", url, "plain", "none", "8") for _ in range(2)]
        time.sleep(1.0)
        (tmp_path / "go").touch()
        for p in a + b:
            assert p.wait(timeout=90) == 0
    for run_id in ("crit", "plain"):
        effects = Counter(ln[4] for ln in log.kinds("E", run_id))
        assert effects == Counter({str(i): 1 for i in range(8)}), f"{run_id}: each effect once"
        ended = log.kinds("R", run_id) + log.kinds("B", run_id)
        assert len(ended) == 2 and len(log.kinds("R", run_id)) >= 1
        results = {" ".join(ln[4:]) for ln in log.kinds("R", run_id)}
        assert len(results) == 1, "one recorded result"
        run = asyncio.run(get_run(url, run_id))
        assert run is not None and run.state == "done"
        assert [s.n for s in run.steps] == list(range(8))


def test_kill_9_mid_run_then_the_waker_resumes_it(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    log = Log(tmp_path / "log")
    (tmp_path / "go").touch()
    with processes(tmp_path) as spawn:
        p = spawn("exec", url, "r", "none", "6", GNL_HOLD="3")
        log.wait(lambda: bool(log.kinds("H", "r")))
        kill9(p)
        stuck = asyncio.run(get_run(url, "r"))
        assert stuck is not None and stuck.state == "running"
        assert [s.n for s in stuck.steps] == [0, 1, 2]
        spawn("waker", url)  # resumes it once its 1.5 s lease has lapsed
        log.wait(lambda: bool(log.kinds("E", "r") and log.kinds("E", "r")[-1][4] == "5"))
    effects = Counter(ln[4] for ln in log.kinds("E", "r"))
    # Completed steps are not repeated; the one in flight at the kill runs again.
    assert effects == Counter({"0": 1, "1": 1, "2": 1, "3": 2, "4": 1, "5": 1})
    run = asyncio.run(get_run(url, "r"))
    assert run is not None and run.state == "done"
    assert run.result == [0, 10, 20, 30, 40, 50]


def test_a_sleep_across_a_restart_resumes_on_time_once_under_two_wakers(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    log = Log(tmp_path / "log")
    with processes(tmp_path) as spawn:
        assert spawn("start", url, "nap", "2500").wait(timeout=60) == 0
        wake_at = int(log.kinds("S", "nap")[0][4])
        spawn("waker", url)
        spawn("waker", url)
        log.wait(lambda: bool(log.kinds("E", "nap")[1:]))
        time.sleep(1.0)  # room for a second (wrong) resume
    after = [ln for ln in log.kinds("E", "nap") if ln[4] == "after"]
    assert len(after) == 1, after
    assert len([ln for ln in log.kinds("E", "nap") if ln[4] == "before"]) == 1
    at = int(after[0][0])
    assert wake_at <= at <= wake_at + 10_000, (wake_at, at)
    run = asyncio.run(get_run(url, "nap"))
    assert run is not None and run.state == "done" and run.result == "woke"


def test_a_reclaimed_job_repeats_no_completed_step_of_its_run(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    log = Log(tmp_path / "log")

    async def enqueue() -> str:
        async with await gnl.connect(url) as st:
            await gnl.enqueue(st, "job", None, id="j")
            job = await gnl.get_job(st, "j")
            assert job is not None
            return job.id

    asyncio.run(enqueue())

    async def job_state() -> gnl.JobInfo | None:
        async with await gnl.connect(url) as st:
            return await gnl.get_job(st, "j")

    with processes(tmp_path) as spawn:
        p = spawn("job", url)
        log.wait(lambda: bool(log.kinds("H")))
        kill9(p)
        spawn("job", url)
        deadline = time.monotonic() + 60
        while True:
            job = asyncio.run(job_state())
            if job is not None and job.state == "done":
                break
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
    run_id = log.kinds("H")[0][3]
    effects = Counter(ln[4] for ln in log.kinds("E", run_id))
    assert effects == Counter({"0": 1, "1": 1, "2": 2, "3": 1, "4": 1})
    assert job.result == [0, 1, 2, 3, 4] and job.attempts == 2


def test_an_at_most_once_step_never_runs_twice_under_100_sigkills(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    url = store_url()
    log = Log(tmp_path / "log")
    rng = random.Random(7)
    kills = 0

    def frontier() -> int:
        """The newest run any process has logged (runs go in order, one process at a time)."""
        return max((int(ln[3].removeprefix("amo-")) for ln in log.lines()), default=0)

    with processes(tmp_path) as spawn:
        while kills < 100:
            seen = len(log.lines())
            # Each process starts at the run the last one was killed in, so it resumes that
            # run first and never runs out of work before it is killed, however fast it is.
            p = spawn("amo", url, str(frontier()), "100000")
            # Kill it while it works: after its first record, a few ms in.
            deadline = time.monotonic() + 30
            while len(log.lines()) == seen:
                assert p.poll() is None, "an amo process exited before it was killed"
                assert time.monotonic() < deadline
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.03))
            kill9(p)
            kills += 1
        # The run after the frontier may hold an intent without a line (killed before ``P``).
        runs = frontier() + 2
        final = spawn("amo", url, "0", str(runs))
        assert final.wait(timeout=300) == 0
    paid = Counter(ln[3] for ln in log.kinds("P"))
    assert paid and max(paid.values()) == 1, "an at-most-once body ran twice"
    unknown = {ln[3] for ln in log.kinds("U")}

    async def states() -> dict[str, str]:
        async with await gnl.connect(url) as st:
            out = {}
            for i in range(runs):
                run = await gnl.get_run(st, f"amo-{i}")
                assert run is not None
                pay = [s for s in run.steps if s.name == "pay"]
                out[run.run_id] = pay[0].state if pay else "none"
            return out

    final_states = asyncio.run(states())
    stuck = {r for r, s in final_states.items() if s == "intent"}
    # Every run left with an intent raised StepOutcomeUnknownError (in the final pass too);
    # every other run finished with its step recorded once.
    assert stuck <= unknown
    assert all(s == "done" for r, s in final_states.items() if r not in stuck)
    print(f"\n{kills} kills, {len(stuck)} runs hit the window, {len(paid)} bodies ran once")
