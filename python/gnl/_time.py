"""Instants and durations at the API boundary: int epoch ms (UTC) or aware datetimes."""

from __future__ import annotations

from datetime import datetime

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


def check_int(value: object, name: str, minimum: int) -> int:
    """Return ``value`` if it is an int >= ``minimum``.

    Raises:
        TypeError: not an int (a bool is refused too).
        InvalidArgumentError: below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value
