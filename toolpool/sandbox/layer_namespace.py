"""The namespaces a daemon not run as root mounts a session's layers in (SPEC V17):
the client of ``layer_holder.py``, one holder process per session.

    space = LayerNamespace.start()               # a user + mount namespace, ready
    space.mount("tmpfs", "/run/x/1.l", "tmpfs", "size=1048576,mode=0700")
    space.overlay("/run/x/1.l/w/merged", ["/ws"], upper, work, ["userxattr"])
    space.outside + "/run/x/1.l"                 # that tmpfs, seen from here
    [*space.enter_argv(), "bwrap", ...]          # a sandbox started inside them
    space.close()                                # the holder ends, its mounts with it

The sessions forked from one another share one holder (``retain``: each ``close``
lets one user go; the last ends it).

A path is the same inside and outside (the mount namespace is a copy of the host's
made when the holder started); only what is mounted there differs, which the daemon
and its workers reach through ``/proc/<holder>/root`` — the holder runs as the
daemon's user and stays dumpable, so the kernel lets them. Raises OSError, saying why.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from toolpool.sandbox import layer_holder

START_SECONDS = 10.0


class LayerNamespace:
    """A running holder: ``outside`` is the prefix its mounts are reached by."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process
        self.pid = process.pid
        self.outside = f"/proc/{process.pid}/root"
        self._users = 1
        self._lock = threading.Lock()  # one request at a time: forks' threads share it

    @classmethod
    def start(cls) -> LayerNamespace:
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise OSError("nsenter (util-linux) is missing: sandboxes could not enter the layers")
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", layer_holder.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        space = cls(process)
        first = space._answer()
        if first != "ready":
            space.close()
            raise OSError(f"the layers' user namespace could not be made: {first}")
        return space

    def _answer(self) -> str:
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        return line or "its holder ended"

    def _ask(self, request: list[object]) -> None:
        """One request; OSError with the holder's reason when it failed."""
        assert self._process.stdin is not None
        with self._lock:
            try:
                self._process.stdin.write(json.dumps(request) + "\n")
                self._process.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise OSError("the layers' holder ended") from None
            answer = self._answer()
        if answer != "ok":
            why = answer.removeprefix("error: ")
            number = re.match(r"\[Errno (\d+)\] ", why)  # OSError's str(): its errno kept
            if number is None:
                raise OSError(why)
            raise OSError(int(number.group(1)), why[number.end() :])

    def mount(self, source: str, target: Path | str, kind: str, options: str) -> None:
        """Mount there; OSError with the holder's reason when it could not."""
        self._ask(["mount", source, str(target), kind, options])

    def overlay(
        self,
        target: Path | str,
        lowers: Sequence[str],
        upper: str,
        work: str,
        options: Sequence[str],
    ) -> None:
        """An overlay there (``layer_holder.mount_overlay``)."""
        self._ask(["overlay", str(target), list(lowers), upper, work, list(options)])

    def unmount(self, target: Path | str, *, lazily: bool = False) -> None:
        """Unmount there (EBUSY when something uses it, unless ``lazily``)."""
        self._ask(["umount", str(target), lazily])

    def retain(self) -> LayerNamespace:
        """One more user (a fork's layers); each ``close`` lets one go."""
        with self._lock:
            self._users += 1
        return self

    def enter_argv(self) -> tuple[str, ...]:
        """The prefix that runs a command inside these namespaces, as this user."""
        target = f"--target={self.pid}"
        return ("nsenter", target, "--user", "--mount", "--preserve-credentials", "--")

    def close(self) -> None:
        """Let one user go; the last ends the holder (its mounts go when nothing runs
        in them any more)."""
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
        with contextlib.suppress(OSError, ValueError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(START_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000


@contextlib.contextmanager
def entering(holder: int, cwd_fd: int) -> Iterator[Callable[[], None]]:
    """A ``preexec_fn`` that moves a child into the namespaces of the holder ``holder``
    and there into the directory ``cwd_fd`` names: for a program that must run in a
    directory only those namespaces show (rg, whose getcwd fails from outside). The
    namespaces are opened here, before the child exists, so that a Landlock domain the
    child runs under (it confines paths, and /proc is none of its) cannot refuse them;
    ``setns`` takes them by fd. Credentials stay as they are (``--preserve-credentials``)."""
    user = os.open(f"/proc/{holder}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        mount = os.open(f"/proc/{holder}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(user)
        raise
    libc = ctypes.CDLL(None, use_errno=True)

    def enter() -> None:  # in the child, after fork: one thread
        if libc.setns(user, _CLONE_NEWUSER) or libc.setns(mount, _CLONE_NEWNS):
            raise OSError(ctypes.get_errno(), "setns into the session's layers")
        os.fchdir(cwd_fd)

    try:
        yield enter
    finally:
        os.close(user)
        os.close(mount)
