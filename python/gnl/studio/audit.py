"""Studio's audit log: one JSON line per action, appended and fsynced before the response.

The log is a file, not a table in the store (docs/DECISIONS.md, "Studio's audit log"): it
keeps a record of actions even when the store is the thing failing, and needs no schema
change in the three engines. Each record names who acted (the token's role and fingerprint,
never the token), the action, the records it touched, how many, and each record's result.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AuditLog", "AuditRecord", "default_audit_path"]


def default_audit_path() -> Path:
    """``$XDG_STATE_HOME/gnl/studio-audit.jsonl`` (``~/.local/state/gnl/…`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "gnl" / "studio-audit.jsonl"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One action.

    Attributes:
        at: When, epoch ms UTC (this machine's clock).
        who: The principal's name (``admin:1a2b3c4d``, ``local``).
        role: ``admin`` or ``viewer``.
        action: ``retry`` or ``cancel`` (refused attempts are recorded too).
        store: The store URL, password redacted.
        count: How many records the action was asked to touch.
        records: Per record: ``{"org_id", "id", "result", "why"}``; result is ``done`` or
            ``skipped``.
        result: ``ok`` (every record done), ``partial``, ``none`` or ``error: …``.
    """

    at: int
    who: str
    role: str
    action: str
    store: str
    count: int
    records: list[dict[str, Any]]
    result: str


class AuditLog:
    """An append-only JSON Lines file. Thread-safe; each append is flushed and fsynced."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Open once to fail at start-up (not at the first action) when it cannot be written.
        with open(self.path, "a", encoding="utf-8"):
            pass

    def append(self, rec: AuditRecord) -> None:
        line = json.dumps(
            {
                "at": rec.at,
                "who": rec.who,
                "role": rec.role,
                "action": rec.action,
                "store": rec.store,
                "count": rec.count,
                "records": rec.records,
                "result": rec.result,
            },
            ensure_ascii=False,
        )
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def latest(self, limit: int = 100) -> list[AuditRecord]:
        """The ``limit`` latest records, newest first (reads the file's tail only)."""
        lines: deque[str] = deque(maxlen=limit)
        with self._lock, open(self.path, encoding="utf-8") as f:
            size = f.seek(0, os.SEEK_END)
            # A bounded tail: at most 4 MiB, however long the log has grown.
            f.seek(max(0, size - (4 << 20)))
            if f.tell():
                f.readline()
            for line in f:
                if line.strip():
                    lines.append(line)
        out = []
        for line in reversed(lines):
            try:
                d = json.loads(line)
                out.append(AuditRecord(**d))
            except (ValueError, TypeError):
                continue
        return out


def now_ms() -> int:
    return time.time_ns() // 1_000_000
