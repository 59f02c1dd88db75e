"""Studio over HTTP against a real ``gnl studio`` process and a real store: security by default
(bind, tokens and roles, CSRF, Host/Origin allowlist, escaping, CSP, hidden payloads), the
audit log, bulk actions (count first, fixed scope, at most 1,000, per-record results), and the
queue API calls Studio reads through (``list_orgs``, ``count_jobs``, ``scan_jobs``) on every
engine."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gnl
from _studio import (
    ADMIN,
    VIEWER,
    Client,
    Studio,
    free_port,
    job_key,
    logged_in,
    start_studio,
)

pytest.importorskip("starlette")

XSS = "<script>alert('xss')</script>"


async def _fill(url: str) -> None:
    """Jobs in three organizations and none; two dead jobs (one with an XSS error)."""
    async with await gnl.connect(url) as st:
        await gnl.enqueue(st.work, "boom", {"note": XSS}, id="x1", org_id="bad")
        await gnl.enqueue(st.work, "boom", {}, id="x2", org_id="bad")

        async def boom(payload: object, ctx: gnl.JobContext) -> None:
            raise RuntimeError(XSS)

        w = gnl.create_worker(st, {"boom": boom}, ttl_ms=5_000, max_attempts=1)
        await w.drain()
        await gnl.enqueue_many(
            st.work,
            [
                {"type": "t", "payload": {"n": i, "note": XSS}, "options": {"org_id": f"o{i % 3}"}}
                for i in range(30)
            ],
        )
        await gnl.enqueue(st.work, "t", {}, id="free")


def fill(url: str) -> None:
    asyncio.run(_fill(url))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/studio.db"
    fill(url)
    return url


@pytest.fixture
def studio(sqlite_url: str, tmp_path: Path) -> Iterator[Studio]:
    s = start_studio(sqlite_url, tmp_path, "--token", VIEWER, "--admin-token", ADMIN)
    yield s
    s.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gnl", *args], capture_output=True, text=True, timeout=60
    )


def _lan_address() -> str | None:
    """A non-loopback address of this machine, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


# -- binding ---------------------------------------------------------------------------------


def test_a_non_loopback_host_without_a_token_is_refused_in_one_line(sqlite_url: str) -> None:
    for host in ("0.0.0.0", "192.0.2.1", "::"):
        r = _cli("studio", sqlite_url, "--host", host, "--port", str(free_port()))
        assert r.returncode == 2, r
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "without a token" in lines[0], r.stderr


def test_a_host_that_names_no_address_is_said_before_the_token_rule(sqlite_url: str) -> None:
    # `--host 999.1.1.1` asked for a token (it is not loopback), then failed to bind.
    for host in ("999.1.1.1", "no-such-host.invalid"):
        r = _cli("studio", sqlite_url, "--host", host, "--port", str(free_port()))
        assert r.returncode == 2, r
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "is no address to bind" in lines[0], r.stderr
        assert "token" not in lines[0]


def test_a_port_in_use_and_an_audit_log_that_is_a_directory_are_one_line(
    sqlite_url: str, tmp_path: Path
) -> None:
    # A port in use printed uvicorn's log line and exited 3; a directory as the audit log
    # was "cannot serve on ...: Is a directory".
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _cli("studio", sqlite_url, "--port", str(port))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r
    assert lines[0].startswith(f"gnl: cannot serve on 127.0.0.1:{port}") and "in use" in lines[0]
    r = _cli("studio", sqlite_url, "--port", str(free_port()), "--audit-log", str(tmp_path))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "is a directory" in lines[0], r


def test_studio_binds_the_loopback_address_by_default(sqlite_url: str, tmp_path: Path) -> None:
    s = start_studio(sqlite_url, tmp_path)
    try:
        assert Client(s.port).get("/").status == 200
        lan = _lan_address()
        if lan is not None:
            with pytest.raises(OSError), socket.create_connection((lan, s.port), timeout=2):
                pass
    finally:
        s.stop()


# -- tokens and roles ------------------------------------------------------------------------


def test_without_a_token_a_request_gets_the_login_page(studio: Studio) -> None:
    anon = Client(studio.port)
    r = anon.get("/jobs")
    assert r.status == 303 and r.headers["location"] == "/login"
    assert anon.get("/login").status == 200
    assert Client(studio.port, token="not-a-real-token-at-all").get("/").status == 303
    # A POST without a valid token is refused even with the session's CSRF token.
    login = anon.get("/login").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', login)
    assert csrf
    r = anon.request("POST", "/jobs/act", form=[("csrf", csrf.group(1)), ("action", "retry")])
    assert r.status == 401


def test_logging_in_with_a_token_sets_a_session_cookie(studio: Studio) -> None:
    c = Client(studio.port)
    page = c.get("/login").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf
    r = c.request("POST", "/login", form=[("csrf", csrf.group(1)), ("token", "wrong" * 5)])
    assert r.status == 401
    r = c.request("POST", "/login", form=[("csrf", csrf.group(1)), ("token", VIEWER)])
    assert r.status == 303
    r = c.get("/")
    assert r.status == 200 and "(viewer)" in r.text


def test_a_viewer_reads_and_cannot_act_an_admin_acts(studio: Studio) -> None:
    viewer = Client(studio.port, token=VIEWER)
    for path in ("/", "/jobs", "/job?org=bad&id=x1", "/audit", "/overview/counts"):
        assert viewer.get(path).status == 200, path
    page = viewer.get("/job?org=bad&id=x1").text
    assert 'id="retry"' not in page, "a viewer is shown no action"
    form = [("action", "retry"), ("job", job_key("bad", "x1"))]
    for path in ("/jobs/act", "/jobs/preview"):
        r = viewer.post(path, form)
        assert r.status == 403, (path, r.text)
    assert "dead" in viewer.get("/job?org=bad&id=x1").text
    assert not studio.audit.read_text().strip(), "a refused request acts on nothing"

    admin = Client(studio.port, token=ADMIN)
    r = admin.post("/jobs/act", form)
    assert r.status == 200, r.text
    assert "1 done, 0 skipped" in r.text
    assert ">pending<" in admin.get("/job?org=bad&id=x1").text


# -- CSRF, Host and Origin -------------------------------------------------------------------


def test_an_unsafe_request_without_the_csrf_token_is_403(studio: Studio) -> None:
    # A browser's session: its token is in the login cookie, which any site's form would send.
    admin = logged_in(studio.port, ADMIN)
    form = [("action", "retry"), ("job", job_key("bad", "x1"))]
    assert admin.post("/jobs/act", form, csrf=False).status == 403
    assert admin.post("/jobs/act", [("csrf", "0" * 64), *form], csrf=False).status == 403
    # Another session's token is wrong for this one.
    other = logged_in(studio.port, ADMIN)
    theirs = other.csrf()
    assert admin.post("/jobs/act", [("csrf", theirs), *form], csrf=False).status == 403
    # Every method but GET/HEAD/OPTIONS is checked, not a list of methods.
    for method in ("PUT", "DELETE", "PATCH", "PROPFIND"):
        assert admin.request(method, "/jobs/act", form=form).status == 403, method
    assert "dead" in admin.get("/job?org=bad&id=x1").text
    # The header form of the token works (htmx sends it).
    r = admin.request("POST", "/jobs/act", form=form, headers={"X-CSRF-Token": admin.csrf()})
    assert r.status == 200 and "1 done" in r.text


def test_a_script_with_a_bearer_token_needs_no_csrf_token(studio: Studio) -> None:
    form = [("action", "retry"), ("job", job_key("bad", "x1"))]
    # A wrong bearer token is no exemption, and a viewer's may still only read.
    assert Client(studio.port, token="x" * 20).post("/jobs/act", form, csrf=False).status == 403
    assert Client(studio.port, token=VIEWER).post("/jobs/act", form, csrf=False).status == 403
    assert "dead" in Client(studio.port, token=ADMIN).get("/job?org=bad&id=x1").text
    # An admin's token in the Authorization header: no browser sends that header by itself.
    r = Client(studio.port, token=ADMIN).post("/jobs/act", form, csrf=False)
    assert r.status == 200 and "1 done" in r.text, (r.status, r.text)
    assert ">pending<" in Client(studio.port, token=ADMIN).get("/job?org=bad&id=x1").text
    assert "retry" in studio.audit.read_text()


def test_a_foreign_host_or_origin_is_refused(studio: Studio) -> None:
    admin = Client(studio.port, token=ADMIN)
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1.
    for host in ("evil.example", f"evil.example:{studio.port}", "127.0.0.1:1", ""):
        r = admin.get("/", headers={"Host": host})
        assert r.status == 421, host
    r = admin.post(
        "/jobs/act",
        [("action", "retry"), ("job", job_key("bad", "x1"))],
        headers={"Origin": "http://evil.example"},
    )
    assert r.status == 403
    assert admin.get("/", headers={"Origin": "null"}).status == 403
    ok = admin.get("/", headers={"Origin": f"http://127.0.0.1:{studio.port}"})
    assert ok.status == 200
    assert admin.get("/", headers={"Host": f"localhost:{studio.port}"}).status == 200


# -- escaping, CSP, payloads -------------------------------------------------------------------


def test_user_strings_render_inert_under_a_csp_without_inline_scripts(studio: Studio) -> None:
    admin = Client(studio.port, token=ADMIN)
    for path in ("/", "/jobs?org=bad", "/job?org=bad&id=x1", "/jobs?org=" + XSS, "/audit"):
        r = admin.get(path)
        assert r.status == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "unsafe-eval" not in csp and "frame-ancestors 'none'" in csp
        assert XSS not in r.text, path
        for tag in re.findall(r"<script[^>]*>", r.text):
            assert 'src="/static/' in tag, (path, tag)
        assert " style=" not in r.text and "<style" not in r.text
    page = admin.get("/job?org=bad&id=x1").text
    assert "&lt;script&gt;" in page, "the error and payload are shown, escaped"


def test_payloads_are_hidden_from_viewers_unless_shown(
    sqlite_url: str, studio: Studio, tmp_path: Path
) -> None:
    viewer = Client(studio.port, token=VIEWER)
    page = viewer.get("/job?org=o1&id=" + _some_id(sqlite_url, "o1")).text
    assert 'id="payload-hidden"' in page and "&#34;note&#34;" not in page
    admin = Client(studio.port, token=ADMIN).get("/job?org=o1&id=" + _some_id(sqlite_url, "o1"))
    assert 'id="payload"' in admin.text and "&#34;note&#34;" in admin.text
    shown = start_studio(sqlite_url, tmp_path, "--token", VIEWER, "--show-payloads")
    try:
        page = Client(shown.port, token=VIEWER).get("/job?org=o1&id=" + _some_id(sqlite_url, "o1"))
        assert 'id="payload"' in page.text
    finally:
        shown.stop()


def _some_id(url: str, org: str) -> str:
    async def go() -> str:
        async with await gnl.connect(url) as st:
            return (await gnl.list_jobs(st.work, org_id=org, limit=1)).items[0].id

    return asyncio.run(go())


# -- actions: audit, bulk ------------------------------------------------------------------------


def test_a_listing_refuses_an_unknown_state_or_a_garbled_cursor(studio: Studio) -> None:
    c = Client(studio.port, token=ADMIN)
    for path, said in (
        ("/jobs?state=bogus", "state must be one of"),
        ("/jobs?cursor=garbage", "cursor is not a cursor"),
        ("/runs?state=bogus", "state must be one of"),
        ("/runs?cursor=garbage", "cursor must be"),
    ):
        page = c.get(path)
        assert page.status == 400, path
        assert said in page.text, path
    assert c.get("/jobs?state=dead").status == 200


def test_a_bulk_action_shows_its_count_acts_on_that_scope_and_is_audited(
    sqlite_url: str, studio: Studio
) -> None:
    admin = Client(studio.port, token=ADMIN)
    page = admin.get("/jobs?state=dead")
    keys = re.findall(r'name="job" value="([^"]+)"', page.text)
    keys = sorted({json.dumps(json.loads(k.replace("&#34;", '"'))) for k in keys})
    assert len(keys) == 2
    scope = [("action", "retry")] + [("job", k) for k in keys]
    # A pending job added to the form is part of the scope: shown, then skipped with a reason.
    scope.append(("job", job_key("o0", _some_id(sqlite_url, "o0"))))
    preview = admin.post("/jobs/preview", scope)
    assert preview.status == 200
    assert "Retry 3 jobs?" in preview.text
    assert "dead" in admin.get("/job?org=bad&id=x2").text, "the preview changes nothing"
    # A key whose organization no job can have (a forged form): no such job, not a 500.
    odd = admin.post("/jobs/preview", [("action", "retry"), ("job", job_key("a\nb", "x1"))])
    assert odd.status == 200, odd.text
    r = admin.post("/jobs/act", scope)
    assert "2 done, 1 skipped" in r.text
    assert "it is pending, not dead" in r.text
    # Again: both are pending now, so both are skipped.
    r = admin.post("/jobs/act", scope)
    assert "0 done, 3 skipped" in r.text

    lines = [json.loads(x) for x in studio.audit.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["who"].startswith("admin:") and ADMIN not in first["who"]
    assert first["action"] == "retry" and first["count"] == 3 and first["result"] == "partial"
    assert [r["result"] for r in first["records"]].count("done") == 2
    assert lines[1]["result"] == "none"
    audit = admin.get("/audit").text
    assert audit.count("retry") >= 2 and "partial" in audit

    # Cancel one pending job: done; again: skipped (already canceled).
    one = [("action", "cancel"), ("job", job_key("bad", "x2"))]
    assert "1 done" in admin.post("/jobs/act", one).text
    assert "it is already canceled" in admin.post("/jobs/act", one).text


def test_a_bulk_action_takes_at_most_1000_records(studio: Studio) -> None:
    admin = Client(studio.port, token=ADMIN)
    many = [("action", "cancel")] + [("job", job_key("o1", f"id{i}")) for i in range(1001)]
    for path in ("/jobs/preview", "/jobs/act"):
        r = admin.post(path, many)
        assert r.status == 400 and "at most 1,000" in r.text, path
    assert not studio.audit.read_text().strip()
    r = admin.post("/jobs/act", many[:1001])
    assert r.status == 200 and "0 done, 1000 skipped" in r.text and "no such job" in r.text


# -- the pages on every engine, and the queue calls they read through -----------------------------


def test_every_page_renders_on_every_engine(store_url: Callable[[], str], tmp_path: Path) -> None:
    url = store_url()
    fill(url)
    s = start_studio(url, tmp_path)
    try:
        c = Client(s.port)
        over = c.get("/")
        assert over.status == 200
        assert re.search(r'id="total-dead">2<', over.text), over.text
        assert "(no organization)" in over.text and ">o2<" in over.text
        jobs = c.get("/jobs?state=dead")
        assert jobs.text.count('class="state-dead"') == 2
        assert c.get("/job?org=bad&id=x1").status == 200
        assert c.get("/job?id=free").status == 200
        assert c.get("/job?id=nope").status == 404
        # No id, or an organization no job can have: no such job (get_job refuses both).
        assert c.get("/job?id=").status == 404
        assert c.get("/job").status == 404
        assert c.get("/job?org=a%0Ab&id=x1").status == 404
        assert c.get("/audit").status == 200
    finally:
        s.stop()


async def test_list_orgs_count_jobs_and_scan_jobs(storage: gnl.Storage) -> None:
    await gnl.enqueue_many(
        storage.work,
        [
            {"type": "a" if i % 2 else "b", "payload": i, "options": {"org_id": f"o{i % 4}"}}
            for i in range(40)
        ],
    )
    await gnl.enqueue(storage.work, "a", None, id="lone")
    assert await gnl.list_orgs(storage.work) == [None, "o0", "o1", "o2", "o3"]
    assert await gnl.list_orgs(storage.work, limit=2, after="") == ["o0", "o1"]
    counts = await gnl.count_jobs(storage.work, ["o1", None, "nobody"], scan=5)
    assert [c.org_id for c in counts] == ["o1", None, "nobody"]
    assert counts[0].states == {"pending": 5} and not counts[0].complete
    assert counts[1].states == {"pending": 1} and counts[1].complete
    assert counts[2].scanned == 0 and counts[2].complete
    assert len(counts[0].finished_per_minute) == 60
    seen: list[str] = []
    cursor = None
    while True:
        page = await gnl.scan_jobs(storage.work, type="a", limit=3, scan=7, cursor=cursor)
        assert len(page.items) <= 3
        seen += [f"{j.org_id}/{j.id}" for j in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == len(set(seen)) == 21
    lane = await gnl.scan_jobs(storage.work, org_id="o1", limit=100)
    assert len(lane.items) == 10 and lane.next_cursor is None
    none = await gnl.scan_jobs(storage.work, org_id="", limit=100)
    assert [j.id for j in none.items] == ["lone"]
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.scan_jobs(storage.work, state="nope")
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.scan_jobs(storage.work, limit=10, scan=5)
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.scan_jobs(storage.work, type="b", cursor=page.next_cursor or "gnl1.x")
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.count_jobs(storage.work, ["o1"], scan=0)
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.count_jobs(storage.work, [None] * 1001)
    with pytest.raises(gnl.InvalidArgumentError):
        await gnl.list_orgs(storage.work, limit=0)
