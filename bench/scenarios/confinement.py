"""Scenario: what the confinement of a command costs (X1–X9, V1). The same bash call,
``true``, run by the bash tool in-process: once with no sandbox at all (the tool's
``confined`` replaced by a pass-through, so the tool's own work is the same), then
under each sandbox profile; calls interleaved so that a busy moment hits all alike.

Then through the daemon (V1's target): in one session, a bash ``true``, an ``ls`` and
a plain fork-exec of ``true`` in the bench's process, interleaved; what the sandbox
adds is bash − ls − fork-exec (medians), for commands started in the session's
sandbox and, with the ``session`` mechanism off, in a sandbox each; offline and with
the network allowed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import daemon, summary
from toolpool import Client, FileReadRegister, ToolCall, ToolContext
from toolpool.cancel import CancelToken
from toolpool.sandbox import command as sandbox_command
from toolpool.sandbox.command import Confinement, confined
from toolpool.sandbox.profile import MECHANISMS, SandboxProfile, set_active_profile
from toolpool.tools.bash import bash

NAME = "confinement"
# The mechanisms switched off in each profile, and whether the session has network;
# "none" runs no sandbox at all. FULL is the default profile of an offline session.
PROFILES: dict[str, tuple[set[str], bool]] = {
    "none": (set(MECHANISMS) - {"rlimits"}, False),
    "exec wrapper only (no bwrap)": ({"bwrap"}, False),
    "bwrap, no seccomp": ({"seccomp"}, False),
    "full (bwrap + seccomp)": (set(), False),
    "full, network allowed (pasta)": (set(), True),
}
FULL = "full (bwrap + seccomp)"


@contextlib.contextmanager
def _bare(argv: Sequence[str], **options: Any) -> Iterator[Confinement]:
    """No sandbox: the command as given, in the caller's environment."""
    yield Confinement(list(argv), (), (), dict(os.environ))


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    rounds = 10 if quick else 60
    profiles = {name: SandboxProfile.probe(disabled=off) for name, (off, _) in PROFILES.items()}
    samples: dict[str, list[float]] = {name: [] for name in profiles}
    with tempfile.TemporaryDirectory(prefix="toolpool-bench-scratch-") as scratch:
        ctx = ToolContext(
            call_id="bench",
            tool_name="bash",
            session_id="bench",
            workspace=workspace.resolve(),
            files=FileReadRegister(),
            scratch_dir=Path(scratch),
            cancel_token=CancelToken(),
        )
        try:
            for i in range(rounds + 2):
                for name, profile in profiles.items():
                    set_active_profile(profile)
                    sandbox_command.confined = _bare if name == "none" else confined
                    call = dataclasses.replace(ctx, allow_network=PROFILES[name][1])
                    began = time.perf_counter()
                    bash.execute({"command": "true"}, call)
                    if i >= 2:  # the first rounds warm the caches
                        samples[name].append((time.perf_counter() - began) * 1000)
        finally:
            sandbox_command.confined = confined
            set_active_profile(SandboxProfile.probe())
    medians = {name: statistics.median(s) for name, s in samples.items()}
    networked = "full, network allowed (pasta)"
    return {
        "summary_ms": {name: summary(s) for name, s in samples.items()},
        "layers": {name: sorted(set(MECHANISMS) - off) for name, (off, _) in PROFILES.items()},
        "active": {
            name: [m.name for m in p.mechanisms if m.active] for name, p in profiles.items()
        },
        "added_ms": round(medians[FULL] - medians["none"], 2),
        "added_network_ms": round(medians[networked] - medians["none"], 2),
        "through_daemon": through_daemon(10 if quick else 50, workspace),
    }


def through_daemon(rounds: int, workspace: Path) -> dict[str, Any]:
    """Per kind of start (session sandbox, one sandbox each) and network: the medians
    of bash ``true``, ``ls`` and a fork-exec of ``true``, and what the sandbox adds."""
    found: dict[str, Any] = {}
    for kind, flags in (
        ("session sandbox", ()),
        ("a sandbox each", ("--sandbox-disabled", "session")),
    ):
        with daemon(1, *flags) as running, Client(runtime_dir=running.runtime) as client:
            for network in (False, True):
                with client.session(workspace, allow_network=network) as session:
                    found[f"{kind}{', network' if network else ''}"] = _paired(session, rounds)
    return found


def _paired(session: Any, rounds: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"bash true": [], "ls": [], "fork-exec true": []}
    calls = {
        "bash true": ToolCall("b", "bash", {"command": "true"}),
        "ls": ToolCall("l", "ls", {"path": "."}),
    }
    for i in range(rounds + 3):
        for name, samples_of in samples.items():
            began = time.perf_counter()
            if name in calls:
                (result,) = session.submit([calls[name]]).results()
                assert not result.is_error, result.text
            else:
                os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)
            if i >= 3:  # the first rounds start the sandbox and warm the caches
                samples_of.append((time.perf_counter() - began) * 1000)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    added = medians["bash true"] - medians["ls"] - medians["fork-exec true"]
    return {"median_ms": {k: round(v, 3) for k, v in medians.items()}, "added_ms": round(added, 3)}
