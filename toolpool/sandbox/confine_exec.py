"""Confine this process, then exec a command: ``python -I -S confine_exec.py
[--cgroup PROCS]... [--rlimit NAME=N[:HARD]]... [--unshare-net] [--drop-caps] [--rw DIR]...
[--ro PATH]... [--seccomp FILE] [--no-network] -- ARGV...``.

Standard library only, so it starts in milliseconds with ``-I -S`` and runs inside
bubblewrap's read-only root. First, what a worker would have given the command had
it started it (the pool's background shells start theirs from the daemon, which
has none of it):

- ``--cgroup``: join the cgroup of that ``cgroup.procs`` file (one per hierarchy);
- ``--rlimit``: set an rlimit by its name (``RLIMIT_<NAME>``: ``CPU``, ``FSIZE``,
  ``NOFILE``, …; toolpool.sandbox.limits.rlimits says which and how much), soft and
  hard, or soft ``N`` and a hard limit of its own (``CPU=5:6``: SIGXCPU at 5 s, a death
  that names the limit, and SIGKILL at 6 s); with ``FSIZE`` SIGXFSZ is ignored, so
  that an oversized write fails with EFBIG as in a worker;
- ``--unshare-net``: a new, empty network namespace.

Then the layers, each applied when asked:

- Landlock: writes are allowed only under the ``--rw`` directories (and to the
  ``--rw`` files, such as /dev/null); when any ``--ro`` is given, reads and execution
  too are allowed only beneath the ``--ro`` paths and the ``--rw`` ones; with
  ``--no-network`` (and Landlock ABI >= 4) TCP bind and connect are refused;
- capabilities: with ``--drop-caps`` every set is emptied, the bounding set too;
- seccomp: the BPF program in ``--seccomp`` (compiled by toolpool.sandbox.seccomp)
  is loaded with no_new_privs.

Exits 126 with a message when a requested layer cannot be applied; writes one byte to
``--ready-fd`` once all are (the tool tells a sandbox failure from the command's own).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import struct
import sys

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_CLONE_NEWNET = 0x40000000

# LANDLOCK_ACCESS_FS_* bits. EXECUTE, READ_FILE and READ_DIR (bits 0, 2, 3) are
# handled only when --ro is given (_FS_READ); the rest are writes.
_FS_WRITE = {
    1: (1 << 1)  # WRITE_FILE
    | (1 << 4)  # REMOVE_DIR
    | (1 << 5)  # REMOVE_FILE
    | (1 << 6)  # MAKE_CHAR
    | (1 << 7)  # MAKE_DIR
    | (1 << 8)  # MAKE_REG
    | (1 << 9)  # MAKE_SOCK
    | (1 << 10)  # MAKE_FIFO
    | (1 << 11)  # MAKE_BLOCK
    | (1 << 12),  # MAKE_SYM
    2: 1 << 13,  # REFER
    3: 1 << 14,  # TRUNCATE
}
_FILE_RIGHTS = (1 << 1) | (1 << 14)  # WRITE_FILE | TRUNCATE
_FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE | READ_FILE | READ_DIR, ABI >= 1
_FILE_READ = (1 << 0) | (1 << 2)  # EXECUTE | READ_FILE: the read rights files have
_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP | CONNECT_TCP, ABI >= 4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _fail(what: str) -> None:
    err = ctypes.get_errno()
    sys.stderr.write(f"toolpool sandbox: {what}: {os.strerror(err)}\n")
    sys.exit(126)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is not available."""
    abi = _libc.syscall(_SYS_CREATE_RULESET, None, 0, 1)
    return max(int(abi), 0)


def landlock_ruleset(
    writable: list[str], no_network: bool, readable: list[str] | None = None
) -> int:
    """A Landlock ruleset fd: writes only beneath ``writable`` (files there may be
    written, not made), with ``readable`` also reads only beneath those and
    ``writable``, and no TCP with ``no_network`` (ABI >= 4). Raises OSError."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError(errno.EOPNOTSUPP, "Landlock is not available")
    fs = 0
    for version, bits in _FS_WRITE.items():
        if abi >= version:
            fs |= bits
    if readable:
        fs |= _FS_READ
    net = _NET_TCP if (no_network and abi >= 4) else 0
    attr = struct.pack("QQ", fs, net) if abi >= 4 else struct.pack("Q", fs)
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, attr, len(attr), 0)
    if ruleset < 0:
        _raise("landlock_create_ruleset")
    try:
        for path in writable:
            # A rule on a file (/dev/null…) may only grant the rights files have.
            file_rights = fs & (_FILE_RIGHTS | _FILE_READ)
            _add_rule(ruleset, path, fs if os.path.isdir(path) else file_rights)
        for path in readable or ():
            _add_rule(ruleset, path, _FS_READ if os.path.isdir(path) else _FILE_READ)
    except BaseException:
        os.close(ruleset)
        raise
    return int(ruleset)


def _add_rule(ruleset: int, path: str, allowed: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = struct.pack("=Qi", allowed, fd)  # landlock_path_beneath_attr is packed
        if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) < 0:
            _raise(f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def restrict_thread(ruleset: int) -> None:
    """Put the calling thread (and what it forks from now on) under ``ruleset``, for
    good; other threads of the process are not affected. Raises OSError."""
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _raise("no_new_privs")
    if _libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) < 0:
        _raise("landlock_restrict_self")


def _raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _restrict_landlock(
    writable: list[str], no_network: bool, readable: list[str] | None = None
) -> None:
    try:
        ruleset = landlock_ruleset(writable, no_network, readable)
        restrict_thread(ruleset)
    except OSError as exc:
        sys.stderr.write(f"toolpool sandbox: Landlock: {exc.strerror or exc}\n")
        sys.exit(126)
    os.close(ruleset)


def _drop_capabilities() -> None:
    """Empty every capability set for good (X5): the bounding set first (that needs
    CAP_SETPCAP, which bubblewrap leaves us for this alone), then ambient, then
    effective, permitted and inheritable."""
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            _fail(f"dropping capability {cap} from the bounding set")
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("Ii", _CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two struct __user_cap_data_struct, all zero
    if _libc.capset(header, data) != 0:
        _fail("capset")


def _load_seccomp(path: str) -> None:
    with open(path, "rb") as f:
        program = f.read()
    count = len(program) // 8  # struct sock_filter is 8 bytes
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HxxxxxxP", count, ctypes.addressof(buf))
    fprog_buf = ctypes.create_string_buffer(fprog, len(fprog))
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail("no_new_privs")
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog_buf, 0, 0) != 0:
        _fail("seccomp")


def _join_cgroup(procs: str) -> None:
    try:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        sys.stderr.write(f"toolpool sandbox: joining the cgroup {procs}: {exc.strerror}\n")
        sys.exit(126)


def _set_rlimit(item: str) -> None:
    name, _, value = item.partition("=")
    soft, _, hard = value.partition(":")
    which = getattr(resource, f"RLIMIT_{name}", None) if name.isalpha() else None
    if not isinstance(which, int) or not soft.isdigit() or not (hard or soft).isdigit():
        sys.stderr.write(f"toolpool sandbox: bad --rlimit {item}\n")
        sys.exit(126)
    cap = resource.getrlimit(which)[1]
    limits = [int(soft), int(hard or soft)]
    if cap != resource.RLIM_INFINITY:
        limits = [min(limit, cap) for limit in limits]
    try:
        resource.setrlimit(which, (min(limits), limits[1]))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"toolpool sandbox: setting RLIMIT_{name}: {exc}\n")
        sys.exit(126)
    if name == "FSIZE":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # exec keeps it ignored


def main(argv: list[str]) -> None:
    writable: list[str] = []
    readable: list[str] = []
    seccomp: str | None = None
    no_network = False
    landlock = False
    drop_caps = False
    ready_fd: int | None = None
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--rw":
            writable.append(argv[i + 1])
            landlock = True
            i += 2
        elif argv[i] == "--ro":
            readable.append(argv[i + 1])
            landlock = True
            i += 2
        elif argv[i] == "--seccomp":
            seccomp = argv[i + 1]
            i += 2
        elif argv[i] == "--no-network":
            no_network = True
            i += 1
        elif argv[i] == "--drop-caps":
            drop_caps = True
            i += 1
        elif argv[i] == "--ready-fd":
            ready_fd = int(argv[i + 1])
            i += 2
        elif argv[i] == "--cgroup":
            _join_cgroup(argv[i + 1])
            i += 2
        elif argv[i] == "--rlimit":
            _set_rlimit(argv[i + 1])
            i += 2
        elif argv[i] == "--unshare-net":
            if _libc.unshare(_CLONE_NEWNET) != 0:
                _fail("unshare(CLONE_NEWNET)")
            i += 1
        else:
            sys.stderr.write(f"toolpool sandbox: unknown option {argv[i]}\n")
            sys.exit(126)
    command = argv[i + 1 :]
    if not command:
        sys.stderr.write("toolpool sandbox: no command\n")
        sys.exit(126)
    if drop_caps:
        _drop_capabilities()
    if landlock:
        if readable and seccomp is not None:
            readable.append(seccomp)  # read after Landlock, below
        _restrict_landlock(writable, no_network, readable)
    if seccomp is not None:
        _load_seccomp(seccomp)
    if ready_fd is not None:
        # Every layer is in place: tell the tool that what runs now is the command.
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
