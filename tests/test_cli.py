"""Every ``gnl`` command: its happy path, and its error paths (an unknown id, a bad URL, an
unreachable store, an outdated schema: the message names ``gnl upgrade``), with ``--json``
output, exit codes (2 bad usage, 1 a failed operation) and one-line errors.

The commands run in process (click's runner), on every backend; ``gnl run`` is tests/test_app.py,
``gnl demo`` tests/test_wheel.py and ``gnl studio`` tests/test_studio.py (their error paths are
here).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner, Result

import gnl
from _support import outdated_sqlite_store
from conftest import _server, missing_server
from gnl import _native
from gnl.cli import cli

LONG_ID = "order-" + "x" * 40 + "-end"


def gnl_cmd(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env={"COLUMNS": "200", **(env or {})}).invoke(cli, list(args), prog_name="gnl")


def one_line_error(r: Result, code: int) -> str:
    assert r.exit_code == code, (r.exit_code, r.output, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gnl: "), r.stderr
    return lines[0]


def seeded(url: str) -> None:
    """A store with a dead job, a pending one, a done run, a trigger and a quarantined event."""

    async def go() -> None:
        async with await gnl.connect(url) as st:
            await gnl.enqueue(st.work, "boom", {"a": 1}, id=LONG_ID, org_id="acme")
            await gnl.enqueue(st.work, "later", {"b": 2}, id="p1", org_id="acme")

            async def boom(payload: Any, ctx: gnl.JobContext) -> None:
                raise RuntimeError("kaput")

            await gnl.create_worker(st, {"boom": boom}, max_attempts=1).drain()

            async def wf(ctx: gnl.WorkflowContext, input: Any) -> Any:
                return await ctx.step("s", lambda: 7)

            await gnl.create_gnl(st, {"wf": wf}).run_workflow("wf", run_id="r1")
            await gnl.schedule_workflow(st, "wf", id="nightly", cron="0 3 * * *")
            await gnl.emit(st.work, "orders", {"o": 1}, id="e1")

            async def fails(payload: Any, meta: gnl.EventMeta) -> None:
                raise ValueError("bad order")

            await gnl.create_consumer(
                st.work, "orders", fails, name="billing", max_attempts=1
            ).drain()

    asyncio.run(go())


def test_runs_that_no_process_executes_or_wakes_are_listed_as_stuck(
    store_url: Callable[[], str],
) -> None:
    # A run whose process died keeps state "running"; one whose wakers are all gone keeps
    # "suspended" past its wake-up: both are marked, in the table and with --json, so an
    # operator sees what no process is going to finish.
    url = store_url()
    gnl_cmd("upgrade", url)

    async def go() -> None:
        async with await gnl.connect(url) as st:
            native = st._native
            now = await st.now_ms()
            # A process that started "dead" with a 3 ms lease, never renewed; "live" holds a
            # lease of an hour; "late" sleeps until two minutes ago, "soon" until a minute on.
            for run_id, lease in (("dead", 3), ("live", 3_600_000), ("late", 3), ("soon", 3)):
                await _native.run_start(native, run_id, "wf", None, None, None, "p:1:x", lease)
            assert await _native.run_suspend(native, "late", now - 120_000)
            assert await _native.run_suspend(native, "soon", now + 60_000)
            await asyncio.sleep(0.05)

    asyncio.run(go())
    env = {"GNL_URL": url}
    listed = {
        x["run_id"]: (x["state"], x["stuck"])
        for x in map(json.loads, gnl_cmd("runs", "list", "--json", env=env).output.splitlines())
    }
    assert listed == {
        "dead": ("running", True),
        "live": ("running", False),
        "late": ("suspended", True),
        "soon": ("suspended", False),
    }
    table = gnl_cmd("runs", "list", env=env).output
    rows = {
        ln.split()[1]: ln
        for ln in table.splitlines()
        if ln.split()[1:2] in (["dead"], ["live"], ["late"], ["soon"])
    }
    assert "stuck: lease expired" in rows["dead"], table
    assert "stuck: overdue" in rows["late"], table
    assert "stuck" not in rows["live"] + rows["soon"], table
    shown = gnl_cmd("runs", "show", "dead", env=env).output
    assert "running, stuck: lease expired" in shown, shown
    assert json.loads(gnl_cmd("runs", "show", "live", "--json", env=env).output)["stuck"] is False


def test_every_command_happy_path(store_url: Callable[[], str]) -> None:
    url = store_url()
    r = gnl_cmd("upgrade", url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["schema_version"] >= 1
    seeded(url)
    env = {"GNL_URL": url}

    # jobs
    r = gnl_cmd("jobs", "list", env=env)
    assert r.exit_code == 0, r.output
    assert "no jobs without organization (--org ORG lists an organization's, --all" in r.output
    r = gnl_cmd("jobs", "list", "--org", "acme", env=env)
    assert r.exit_code == 0 and LONG_ID in r.output and "p1" in r.output, r.output
    listed = [
        json.loads(ln)
        for ln in gnl_cmd("jobs", "list", "--all", "--json", env=env).output.splitlines()
    ]
    assert {j["id"]: j["state"] for j in listed} == {LONG_ID: "dead", "p1": "pending"}
    # --json pages too: stdout holds only JSON lines, the cursor is on stderr.
    first = gnl_cmd("jobs", "list", "--all", "--json", "--limit", "1", env=env)
    assert len(first.stdout.splitlines()) == 1, first.output
    cursor = first.stderr.split("--cursor ", 1)[1].strip()
    rest = gnl_cmd("jobs", "list", "--all", "--json", "--limit", "1", "--cursor", cursor, env=env)
    ids = [json.loads(ln)["id"] for ln in (first.stdout + rest.stdout).splitlines()]
    assert sorted(ids) == sorted([LONG_ID, "p1"]), ids
    # --json is one JSON object per line (docs/deploy.md), for show as for the listings.
    shown_out = gnl_cmd("jobs", "show", LONG_ID, "--org", "acme", "--json", env=env).output
    assert len(shown_out.splitlines()) == 1, shown_out
    shown = json.loads(shown_out)
    assert shown["state"] == "dead" and "kaput" in shown["last_error"]
    assert "kaput" in gnl_cmd("jobs", "show", LONG_ID, "--org", "acme", env=env).output
    r = gnl_cmd("jobs", "retry", LONG_ID, "--org", "acme", "--json", env=env)
    assert r.exit_code == 0 and json.loads(r.output)["state"] == "pending", r.output
    r = gnl_cmd("jobs", "cancel", "p1", "--org", "acme", "--reason", "dup", env=env)
    assert r.exit_code == 0 and "canceled" in r.output

    # runs
    runs = [json.loads(ln) for ln in gnl_cmd("runs", "list", "--json", env=env).output.splitlines()]
    assert [(x["run_id"], x["state"]) for x in runs] == [("r1", "done")]
    # A listing reads no steps: no "steps" key (it printed "steps": [] for runs with steps).
    assert all("steps" not in x for x in runs), runs
    assert "r1" in gnl_cmd("runs", "list", env=env).output
    run_out = gnl_cmd("runs", "show", "r1", "--json", env=env).output
    assert len(run_out.splitlines()) == 1 and json.loads(run_out)["result"] == 7, run_out
    assert [s["name"] for s in json.loads(run_out)["steps"]], run_out
    assert "done" in gnl_cmd("runs", "show", "r1", env=env).output

    # events
    r = gnl_cmd("events", "dead", "orders", "billing", env=env)
    assert r.exit_code == 0 and "e1" in r.output and "bad order" in r.output, r.output
    dead = [
        json.loads(ln)
        for ln in gnl_cmd(
            "events", "dead", "orders", "billing", "--json", env=env
        ).output.splitlines()
    ]
    assert [(d["id"], d["attempts"], d["payload"]) for d in dead] == [("e1", 1, {"o": 1})]
    r = gnl_cmd("events", "dead", "orders", "billing", "--limit", "1", env=env)
    assert r.exit_code == 0 and f"--after {dead[0]['seq']}" in r.output, r.output
    r = gnl_cmd("events", "dead", "orders", "billing", "--after", str(dead[0]["seq"]), env=env)
    assert r.exit_code == 0 and "no quarantined events" in r.output, r.output
    r = gnl_cmd("events", "retry", "orders", "billing", "e1", "--json", env=env)
    assert r.exit_code == 0 and json.loads(r.output)["retried"] is True, r.output
    r = gnl_cmd("events", "dead", "orders", "other", env=env)
    assert r.exit_code == 0 and "no quarantined events" in r.output

    # triggers
    trig = [
        json.loads(ln) for ln in gnl_cmd("triggers", "list", "--json", env=env).output.splitlines()
    ]
    assert [(t["id"], t["spec"]) for t in trig] == [("nightly", "0 3 * * *")]
    assert "nightly" in gnl_cmd("triggers", "list", env=env).output
    r = gnl_cmd("triggers", "unschedule", "nightly", "--json", env=env)
    assert r.exit_code == 0 and json.loads(r.output) == {"id": "nightly", "unscheduled": True}
    assert gnl_cmd("triggers", "list", env=env).output.strip() == "no triggers"


def test_cron_prints_iso_utc() -> None:
    r = gnl_cmd("cron", "0 3 * * *", "-n", "2", "--after", "0")
    assert r.exit_code == 0
    assert r.output.split() == ["1970-01-01T03:00:00.000Z", "1970-01-02T03:00:00.000Z"]
    # --json: one object per line, like every listing (docs/deploy.md).
    r = gnl_cmd("cron", "*/30 * * * *", "-n", "3", "--after", "0", "--json")
    assert [json.loads(ln) for ln in r.output.splitlines()] == [
        {"at_ms": 1_800_000, "at": "1970-01-01T00:30:00.000Z"},
        {"at_ms": 3_600_000, "at": "1970-01-01T01:00:00.000Z"},
        {"at_ms": 5_400_000, "at": "1970-01-01T01:30:00.000Z"},
    ]
    assert "How many fire times" in gnl_cmd("cron", "--help").output
    assert "CronError" in one_line_error(gnl_cmd("cron", "61 * * * *"), 2)
    assert gnl_cmd("cron", "* * * * *", "-n", "0").exit_code == 2
    # Near the end of the year 9999 fewer times are left than asked for: those, and a line on
    # stderr saying so (gnl.cron_times returns fewer too).
    r = gnl_cmd("cron", "59 23 31 12 *", "-n", "3", "--after", "253370764800000")
    assert r.exit_code == 0 and r.stdout.split() == ["9999-12-31T23:59:00.000Z"], r.output
    assert "1 of 3 fire times: the next come after the year 9999" in r.stderr


def test_upgrade_takes_its_url_argument_over_gnl_url(tmp_path: Path) -> None:
    # GNL_URL is a default: the argument names the store, with no clash reported.
    r = gnl_cmd(
        "upgrade", f"sqlite:///{tmp_path}/a.db", env={"GNL_URL": f"sqlite:///{tmp_path}/b.db"}
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a.db").exists() and not (tmp_path / "b.db").exists()
    same = f"sqlite:///{tmp_path}/a.db"
    assert gnl_cmd("upgrade", same, "--url", same).exit_code == 0


def test_unknown_ids_exit_1(store_url: Callable[[], str]) -> None:
    url = store_url()
    asyncio.run(gnl.upgrade(url))
    env = {"GNL_URL": url}
    for args, msg in (
        # Without --org the id is looked up among the jobs without one: the line says so,
        # and how to name an organization.
        (("jobs", "show", "nope"), "no job 'nope' without organization (give --org ORG"),
        (("jobs", "retry", "nope"), "no job 'nope' without organization (give --org ORG"),
        (("jobs", "cancel", "nope", "--org", "acme"), "no job 'nope' in org 'acme'"),
        (("runs", "show", "nope"), "no run 'nope'"),
        (("runs", "resolve", "nope", "pay", "--retry"), "no run 'nope'"),
        (("events", "retry", "orders", "billing", "nope"), "no quarantined event 'nope'"),
        (("triggers", "unschedule", "nope"), "no trigger 'nope'"),
    ):
        assert msg in one_line_error(gnl_cmd(*args, env=env), 1), args


STORE_COMMANDS = [
    ("upgrade",),
    ("jobs", "list"),
    ("jobs", "show", "x"),
    ("jobs", "retry", "x"),
    ("jobs", "cancel", "x"),
    ("runs", "list"),
    ("runs", "show", "x"),
    ("events", "dead", "t", "c"),
    ("events", "retry", "t", "c", "x"),
    ("triggers", "list"),
    ("triggers", "unschedule", "x"),
    ("studio",),  # the store is opened before the server starts: one line, not a traceback
]


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=lambda a: " ".join(a))
def test_bad_and_unreachable_urls(args: tuple[str, ...]) -> None:
    assert "no store given" in gnl_cmd(*args).stderr
    assert gnl_cmd(*args).exit_code == 2
    bad = one_line_error(gnl_cmd(*args, "--url", "redis://127.0.0.1/0"), 2)
    assert "InvalidArgumentError" in bad and "redis" in bad
    # The message lists every accepted form, mariadb:// too (docs/engines.md).
    assert "mysql://" in bad and "mariadb://" in bad
    away = one_line_error(gnl_cmd(*args, "--url", "postgres://postgres@127.0.0.1:1/test"), 1)
    # The refused connection names the server it tried.
    assert "StoreUnavailableError" in away and "127.0.0.1:1" in away, away


@pytest.mark.parametrize("args", STORE_COMMANDS[1:], ids=lambda a: " ".join(a))
def test_outdated_schema_names_gnl_upgrade(args: tuple[str, ...], tmp_path: Path) -> None:
    url = outdated_sqlite_store(str(tmp_path / "old.db"))
    err = one_line_error(gnl_cmd(*args, "--url", url), 1)
    assert "SchemaOutdatedError" in err and "gnl upgrade" in err
    # And no SQLite file at all: exit 1, naming gnl upgrade; nothing is created.
    missing = tmp_path / "missing.db"
    err = one_line_error(gnl_cmd(*args, "--url", f"sqlite:///{missing}"), 1)
    assert "gnl upgrade" in err and not missing.exists()


def test_an_empty_database_is_said_to_hold_no_store(store_url: Callable[[], str]) -> None:
    # A database gnl has never upgraded: the message says there is no store yet and names the
    # engine whose schema version it counts (each engine numbers its own migrations).
    url = store_url()
    err = one_line_error(gnl_cmd("jobs", "list", "--url", url), 1)
    if url.startswith("sqlite"):
        assert "no SQLite store" in err and "gnl upgrade" in err
    else:
        engine = "Postgres" if url.startswith("postgres") else "MySQL"
        assert "SchemaOutdatedError" in err and "holds no gnl store yet" in err, err
        assert f"needs {engine} schema" in err and "gnl upgrade" in err, err


def test_a_refused_mysql_connection_names_the_server() -> None:
    away = one_line_error(gnl_cmd("jobs", "list", "--url", "mysql://root@127.0.0.1:1/test"), 1)
    assert "StoreUnavailableError" in away and "127.0.0.1:1" in away, away


@pytest.mark.parametrize("backend", ["postgres", "mysql"])
def test_a_missing_database_or_user_says_what_to_change(backend: str) -> None:
    # The server answers and refuses the URL's database or user: the line names the server
    # and what to change (it was a bare `store error (3D000)`).
    server = _server(backend)
    if isinstance(server, str):
        missing_server(server)
        return
    url = urlsplit(server.admin_url)
    no_db = urlunsplit(url._replace(path="/gnl_no_such_db"))
    err = one_line_error(gnl_cmd("jobs", "list", "--url", no_db), 1)
    assert f"cannot connect to {url.hostname}:{url.port}" in err, err
    assert "gnl_no_such_db" in err and "create the database first" in err, err
    no_user = urlunsplit(url._replace(netloc=f"gnl_no_such_user@{url.hostname}:{url.port}"))
    err = one_line_error(gnl_cmd("jobs", "list", "--url", no_user), 1)
    assert f"cannot connect to {url.hostname}:{url.port}" in err, err
    assert "gnl_no_such_user" in err and "check the URL's user and password" in err, err


def test_a_missing_postgres_schema_says_to_create_it() -> None:
    # The URL's search_path names a schema nobody created: `jobs list` sent the user to
    # `gnl upgrade`, which failed with the server's "no schema has been selected to create in"
    # (a bare `store error (3F000)`). Both now say what to do.
    server = _server("postgres")
    if isinstance(server, str):
        missing_server(server)
        return
    sep = "&" if "?" in server.admin_url else "?"
    url = f"{server.admin_url}{sep}options=-c%20search_path%3Dgnl_no_such_schema"
    for args in (("jobs", "list", "--url", url), ("upgrade", url)):
        err = one_line_error(gnl_cmd(*args), 2)
        assert "InvalidArgumentError" in err and "gnl_no_such_schema" in err, err
        assert "create it first (CREATE SCHEMA" in err and "3F000" not in err, err


def test_a_bad_url_option_is_said_once() -> None:
    # sqlx's reason read "error with configuration: error with configuration: unknown value".
    err = one_line_error(gnl_cmd("jobs", "list", "--url", "postgres://u@h/db?sslmode=bogus"), 2)
    assert "bad Postgres URL" in err and "bogus" in err, err
    assert "error with configuration" not in err, err


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=lambda a: " ".join(a))
def test_a_store_in_a_missing_directory_is_bad_usage_worded_alike(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    # The API refuses it (InvalidArgumentError): exit 2 from every command, upgrade too, in one
    # wording that names the directory; the hint is not just "run gnl upgrade" (it refuses it).
    url = f"sqlite:///{tmp_path}/nowhere/x.db"
    err = one_line_error(gnl_cmd(*args, "--url", url), 2)
    assert "directory" in err and "nowhere" in err and "does not exist" in err, err
    assert "create the directory" in err, err
    assert not (tmp_path / "nowhere").exists()
    if args != STORE_COMMANDS[0]:
        assert err == one_line_error(gnl_cmd("upgrade", "--url", url), 2)


def test_gnl_run_of_something_else_than_an_app_says_what_it_is(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    # A function that needs arguments is not called (json.dumps() would raise a TypeError).
    err = one_line_error(gnl_cmd("run", "json:dumps", "--url", url), 2)
    assert "'json:dumps' is a function that needs arguments (obj)" in err, err
    assert "not a gnl.App" in err, err
    # A callable of no arguments is called: what it returned is named.
    err = one_line_error(gnl_cmd("run", "json:JSONDecoder", "--url", url), 2)
    assert "returned a JSONDecoder, not a gnl.App" in err, err
    err = one_line_error(gnl_cmd("run", "json:__name__", "--url", url), 2)
    assert "is a str, not a gnl.App" in err, err
    assert not (tmp_path / "s.db").exists()


def test_studio_and_demo_error_paths(tmp_path: Path) -> None:
    err = one_line_error(gnl_cmd("studio", f"sqlite:///{tmp_path}/none.db"), 1)
    assert "gnl upgrade" in err
    err = one_line_error(gnl_cmd("demo", "--url", "redis://127.0.0.1/0"), 2)
    assert "redis" in err
    assert gnl_cmd("demo", "--workers", "0").exit_code == 2


def test_tables_fit_a_narrow_terminal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    asyncio.run(gnl.upgrade(url))
    seeded(url)
    for args in (
        ("jobs", "list", "--org", "acme"),
        ("jobs", "show", LONG_ID, "--org", "acme"),
        ("events", "dead", "orders", "billing"),
        ("runs", "list"),
        ("triggers", "list"),
    ):
        r = gnl_cmd(*args, "--url", url, env={"COLUMNS": "60"})
        assert r.exit_code == 0, (args, r.output)
        lines = r.output.splitlines()
        assert all(len(ln) <= 60 for ln in lines), (args, r.output)
        assert "…" not in r.output, (args, r.output)  # nothing cut: long cells wrap
    # The long id wraps, whole, across lines of its column.
    out = gnl_cmd("jobs", "list", "--org", "acme", "--url", url, env={"COLUMNS": "60"}).output
    pieces = [ln.split("│")[2].strip() for ln in out.splitlines() if ln.count("│") > 3]
    assert LONG_ID in "".join(pieces)


@pytest.mark.parametrize(
    ("args", "times"),
    [
        (("jobs", "list", "--org", "acme"), 4),
        (("runs", "list"), 1),
        (("triggers", "list"), 1),
        (("events", "dead", "orders", "billing"), 1),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, tuple) else str(a),
)
def test_an_80_column_table_wraps_a_time_between_date_and_time_only(
    args: tuple[str, ...], times: int, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    asyncio.run(gnl.upgrade(url))
    seeded(url)
    r = gnl_cmd(*args, "--url", url, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(len(ln) <= 80 for ln in lines) and "…" not in r.output, r.output
    # Each time is whole in its cell, its date and its time (to the second) unbroken, on one
    # line or the time under the date.
    assert len(re.findall(r"(?<= )\d{4}-\d\d-\d\d(?= )", r.output)) == times, r.output
    assert len(re.findall(r"(?<= )\d\d:\d\d:\d\dZ(?= )", r.output)) == times, r.output
    # The right-hand border is on every row: nothing was cropped.
    assert all(ln.endswith(("│", "┃", "┓", "┩", "┘")) for ln in lines if ln.strip()), r.output


def test_jobs_list_shows_attempts_of_the_limit_once_claimed(tmp_path: Path) -> None:
    # The limit is the claiming worker's max_attempts: before a claim there is none to show
    # (the stored default would read 0/5 under a worker whose max_attempts is 1).
    url = f"sqlite:///{tmp_path}/s.db"
    asyncio.run(gnl.upgrade(url))
    seeded(url)
    out = gnl_cmd("jobs", "list", "--org", "acme", "--url", url).output
    rows = {
        ln.split("│")[2].strip(): ln.split("│")[5].strip()
        for ln in out.splitlines()
        if ln.count("│") > 3 and ln.split("│")[2].strip()
    }
    assert rows == {LONG_ID: "1/1", "p1": "0"}, out


def test_a_filtered_listing_of_every_organization_pages_with_a_cursor(tmp_path: Path) -> None:
    # --all with --type reads the store's pages of 1,000 and keeps the matches; --cursor goes
    # on right after the last one shown, across those pages, with no job twice or left out.
    url = f"sqlite:///{tmp_path}/s.db"
    orgs = [None, "acme", "beta"]

    async def seed() -> None:
        async with await gnl.connect(url) as st:
            await gnl.enqueue_many(
                st.work,
                [
                    {
                        "type": "x" if i % 3 else "y",
                        "payload": i,
                        "options": {"id": f"j{i:05}", "org_id": orgs[i % 7 % 3]},
                    }
                    for i in range(3_100)
                ],
            )

    asyncio.run(seed())
    whole = [
        json.loads(ln)["id"]
        for ln in gnl_cmd(
            "jobs", "list", "--all", "--json", "--limit", "10000", "--url", url
        ).stdout.splitlines()
    ]
    expected = [j for j in whole if int(j[1:]) % 3]
    assert len(whole) == 3_100 and len(expected) == 2_066
    got: list[str] = []
    cursor: list[str] = []
    for _ in range(10):
        r = gnl_cmd(
            "jobs",
            "list",
            "--all",
            "--type",
            "x",
            "--limit",
            "700",
            "--json",
            "--url",
            url,
            *cursor,
        )
        assert r.exit_code == 0, r.output
        got += [json.loads(ln)["id"] for ln in r.stdout.splitlines()]
        if "--cursor " not in r.stderr:
            break
        cursor = ["--cursor", r.stderr.split("--cursor ", 1)[1].strip()]
    assert got == expected
    # The table says how to go on too.
    r = gnl_cmd("jobs", "list", "--all", "--type", "y", "--limit", "5", "--url", url)
    assert r.exit_code == 0 and "more jobs: add --cursor " in r.output, r.output


def test_show_of_a_huge_payload_prints_its_start_and_says_how_to_get_it_whole(
    tmp_path: Path,
) -> None:
    # A 5 MB payload: the table shows its first characters and says what is left (it took
    # minutes to lay out a 50 MB one whole); --json prints it whole.
    url = f"sqlite:///{tmp_path}/s.db"
    big = "a" * 5_000_000

    async def seed() -> None:
        async with await gnl.connect(url) as storage:
            await gnl.enqueue(storage.work, "t", big, id="big")

    asyncio.run(seed())
    r = gnl_cmd("jobs", "show", "big", "--url", url)
    assert r.exit_code == 0, r.output
    assert len(r.output) < 100_000
    assert "more characters (--json prints it whole)" in r.output
    whole = json.loads(gnl_cmd("jobs", "show", "big", "--url", url, "--json").output)
    assert whole["payload"] == big


@pytest.mark.parametrize("command", ["show", "retry", "cancel"])
def test_an_empty_job_id_is_bad_usage(command: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    asyncio.run(gnl.upgrade(url))
    err = one_line_error(gnl_cmd("jobs", command, "", "--url", url), 2)
    assert "non-empty" in err


@pytest.mark.parametrize(
    "args",
    [
        ("jobs", "list", "--org", ""),
        ("jobs", "list", "--all", "--type", ""),
        ("jobs", "show", "x", "--org", ""),
        ("runs", "list", "--workflow", ""),
    ],
    ids=["list --org", "list --type", "show --org", "runs list --workflow"],
)
def test_an_empty_organization_or_type_is_bad_usage(args: tuple[str, ...], tmp_path: Path) -> None:
    # An empty --type listed nothing ("no jobs on the store"); an empty --org gave the API's
    # advice to use None. Both are refused as an empty id is, before the store is opened (and
    # an empty --workflow of runs list, which listed nothing).
    url = f"sqlite:///{tmp_path}/s.db"
    asyncio.run(gnl.upgrade(url))
    err = one_line_error(gnl_cmd(*args, "--url", url), 2)
    assert "non-empty" in err and "None" not in err, err


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "show", ""),
        ("runs", "resolve", "", "pay", "--retry"),
        ("runs", "resolve", "r1", "", "--retry"),
        ("triggers", "unschedule", ""),
        ("events", "retry", "", "c", "e1"),
        ("events", "retry", "t", "", "e1"),
        ("events", "retry", "t", "c", ""),
    ],
)
def test_an_empty_name_or_id_argument_is_bad_usage(args: tuple[str, ...], tmp_path: Path) -> None:
    # `triggers unschedule ''` said "no trigger ''" (exit 1) where `jobs show ''` is bad usage.
    url = f"sqlite:///{tmp_path}/s.db"
    asyncio.run(gnl.upgrade(url))
    err = one_line_error(gnl_cmd(*args, "--url", url), 2)
    assert "non-empty" in err, err


@pytest.mark.parametrize("args", [("jobs", "list", "--all"), ("upgrade",)])
@pytest.mark.parametrize("url", ["sqlite::memory:", "sqlite:///:memory:"])
def test_an_in_memory_store_is_bad_usage(args: tuple[str, ...], url: str) -> None:
    # `jobs list` advised `gnl upgrade sqlite::memory:`, which created a store and dropped it;
    # `sqlite:///:memory:` (SQLAlchemy's spelling) was a file name and hung for 30 s.
    err = one_line_error(gnl_cmd(*args, "--url", url), 2)
    assert "store of one process" in err and "upgrade sqlite::memory:" not in err, err


async def test_sqlite_memory_spelled_as_a_path_is_in_memory() -> None:
    # It opened a database of its own for each pooled connection: the pool timed out (30 s).
    async with await gnl.connect("sqlite:///:memory:") as st:
        await gnl.enqueue(st, "t", {"n": 1}, id="a")
        job = await gnl.get_job(st, "a")
        assert job is not None and job.state == "pending"


def test_an_empty_cancel_reason_is_bad_usage(tmp_path: Path) -> None:
    # It stored "canceled: " (an empty reason); leaving --reason out records the default.
    url = f"sqlite:///{tmp_path}/s.db"

    async def seed() -> None:
        async with await gnl.connect(url) as storage:
            await gnl.enqueue(storage.work, "t", {}, id="waiting")

    asyncio.run(seed())
    err = one_line_error(gnl_cmd("jobs", "cancel", "waiting", "--reason", "", "--url", url), 2)
    assert "--reason" in err and "non-empty" in err, err
    shown = json.loads(gnl_cmd("jobs", "show", "waiting", "--url", url, "--json").output)
    assert shown["state"] == "pending"


def test_an_empty_upgrade_url_is_bad_usage_not_gnl_url(tmp_path: Path) -> None:
    # `gnl upgrade ""` (an unset shell variable) upgraded GNL_URL's store instead.
    other = tmp_path / "other.db"
    r = gnl_cmd("upgrade", "", env={"GNL_URL": f"sqlite:///{other}"})
    assert "URL is empty" in one_line_error(r, 2)
    r = gnl_cmd("upgrade", "", "--url", f"sqlite:///{other}")
    assert "URL is empty" in one_line_error(r, 2)
    assert not other.exists()
    # Studio's URL argument too (it served GNL_URL's store).
    asyncio.run(gnl.upgrade(f"sqlite:///{other}"))
    r = gnl_cmd("studio", "", env={"GNL_URL": f"sqlite:///{other}"})
    assert "URL is empty" in one_line_error(r, 2)


def test_sqlite_url_query_parameters_are_refused_in_one_wording(tmp_path: Path) -> None:
    # `jobs list` said "no SQLite store at 'ws.db?mode=ro'" where `upgrade` said the query
    # parameters are not supported: the open's wording for every command.
    url = f"sqlite:///{tmp_path}/ws.db"
    asyncio.run(gnl.upgrade(url))
    for args in (("jobs", "list"), ("upgrade",)):
        err = one_line_error(gnl_cmd(*args, "--url", url + "?mode=ro"), 2)
        assert "query parameters are not supported" in err, (args, err)


def test_a_file_that_is_not_a_sqlite_database_is_named(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a database\n" * 10)
    for args in (("jobs", "list"), ("upgrade",)):
        err = one_line_error(gnl_cmd(*args, "--url", f"sqlite:///{text}"), 2)
        assert "notes.txt" in err and "is not a SQLite database" in err, (args, err)
    assert text.read_text().startswith("hello")


def test_retry_and_cancel_say_why_nothing_changed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"

    async def seed() -> None:
        async with await gnl.connect(url) as storage:
            await gnl.enqueue(storage.work, "t", {}, id="waiting", org_id="acme")

    asyncio.run(seed())
    # A job that exists: its state, and what the command needs of it.
    err = one_line_error(gnl_cmd("jobs", "retry", "waiting", "--org", "acme", "--url", url), 1)
    assert err == (
        "gnl: job 'waiting' in org 'acme' is pending; only a dead job can be retried, "
        "nothing changed"
    ), err
    # A job that does not exist: only that (no word on the states it would need).
    for command in ("retry", "cancel"):
        err = one_line_error(gnl_cmd("jobs", command, "nope", "--org", "acme", "--url", url), 1)
        assert err == "gnl: no job 'nope' in org 'acme'", err


@pytest.mark.parametrize("args", [(), ("jobs",), ("runs",)], ids=lambda a: " ".join(a) or "gnl")
def test_a_group_without_its_command_prints_its_help(args: tuple[str, ...]) -> None:
    r = gnl_cmd(*args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"Usage: gnl{''.join(' ' + a for a in args)} "), r.stderr
    assert "Commands:" in r.stderr and len(r.stderr.splitlines()) > 5, r.stderr


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("upgrade",),
        ("demo",),
        ("run",),
        ("studio",),
        ("jobs",),
        ("jobs", "list"),
        ("jobs", "show"),
        ("jobs", "retry"),
        ("jobs", "cancel"),
        ("runs",),
        ("runs", "list"),
        ("runs", "show"),
        ("runs", "resolve"),
        ("events",),
        ("events", "dead"),
        ("events", "retry"),
        ("triggers",),
        ("triggers", "list"),
        ("triggers", "unschedule"),
        ("cron",),
    ],
    ids=lambda a: " ".join(a) or "gnl",
)
def test_every_command_has_help_with_an_example(args: tuple[str, ...]) -> None:
    r = gnl_cmd(*args, "--help")
    assert r.exit_code == 0, r.output
    assert "Usage: gnl" in r.output
    examples = r.output.split("Examples:")[1].splitlines()[1:]
    assert examples and all(ln.startswith("    ") for ln in examples), r.output
    assert any(ln.strip().startswith("gnl ") for ln in examples), r.output


@pytest.mark.parametrize(
    "args, msg",
    [
        (("jobs", "show"), "Missing argument 'ID'; see gnl jobs show --help"),
        (("jobs", "list", "--state", "nope", "--url", "sqlite:///x.db"), "'--state'"),
        (("nope",), "No such command 'nope'; see gnl --help"),
        (("runs", "resolve", "r", "s", "--url", "sqlite:///x.db"), "exactly one of --value"),
        (("cron", "* * * * *", "-n", "0"), "'-n'"),
        # A suggestion keeps its question mark; the hint is a sentence of its own.
        (("jobs", "lst"), "Did you mean 'list'? See gnl jobs --help"),
        # Fire times print from year 1 to 9999: past either end is bad usage, not a traceback
        # (a negative one raised ValueError) or an empty list with exit 0.
        (("cron", "* * * * *", "--after", "99999999999999999"), "'--after'"),
        (("cron", "* * * * *", "--after", "-99999999999999"), "'--after'"),
        # Two stores named at once: neither is silently ignored.
        (
            ("upgrade", "sqlite:///a.db", "--url", "sqlite:///b.db"),
            "URL and --url name two stores; give one",
        ),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: tuple[str, ...], msg: str, tmp_path: Path) -> None:
    assert msg in one_line_error(gnl_cmd(*args), 2)


@pytest.mark.parametrize("command", ["studio", "upgrade"])
def test_an_optional_url_reads_optional_in_the_help(command: str) -> None:
    # URL or --url/GNL_URL: the usage line must not make URL look required, and the help
    # shows no reStructuredText markup.
    out = gnl_cmd(command, "--help").output
    assert f"gnl {command} [OPTIONS] [URL]" in out, out
    assert "``" not in out, out


def test_a_reader_that_closes_the_pipe_early_is_not_an_error(tmp_path: Path) -> None:
    # `gnl jobs list --json | head -1`: exit 0, nothing on stderr (click alone exits 1).
    url = f"sqlite:///{tmp_path}/s.db"

    async def fill() -> None:
        async with await gnl.connect(url) as st:
            await gnl.enqueue_many(
                st.work, [{"type": "t", "payload": {"i": i, "pad": "x" * 200}} for i in range(3000)]
            )

    asyncio.run(fill())
    p = subprocess.Popen(
        [sys.executable, "-m", "gnl", "jobs", "list", "--all", "--limit", "3000", "--json"],
        env={**os.environ, "GNL_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    assert json.loads(p.stdout.readline())["type"] == "t"
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=60) == 0, err
    assert err == ""
