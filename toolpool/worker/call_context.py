"""What a call's tool sees in the worker: the ``ToolContext`` made from the
``CallContext`` the pool sent (``PoolExecutor`` builds that from the engine's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolpool.background import BackgroundShells
from toolpool.cancel import CancelToken
from toolpool.file_reads import RecordingRegister
from toolpool.models import ToolCall
from toolpool.protocol import CallContext
from toolpool.sandbox.limits import Limits
from toolpool.tool import ToolContext


@dataclass(frozen=True, slots=True)
class CallPlaces:
    """A ``CallContext``'s paths as the ``ToolContext`` holds them (``Path``s are
    immutable: calls of one session share them)."""

    workspace: Path
    extra_roots: tuple[Path, ...]
    scratch_dir: Path | None
    workspace_view: Path | None

    @classmethod
    def of(cls, context: CallContext) -> CallPlaces:
        scratch = None if context.scratch_dir is None else Path(context.scratch_dir)
        view = Path(context.workspace_view) if context.workspace_view else None
        roots = tuple(Path(p) for p in context.extra_roots)
        return cls(Path(context.workspace), roots, scratch, view)


def tool_context(
    context: CallContext,
    call: ToolCall,
    files: RecordingRegister,
    token: CancelToken,
    progress: Callable[[Any], None],
    limits: Limits,
    places: CallPlaces | None = None,
    shells: BackgroundShells | None = None,
) -> ToolContext:
    """The ``ToolContext`` a call's tool sees in the worker, from the ``CallContext``
    the pool sent (``PoolExecutor`` builds it from the engine's); ``places`` are its
    paths when the caller has them already, ``shells`` the session's background
    shells as the pool offers them."""
    if places is None:
        places = CallPlaces.of(context)
    return ToolContext(
        call_id=call.id,
        tool_name=call.name,
        session_id=context.session_id,
        workspace=places.workspace,
        files=files,
        extra_roots=places.extra_roots,
        allow_network=context.allow_network,
        persistent_shell=context.persistent_shell,
        root=context.root,
        layer_bytes=context.layer_bytes,
        image=context.image,
        workspace_overlay=context.workspace_overlay,
        workspace_view=places.workspace_view,
        scratch_dir=places.scratch_dir,
        cancel_token=token,
        progress=progress,
        limits=limits,
        shells=shells,
        tool_profile=context.tool_profile,
        egress=context.egress,
    )
