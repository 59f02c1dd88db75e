"""Studio's runs, triggers and dead-events pages in a real headless Chromium (the set-up of
test_studio_browser.py: Debian's /usr/bin/chromium driven by Playwright), one click-through per
action: resolve a run's step, unschedule a trigger after its confirmation, retry one dead event
and see a running consumer receive it, retry all shown after their count; the XSS strings stay
inert and a viewer is offered no action; a screenshot of each page under the test's temp dir.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gnl
from _studio import ADMIN, VIEWER, start_studio
from test_studio_browser import _shot, chromium, page_of, run  # noqa: F401 (fixtures)
from test_studio_ops import XSS, _fill_ops


def fill(url: str) -> None:
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
            while not self.done.is_set():
                await asyncio.sleep(0.05)
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
    fill(url)
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
    fill(url)
    studio = start_studio(url, tmp_path, "--admin-token", ADMIN)
    try:
        page = page_of(studio, ADMIN)
        page.goto(f"{studio.base}/runs")
        assert page.locator("#runs tbody tr").count() == 50
        _shot(page, tmp_path, "runs")
        page.click("#next")
        page.wait_for_selector("text=End of the listing.")
        assert page.locator("#runs tbody tr").count() == 9
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
    fill(url)
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
