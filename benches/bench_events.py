"""The event log on each engine (issue 12's bench bars), gnl beside a raw-driver anchor, one run:

* ``emit_many``: one ``gnl.emit_many`` of N events (payload ``_servers.payload(i)``, id
  ``ev:<i>``, org ``acme``) on a fresh topic, against the raw driver's bulk insert of the same
  rows (JSON-encoded in the timed region too) into a table of the same shape as
  ``gnl_events`` (same keys: ``(topic, seq)`` and unique ``(topic, id)``; MySQL's unique
  SHA-256 id key too): ``sqlite3`` ``executemany`` in one transaction, psycopg 3 ``COPY``,
  pymysql ``executemany`` (multi-row INSERT), each one commit. Bar: at most 2x.
* ``emit``: N single ``gnl.emit`` calls (each its own transaction), against a plain loop of
  N committed single-row inserts of the same rows (autocommit).
* ``consume``: N events consumed by each of two consumer names (``drain()``, a no-op async
  handler; one name after the other, each timed), against a plain Python loop per name that
  in one transaction per event selects the next event past its cursor, hands it to the same
  no-op handler (``json.loads`` of the payload) and updates its cursor row. Per-name rate.
  Bar: gnl at least 3x the plain loop on Postgres and MySQL, 2x on SQLite. Also gnl alone
  consuming the N events of ``emit_many`` (a backlog of N) with two names.

SQLite anchors run with gnl's pragmas (WAL, synchronous=NORMAL). Each contender R times
(fresh topic / tables each), medians; ``emit`` and ``consume`` use ``N1`` events (default
N). Servers: ``PG_URL`` (default ``postgres://postgres@127.0.0.1:5432/gnl_bench_events``,
created if missing; its schemas ``gnl_bench_events`` and ``raw_bench_events`` are dropped and
made again) and ``MYSQL_URL`` (databases ``<db>_gnl_events`` / ``<db>_raw_events``).

    N=30000 R=3 .venv/bin/python benches/bench_events.py     # ENGINES=sqlite,postgres,mysql
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PG_URL", "postgres://postgres@127.0.0.1:5432/gnl_bench_events")

import _common as c  # noqa: E402
import _servers as srv  # noqa: E402
import gnl  # noqa: E402

N = c.env_int("N", 30_000)
N1 = c.env_int("N1", N)
R = c.env_int("R", 3)
ENGINES = os.environ.get("ENGINES", "sqlite,postgres,mysql").split(",")
ORG = "acme"

RAW_DDL = {
    "sqlite": """
        CREATE TABLE raw_events (topic TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL,
          org TEXT NOT NULL, payload TEXT NOT NULL, deliver_at INTEGER NOT NULL,
          emitted_at INTEGER NOT NULL, PRIMARY KEY (topic, seq), UNIQUE (topic, id))
          WITHOUT ROWID;
        CREATE TABLE raw_cursors (topic TEXT NOT NULL, name TEXT NOT NULL,
          cursor_seq INTEGER NOT NULL, PRIMARY KEY (topic, name));
    """,
    "postgres": """
        CREATE TABLE raw_events (topic text COLLATE "C" NOT NULL, seq bigint NOT NULL,
          id text COLLATE "C" NOT NULL, org text NOT NULL, payload text NOT NULL,
          deliver_at bigint NOT NULL, emitted_at bigint NOT NULL,
          PRIMARY KEY (topic, seq), UNIQUE (topic, id));
        CREATE TABLE raw_cursors (topic text NOT NULL, name text NOT NULL,
          cursor_seq bigint NOT NULL, PRIMARY KEY (topic, name));
    """,
    "mysql": """
        CREATE TABLE raw_events (topic VARBINARY(800) NOT NULL, seq BIGINT NOT NULL,
          id VARBINARY(4000) NOT NULL, id_key BINARY(32) AS (UNHEX(SHA2(id, 256))) STORED,
          org VARBINARY(800) NOT NULL,
          payload LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
          deliver_at BIGINT NOT NULL, emitted_at BIGINT NOT NULL,
          PRIMARY KEY (topic, seq), UNIQUE KEY raw_events_id (topic, id_key)) ENGINE=InnoDB;
        CREATE TABLE raw_cursors (topic VARBINARY(800) NOT NULL, name VARBINARY(800) NOT NULL,
          cursor_seq BIGINT NOT NULL, PRIMARY KEY (topic, name)) ENGINE=InnoDB;
    """,
}
COLS = "topic, seq, id, org, payload, deliver_at, emitted_at"


def pg_url(db: str | None = None) -> str:
    u = srv.PG_URL.replace("postgres://", "postgresql://", 1)
    return u if db is None else u.rsplit("/", 1)[0] + f"/{db}"


def pg_setup() -> tuple[str, str]:
    """Create the bench database if missing, fresh schemas; (gnl URL, raw search_path)."""
    import psycopg

    db = pg_url().rsplit("/", 1)[1]
    with psycopg.connect(pg_url("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone():
            conn.execute(f'CREATE DATABASE "{db}"')
    with psycopg.connect(pg_url(), autocommit=True) as conn:
        for s in ("gnl_bench_events", "raw_bench_events"):
            conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{s}"')
    return srv.pg_schema_url("gnl_bench_events"), "raw_bench_events"


class Raw:
    """The anchor's connection (autocommit; transactions explicit)."""

    def __init__(self, engine: str, work: c.Workdir) -> None:
        self.engine = engine
        self.ph = "?" if engine == "sqlite" else "%s"
        self.conn: Any
        if engine == "sqlite":
            self.conn = c.anchor_connect(work.fresh("raw"), create=False)
        elif engine == "postgres":
            import psycopg

            self.conn = psycopg.connect(pg_url(), autocommit=True)
            self.conn.execute("SET search_path TO raw_bench_events")
        else:
            import pymysql

            p = srv.mysql_params()
            p["database"] = srv.mysql_fresh("raw_events").rsplit("/", 1)[1]
            self.conn = pymysql.connect(**p, autocommit=True, charset="utf8mb4")
        self.cur = self.conn.cursor()

    def run(self, sql: str, params: Any = ()) -> None:
        self.cur.execute(sql, params)

    def fresh_tables(self) -> None:
        for t in ("raw_events", "raw_cursors"):
            self.run(f"DROP TABLE IF EXISTS {t}")
        for stmt in RAW_DDL[self.engine].split(";"):
            if stmt.strip():
                self.run(stmt)

    def begin(self) -> None:
        self.run("BEGIN")

    def commit(self) -> None:
        self.run("COMMIT")

    def bulk(self, topic: str, n: int) -> None:
        """The raw bulk insert of n events (JSON encoding included), one commit."""
        now = c.now_ms()
        rows = [
            (topic, i + 1, f"ev:{i}", ORG, json.dumps(srv.payload(i)), now, now) for i in range(n)
        ]
        if self.engine == "postgres":
            with (
                self.conn.transaction(),
                self.cur.copy(f"COPY raw_events ({COLS}) FROM STDIN") as cp,
            ):
                for r in rows:
                    cp.write_row(r)
            return
        sql = f"INSERT INTO raw_events ({COLS}) VALUES ({', '.join([self.ph] * 7)})"
        self.begin()
        self.cur.executemany(sql, rows)
        self.commit()

    def singles(self, topic: str, n: int) -> None:
        sql = f"INSERT INTO raw_events ({COLS}) VALUES ({', '.join([self.ph] * 7)})"
        for i in range(n):
            now = c.now_ms()
            self.run(sql, (topic, i + 1, f"ev:{i}", ORG, json.dumps(srv.payload(i)), now, now))

    def consume(self, topic: str, name: str, handler: Callable[[Any], None]) -> int:
        """The plain per-event loop for consumer ``name``: events handled."""
        p = self.ph
        self.run(f"INSERT INTO raw_cursors VALUES ({p}, {p}, 0)", (topic, name))
        nxt = (
            f"SELECT seq, id, payload FROM raw_events WHERE topic = {p} AND seq > {p} "
            "ORDER BY seq LIMIT 1"
        )
        upd = f"UPDATE raw_cursors SET cursor_seq = {p} WHERE topic = {p} AND name = {p}"
        cursor, done = 0, 0
        while True:
            self.begin()
            self.run(nxt, (topic, cursor))
            row = self.cur.fetchone()
            if row is None:
                self.commit()
                return done
            handler(json.loads(row[2]))
            self.run(upd, (row[0], topic, name))
            self.commit()
            cursor, done = row[0], done + 1

    def close(self) -> None:
        self.conn.close()


def noop_sync(payload: Any) -> None:
    pass


async def noop(payload: Any, meta: gnl.EventMeta) -> None:
    pass


def events(n: int) -> list[dict[str, Any]]:
    return [{"payload": srv.payload(i), "id": f"ev:{i}", "org_id": ORG} for i in range(n)]


def timed(fn: Callable[[], Any]) -> float:
    c.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


async def atimed(coro: Any) -> tuple[float, Any]:
    c.collect()
    t = time.perf_counter()
    out = await coro
    return time.perf_counter() - t, out


async def consume_two(w: gnl.WorkStore, topic: str, n: int) -> list[float]:
    """Drain ``topic``'s n events with two consumer names, one after the other: their times."""
    out = []
    for name in ("fulfilment", "audit"):
        dt, res = await atimed(gnl.create_consumer(w, topic, noop, name=name).drain())
        assert res == gnl.DrainResult(n, n, 0), res
        out.append(dt)
    return out


async def gnl_runs(url: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"emit_many": [], "emit": [], "consume": [], "consume_n": []}
    async with await gnl.connect(url) as st:
        w = st.work
        await gnl.emit_many(w, "warm", events(100))
        for r in range(R):
            evs = events(N)
            dt, ids = await atimed(gnl.emit_many(w, f"many-{r}", evs))
            assert len(ids) == N
            out["emit_many"].append(dt)
            # gnl alone: the N events of emit_many consumed by two names (a backlog of N).
            out["consume_n"] += await consume_two(w, f"many-{r}", N)

            async def singles(topic: str) -> None:
                for i in range(N1):
                    await gnl.emit(w, topic, srv.payload(i), id=f"ev:{i}", org_id=ORG)

            dt, _ = await atimed(singles(f"one-{r}"))
            out["emit"].append(dt)
            # Consume the single-emit topic (N1 events) with two names, one after the other.
            out["consume"] += await consume_two(w, f"one-{r}", N1)
    return out


def raw_runs(engine: str, work: c.Workdir) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"emit_many": [], "emit": [], "consume": []}
    raw = Raw(engine, work)
    try:
        raw.fresh_tables()
        raw.bulk("warm", 100)
        for r in range(R):
            raw.fresh_tables()
            out["emit_many"].append(timed(lambda r=r: raw.bulk(f"many-{r}", N)))
            out["emit"].append(timed(lambda r=r: raw.singles(f"one-{r}", N1)))
            for name in ("fulfilment", "audit"):
                t = time.perf_counter()
                got = raw.consume(f"one-{r}", name, noop_sync)
                out["consume"].append(time.perf_counter() - t)
                assert got == N1, got
    finally:
        raw.close()
    return out


def med(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


async def engine_url(engine: str, work: c.Workdir) -> str:
    if engine == "postgres":
        return pg_setup()[0]
    if engine == "mysql":
        return srv.mysql_fresh("gnl_events")
    return c.sqlite_url(work.fresh("gnl"))


def main() -> None:
    c.header("bench_events: emit_many, emit, consume (issue 12)", N=N, N1=N1, R=R)
    if "postgres" in ENGINES:
        import psycopg

        with psycopg.connect(pg_url("postgres")) as conn:
            v = conn.execute("SHOW server_version").fetchone()
        print(f"  PostgreSQL {v[0] if v else '?'} at {srv.PG_URL}", flush=True)
    if "mysql" in ENGINES:
        print(f"  MySQL/MariaDB {srv.mysql_version()} at {srv.MYSQL_URL}", flush=True)
    work = c.Workdir()
    bars = {"sqlite": 2.0, "postgres": 3.0, "mysql": 3.0}
    try:
        for engine in ENGINES:
            url = asyncio.run(engine_url(engine, work))
            g = asyncio.run(gnl_runs(url))
            a = raw_runs(engine, work)
            for what, n in (("emit_many", N), ("emit", N1), ("consume", N1)):
                gm, am = med(g[what])[0], med(a[what])[0]
                if what == "consume":
                    ratio = am / gm
                    line = (
                        f"{engine:8} consume (per name) gnl {n / gm:,.0f} ev/s "
                        f"[{n / max(g[what]):,.0f}-{n / min(g[what]):,.0f}]  plain loop "
                        f"{n / am:,.0f} ev/s  ratio {ratio:.2f}x (bar >= {bars[engine]}x)"
                    )
                else:
                    ratio = gm / am
                    bar = "  (bar <= 2x)" if what == "emit_many" else ""
                    line = (
                        f"{engine:8} {what:9} gnl {c.fmt_s(*med(g[what]))}  anchor "
                        f"{c.fmt_s(*med(a[what]))}  ratio {ratio:.2f}x{bar}"
                    )
                print(line, flush=True)
            line = f"{engine:8} consume (per name, gnl alone, backlog {N:,}) " + (
                f"{N / med(g['consume_n'])[0]:,.0f} ev/s"
            )
            print(line, flush=True)
            if engine == "mysql":
                for s in ("gnl_events", "raw_events"):
                    srv.mysql_drop(s)
    finally:
        work.cleanup()
    print("load average at end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
