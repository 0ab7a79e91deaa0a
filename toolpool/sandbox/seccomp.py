"""seccomp filters, compiled with libseccomp (through pyseccomp) to BPF once.

Two filters, one stricter than the other:
- ``worker``: system calls no tool has a reason to make (ptrace, kernel modules,
  kexec, bpf, perf, keyrings, swap, reboot, clock setting…) fail with EPERM;
- ``command``: the same plus the ones that change the filesystem view or the
  namespaces (mount, pivot_root, unshare, setns, chroot), for the commands tools
  start. The worker keeps those because bubblewrap needs them to build its sandbox.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from pathlib import Path

WORKER_DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "userfaultfd",
    "open_by_handle_at",
    "lookup_dcookie",
)
COMMAND_DENIED = (
    *WORKER_DENIED,
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsmount",
    "move_mount",
    "open_tree",
)


def available() -> str | None:
    """None when filters can be built here, else why not."""
    try:
        import pyseccomp  # noqa: F401
    except Exception as exc:  # pyseccomp raises plain exceptions when libseccomp is absent
        return f"pyseccomp/libseccomp unavailable: {exc}"
    return None


def _build(kind: str) -> object:
    import pyseccomp

    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in WORKER_DENIED if kind == "worker" else COMMAND_DENIED:
        try:
            flt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except Exception:
            continue  # a system call this architecture or libseccomp does not know
    return flt


@functools.cache
def bpf_file(kind: str) -> Path:
    """The BPF program of filter ``kind`` ("worker" or "command"), compiled once per
    process into a private temporary file (bubblewrap and the exec wrapper load it)."""
    flt = _build(kind)
    fd, name = tempfile.mkstemp(prefix=f"toolpool-seccomp-{kind}-", suffix=".bpf")
    with os.fdopen(fd, "wb") as f:
        flt.export_bpf(f)  # type: ignore[attr-defined]
    return Path(name)


def load_in_this_process(kind: str) -> None:
    """Apply filter ``kind`` to this process and every process it starts."""
    _build(kind).load()  # type: ignore[attr-defined]
