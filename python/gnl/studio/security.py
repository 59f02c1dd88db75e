"""Studio's security layer: who is asking (tokens, roles), where from (Host/Origin allowlist),
CSRF on every unsafe method, and the response headers (CSP without inline scripts).

It is one pure ASGI middleware (:class:`Guard`) in front of the app, so no route can forget a
check: a request that fails one never reaches a route.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CSP",
    "Guard",
    "Principal",
    "SAFE_METHODS",
    "Tokens",
    "is_loopback",
]

#: Methods that never change anything; every other method needs a valid CSRF token.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: No inline script or style, no eval, nothing from another origin, no framing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

SESSION_COOKIE = "gnl_studio_session"
TOKEN_COOKIE = "gnl_studio_token"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as.

    Attributes:
        role: ``"admin"`` (reads and acts) or ``"viewer"`` (reads only).
        name: How the audit log names it: ``"local"`` (no tokens configured, loopback only)
            or the role and a fingerprint of its token (never the token).
    """

    role: str
    name: str

    @property
    def can_act(self) -> bool:
        return self.role == "admin"


def _fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:8]


class Tokens:
    """The configured tokens. None configured: every request is the local admin (Studio then
    binds a loopback address only)."""

    def __init__(self, viewer: str | None, admin: str | None) -> None:
        for name, t in (("--token", viewer), ("--admin-token", admin)):
            if t is not None and len(t) < 16:
                raise ValueError(f"{name} must be at least 16 characters")
        if viewer is not None and viewer == admin:
            raise ValueError("--token and --admin-token must differ")
        self.viewer = viewer
        self.admin = admin

    @property
    def required(self) -> bool:
        return self.viewer is not None or self.admin is not None

    def principal(self, token: str | None) -> Principal | None:
        """The principal of ``token`` (None: not a valid token)."""
        if not self.required:
            return Principal("admin", "local")
        if token is None:
            return None
        for role, want in (("admin", self.admin), ("viewer", self.viewer)):
            if want is not None and hmac.compare_digest(token.encode(), want.encode()):
                return Principal(role, f"{role}:{_fingerprint(token)}")
        return None


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return str(v.decode("latin-1"))
    return None


def _cookies(scope: Scope) -> dict[str, str]:
    raw = _header(scope, b"cookie")
    if not raw:
        return {}
    c: SimpleCookie = SimpleCookie()
    try:
        c.load(raw)
    except Exception:
        return {}
    return {k: m.value for k, m in c.items()}


def _host_name(host_header: str) -> tuple[str, str | None]:
    """(name, port) of a Host header value; the name lower-cased, IPv6 in brackets."""
    h = host_header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        name, rest = h[: end + 1], h[end + 1 :]
        return name, rest[1:] if rest.startswith(":") else None
    if ":" in h:
        name, port = h.rsplit(":", 1)
        return name, port
    return h, None


class Guard:
    """The ASGI middleware that checks every request before the app sees it.

    * Host must be one of ``allowed_hosts`` with the server's port (else 421): a page served
      from another name that resolves here (DNS rebinding) is refused.
    * An Origin header, when sent, must be this server's own origin (else 403).
    * With tokens configured, a request needs one (``Authorization: Bearer``, or the cookie
      that ``POST /login`` sets); without one it gets the login page (401).
    * Every method but GET, HEAD and OPTIONS needs the session's CSRF token (form field
      ``csrf`` or header ``X-CSRF-Token``), else 403, unless it carries a valid token in its
      ``Authorization: Bearer`` header (a script: no browser adds that header by itself, so
      no other site can forge it); and a viewer's unsafe request is 403.
    * Every response carries the CSP and the other hardening headers.

    The principal, the session's CSRF token and (for a form POST) the parsed form are put in
    ``scope["state"]``: ``principal``, ``csrf``, ``form``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Tokens,
        allowed_hosts: Iterable[str],
        port: int,
        secret: bytes | None = None,
        login_path: str = "/login",
        public_paths: Iterable[str] = ("/static/",),
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.allowed = {h.lower() for h in allowed_hosts}
        self.port = str(port)
        self.secret = secret or secrets.token_bytes(32)
        self.login_path = login_path
        self.public = tuple(public_paths)

    def csrf_for(self, session: str) -> str:
        return hmac.new(self.secret, session.encode(), hashlib.sha256).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"].upper()
        path: str = scope["path"]
        headers_out: list[tuple[bytes, bytes]] = [
            (b"content-security-policy", CSP.encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            # Not no-referrer: under it Chromium sends "Origin: null" with a form POST,
            # which the Origin check must refuse.
            (b"referrer-policy", b"same-origin"),
            (b"cache-control", b"no-store"),
        ]

        host = _header(scope, b"host")
        name, port = _host_name(host or "")
        if not host or name not in self.allowed or (port or "80") != self.port:
            await _plain(send, 421, "misdirected request: unknown Host", headers_out)
            return
        origin = _header(scope, b"origin")
        if origin is not None:
            o = urlsplit(origin)
            o_name, o_port = _host_name(o.netloc)
            if o.scheme != "http" or o_name not in self.allowed or (o_port or "80") != self.port:
                await _plain(send, 403, "forbidden: foreign Origin", headers_out)
                return

        cookies = _cookies(scope)
        session = cookies.get(SESSION_COOKIE)
        if not session or len(session) != 43:
            session = secrets.token_urlsafe(32)
            headers_out.append(
                (
                    b"set-cookie",
                    f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict".encode(),
                )
            )
        csrf = self.csrf_for(session)

        token = None
        auth = _header(scope, b"authorization")
        by_header = bool(auth and auth.lower().startswith("bearer "))
        if auth is not None and by_header:
            token = auth[7:].strip()
        elif TOKEN_COOKIE in cookies:
            token = cookies[TOKEN_COOKIE]
        principal = self.tokens.principal(token)

        receive, form = await _read_form(scope, receive, method)
        sent_csrf = _header(scope, CSRF_HEADER.encode())
        if sent_csrf is None and form is not None:
            values = form.get(CSRF_FIELD)
            sent_csrf = values[0] if values else None
        # A request that carries a valid token in its Authorization header (a script) cannot be
        # forged by another site: a browser never adds that header on its own. CSRF guards the
        # cookie: a session (or no-token mode) needs the CSRF token on every unsafe method.
        bearer = by_header and principal is not None and self.tokens.required
        if (
            method not in SAFE_METHODS
            and not bearer
            and not (
                sent_csrf is not None and hmac.compare_digest(sent_csrf.encode(), csrf.encode())
            )
        ):
            await _plain(send, 403, "forbidden: missing or wrong CSRF token", headers_out)
            return

        is_public = path.startswith(self.public) or path == self.login_path
        if principal is None and not is_public:
            if method in SAFE_METHODS:
                await _redirect(send, self.login_path, headers_out)
            else:
                await _plain(send, 401, "unauthorized: a token is needed", headers_out)
            return
        if (
            principal is not None
            and not principal.can_act
            and method not in SAFE_METHODS
            and path != self.login_path
        ):
            await _plain(send, 403, "forbidden: this token may only read", headers_out)
            return

        state = scope.setdefault("state", {})
        state["principal"] = principal
        state["csrf"] = csrf
        state["form"] = form

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + headers_out
            await send(message)

        await self.app(scope, receive, send_with_headers)


MAX_FORM_BYTES = 1 << 20


async def _read_form(
    scope: Scope, receive: Receive, method: str
) -> tuple[Receive, dict[str, list[str]] | None]:
    """Read a urlencoded body (at most 1 MiB) for the CSRF check; the app gets it again."""
    if method in SAFE_METHODS:
        return receive, None
    ctype = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
    body = b""
    more = True
    while more:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
        if len(body) > MAX_FORM_BYTES:
            break
    done = False

    async def replay() -> Message:
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    form = None
    if ctype == "application/x-www-form-urlencoded" and len(body) <= MAX_FORM_BYTES:
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return replay, form


async def _plain(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", location.encode()), (b"content-length", b"0"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def form_values(state: Any, name: str) -> list[str]:
    """The values of form field ``name`` of the request the Guard parsed."""
    form = state.get("form") if isinstance(state, dict) else getattr(state, "form", None)
    return list(form.get(name, [])) if form else []
