"""Field checks derived from the message classes' own type hints.

For each dataclass that crosses the wire (a message, or a struct inside one such as
``CallContext``), ``struct(cls)`` reads ``typing.get_type_hints`` once and compiles
one check per field: it checks a decoded value against the field's type — shallow
where the type says ``Any`` — and turns wire forms back into the declared ones (a
string into its ``StrEnum`` member, a map into a nested struct, an array into a
tuple). A value that does not fit raises ``ProtocolError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import operator
import types
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Union, get_args, get_origin, get_type_hints

from toolpool.frozen import maker
from toolpool.protocol.kinds import ProtocolError

# A check of one field: isinstance against a tuple of types (the common case, done
# inline), or a function from the decoded value to the value to store.
Convert = Callable[[Any], Any]
Check = tuple[type, ...] | Convert

# A field's metadata for a field added to a message after peers were released: it is
# left out of the frame while it holds its default, so that such a message is the same
# bytes as before the field existed, and a peer that does not know it still reads it.
OMITTED_AT_DEFAULT: Mapping[str, Any] = types.MappingProxyType({"wire": "omitted at default"})


class _Wrong(Exception):
    """A value that does not fit; ``path`` grows as it travels up (".context", "[2]")."""

    def __init__(self, text: str, *, whole: bool = False) -> None:
        self.text = text
        self.whole = whole  # about the struct as a whole (a missing field…)
        self.path: list[str] = []

    def render(self, where: str) -> str:
        at = where + "".join(reversed(self.path))
        return f"bad {at}: {self.text}" if self.whole else f"{at} {self.text}"


class Struct:
    """How one dataclass is read from a decoded map."""

    def __init__(self, cls: type[Any]) -> None:
        hints = get_type_hints(cls)
        self.cls = cls
        self.names = tuple(f.name for f in dataclasses.fields(cls))
        checks = {name: _check(hints[name]) for name in self.names}
        self._checks: dict[str, Check] = {n: c for n, c in checks.items() if c is not None}
        # Fields holding a nested struct, packed as the map of its fields.
        self._nested = tuple(
            n
            for n in self.names
            if isinstance(hints[n], type) and dataclasses.is_dataclass(hints[n])
        )
        self._omitted = tuple(
            (f.name, f.default)
            for f in dataclasses.fields(cls)
            if f.metadata.get("wire") == OMITTED_AT_DEFAULT["wire"]
        )
        if any(default is dataclasses.MISSING for _, default in self._omitted):
            raise TypeError(f"{cls.__name__}: a field omitted at its default needs a default")
        # The fast way (``_build``): by position, every field there, nothing else.
        self._defaults = dict(self._omitted)
        index = {name: i for i, name in enumerate(self.names)}
        self._plain = tuple((index[n], c) for n, c in self._checks.items() if type(c) is tuple)
        self._converted = tuple(
            (index[n], c) for n, c in self._checks.items() if type(c) is not tuple
        )
        positional = all(f.init and not f.kw_only for f in dataclasses.fields(cls))
        self._count = len(self.names) if positional else -1  # -1: never the fast way
        self._values = _getter(self.names)
        self._make = maker(cls)  # every field's value, in order: without __init__
        # build(body, where): an instance of the class from ``body`` (its fields by
        # name); ``where`` names it in errors (about a field: ``where.field``; about
        # the whole: the message).
        self.build: Callable[[dict[str, Any], str], Any] = (
            _compiled(self) if positional else self._checked
        )

    def _checked(self, body: dict[str, Any], where: str) -> Any:
        """``build`` the way that names what is wrong; any fault a ProtocolError."""
        try:
            return self._build(body)
        except _Wrong as wrong:
            if wrong.whole and not wrong.path:
                raise ProtocolError(f"bad {where} message: {wrong.text}") from None
            raise ProtocolError(wrong.render(where)) from None

    def _build(self, body: dict[str, Any]) -> Any:
        """The instance; the common case (every field there, each fits) the fast way,
        anything else the way that names what is wrong (``_build_by_name``)."""
        given = body
        if self._defaults and len(given) != self._count:
            given = self._defaults | body  # fields left out at their defaults
        if len(given) == self._count:
            try:
                values = self._values(given)
            except KeyError:  # an unknown field in place of a known one
                return self._build_by_name(body)
            for i, kinds in self._plain:
                if not isinstance(values[i], kinds):
                    return self._build_by_name(body)
            try:
                converted = None  # a copy of values, once one is converted
                for i, convert in self._converted:
                    value = values[i]
                    new = convert(value)  # type: ignore[operator]
                    if new is not value:
                        converted = list(values) if converted is None else converted
                        converted[i] = new
                return self._make(*(values if converted is None else converted))
            except (_Wrong, TypeError):
                pass
        return self._build_by_name(body)

    def _build_by_name(self, body: dict[str, Any]) -> Any:
        values = None  # a copy of body, once a value is converted
        for name, check in self._checks.items():
            if name not in body:
                continue  # a default, or a missing field the constructor names
            value = body[name]
            if type(check) is tuple:
                if not isinstance(value, check):
                    raise _named(_mismatch(value, check), "." + name)
            else:
                try:
                    new = check(value)  # type: ignore[operator]
                except _Wrong as wrong:
                    raise _named(wrong, "." + name) from None
                if new is not value:
                    values = dict(body) if values is None else values
                    values[name] = new
        try:
            return self.cls(**(body if values is None else values))
        except TypeError as exc:  # an unknown or a missing field
            raise _Wrong(str(exc), whole=True) from None

    def to_map(self, value: Any, head: dict[str, Any] | None = None) -> dict[str, Any]:
        """``value``'s fields by name, nested structs as maps: what msgpack packs;
        after the entries of ``head`` when given (a frame's type comes first)."""
        body = {} if head is None else head
        for name in self.names:
            body[name] = getattr(value, name)
        for name in self._nested:
            body[name] = struct(type(body[name])).to_map(body[name])
        for name, default in self._omitted:
            if body[name] == default:
                del body[name]
        return body


def _compiled(reader: Struct) -> Callable[[dict[str, Any], str], Any]:
    """``reader.build`` written out for its class, as dataclasses writes ``__init__``:
    the common case (every field there, nothing else, each value fits) is one call,
    its fields read, checked and stored inline; anything else goes to the way by name
    (``_checked``), which is the authority on what a frame means and says what is
    wrong with it. A frame is read the same either way (tests/test_protocol.py)."""
    defaults = dict(reader._omitted)
    scope: dict[str, Any] = {
        "slow": reader._checked,
        "make": reader._make,
        "Wrong": _Wrong,
        "MISSING": dataclasses.MISSING,
    }
    fetch, test, convert = [], [], []
    for i, name in enumerate(reader.names):
        if name in defaults:  # left out of the frame at its default
            scope[f"d{i}"] = defaults[name]
            fetch += [
                f"        v{i} = body.get({name!r}, MISSING)",
                f"        if v{i} is MISSING:",
                f"            v{i} = d{i}",
                "            size -= 1",
            ]
        else:
            fetch.append(f"        v{i} = body[{name!r}]")
        check = reader._checks.get(name)
        if type(check) is tuple:
            scope[f"k{i}"] = check
            test.append(f" or not isinstance(v{i}, k{i})")
        elif check is not None:
            scope[f"c{i}"] = check
            convert.append(f"        v{i} = c{i}(v{i})")
    values = ", ".join(f"v{i}" for i in range(len(reader.names)))
    source = "\n".join(
        [
            "def build(body, where):",
            f"    size = {len(reader.names)}",
            "    try:",
            *(fetch or ["        pass"]),
            "    except KeyError:",
            "        return slow(body, where)",
            f"    if len(body) != size{''.join(test)}:",
            "        return slow(body, where)",
            "    try:",
            *convert,
            f"        return make({values})",
            "    except (Wrong, TypeError):",
            "        return slow(body, where)",
        ]
    )
    exec(source, scope)
    build: Callable[[dict[str, Any], str], Any] = scope["build"]
    build.__qualname__ = build.__name__ = f"build_{reader.cls.__name__}"
    return build


def _getter(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A function from a map to the tuple of its values at ``names`` (KeyError if one
    is missing); ``itemgetter``'s, in C, for two names or more."""
    if len(names) >= 2:
        return operator.itemgetter(*names)
    if names:
        (name,) = names
        return lambda body: (body[name],)
    return lambda body: ()


_STRUCTS: dict[type[Any], Struct] = {}


def struct(cls: type[Any]) -> Struct:
    """The reader of ``cls``, made at its first use."""
    reader = _STRUCTS.get(cls)
    if reader is None:
        reader = _STRUCTS[cls] = Struct(cls)
    return reader


def wire_form(value: Any) -> Any:
    """msgpack's ``default``: a nested struct (``CallContext``) as the map of its fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return struct(type(value)).to_map(value)
    raise TypeError(f"cannot pack a {type(value).__name__}")


# --- compiling the checks ------------------------------------------------------------


def _check(hint: Any) -> Check | None:
    """The check of one type; None when anything goes (``Any``). A type the wire
    cannot carry is a TypeError when the message classes are read, not at decode."""
    if hint is Any:
        return None
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return _union(hint)
    if origin in (list, tuple):
        return _array(hint)
    if origin is dict:
        return _map(hint)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _enum(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _struct(hint)
    if hint is float:
        return (int, float)
    if hint in (str, int, bool, bytes, type(None)):
        return (hint,)
    raise TypeError(f"the wire cannot carry {hint!r}")


def _named(wrong: _Wrong, step: str) -> _Wrong:
    wrong.path.append(step)
    return wrong


def _mismatch(value: Any, kinds: tuple[type, ...], expected: str | None = None) -> _Wrong:
    if expected is None:
        expected = "float" if float in kinds else " | ".join(_name(k) for k in kinds)
    return _Wrong(f"is a {type(value).__name__}, not {expected}")


def _name(hint: Any) -> str:
    if hint is type(None):
        return "None"
    if isinstance(hint, type) and get_origin(hint) is None:
        return hint.__name__
    return str(hint).replace("typing.", "")


def _as_function(check: Check, expected: str) -> Convert:
    if type(check) is not tuple:
        return check  # type: ignore[return-value]
    kinds: tuple[type, ...] = check

    def instance(value: Any) -> Any:
        if not isinstance(value, kinds):
            raise _mismatch(value, kinds, expected)
        return value

    return instance


def _union(hint: Any) -> Check | None:
    options = [o for o in get_args(hint) if o is not type(None)]
    nullable = len(options) < len(get_args(hint))
    maybe = [_check(o) for o in options]
    checks = [c for c in maybe if c is not None]
    if len(checks) < len(maybe):
        return None
    if all(type(c) is tuple for c in checks):  # int | None, str | None…
        kinds = tuple(k for c in checks for k in c)  # type: ignore[union-attr]
        return (*kinds, type(None)) if nullable else kinds
    expected = " | ".join(_name(o) for o in options)
    functions = [_as_function(c, _name(o)) for c, o in zip(checks, options, strict=True)]

    def either(value: Any) -> Any:
        if value is None and nullable:
            return None
        for convert in functions:
            try:
                return convert(value)
            except _Wrong:
                if len(functions) == 1:
                    raise
        raise _Wrong(f"is a {type(value).__name__}, not {expected}")

    return either


def _array(hint: Any) -> Check:
    origin, args = get_origin(hint), get_args(hint)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        raise TypeError(f"only tuple[X, ...] crosses the wire, not {hint!r}")
    item = _check(args[0]) if args else None
    expected = _name(hint)
    item_of = None if item is None else _as_function(item, _name(args[0]))
    plain = item if type(item) is tuple else None  # items checked inline, not converted

    def array(value: Any) -> Any:
        if plain is not None and type(value) in (list, tuple):
            # The common case, without a call or a copy per item: every item fits.
            for v in value:
                if not isinstance(v, plain):
                    break
            else:
                return value if type(value) is origin else origin(value)
        if not isinstance(value, (list, tuple)):
            raise _mismatch(value, (), expected)
        if item_of is not None:
            out = []
            for i, v in enumerate(value):
                try:
                    out.append(item_of(v))
                except _Wrong as wrong:
                    raise _named(wrong, f"[{i}]") from None
            value = out
        return value if type(value) is origin else origin(value)

    return array


def _map(hint: Any) -> Check:
    args = get_args(hint)
    item = _check(args[1]) if args else None
    if item is None:
        return (dict,)  # dict[str, Any]: msgpack's strict_map_key keeps the keys plain
    expected = _name(hint)
    item_of = _as_function(item, _name(args[1]))
    plain = item if type(item) is tuple else None  # values checked inline, not converted

    def mapping(value: Any) -> Any:
        if plain is not None and type(value) is dict:
            for v in value.values():
                if not isinstance(v, plain):
                    break
            else:
                return value
        if not isinstance(value, dict):
            raise _mismatch(value, (), expected)
        out: dict[Any, Any] | None = None  # a copy, once a value is converted
        for k, v in value.items():
            try:
                new = item_of(v)
            except _Wrong as wrong:
                raise _named(wrong, f"[{k!r}]") from None
            if new is not v:
                out = dict(value) if out is None else out
                out[k] = new
        return value if out is None else out

    return mapping


def _enum(cls: type[Enum]) -> Check:
    members = {m.value: m for m in cls}
    allowed = ", ".join(repr(v) for v in members)

    def member(value: Any) -> Any:
        if not isinstance(value, str):
            raise _mismatch(value, (), cls.__name__)
        found = members.get(value)
        if found is None:
            raise _Wrong(f"is {value!r}, not one of {allowed}")
        return found

    return member


def _struct(cls: type[Any]) -> Check:
    """A nested struct's check. The last map read and what it made are kept: the
    structs are frozen, and one arrives again and again (every ``Execute`` of a
    session carries the same ``CallContext``). A map equal to the last one, value
    for value and type for type (``1`` is not ``True`` here), is the same value:
    known at the cost of comparing them."""
    # (the map, its values' types, the instance), replaced whole: a thread that reads
    # it while another decodes never pairs one map with another's instance
    last: list[tuple[Any, tuple[type, ...], Any]] = [(None, (), None)]

    def nested(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _mismatch(value, (), cls.__name__)
        seen, types_, made = last[0]
        if value == seen and tuple(map(type, value.values())) == types_:
            return made
        made = struct(cls)._build(value)
        last[0] = (value, tuple(map(type, value.values())), made)
        return made

    return nested
