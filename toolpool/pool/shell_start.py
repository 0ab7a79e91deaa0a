"""Where a background shell's command starts (SPEC V5): in its session's sandbox
(``shell_spawn.start_in_sandbox``, from a thread: the spawn's send may wait on the
sandbox's helper) or, where the session has none, in a sandbox of its own
(``shell_process.launch``, from the event loop's thread, which bubblewrap's
parent-death signal follows)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from toolpool.egress.environment import proxy_environment
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.shell_process import ShellProcess, launch
from toolpool.pool.shell_spawn import start_in_sandbox
from toolpool.protocol import CallContext
from toolpool.sandbox.cgroups import WorkerCgroup
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.spawn import SpawnError

# The session sandbox's socket, or a sandbox of its own's root arguments and views.
Where = Path | tuple[Sequence[str], Mapping[str, str]]


async def start_command(
    where: Where,
    context: CallContext,
    limits: Limits,
    command: str,
    cgroup: WorkerCgroup | None,
    mark: str,
    processes: WorkerProcesses,
    *,
    base: Mapping[str, str],
    call_id: str,
) -> tuple[ShellProcess, int] | str:
    """Start ``command`` (in ``cgroup``, with ``mark`` in its environment) where
    ``where`` says, with the pool's sandbox profile and policy: its process and the
    read end of its output pipe, or why the session's sandbox did not start it
    (nothing of it ran: another attempt may be made). ``base``: the environment an
    image root gives (V13); ``call_id``: the call whose a policy session's
    connections are (N3)."""
    profile, policy = processes.profile, processes.policy
    try:
        if isinstance(where, Path):
            egress = context.egress and not limits.network
            proxy = proxy_environment(context.egress, call_id) if egress else {}
            start = partial(start_in_sandbox, where, context, limits, command, cgroup, mark)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, start, policy, base, proxy)
        root, views = where
        return launch(context, limits, command, cgroup, mark, profile, policy, root, views)
    except SpawnError as exc:  # the sandbox is gone: the next attempt starts another
        return f"The session's sandbox is gone: {exc}."
