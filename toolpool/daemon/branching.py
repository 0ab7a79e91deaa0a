"""What the daemon does with a session's branches (SPEC B1–B10): the checkpoint at
each turn's end, and the ``Branch`` requests — checkpoint, checkpoints, rewind, fork,
changes, diff, export, commit — of a session whose workspace is an overlay.

Each is work between the session's turns (``engine.between.BetweenTurns``): queued at
the session, it begins once what was queued before it ended, and the next turn waits
for it. A request that finds a turn running or waiting is refused (``busy``): none of
them waits behind a turn. The work on layers is the pool's (``pool.branches``,
``pool.branch_changes``); a fork's sessions are opened here, as the client's, with
the parent's options under the ones the request gives, its read register copied
(judged by content from then on) and its shell's saved state.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from toolpool.changes import CommitConflict, PatchTooLarge
from toolpool.daemon.audit import Auditor
from toolpool.daemon.clients import Clients
from toolpool.daemon.records import Address, BadRequest, ClientState, SessionEntry
from toolpool.engine.between import BetweenTurns
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.session import Session
from toolpool.pool import WorkerPool
from toolpool.pool.branches import BranchRefused
from toolpool.pool.history import DEFAULT_MAX_CHECKPOINTS, Checkpoint, UnknownCheckpoint
from toolpool.protocol import (
    MAX_MESSAGE_BYTES,
    Branch,
    BranchAction,
    CallContext,
    Error,
    FailureCode,
    Reply,
)
from toolpool.sandbox.session_box import SandboxStartError
from toolpool.session_options import SessionOptionError, SessionOptions, WorkspaceMode

log = logging.getLogger("toolpool.daemon")

MAX_FORKS = 256  # forks of one request (the session limits bound them too)
# Options a fork keeps its parent's: its layers are stacked on the parent's.
_KEPT = ("root", "workspace_mode", "extra_roots")
_SHELL_STATE = Path("bash") / "shell"  # in a session's scratch directory (V10, V11)


class Opener(Protocol):
    """What forks ask of the daemon's sessions (``Sessions``)."""

    max_sessions_per_client: int
    max_sessions: int
    table: dict[str, SessionEntry]

    def add(
        self,
        client: ClientState,
        workspace: str,
        options: SessionOptions,
        *,
        forked_from: SessionEntry | None = None,
    ) -> SessionEntry: ...

    def end(self, entry: SessionEntry) -> None: ...

    def entry(self, client: ClientState, session_id: str) -> SessionEntry: ...


class Branching:
    def __init__(
        self,
        sessions: Opener,
        coordinator: Coordinator,
        pool: WorkerPool | None,
        clients: Clients,
        auditor: Auditor | None,
    ) -> None:
        self.sessions = sessions
        self.coordinator = coordinator
        self.pool = pool
        self.clients = clients
        self.auditor = auditor

    # -- sessions ------------------------------------------------------------------

    def opened(self, entry: SessionEntry) -> None:
        """A session opened: a layered one's start is its first checkpoint."""
        session = entry.session
        if self.pool is None or not session.workspace_overlay:
            return
        limit = entry.options.max_checkpoints or DEFAULT_MAX_CHECKPOINTS
        self.pool.branches.opened(session.id, session.workspace, limit)
        entry.checkpoints = True

    def closed(self, entry: SessionEntry) -> None:
        if self.pool is not None:
            self.pool.branches.closed(entry.session.id)
        if self.auditor is not None:
            self.auditor.closed(entry.session.id)

    def _between(
        self, entry: SessionEntry, work: Callable[[], Awaitable[Any]], first: bool
    ) -> BetweenTurns:
        item = BetweenTurns(entry.session, work).queue(first=first)
        entry.between.add(item)
        item.done.add_done_callback(lambda _: entry.between.discard(item))
        return item

    def turn_ended(self, entry: SessionEntry, turn_id: str) -> None:
        """The turn's end is a checkpoint, made before the next turn begins."""
        assert self.pool is not None
        branches = self.pool.branches
        session_id = entry.session.id

        async def checkpoint() -> None:
            try:
                made = await branches.checkpoint(session_id, turn_id=turn_id, label=None)
            except (OSError, SandboxStartError, BranchRefused) as exc:
                log.error(
                    "no checkpoint at the turn's end: %s",
                    exc,
                    extra={"session": session_id, "turn": turn_id},
                )
                return
            if not isinstance(made, Checkpoint):
                log.info(
                    "no checkpoint at the turn's end: background shells run (%s)",
                    ", ".join(made.shells),
                    extra={"session": session_id, "turn": turn_id},
                )

        self._between(entry, checkpoint, first=True)

    # -- requests -------------------------------------------------------------------

    def request(self, client: ClientState, message: Branch) -> None:
        """A ``Branch`` request: queued between the session's turns, answered when done."""
        entry = self.sessions.entry(client, message.session_id)
        if self.pool is None or not self.pool.branches.tracks(entry.session.id):
            raise BadRequest(
                FailureCode.BAD_REQUEST,
                f"session {entry.session.id} has no checkpoints, forks or changes to give: "
                'they need workspace_mode = "overlay" (and the daemon\'s worker pool)',
            )
        if entry.session.busy(BetweenTurns):
            raise BadRequest(
                FailureCode.BUSY,
                f"a turn of session {entry.session.id} is running or waiting: "
                f"{message.action.value} happens between turns (wait for the turn's end)",
            )
        work = self._work(client, entry, message)
        item = self._between(entry, work, first=False)
        item.done.add_done_callback(lambda done: self._answer(client.address, message, done))

    def _answer(self, address: Address, message: Branch, done: Any) -> None:
        if address not in self.clients.table:
            return
        exc = done.exception()
        if exc is None:
            self.clients.send(address, Reply(message.request_id, done.result()))
            return
        code, text = _failure(exc)
        if code is FailureCode.INTERNAL:
            log.error(
                "%s failed: %r", message.action.value, exc, extra={"session": message.session_id}
            )
        self.clients.send(address, Error(message.request_id, code, text))

    def _work(
        self, client: ClientState, entry: SessionEntry, message: Branch
    ) -> Callable[[], Awaitable[Any]]:
        assert self.pool is not None
        branches, changes = self.pool.branches, self.pool.workspace_changes
        session_id = entry.session.id
        since = message.checkpoint or None

        async def work() -> Any:
            match message.action:
                case BranchAction.CHECKPOINT:
                    await branches.checkpoint(
                        session_id, turn_id=None, label=message.label or None, demand=True
                    )
                    listed = await branches.listing(session_id)
                    return listed["checkpoints"][-1]
                case BranchAction.CHECKPOINTS:
                    return await branches.listing(session_id)
                case BranchAction.REWIND:
                    rewound = await branches.rewind(session_id, message.checkpoint)
                    entry.session.files.rejudge()
                    return {
                        "checkpoint": rewound.target.id,
                        "forgot": list(rewound.forgot),
                        "shells_stopped": list(rewound.shells),
                    }
                case BranchAction.FORK:
                    return await self._fork(client, entry, message)
                case BranchAction.CHANGES:
                    return {"changes": await changes.changes(session_id, since)}
                case BranchAction.DIFF:
                    return {"patch": await changes.diff(session_id, since, MAX_MESSAGE_BYTES // 2)}
                case BranchAction.EXPORT:
                    entries = await changes.export(session_id, message.path)
                    return {"path": message.path, "entries": entries}
                case BranchAction.COMMIT:
                    try:
                        return {"paths": await changes.commit(session_id), "conflicts": []}
                    except CommitConflict as exc:  # a refusal the client lists
                        return {"paths": [], "conflicts": exc.paths, "message": str(exc)}

        return work

    # -- forks -----------------------------------------------------------------------

    def _fork_options(self, entry: SessionEntry, overrides: dict[str, Any]) -> SessionOptions:
        if entry.binding is not None:
            # Its shipped tools run on workers bound to it alone (A6); a fork would need
            # workers of its own loading them again: not done, and said.
            raise BranchRefused("a session with shipped tools (A5) cannot be forked")
        kept = [name for name in _KEPT if name in overrides]
        if kept:
            raise BranchRefused(
                f"a fork keeps its parent's {', '.join(kept)} (its layers are stacked on the "
                "parent's): give the other options only"
            )
        try:
            options = SessionOptions.parse({**entry.options.to_wire(), **overrides})
        except SessionOptionError as exc:
            raise BranchRefused(str(exc)) from None
        assert options.workspace_mode is WorkspaceMode.OVERLAY
        return options

    async def _fork(
        self, client: ClientState, entry: SessionEntry, message: Branch
    ) -> dict[str, Any]:
        assert self.pool is not None
        count = message.count
        if not 1 <= count <= MAX_FORKS:
            raise BranchRefused(f"a fork makes 1 to {MAX_FORKS} sessions, not {count}")
        opener = self.sessions
        if len(client.sessions) + count > opener.max_sessions_per_client:
            raise BranchRefused(
                f"{count} forks would give this client {len(client.sessions) + count} sessions, "
                f"past max_sessions_per_client ({opener.max_sessions_per_client})"
            )
        if len(opener.table) + count > opener.max_sessions:
            raise BranchRefused(
                f"{count} forks would give the daemon {len(opener.table) + count} sessions, "
                f"past max_sessions ({opener.max_sessions})"
            )
        options = self._fork_options(entry, message.options)
        if client.address not in self.clients.table:
            raise BranchRefused("the client is gone")
        parent = entry.session
        children: list[SessionEntry] = []
        try:
            for _ in range(count):
                children.append(
                    opener.add(client, str(parent.workspace), options, forked_from=entry)
                )
            contexts = [_context(child.session) for child in children]
            limit = options.max_checkpoints or DEFAULT_MAX_CHECKPOINTS
            point = await self.pool.branches.fork(
                parent.id, contexts, message.checkpoint or None, limit
            )
        except BaseException:
            for child in children:
                opener.end(child)
            raise
        for child in children:
            if opener.table.get(child.session.id) is not child:
                # Ended while its layers were made (its client left): they go now.
                await self.pool.shells.end_session(child.session.id)
                self.pool.branches.closed(child.session.id)
                continue
            child.checkpoints = True
            child.session.files = parent.files.copy()
            child.session.files.rejudge()
            _copy_shell_state(parent, child.session)
            if self.auditor is not None:
                self.auditor.forked(child.session.id, parent.id)
            log.info(
                "session forked at %s",
                point.id,
                extra={"session": child.session.id, "forked_from": parent.id},
            )
        return {"session_ids": [c.session.id for c in children], "at": point.id}


def _context(session: Session) -> CallContext:
    """What the pool needs to make a session's layers."""
    return CallContext(
        workspace=str(session.workspace),
        session_id=session.id,
        extra_roots=tuple(str(p) for p in session.extra_roots),
        allow_network=session.allow_network,
        root=session.options.root.value,
        layer_bytes=session.options.layer_bytes or 0,
        image=session.image,
        workspace_overlay=session.workspace_overlay,
        scratch_dir=str(session.scratch_dir),
    )


def _copy_shell_state(parent: Session, child: Session) -> None:
    """The directory (and, with a persistent shell, the state) the parent's next
    command would start with, the fork's too (V10, V11)."""
    source = parent.scratch_dir / _SHELL_STATE
    if source.is_dir():
        shutil.copytree(source, child.scratch_dir / _SHELL_STATE, symlinks=True, dirs_exist_ok=True)


def _failure(exc: BaseException) -> tuple[FailureCode, str]:
    """A branch request's failure as the client is told it."""
    match exc:
        case UnknownCheckpoint():
            return FailureCode.UNKNOWN_CHECKPOINT, exc.message
        case BranchRefused() | PatchTooLarge():
            return FailureCode.BAD_REQUEST, str(exc)
        case SandboxStartError():
            return FailureCode.INTERNAL, exc.message
        case OSError():
            return FailureCode.INTERNAL, f"the session's layers: {exc}"
        case BadRequest():
            return exc.code, exc.message
    return FailureCode.INTERNAL, repr(exc)


__all__ = ["Branching"]
