"""A worker's ``ToolContext.shells``: background shells, asked of the pool.

The pool owns the shells (``toolpool.pool.shells``); a worker only asks, over its
channel, for the call it runs (the pool knows that call's session). What each
request did is kept as the call's result details (``details``): the shell's id, and
its state after a read or a kill.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

from toolpool.background import SandboxAddress, ShellInfo, ShellOutput
from toolpool.errors import ToolError
from toolpool.protocol import ShellAction, ShellReply, ShellRequest
from toolpool.worker.channel import Channel

# A start may wait for a network-allowed command's namespace (up to 10 s): beyond
# this the pool is not answering at all.
ANSWER_TIMEOUT = 30.0
_SANDBOXES_KEPT = 64  # sessions whose sandbox a worker remembers


class WorkerShells:
    """The ``BackgroundShells`` of the call a worker runs; ``begin`` it per call."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._call_id = ""
        self._sandbox_key: Hashable = None
        self._sandboxes: dict[Hashable, SandboxAddress | None] = {}  # the pool's answers
        self.details: dict[str, Any] = {}

    def begin(self, call_id: str, sandbox_key: Hashable) -> None:
        """A call starts; ``sandbox_key`` names the sandbox its commands run in (its
        session and whether it has network): the pool's answer for it is kept."""
        self._call_id = call_id
        self._sandbox_key = sandbox_key
        if self.details:
            self.details = {}

    def sandbox(self, again: bool = False) -> SandboxAddress | None:
        key = self._sandbox_key
        if not again and key in self._sandboxes:
            return self._sandboxes[key]
        reply = self._ask(ShellAction.SANDBOX)
        if len(self._sandboxes) >= _SANDBOXES_KEPT:
            self._sandboxes.clear()
        found = None
        if reply.socket:
            layer = Path(reply.layer) if reply.layer else None
            found = SandboxAddress(Path(reply.socket), layer, reply.env, reply.working_dir)
        self._sandboxes[key] = found
        return found

    def start(self, command: str) -> ShellInfo:
        return self._shell(self._ask(ShellAction.START, command=command))

    def output(self, shell_id: str) -> ShellOutput:
        reply = self._ask(ShellAction.OUTPUT, shell_id=shell_id)
        return ShellOutput(self._shell(reply), reply.start, reply.end)

    def kill(self, shell_id: str) -> ShellInfo:
        return self._shell(self._ask(ShellAction.KILL, shell_id=shell_id))

    def _ask(self, action: ShellAction, **fields: str) -> ShellReply:
        request = ShellRequest(self._call_id, self._channel.request_id(), action, **fields)
        try:
            reply = self._channel.ask(request, ANSWER_TIMEOUT)
        except TimeoutError as exc:
            raise ToolError(f"The daemon did not answer in time: {exc}.") from None
        if reply.error:
            raise ToolError(reply.error, code=reply.code or None)
        return reply

    def _shell(self, reply: ShellReply) -> ShellInfo:
        shell = ShellInfo.from_dict(reply.shell)
        self.details = {"shell_id": shell.shell_id, "shell_state": shell.state.value}
        if shell.exit_code is not None:
            self.details["shell_exit_code"] = shell.exit_code
        return shell
