"""Studio's runs, triggers and dead-events pages over HTTP against a real ``gnl studio`` process
on every engine: listings with cursor pagination, each action (resolve a step, unschedule a
trigger, hand back dead events: one, or all shown after a count) done through the public API
and written to the audit log; roles, CSRF and escaping as on the jobs pages. Also the public
calls those pages read through: ``list_runs(before=...)``, ``list_consumers``,
``list_dead_events(after_seq=..., limit=...)`` and ``redact_url``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gnl
from _studio import ADMIN, VIEWER, Client, Studio, logged_in, start_studio, unescape
from gnl import _native

pytest.importorskip("starlette")

XSS = "<script>alert('xss')</script>"
RUNS = 57  # more than one page of 50


async def _fill_ops(url: str) -> None:
    """Runs (57 done, one failed with an XSS error, one with an unresolved at-most-once step),
    two triggers (never fired), and three dead events of consumer (t, c) and none of (t, ok)."""
    async with await gnl.connect(url) as st:

        async def done(ctx: gnl.WorkflowContext, input: Any) -> Any:
            return await ctx.step("s", lambda: {"n": input})

        async def bad(ctx: gnl.WorkflowContext, input: Any) -> Any:
            raise RuntimeError(XSS)

        g = gnl.create_gnl(st, {"done": done, "bad": bad})
        for i in range(RUNS):
            await g.run_workflow("done", input=i, run_id=f"run-{i:03d}")
        with pytest.raises(RuntimeError):
            await g.run_workflow("bad", input=XSS, run_id="bad-run")
        # An execution recorded an at-most-once step's intent and died before its result.
        native = st._native
        await _native.run_start(native, "stuck", "done", None, None, None, "dead:1:x", None)
        await _native.step_intent(native, "stuck", "pay", 0, 0, 99)
        # A run whose process died (a 3 ms lease never renewed) and a suspended run two
        # minutes past its wake-up with no waker: both are marked stuck on the runs pages.
        now = await st.now_ms()
        await _native.run_start(native, "lapsed", "done", None, None, None, "gone:1:x", 3)
        await _native.run_start(native, "overdue", "done", None, None, None, "gone:1:x", 3)
        assert await _native.run_suspend(native, "overdue", now - 120_000)

        await gnl.schedule_workflow(st, "done", id="nightly", cron="0 3 * * *")
        await gnl.schedule_workflow(st, "done", id="often", every_ms=60_000)

        async def handler(payload: Any, meta: gnl.EventMeta) -> None:
            if payload.get("poison"):
                raise RuntimeError(XSS)

        await gnl.emit_many(
            st.work,
            "t",
            [{"payload": {"poison": True, "note": XSS}, "id": f"e{i}"} for i in range(3)]
            + [{"payload": {}, "id": "fine"}],
        )

        async def accept(payload: Any, meta: gnl.EventMeta) -> None:
            return None

        for name, h in (("c", handler), ("ok", accept)):
            c = gnl.create_consumer(st.work, "t", h, name=name, max_attempts=1, retry_delay_ms=0)
            await c.drain()


def fill_ops(url: str) -> None:
    asyncio.run(_fill_ops(url))


def _ids(pattern: str, text: str) -> list[str]:
    return [unescape(m) for m in re.findall(pattern, text)]


def _audit(studio: Studio) -> list[dict[str, Any]]:
    return [json.loads(x) for x in studio.audit.read_text().splitlines()]


@pytest.fixture
def ops_url(store_url: Callable[[], str]) -> str:
    url = store_url()
    fill_ops(url)
    return url


@pytest.fixture
def studio(ops_url: str, tmp_path: Path) -> Iterator[Studio]:
    s = start_studio(ops_url, tmp_path, "--token", VIEWER, "--admin-token", ADMIN)
    yield s
    s.stop()


def _inert(text: str) -> None:
    assert XSS not in text
    for tag in re.findall(r"<script[^>]*>", text):
        assert 'src="/static/' in tag, tag


def test_the_runs_page_pages_by_cursor_and_shows_steps(studio: Studio) -> None:
    c = Client(studio.port, token=ADMIN)
    seen: list[str] = []
    path = "/runs"
    while True:
        r = c.get(path)
        assert r.status == 200, r.text
        _inert(r.text)
        seen += _ids(r'<a href="/run\?id=[^"]+">([^<]+)</a>', r.text)
        nxt = re.search(r'id="next" href="([^"]+)"', r.text)
        if nxt is None:
            break
        path = unescape(nxt.group(1))
    assert len(seen) == len(set(seen)) == RUNS + 4
    assert seen[-1] == "run-000" and "bad-run" in seen
    failed = c.get("/runs?state=failed")
    assert _ids(r'<a href="/run\?id=[^"]+">([^<]+)</a>', failed.text) == ["bad-run"]
    assert "&lt;script&gt;" in failed.text
    assert c.get("/runs?state=nope").text.count("state must be one of") == 1
    assert "cursor must be a next_cursor" in c.get("/runs?cursor=garbage").text
    # The live-refreshed table answers alone.
    part = c.get("/runs/table?state=failed")
    assert part.text.startswith('<section id="runs-table"') and "bad-run" in part.text
    run = c.get("/run?id=run-001")
    assert run.status == 200 and ">done<" in run.text and "&#34;n&#34;: 1" in run.text
    assert c.get("/run?id=nope").status == 404
    bad = c.get("/run?id=bad-run")
    _inert(bad.text)
    assert "&lt;script&gt;" in bad.text


def test_the_runs_pages_mark_runs_that_no_process_executes_or_wakes(studio: Studio) -> None:
    c = Client(studio.port, token=VIEWER)
    rows = {
        unescape(m.group(1)): m.group(2)
        for m in re.finditer(
            r'<a href="/run\?id=[^"]+">([^<]+)</a></td>\s*<td>[^<]*</td>\s*<td>(.*?)</td>',
            c.get("/runs").text,
        )
    }
    assert "stuck: lease expired" in rows["lapsed"], rows["lapsed"]
    assert "stuck: overdue" in rows["overdue"], rows["overdue"]
    # A run whose execution holds no lease of its own (a job's run: "stuck" here) and the
    # finished ones are not marked.
    assert "stuck:" not in rows["stuck"] + rows["run-056"] + rows["bad-run"]
    assert "stuck: lease expired" in c.get("/run?id=lapsed").text
    assert "stuck:" not in c.get("/run?id=run-001").text


def test_an_admin_resolves_an_intent_step_and_it_is_audited(ops_url: str, studio: Studio) -> None:
    c = Client(studio.port, token=ADMIN)
    page = c.get("/run?id=stuck").text
    assert 'class="resolve-value"' in page and "outcome unknown" in page
    form = [("run_id", "stuck"), ("step", "pay"), ("n", "0"), ("value", '{"receipt": "manual"}')]
    assert c.post("/runs/resolve", [*form[:3], ("value", "{not json")]).status == 400
    r = c.post("/runs/resolve", [*form, ("mode", "value")])
    assert r.status == 200 and "1 done, 0 skipped" in r.text, r.text

    async def step() -> gnl.StepInfo:
        async with await gnl.connect(ops_url) as st:
            run = await gnl.get_run(st, "stuck")
            assert run is not None
            return run.steps[0]

    s = asyncio.run(step())
    assert (s.state, s.result) == ("done", {"receipt": "manual"})
    again = c.post("/runs/resolve", [*form[:3], ("mode", "retry")])
    assert "0 done, 1 skipped" in again.text and "already done" in again.text
    lines = _audit(studio)
    assert [(x["action"], x["result"]) for x in lines] == [
        ("resolve_step", "ok"),
        ("resolve_step", "none"),
    ]
    assert lines[0]["records"][0]["run_id"] == "stuck"
    assert "resolve_step" in c.get("/audit").text


def test_the_triggers_page_shows_each_figure_and_unschedules_after_confirming(
    ops_url: str, studio: Studio
) -> None:
    c = Client(studio.port, token=ADMIN)
    page = c.get("/triggers")
    assert page.status == 200
    assert _ids(r'class="trigger-id">([^<]+)<', page.text) == ["nightly", "often"]
    assert "Triggers by id, 2 shown" in page.text and 'id="next"' not in page.text
    for head in ("fires", "next run", "last slot", "missed", "deferrals", "last deferral"):
        assert f">{head}<" in page.text, head
    assert "<code>0 3 * * *</code>" in page.text and "60,000 ms" in page.text
    assert c.get("/triggers?after=nightly").text.count('class="trigger-id"') == 1
    assert c.get("/triggers/table").text.startswith('<section id="triggers-table"')
    confirm = c.post("/triggers/confirm", [("trigger", "often")])
    assert "Unschedule trigger often?" in confirm.text

    async def ids() -> list[str]:
        async with await gnl.connect(ops_url) as st:
            return [t.id for t in await gnl.list_triggers(st)]

    assert asyncio.run(ids()) == ["nightly", "often"], "confirming changes nothing"
    r = c.post("/triggers/unschedule", [("trigger", "often")])
    assert "1 done, 0 skipped" in r.text
    assert asyncio.run(ids()) == ["nightly"]
    assert "no such trigger" in c.post("/triggers/unschedule", [("trigger", "often")]).text
    assert "No such trigger" in c.post("/triggers/confirm", [("trigger", "often")]).text
    assert [(x["action"], x["result"]) for x in _audit(studio)] == [
        ("unschedule", "ok"),
        ("unschedule", "none"),
    ]


def test_the_triggers_page_pages_by_id(ops_url: str, studio: Studio) -> None:
    ids = sorted(["nightly", "often", *(f"page-{i:03d}" for i in range(55))])

    async def schedule() -> None:
        async with await gnl.connect(ops_url) as st:
            for id in ids[2:]:
                await gnl.schedule_workflow(st, "done", id=id, every_ms=3_600_000)

    asyncio.run(schedule())
    c = Client(studio.port, token=VIEWER)
    first = c.get("/triggers")
    assert _ids(r'class="trigger-id">([^<]+)<', first.text) == ids[:50]
    nxt = re.search(r'id="next" href="([^"]+)"', first.text)
    assert nxt is not None and nxt.group(1) == f"/triggers?after={ids[49]}"
    rest = c.get(nxt.group(1))
    assert _ids(r'class="trigger-id">([^<]+)<', rest.text) == ids[50:]
    assert "End of the listing." in rest.text
    table = c.get(f"/triggers/table?after={ids[49]}").text
    assert _ids(r'class="trigger-id">([^<]+)<', table) == ids[50:]


def test_dead_events_by_consumer_are_retried_one_or_all_shown_after_a_count(
    ops_url: str, studio: Studio
) -> None:
    c = Client(studio.port, token=ADMIN)
    assert re.search(r'id="total-dead-events">3<', c.get("/").text), "at a glance"
    page = c.get("/dead-events")
    assert page.status == 200 and re.search(r'id="dead-total">3<', page.text)
    rows = re.findall(r"<td>t</td>\s*<td>(\w+)</td>\s*<td class=\"num\">(.*?)</td>", page.text)
    assert [(n, "dead-link" in v) for n, v in rows] == [("c", True), ("ok", False)]
    assert c.get("/dead-events/table").text.startswith('<section id="consumers-table"')
    one = c.get("/dead-events/consumer?topic=t&consumer=c")
    _inert(one.text)
    assert _ids(r'class="event-id">([^<]+)<', one.text) == ["e0", "e1", "e2"]
    assert "&lt;script&gt;" in one.text and "&#34;poison&#34;: true" in one.text
    assert 'id="retry-all">Retry all 3 shown' in one.text
    assert c.get("/dead-events/consumer?topic=t&consumer=c&after_seq=x").status == 400

    r = c.post("/dead-events/retry", [("topic", "t"), ("consumer", "c"), ("event", "e0")])
    assert "1 done, 0 skipped" in r.text
    every = [("topic", "t"), ("consumer", "c")] + [("event", f"e{i}") for i in range(3)]
    every.append(("event", "nope"))
    preview = c.post("/dead-events/preview", every)
    assert "Retry 4 dead events of t / c?" in preview.text
    r = c.post("/dead-events/retry", every)
    # e0 waits for its redelivery (handed back: done again, changing nothing); nope is unknown.
    assert "3 done, 1 skipped" in r.text and "no such quarantine record" in r.text

    async def redeliver() -> tuple[list[str], list[gnl.DeadEvent]]:
        got: list[str] = []

        async def healed(payload: Any, meta: gnl.EventMeta) -> None:
            got.append(meta.id)

        async with await gnl.connect(ops_url) as st:
            con = gnl.create_consumer(st.work, "t", healed, name="c", max_attempts=1)
            await con.drain()
            return got, await gnl.list_dead_events(st.work, "t", "c")

    got, left = asyncio.run(redeliver())
    assert sorted(got) == ["e0", "e1", "e2"] and left == []
    assert [(x["action"], x["count"], x["result"]) for x in _audit(studio)] == [
        ("retry_dead_event", 1, "ok"),
        ("retry_dead_event", 4, "partial"),
    ]
    too_many = [("topic", "t"), ("consumer", "c")] + [("event", f"x{i}") for i in range(1001)]
    assert "at most 1,000" in c.post("/dead-events/preview", too_many).text


def test_a_viewer_reads_the_new_pages_and_cannot_act(studio: Studio) -> None:
    viewer = Client(studio.port, token=VIEWER)
    for path in (
        "/runs",
        "/runs/table",
        "/run?id=stuck",
        "/triggers",
        "/triggers/table",
        "/dead-events",
        "/dead-events/table",
        "/dead-events/consumer?topic=t&consumer=c",
    ):
        r = viewer.get(path)
        assert r.status == 200, path
        actions = set(re.findall(r'method="post" action="([^"]+)"', r.text)) - {"/logout"}
        assert not actions, (path, actions)
    assert "&#34;poison&#34;" not in viewer.get("/dead-events/consumer?topic=t&consumer=c").text
    posts: list[tuple[str, list[tuple[str, str]]]] = [
        ("/runs/resolve", [("run_id", "stuck"), ("step", "pay"), ("mode", "retry")]),
        ("/triggers/confirm", [("trigger", "often")]),
        ("/triggers/unschedule", [("trigger", "often")]),
        ("/dead-events/preview", [("topic", "t"), ("consumer", "c"), ("event", "e0")]),
        ("/dead-events/retry", [("topic", "t"), ("consumer", "c"), ("event", "e0")]),
    ]
    admin = logged_in(studio.port, ADMIN)
    for path, form in posts:
        assert viewer.post(path, form).status == 403, path
        assert admin.post(path, form, csrf=False).status == 403, path
    assert not studio.audit.read_text().strip(), "a refused request acts on nothing"
    assert "often" in admin.get("/triggers").text


# -- the public calls the pages read through ---------------------------------------------------


async def test_list_runs_pages_with_before(storage: gnl.Storage) -> None:
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        return input

    g = gnl.create_gnl(storage, {"wf": wf})
    for i in range(7):
        await g.run_workflow("wf", input=i, run_id=f"r{i}")
    everything = [r.run_id for r in await gnl.list_runs(storage, limit=100)]
    walked: list[str] = []
    before: gnl.RunInfo | None = None
    while True:
        page = await gnl.list_runs(storage, limit=3, before=before)
        if not page:
            break
        walked += [r.run_id for r in page]
        before = page[-1]
    assert walked == everything and sorted(walked) == [f"r{i}" for i in range(7)]
    last = (await gnl.list_runs(storage, limit=100))[-1]
    assert await gnl.list_runs(storage, before=(last.created_at, last.run_id)) == []
    with pytest.raises(TypeError):
        await gnl.list_runs(storage, before="r3")  # type: ignore[arg-type]


async def test_scan_runs_reads_a_bounded_window_per_page(storage: gnl.Storage) -> None:
    async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
        if input % 5 == 0:
            raise RuntimeError("five")
        return input

    g = gnl.create_gnl(storage, {"wf": wf})
    for i in range(23):
        try:
            await g.run_workflow("wf", input=i, run_id=f"r{i:02d}")
        except RuntimeError:
            pass
    failed = [r.run_id for r in await gnl.list_runs(storage, state="failed", limit=100)]
    assert len(failed) == 5
    pages: list[list[str]] = []
    cursor = None
    while True:
        page = await gnl.scan_runs(storage, state="failed", limit=2, scan=3, cursor=cursor)
        pages.append([r.run_id for r in page.items])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert [i for p in pages for i in p] == failed
    assert all(len(p) <= 2 for p in pages) and [] in pages, "a window can hold no match"
    none = await gnl.scan_runs(storage, state="suspended", limit=10, scan=10)
    assert none.items == [] and none.next_cursor is not None, "ten examined, more left"
    every = await gnl.scan_runs(storage, limit=50, scan=50)
    assert len(every.items) == 23 and every.next_cursor is None
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.scan_runs(storage, limit=10, scan=5)
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.scan_runs(storage, cursor="nope")
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.scan_runs(storage, state="sleeping")


async def test_list_consumers_and_dead_events_page(storage: gnl.Storage) -> None:
    async def fail(payload: Any, meta: gnl.EventMeta) -> None:
        raise RuntimeError("no")

    await gnl.emit_many(storage.work, "b", [{"payload": i, "id": f"e{i}"} for i in range(5)])
    for topic, name in (("b", "z"), ("b", "a"), ("a", "q")):
        await gnl.emit(storage.work, topic, 0, id="x")
        con = gnl.create_consumer(storage.work, topic, fail, name=name, max_attempts=1)
        await con.drain()
    listed = await gnl.list_consumers(storage.work)
    assert [(c.topic, c.consumer, c.dead) for c in listed] == [
        ("a", "q", 1),
        ("b", "a", 6),
        ("b", "z", 6),
    ]
    assert all(c.heartbeat_at for c in listed)
    nxt = await gnl.list_consumers(storage.work, after=("a", "q"), limit=1)
    assert [(c.topic, c.consumer) for c in nxt] == [("b", "a")]
    seqs: list[int] = []
    after = 0
    while page := await gnl.list_dead_events(storage.work, "b", "a", after_seq=after, limit=4):
        seqs += [d.seq for d in page]
        after = page[-1].seq
    assert seqs == [d.seq for d in await gnl.list_dead_events(storage.work, "b", "a")]
    assert seqs == sorted(seqs) and len(seqs) == 6
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.list_consumers(storage.work, limit=0)
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.list_dead_events(storage.work, "b", "a", limit=0)
    with pytest.raises(TypeError):
        await gnl.list_consumers(storage.work, after="b")  # type: ignore[arg-type]


def test_redact_url_is_public(tmp_path: Path) -> None:
    assert gnl.redact_url("postgres://u:pw@h:5432/db") == "postgres://u:***@h:5432/db"
    assert gnl.redact_url("mysql://u@h/db?password=pw") == "mysql://u@h/db?password=***"
    assert gnl.redact_url("sqlite:///x.db") == "sqlite:///x.db"
    with pytest.raises(TypeError):
        gnl.redact_url(b"x")  # type: ignore[arg-type]

    async def shown() -> str:
        async with await gnl.connect(f"sqlite:///{tmp_path}/r.db") as st:
            return st.redacted_url

    assert asyncio.run(shown()) == f"sqlite:///{tmp_path}/r.db"
