"""The job state machine (API.md "Queue" job states) against a model, with hypothesis.

Rules: enqueue, claim-and-succeed, claim-and-fail (retried at once, or not within the test),
cancel and retry, over a few (org, id) keys; after every step each job's state and attempts
must match the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import gnl

T = TypeVar("T")

KEYS: list[tuple[str | None, str]] = [
    (None, "a"),
    (None, "b"),
    (None, "c"),
    ("acme", "a"),
    ("acme", "d"),
]
NEVER_MS = 10**9  # a retry delay that is not due again within the test


class Boom(Exception):
    pass


@dataclass
class Model:
    state: str
    attempts: int
    due: bool
    max_attempts: int = 0


class JobMachine(RuleBasedStateMachine):
    url_factory: Callable[[], str]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.storage: gnl.Storage = self.run(gnl.connect(type(self).url_factory()))
        self.model: dict[tuple[str | None, str], Model] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.storage.close())
        finally:
            self.loop.close()

    # -- rules --------------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), payload=st.integers(0, 9))
    def enqueue(self, key: tuple[str | None, str], payload: int) -> None:
        org, job_id = key
        got = self.run(gnl.enqueue(self.storage, "t", payload, id=job_id, org_id=org))
        assert got == job_id
        if key not in self.model:
            self.model[key] = Model("pending", 0, True)

    # The claiming worker's max_attempts decides (JobInfo.max_attempts: set at claim time).
    @rule(max_attempts=st.integers(1, 3))
    def claim_and_succeed(self, max_attempts: int) -> None:
        self.claim_one("succeed", max_attempts)

    @rule(max_attempts=st.integers(1, 3))
    def claim_and_fail_retry_now(self, max_attempts: int) -> None:
        self.claim_one("fail, retry now", max_attempts)

    @rule(max_attempts=st.integers(1, 3))
    def claim_and_fail_retry_later(self, max_attempts: int) -> None:
        self.claim_one("fail, retry later", max_attempts)

    def claim_one(self, outcome: str, max_attempts: int) -> None:
        due = {k for k, m in self.model.items() if m.state == "pending" and m.due}
        if not due:
            result = self.run(self._drain())
            assert result == gnl.DrainResult(0, 0, 0), "claimed a job that is not due"
            return
        key, attempt = self.run(self._claim_one(outcome, max_attempts))
        assert key in due, f"claimed {key}, due were {due}"
        m = self.model[key]
        m.attempts += 1
        m.max_attempts = max_attempts
        assert attempt == m.attempts
        if outcome == "succeed":
            m.state = "done"
        elif m.attempts >= max_attempts:
            m.state = "dead"
        else:
            m.state, m.due = "pending", outcome == "fail, retry now"

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: tuple[str | None, str]) -> None:
        org, job_id = key
        ok = self.run(gnl.cancel_job(self.storage, job_id, org_id=org))
        m = self.model.get(key)
        expected = m is not None and m.state == "pending"
        assert ok is expected
        if m is not None and expected:
            m.state = "canceled"

    @rule(key=st.sampled_from(KEYS))
    def retry(self, key: tuple[str | None, str]) -> None:
        org, job_id = key
        ok = self.run(gnl.retry_job(self.storage, job_id, org_id=org))
        m = self.model.get(key)
        expected = m is not None and m.state == "dead"
        assert ok is expected
        if m is not None and expected:
            m.state, m.attempts, m.due = "pending", 0, True

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def jobs_match_the_model(self) -> None:
        for key in KEYS:
            org, job_id = key
            job = self.run(gnl.get_job(self.storage, job_id, org_id=org))
            m = self.model.get(key)
            if m is None:
                assert job is None
                continue
            assert job is not None
            assert (job.state, job.attempts) == (m.state, m.attempts), key
            assert job.org_id == org and job.id == job_id
            finished = m.state in ("done", "dead", "canceled")
            assert (job.finished_at is not None) == finished, (key, job)
            if m.state == "done":
                assert job.result == "ok"
            if m.attempts:
                assert job.max_attempts == m.max_attempts
            if m.state == "dead" or (m.state == "pending" and m.attempts > 0):
                assert job.last_error is not None and "boom" in job.last_error

    # -- helpers ------------------------------------------------------------------------------

    def _worker(
        self, handler: Any, retry_delay_ms: int = NEVER_MS, max_attempts: int = 3
    ) -> gnl.Worker:
        return gnl.create_worker(
            self.storage,
            {"t": handler},
            max_attempts=max_attempts,
            retry_delay_ms=retry_delay_ms,
            poll_ms=5,
        )

    async def _drain(self) -> gnl.DrainResult:
        async def handler(payload: Any, ctx: gnl.JobContext) -> None:
            return None

        return await self._worker(handler).drain()

    async def _claim_one(
        self, outcome: str, max_attempts: int
    ) -> tuple[tuple[str | None, str], int]:
        """Run a worker until it has claimed one job; stop it before it claims another."""
        claimed: list[tuple[tuple[str | None, str], int]] = []
        started = asyncio.Event()
        gate = asyncio.Event()

        async def handler(payload: Any, ctx: gnl.JobContext) -> str:
            claimed.append(((ctx.org_id, ctx.job_id), ctx.attempt))
            started.set()
            await gate.wait()
            if outcome != "succeed":
                raise Boom("boom")
            return "ok"

        worker = self._worker(
            handler, 0 if outcome == "fail, retry now" else NEVER_MS, max_attempts
        )
        worker.start()
        try:
            await asyncio.wait_for(started.wait(), 10)
        finally:
            stopping = asyncio.ensure_future(worker.stop())
            await asyncio.sleep(0)
            gate.set()
            await stopping
        assert len(claimed) == 1, claimed
        return claimed[0]


def test_job_state_machine(store_url: Callable[[], str]) -> None:
    class Machine(JobMachine):
        url_factory = staticmethod(store_url)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
