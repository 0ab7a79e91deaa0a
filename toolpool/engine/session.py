"""A session: one agent conversation's state (SPEC F2, P2, vocabulary).

It owns the workspace, the file-read register and the breaker's counts. Its turns
run one after another: each waits in the session's queue (``enqueue``) until the one
before it has ended, then begins in a callback of the loop.
``turn_output_chars`` bounds the text of each of its turns (SPEC L4, ``budget.py``;
0: no bound).

Its ``tool_profile`` ("toolpool", "claude-code", "codex", "openai", "anthropic":
toolpool.profiles) says whose tool names its calls use (SPEC F12); in an
``anthropic`` session the names Anthropic gives its own tools (``bash``) mean those
tools, and its turns rename such calls as they take them (``named``, F17).

Its ``tools`` are the tools its calls may name: the coordinator's registry, or one
with the session's own tools beside them (a client's shipped tools, SPEC A5).

Its scratch directory (spill files: bash's in ``bash/``, cut results' in ``output/``)
is ``<scratch_root>/<session id>``, created mode 0700 when the session opens and
removed when it closes (SPEC X8); without a ``scratch_root`` the session makes a
private temporary one of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from toolpool.cancel import CancelToken
from toolpool.egress.rules import NetworkPolicy
from toolpool.engine.breaker import Breaker
from toolpool.engine.budget import DEFAULT_TURN_OUTPUT_CHARS
from toolpool.file_reads import FileReadRegister
from toolpool.models import ToolCall
from toolpool.profiles import call_names, offers
from toolpool.registry import ToolRegistry
from toolpool.runtime import private_dir
from toolpool.sandbox.limits import Limits
from toolpool.session_options import ImageRoot, SessionOptions, Shell, WorkspaceMode
from toolpool.tool import ToolContext


class Begins(Protocol):
    """What the session's queue of turns asks of a turn (``toolpool.engine.turn``)."""

    def begin(self) -> None: ...


_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    id: str
    workspace: str
    files_read: int
    breaker_failures: dict[str, int]
    turn_running: bool


class Session:
    """``options`` are the session's (``toolpool.session_options``, checked there);
    ``max_tool_errors`` and ``turn_output_chars`` are the coordinator's, for the
    options that leave them unset; ``tools`` the registry its calls are looked up in
    (the coordinator's, or one with the session's own tools in it; none: empty)."""

    def __init__(
        self,
        workspace: str | Path,
        *,
        options: SessionOptions | None = None,
        session_id: str | None = None,
        scratch_root: Path | None = None,
        max_tool_errors: int = 3,
        turn_output_chars: int = DEFAULT_TURN_OUTPUT_CHARS,
        tools: ToolRegistry | None = None,
    ) -> None:
        options = options or SessionOptions()
        root = Path(workspace).resolve()
        if not root.is_dir():
            raise NotADirectoryError(f"workspace {root} is not a directory")
        self.id = session_id or uuid.uuid4().hex[:12]
        self.workspace = root
        self.options = options
        self.tools = ToolRegistry() if tools is None else tools
        self.extra_roots = tuple(Path(r).resolve() for r in options.extra_roots)
        self.allow_network = options.allow_network
        self.network_policy = (
            options.network if isinstance(options.network, NetworkPolicy) else None
        )
        self.persistent_shell = options.shell is Shell.PERSISTENT
        self.image = options.root.image if isinstance(options.root, ImageRoot) else ""
        self.workspace_overlay = options.workspace_mode is WorkspaceMode.OVERLAY
        self.limits = dict(options.limits)  # resource limit overrides for this session's calls
        # The limits a tool in this process sees (ctx.limits): the defaults with the
        # overrides, made once (options were checked: they merge).
        self.call_limits = Limits().merged(self.limits)
        self._offered: dict[str, bool] = {}
        self.breaker = Breaker(
            max_tool_errors if options.max_tool_errors is None else options.max_tool_errors
        )
        self.turn_output_chars = (  # 0: none
            turn_output_chars if options.turn_output_chars is None else options.turn_output_chars
        )
        self.on_error = options.on_error
        self.tool_profile = options.tool_profile  # whose tool names (F12)
        self._call_names = call_names(self.tool_profile)  # empty but for "anthropic"
        self.files = FileReadRegister()
        self._turns: deque[Begins] = deque()  # the running turn first, then those waiting
        # Private (0700) before any tool writes there; removed by close().
        if scratch_root is None:
            self.scratch_dir = Path(tempfile.mkdtemp(prefix=f"toolpool-session-{self.id}-"))
        else:
            if self.id in ("", ".", "..") or not set(self.id) <= _ID_CHARS:
                raise ValueError(f"session id {self.id!r} cannot name a scratch directory")
            self.scratch_dir = private_dir(scratch_root / self.id)

    def enqueue(self, turn: Begins) -> None:
        """Queue ``turn``; it begins (``turn.begin()``, in a callback of the loop) once
        every turn queued before it has ended (``dequeue``)."""
        self._turns.append(turn)
        if len(self._turns) == 1:
            asyncio.get_running_loop().call_soon(turn.begin)

    def follow(self, item: Begins) -> None:
        """Queue ``item`` right after the running turn, ahead of those waiting: the
        checkpoint of a turn's end (B1), which the next turn waits for."""
        if self._turns:
            self._turns.insert(1, item)
        else:
            self.enqueue(item)

    def busy(self, between: type) -> bool:
        """Whether a turn runs or waits: anything queued that is not ``between``
        (work done between turns, ``engine.between.BetweenTurns``)."""
        return any(not isinstance(item, between) for item in self._turns)

    def dequeue(self, turn: Begins) -> None:
        """``turn`` has ended: the next one begins. No cut (L4) can come any more for
        the reads it made: the register settles them (F13)."""
        self.files.settle()
        if self._turns and self._turns[0] is turn:
            self._turns.popleft()
            if self._turns:
                asyncio.get_running_loop().call_soon(self._turns[0].begin)
        elif turn in self._turns:
            self._turns.remove(turn)

    def named(self, calls: Sequence[ToolCall]) -> Sequence[ToolCall]:
        """``calls`` with the names the session's profile gives another tool renamed
        to that tool's (``bash`` → ``anthropic_bash`` in an ``anthropic`` session);
        the same sequence when there is nothing to rename."""
        names = self._call_names
        if not names or not any(call.name in names for call in calls):
            return calls
        return [
            dataclasses.replace(call, name=names[call.name]) if call.name in names else call
            for call in calls
        ]

    def offers(self, tool: str) -> bool:
        """Whether this session's calls may use ``tool``: its profile's tools and those
        of no profile (F12)."""
        offered = self._offered.get(tool)
        if offered is None:
            offered = self._offered[tool] = offers(self.tool_profile, tool)
        return offered

    def close(self) -> None:
        """Forget the session's state and remove its scratch directory."""
        shutil.rmtree(self.scratch_dir, ignore_errors=True)

    def context(
        self,
        call: ToolCall,
        cancel_token: CancelToken,
        progress: Callable[[Any], None] | None = None,
    ) -> ToolContext:
        """The context a tool of this session sees for ``call``."""
        ctx = ToolContext(
            call_id=call.id,
            tool_name=call.name,
            session_id=self.id,
            workspace=self.workspace,
            files=self.files,
            extra_roots=self.extra_roots,
            allow_network=self.allow_network,
            persistent_shell=self.persistent_shell,
            root=self.options.root.value,
            layer_bytes=self.options.layer_bytes or 0,
            image=self.image,
            workspace_overlay=self.workspace_overlay,
            scratch_dir=self.scratch_dir,
            cancel_token=cancel_token,
            limits=self.call_limits,
            tool_profile=self.tool_profile,
            network_policy=self.network_policy,
        )
        if progress is not None:
            ctx.progress = progress
        return ctx

    def statistics(self) -> SessionStatistics:
        return SessionStatistics(
            id=self.id,
            workspace=str(self.workspace),
            files_read=len(self.files),
            breaker_failures=self.breaker.statistics().failures,
            turn_running=bool(self._turns),
        )

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.workspace} {self.files!r} {self.breaker!r}>"
