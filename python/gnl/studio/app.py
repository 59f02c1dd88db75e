"""Studio's web app: Starlette routes rendering Jinja2 templates, every read and action through
gnl's public API (no SQL here), behind :class:`gnl.studio.security.Guard`.

Pages: overview (counts by state per organization, throughput chart, dead jobs), jobs
(filtered, cursor-paginated listing; detail; retry and cancel, one or in bulk), audit; runs,
triggers and dead events are in :mod:`gnl.studio.pages`. :data:`PAGES` is the navigation.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

import gnl

from . import pages
from .audit import AuditLog, AuditRecord, now_ms
from .security import TOKEN_COOKIE, Guard, Principal, Tokens, form_values

__all__ = ["MAX_BULK", "PAGES", "NavPage", "StudioConfig", "create_app"]

HERE = Path(__file__).parent
STATES = ("pending", "running", "done", "dead", "canceled")
#: The most records one action may touch.
MAX_BULK = 1_000


@dataclass(frozen=True, slots=True)
class NavPage:
    """A page in the navigation bar.

    Attributes:
        path: Its URL path.
        title: Its label.
        available: Whether this gnl has the subsystem the page shows (runs, triggers and dead
            events join when those subsystems exist).
    """

    path: str
    title: str
    available: Callable[[], bool] = lambda: True


#: The navigation: the extension point for the pages of later subsystems. A page whose
#: subsystem does not exist yet is simply not listed (``available`` False).
PAGES: list[NavPage] = [
    NavPage("/", "Overview"),
    NavPage("/jobs", "Jobs"),
    NavPage("/runs", "Runs"),
    NavPage("/triggers", "Triggers"),
    NavPage("/dead-events", "Dead events"),
    NavPage("/audit", "Audit"),
]


@dataclass
class StudioConfig:
    """What ``gnl studio`` was started with.

    Attributes:
        url: The store URL.
        host: The address bound (its name is in the Host allowlist).
        port: The port bound.
        tokens: The viewer and admin tokens (none: loopback only, everyone is admin).
        audit_path: The audit log file.
        show_payloads: Show payloads and results to viewers too (admins always see them).
        allowed_hosts: More Host names to accept (a reverse proxy's public name).
        org_page: Organizations per overview page.
        org_scan: Jobs counted per organization (its latest).
        list_scan: Jobs examined per jobs page.
        timeout_ms: Statement timeout of every read the dashboard makes (counts, listings,
            look-ups: the store is opened with ``read_timeout_ms``), ms.
    """

    url: str
    host: str = "127.0.0.1"
    port: int = 8484
    tokens: Tokens = field(default_factory=lambda: Tokens(None, None))
    audit_path: str | os.PathLike[str] = ""
    show_payloads: bool = False
    allowed_hosts: tuple[str, ...] = ()
    org_page: int = 25
    org_scan: int = 1_000
    list_scan: int = 2_000
    timeout_ms: int = 2_000

    def hosts(self) -> set[str]:
        names = {"127.0.0.1", "localhost", "[::1]", *self.allowed_hosts}
        h = self.host.lower()
        if h not in ("0.0.0.0", "::"):
            names.add(f"[{h}]" if ":" in h else h)
        return {n.lower() for n in names}


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = _when
    env.filters["pretty"] = _pretty
    env.filters["key"] = _key
    env.filters["num"] = lambda n: f"{n:,}"
    return env


def _when(ms: int | None) -> str:
    if ms is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _key(job: gnl.JobInfo) -> str:
    """A job's form value: ``[org_id, id]`` as JSON."""
    return json.dumps([job.org_id, job.id])


def _parse_key(text: str) -> tuple[str | None, str] | None:
    try:
        v = json.loads(text)
    except ValueError:
        return None
    if (
        isinstance(v, list)
        and len(v) == 2
        and (v[0] is None or isinstance(v[0], str))
        and isinstance(v[1], str)
        and v[1]
    ):
        return v[0], v[1]
    return None


def chart(per_minute: list[dict[str, int]], width: int = 600, height: int = 120) -> dict[str, Any]:
    """The throughput chart's geometry: one bar per minute (done, then dead and canceled
    stacked on it), scaled to the busiest minute. Rendered as SVG by the template."""
    n = max(1, len(per_minute))
    totals = [sum(m.values()) for m in per_minute]
    peak = max(totals, default=0) or 1
    bw = width / n
    bars = []
    for i, m in enumerate(per_minute):
        y = float(height)
        for state in ("done", "dead", "canceled"):
            v = m.get(state, 0)
            if not v:
                continue
            h = v / peak * (height - 4)
            y -= h
            bars.append(
                {
                    "x": round(i * bw + 0.5, 1),
                    "y": round(y, 1),
                    "w": round(max(bw - 1, 1), 1),
                    "h": round(h, 1),
                    "state": state,
                    "title": f"{n - i} min ago: {v} {state}",
                }
            )
    return {
        "width": width,
        "height": height,
        "bars": bars,
        "peak": max(totals, default=0),
        "total": sum(totals),
    }


class Studio:
    """The app's state: the config, the open store, the templates, the audit log."""

    def __init__(self, config: StudioConfig) -> None:
        self.config = config
        self.env = _env()
        self.audit = AuditLog(config.audit_path)
        self.storage: gnl.Storage | None = None
        self.schema: int | None = None
        #: The most records one action may touch.
        self.max_bulk = MAX_BULK

    @property
    def store(self) -> gnl.Storage:
        assert self.storage is not None, "the store opens at start-up"
        return self.storage

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        principal: Principal | None = request.state.principal
        body = self.env.get_template(name).render(
            request=request,
            principal=principal,
            csrf=request.state.csrf,
            nav=[p for p in PAGES if p.available()],
            path=request.url.path,
            backend=self.store.backend if self.storage else "",
            store_url=gnl.redact_url(self.config.url),
            schema=self.schema,
            show_payloads=self.show_payloads(principal),
            **ctx,
        )
        return HTMLResponse(body, status_code=status)

    def show_payloads(self, principal: Principal | None) -> bool:
        return principal is not None and (principal.can_act or self.config.show_payloads)

    def record(self, principal: Principal, action: str, records: list[dict[str, Any]]) -> str:
        done = sum(1 for r in records if r["result"] == "done")
        result = "ok" if done == len(records) else ("none" if done == 0 else "partial")
        self.audit.append(
            AuditRecord(
                at=now_ms(),
                who=principal.name,
                role=principal.role,
                action=action,
                store=gnl.redact_url(self.config.url),
                count=len(records),
                records=records,
                result=result,
            )
        )
        return result

    # ---- pages -------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        if request.method == "POST":
            token = (form_values(request.state, "token") or [""])[0]
            if self.config.tokens.principal(token) is None:
                return self.render(request, "login.html", 401, error="That token is not valid.")
            resp = RedirectResponse("/", status_code=303)
            resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/")
            return resp
        return self.render(request, "login.html", error=None)

    async def logout(self, request: Request) -> Response:
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(TOKEN_COOKIE, path="/")
        return resp

    async def _org_page(self, after: str | None) -> dict[str, Any]:
        c = self.config
        orgs = await gnl.list_orgs(self.store.work, limit=c.org_page + 1, after=after)
        more = len(orgs) > c.org_page
        orgs = orgs[: c.org_page]
        counts = await gnl.count_jobs(
            self.store.work, orgs, scan=c.org_scan, timeout_ms=c.timeout_ms
        )
        minutes: list[dict[str, int]] = [{} for _ in range(60)]
        totals = dict.fromkeys(STATES, 0)
        for jc in counts:
            for i, m in enumerate(jc.finished_per_minute):
                for st, n in m.items():
                    minutes[i][st] = minutes[i].get(st, 0) + n
            for st, n in jc.states.items():
                totals[st] = totals.get(st, 0) + n
        last = orgs[-1] if orgs else None
        consumers = await gnl.list_consumers(self.store.work, limit=pages.PER_PAGE + 1)
        return {
            "dead_events": sum(x.dead for x in consumers[: pages.PER_PAGE]),
            "dead_events_more": len(consumers) > pages.PER_PAGE,
            "counts": counts,
            "totals": totals,
            "estimate": any(not jc.complete for jc in counts) or more or after is not None,
            "chart": chart(minutes),
            "after": after,
            "next_after": ("" if last is None else last) if more else None,
            "scan": c.org_scan,
            "states": STATES,
        }

    async def overview(self, request: Request) -> Response:
        after = request.query_params.get("after")
        return self.render(request, "overview.html", **await self._org_page(after))

    async def overview_counts(self, request: Request) -> Response:
        after = request.query_params.get("after")
        return self.render(request, "_counts.html", **await self._org_page(after))

    async def jobs(self, request: Request) -> Response:
        q = request.query_params
        org = q.get("org") or None
        state = q.get("state") or None
        typ = q.get("type") or None
        cursor = q.get("cursor") or None
        error = None
        page: gnl.Page[gnl.JobInfo] = gnl.Page([], None)
        try:
            page = await gnl.scan_jobs(
                self.store.work,
                org_id=org,
                state=state,
                type=typ,
                limit=50,
                scan=self.config.list_scan,
                cursor=cursor,
            )
        except gnl.InvalidArgumentError as e:
            error = str(e)
        return self.render(
            request,
            "jobs.html",
            400 if error else 200,  # a state or cursor the listing refused: said on the page
            page=page,
            org=org or "",
            state=state or "",
            type=typ or "",
            error=error,
            states=STATES,
            scan=self.config.list_scan,
            max_bulk=MAX_BULK,
        )

    async def job(self, request: Request) -> Response:
        q = request.query_params
        org = q.get("org")
        job_id = q.get("id", "")
        try:
            job = await gnl.get_job(self.store.work, job_id, org or None)
        except gnl.InvalidArgumentError:
            job = None  # an empty id, an organization no job can have: no such job
        if job is None:
            return self.render(request, "job.html", 404, job=None, job_id=job_id, org=org)
        return self.render(request, "job.html", job=job, job_id=job_id, org=org)

    async def _act_one(self, action: str, org: str | None, job_id: str) -> dict[str, Any]:
        rec: dict[str, Any] = {"org_id": org, "id": job_id}
        try:
            job = await gnl.get_job(self.store.work, job_id, org)
            if job is None:
                return {**rec, "result": "skipped", "why": "no such job"}
            if action == "retry":
                if job.state != "dead":
                    return {**rec, "result": "skipped", "why": f"it is {job.state}, not dead"}
                ok = await gnl.retry_job(self.store.work, job_id, org)
                return {
                    **rec,
                    "result": "done" if ok else "skipped",
                    "why": ("dead -> pending" if ok else "it was no longer dead"),
                }
            if job.state not in ("pending", "running"):
                return {**rec, "result": "skipped", "why": f"it is already {job.state}"}
            ok = await gnl.cancel_job(self.store.work, job_id, org, reason="canceled in Studio")
            why = (
                "pending -> canceled"
                if job.state == "pending"
                else "running: its handler's signal is aborted"
            )
            return {
                **rec,
                "result": "done" if ok else "skipped",
                "why": (why if ok else "it had finished"),
            }
        except gnl.GnlError as e:
            return {**rec, "result": "skipped", "why": f"error: {e}"}

    def _selected(self, request: Request) -> tuple[str, list[tuple[str | None, str]], str | None]:
        action = (form_values(request.state, "action") or [""])[0]
        keys = []
        for raw in form_values(request.state, "job"):
            k = _parse_key(raw)
            if k is not None and k not in keys:
                keys.append(k)
        if action not in ("retry", "cancel"):
            return action, keys, "unknown action"
        if not keys:
            return action, keys, "no job selected"
        if len(keys) > MAX_BULK:
            return (
                action,
                keys,
                (f"{len(keys):,} jobs selected: one action takes at most {MAX_BULK:,}"),
            )
        return action, keys, None

    async def act(self, request: Request) -> Response:
        """One job, or the fixed list of jobs confirmed on the preview page."""
        action, keys, error = self._selected(request)
        if error:
            return self.render(request, "message.html", 400, message=error)
        records = [await self._act_one(action, org, jid) for org, jid in keys]
        result = self.record(request.state.principal, action, records)
        return self.render(request, "results.html", action=action, records=records, result=result)

    async def preview(self, request: Request) -> Response:
        """A bulk action's scope, shown before anything is done: the count and each job."""
        action, keys, error = self._selected(request)
        if error:
            return self.render(request, "message.html", 400, message=error)
        jobs = []
        for org, jid in keys:
            try:
                job = await gnl.get_job(self.store.work, jid, org)
            except gnl.InvalidArgumentError:
                job = None  # an organization no job can have: shown as no such job
            jobs.append((org, jid, job))
        return self.render(request, "confirm.html", action=action, jobs=jobs, json=json)

    async def audit_page(self, request: Request) -> Response:
        return self.render(request, "audit.html", records=self.audit.latest(200))


def create_app(config: StudioConfig) -> ASGIApp:
    """Studio's ASGI app for ``config``: the routes behind the security Guard.

    The store is opened at start-up (lifespan) and closed at shutdown.
    """
    studio = Studio(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        studio.storage = await gnl.connect(
            config.url, create=False, read_timeout_ms=config.timeout_ms
        )
        studio.schema = await studio.storage.schema_version()
        try:
            yield
        finally:
            await studio.storage.close()

    def route(path: str, fn: Callable[[Request], Awaitable[Response]], methods: list[str]) -> Route:
        return Route(path, fn, methods=methods)

    routes = [
        route("/", studio.overview, ["GET"]),
        route("/overview/counts", studio.overview_counts, ["GET"]),
        route("/jobs", studio.jobs, ["GET"]),
        route("/job", studio.job, ["GET"]),
        route("/jobs/preview", studio.preview, ["POST"]),
        route("/jobs/act", studio.act, ["POST"]),
        *pages.routes(studio),
        route("/audit", studio.audit_page, ["GET"]),
        route("/login", studio.login, ["GET", "POST"]),
        route("/logout", studio.logout, ["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.studio = studio
    guarded = Guard(app, tokens=config.tokens, allowed_hosts=config.hosts(), port=config.port)
    # The Guard wraps the whole app, lifespan included (it passes non-HTTP scopes through).
    return guarded
