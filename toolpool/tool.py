"""The tool contract (SPEC T1-T4).

A tool is any object with four parts: ``name``, ``description``, ``schema`` and
``execute(args, ctx)``. Everything else is an optional capability, one small
``Protocol`` each, detected with ``isinstance`` at run time — the Python form of Go's
optional marker interfaces. A tool implements only what it needs; ``ToolSpec``
(registry.py) applies the defaults of SPEC T2 for what it lacks.

``execute`` and ``execute_content`` may be plain or ``async`` functions.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from toolpool.cancel import CancelToken
from toolpool.models import ContentBlock, ImageBlock, TextBlock

if TYPE_CHECKING:
    from toolpool.background import BackgroundShells
    from toolpool.egress.rules import NetworkPolicy
    from toolpool.file_reads import FileReadRegister
    from toolpool.sandbox.limits import Limits

Arguments = dict[str, Any]


class InterruptBehavior(StrEnum):
    """What happens to a running call when the user interrupts (SPEC S4)."""

    CANCEL = "cancel"
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """The answer of a tool's ``validate``: ok, or a message for the model and a code,
    with ``details`` for programs (they join the refusal's result details beside
    ``validation_code``: what a profile words its refusal from, SPEC F14).

    ``reason`` is a stable name for why (F3's ``not_read``, ``partly_read``,
    ``changed``…) and ``explanation`` what the message says past the reason's own
    sentence (what changed, the nearest match): a tool profile says the reason in its
    agent's words and keeps the explanation, reading no English. Neither crosses to
    the result, which carries the message, the code and the details."""

    ok: bool
    message: str = ""
    code: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    explanation: str = ""

    @classmethod
    def passed(cls) -> ValidationResult:
        return _PASSED if cls is ValidationResult else cls(True)

    @classmethod
    def failed(
        cls,
        message: str,
        code: int = 1,
        details: Mapping[str, Any] | None = None,
        *,
        reason: str = "",
        explanation: str = "",
    ) -> ValidationResult:
        return cls(False, message, code, details or {}, reason, explanation)


# The verdict of every call whose tool has no validate: frozen, so one serves all.
_PASSED = ValidationResult(True)


@dataclass(frozen=True, slots=True)
class Preview:
    """What a ``preview`` may return besides plain text or a JSON-able value: its text,
    and whether the tool cut it (a diff stops at its cap), which a gate is told
    (``GateRequest.preview_truncated``) besides the note the text ends with."""

    text: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What ``execute`` (or ``execute_content``) may return besides text, JSON-able data
    or content blocks: its ``content`` (any of those) with ``details`` for programs,
    which become the result's details (``read``'s lines shown, SPEC F2)."""

    content: Any
    details: Mapping[str, Any] = field(default_factory=dict)


def _no_progress(_: Any) -> None:
    """Progress sink for contexts where nothing listens (validate, preview)."""


@dataclass(slots=True)
class ToolContext:
    """What a tool sees of the world while it validates, previews or executes.

    ``scratch_dir`` is the session's own directory outside the workspace (spill
    files of long outputs…); it may not exist yet: tools create it when they need it.
    File tools may read there as well as in the workspace and ``extra_roots``.

    ``report_progress`` may be called from any thread while ``execute`` runs; each
    report becomes a ``tool_update`` event of this call (P9). ``cancelled`` turns true
    when the call is cancelled; long-running tools should look at it (the worker pool
    also delivers a signal, see SPEC D4).

    ``shells`` starts, reads and ends the session's background commands (bash's
    ``run_in_background``, ``bash_output``, ``kill_shell``) where the executor
    offers them — in workers, through the pool; None elsewhere (in-process).

    ``tool_profile`` is the session's (SPEC F12): a tool words the calls it names in
    that profile's spelling, and ``apply_patch`` follows Codex in a Codex session.
    """

    call_id: str
    tool_name: str
    session_id: str
    workspace: Path
    files: FileReadRegister
    extra_roots: tuple[Path, ...] = ()
    allow_network: bool = False
    persistent_shell: bool = False  # the session's shell = "persistent" (SPEC V11)
    root: str = "host"  # the session's root: "host", "overlay" (V12) or "image" (V13)
    layer_bytes: int = 0  # its copy-on-write layers' size (0: the default)
    image: str = ""  # root = "image": the image's path (SPEC V13)
    workspace_overlay: bool = False  # workspace_mode = "overlay" (SPEC V14)
    workspace_view: Path | None = None  # where its overlay shows the workspace (V14)
    scratch_dir: Path | None = None
    cancel_token: CancelToken = field(default_factory=CancelToken)
    progress: Callable[[Any], None] = _no_progress
    limits: Limits | None = None  # the call's limits, where the executor knows them
    shells: BackgroundShells | None = None  # the session's background shells, if offered
    tool_profile: str = "toolpool"  # whose tools the session's calls use (SPEC F12)
    # The session's network policy (SPEC N1), where it has one; in a worker, its
    # proxy's key instead (``egress``: the proxy variables' tokens, N3).
    network_policy: NetworkPolicy | None = None
    egress: str = ""

    def report_progress(self, data: Any) -> None:
        """Report progress: text (e.g. a chunk of output) or a JSON-able value."""
        self.progress(data)

    @property
    def cancelled(self) -> bool:
        return self.cancel_token.requested


# --- the required parts (T1) -------------------------------------------------------


@runtime_checkable
class Tool(Protocol):
    """T1: the four required parts. Attributes or properties both satisfy it."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def schema(self) -> Mapping[str, Any]: ...

    def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        """Do the work. Return text, JSON-able data or content blocks; may be async."""
        ...


# --- the optional capabilities (T2, T3) -------------------------------------------


@runtime_checkable
class Labeler(Protocol):
    """A human-readable name for UIs ("Edit File"). Default: the name."""

    def label(self) -> str: ...


@runtime_checkable
class Validator(Protocol):
    """A cheap semantic self-check before execution (T4). Default: passes."""

    def validate(self, args: Arguments, ctx: ToolContext) -> ValidationResult: ...


@runtime_checkable
class Previewer(Protocol):
    """A preview of the effect (a unified diff…) for UIs and gates. Default: none."""

    def preview(self, args: Arguments, ctx: ToolContext) -> Any: ...


@runtime_checkable
class ReadOnlyTool(Protocol):
    """Whether this call only reads. Default: False."""

    def read_only(self, args: Arguments) -> bool: ...


@runtime_checkable
class ConcurrencySafeTool(Protocol):
    """Whether this call may run beside others; overrides read_only (S1)."""

    def concurrency_safe(self, args: Arguments) -> bool: ...


@runtime_checkable
class ContentTool(Protocol):
    """Execute returning content blocks (text, images…). Default: ``execute``."""

    def execute_content(self, args: Arguments, ctx: ToolContext) -> Any: ...


@runtime_checkable
class ActivityDescriber(Protocol):
    """A one-line busy text for UIs ("Running: go test"). Default: none."""

    def activity(self, args: Arguments) -> str: ...


@runtime_checkable
class InterruptBehaviorTool(Protocol):
    """What an interrupt does to this call: cancel or block. Default: block."""

    def interrupt_behavior(self, args: Arguments) -> InterruptBehavior | str: ...


@runtime_checkable
class FileTool(Protocol):
    """The files this call reads or writes, resolved. Their file-read register stamps
    travel with the call when it runs in a worker process, and come back updated.
    Default: none (the tool then sees an empty register in a worker)."""

    def file_paths(self, args: Arguments, ctx: ToolContext) -> Sequence[Path]: ...


@runtime_checkable
class LimitedTool(Protocol):
    """Resource limits this call needs (``{"wall_seconds": 610}`` for a command with
    a 600 s timeout…), over the pool's defaults and under the operator's per-tool
    and the session's settings. Default: none."""

    def call_limits(self, args: Arguments) -> Mapping[str, Any]: ...


@runtime_checkable
class FixedAnswersTool(Protocol):
    """Capability answers that do not depend on the arguments, given once (T2): by
    name — "label", "read_only", "concurrency_safe", "interrupt_behavior",
    "activity" (None: no activity) — with the answer every call would get. A name left
    out is asked per call, as usual. ``@tool`` functions say so of their fixed options."""

    def fixed_answers(self) -> Mapping[str, Any]: ...


@runtime_checkable
class PermissionMetadataTool(Protocol):
    """T3: what the tool does (read, write, exec, network…). Only gates look at it."""

    def permissions(self) -> Sequence[str]: ...


# --- turning what execute returned into content -------------------------------------

_IMAGE_MEDIA_TYPES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}


def image_block(data: bytes, media_type: str | None = None) -> ImageBlock:
    """An image content block from raw bytes; the media type is sniffed when not given."""
    if media_type is None:
        media_type = next(
            (mt for magic, mt in _IMAGE_MEDIA_TYPES.items() if data.startswith(magic)),
            "image/webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else None,
        )
        if media_type is None:
            raise ValueError("not a png, jpeg, gif or webp image")
    return ImageBlock(base64.b64encode(data).decode("ascii"), media_type)


def to_content(output: Any) -> tuple[ContentBlock, ...]:
    """Normalise what ``execute`` returned into content blocks.

    Three cases: text stays text; content blocks (one or a sequence) pass through;
    anything else is serialised as JSON text.
    """
    if isinstance(output, str):
        return (TextBlock(output),)
    if output is None:
        return (TextBlock(""),)
    if isinstance(output, TextBlock | ImageBlock):
        return (output,)
    if (
        isinstance(output, list | tuple)
        and output
        and all(isinstance(b, TextBlock | ImageBlock) for b in output)
    ):
        return tuple(output)
    return (TextBlock(json.dumps(output, ensure_ascii=False, default=str)),)
