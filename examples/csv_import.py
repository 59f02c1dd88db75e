"""Import a CSV with gnl, the short way: one job per row, organizations served in turn, each
row written once even if the import is interrupted and run again.

    python examples/csv_import.py [path.csv]     # default: the airports CSV gnl ships

`gnl demo` is the long version of this file (several worker processes, one of which crashes,
a progress bar and a report).
"""

from __future__ import annotations

import asyncio
import csv
import importlib.resources
import sqlite3
import sys
from pathlib import Path
from typing import Any

import gnl

# The data set of `gnl demo`, package data of gnl (python/gnl/demo_data/ in the repository).
DEFAULT_CSV = Path(str(importlib.resources.files("gnl") / "demo_data" / "airports.csv"))


async def main(path: Path) -> None:
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))

    # The side effect lives outside the queue: here, a table in another SQLite file.
    results = sqlite3.connect("csv-import-results.db", isolation_level=None)
    results.execute("CREATE TABLE IF NOT EXISTS airports (job_id TEXT, state TEXT, name TEXT)")

    async def import_row(row: dict[str, Any], ctx: gnl.JobContext) -> None:
        def write() -> int | None:
            cur = results.execute(
                "INSERT INTO airports VALUES (?, ?, ?)", (ctx.job_id, ctx.org_id, row.get("name"))
            )
            return cur.lastrowid

        # Journaled under the job's run_id: a job that runs again (its worker died, or this
        # script is run twice) gets the recorded rowid back instead of inserting again.
        await ctx.step("write", write)

    async with await gnl.connect("sqlite:///csv-import.db") as storage:
        # One call, one transaction. The ids make it idempotent: run the script twice and the
        # second call adds nothing.
        await gnl.enqueue_many(
            storage.work,
            [
                {
                    "type": "import-row",
                    "payload": row,
                    "options": {"id": f"row:{n}", "org_id": row.get("state") or None},
                }
                for n, row in enumerate(rows, start=2)  # line numbers: the header is line 1
            ],
        )
        worker = gnl.create_worker(storage, {"import-row": import_row}, concurrency=8)
        outcome = await worker.drain()
    (written,) = results.execute("SELECT COUNT(*) FROM airports").fetchone()
    print(f"{len(rows):,} rows, {outcome.succeeded:,} jobs run now, {written:,} rows in the table")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CSV))
