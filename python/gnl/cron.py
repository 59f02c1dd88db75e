"""Cron arithmetic: pure functions, no I/O (API.md "Scheduler").

Expressions are read exactly as Debian (Vixie) cron reads them, in UTC at minute resolution:
five fields (minute 0-59, hour 0-23, day-of-month 1-31, month 1-12, day-of-week 0-7); numbers,
``*``, ranges ``a-b``, lists, steps ``*/n``, ``a-b/n`` and ``a/n`` (= ``a-max/n``; the maximum is
7 for weekdays); month and weekday names (``JAN``-``DEC``, ``SUN``-``SAT``, any case); 0 and 7
both Sunday; and the macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``.
When both day fields are restricted a day matches either; a day field whose text starts with
``*`` is unrestricted, and then a day must match both (``0 0 */2 * 1``: odd days that are
Mondays; ``0 0 1-31 * 1``: every day). A step is any number >= 1, as Debian's: one past the
field's span gives the range's first value only (``*/61`` in the minute field is ``0``, as
``*/60`` is).

Refused with :class:`gnl.CronError`, whose message names the field: another number of fields
(a sixth, seconds or year, field too), values out of range, step 0, reversed ranges, the
extensions ``L W # ?``, and expressions that can never fire (``0 0 30 2 *``).

The arithmetic is the native core's (``rust/src/cron/``); these wrappers check the Python types.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from . import _native
from ._time import to_ms
from .errors import InvalidArgumentError

__all__ = ["cron_times", "next_cron_time", "parse_field"]

_I64_MIN = -(2**63)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def _instant(value: int | datetime) -> int:
    """``value`` (epoch ms or an aware datetime) as epoch ms; a datetime's sub-millisecond
    part is dropped (floor), so a fire time is never taken for one already past."""
    if isinstance(value, datetime):
        try:
            return (value - _EPOCH) // _MS
        except TypeError:  # naive (no UTC offset)
            pass
    return to_ms(value, "after_ms")


def _out_of_range(expr: str, after_ms: int) -> None:
    """For an ``after_ms`` outside the int64 range: refuse a bad ``expr`` first, then a
    value below it (after it there is no fire time: the caller answers None)."""
    _native.next_cron_time(expr, 0)
    if after_ms < _I64_MIN:
        raise InvalidArgumentError(f"after_ms must be >= {_I64_MIN}, got {after_ms}")


def next_cron_time(expr: str, after_ms: int | datetime) -> int | None:
    """The first fire time of ``expr`` strictly after ``after_ms``.

    Args:
        expr: A cron expression (see the module's docstring), evaluated in UTC.
        after_ms: An instant, epoch ms UTC, or an aware datetime.

    Returns:
        The fire time, epoch ms UTC (a whole minute), or None when there is none before the
        year 10000.

    Raises:
        gnl.CronError: ``expr`` is refused; the message names the field.
        TypeError: ``expr`` is not a str, or ``after_ms`` neither an int nor a datetime.
        gnl.InvalidArgumentError: ``after_ms`` is a naive datetime.
    """
    if type(after_ms) is not int:
        after_ms = _instant(after_ms)
    try:
        return _native.next_cron_time(expr, after_ms)
    except OverflowError:
        _out_of_range(expr, after_ms)
        return None


def cron_times(expr: str, after_ms: int | datetime, count: int) -> list[int]:
    """The next ``count`` fire times of ``expr`` strictly after ``after_ms``, in order.

    Args:
        expr: A cron expression (see the module's docstring), evaluated in UTC.
        after_ms: An instant, epoch ms UTC, or an aware datetime.
        count: How many fire times, 0 to 1,000,000.

    Returns:
        Up to ``count`` fire times, epoch ms UTC; fewer when the year 10000 comes first.

    Raises:
        gnl.CronError: ``expr`` is refused; the message names the field.
        TypeError: a wrong type (``count`` must be an int).
        gnl.InvalidArgumentError: ``count`` out of range, or ``after_ms`` a naive datetime.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, not {type(count).__name__}")
    if not 0 <= count <= 1_000_000:
        raise InvalidArgumentError(f"count must be in 0..1000000, got {count}")
    if type(after_ms) is not int:
        after_ms = _instant(after_ms)
    try:
        return _native.cron_times(expr, after_ms, count)
    except OverflowError:
        _out_of_range(expr, after_ms)
        return []


def parse_field(text: str, lo: int, hi: int) -> list[int]:
    """The values one cron field's text denotes over ``lo..hi``, sorted.

    The grammar is a cron field's (numbers, ``*``, ranges, lists, steps; ``a/n`` runs to
    ``hi``). The month range ``(1, 12)`` also takes ``JAN``-``DEC``; the day-of-week ranges
    ``(0, 7)`` and ``(0, 6)`` take ``SUN``-``SAT`` and answer Sunday as 0
    (``parse_field("5-7", 0, 7) == [0, 5, 6]``).

    Args:
        text: The field's text, e.g. ``"*/15"``.
        lo: The smallest value, >= 0.
        hi: The largest value, ``lo <= hi <= 59``.

    Returns:
        The sorted, distinct values.

    Raises:
        gnl.CronError: ``text`` is refused; the message names the field (by its range).
        TypeError: ``text`` is not a str, or ``lo``/``hi`` not ints.
        gnl.InvalidArgumentError: ``lo``/``hi`` outside ``0 <= lo <= hi <= 59``.
    """
    for name, v in (("lo", lo), ("hi", hi)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if not 0 <= lo <= hi <= 59:
        raise InvalidArgumentError(f"parse_field needs 0 <= lo <= hi <= 59, got lo={lo} hi={hi}")
    return _native.parse_field(text, lo, hi)
