"""The misfire plan (``rust/src/misfire.rs``, through ``gnl._native.misfire_plan``) against a
small, obviously correct reference model: list every occurrence due at the poll, then apply
the policy as API.md "Scheduler" words it.

A poll at ``now`` finds due every occurrence from the stored slot up to ``now``. An occurrence
is missed when the same poll also finds a later one due, or finds it more than
``misfire_grace_ms`` late. No missed one: the due one fires. Otherwise ``latest`` fires the last
once, ``earliest`` the oldest once, ``none`` none, ``catchup`` every one, oldest first, one per
poll; then the schedule goes on from the first occurrence after now. ``max_catchup=n`` keeps
the n latest. Cron occurrences in the model come from cronsim, not from gnl.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import cronsim
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnl import _native

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
MIN = 60_000
START = 1_767_225_600_000  # 2026-01-01T00:00Z
POLICIES = ["latest", "earliest", "none", "catchup"]
CRONS = ["* * * * *", "*/5 * * * *", "0 * * * *", "15,45 9-17 * * 1-5", "0 0 * * *", "7 */3 * * *"]

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Grid:
    kind: str  # "cron", "every" or "at"
    spec: str | int
    anchor: int = 0

    def next_after(self, t: int) -> int | None:
        """The first occurrence strictly after ``t`` (None for a one-shot)."""
        if self.kind == "at":
            return None
        if self.kind == "every":
            assert isinstance(self.spec, int)
            k = max(0, (t - self.anchor) // self.spec)
            return self.anchor + (k + 1) * self.spec
        assert isinstance(self.spec, str)
        d = next(cronsim.CronSim(self.spec, EPOCH + dt.timedelta(milliseconds=t)))
        return (d - EPOCH) // dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class Plan:
    due: int
    fire: int | None
    dropped: int
    skipped: int
    oldest_skipped: int | None
    next_slot: int | None


def reference(
    grid: Grid, slot: int, now: int, grace: int, policy: str, max_catchup: int | None
) -> Plan:
    """List every due occurrence, then apply the policy."""
    if slot > now:
        return Plan(0, None, 0, 0, None, slot)
    if grid.kind == "at":  # a one-shot fires when due, however late
        return Plan(1, slot, 0, 0, None, None)
    due = [slot]
    while (n := grid.next_after(due[-1])) is not None and n <= now:
        due.append(n)
    after_now = grid.next_after(now)
    missed = [o for i, o in enumerate(due) if i < len(due) - 1 or now - o > grace]
    k = len(due)
    if not missed:
        return Plan(k, due[0], 0, 0, None, after_now)
    if policy == "latest":
        return Plan(k, due[-1], k - 1, 0, None, after_now)
    if policy == "earliest":
        return Plan(k, due[0], k - 1, 0, None, after_now)
    if policy == "none":
        return Plan(k, None, k, 0, None, after_now)
    kept = due[-max_catchup:] if max_catchup else due
    skipped = due[: k - len(kept)]
    return Plan(
        k,
        kept[0],
        len(skipped),
        len(skipped),
        skipped[0] if skipped else None,
        kept[1] if len(kept) > 1 else after_now,
    )


def plan(grid: Grid, slot: int, now: int, grace: int, policy: str, max_catchup: int | None) -> Plan:
    p = _native.misfire_plan(
        grid.kind, grid.spec, grid.anchor, slot, now, grace, policy, max_catchup
    )
    return Plan(p.due, p.fire, p.dropped, p.skipped, p.oldest_skipped, p.next_slot)


@st.composite
def grids(draw: st.DrawFn) -> Grid:
    kind = draw(st.sampled_from(["cron", "cron", "every", "at"]))
    if kind == "cron":
        return Grid("cron", draw(st.sampled_from(CRONS)))
    if kind == "every":
        every = draw(st.sampled_from([1, 7, 1_000, 60_000, 90_001, 3_600_000]))
        return Grid("every", every, START + draw(st.integers(-(10**6), 10**6)))
    return Grid("at", START + draw(st.integers(0, 10**8)))


def first_slot(grid: Grid) -> int:
    """The first occurrence after registration (the grid's anchor, or START)."""
    if grid.kind == "at":
        assert isinstance(grid.spec, int)
        return grid.spec
    n = grid.next_after(grid.anchor if grid.kind == "every" else START)
    assert n is not None
    return n


@st.composite
def poll_times(draw: st.DrawFn, grid: Grid, slot: int) -> int:
    """An instant some (0 to 60) occurrences after ``slot``, anywhere in the gap to the next."""
    t = slot
    for _ in range(draw(st.integers(0, 60))):
        n = grid.next_after(t)
        if n is None:
            break
        t = n
    gap = (grid.next_after(t) or t + 10 * MIN) - t
    return t + draw(st.integers(-1, max(gap - 1, 0)))


graces = st.sampled_from([0, 1, 1_000, 30_000, 60_000, 3_600_000])
catchups = st.one_of(st.none(), st.integers(1, 12))


@SETTINGS
@given(data=st.data(), grid=grids(), policy=st.sampled_from(POLICIES), grace=graces)
def test_one_poll_matches_the_model(
    data: st.DataObject, grid: Grid, policy: str, grace: int
) -> None:
    slot = first_slot(grid)
    now = data.draw(poll_times(grid, slot))
    max_catchup = data.draw(catchups) if policy == "catchup" else None
    assert plan(grid, slot, now, grace, policy, max_catchup) == reference(
        grid, slot, now, grace, policy, max_catchup
    )


@SETTINGS
@given(
    data=st.data(),
    grid=grids(),
    policy=st.sampled_from(POLICIES),
    grace=graces,
    max_catchup=catchups,
)
def test_a_run_of_polls_matches_the_model(
    data: st.DataObject, grid: Grid, policy: str, grace: int, max_catchup: int | None
) -> None:
    """Polls at increasing instants, the state carried from plan to plan as a store would."""
    if policy != "catchup":
        max_catchup = None
    slot: int | None = first_slot(grid)
    now = slot - 1
    fired: list[int] = []
    dropped = 0
    for _ in range(data.draw(st.integers(1, 8))):
        if slot is None:
            break
        now = max(now, data.draw(poll_times(grid, slot)))
        got = plan(grid, slot, now, grace, policy, max_catchup)
        assert got == reference(grid, slot, now, grace, policy, max_catchup)
        if got.fire is not None:
            assert not fired or got.fire > fired[-1], "fires go forward, each slot once"
            fired.append(got.fire)
        dropped += got.dropped
        assert got.next_slot is None or got.next_slot > (
            got.fire if got.fire is not None else slot - 1
        )
        slot = got.next_slot
    if grid.kind != "at" and slot is not None:
        # Every occurrence from the first to the last one handled was fired or dropped.
        handled: list[int] = []
        o: int | None = first_slot(grid)
        while o is not None and o < slot:
            handled.append(o)
            o = grid.next_after(o)
        assert len(fired) + dropped == len(handled)
        assert set(fired) <= set(handled)


@SETTINGS
@given(grid=grids(), grace=graces, max_catchup=catchups, polls=st.integers(1, 80))
def test_catchup_fires_every_occurrence_oldest_first_one_per_poll(
    grid: Grid, grace: int, max_catchup: int | None, polls: int
) -> None:
    """Asleep for 40 occurrences, then polled repeatedly at the same instant."""
    if grid.kind == "at":
        return
    first = first_slot(grid)
    occ = [first]
    while len(occ) < 40:
        n = grid.next_after(occ[-1])
        assert n is not None
        occ.append(n)
    now = occ[-1]
    slot: int | None = first
    fired = []
    for _ in range(polls):
        assert slot is not None
        p = plan(grid, slot, now, grace, "catchup", max_catchup)
        if p.fire is None:
            break
        fired.append(p.fire)
        slot = p.next_slot
        if slot is not None and slot > now:
            break
    want = occ[-max_catchup:] if max_catchup else occ
    assert fired == want[: len(fired)]
    assert len(fired) == min(polls, len(want))


def test_a_day_asleep_on_a_minute_cron_counts_without_listing() -> None:
    grid = Grid("cron", "* * * * *")
    now = START + 1440 * MIN + 30_000
    latest = plan(grid, START + MIN, now, 60_000, "latest", None)
    assert latest == Plan(1440, START + 1440 * MIN, 1439, 0, None, START + 1441 * MIN)
    none = plan(grid, START + MIN, now, 60_000, "none", None)
    assert (none.fire, none.dropped) == (None, 1440)
    capped = plan(grid, START + MIN, now, 60_000, "catchup", 10)
    assert (capped.skipped, capped.oldest_skipped) == (1430, START + MIN)
    assert capped.fire == START + 1431 * MIN


def test_years_asleep_stay_bounded() -> None:
    # 100 years of minutes (52.6 million occurrences) and of every_ms=1 (3.2e12): counted.
    grid = Grid("cron", "* * * * *")
    now = START + 36_525 * 1440 * MIN
    p = plan(grid, START + MIN, now, 0, "catchup", 1_000_000)
    assert p.due == 36_525 * 1440
    assert p.skipped == p.due - 1_000_000
    assert p.fire == now - 999_999 * MIN
    every = Grid("every", 1, START)
    p = plan(every, START + 1, now, 0, "latest", None)
    assert (p.due, p.fire, p.next_slot) == (now - START, now, now + 1)


def test_the_max_catchup_warning() -> None:
    p = plan(
        Grid("cron", "0 3 * * *"),
        START + 3 * 3_600_000,
        START + 30 * 86_400_000,
        60_000,
        "catchup",
        10,
    )
    assert (p.skipped, p.oldest_skipped) == (20, START + 3 * 3_600_000)
    assert p.oldest_skipped is not None
    text = _native.max_catchup_warning("nightly", 10, p.skipped, p.oldest_skipped)
    assert text == (
        'trigger "nightly": max_catchup=10 skipped 20 missed occurrences, '
        "the oldest at 2026-01-01T03:00:00Z"
    )
    oldest = text.rsplit(" ", 1)[1]
    assert dt.datetime.fromisoformat(oldest.replace("Z", "+00:00")) == dt.datetime(
        2026, 1, 1, 3, tzinfo=UTC
    )
    assert _native.max_catchup_warning("t", 1, 1, START + 1).endswith(
        "skipped 1 missed occurrence, the oldest at 2026-01-01T00:00:00.001Z"
    )


@pytest.mark.parametrize(
    ("args", "exc"),
    [
        (("cron", "* * * * * *", 0, 0, 0, 0, "latest", None), ValueError),
        (("every", 0, 0, 0, 0, 0, "latest", None), ValueError),
        (("every", 5, 0, 0, 0, -1, "latest", None), ValueError),
        (("every", 5, 0, 0, 0, 0, "skip", None), ValueError),
        (("every", 5, 0, 0, 0, 0, "catchup", 0), ValueError),
        (("hourly", 5, 0, 0, 0, 0, "latest", None), TypeError),
        (("every", "5", 0, 0, 0, 0, "latest", None), TypeError),
    ],
)
def test_bad_arguments(args: tuple[object, ...], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        _native.misfire_plan(*args)  # type: ignore[arg-type]
