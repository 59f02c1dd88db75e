"""gnl Studio: operate a gnl store from a browser (``gnl studio URL``).

Server-rendered pages (Starlette + Jinja2 under uvicorn, htmx vendored in ``static/``), every
read and action through gnl's public API, secure by default (:mod:`gnl.studio.security`).
Installed with the ``studio`` extra: ``pip install gnl[studio]``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

from .app import MAX_BULK, PAGES, NavPage, StudioConfig, create_app
from .audit import default_audit_path
from .security import Tokens, is_loopback

__all__ = [
    "MAX_BULK",
    "PAGES",
    "NavPage",
    "StudioConfig",
    "Tokens",
    "create_app",
    "serve",
]


def serve(
    url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8484,
    tokens: Tokens | None = None,
    show_payloads: bool = False,
    audit_path: str | os.PathLike[str] | None = None,
    allowed_hosts: Iterable[str] = (),
) -> None:
    """Serve Studio for the store at ``url`` until interrupted.

    Raises:
        ValueError: a non-loopback ``host`` without a token.
        OSError: the address cannot be bound (in use, not this machine's).
        GnlError: the store cannot be opened.
    """
    import uvicorn

    tokens = tokens or Tokens(None, None)
    if not is_loopback(host) and not tokens.required:
        raise ValueError(f"refusing to serve Studio on {host} without a token")
    config = StudioConfig(
        url=url,
        host=host,
        port=port,
        tokens=tokens,
        show_payloads=show_payloads,
        audit_path=audit_path or default_audit_path(),
        allowed_hosts=tuple(allowed_hosts),
    )
    # The address is taken here first, so that one in use is an OSError for the caller (gnl
    # studio: one line, exit 1), not uvicorn's log line and its exit code 3.
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="on",
    )
