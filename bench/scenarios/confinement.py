"""Scenario: what the confinement of a command costs (X1–X9). The same bash call,
``true``, run by the bash tool in-process: once with no sandbox at all (the tool's
``confined`` replaced by a pass-through, so the tool's own work is the same), then
under each sandbox profile; calls interleaved so that a busy moment hits all alike."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import summary
from toolpool import FileReadRegister, ToolContext
from toolpool.cancel import CancelToken
from toolpool.sandbox.command import Confinement, confined
from toolpool.sandbox.profile import MECHANISMS, SandboxProfile, set_active_profile
from toolpool.tools.bash import bash

# The module, not the tool instance that toolpool.tools exports under the same name.
bash_module: Any = importlib.import_module("toolpool.tools.bash")

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
                    bash_module.confined = _bare if name == "none" else confined
                    call = dataclasses.replace(ctx, allow_network=PROFILES[name][1])
                    began = time.perf_counter()
                    bash.execute({"command": "true"}, call)
                    if i >= 2:  # the first rounds warm the caches
                        samples[name].append((time.perf_counter() - began) * 1000)
        finally:
            bash_module.confined = confined
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
    }
