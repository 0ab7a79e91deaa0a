"""Which confinement mechanisms this machine offers, probed once (SPEC D3).

The pool applies the strongest profile available and says exactly what is off and
why; ``toolpool doctor`` prints it and the daemon logs it.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from toolpool.sandbox import cgroups, confine_exec, helper_binary, network, seccomp

MECHANISMS = (
    "rlimits",
    "cgroups",
    "bwrap",
    "session",
    "netns",
    "netns-outbound",
    "seccomp",
    "landlock",
)

_DESCRIPTIONS = {
    "rlimits": "rlimits in workers and tool processes (core, files, file size, CPU, memory)",
    "cgroups": "a cgroup per worker (memory, pids, CPU quota; kill the whole group)",
    "bwrap": "bubblewrap around commands: a user namespace without capabilities, read-only "
    "root, workspace writable, private /tmp and /run, the runtime dir and secrets hidden",
    "session": "one bubblewrap sandbox per session, commands started inside it by a static "
    "helper (each in its own PID namespace, with its call's cgroups and rlimits)",
    "netns": "workers of network-less sessions in their own, empty network namespace",
    "netns-outbound": "commands of network-allowed sessions in their own namespace, "
    "outbound only (pasta): this host's own services unreachable",
    "seccomp": "seccomp filters on workers and commands (no ptrace, mount API, kexec, bpf, "
    "new user namespaces…)",
    "landlock": "Landlock on ripgrep's walks (reads only under the roots), and on commands "
    "when bubblewrap is off (writes only under the roots, no TCP when offline)",
}


@dataclass(frozen=True, slots=True)
class Mechanism:
    name: str
    active: bool
    detail: str


@dataclass(frozen=True, slots=True)
class SandboxProfile:
    mechanisms: tuple[Mechanism, ...]

    def active(self, name: str) -> bool:
        return any(m.name == name and m.active for m in self.mechanisms)

    def describe(self) -> list[str]:
        """One line per mechanism: on/off, what it does, and the detail or the reason."""
        lines = []
        for m in self.mechanisms:
            mark = "on " if m.active else "off"
            lines.append(f"{mark} {m.name:<14} {_DESCRIPTIONS[m.name]} — {m.detail}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {m.name: {"active": m.active, "detail": m.detail} for m in self.mechanisms}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxProfile:
        return cls(
            tuple(
                Mechanism(name, bool(data[name]["active"]), str(data[name]["detail"]))
                for name in MECHANISMS
                if name in data
            )
        )

    @classmethod
    def nothing(cls) -> SandboxProfile:
        """rlimits only (they cannot be switched off)."""
        return cls.probe(disabled=set(MECHANISMS) - {"rlimits"})

    @classmethod
    def probe(cls, disabled: Collection[str] = ()) -> SandboxProfile:
        """What this machine offers, less ``disabled``; probed once per process."""
        unknown = set(disabled) - set(MECHANISMS)
        if unknown:
            raise ValueError(f"unknown sandbox mechanisms {sorted(unknown)}")
        return _probe(frozenset(disabled))


@functools.cache
def _probe(disabled: frozenset[str]) -> SandboxProfile:
    found = []
    for name in MECHANISMS:
        if name in disabled and name != "rlimits":
            found.append(Mechanism(name, False, "disabled by configuration"))
            continue
        active, detail = _PROBES[name]()
        found.append(Mechanism(name, active, detail))
    return SandboxProfile(tuple(found))


def _run(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    lines = (done.stderr or done.stdout).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else f"exit status {done.returncode}"


def _probe_rlimits() -> tuple[bool, str]:
    return True, "always available"


def _probe_cgroups() -> tuple[bool, str]:
    tree = cgroups.CgroupTree.probe()
    if tree is None:
        return False, "no writable cgroup hierarchy (not root, or not delegated)"
    if not tree.controllers and not tree.can_kill:
        return False, f"no usable controller: {tree.describe()}"
    return True, tree.describe()


def _probe_bwrap() -> tuple[bool, str]:
    path = shutil.which("bwrap")
    if path is None:
        return False, "bwrap not installed (Debian package bubblewrap)"
    namespaces = ["--unshare-pid", "--unshare-net", "--die-with-parent"]
    mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    ok, why = _run([path, *mounts, *namespaces, "true"])
    return (True, path) if ok else (False, f"bwrap cannot create namespaces here: {why}")


def _probe_session() -> tuple[bool, str]:
    if not _probe_bwrap()[0]:
        return False, "needs bubblewrap (commands then get a sandbox each)"
    try:
        helper = helper_binary.spawner_binary()
    except helper_binary.HelperBuildError as exc:
        return False, f"{exc} (commands then get a sandbox each)"
    return True, f"helper {helper}"


def _probe_netns() -> tuple[bool, str]:
    code = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x40000000) != 0)"
    ok, _ = _run([sys.executable, "-I", "-S", "-c", code])
    return (True, "unshare(CLONE_NEWNET) works") if ok else (False, "unshare(CLONE_NEWNET) denied")


def _probe_seccomp() -> tuple[bool, str]:
    why = seccomp.available()
    if why is not None:
        return False, why
    seccomp.bpf_program("command")
    return True, f"{len(seccomp.WORKER_DENIED)} system calls denied to workers"


def _probe_landlock() -> tuple[bool, str]:
    abi = confine_exec.landlock_abi()
    if abi < 1:
        return False, "the kernel offers no Landlock"
    extra = ", TCP rules" if abi >= 4 else ""
    return True, f"ABI {abi}{extra}"


def _probe_outbound() -> tuple[bool, str]:
    if not _probe_bwrap()[0]:
        return False, "needs bubblewrap"
    return network.probe()


_PROBES = {
    "rlimits": _probe_rlimits,
    "cgroups": _probe_cgroups,
    "bwrap": _probe_bwrap,
    "session": _probe_session,
    "netns": _probe_netns,
    "netns-outbound": _probe_outbound,
    "seccomp": _probe_seccomp,
    "landlock": _probe_landlock,
}

_active: SandboxProfile | None = None


def active_profile() -> SandboxProfile:
    """The profile of this process: set by the worker from its configuration, or
    probed on first use (in-process execution)."""
    global _active
    if _active is None:
        _active = SandboxProfile.probe()
    return _active


def set_active_profile(profile: SandboxProfile) -> None:
    global _active
    _active = profile
