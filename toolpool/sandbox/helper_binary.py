"""The session sandbox's static helper (spawner.c), built once per source version.

    path = spawner_binary()   # raises HelperBuildError saying what to install

The helper runs inside every session sandbox, so it must not depend on anything of
the sandbox's root (later an image's): it is linked statically, from the source
shipped in this package, with the host's C compiler. Binaries are cached under
``$TOOLPOOL_HELPER_DIR``, else ``$XDG_CACHE_HOME/toolpool/helpers``, else
``~/.cache/toolpool/helpers``, named by the hash of the source and the flags, so a
changed source is rebuilt and an unchanged one is reused. A build goes to a
temporary file beside the final one and is renamed into place: two processes
building at once both succeed, and neither ever runs a half-written binary.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("spawner.c")
CFLAGS = ("-static", "-O2", "-Wall", "-Wextra", "-Werror")
_INSTALL = "install a C compiler and a static C library (Debian: apt-get install gcc libc6-dev)"


class HelperBuildError(Exception):
    """The helper could not be built here; the message says why and what to install."""


def cache_dir() -> Path:
    """Where built helpers are kept (see the module docstring)."""
    explicit = os.environ.get("TOOLPOOL_HELPER_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolpool" / "helpers"


def _digest(source: bytes, compiler: str) -> str:
    h = hashlib.sha256(source)
    h.update("\0".join((compiler, *CFLAGS)).encode())
    return h.hexdigest()[:16]


def spawner_binary(source: Path = SOURCE, directory: Path | None = None) -> Path:
    """The path of the built helper for ``source``, building it if it is not cached."""
    return _built(source, directory or cache_dir(), os.environ.get("CC") or "cc")


@functools.cache
def _built(source: Path, directory: Path, cc: str) -> Path:
    compiler = shutil.which(cc)
    if compiler is None:
        raise HelperBuildError(f"no C compiler ({cc}) to build the sandbox helper: {_INSTALL}")
    text = source.read_bytes()
    target = directory / f"spawner-{_digest(text, compiler)}"
    if os.access(target, os.X_OK):
        return target
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise HelperBuildError(f"cannot create {directory} for the sandbox helper: {exc}") from exc
    fd, partial = tempfile.mkstemp(prefix=".spawner-", dir=directory)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *CFLAGS, "-o", partial, str(source)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            why = lines[-1] if lines else f"exit status {done.returncode}"
            raise HelperBuildError(
                f"cannot build the sandbox helper with {compiler}: {why}; {_INSTALL}"
            )
        os.chmod(partial, 0o755)
        os.replace(partial, target)  # atomic: a concurrent build renames an equal file
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HelperBuildError(f"cannot build the sandbox helper: {exc}; {_INSTALL}") from exc
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
