"""Next cron time from Python: ``gnl.next_cron_time`` vs croniter and croniter-rs (and cronsim).

The work is the peerbench's ``cron_next_py.py`` (``../shared/peerbench``): for each of its five
expressions, parse the expression and compute the next fire time after ``START`` (an aware
datetime, 2026-01-01T00:00Z), N times; the figure is calls per second.

* gnl: ``gnl.next_cron_time(expr, START)``: the public function with the datetime (converted
  to epoch ms), the expression parsed on every call (gnl keeps no parse cache), the result an
  int. ``gnl (int ms)`` passes ``START`` as epoch ms instead (what the scheduler does).
* croniter (**anchor of the first bar**): ``croniter.croniter(expr, START).get_next(float)``.
* croniter-rs (**anchor of the second bar**): ``croniter_rs.croniter(expr, START).get_next(float)``.
* cronsim (for reference): ``next(cronsim.CronSim(expr, START))``.

Each contender runs N calls per repetition, the contenders alternating, R repetitions after
one warm-up; the figure is the median rate (min-max in brackets). Before timing, every
contender's answer is checked against gnl's.

Issue bars (issue 11): gnl >= 100x croniter and >= 2x croniter-rs on every expression.

    N=20000 R=7 .venv/bin/python benches/bench_cron.py
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from importlib.metadata import version

import croniter
import croniter_rs
import cronsim

import gnl
from _common import env_int, header, summary

EXPRS = ["0 3 * * *", "*/5 * * * *", "0 0 29 2 *", "15,45 9-17 * * 1-5", "0 0 1 */3 *"]
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
START_MS = int(START.timestamp() * 1000)


def rate(fn: Callable[[], object], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t)


def contenders(e: str) -> dict[str, Callable[[], object]]:
    return {
        "gnl": lambda: gnl.next_cron_time(e, START),
        "gnl (int ms)": lambda: gnl.next_cron_time(e, START_MS),
        "croniter": lambda: croniter.croniter(e, START).get_next(float),
        "croniter-rs": lambda: croniter_rs.croniter(e, START).get_next(float),
        "cronsim": lambda: next(cronsim.CronSim(e, START)),
    }


def check(e: str) -> None:
    want = gnl.next_cron_time(e, START)
    assert want is not None
    got = {
        "croniter": croniter.croniter(e, START).get_next(float) * 1000,
        "croniter-rs": croniter_rs.croniter(e, START).get_next(float) * 1000,
        "cronsim": next(cronsim.CronSim(e, START)).timestamp() * 1000,
    }
    for name, v in got.items():
        assert round(v) == want, f"{e!r}: {name} says {v}, gnl {want}"


def main() -> None:
    n = env_int("N", 20_000)
    r = env_int("R", 7)
    header("next cron time from Python (parse + next), calls/s", anchor=False, N=n, R=r)
    peers = ", ".join(f"{p} {version(p)}" for p in ("croniter", "croniter-rs", "cronsim"))
    print(f"  peers: {peers}; gnl parses on every call (no parse cache)")
    worst_it = worst_rs = float("inf")
    for e in EXPRS:
        check(e)
        fns = contenders(e)
        for fn in fns.values():
            rate(fn, min(n, 2_000))
        rates: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(r):
            for k, fn in fns.items():
                rates[k].append(rate(fn, n))
        med = {k: summary(v) for k, v in rates.items()}
        g = med["gnl"][0]
        x_it, x_rs = g / med["croniter"][0], g / med["croniter-rs"][0]
        worst_it, worst_rs = min(worst_it, x_it), min(worst_rs, x_rs)
        cells = "  ".join(f"{k} {m:,.0f}/s ({lo:,.0f}-{hi:,.0f})" for k, (m, lo, hi) in med.items())
        print(f"{e!r:22s} {cells}")
        print(
            f"{'':22s} gnl/croniter {x_it:.0f}x, gnl/croniter-rs {x_rs:.2f}x, "
            f"gnl (int ms)/croniter-rs {med['gnl (int ms)'][0] / med['croniter-rs'][0]:.2f}x, "
            f"gnl/cronsim {g / med['cronsim'][0]:.0f}x"
        )
    print(
        f"worst over the five: gnl/croniter {worst_it:.0f}x (bar >= 100x: "
        f"{'met' if worst_it >= 100 else 'NOT met'}), gnl/croniter-rs {worst_rs:.2f}x "
        f"(bar >= 2x: {'met' if worst_rs >= 2 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
