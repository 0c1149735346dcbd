"""Parsers: turn a raw setting value into a checked one, or say what is wrong.

Each parser takes the setting's key (to name it in the error) and the raw value
(from ``app.conf`` or the environment, so often a string) and returns the value
or raises :class:`~.exceptions.ConfigurationError`. :mod:`.settings` declares
which parser each setting uses; the names of settings live only there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .exceptions import ConfigurationError

__all__ = ["Parser", "boolean", "choice", "count", "duration", "identifier", "number",
           "optional", "seconds", "text"]

#: Turns a raw value into the setting's value, or raises ConfigurationError
#: naming the setting (the first argument).
Parser = Callable[[str, Any], Any]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def duration(name: str, value: str) -> timedelta:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` -> timedelta."""
    match = _DURATION.match(value)
    if not match:
        raise ConfigurationError(f"{name} {value!r} is not a duration; use e.g. 90s, 30m, "
                                 "12h, 7d")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


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
            raise ConfigurationError(f"{name} must be at most {maximum:g} seconds, "
                                     f"not {value!r}")
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
