"""Studio's pages for durable runs, triggers and dead events (the jobs pages are in
:mod:`gnl.studio.app`). Every read and action goes through gnl's public API
(:func:`gnl.scan_runs`, :func:`gnl.get_run`, :func:`gnl.resolve_step`, :func:`gnl.list_triggers`,
:func:`gnl.get_trigger`, :func:`gnl.unschedule`, :func:`gnl.list_consumers`,
:func:`gnl.list_dead_events`, :func:`gnl.retry_dead_event`); the Guard
(:mod:`gnl.studio.security`) has already checked the CSRF token and the admin role of every
POST that reaches a handler here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import gnl

from .security import form_values

if TYPE_CHECKING:
    from .app import Studio

__all__ = ["PER_PAGE", "RUN_STATES", "routes"]

#: Rows per listing page.
PER_PAGE = 50
RUN_STATES = ("running", "suspended", "done", "failed")


def _form(request: Request, name: str) -> str:
    return (form_values(request.state, name) or [""])[0]


def _parse_pair(text: str) -> tuple[str, str] | None:
    try:
        v = json.loads(text)
    except ValueError:
        return None
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) and x for x in v):
        return v[0], v[1]
    return None


class Pages:
    """The handlers of the runs, triggers and dead-events pages, on a :class:`Studio`."""

    def __init__(self, studio: Studio) -> None:
        self.studio = studio

    @property
    def store(self) -> gnl.Storage:
        return self.studio.store

    def message(self, request: Request, text: str, back: str, status: int = 400) -> Response:
        return self.studio.render(request, "message.html", status, message=text, back=back)

    # ---- runs --------------------------------------------------------------------------

    async def _runs_page(self, request: Request) -> dict[str, Any]:
        q = request.query_params
        state = q.get("state") or None
        workflow = q.get("workflow") or None
        cursor = q.get("cursor") or None
        error = None
        page: gnl.Page[gnl.RunInfo] = gnl.Page([], None)
        try:
            page = await gnl.scan_runs(
                self.store,
                state=state,
                workflow=workflow,
                limit=PER_PAGE,
                scan=self.studio.config.list_scan,
                cursor=cursor,
            )
        except gnl.InvalidArgumentError as e:
            error = str(e)
        return {
            "runs": page.items,
            # The store's time, for the runs no process is executing or waking (RunInfo.stuck).
            "now": await self.store.now_ms(),
            "state": state or "",
            "workflow": workflow or "",
            "cursor": cursor or "",
            "next_cursor": page.next_cursor,
            "states": RUN_STATES,
            "error": error,
            "scan": self.studio.config.list_scan,
        }

    async def runs(self, request: Request) -> Response:
        ctx = await self._runs_page(request)
        return self.studio.render(request, "runs.html", 400 if ctx["error"] else 200, **ctx)

    async def runs_table(self, request: Request) -> Response:
        # 200 even with an error: htmx swaps in 2xx answers only, and the fragment says it.
        return self.studio.render(request, "_runs_table.html", **await self._runs_page(request))

    async def run(self, request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        run = None
        if run_id:
            try:
                run = await gnl.get_run(self.store, run_id)
            except gnl.InvalidArgumentError:
                run = None
        status = 200 if run is not None else 404
        now = await self.store.now_ms()
        return self.studio.render(request, "run.html", status, run=run, run_id=run_id, now=now)

    async def resolve(self, request: Request) -> Response:
        """Resolve an at-most-once step left without result: record a value, or let it run
        again (:func:`gnl.resolve_step`)."""
        run_id, step, mode = (
            _form(request, "run_id"),
            _form(request, "step"),
            _form(request, "mode"),
        )
        back = "/run?" + urlencode({"id": run_id})
        n_text = _form(request, "n") or "0"
        if not n_text.isdigit():
            return self.message(request, "n must be a step number (0 or more)", back)
        n = int(n_text)
        rec: dict[str, Any] = {"run_id": run_id, "step": step, "n": n, "mode": mode}
        kwargs: dict[str, Any]
        if mode == "retry":
            kwargs = {"retry": True}
        elif mode == "value":
            try:
                kwargs = {"value": json.loads(_form(request, "value"))}
            except ValueError as e:
                return self.message(request, f"value must be JSON: {e}", back)
        else:
            return self.message(request, "mode must be value or retry", back)
        try:
            ok = await gnl.resolve_step(self.store, run_id, step, n=n, **kwargs)
            why = (
                ("recorded the value as its result" if mode == "value" else "it will run again")
                if ok
                else "it is not an intent without result (unknown, or already done)"
            )
            rec.update(result="done" if ok else "skipped", why=why)
        except (gnl.GnlError, TypeError) as e:
            rec.update(result="skipped", why=f"error: {e}")
        result = self.studio.record(request.state.principal, "resolve_step", [rec])
        return self.studio.render(
            request,
            "act_results.html",
            title="Resolve step",
            columns=("run_id", "step", "n", "mode"),
            records=[rec],
            result=result,
            back=back,
        )

    # ---- triggers ----------------------------------------------------------------------

    async def _triggers_page(self, request: Request) -> dict[str, Any]:
        after = request.query_params.get("after") or ""
        shown = await gnl.list_triggers(self.store, after=after or None, limit=PER_PAGE + 1)
        more = len(shown) > PER_PAGE
        shown = shown[:PER_PAGE]
        return {
            "triggers": shown,
            "after": after,
            "next_after": shown[-1].id if more else None,
            "per_page": PER_PAGE,
        }

    async def triggers(self, request: Request) -> Response:
        return self.studio.render(request, "triggers.html", **await self._triggers_page(request))

    async def triggers_table(self, request: Request) -> Response:
        return self.studio.render(
            request, "_triggers_table.html", **await self._triggers_page(request)
        )

    async def unschedule_confirm(self, request: Request) -> Response:
        """The confirmation of an unschedule: the trigger as it is now, one button."""
        trigger_id = _form(request, "trigger")
        if not trigger_id:
            return self.message(request, "no trigger selected", "/triggers")
        trigger = await gnl.get_trigger(self.store, trigger_id)
        return self.studio.render(
            request, "trigger_confirm.html", trigger=trigger, trigger_id=trigger_id
        )

    async def unschedule(self, request: Request) -> Response:
        trigger_id = _form(request, "trigger")
        if not trigger_id:
            return self.message(request, "no trigger selected", "/triggers")
        rec: dict[str, Any] = {"trigger": trigger_id}
        try:
            ok = await gnl.unschedule(self.store, trigger_id)
            rec.update(
                result="done" if ok else "skipped",
                why="removed (its runs stay in the journal)" if ok else "no such trigger",
            )
        except gnl.GnlError as e:
            rec.update(result="skipped", why=f"error: {e}")
        result = self.studio.record(request.state.principal, "unschedule", [rec])
        return self.studio.render(
            request,
            "act_results.html",
            title="Unschedule",
            columns=("trigger",),
            records=[rec],
            result=result,
            back="/triggers",
        )

    # ---- dead events -------------------------------------------------------------------

    async def _consumers_page(self, request: Request) -> dict[str, Any]:
        raw = request.query_params.get("after") or ""
        after = _parse_pair(raw) if raw else None
        consumers = await gnl.list_consumers(self.store, after=after, limit=PER_PAGE + 1)
        more = len(consumers) > PER_PAGE
        consumers = consumers[:PER_PAGE]
        last = consumers[-1] if consumers else None
        return {
            "consumers": consumers,
            "after": raw,
            "next_after": (
                json.dumps([last.topic, last.consumer]) if more and last is not None else None
            ),
            "dead_total": sum(c.dead for c in consumers),
        }

    async def dead_events(self, request: Request) -> Response:
        return self.studio.render(
            request, "dead_events.html", **await self._consumers_page(request)
        )

    async def consumers_table(self, request: Request) -> Response:
        return self.studio.render(
            request, "_consumers_table.html", **await self._consumers_page(request)
        )

    async def dead_consumer(self, request: Request) -> Response:
        """One consumer's quarantined events, in log order, a page at a time."""
        q = request.query_params
        topic, consumer = q.get("topic", ""), q.get("consumer", "")
        after_text = q.get("after_seq") or "0"
        error = None
        events: list[gnl.DeadEvent] = []
        if not after_text.isdigit():
            error = "after_seq must be a log position (0 or more)"
        else:
            try:
                events = await gnl.list_dead_events(
                    self.store, topic, consumer, after_seq=int(after_text), limit=PER_PAGE + 1
                )
            except gnl.InvalidArgumentError as e:
                error = str(e)
        more = len(events) > PER_PAGE
        events = events[:PER_PAGE]
        lag = None
        if error is None:
            lag = await gnl.consumer_lag(self.store, topic, consumer)
        return self.studio.render(
            request,
            "dead_consumer.html",
            400 if error else 200,
            topic=topic,
            consumer=consumer,
            events=events,
            lag=lag,
            error=error,
            after_seq=after_text,
            next_after_seq=events[-1].seq if more and events else None,
            max_bulk=self.studio.max_bulk,
        )

    def _dead_selected(self, request: Request) -> tuple[str, str, list[str], str | None]:
        topic, consumer = _form(request, "topic"), _form(request, "consumer")
        ids: list[str] = []
        for i in form_values(request.state, "event"):
            if i and i not in ids:
                ids.append(i)
        if not topic or not consumer:
            return topic, consumer, ids, "no consumer given"
        if not ids:
            return topic, consumer, ids, "no event selected"
        if len(ids) > self.studio.max_bulk:
            return (
                topic,
                consumer,
                ids,
                f"{len(ids):,} events selected: one action takes at most {self.studio.max_bulk:,}",
            )
        return topic, consumer, ids, None

    async def dead_preview(self, request: Request) -> Response:
        """Retrying several: the count and each event, shown before anything is done."""
        topic, consumer, ids, error = self._dead_selected(request)
        if error:
            return self.message(request, error, "/dead-events")
        return self.studio.render(
            request, "dead_confirm.html", topic=topic, consumer=consumer, ids=ids
        )

    async def dead_retry(self, request: Request) -> Response:
        """Hand back one event, or the fixed list confirmed on the preview page."""
        topic, consumer, ids, error = self._dead_selected(request)
        if error:
            return self.message(request, error, "/dead-events")
        records = []
        for event_id in ids:
            rec: dict[str, Any] = {"topic": topic, "consumer": consumer, "id": event_id}
            try:
                ok = await gnl.retry_dead_event(self.store, topic, consumer, event_id)
                rec.update(
                    result="done" if ok else "skipped",
                    why="handed back for redelivery" if ok else "no such quarantine record",
                )
            except gnl.GnlError as e:
                rec.update(result="skipped", why=f"error: {e}")
            records.append(rec)
        result = self.studio.record(request.state.principal, "retry_dead_event", records)
        return self.studio.render(
            request,
            "act_results.html",
            title="Retry dead events",
            columns=("topic", "consumer", "id"),
            records=records,
            result=result,
            back="/dead-events/consumer?" + urlencode({"topic": topic, "consumer": consumer}),
        )


def routes(studio: Studio) -> list[Route]:
    """The routes of the runs, triggers and dead-events pages."""
    p = Pages(studio)
    table: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
        ("/runs", p.runs, ["GET"]),
        ("/runs/table", p.runs_table, ["GET"]),
        ("/run", p.run, ["GET"]),
        ("/runs/resolve", p.resolve, ["POST"]),
        ("/triggers", p.triggers, ["GET"]),
        ("/triggers/table", p.triggers_table, ["GET"]),
        ("/triggers/confirm", p.unschedule_confirm, ["POST"]),
        ("/triggers/unschedule", p.unschedule, ["POST"]),
        ("/dead-events", p.dead_events, ["GET"]),
        ("/dead-events/table", p.consumers_table, ["GET"]),
        ("/dead-events/consumer", p.dead_consumer, ["GET"]),
        ("/dead-events/preview", p.dead_preview, ["POST"]),
        ("/dead-events/retry", p.dead_retry, ["POST"]),
    ]
    return [Route(path, fn, methods=methods) for path, fn, methods in table]
