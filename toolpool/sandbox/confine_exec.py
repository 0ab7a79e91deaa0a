"""Confine this process, then exec a command: ``python -I -S confine_exec.py
[--rw DIR]... [--seccomp FILE] [--no-network] -- ARGV...``.

Standard library only, so it starts in milliseconds with ``-I -S`` and runs inside
bubblewrap's read-only root. Two layers, each applied when asked:

- Landlock: writes are allowed only under the ``--rw`` directories (and to the
  ``--rw`` files, such as /dev/null); with
  ``--no-network`` (and Landlock ABI >= 4) TCP bind and connect are refused;
- seccomp: the BPF program in ``--seccomp`` (compiled by toolpool.sandbox.seccomp)
  is loaded with no_new_privs.

Exits 126 with a message when a requested layer cannot be applied.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

# LANDLOCK_ACCESS_FS_* bits; the first three are reads and stay unrestricted.
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


def _restrict_landlock(writable: list[str], no_network: bool) -> None:
    abi = landlock_abi()
    if abi < 1:
        _fail("Landlock is not available")
    fs = 0
    for version, bits in _FS_WRITE.items():
        if abi >= version:
            fs |= bits
    net = _NET_TCP if (no_network and abi >= 4) else 0
    attr = struct.pack("QQ", fs, net) if abi >= 4 else struct.pack("Q", fs)
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, attr, len(attr), 0)
    if ruleset < 0:
        _fail("landlock_create_ruleset")
    for path in writable:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        # A rule on a file (/dev/null…) may only grant the rights files have.
        allowed = fs if os.path.isdir(path) else fs & _FILE_RIGHTS
        rule = struct.pack("=Qi", allowed, fd)  # landlock_path_beneath_attr is packed
        if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) < 0:
            _fail(f"landlock_add_rule {path}")
        os.close(fd)
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail("no_new_privs")
    if _libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) < 0:
        _fail("landlock_restrict_self")
    os.close(ruleset)


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


def main(argv: list[str]) -> None:
    writable: list[str] = []
    seccomp: str | None = None
    no_network = False
    landlock = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--rw":
            writable.append(argv[i + 1])
            landlock = True
            i += 2
        elif argv[i] == "--seccomp":
            seccomp = argv[i + 1]
            i += 2
        elif argv[i] == "--no-network":
            no_network = True
            i += 1
        else:
            sys.stderr.write(f"toolpool sandbox: unknown option {argv[i]}\n")
            sys.exit(126)
    command = argv[i + 1 :]
    if not command:
        sys.stderr.write("toolpool sandbox: no command\n")
        sys.exit(126)
    if landlock:
        _restrict_landlock(writable, no_network)
    if seccomp is not None:
        _load_seccomp(seccomp)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
