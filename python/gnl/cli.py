"""The ``gnl`` command line (API.md "Command line and Studio").

``gnl upgrade URL`` · ``gnl demo`` · ``gnl run MODULE:ATTR`` · ``gnl studio URL`` ·
``gnl jobs list|show|retry|cancel`` · ``gnl runs list|show|resolve`` · ``gnl events dead|retry``
· ``gnl triggers list|unschedule`` · ``gnl cron EXPR``. Every command that reads a store takes
``--url`` or the ``GNL_URL`` environment variable, and ``--json`` for scripts. An error prints
one line on stderr; exit code 2 for bad usage (a bad option or argument, a URL gnl does not
accept), 1 for an operation that failed (a store that cannot be reached, an outdated schema, an
unknown id, a job that is not dead).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import gnl

from . import _native

__all__ = ["cli", "main"]

T = TypeVar("T")

STATES = ("pending", "running", "done", "dead", "canceled")
RUN_STATES = ("running", "suspended", "done", "failed")

_url_option = click.option(
    "--url",
    envvar="GNL_URL",
    metavar="URL",
    help="The store: sqlite:///path.db, postgres://…, mysql://… (or set GNL_URL).",
)
_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the outcome as one JSON object (for scripts)."
)


def _ex(*lines: str) -> str:
    """A command's epilog: its examples, kept as written by ``--help``."""
    return "\b\nExamples:\n" + "\n".join(f"  {ln}" for ln in lines)


def _nonempty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An id, name, organization or type: an empty one is bad usage (exit 2), as gnl's API
    refuses it (None: the option was not given)."""
    if value == "":
        raise click.BadParameter("must be a non-empty string")
    return value


_org_option = click.option(
    "--org",
    "org",
    metavar="ORG",
    default=None,
    callback=_nonempty,
    help="The job's organization (default: none).",
)


class CliError(Exception):
    """A problem to report in one line (exit code 2)."""


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"gnl: {' '.join(message.split())}", err=True)
    sys.exit(code)


def _fail_error(e: BaseException) -> NoReturn:
    """gnl's errors: a bad argument (InvalidArgumentError, TypeError) is bad usage (exit 2);
    any other failure of the operation exits 1."""
    bad_usage = isinstance(e, (gnl.InvalidArgumentError, TypeError, CliError))
    _fail(
        f"{type(e).__name__}: {e}" if not isinstance(e, CliError) else str(e), 2 if bad_usage else 1
    )


def _run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run one command's coroutine; an error becomes one line on stderr (see the module)."""

    async def runner() -> T:
        return await coro_fn()

    try:
        return asyncio.run(runner())
    except (CliError, gnl.GnlError, TypeError) as e:
        _fail_error(e)
    except KeyboardInterrupt:
        _fail("interrupted", 130)


def _need_url(url: str | None) -> str:
    if not url:
        raise click.UsageError("no store given: pass --url URL or set GNL_URL")
    return url


#: The in-memory SQLite URLs (`store/url.rs`).
_MEMORY_URLS = ("sqlite::memory:", "sqlite://:memory:", "sqlite:///:memory:")


def _sqlite_file(url: str) -> str | None:
    if url in _MEMORY_URLS or not url.startswith("sqlite://"):
        return None
    rest = url[len("sqlite://") :]
    if "?" in rest:
        return None  # refused by the open, for every command in one wording
    return rest[1:] if rest.startswith("/") else rest


def _nonempty_url_arg(url_arg: str | None) -> None:
    """A URL argument given empty is a mistake (an unset shell variable), not a request for
    GNL_URL's store."""
    if url_arg is not None and not url_arg.strip():
        raise click.UsageError("URL is empty")


def _not_memory(target: str) -> str:
    """An in-memory SQLite store lives in one process: a command can neither see another
    process's nor leave one behind (upgrade would create one and drop it)."""
    if target in _MEMORY_URLS:
        raise click.UsageError(
            f"{target} is a store of one process, gone when it exits: this command cannot "
            "see another's; give a file (sqlite:///jobs.db) or a server"
        )
    return target


def _need_store(url: str | None) -> str:
    """The URL of an existing store (commands other than upgrade and demo never create one).
    A SQLite file whose directory is missing is left to the open, which refuses it for every
    command in one wording (InvalidArgumentError: bad usage, exit 2)."""
    target = _not_memory(_need_url(url))
    path = _sqlite_file(target)
    folder = os.path.dirname(path) if path else ""
    if path and not os.path.exists(path) and (not folder or os.path.isdir(folder)):
        _fail(f"no SQLite store at {path!r} (from {target}); create it with gnl upgrade", 1)
    return target


async def _open(url: str) -> gnl.Storage:
    return await gnl.connect(url, max_connections=2, create=False)


def _when(ms: int | None) -> str:
    if ms is None:
        return "—"
    try:
        dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms"  # outside the years 1-9999 (written by an older release)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _cell_time(ms: int | None) -> str:
    """A time in a table cell: ISO-8601 to the second, with a space for the ``T`` (RFC 3339
    allows it), so a narrow column wraps it between the date and the time (``_print_table``
    keeps time columns that wide); ``show`` and ``--json`` give the milliseconds."""
    if ms is None:
        return "—"
    return _when(ms)[:19].replace("T", " ") + "Z"


def _attempts(job: gnl.JobInfo, of: str = "/") -> str:
    """Attempts made ``of`` the limit; before the first claim just ``0``: the limit is the
    claiming worker's ``max_attempts`` (written at claim time), not yet known."""
    return f"{job.attempts}{of}{job.max_attempts}" if job.attempts else "0"


def _job_dict(job: gnl.JobInfo) -> dict[str, Any]:
    return asdict(job)


def _print_json(value: Any, *, indent: int | None = None) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=indent))


#: A time column's narrowest width in a table: its date (``2026-12-03``) on one line, its
#: time (``12:53:30Z``) on the next.
_TIME_WIDTH = len("2026-12-03")
#: A folding column's narrowest width when a table must fit a narrow terminal.
_FOLD_MIN = 4


def _table(*columns: str, wrap: Sequence[str] = (), times: Sequence[str] = ()) -> Table:
    """A table whose ``wrap`` columns (ids, errors) fold onto more lines in a narrow terminal
    instead of being cut, and whose ``times`` columns (``_cell_time``) wrap between date and
    time only (``_print_table``); the others keep one line."""
    table = Table(header_style="bold")
    for col in columns:
        if col in times:
            table.add_column(col, overflow="fold", min_width=_TIME_WIDTH)
        elif col in wrap:
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, no_wrap=True)
    return table


def _print_table(console: Console, table: Table) -> None:
    """Print ``table`` within the terminal's width. When its cells do not fit on one line each,
    the folding columns get the room the one-line columns leave, time columns first their
    date's width, then the narrowest folding column one more character at a time (rich alone
    shares the room evenly, which folds a time inside its date, and crops the table's right
    edge when a column's minimum width does not fit). A terminal too narrow even for that is
    left to rich (every column folds)."""
    cols = table.columns
    room = console.width - (3 * len(cols) + 1)  # each column's padding and border, and the last

    def natural(col: Any) -> int:
        cells = [col.header, *col.cells]
        return max(console.measure(c).maximum for c in cells)

    want = [natural(c) for c in cols]
    if sum(want) > room:
        fold = [i for i, c in enumerate(cols) if not c.no_wrap]
        fixed = sum(want[i] for i, c in enumerate(cols) if c.no_wrap)
        width = {i: min(want[i], cols[i].min_width or _FOLD_MIN) for i in fold}
        if fixed + sum(width.values()) <= room:
            spare = room - fixed - sum(width.values())
            while spare > 0:
                short = [i for i in fold if width[i] < want[i]]
                if not short:
                    break
                width[min(short, key=lambda i: width[i])] += 1
                spare -= 1
            for i in fold:
                cols[i].width = width[i]
        else:
            for i in fold:
                cols[i].min_width = None
    console.print(table)


#: Characters of a payload or result that ``gnl jobs show`` prints in its table (the terminal
#: table lays a long text out slowly: a 50 MB payload took minutes); ``--json`` prints it whole.
_SHOW_MAX = 20_000


def _capped(text: str) -> str:
    if len(text) <= _SHOW_MAX:
        return text
    rest = len(text) - _SHOW_MAX
    return f"{text[:_SHOW_MAX]}\n… {rest:,} more characters (--json prints it whole)"


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


# -- the group ------------------------------------------------------------------------------------


# click >= 8.2 raises this for a group called without a command (8.1 printed the help itself).
_NO_ARGS_IS_HELP: type[click.UsageError] | None = getattr(
    click.exceptions, "NoArgsIsHelpError", None
)


class _OneLineErrors(click.Group):
    """The ``gnl`` group: click's usage errors are one line on stderr too (exit code 2),
    naming the command's ``--help``.

    A reader that closes its end of stdout early (``gnl jobs list --json | head -1``) ends the
    command with exit code 0 and no message, as the table output does (rich's console): the
    reader took what it wanted, and a listing changes nothing (docs/DECISIONS.md). Click alone
    exits 1 then."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # Python would meet the closed pipe again when it flushes stdout at exit: stdout
            # goes to /dev/null first (the recipe of Python's signal module documentation).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise click.exceptions.Exit(0) from None

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            return super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            if _NO_ARGS_IS_HELP is not None and isinstance(e, _NO_ARGS_IS_HELP) and e.ctx:
                # A group called without its command (``gnl``, ``gnl jobs``): its help, as
                # ``--help`` prints it, on stderr, exit 2.
                click.echo(e.ctx.get_help(), err=True)
                sys.exit(2)
            msg = e.format_message().rstrip(".")
            if e.ctx is not None:
                # "Did you mean 'list'?" keeps its question mark; the hint is a sentence after it.
                sep = " See" if msg.endswith("?") else "; see"
                msg += f"{sep} {e.ctx.command_path} --help"
            _fail(msg, 2)
        except click.Abort:
            _fail("interrupted", 130)
        except click.ClickException as e:
            _fail(e.format_message(), e.exit_code)


@click.group(
    cls=_OneLineErrors,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=_ex(
        "export GNL_URL=sqlite:///jobs.db",
        "gnl upgrade",
        "gnl run myapp.tasks:app",
        "gnl jobs list --all --state dead",
    ),
)
@click.version_option(gnl.__version__, prog_name="gnl")
def cli() -> None:
    """gnl: durable background work — a job queue, a cron scheduler and an event log on
    SQLite, Postgres or MySQL."""


# -- upgrade --------------------------------------------------------------------------------------


@cli.command(
    epilog=_ex("gnl upgrade sqlite:///jobs.db", "GNL_URL=postgres://app@db/app gnl upgrade --json")
)
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
@_json_option
def upgrade(url_arg: str | None, url: str | None, as_json: bool) -> None:
    """Create the store at URL, or bring it to the current schema (idempotent)."""
    _nonempty_url_arg(url_arg)
    given = click.get_current_context().get_parameter_source("url")
    if url_arg is not None and given is click.core.ParameterSource.COMMANDLINE and url_arg != url:
        # (GNL_URL is a default: the argument overrides it.)
        raise click.UsageError("URL and --url name two stores; give one")
    target = _not_memory(_need_url(url_arg or url))
    version = _run(lambda: gnl.upgrade(target))
    if as_json:
        _print_json({"url": _native.redact_url(target), "schema_version": version})
        return
    click.echo(f"{_native.redact_url(target)}: schema version {version}")


# -- demo -----------------------------------------------------------------------------------------


@cli.command(epilog=_ex("gnl demo", "gnl demo --url postgres://postgres@127.0.0.1/test --no-crash"))
@_url_option
@click.option(
    "--csv",
    "csv_path",
    metavar="PATH",
    type=click.Path(dir_okay=False),
    help="The CSV to import (default: the packaged gnl/demo_data/airports.csv).",
)
@click.option(
    "--workers", default=4, show_default=True, type=click.IntRange(1, 64), help="Worker processes."
)
@click.option(
    "--concurrency",
    default=8,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Handlers per worker.",
)
@click.option(
    "--org-column",
    metavar="NAME",
    help="The column that names each row's organization (default: 'state' if present, else the "
    "first column with 2 to 500 distinct values that repeat).",
)
@click.option(
    "--id-column", metavar="NAME", help="The column of unique job ids (default: row:<line>)."
)
@click.option("--no-crash", is_flag=True, help="Do not crash a worker mid-run.")
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the demo's store and results file from an earlier run instead of starting fresh.",
)
@click.option(
    "--ttl-ms", default=1_500, show_default=True, type=click.IntRange(3), help="Worker lease."
)
@click.option(
    "--work-ms",
    default=20.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Simulated I/O per row, in ms (0.5x to 1.5x at random).",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=300.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Give up (and fail) after this many seconds.",
)
def demo(
    url: str | None,
    csv_path: str | None,
    workers: int,
    concurrency: int,
    org_column: str | None,
    id_column: str | None,
    no_crash: bool,
    keep: bool,
    ttl_ms: int,
    work_ms: float,
    timeout_s: float,
) -> None:
    """Import a CSV with several worker processes, crash one mid-run, and check that every row
    was written exactly once.

    Default store: sqlite:///gnl-demo.db in the working directory, replaced on each run unless
    --keep (a store given with --url or GNL_URL is never deleted). The rows go to the
    demo_results table of <store>-results.db next to a SQLite store (gnl-demo-results.db in the
    working directory otherwise), which is replaced unless --keep. Exit code 0 only if every
    row was imported exactly once.
    """
    from .demo import DemoError, DemoOptions, run_demo

    opts = DemoOptions(
        url=url,
        csv=csv_path,
        workers=workers,
        concurrency=concurrency,
        org_column=org_column,
        id_column=id_column,
        crash=not no_crash,
        keep=keep,
        ttl_ms=ttl_ms,
        work_ms=work_ms,
        timeout_s=timeout_s,
    )
    try:
        code = run_demo(opts, Console())
    except DemoError as e:
        _fail(str(e))
    except gnl.GnlError as e:
        _fail(f"{type(e).__name__}: {e}")
    except TypeError as e:
        _fail(f"TypeError: {e}")
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    sys.exit(code)


# -- jobs -----------------------------------------------------------------------------------------


@cli.group(epilog=_ex("gnl jobs list --all --state dead", "gnl jobs retry JOB_ID"))
def jobs() -> None:
    """List, show, retry and cancel jobs."""


@jobs.command(
    "list",
    epilog=_ex(
        "gnl jobs list --url sqlite:///jobs.db --org acme",
        "gnl jobs list --all --state dead --json",
    ),
)
@_url_option
@_org_option
@click.option("--state", type=click.Choice(STATES), help="Only jobs in this state.")
@click.option("--type", "job_type", metavar="T", callback=_nonempty, help="Only jobs of this type.")
@click.option("--all", "all_orgs", is_flag=True, help="Every organization's jobs (not with --org).")
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(1, 10_000), help="Jobs to show."
)
@click.option(
    "--cursor", metavar="C", help="Continue a listing (the cursor a previous page printed)."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def jobs_list(
    url: str | None,
    org: str | None,
    state: str | None,
    job_type: str | None,
    all_orgs: bool,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List jobs: one organization's lane (--org; without it, the jobs that have no
    organization), in enqueue order; or every job on the store (--all): the jobs without
    organization, then each organization's in name order, each in enqueue order."""
    if all_orgs and org is not None:
        raise click.UsageError("--all lists every organization; it does not go with --org")
    filtered = all_orgs and (state is not None or job_type is not None)
    target = _need_store(url)

    def wanted(job: gnl.JobInfo) -> bool:
        return (state is None or job.state == state) and (job_type is None or job.type == job_type)

    async def go() -> tuple[list[gnl.JobInfo], str | None]:
        async with await _open(target) as storage:
            if not all_orgs:
                page = await gnl.list_jobs(
                    storage.work, org_id=org, state=state, type=job_type, limit=limit, cursor=cursor
                )
                return page.items, page.next_cursor
            if not filtered:
                page = await gnl.list_all_jobs(storage.work, limit=limit, cursor=cursor)
                return page.items, page.next_cursor
            # list_all_jobs has no filters: read its pages and keep the matching jobs. A page
            # that holds more matches than are still wanted is read again, cut just after the
            # last one wanted, so its cursor continues right there (--cursor).
            shown: list[gnl.JobInfo] = []
            cur = cursor
            while True:
                page = await gnl.list_all_jobs(storage.work, limit=1_000, cursor=cur)
                hits = [i for i, job in enumerate(page.items) if wanted(job)]
                room = limit - len(shown)
                if len(hits) > room:
                    page = await gnl.list_all_jobs(
                        storage.work, limit=hits[room - 1] + 1, cursor=cur
                    )
                    hits = [i for i, job in enumerate(page.items) if wanted(job)]
                shown.extend(page.items[i] for i in hits)
                cur = page.next_cursor
                if cur is None or len(shown) >= limit:
                    return shown, cur

    items, next_cursor = _run(go)
    if as_json:
        for job in items:
            click.echo(json.dumps(_job_dict(job), ensure_ascii=False))
        # stdout stays JSON lines; how to see more goes to stderr, where a script can read it.
        if next_cursor is not None:
            click.echo(f"more jobs: add --cursor {next_cursor}", err=True)
        return
    console = Console()
    if not items:
        where = "on the store" if all_orgs else f"in org {org!r}" if org else "without organization"
        hint = "" if all_orgs or org else " (--org ORG lists an organization's, --all every job)"
        console.print(
            f"no jobs {where}" + (" matching the filters" if state or job_type else "") + hint,
            soft_wrap=True,
        )
        return
    table = _table(
        "org",
        "id",
        "type",
        "state",
        "att",
        "run at (UTC)",
        "updated (UTC)",
        "error",
        wrap=("org", "id", "type", "error"),
        times=("run at (UTC)", "updated (UTC)"),
    )
    for job in items:
        table.add_row(
            escape(job.org_id or "—"),
            escape(job.id),
            escape(job.type),
            job.state,
            _attempts(job),
            _cell_time(job.run_at),
            _cell_time(job.updated_at),
            escape(_short(job.last_error)),
        )
    _print_table(console, table)
    if next_cursor is not None:
        console.print(f"more jobs: add --cursor {escape(next_cursor)}", soft_wrap=True)


@jobs.command("show", epilog=_ex("gnl jobs show order-42 --org acme --json"))
@click.argument("job_id", metavar="ID", callback=_nonempty)
@_url_option
@_org_option
@click.option("--json", "as_json", is_flag=True, help="Print the job as one JSON object.")
def jobs_show(job_id: str, url: str | None, org: str | None, as_json: bool) -> None:
    """Show one job (its payload, result and last error)."""
    target = _need_store(url)

    async def go() -> gnl.JobInfo | None:
        async with await _open(target) as storage:
            return await gnl.get_job(storage.work, job_id, org)

    job = _run(go)
    if job is None:
        _fail(f"no job {job_id!r} " + (f"in org {org!r}" if org else _NO_ORG_HINT), 1)
    if as_json:
        click.echo(json.dumps(_job_dict(job), ensure_ascii=False))
        return
    console = Console()
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("id", job.id),
        ("org", job.org_id or "— (none)"),
        ("type", job.type),
        ("state", job.state),
        ("attempts", _attempts(job, " of ")),
        ("created", _when(job.created_at)),
        ("run at", _when(job.run_at)),
        ("updated", _when(job.updated_at)),
        ("finished", _when(job.finished_at)),
        ("last error", job.last_error or "—"),
        ("payload", _capped(json.dumps(job.payload, ensure_ascii=False, indent=2))),
        (
            "result",
            "—"
            if job.result is None
            else _capped(json.dumps(job.result, ensure_ascii=False, indent=2)),
        ),
    ]
    for k, v in rows:
        table.add_row(k, escape(v))
    console.print(table)


# A job id is looked up in one organization: without --org, in the jobs that have none.
_NO_ORG_HINT = "without organization (give --org ORG if it has one)"


async def _explain(storage: gnl.Storage, job_id: str, org: str | None, why: str) -> str:
    """Why a retry or cancel changed nothing: the job is missing (said alone), or its state
    and ``why`` (what the command needs of it)."""
    job = await gnl.get_job(storage.work, job_id, org)
    where = f"in org {org!r}" if org else "without organization"
    if job is None:
        return f"no job {job_id!r} " + (where if org else _NO_ORG_HINT)
    return f"job {job_id!r} {where} is {job.state}; {why}, nothing changed"


@jobs.command("retry", epilog=_ex("gnl jobs retry order-42 --org acme"))
@click.argument("job_id", metavar="ID", callback=_nonempty)
@_url_option
@_org_option
@_json_option
def jobs_retry(job_id: str, url: str | None, org: str | None, as_json: bool) -> None:
    """Send a dead job back to pending (attempts reset to 0)."""
    target = _need_store(url)

    async def go() -> tuple[bool, str]:
        async with await _open(target) as storage:
            if await gnl.retry_job(storage.work, job_id, org):
                return True, ""
            return False, await _explain(storage, job_id, org, "only a dead job can be retried")

    ok, why = _run(go)
    if not ok:
        _fail(why, 1)
    if as_json:
        _print_json({"id": job_id, "org_id": org, "state": "pending"})
        return
    click.echo(f"job {job_id!r} is pending again")


@jobs.command("cancel", epilog=_ex('gnl jobs cancel order-42 --org acme --reason "duplicate"'))
@click.argument("job_id", metavar="ID", callback=_nonempty)
@_url_option
@_org_option
@click.option(
    "--reason",
    metavar="R",
    callback=_nonempty,
    help="Recorded as the job's last error (canceled: R). Default: cancel_job was called.",
)
@_json_option
def jobs_cancel(
    job_id: str, url: str | None, org: str | None, reason: str | None, as_json: bool
) -> None:
    """Cancel a pending job at once, or a running one when its handler returns."""
    target = _need_store(url)

    async def go() -> tuple[bool, str]:
        async with await _open(target) as storage:
            before = await gnl.get_job(storage.work, job_id, org)
            if await gnl.cancel_job(storage.work, job_id, org, reason):
                state = before.state if before is not None else "pending"
                return True, state
            why = "only a pending or running job can be canceled"
            return False, await _explain(storage, job_id, org, why)

    ok, info = _run(go)
    if not ok:
        _fail(info, 1)
    if as_json:
        _print_json(
            {"id": job_id, "org_id": org, "state": "canceling" if info == "running" else "canceled"}
        )
        return
    if info == "running":
        click.echo(
            f"job {job_id!r} is running: its signal is aborted; "
            "it is canceled when its handler returns"
        )
    else:
        click.echo(f"job {job_id!r} canceled")


# -- runs -----------------------------------------------------------------------------------------


@cli.group(epilog=_ex("gnl runs list --state failed", "gnl runs show RUN_ID"))
def runs() -> None:
    """List and show durable runs; resolve an at-most-once step left without result."""


def _run_dict(run: gnl.RunInfo) -> dict[str, Any]:
    return asdict(run)


@runs.command("list", epilog=_ex("gnl runs list --workflow report --state running --json"))
@_url_option
@click.option("--state", type=click.Choice(RUN_STATES), help="Only runs in this state.")
@click.option("--workflow", metavar="W", callback=_nonempty, help="Only runs of this workflow.")
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(1, 10_000), help="Runs to show."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per line, without steps (gnl runs show RUN_ID --json has them).",
)
def runs_list(
    url: str | None, state: str | None, workflow: str | None, limit: int, as_json: bool
) -> None:
    """List durable runs, newest first. A run no process is executing or waking is marked
    stuck (``"stuck": true`` with --json): a running run whose lease expired (its process
    died or stalled), or a suspended run more than a minute past its wake-up time; a waker
    (``gnl run`` of an app that declares its workflow) resumes it."""
    target = _need_store(url)

    async def go() -> tuple[list[gnl.RunInfo], int]:
        async with await _open(target) as storage:
            got = await gnl.list_runs(storage, state=state, workflow=workflow, limit=limit)
            return got, await storage.now_ms()

    items, now = _run(go)
    if as_json:
        for run in items:
            # A listing reads no steps: no "steps" key (an empty list read as "no steps");
            # `gnl runs show RUN_ID --json` has them.
            d = _run_dict(run)
            del d["steps"]
            d["stuck"] = run.stuck(now) is not None
            click.echo(json.dumps(d, ensure_ascii=False))
        return
    console = Console()
    if not items:
        console.print("no runs" + (" matching the filters" if state or workflow else ""))
        return
    table = _table(
        "run id",
        "workflow",
        "state",
        "created (UTC)",
        "wake at / lease until",
        "error",
        wrap=("run id", "workflow", "error"),
        times=("created (UTC)", "wake at / lease until"),
    )
    for run in items:
        table.add_row(
            escape(run.run_id),
            escape(run.workflow),
            run.state + (f", {why}" if (why := run.stuck(now)) else ""),
            _cell_time(run.created_at),
            _cell_time(run.wake_at if run.state == "suspended" else run.lease_expires_at),
            escape(_short(run.error)),
        )
    _print_table(console, table)


@runs.command("show", epilog=_ex("gnl runs show sched:nightly:12 --json"))
@click.argument("run_id", metavar="RUN_ID", callback=_nonempty)
@_url_option
@click.option("--json", "as_json", is_flag=True, help="Print the run as one JSON object.")
def runs_show(run_id: str, url: str | None, as_json: bool) -> None:
    """Show one run and its recorded steps."""
    target = _need_store(url)

    async def go() -> tuple[gnl.RunInfo | None, int]:
        async with await _open(target) as storage:
            return await gnl.get_run(storage, run_id), await storage.now_ms()

    run, now = _run(go)
    if run is None:
        _fail(f"no run {run_id!r}", 1)
    why = run.stuck(now)
    if as_json:
        click.echo(json.dumps(_run_dict(run) | {"stuck": why is not None}, ensure_ascii=False))
        return
    console = Console()
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold", no_wrap=True)
    head.add_column(overflow="fold")
    for k, v in (
        ("run id", run.run_id),
        ("workflow", run.workflow),
        (
            "state",
            run.state + (f" ({run.preset})" if run.preset else "") + (f", {why}" if why else ""),
        ),
        ("created", _when(run.created_at)),
        ("updated", _when(run.updated_at)),
        ("wake at", _when(run.wake_at)),
        ("lease", f"{run.lease_owner or '—'} until {_when(run.lease_expires_at)}"),
        ("error", run.error or "—"),
        ("input", json.dumps(run.input, ensure_ascii=False)),
        ("result", json.dumps(run.result, ensure_ascii=False)),
    ):
        head.add_row(k, escape(v))
    console.print(head)
    steps = _table(
        "#",
        "step",
        "n",
        "state",
        "recorded (UTC)",
        "result",
        wrap=("step", "result"),
        times=("recorded (UTC)",),
    )
    for st in run.steps:
        steps.add_row(
            str(st.position),
            escape(st.name),
            str(st.n),
            st.state,
            _cell_time(st.started_at),
            escape(_short(json.dumps(st.result, ensure_ascii=False))),
        )
    _print_table(console, steps)


@runs.command(
    "resolve",
    epilog=_ex(
        "gnl runs resolve c-2 pay --value '{\"paid\": 2}'", "gnl runs resolve c-2 pay --retry"
    ),
)
@click.argument("run_id", metavar="RUN_ID", callback=_nonempty)
@click.argument("step", metavar="STEP", callback=_nonempty)
@_url_option
@click.option("--n", "n", default=0, show_default=True, type=click.IntRange(0), help="Which call.")
@click.option("--value", metavar="JSON", help="It happened: record this JSON as its result.")
@click.option("--retry", is_flag=True, help="It did not happen: run the step again.")
@_json_option
def runs_resolve(
    run_id: str,
    step: str,
    url: str | None,
    n: int,
    value: str | None,
    retry: bool,
    as_json: bool,
) -> None:
    """Resolve an at-most-once step whose earlier start left no result
    (StepOutcomeUnknownError): --value JSON or --retry."""
    if (value is None) == (not retry):
        raise click.UsageError("give exactly one of --value JSON and --retry")
    try:
        decoded = None if value is None else json.loads(value)
    except json.JSONDecodeError as e:
        raise click.UsageError(f"--value is not JSON: {e}") from None
    target = _need_store(url)

    async def go() -> str | None:
        """None when resolved, else why nothing changed."""
        async with await _open(target) as storage:
            if retry:
                done = await gnl.resolve_step(storage, run_id, step, n=n, retry=True)
            else:
                done = await gnl.resolve_step(storage, run_id, step, n=n, value=decoded)
            if done:
                return None
            if await gnl.get_run(storage, run_id) is None:
                return f"no run {run_id!r}"
            return (
                f"step {step!r} (call {n}) of run {run_id!r} is not an unresolved intent"
                " (gnl runs show lists its steps); nothing changed"
            )

    why = _run(go)
    if why is not None:
        _fail(why, 1)
    if as_json:
        _print_json(
            {"run_id": run_id, "step": step, "n": n, "resolved": "retry" if retry else "value"}
        )
        return
    click.echo(
        f"step {step!r} (call {n}) of run {run_id!r} resolved; resume the run"
        f" (a failed run: gnl runs resume {shlex.quote(run_id)})"
    )


@runs.command("resume", epilog=_ex("gnl runs resume sched:nightly:12"))
@click.argument("run_id", metavar="RUN_ID", callback=_nonempty)
@_url_option
@_json_option
def runs_resume(run_id: str, url: str | None, as_json: bool) -> None:
    """Hand a failed run to the waker: it is resumed at the next tick of a waker that serves
    its workflow (gnl run), its recorded steps not run again."""
    target = _need_store(url)

    async def go() -> str | None:
        """None when handed over, else why nothing changed."""
        async with await _open(target) as storage:
            if await gnl.resume_run(storage, run_id):
                return None
            run = await gnl.get_run(storage, run_id)
            if run is None:
                return f"no run {run_id!r}"
            return f"run {run_id!r} is {run.state}, not failed; nothing changed"

    why = _run(go)
    if why is not None:
        _fail(why, 1)
    if as_json:
        _print_json({"run_id": run_id, "state": "suspended"})
        return
    click.echo(f"run {run_id!r} is due to the waker (a process serving its workflow resumes it)")


# -- studio ---------------------------------------------------------------------------------------


@cli.command(
    epilog=_ex(
        "gnl studio sqlite:///jobs.db",
        "gnl studio --url postgres://app@db/app --host 0.0.0.0 --token VIEWER --admin-token ADMIN",
    )
)
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option("--port", default=8484, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--token",
    envvar="GNL_STUDIO_TOKEN",
    metavar="T",
    help="The viewer token: it reads (or set GNL_STUDIO_TOKEN).",
)
@click.option(
    "--admin-token",
    envvar="GNL_STUDIO_ADMIN_TOKEN",
    metavar="T",
    help="The admin token: it reads and acts (or set GNL_STUDIO_ADMIN_TOKEN).",
)
@click.option("--show-payloads", is_flag=True, help="Show payloads and results to viewers.")
@click.option(
    "--audit-log",
    metavar="PATH",
    default=None,
    help="The audit log (JSON lines); default ~/.local/state/gnl/studio-audit.jsonl.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Another Host name to accept (behind a reverse proxy); repeatable.",
)
def studio(
    url_arg: str | None,
    url: str | None,
    host: str,
    port: int,
    token: str | None,
    admin_token: str | None,
    show_payloads: bool,
    audit_log: str | None,
    allow_hosts: tuple[str, ...],
) -> None:
    """Serve Studio, the web dashboard of the store at URL (needs pip install 'gnl[studio]').

    It binds 127.0.0.1 unless --host says otherwise, and refuses any other address without a
    token. With no token, everyone who can reach the loopback address is admin.
    """
    _nonempty_url_arg(url_arg)
    target = _need_store(url_arg or url)
    try:
        from .studio import serve
        from .studio.security import Tokens, is_loopback
    except ImportError as e:
        _fail(f"gnl studio needs the studio extra (pip install 'gnl[studio]'): {e}")
    try:
        # Before the token rule: an address that names nothing is the mistake to report.
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise click.BadParameter(
            f"{host!r} is no address to bind ({e})", param_hint="--host"
        ) from None
    if audit_log is not None and os.path.isdir(audit_log):
        raise click.BadParameter(
            f"{audit_log!r} is a directory, not a file", param_hint="--audit-log"
        )
    if not is_loopback(host) and not (token or admin_token):
        _fail(
            f"refusing to serve Studio on {host} without a token: pass --token "
            "(viewer) and/or --admin-token, or bind 127.0.0.1"
        )
    try:
        tokens = Tokens(token, admin_token)
    except ValueError as e:
        _fail(str(e))

    async def reachable() -> None:
        # The store is opened once before the server starts, so a bad URL or a server that is
        # down is one line and exit 2 / 1, not a traceback from the server's start-up.
        async with await _open(target):
            pass

    _run(reachable)
    try:
        serve(
            target,
            host=host,
            port=port,
            tokens=tokens,
            show_payloads=show_payloads,
            audit_path=audit_log,
            allowed_hosts=allow_hosts,
        )
    except gnl.GnlError as e:
        _fail(f"{type(e).__name__}: {e}")
    except OSError as e:
        _fail(f"cannot serve on {host}:{port}: {e}", 1)


@cli.group(epilog=_ex("gnl triggers list", "gnl triggers unschedule nightly"))
def triggers() -> None:
    """List and unschedule the scheduler's triggers."""


@triggers.command("list", epilog=_ex("gnl triggers list --url sqlite:///jobs.db --json"))
@_url_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def triggers_list(url: str | None, as_json: bool) -> None:
    """List the registered triggers, by id."""
    target = _need_store(url)

    async def go() -> list[gnl.TriggerInfo]:
        async with await _open(target) as storage:
            return await gnl.list_triggers(storage)

    items = _run(go)
    if as_json:
        for t in items:
            click.echo(json.dumps(asdict(t), ensure_ascii=False))
        return
    console = Console()
    if not items:
        console.print("no triggers")
        return
    table = _table(
        "id",
        "workflow",
        "kind",
        "spec",
        "state",
        "fires",
        "next run (UTC)",
        "error",
        wrap=("id", "workflow", "spec", "error"),
        times=("next run (UTC)",),
    )
    for t in items:
        table.add_row(
            escape(t.id),
            escape(t.name),
            t.kind,
            escape(str(t.spec)),
            t.state,
            str(t.fire_count),
            _cell_time(t.next_run_at),
            escape(_short(t.last_error)),
        )
    _print_table(console, table)


@triggers.command("unschedule", epilog=_ex("gnl triggers unschedule nightly"))
@click.argument("trigger_id", metavar="ID", callback=_nonempty)
@_url_option
@_json_option
def triggers_unschedule(trigger_id: str, url: str | None, as_json: bool) -> None:
    """Remove trigger ID (its runs stay in the journal). Exit code 1 when there is none."""
    target = _need_store(url)

    async def go() -> bool:
        async with await _open(target) as storage:
            return await gnl.unschedule(storage, trigger_id)

    if not _run(go):
        _fail(f"no trigger {trigger_id!r}", 1)
    if as_json:
        _print_json({"id": trigger_id, "unscheduled": True})
        return
    click.echo(f"trigger {trigger_id!r} unscheduled")


# Epoch ms of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z.
_FIRST_MS = -62_135_596_800_000
_LAST_MS = 253_402_300_799_999


@cli.command("cron", epilog=_ex("gnl cron '0 3 * * 1-5'", "gnl cron '*/15 * * * *' -n 3 --json"))
@click.argument("expr", metavar="EXPR")
@click.option(
    "-n",
    "count",
    default=5,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="How many fire times to print.",
)
@click.option(
    "--after",
    "after_ms",
    # The instants a fire time can be printed at: years 1 to 9999 (cron's search ends there).
    type=click.IntRange(_FIRST_MS, _LAST_MS),
    help="Epoch ms to start after (default: now), from year 1 to 9999.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='One JSON object per line: {"at_ms": epoch ms, "at": ISO-8601 UTC}.',
)
def cron_cmd(expr: str, count: int, after_ms: int | None, as_json: bool) -> None:
    """Print the next fire times of cron expression EXPR (UTC, ISO-8601); no store is read."""
    start = after_ms if after_ms is not None else int(datetime.now(timezone.utc).timestamp() * 1000)
    try:
        times = gnl.cron_times(expr, start, count)
    except gnl.CronError as e:
        _fail(f"CronError: {e}")  # a refused expression is bad usage: exit 2
    if as_json:
        for t in times:
            click.echo(json.dumps({"at_ms": t, "at": _when(t)}))
    else:
        for t in times:
            click.echo(_when(t))
    if len(times) < count:
        # Not an error (gnl.cron_times returns fewer too), but never a silent short list.
        click.echo(
            f"{len(times)} of {count} fire times: the next come after the year 9999", err=True
        )


# -- events ---------------------------------------------------------------------------------------


@cli.group(epilog=_ex("gnl events dead orders billing", "gnl events retry orders billing EVENT_ID"))
def events() -> None:
    """List and retry the events a consumer quarantined."""


@events.command("dead", epilog=_ex("gnl events dead orders billing --url sqlite:///jobs.db --json"))
@click.argument("topic", metavar="TOPIC", callback=_nonempty)
@click.argument("consumer", metavar="CONSUMER", callback=_nonempty)
@_url_option
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Events to show.",
)
@click.option(
    "--after",
    "after_seq",
    default=0,
    type=click.IntRange(0),
    metavar="SEQ",
    help="The next page: only events past this log position (printed under a full page).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def events_dead(
    topic: str, consumer: str, url: str | None, limit: int, after_seq: int, as_json: bool
) -> None:
    """List the events consumer CONSUMER of TOPIC quarantined (it gave up on them), in log
    order."""
    target = _need_store(url)

    async def go() -> list[gnl.DeadEvent]:
        async with await _open(target) as storage:
            return await gnl.list_dead_events(
                storage.work, topic, consumer, after_seq=after_seq, limit=limit
            )

    items = _run(go)
    if as_json:
        for ev in items:
            click.echo(json.dumps(asdict(ev), ensure_ascii=False))
        return
    console = Console()
    if not items:
        console.print(
            f"no quarantined events for consumer {escape(consumer)!r} of {escape(topic)!r}"
        )
        return
    table = _table(
        "id",
        "attempts",
        "quarantined (UTC)",
        "error",
        "payload",
        wrap=("id", "error", "payload"),
        times=("quarantined (UTC)",),
    )
    for ev in items:
        table.add_row(
            escape(ev.id),
            str(ev.attempts),
            _cell_time(ev.at),
            escape(_short(ev.error)),
            escape(_short(json.dumps(ev.payload, ensure_ascii=False))),
        )
    _print_table(console, table)
    if len(items) == limit:
        console.print(f"more events may follow: add --after {items[-1].seq}")


@events.command("retry", epilog=_ex("gnl events retry orders billing 01JD0Z6K3M"))
@click.argument("topic", metavar="TOPIC", callback=_nonempty)
@click.argument("consumer", metavar="CONSUMER", callback=_nonempty)
@click.argument("event_id", metavar="ID", callback=_nonempty)
@_url_option
@_json_option
def events_retry(topic: str, consumer: str, event_id: str, url: str | None, as_json: bool) -> None:
    """Hand quarantined event ID back to CONSUMER of TOPIC for a fresh series of attempts.
    Exit code 1 when the consumer has no such quarantined event."""
    target = _need_store(url)

    async def go() -> bool:
        async with await _open(target) as storage:
            return await gnl.retry_dead_event(storage.work, topic, consumer, event_id)

    if not _run(go):
        _fail(f"no quarantined event {event_id!r} for consumer {consumer!r} of {topic!r}", 1)
    if as_json:
        _print_json({"topic": topic, "consumer": consumer, "id": event_id, "retried": True})
        return
    click.echo(f"event {event_id!r} handed back to consumer {consumer!r} of {topic!r}")


# -- run ------------------------------------------------------------------------------------------


@cli.command(
    "run",
    epilog=_ex(
        "gnl run myapp.tasks:app",
        "gnl run myapp.tasks:app --only worker --grace-ms 60000",
        "GNL_URL=postgres://app@db/app gnl run myapp.tasks:app --only scheduler,waker",
    ),
)
@click.argument("target", metavar="MODULE:ATTR")
@_url_option
@click.option(
    "--only",
    metavar="ROLES",
    help="Run only these roles, comma-separated: worker, scheduler, consumers, waker "
    "(default: all).",
)
@click.option(
    "--grace-ms",
    default=30_000,
    show_default=True,
    type=click.IntRange(0),
    help="On SIGTERM/SIGINT, how long running handlers get to return before their signals "
    "abort (why='shutdown'), and again after.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="The level of the 'gnl' logger's lines on stderr.",
)
def run_cmd(target: str, url: str | None, only: str | None, grace_ms: int, log_level: str) -> None:
    """Run the app MODULE:ATTR (a gnl.App): its workers, scheduler, consumers and workflow
    waker in this process, until SIGTERM or SIGINT.

    The working directory is importable. The store is --url, else the app's url, else GNL_URL;
    an empty store gets the schema, an outdated one is refused (run gnl upgrade). The first
    signal stops claiming and lets running handlers finish (--grace-ms, then their signals
    abort); exit code 0 when everything settled, 1 when some outcome could not be written or
    a handler ignored its signal (those jobs run again after their lease). A second signal
    exits at once (code 128 + signal number).
    """
    import logging

    from .app import AppError, AppImportError, load_app

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
    )
    logger = logging.getLogger("gnl")
    logger.addHandler(handler)
    logger.setLevel(log_level.upper())
    logger.propagate = False
    try:
        app = load_app(target)
        roles = None if only is None else [r.strip() for r in only.split(",")]
        code = app.run(url=url, only=roles, grace_ms=grace_ms)
    except AppImportError as e:
        # The module's own traceback (its frames, not gnl's, click's or importlib's), then
        # the one line.
        click.echo(_user_traceback(e.__cause__), err=True, nl=False)
        _fail(str(e), 1)
    except AppError as e:
        _fail(str(e), 1)
    except (gnl.GnlError, TypeError) as e:
        _fail_error(e)
    sys.exit(code)


def _user_traceback(exc: BaseException | None) -> str:
    """``exc``'s traceback without the frames of gnl, click and the import machinery."""
    if exc is None:
        return ""
    import importlib
    import traceback

    skip = (
        os.path.dirname(__file__),
        os.path.dirname(click.__file__),
        os.path.dirname(importlib.__file__),
        "<frozen importlib",
    )
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.startswith(skip)]
    )
    te.__cause__ = te.__context__ = None
    return "".join(te.format())


def main(argv: Sequence[str] | None = None) -> None:
    """The ``gnl`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="gnl")


if __name__ == "__main__":
    main()
