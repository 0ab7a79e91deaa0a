"""Confining a command a tool starts (bash): bubblewrap, then Landlock and seccomp.

    with confined(["bash", "-c", cmd], workspace=ws, network=False) as c:
        subprocess.Popen(c.argv, pass_fds=c.pass_fds, start_new_session=True, ...)

Each layer is applied when the active profile has it:
- bubblewrap: a read-only view of /, the workspace (and ``writable`` extras)
  read-write, a private /tmp, its own PID namespace (ending bubblewrap ends every
  process inside, setsid daemons included), no network unless allowed, dies with
  its parent, and the command seccomp filter;
- the exec wrapper (confine_exec.py): Landlock write rules (and TCP rules offline),
  and the seccomp filter itself when bubblewrap is off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolpool.sandbox import confine_exec, seccomp
from toolpool.sandbox.profile import SandboxProfile, active_profile

# Device files every shell writes to; Landlock needs a rule for each.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")


@dataclass(frozen=True, slots=True)
class Confinement:
    argv: list[str]
    pass_fds: tuple[int, ...]
    layers: tuple[str, ...]


@contextlib.contextmanager
def confined(
    argv: Sequence[str],
    *,
    workspace: Path,
    writable: Sequence[Path] = (),
    network: bool = False,
    profile: SandboxProfile | None = None,
) -> Iterator[Confinement]:
    """The argv that runs ``argv`` confined, and the descriptors it must inherit;
    they are closed when the block ends (start the process inside it)."""
    profile = profile or active_profile()
    roots = [workspace, *writable]
    use_bwrap = profile.active("bwrap")
    layers: list[str] = []
    fds: list[int] = []
    try:
        wrapper: list[str] = []
        if profile.active("landlock"):
            # Inside bubblewrap /tmp is private; without it /tmp is shared but needed.
            for root in [*roots, Path("/tmp")]:
                wrapper += ["--rw", str(root)]
            wrapper += [arg for d in _DEVICES if os.path.exists(d) for arg in ("--rw", d)]
            if not network:
                wrapper.append("--no-network")
            layers.append("landlock")
        if profile.active("seccomp") and not use_bwrap:
            wrapper += ["--seccomp", str(seccomp.bpf_file("command"))]
            layers.append("seccomp")
        command = list(argv)
        if wrapper:
            command = [sys.executable, "-I", "-S", confine_exec.__file__, *wrapper, "--", *command]
        if use_bwrap:
            outer = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--unshare-pid"]
            outer += ["--unshare-ipc", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
            outer += ["--tmpfs", "/tmp"]
            for root in roots:
                outer += ["--bind", str(root), str(root)]
            if not network:
                outer.append("--unshare-net")
            if profile.active("seccomp"):
                fds.append(os.open(seccomp.bpf_file("command"), os.O_RDONLY))
                outer += ["--seccomp", str(fds[-1])]
                layers.append("seccomp")
            command = [*outer, "--chdir", str(workspace), "--", *command]
            layers.insert(0, "bwrap")
        yield Confinement(command, tuple(fds), tuple(layers))
    finally:
        for fd in fds:
            os.close(fd)
