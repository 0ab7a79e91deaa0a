"""A session's branches as the client sees them, without I/O (SPEC B1–B10): the
requests (``Branch`` frames, through the connection) and what their replies become.
Both drivers' ``checkpoint``, ``checkpoints``, ``rewind``, ``fork``, ``changes``,
``diff``, ``export`` and ``commit`` are these operations, waited for their way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from toolpool import protocol as wire
from toolpool.client.connection import Connection
from toolpool.client.errors import RequestFailed
from toolpool.client.operation import Operation
from toolpool.session_options import SessionOptionError, SessionOptions


class CommitConflict(RequestFailed):
    """``commit()`` found paths the host changed since the session started from them
    (``paths``): nothing was written."""

    def __init__(self, paths: Sequence[str], message: str) -> None:
        super().__init__("conflict", message)
        self.paths = list(paths)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint of a session's workspace and root (B1): ``turn_id`` is the turn
    whose end it is (None for the session's start or one asked for), ``time`` in
    seconds since the epoch, ``paths`` what its layers changed (absolute; at most
    1000, then ``paths_truncated``), ``merged`` the older checkpoints folded into it
    (B5), ``duration_ms`` what making it took in the daemon."""

    id: str
    turn_id: str | None
    time: float
    label: str | None
    paths: tuple[str, ...]
    paths_truncated: bool = False
    merged: tuple[str, ...] = ()
    duration_ms: float = 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Checkpoint:
        return cls(
            str(data["id"]),
            data.get("turn_id"),
            float(data["time"]),
            data.get("label"),
            tuple(data.get("paths") or ()),
            bool(data.get("paths_truncated")),
            tuple(data.get("merged") or ()),
            float(data.get("duration_ms") or 0.0),
        )


@dataclass(frozen=True, slots=True)
class SkippedCheckpoint:
    """A turn's end that made no checkpoint: the session's background ``shells`` ran."""

    turn_id: str | None
    time: float
    shells: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Checkpoints(Sequence[Checkpoint]):
    """A session's checkpoints, oldest first (its start first, the latest last), the
    turns' ends that made none (``skipped``), and how many are kept."""

    items: tuple[Checkpoint, ...]
    skipped: tuple[SkippedCheckpoint, ...]
    max_checkpoints: int

    @overload
    def __getitem__(self, index: int) -> Checkpoint: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Checkpoint]: ...

    def __getitem__(self, index: int | slice) -> Checkpoint | Sequence[Checkpoint]:
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(self.items)


@dataclass(frozen=True, slots=True)
class Change:
    """A path that differs (B8): ``path`` relative to the workspace, ``kind`` "added",
    "modified", "deleted" or "mode", ``type`` "file", "symlink" or "directory", its
    permission bits before and after (None where absent)."""

    path: str
    kind: str
    type: str
    old_mode: int | None = None
    new_mode: int | None = None


@dataclass(frozen=True, slots=True)
class Rewound:
    """A rewind's outcome (B2): the ``checkpoint`` it went back to, those it
    ``forgot`` (later ones), and the background shells it stopped."""

    checkpoint: str
    forgot: tuple[str, ...]
    shells_stopped: tuple[str, ...]


def _data(reply: wire.Message) -> Any:
    if not isinstance(reply, wire.Reply):
        raise RequestFailed("protocol", f"expected a reply, got {reply.type.value}")
    return reply.data


def _request(
    conn: Connection,
    session_id: str,
    action: wire.BranchAction,
    timeout: float | None,
    finish: Any,
    **fields: Any,
) -> Operation[Any]:
    message = wire.Branch(conn.next_id(), session_id, action, **fields)
    return conn.request(message, lambda reply: finish(_data(reply)), timeout)


def checkpoint(
    conn: Connection, session_id: str, label: str | None, timeout: float | None
) -> Operation[Checkpoint]:
    return _request(
        conn, session_id, wire.BranchAction.CHECKPOINT, timeout, Checkpoint.from_dict,
        label=label or "",
    )  # fmt: skip


def checkpoints(conn: Connection, session_id: str, timeout: float | None) -> Operation[Checkpoints]:
    def listed(data: Mapping[str, Any]) -> Checkpoints:
        return Checkpoints(
            tuple(Checkpoint.from_dict(c) for c in data["checkpoints"]),
            tuple(
                SkippedCheckpoint(s.get("turn_id"), float(s["time"]), tuple(s["shells"]))
                for s in data.get("skipped", ())
            ),
            int(data["max_checkpoints"]),
        )

    return _request(conn, session_id, wire.BranchAction.CHECKPOINTS, timeout, listed)


def rewind(
    conn: Connection, session_id: str, checkpoint_id: str, timeout: float | None
) -> Operation[Rewound]:
    def rewound(data: Mapping[str, Any]) -> Rewound:
        return Rewound(
            str(data["checkpoint"]), tuple(data["forgot"]), tuple(data["shells_stopped"])
        )

    return _request(
        conn, session_id, wire.BranchAction.REWIND, timeout, rewound, checkpoint=checkpoint_id
    )


def fork(
    conn: Connection,
    session_id: str,
    n: int,
    at: str | None,
    options: dict[str, Any],
    timeout: float | None,
) -> Operation[list[str]]:
    """The ids of ``n`` forks (sessions of this connection, answered as the parent's
    approvals are)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RequestFailed("bad_request", f"fork(n={n!r}): n is a number of sessions, 1 or more")
    try:  # the check the daemon makes too (E6), here with the same words
        given = SessionOptions.parse(options)
    except SessionOptionError as exc:
        raise RequestFailed("bad_request", str(exc)) from None
    wire_options = given.to_wire(also=options.keys())

    def forked(data: Mapping[str, Any]) -> list[str]:
        ids = [str(i) for i in data["session_ids"]]
        for child in ids:
            conn.adopt(child, session_id)
        return ids

    return _request(
        conn, session_id, wire.BranchAction.FORK, timeout, forked,
        checkpoint=at or "", count=n, options=wire_options,
    )  # fmt: skip


def changes(
    conn: Connection, session_id: str, since: str | None, timeout: float | None
) -> Operation[list[Change]]:
    def listed(data: Mapping[str, Any]) -> list[Change]:
        return [Change(**c) for c in data["changes"]]

    return _request(
        conn, session_id, wire.BranchAction.CHANGES, timeout, listed, checkpoint=since or ""
    )


def diff(
    conn: Connection, session_id: str, since: str | None, timeout: float | None
) -> Operation[str]:
    return _request(
        conn, session_id, wire.BranchAction.DIFF, timeout, lambda d: str(d["patch"]),
        checkpoint=since or "",
    )  # fmt: skip


def export(
    conn: Connection, session_id: str, path: str | os.PathLike[str], timeout: float | None
) -> Operation[int]:
    """``path`` relative to this process's directory is made absolute (the daemon
    takes absolute paths only)."""
    where = os.path.abspath(path)
    return _request(
        conn, session_id, wire.BranchAction.EXPORT, timeout, lambda d: int(d["entries"]), path=where
    )


def commit(conn: Connection, session_id: str, timeout: float | None) -> Operation[list[str]]:
    def committed(data: Mapping[str, Any]) -> list[str]:
        if data.get("conflicts"):
            raise CommitConflict(data["conflicts"], str(data.get("message", "")))
        return [str(p) for p in data["paths"]]

    return _request(conn, session_id, wire.BranchAction.COMMIT, timeout, committed)


__all__ = [
    "Change",
    "Checkpoint",
    "Checkpoints",
    "CommitConflict",
    "Rewound",
    "SkippedCheckpoint",
]
