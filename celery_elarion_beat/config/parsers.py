"""Parsers: turn a raw setting value into a checked one, or say what is wrong; and
the one writer of a duration for people (:func:`format_duration`), beside its reader.

Each parser takes the setting's key (to name it in the error) and the raw value
(from ``app.conf`` or the environment, so often a string) and returns the value
or raises :class:`~celery_elarion_beat.exceptions.ConfigurationError`. :mod:`.settings` declares
which parser each setting uses; the names of settings live only there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from ..exceptions import ConfigurationError

__all__ = ["Parser", "boolean", "choice", "count", "duration", "format_duration", "identifier",
           "number", "optional", "patterns", "seconds", "text"]

#: Turns a raw value into the setting's value, or raises ConfigurationError
#: naming the setting (the first argument).
Parser = Callable[[str, Any], Any]

#: One part of a duration: a number and its unit (``ms`` before ``m``: the longest wins).
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|[smhdw])\s*")
_BARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
#: Microseconds per unit, longest first: the order a duration's parts must come in.
_UNITS = {"w": 604_800_000_000, "d": 86_400_000_000, "h": 3_600_000_000, "m": 60_000_000,
          "s": 1_000_000, "ms": 1_000}
_US = 1_000_000
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def duration(name: str, value: str) -> timedelta:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w``, ``1h30m``, ``2h5m30s``,
    ``250ms``, ``1.5h`` -> timedelta (exact to the microsecond).

    A bare number counts seconds; parts come longest unit first, each once. Every
    text :func:`format_duration` writes reads back to the same duration.
    """
    text = str(value).strip()
    what = f"{name} {value!r}" if name else repr(value)
    bare = _BARE.match(text)
    total, at, last = Decimal(0), 0, -1
    if bare:
        total, at = Decimal(bare.group(1)) * _US, len(text)
    else:
        units = list(_UNITS)
        for part in _PART.finditer(text):
            order = units.index(part.group(2))
            if part.start() != at or order <= last:
                at = -1
                break
            total += Decimal(part.group(1)) * _UNITS[part.group(2)]
            at, last = part.end(), order
    if not text or at != len(text):
        raise ConfigurationError(f"{what} is not a duration; use e.g. 90s, 30m, 12h, 7d or "
                                 "1h30m")
    try:
        return timedelta(microseconds=int(total.to_integral_value()))
    except OverflowError:
        raise ConfigurationError(f"{what} is longer than any duration can be (at most "
                                 "999999999d)") from None


#: (below this many seconds, round to this many) of an approximate duration: about
#: two significant digits, as a person reads a runtime or a time left.
_APPROXIMATE = ((0.001, 0.000001), (0.01, 0.0001), (1, 0.001), (10, 0.1), (3600, 1),
                (86400, 60))


def format_duration(value: timedelta | float, precision: float | None = None, *,
                    approximate: bool = False) -> str:
    """A duration as people write it, and as :func:`duration` reads it back:
    ``7d``, ``1h``, ``90s``, ``1h30m``, ``2h5m30s``, ``1.5s``, ``250ms``; never
    ``7 days, 0:00:00`` or ``0:01:00``.

    *value* is a timedelta or a number of seconds. Days, hours, minutes and seconds
    follow each other, the units that are zero left out (weeks are written in days:
    ``14d``); a duration under two minutes that is no whole minute is written in
    seconds (``90s``, ``119.5s``), and one under a second in milliseconds
    (``250ms``, ``0.5ms``). *precision* rounds to a multiple of that many seconds
    first (``1`` for whole seconds; default: exact to the microsecond);
    *approximate* picks it by size instead, for about two significant digits
    (``4.2ms``, ``340ms``, ``1.3s``, ``1m16s``, ``2h6m``, ``3d4h``). A negative
    duration gets a ``-`` in front (which :func:`duration` does not read).
    """
    if isinstance(value, timedelta):
        micro = value // timedelta(microseconds=1)
    else:
        if not math.isfinite(value):
            return str(value)
        micro = round(value * _US)
    if approximate:
        size = abs(micro) / _US
        precision = next((p for below, p in _APPROXIMATE if size < below), 3600)
    if precision is not None and precision > 0:
        step = max(1, round(precision * _US))
        micro = (abs(micro) + step // 2) // step * step * (1 if micro >= 0 else -1)
    if micro < 0:
        return "-" + format_duration(timedelta(microseconds=-micro))
    if micro == 0:
        return "0s"
    if micro < _US:
        return _decimal(micro, 1_000) + "ms"
    if micro < 2 * _UNITS["m"] and micro % _UNITS["m"]:  # as a timeout is written
        return _decimal(micro, _US) + "s"
    parts = []
    for unit in ("d", "h", "m"):
        whole, micro = divmod(micro, _UNITS[unit])
        if whole:
            parts.append(f"{whole}{unit}")
    if micro:
        parts.append(_decimal(micro, _US) + "s")
    return "".join(parts)


def _decimal(amount: int, per: int) -> str:
    """*amount* / *per* written exactly, without trailing zeros (``1.5``, ``90``)."""
    whole, rest = divmod(amount, per)
    if not rest:
        return str(whole)
    digits = len(str(per)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"{name} must be true or false, not {value!r}")


def number(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ConfigurationError(f"{name} must be {what}, not {value!r}")
    try:
        number = float(getattr(value, "total_seconds", lambda: value)())
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{name} must be {what}, not {value!r}") from None
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} must be {what}, not {value!r}")
    return number


def seconds(maximum: float | None = None) -> Parser:
    def parse(name: str, value: Any) -> float:
        seconds = number(name, value, "a number of seconds")
        if not seconds > 0:
            raise ConfigurationError(f"{name} must be greater than 0 seconds, not {value!r}")
        if maximum is not None and seconds > maximum:
            raise ConfigurationError(f"{name} must be at most {maximum:g} seconds "
                                     f"({format_duration(maximum)}), not {value!r}")
        return seconds
    return parse


def count(maximum: int, minimum: int = 1) -> Parser:
    def parse(name: str, value: Any) -> int:
        whole = number(name, value, "a whole number")
        if whole != int(whole):
            raise ConfigurationError(f"{name} must be a whole number, not {value!r}")
        if not minimum <= whole <= maximum:
            raise ConfigurationError(f"{name} must be between {minimum} and {maximum}, "
                                     f"not {value!r}")
        return int(whole)
    return parse


def identifier(maximum: int = 63) -> Parser:
    def parse(name: str, value: Any) -> str:
        text = str(value)
        if not _IDENTIFIER.match(text) or len(text) > maximum:
            raise ConfigurationError(
                f"{name} = {value!r} is not a usable SQL identifier; use letters, digits and "
                f"underscores, starting with a letter or underscore, at most {maximum} "
                "characters" + (" (the name of the table's index is longer)"
                                if maximum < 63 else ""))
        return text
    return parse


def optional(parser: Parser) -> Parser:
    def parse(name: str, value: Any) -> Any:
        return None if value is None else parser(name, value)
    return parse


def choice(*allowed: str) -> Parser:
    def parse(name: str, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in allowed:
            raise ConfigurationError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                                     f"not {value!r}")
        return text
    return parse


def text(name: str, value: Any) -> str:
    """Any value, as text (checked by the setting's own rule afterwards)."""
    return str(value)


def patterns(name: str, value: Any) -> tuple[str, ...]:
    """Names or glob patterns: a list (or tuple, or set) of strings in ``app.conf``, or
    one comma-separated string (the environment's form). Blanks around each item are
    dropped, and so are empty items: ``""`` and ``[]`` are the empty list."""
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, (set, frozenset)):
        items = sorted(value, key=str)
    else:
        raise ConfigurationError(
            f"{name} must be a list of names or glob patterns (e.g. ['alice', "
            f"'*@example.com']) or one comma-separated string, not {value!r}")
    found: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigurationError(
                f"{name}: {item!r} is not a name or glob pattern; give strings, e.g. "
                "'alice' or '*@example.com'")
        if item.strip():
            found.append(item.strip())
    return tuple(found)
