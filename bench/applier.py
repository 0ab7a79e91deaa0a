"""The in-process applier: what an agent program would do with the same calls without
toolpool — plain Python, one call after another, in its own process.

It does the work the tools do and no more: ``read`` numbers the lines it shows;
``grep`` and ``glob`` run ``rg`` with the flags toolpool's tools pass (toolpool's grep
runs rg too), newest files first; ``ls`` walks the tree; ``edit`` and ``write`` keep a
register of what was read (a content hash, checked before replacing a file) and make
the same durable writes as toolpool's ``atomic.py``: a temporary file in the same
directory, written, fsynced, renamed over the name, then the directory fsynced. No
sandbox, no process hop, no schema check, no events.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import subprocess
from pathlib import Path
from typing import Any

from toolpool import ToolCall
from toolpool.tools.support.ripgrep import RIPGREP_DEFAULTS, ripgrep_executable

MAX_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_GREP_CHARS = 30_000
MAX_GLOB = 100
MAX_LS = 1000
SKIPPED_DIRS = {".git", "node_modules", "__pycache__", ".venv", "venv"}


def _hash(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def durable_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temporary file, fsync, rename, fsync the directory."""
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            st = os.stat(path.name, dir_fd=directory, follow_symlinks=False)
            mode: int | None = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
        except FileNotFoundError:
            mode = None
        temp = f".{path.name}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o666, dir_fd=directory)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if mode is not None:
                    os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, path.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=directory)
            raise
        os.fsync(directory)
    finally:
        os.close(directory)


class Applier:
    """Carries out ``ToolCall``s on the tree at ``root``; raises on a call it cannot
    make (the session's calls are all meant to succeed)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.register: dict[Path, bytes] = {}  # path → hash of the bytes read or written
        self.rg = ripgrep_executable()

    def apply(self, call: ToolCall) -> str:
        args = call.arguments
        if call.name == "read":
            return self.read(args["path"])
        if call.name == "grep":
            return self.grep(args)
        if call.name == "glob":
            return self.glob(args["pattern"], args.get("path", "."))
        if call.name == "ls":
            return self.ls(args.get("path", "."))
        if call.name == "edit":
            return self.edit(args["path"], args["old_string"], args["new_string"])
        if call.name == "write":
            return self.write(args["path"], args["content"])
        raise ValueError(f"the applier has no {call.name}")

    def read(self, relative: str) -> str:
        path = self.root / relative
        with open(path, "rb") as f:
            data = f.read()
        self.register[path] = _hash(data)
        lines = data.decode("utf-8", errors="replace").split("\n")
        if lines[-1] == "":
            lines.pop()
        return "\n".join(
            f"{n:>6}\t{line[:MAX_LINE_CHARS]}" for n, line in enumerate(lines[:MAX_LINES], 1)
        )

    def _rg(self, flags: list[str], cwd: Path) -> list[str]:
        done = subprocess.run(
            [self.rg, *RIPGREP_DEFAULTS, *flags],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
        if done.returncode == 2 and not done.stdout:
            raise RuntimeError(f"rg failed: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode("utf-8", errors="replace").splitlines()

    def _newest_first(self, cwd: Path, names: list[str]) -> list[str]:
        return sorted(names, key=lambda rel: (-os.stat(cwd / rel).st_mtime_ns, rel))

    def grep(self, args: dict[str, Any]) -> str:
        cwd = self.root / args.get("path", ".")
        mode = args.get("output_mode", "files_with_matches")
        flags: list[str] = []
        if args.get("glob"):
            flags.append(f"--glob={args['glob']}")
        if mode == "files_with_matches":
            flags.append("--files-with-matches")
        elif mode == "count":
            flags += ["--count", "--with-filename"]
        else:
            flags += ["--no-heading", "--with-filename", "--sort=path", "--line-number"]
            flags += [f"--context={args['-C']}"] if "-C" in args else []
        lines = self._rg([*flags, "--", args["pattern"]], cwd)
        if mode == "files_with_matches":
            lines = self._newest_first(cwd, lines)
        elif mode == "count":
            lines = sorted(lines)
        kept: list[str] = []
        chars = 0
        for line in lines[: args.get("head_limit")]:
            if chars + len(line) + 1 > MAX_GREP_CHARS:
                break
            kept.append(line)
            chars += len(line) + 1
        return "\n".join(kept) if kept else f"No matches for {args['pattern']}."

    def glob(self, pattern: str, relative: str) -> str:
        cwd = self.root / relative
        matched = self._newest_first(cwd, self._rg(["--files", f"--glob={pattern}"], cwd))
        return "\n".join(matched[:MAX_GLOB])

    def ls(self, relative: str) -> str:
        lines: list[str] = []
        for top, dirs, files in os.walk(self.root / relative):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            depth = len(Path(top).relative_to(self.root / relative).parts)
            lines += [f"{'  ' * depth}{d}/" for d in dirs]
            lines += [f"{'  ' * depth}{f}" for f in sorted(files)]
            if len(lines) >= MAX_LS:
                break
        return "\n".join(lines[:MAX_LS])

    def _check_read(self, path: Path, data: bytes) -> None:
        if self.register.get(path) != _hash(data):
            raise RuntimeError(f"{path} was not read, or changed since")

    def edit(self, relative: str, old: str, new: str) -> str:
        path = self.root / relative
        with open(path, "rb") as f:
            data = f.read()
        self._check_read(path, data)
        text = data.decode("utf-8")
        if text.count(old) != 1:
            raise RuntimeError(f"old_string occurs {text.count(old)} times in {relative}")
        written = text.replace(old, new, 1).encode("utf-8")
        durable_write(path, written)
        self.register[path] = _hash(written)
        return f"Edited {relative}"

    def write(self, relative: str, content: str) -> str:
        path = self.root / relative
        try:
            with open(path, "rb") as f:
                self._check_read(path, f.read())
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8")
        durable_write(path, data)
        self.register[path] = _hash(data)
        return f"Wrote {relative} ({len(data):,} bytes)"
