"""``python -m toolpool.ray.tether PARENT -- ARGV…``: become ARGV, dying with PARENT.

A node's actor starts its daemon through this: the kernel then sends SIGKILL to the
daemon when the thread of the actor that started it ends (``PR_SET_PDEATHSIG``),
the actor's process killed by Ray or by a signal included, and the daemon's zygote
and workers die with it as they always do. The death signal survives ``execv``;
``PARENT`` catches the actor that died before the signal was set.
"""

from __future__ import annotations

import os
import signal
import sys

from toolpool.sandbox import linux


def main(argv: list[str]) -> int:
    """Become ``ARGV``; return (an exit status) only when that cannot be done."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m toolpool.ray.tether PARENT_PID -- ARGV…", file=sys.stderr)
        return 2
    try:
        linux.die_with_parent(signal.SIGKILL)
    except ProcessLookupError:
        return 1
    if os.getppid() != int(argv[0]):  # the parent ended before we were started
        return 1
    try:
        os.execv(argv[2], argv[2:])
    except OSError as exc:
        print(f"toolpool.ray.tether: cannot run {argv[2]}: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
