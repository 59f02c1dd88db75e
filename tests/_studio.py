"""Helpers of Studio's tests: a real ``gnl studio`` process on a free port, and a small HTTP
client (urllib, cookies kept) that can send any Host or Origin header."""

from __future__ import annotations

import html
import http.client
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlencode

VIEWER = "viewer-token-0123456789"
ADMIN = "admin-token-0123456789ab"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Studio:
    """A running ``gnl studio`` process."""

    proc: subprocess.Popen[bytes]
    port: int
    audit: Path
    log: Path
    out: IO[bytes]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()


def start_studio(url: str, tmp: Path, *args: str, port: int | None = None) -> Studio:
    """Start ``gnl studio URL ARGS`` and wait until it answers (30 s at most)."""
    port = port or free_port()
    audit = tmp / f"audit-{port}.jsonl"
    log = tmp / f"studio-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "gnl",
        "studio",
        url,
        "--port",
        str(port),
        "--audit-log",
        str(audit),
        *args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = open(log, "wb")  # noqa: SIM115 (the process owns it)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out.close()
            raise AssertionError(f"gnl studio exited {proc.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return Studio(proc, port, audit, log, out)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    out.close()
    raise AssertionError(f"gnl studio did not start: {log.read_text()}")


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    text: str


@dataclass
class Client:
    """An HTTP client of one Studio with its own cookies (one browser session)."""

    port: int
    token: str | None = None
    cookies: dict[str, str] = field(default_factory=dict)

    def request(
        self,
        method: str,
        path: str,
        form: list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        h = {"Host": f"127.0.0.1:{self.port}"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if self.cookies:
            h["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form).encode()
            h["Content-Type"] = "application/x-www-form-urlencoded"
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        text = r.read().decode()
        for k, v in r.getheaders():
            if k.lower() == "set-cookie":
                name, _, rest = v.partition("=")
                value = rest.split(";", 1)[0]
                if value and "Max-Age=0" not in v:
                    self.cookies[name] = value
                else:
                    self.cookies.pop(name, None)
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        conn.close()
        return Response(r.status, hdrs, text)

    def get(self, path: str, **kw: object) -> Response:
        return self.request("GET", path, **kw)  # type: ignore[arg-type]

    def csrf(self) -> str:
        """The session's CSRF token (from a page's form)."""
        page = self.get("/audit")
        m = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text) or re.search(
            r'"X-CSRF-Token": "([0-9a-f]+)"', page.text
        )
        assert m, page.text
        return m.group(1)

    def post(
        self, path: str, form: list[tuple[str, str]], csrf: bool = True, **kw: object
    ) -> Response:
        if csrf:
            form = [("csrf", self.csrf()), *form]
        return self.request("POST", path, form=form, **kw)  # type: ignore[arg-type]


def logged_in(port: int, token: str) -> Client:
    """A browser-like session: logged in through the login page (the token in a cookie, no
    Authorization header), so its unsafe requests need the CSRF token."""
    c = Client(port)
    page = c.get("/login").text
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert m, page
    r = c.request("POST", "/login", form=[("csrf", m.group(1)), ("token", token)])
    assert r.status == 303, (r.status, r.text)
    return c


def job_key(org: str | None, job_id: str) -> str:
    import json

    return json.dumps([org, job_id])


def unescape(text: str) -> str:
    return html.unescape(text)
