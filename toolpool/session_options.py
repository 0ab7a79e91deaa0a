"""The options a session is opened with: the one list of them, each with its parser
and its message (SPEC E6).

``SessionOptions.parse`` is the one check. The client runs it before it sends an
``OpenSession`` (both clients, through the sans-IO connection), the in-process
``Coordinator`` when it opens a session, and the daemon when one arrives, never
relying on the client's: a bad option is refused in all three with the same message,
which names the option and the value (``bad_request`` over the wire)::

    session option approval_timeout = 'x': expected a number more than 0

An option is a field of ``SessionOptions`` with ``option(default, parser, what)``
(``daemon=True``: one a daemon carries out, ``DAEMON_OPTIONS``, which an in-process
``Coordinator`` refuses and the engine's session never sees: ``for_engine``); adding
one is that field, its use and its row in docs/sessions.md, the one list users read
(a test keeps the two in step). A session's ``limits`` are checked by the rule
``Limits`` keeps (``toolpool.sandbox.limits.refusal``). ``to_wire`` is what
``OpenSession`` carries: the options given, in their plain JSON form.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from toolpool.egress.rules import NetworkPolicy, PolicyError
from toolpool.policy import GateMode, PolicyRule, parse_policy
from toolpool.profiles import DEFAULT_PROFILE, PROFILES
from toolpool.sandbox.limits import Limits, refusal

Parser = Callable[[Any], Any]


class OnError(StrEnum):
    """What a failed call does to the other calls of its turn (SPEC S7)."""

    CONTINUE = "continue"  # nothing: every call runs to its own end
    CANCEL_SIBLINGS = "cancel_siblings"  # the rest of the turn stops as on an interrupt


class Shell(StrEnum):
    """What a session's ``bash`` keeps from one command to the next (SPEC V10, V11)."""

    FRESH = "fresh"  # a new shell each command; only the working directory carries over
    PERSISTENT = "persistent"  # its variables, functions, options and aliases too


class Root(StrEnum):
    """What a session's commands have as their root file system (SPEC V12)."""

    HOST = "host"  # the host's, read-only
    OVERLAY = "overlay"  # the host's, copy-on-write for this session alone


class Network(StrEnum):
    """What a session's commands may reach (SPEC N1); a ``NetworkPolicy`` is the
    third choice."""

    OFF = "off"  # nothing: an empty network namespace
    OPEN = "open"  # the outside, never this host (X3)


class WorkspaceMode(StrEnum):
    """Where a session's writes to its workspace go (SPEC V14)."""

    DIRECT = "direct"  # to the host directory, in place
    OVERLAY = "overlay"  # to the session's own layer over it: the host's never changes


@dataclass(frozen=True, slots=True)
class ImageRoot:
    """``root = {"image": path}``: an image's root file system, copy-on-write for the
    session (SPEC V13). The daemon admits the path (its ``image_dirs``) at open."""

    image: str

    @property
    def value(self) -> str:  # as Root's members: what a call's context carries
        return "image"


DEFAULT_LAYER_BYTES = 1024**3  # a session's copy-on-write layer (root = "overlay")


class SessionOptionError(ValueError):
    """A session option that is unknown, or whose value its parser refuses."""


class _Refused(ValueError):
    """What a parser says of a value: "expected …" (the caller names the option)."""


# --- the parsers: each takes the value as it came (JSON's types) ------------------------


def _paths(value: Any) -> tuple[str, ...]:
    # A string is a sequence of characters: "abc" must not become the roots a, b, c.
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise _Refused("expected a list of paths")
    if not all(isinstance(p, str) and p for p in value):
        raise _Refused("expected a list of paths, each a non-empty string")
    return tuple(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Refused("expected true or false")
    return value


def _count(minimum: int) -> Parser:
    def parse(value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _Refused(f"expected an integer of {minimum} or more")
        return value

    return parse


# A checkpoint adds at most one layer to each of a session's overlays, and overlayfs
# stacks 500 lower layers: room is left for an image's own (docker's bound is 127).
MAX_CHECKPOINTS = 256


def _checkpoints(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_CHECKPOINTS:
        raise _Refused(
            f"expected an integer from 2 to {MAX_CHECKPOINTS} (each checkpoint may be a "
            "layer the kernel stacks, and it stacks 500)"
        )
    return value


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _Refused("expected a number more than 0")
    if not math.isfinite(value):
        raise _Refused("expected a finite number of seconds")
    return float(value)


def _choice(kind: type[StrEnum]) -> Parser:
    def parse(value: Any) -> StrEnum:
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in kind)
            raise _Refused(f"expected one of {allowed}") from None

    return parse


_gate_mode = _choice(GateMode)
_on_error = _choice(OnError)
_shell = _choice(Shell)
_workspace_mode = _choice(WorkspaceMode)


def _root(value: Any) -> Root | ImageRoot:
    if not isinstance(value, Mapping):
        try:
            return Root(value)
        except (ValueError, TypeError):
            raise _Refused("expected 'host', 'overlay' or {'image': '/abs/path'}") from None
    image = value.get("image")
    if set(value) != {"image"} or not isinstance(image, str):
        raise _Refused("expected {'image': '/abs/path'} and nothing else in it")
    if not image.startswith("/") or "\0" in image:
        raise _Refused("expected the image as an absolute path")
    return ImageRoot(image)


def _network(value: Any) -> Network | NetworkPolicy:
    if isinstance(value, Mapping):
        try:
            return NetworkPolicy.parse(value)
        except PolicyError as exc:
            raise _Refused(str(exc)) from None
    try:
        return Network(value)
    except (ValueError, TypeError):
        raise _Refused(
            "expected 'off', 'open' or a policy {'allow': [...], 'deny': [...], 'ask': false}"
        ) from None


def network_rank(network: Network | NetworkPolicy) -> int:
    """How much a choice lets through: off < a policy < open (the daemon's ceiling)."""
    if isinstance(network, NetworkPolicy):
        return 1
    return 2 if network is Network.OPEN else 0


def _profile(value: Any) -> str:
    if value not in PROFILES:
        raise _Refused(f"expected one of {', '.join(repr(p) for p in PROFILES)}")
    return str(value)


def _rules(value: Any) -> tuple[PolicyRule, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise _Refused("expected a list of rules ({'action': ..., 'tool': ...})")
    try:
        return tuple(parse_policy(value))
    except ValueError as exc:
        raise _Refused(str(exc)) from None


_NO_LIMITS: Mapping[str, Any] = MappingProxyType({})
_LIMIT_NAMES = tuple(f.name for f in dataclasses.fields(Limits))


def _limits(value: Any) -> Mapping[str, Any]:
    """Overrides of ``Limits``: known names, each a value ``Limits`` takes (its one
    rule, ``toolpool.sandbox.limits.refusal``)."""
    if value is None:
        return _NO_LIMITS
    if not isinstance(value, Mapping):
        raise _Refused("expected a table of limits ({'wall_seconds': 30, …})")
    for name, limit in value.items():
        if name not in _LIMIT_NAMES:
            raise _Refused(f"{shown(name)} is not a limit (known: {', '.join(_LIMIT_NAMES)})")
        why = refusal(name, limit)
        if why is not None:
            raise _Refused(f"{name} = {shown(limit)}: {why}")
    return MappingProxyType(dict(value))


def shown(value: Any, limit: int = 200) -> str:
    """``value`` as a message shows it: its repr (controls escaped), cut at ``limit``
    characters — a client may send megabytes where a number goes."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4,300 digits, somewhere in it
        return f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def option(default: Any, parse: Parser, what: str, *, daemon: bool = False) -> Any:
    """A session option: its default, its parser, and what it is; ``daemon``: a
    daemon carries it out (it asks the client), not the engine's session."""
    metadata = {"parse": parse, "what": what, "daemon": daemon}
    if isinstance(default, Mapping):  # not hashable: shared, read-only, by a factory
        return field(default_factory=lambda: default, metadata=metadata)
    return field(default=default, metadata=metadata)


# --- the options ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOptions:
    """Every option of a session, parsed. None: the daemon's (or the coordinator's)
    setting applies."""

    extra_roots: tuple[str, ...] = option((), _paths, "more directories the file tools may use")
    allow_network: bool = option(False, _flag, "the old spelling of network = 'open' (deprecated)")
    network: Network | NetworkPolicy = option(
        Network.OFF, _network, "'off', 'open' (X3) or a policy of names (N1)"
    )
    max_tool_errors: int | None = option(
        None, _count(0), "consecutive failures that open a tool's breaker (P2; 0: never)"
    )
    limits: Mapping[str, Any] = option(
        _NO_LIMITS, _limits, "overrides of the calls' resource limits (D3)"
    )
    gate: GateMode = option(GateMode.ALLOW, _gate_mode, "allow, ask or policy (P8)", daemon=True)
    policy: tuple[PolicyRule, ...] = option(
        (), _rules, "the rules of gate 'policy' (P8)", daemon=True
    )
    approval_timeout: float | None = option(
        None, _seconds, "seconds an approval waits for its answer", daemon=True
    )
    max_tool_concurrency: int | None = option(
        None, _count(0), "safe calls of a turn that run side by side (S2; 0, 1: serial)"
    )
    turn_output_chars: int | None = option(
        None, _count(0), "a turn's model-facing text (L4; 0: no budget)"
    )
    on_error: OnError = option(
        OnError.CONTINUE, _on_error, "what a failed call does to its siblings (S7)"
    )
    tool_profile: str = option(DEFAULT_PROFILE, _profile, "whose tool names (F12)")
    shell: Shell = option(Shell.FRESH, _shell, "what bash keeps between commands (V11)")
    root: Root | ImageRoot = option(
        Root.HOST, _root, "the commands' root: the host's, an overlay of it, an image (V12, V13)"
    )
    layer_bytes: int | None = option(
        None, _count(1024 * 1024), "the size of the session's copy-on-write layers (V12)"
    )
    workspace_mode: WorkspaceMode = option(
        WorkspaceMode.DIRECT, _workspace_mode, "the workspace written in place, or an overlay (V14)"
    )
    max_checkpoints: int | None = option(
        None, _checkpoints, "checkpoints kept before the oldest are merged (B5; default 50)"
    )

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SessionOptions:
        """The options in ``options`` (JSON's types, as a client or the wire gives
        them); a SessionOptionError naming the first option that is unknown or bad."""
        if not isinstance(options, Mapping):
            raise SessionOptionError(f"session options must be a table, not {shown(options)}")
        known = _OPTIONS
        unknown = sorted(set(options) - known.keys())
        if unknown:
            raise SessionOptionError(
                f"unknown session option {shown(unknown[0])} (known: {', '.join(known)})"
            )
        parsed: dict[str, Any] = {}
        for name, value in options.items():
            try:
                parsed[name] = known[name](value)
            except _Refused as why:
                raise SessionOptionError(f"session option {name} = {shown(value)}: {why}") from None
        # allow_network = true is network = "open" (N1): either spelling gives both.
        if parsed.get("allow_network"):
            if parsed.setdefault("network", Network.OPEN) is not Network.OPEN:
                raise SessionOptionError(
                    "session option allow_network = True is the old spelling of network = "
                    f"'open', and network = {shown(options['network'])} says otherwise: give one"
                )
        elif parsed.get("network") is Network.OPEN:
            parsed["allow_network"] = True
        return cls(**parsed)

    def for_engine(self) -> SessionOptions:
        """These options with a daemon's (``DAEMON_OPTIONS``) at their defaults: what
        the engine's session takes, the daemon carrying out the rest."""
        return dataclasses.replace(self, **{name: _DEFAULTS[name] for name in DAEMON_OPTIONS})

    def given(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != _DEFAULTS[f.name]
        }

    def to_wire(self, *, also: Collection[str] = ()) -> dict[str, Any]:
        """``OpenSession.options``: the options given, in plain JSON form, which
        ``parse`` reads back to these options; ``also`` names options to carry even at
        their default (a fork's, which go over its parent's)."""
        wire: dict[str, Any] = {}
        values = self.given() | {name: getattr(self, name) for name in also}
        for name, value in values.items():
            if name == "policy":
                value = [rule.to_dict() for rule in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, StrEnum):
                value = value.value
            elif isinstance(value, ImageRoot):
                value = {"image": value.image}
            elif isinstance(value, NetworkPolicy):
                value = value.to_wire()
            elif isinstance(value, Mapping):
                value = dict(value)
            wire[name] = value
        return wire


_OPTIONS: dict[str, Parser] = {
    f.name: f.metadata["parse"] for f in dataclasses.fields(SessionOptions)
}
_DEFAULTS: dict[str, Any] = {
    f.name: getattr(SessionOptions(), f.name) for f in dataclasses.fields(SessionOptions)
}
# The options a daemon carries out (it asks the client): an in-process Coordinator,
# whose gate is a function, refuses them.
DAEMON_OPTIONS = frozenset(
    f.name for f in dataclasses.fields(SessionOptions) if f.metadata["daemon"]
)
