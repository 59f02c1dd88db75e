"""Instants and durations at the API boundary: int epoch ms (UTC) or aware datetimes."""

from __future__ import annotations

import time
from datetime import datetime

from . import _native
from .errors import InvalidArgumentError


def to_ms(value: int | datetime, name: str) -> int:
    """Return ``value`` as epoch ms; an aware datetime is converted, a naive one refused.

    Raises:
        TypeError: ``value`` is neither an int nor a datetime.
        InvalidArgumentError: ``value`` is a naive datetime.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be int epoch ms or an aware datetime, not bool")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise InvalidArgumentError(
                f"{name} is a naive datetime; pass an aware one "
                "(e.g. tzinfo=datetime.timezone.utc) or epoch ms"
            )
        return round(value.timestamp() * 1000)
    raise TypeError(f"{name} must be int epoch ms or an aware datetime, not {type(value).__name__}")


#: The largest int a count or duration may be (2**53: exact in every JSON reader and in
#: every store's integer column).
MAX_INT = 2**53

#: The longest duration accepted, in ms (about ten years; the native core's clamp).
MAX_DURATION_MS = 315_360_000_000

#: The latest instant accepted, in epoch ms: the end of the year 9999 (the native core's
#: limit for ``run_at``).
MAX_INSTANT_MS: int = _native.MAX_INSTANT_MS

#: The shortest lease accepted, in ms (a job's ``ttl_ms``, a consumer's or a run's
#: ``lease_ms``, a fire lock's ``lock_ttl_ms``): each is renewed every third of it, and a
#: renewal must be answered within half of it, which a store round trip under load is not
#: within a few ms (docs/DECISIONS.md, "Leases are at least 100 ms").
MIN_LEASE_MS = 100


def check_int(value: object, name: str, minimum: int, maximum: int = MAX_INT) -> int:
    """Return ``value`` if it is an int in ``[minimum, maximum]``.

    Raises:
        TypeError: not an int (a bool is refused too).
        InvalidArgumentError: out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise InvalidArgumentError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_lease(value: object, name: str) -> int:
    """Return ``value`` if it is a lease duration: an int in ``[MIN_LEASE_MS,
    MAX_DURATION_MS]``.

    Raises:
        TypeError: not an int.
        InvalidArgumentError: out of range; a lease too short names why.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value < MIN_LEASE_MS:
        raise InvalidArgumentError(
            f"{name} must be >= {MIN_LEASE_MS} ms, got {value}: a lease is renewed every "
            "third of it, and a shorter one can lapse while its holder is alive"
        )
    return check_int(value, name, MIN_LEASE_MS, MAX_DURATION_MS)


def age_ms(sent: float) -> int:
    """Ms since ``sent`` (``time.monotonic()`` read before a lock's or lease's acquisition was
    sent), rounded up: the ``age_ms`` of the ``RunKeeper`` that renews it."""
    return int((time.monotonic() - sent) * 1000) + 1
