"""seccomp filters, compiled with libseccomp (through pyseccomp) to BPF once.

Three filters, each stricter than the one before:
- ``worker``: system calls no tool has a reason to make (ptrace, kernel modules,
  kexec, bpf, perf, keyrings, swap, reboot, clock and host name setting, the new
  mount API…) fail with EPERM;
- ``bound``: a policy session's own worker's (N11), forked into its network
  namespace: the same plus setns and pidfd_getfd, so that it cannot step back into
  the host's namespace or borrow a socket from a process there;
- ``command`` (X5): the same plus everything that changes the filesystem view or the
  namespaces (mount, umount2, pivot_root, chroot, unshare, setns, and clone with
  CLONE_NEWUSER), for the commands tools start; ``clone3``, whose flags live in
  memory seccomp cannot read, answers ENOSYS so that libc falls back to clone. The
  worker keeps mount, umount2, pivot_root and namespaced clone because bubblewrap,
  which it starts, needs them to build the command's sandbox.

Programs reach bubblewrap and the exec wrapper as memfds (``bpf_fd``), never as
files (X8).
"""

from __future__ import annotations

import errno
import functools
import os
from typing import Any

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
    "sethostname",
    "setdomainname",
    # The new mount API: bubblewrap 0.8 does not use it, nothing else needs it.
    "mount_setattr",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
)
COMMAND_DENIED = (
    *WORKER_DENIED,
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
)
# A policy session's own worker (N11), in its network namespace: nor may it enter
# another namespace, nor take a descriptor (a socket of the host's) from a process.
BOUND_DENIED = (*WORKER_DENIED, "setns", "pidfd_getfd")
CLONE_NEWUSER = 0x10000000
_DENIED = {"worker": WORKER_DENIED, "bound": BOUND_DENIED, "command": COMMAND_DENIED}
# The processes that built a filter (a worker inherits the zygote's, and builds none).
BUILT_IN: list[int] = []


def available() -> str | None:
    """None when filters can be built here, else why not."""
    try:
        import pyseccomp  # noqa: F401
    except Exception as exc:  # pyseccomp raises plain exceptions when libseccomp is absent
        return f"pyseccomp/libseccomp unavailable: {exc}"
    return None


@functools.cache
def _build(kind: str) -> Any:
    """Filter ``kind`` as a libseccomp context, built once per process. The zygote
    builds the workers' before it forks (``prepare``): a worker that built its own
    would load pyseccomp, whose ``find_library`` runs ``ldconfig -p`` twice — two
    processes, most of a worker start's CPU (measured)."""
    import pyseccomp

    BUILT_IN.append(os.getpid())

    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    rules: list[tuple[Any, str, tuple[Any, ...]]] = [
        (pyseccomp.ERRNO(errno.EPERM), name, ()) for name in _DENIED[kind]
    ]
    if kind == "command":
        newuser = pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
        rules.append((pyseccomp.ERRNO(errno.EPERM), "clone", (newuser,)))
        rules.append((pyseccomp.ERRNO(errno.ENOSYS), "clone3", ()))
    for action, name, args in rules:
        try:
            flt.add_rule(action, name, *args)
        except Exception:
            continue  # a system call this architecture or libseccomp does not know
    return flt


@functools.cache
def bpf_program(kind: str) -> bytes:
    """The BPF program of filter ``kind`` ("worker" or "command"), compiled once."""
    fd = os.memfd_create(f"toolpool-seccomp-{kind}", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as f:
        _build(kind).export_bpf(f)
        f.seek(0)
        return f.read()


def bpf_fd(kind: str) -> int:
    """A new memfd holding the program of filter ``kind``, at offset 0, for one
    reader (bubblewrap reads it to the end). Not inheritable: pass it explicitly."""
    fd = os.memfd_create(f"toolpool-seccomp-{kind}", os.MFD_CLOEXEC)
    try:
        os.write(fd, bpf_program(kind))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def prepare() -> None:
    """Build the workers' filters, and the program of their commands', now, where
    the workers are forked from; nothing when they cannot be built here (a worker
    that needs one then says why)."""
    if available() is None:
        _build("worker")
        _build("bound")
        bpf_program("command")


def load_in_this_process(kind: str) -> None:
    """Apply filter ``kind`` to this process and every process it starts."""
    _build(kind).load()
