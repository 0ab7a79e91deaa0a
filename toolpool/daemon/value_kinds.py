"""The kinds of value a setting takes: how each is read, and what it may be.

``parse(value, text=...)``: ``text`` is true for the environment and the command line,
where every value is a string to read; in the TOML file a value must have its type.
A value a kind does not take raises ``Refused``, whose message says what it does take;
``config.py`` turns that into a ``ConfigError`` naming the setting and its source.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Refused(Exception):
    """A value a kind does not take; the message says what it does take."""


@dataclass(frozen=True, slots=True)
class Integer:
    minimum: int
    metavar: str = "N"

    @property
    def allowed(self) -> str:
        return f"an integer of at least {self.minimum}"

    def parse(self, value: Any, *, text: bool) -> int:
        if text and isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise Refused(f"expected {self.allowed}")
        return value


@dataclass(frozen=True, slots=True)
class Number:
    minimum: float
    above: bool = False  # the minimum itself is not allowed
    metavar: str = "SECONDS"

    @property
    def allowed(self) -> str:
        bound = "more than" if self.above else "at least"
        return f"a number {bound} {self.minimum:g}"

    def parse(self, value: Any, *, text: bool) -> float:
        if text and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise Refused(f"expected {self.allowed}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refused(f"expected {self.allowed}")
        low = value <= self.minimum if self.above else value < self.minimum
        if not math.isfinite(value) or low:
            raise Refused(f"expected {self.allowed}")
        return float(value)


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True, slots=True)
class Boolean:
    metavar: str = "true|false"
    allowed: str = "true or false"

    def parse(self, value: Any, *, text: bool) -> bool:
        if text and isinstance(value, str) and value.strip().lower() in (*_TRUE, *_FALSE):
            return value.strip().lower() in _TRUE
        if not isinstance(value, bool):
            raise Refused(f"expected {self.allowed}")
        return value


@dataclass(frozen=True, slots=True)
class Choice:
    choices: tuple[str, ...]

    @property
    def metavar(self) -> str:
        return "|".join(self.choices)

    @property
    def allowed(self) -> str:
        return "one of " + ", ".join(self.choices)

    def parse(self, value: Any, *, text: bool) -> str:
        if not isinstance(value, str) or value.strip().lower() not in self.choices:
            raise Refused(f"expected {self.allowed}")
        return value.strip().lower()


@dataclass(frozen=True, slots=True)
class PathKind:
    metavar: str = "PATH"
    allowed: str = "a path"

    def parse(self, value: Any, *, text: bool) -> Path:
        if isinstance(value, Path):
            return value
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise Refused(f"expected {self.allowed}")
        return Path(os.path.expanduser(value.strip()))


@dataclass(frozen=True, slots=True)
class Address:
    metavar: str = "HOST:PORT"
    allowed: str = "HOST:PORT with a port from 0 (any free one) to 65535"

    def parse(self, value: Any, *, text: bool) -> str:
        if not isinstance(value, str):
            raise Refused(f"expected {self.allowed}")
        host, _, port = value.strip().rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise Refused(f"expected {self.allowed}")
        return value.strip()


@dataclass(frozen=True, slots=True)
class Names:
    """A list: in TOML a list of strings, as text comma-separated."""

    what: str  # "module names", "sandbox mechanisms" …
    choices: tuple[str, ...] | None = None
    pattern: str | None = None  # each name must match it whole
    unique: bool = False  # a set: kept as a frozenset

    @property
    def metavar(self) -> str:
        return "A,B,…"

    @property
    def allowed(self) -> str:
        if self.choices is not None:
            return f"a list of {self.what} from: {', '.join(self.choices)}"
        return f"a list of {self.what}"

    def parse(self, value: Any, *, text: bool) -> tuple[str, ...] | frozenset[str]:
        if text and isinstance(value, str):
            items: list[Any] = [s.strip() for s in value.split(",") if s.strip()]
        elif isinstance(value, list | tuple | frozenset):
            items = sorted(value) if isinstance(value, frozenset) else list(value)
        else:
            raise Refused(f"expected {self.allowed}")
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise Refused(f"expected {self.allowed}")
            if self.choices is not None and item not in self.choices:
                raise Refused(f"{item!r} is not allowed: expected {self.allowed}")
            if self.pattern is not None and not re.fullmatch(self.pattern, item):
                raise Refused(f"{item!r} is not allowed: expected {self.allowed}")
        return frozenset(items) if self.unique else tuple(items)


Kind = Integer | Number | Boolean | Choice | PathKind | Address | Names
