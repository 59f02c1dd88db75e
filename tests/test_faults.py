"""Issue 9: the queue under faults (shared/reviews/queue-review-c57dee9.md).

Each test is the regression test of one finding of the review, run through the public API on
every engine it applies to, with real faults: a second process holding SQLite's write lock or
a row lock on a server, a Postgres role with a 1 ms ``lock_timeout``, a handler that raises
``CancelledError``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import gnl
from gnl import _native

# --------------------------------------------------------------------------------------------
# Finding 1: run ids are injective over (org_id, id)

# Organizations and ids made mostly of the characters the run id format gives a meaning to.
_parts = st.text(alphabet=st.sampled_from(":%3Aa2b5-"), max_size=8) | st.text(max_size=6)


@settings(max_examples=3000, deadline=None)
@given(a=st.tuples(_parts, _parts), other=st.tuples(_parts, _parts), data=st.data())
def test_run_ids_are_injective_over_org_and_id(
    a: tuple[str, str], other: tuple[str, str], data: st.DataObject
) -> None:
    # The empty organization is "no organization" (org_id=None): one scope, not two.
    def run_id(org: str, job_id: str) -> str:
        return _native.job_run_id(org or None, job_id)

    # Besides an unrelated pair, the pairs that spell the same text around a separator:
    # (org, id) re-split anywhere in "org:id" (the collisions a delimited format can have).
    joined = f"{a[0]}:{a[1]}"
    k = data.draw(st.integers(0, len(joined)))
    for b in (other, (joined[:k], joined[k:]), ("", joined), (joined, "")):
        if a != b:
            assert run_id(*a) != run_id(*b), (a, b)
    assert run_id(*a) == run_id(*a)
    assert _native.job_run_id(None, a[1]) == _native.job_run_id("", a[1])


async def test_steps_do_not_cross_from_a_no_org_job_to_an_org_job(storage: gnl.Storage) -> None:
    # The review's reproduction: the no-organization job "acme:inv-1" and acme's job "inv-1".
    await gnl.enqueue(storage, "t", {"who": "tenant acme, invoice 1"}, id="inv-1", org_id="acme")
    await gnl.enqueue(storage, "t", {"who": "no-org job"}, id="acme:inv-1")
    seen: dict[tuple[str | None, str], tuple[str, Any]] = {}

    async def handler(payload: Any, ctx: gnl.JobContext) -> None:
        seen[(ctx.org_id, ctx.job_id)] = (
            ctx.run_id,
            await ctx.step("charge", lambda: payload["who"]),
        )

    await gnl.create_worker(storage, {"t": handler}, concurrency=1).drain()
    assert seen[("acme", "inv-1")][1] == "tenant acme, invoice 1"
    assert seen[(None, "acme:inv-1")][1] == "no-org job"
    assert seen[("acme", "inv-1")][0] != seen[(None, "acme:inv-1")][0]
