"""Studio in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright, no
browser download), against a real ``gnl studio`` process and a real store: cancel a running
job and see its handler's signal abort (a real worker process), bulk-retry dead jobs, the XSS
payload stays inert (no dialog fires), a viewer cannot act, htmx refreshes the counts under
the CSP, and a screenshot of each page saved under the test's temp dir. The runs, triggers and
dead-events pages: one click-through per action (resolve a run's step, unschedule a trigger
after its confirmation, retry one dead event and see a running consumer receive it, retry all
shown after their count), a viewer is offered no action, htmx refreshes the dead counts.

Without Chromium or Playwright the tests skip, and FAIL under ``CI=true`` (``make browser``
installs Chromium)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

import gnl
from _studio import ADMIN, VIEWER, Studio, start_studio
from test_studio import XSS, _fill
from test_studio_ops import RUNS, _fill_ops

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HERE = Path(__file__).parent
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end in a thread of its own (Playwright's sync API holds an event
    loop in this one)."""
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def fill(url: str) -> None:
    run(_fill(url))


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the browser tests must run; `make browser`)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        _missing(f"no {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page_of(chromium: Any) -> Iterator[Callable[[Studio, str | None], Any]]:
    """A new page (its own cookies) on a Studio, logged in with ``token`` (None: no login);
    every dialog it opens is recorded in ``page.dialogs``."""
    contexts: list[Any] = []

    def open_page(studio: Studio, token: str | None) -> Any:
        ctx = chromium.new_context(viewport={"width": 1200, "height": 900})
        contexts.append(ctx)
        page = ctx.new_page()
        page.set_default_timeout(15_000)
        page.dialogs = []
        page.console_errors = []

        def on_dialog(d: Any) -> None:
            page.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.on(
            "console", lambda m: page.console_errors.append(m.text) if m.type == "error" else None
        )
        if token is not None:
            page.goto(f"{studio.base}/login")
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            page.wait_for_url(f"{studio.base}/")
        return page

    yield open_page
    for c in contexts:
        c.close()


def _shot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / "screenshots" / f"{name}.png"
    path.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000
    return path


async def _job(url: str, job_id: str, org: str | None) -> gnl.JobInfo | None:
    async with await gnl.connect(url) as st:
        return await gnl.get_job(st.work, job_id, org)


def job_state(url: str, job_id: str, org: str | None) -> str | None:
    j = run(_job(url, job_id, org))
    return None if j is None else j.state


def test_cancel_a_running_job_in_the_page_aborts_its_handlers_signal(
    store_url: Callable[[], str], tmp_path: Path, page_of: Any
) -> None:
    url = store_url()

    async def one() -> None:
        async with await gnl.connect(url) as st:
            await gnl.enqueue(st.work, "job", {"note": XSS}, id="j1", org_id="live")

    run(one())
    out = tmp_path / "worker"
    out.mkdir()
    worker = subprocess.Popen(
        [sys.executable, str(HERE / "_worker_proc.py"), "lease", url, str(out)],
        env={**os.environ, "GNL_TEST_TTL_MS": "600"},
    )
    studio = start_studio(url, tmp_path, "--admin-token", ADMIN)
    try:
        deadline = time.monotonic() + 20
        while not (out / "ready").exists():
            assert worker.poll() is None and time.monotonic() < deadline, "the job never ran"
            time.sleep(0.05)
        page = page_of(studio, ADMIN)
        page.goto(f"{studio.base}/job?org=live&id=j1")
        assert page.inner_text("#state") == "running"
        _shot(page, tmp_path, "job-running")
        page.click("#cancel")
        page.wait_for_selector("#results-title")
        assert "1 done, 0 skipped" in page.inner_text("#results-title")
        assert "its handler's signal is aborted" in page.inner_text("#results")
        _shot(page, tmp_path, "results-cancel")
        assert worker.wait(20) == 0
        assert (out / "why").read_text() == "canceled", "the handler saw its signal abort"
        page.goto(f"{studio.base}/job?org=live&id=j1")
        assert page.inner_text("#state") == "canceled"
        assert not page.dialogs
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        studio.stop()


def test_bulk_retry_of_dead_jobs_shows_the_count_then_retries_them(
    store_url: Callable[[], str], tmp_path: Path, page_of: Any
) -> None:
    url = store_url()
    fill(url)
    studio = start_studio(url, tmp_path, "--admin-token", ADMIN, "--token", VIEWER)
    try:
        page = page_of(studio, ADMIN)
        page.goto(f"{studio.base}/jobs?state=dead")
        assert page.locator("#jobs tbody tr.state-dead").count() == 2
        _shot(page, tmp_path, "jobs-dead")
        page.click("#retry-all")
        page.wait_for_selector("#confirm-title")
        assert page.inner_text("#confirm-title") == "Retry 2 jobs?"
        assert page.locator("#scope tbody tr").count() == 2
        _shot(page, tmp_path, "confirm-retry")
        assert job_state(url, "x1", "bad") == "dead", "the count is shown before any action"
        page.click("#confirm")
        page.wait_for_selector("#results-title")
        assert "2 done, 0 skipped" in page.inner_text("#results-title")
        assert job_state(url, "x1", "bad") == job_state(url, "x2", "bad") == "pending"
        page.goto(f"{studio.base}/audit")
        assert "retry" in page.inner_text("#audit") and "admin:" in page.inner_text("#audit")
        _shot(page, tmp_path, "audit")
        rec = json.loads(studio.audit.read_text().splitlines()[-1])
        assert rec["count"] == 2 and rec["result"] == "ok"
    finally:
        studio.stop()


def test_the_xss_payload_stays_inert_and_htmx_refreshes_the_counts(
    tmp_path: Path, page_of: Any
) -> None:
    url = f"sqlite:///{tmp_path}/xss.db"
    fill(url)
    studio = start_studio(url, tmp_path, "--admin-token", ADMIN)
    try:
        page = page_of(studio, ADMIN)
        for path in ("/", "/jobs", "/jobs?org=bad", "/job?org=bad&id=x1", "/audit"):
            page.goto(studio.base + path)
            page.wait_for_load_state("networkidle")
        page.goto(f"{studio.base}/job?org=bad&id=x1")
        assert XSS in page.inner_text("#last-error"), "shown as text"
        assert XSS in page.inner_text("#payload")
        assert page.locator("#last-error script").count() == 0
        assert page.dialogs == [], "no script of the payload ran"
        # htmx works under the CSP: the overview's counts refresh without a reload.
        page.goto(f"{studio.base}/")
        _shot(page, tmp_path, "overview")
        before = page.inner_text("#total-pending")

        async def more() -> None:
            async with await gnl.connect(url) as st:
                await gnl.enqueue(st.work, "t", {}, id="late", org_id="o0")

        run(more())
        page.wait_for_function(
            "b => document.querySelector('#total-pending').textContent !== b",
            arg=before,
            timeout=15_000,
        )
        assert int(page.inner_text("#total-pending")) == int(before) + 1
        assert page.locator("#chart rect.bar").count() >= 1
        assert not [e for e in page.console_errors if "Content Security Policy" in e]
        assert page.dialogs == []
    finally:
        studio.stop()


def test_a_viewer_cannot_act_in_the_page(tmp_path: Path, page_of: Any) -> None:
    url = f"sqlite:///{tmp_path}/viewer.db"
    fill(url)
    studio = start_studio(url, tmp_path, "--token", VIEWER, "--admin-token", ADMIN)
    try:
        anon = page_of(studio, None)
        anon.goto(f"{studio.base}/jobs")
        assert anon.url == f"{studio.base}/login"
        _shot(anon, tmp_path, "login")
        page = page_of(studio, VIEWER)
        assert "(viewer)" in page.inner_text("#who")
        page.goto(f"{studio.base}/job?org=bad&id=x1")
        assert page.locator("#retry").count() == 0
        assert page.locator("#payload-hidden").count() == 1
        _shot(page, tmp_path, "job-viewer")
        page.goto(f"{studio.base}/jobs?state=dead")
        assert page.locator("#retry-all").count() == 0
        assert page.locator("input[type=checkbox]").count() == 0
        # Even a request forged from the page itself, with its CSRF token, is refused.
        status = page.evaluate(
            """async () => {
                const h = JSON.parse(document.body.getAttribute('hx-headers'));
                const r = await fetch('/jobs/act', {method: 'POST', headers: {
                    'Content-Type': 'application/x-www-form-urlencoded',
                    'X-CSRF-Token': h['X-CSRF-Token']},
                    body: 'action=retry&job=' + encodeURIComponent('["bad","x1"]')});
                return r.status; }"""
        )
        assert status == 403
        assert job_state(url, "x1", "bad") == "dead"
    finally:
        studio.stop()


# -- runs, triggers, dead events -------------------------------------------------------------


def fill_ops(url: str) -> None:
    run(_fill_ops(url))


class RunningConsumer:
    """Consumer (t, c) with a handler that accepts, running in a thread of its own (its own
    event loop) until stopped; ``got`` lists the ids it was handed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.got: list[str] = []
        self.ready = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()
        assert self.ready.wait(20), "the consumer did not start"

    async def _main(self) -> None:
        async def handler(payload: Any, meta: gnl.EventMeta) -> None:
            self.got.append(meta.id)

        async with await gnl.connect(self.url) as st:
            con = gnl.create_consumer(st.work, "t", handler, name="c", poll_ms=50, max_poll_ms=200)
            con.start()
            self.ready.set()
            await asyncio.to_thread(self.done.wait)
            await con.stop()

    def wait_for(self, event_id: str, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while event_id not in self.got:
            assert time.monotonic() < deadline, f"{event_id} was never delivered: {self.got}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(20)


async def _dead(url: str) -> list[str]:
    async with await gnl.connect(url) as st:
        return [d.id for d in await gnl.list_dead_events(st.work, "t", "c")]


def test_retry_dead_events_in_the_page_and_see_a_running_consumer_receive_them(
    store_url: Callable[[], str], tmp_path: Path, page_of: Any
) -> None:
    url = store_url()
    fill_ops(url)
    studio = start_studio(url, tmp_path, "--admin-token", ADMIN)
    consumer = RunningConsumer(url)
    try:
        page = page_of(studio, ADMIN)
        page.goto(f"{studio.base}/dead-events")
        assert page.inner_text("#dead-total") == "3"
        _shot(page, tmp_path, "dead-events")
        page.click("a.dead-link")
        page.wait_for_selector("#dead")
        assert page.locator("#dead tbody td.event-id").all_inner_texts() == ["e0", "e1", "e2"]
        assert XSS in page.locator("pre.event-error").first.inner_text(), "shown as text"
        _shot(page, tmp_path, "dead-consumer")
        assert consumer.got == [], "a quarantined event is not delivered"
        # One: the first row's Retry.
        page.locator("button.retry-one").first.click()
        page.wait_for_selector("#results-title")
        assert "1 done, 0 skipped" in page.inner_text("#results-title")
        consumer.wait_for("e0")
        # All shown: the count first, then the same scope.
        page.click("#back")
        page.wait_for_selector("#retry-all")
        assert page.inner_text("#retry-all") == "Retry all 2 shown…"
        page.click("#retry-all")
        page.wait_for_selector("#confirm-title")
        assert page.inner_text("#confirm-title") == "Retry 2 dead events of t / c?"
        assert page.locator("#scope tbody tr").count() == 2
        _shot(page, tmp_path, "dead-confirm")
        assert run(_dead(url)) == ["e1", "e2"], "the count is shown before any action"
        page.click("#confirm")
        page.wait_for_selector("#results-title")
        assert "2 done, 0 skipped" in page.inner_text("#results-title")
        consumer.wait_for("e1")
        consumer.wait_for("e2")
        assert page.dialogs == []
    finally:
        consumer.stop()
        studio.stop()


def test_resolve_a_step_and_unschedule_a_trigger_in_the_page(
    store_url: Callable[[], str], tmp_path: Path, page_of: Any
) -> None:
    url = store_url()
    fill_ops(url)
    studio = start_studio(url, tmp_path, "--admin-token", ADMIN)
    try:
        page = page_of(studio, ADMIN)
        page.goto(f"{studio.base}/runs")
        assert page.locator("#runs tbody tr").count() == 50
        # The runs no process executes or wakes are marked (RunInfo.stuck).
        stuck = page.locator("#runs span.stuck").all_inner_texts()
        assert sorted(stuck) == ["stuck: lease expired", "stuck: overdue"], stuck
        _shot(page, tmp_path, "runs")
        page.click("#next")
        page.wait_for_selector("text=End of the listing.")
        assert page.locator("#runs tbody tr").count() == RUNS + 4 - 50
        page.goto(f"{studio.base}/runs?state=failed")
        assert XSS in page.inner_text("#runs td.err")
        page.goto(f"{studio.base}/run?id=stuck")
        assert "outcome unknown" in page.inner_text("#steps")
        _shot(page, tmp_path, "run")
        page.fill("input[name=value]", '{"receipt": "by hand"}')
        page.click("button.resolve-value")
        page.wait_for_selector("#results-title")
        assert "1 done, 0 skipped" in page.inner_text("#results-title")
        page.click("#back")
        assert page.locator("tr.step-done").count() == 1
        assert page.locator("button.resolve-value").count() == 0

        page.goto(f"{studio.base}/triggers")
        assert page.locator("#triggers td.trigger-id").all_inner_texts() == ["nightly", "often"]
        _shot(page, tmp_path, "triggers")
        page.locator("#trigger-2 button.unschedule").click()
        page.wait_for_selector("#confirm-title")
        assert page.inner_text("#confirm-title") == "Unschedule trigger often?"
        _shot(page, tmp_path, "trigger-confirm")
        page.click("#confirm")
        page.wait_for_selector("#results-title")
        assert "1 done, 0 skipped" in page.inner_text("#results-title")
        page.goto(f"{studio.base}/triggers")
        assert page.locator("#triggers td.trigger-id").all_inner_texts() == ["nightly"]
        page.goto(f"{studio.base}/audit")
        audit = page.inner_text("#audit")
        assert "resolve_step" in audit and "unschedule" in audit
        assert page.dialogs == []
    finally:
        studio.stop()


def test_the_new_pages_offer_a_viewer_no_action_and_refresh_live(
    tmp_path: Path, page_of: Any
) -> None:
    url = f"sqlite:///{tmp_path}/viewer.db"
    fill_ops(url)
    studio = start_studio(url, tmp_path, "--token", VIEWER, "--admin-token", ADMIN)
    try:
        page = page_of(studio, VIEWER)
        for path in (
            "/runs",
            "/run?id=stuck",
            "/triggers",
            "/dead-events/consumer?topic=t&consumer=c",
        ):
            page.goto(studio.base + path)
            assert page.locator("main form[method=post]").count() == 0, path
            acts = ".retry-one, .unschedule, .resolve-value, .resolve-retry, #retry-all"
            assert page.locator(acts).count() == 0, path
        _shot(page, tmp_path, "dead-consumer-viewer")
        # htmx refreshes the dead-events counts without a reload.
        page.goto(f"{studio.base}/dead-events")
        assert page.inner_text("#dead-total") == "3"

        async def more() -> None:
            async with await gnl.connect(url) as st:
                await gnl.emit(st.work, "t", {"poison": True}, id="e9")

                async def fail(payload: Any, meta: gnl.EventMeta) -> None:
                    raise RuntimeError("again")

                con = gnl.create_consumer(st.work, "t", fail, name="c", max_attempts=1)
                await con.drain()

        run(more())
        page.wait_for_function(
            "() => document.querySelector('#dead-total').textContent === '4'", timeout=15_000
        )
        assert not [e for e in page.console_errors if "Content Security Policy" in e]
        assert page.dialogs == []
    finally:
        studio.stop()
