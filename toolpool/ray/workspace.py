"""Sessions' workspaces: where they come from (the driver's side) and how a node
makes them (its actor's side).

A workspace is one of:

- a path that exists on the node (``str`` or ``os.PathLike``): used as it is, and
  left as it is when the session closes;
- a tarball (``bytes``, or a Ray ``ObjectRef`` to bytes put once for many sessions):
  shipped through Ray's object store and unpacked into a directory of the session's
  own (``pack(directory)`` makes one);
- ``GitSource(url, revision)``: cloned and checked out on the node into a directory
  of the session's own.

A directory made for a session is removed when the session closes.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from toolpool.ray.errors import WorkspaceError


@dataclass(frozen=True, slots=True)
class GitSource:
    """A repository to clone on the node (any URL git takes: https, ssh, file://)
    and the revision to check out (a commit, tag or branch)."""

    url: str
    revision: str = "HEAD"

    def __post_init__(self) -> None:
        # Both go to git as arguments: neither may read as one of its options.
        if not self.url or self.url.startswith("-"):
            raise ValueError(f"not a repository URL: {self.url!r}")
        if not self.revision or self.revision.startswith("-"):
            raise ValueError(f"not a revision: {self.revision!r}")


def pack(directory: str | os.PathLike[str]) -> bytes:
    """A gzipped tarball of ``directory``'s contents, for ``cluster.session``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in sorted(Path(directory).iterdir()):
            tar.add(entry, arcname=entry.name)
    return buffer.getvalue()


# --- on the node -----------------------------------------------------------------------


def existing(path: str) -> str:
    """``path`` as the node sees it: an existing directory, absolute."""
    where = Path(path).expanduser()
    if not where.is_dir():
        raise WorkspaceError(f"no directory {path!r} on this node")
    return str(where.resolve())


def unpack(data: bytes, into: Path) -> None:
    """Unpack a tarball into ``into`` with tarfile's "data" filter: no member lands
    outside it, no link points outside it, no device files, no set-id bits."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise WorkspaceError(f"the workspace tarball does not unpack: {exc}") from None


def clone(source: GitSource, into: Path, timeout: float) -> None:
    """``git clone`` the source into the empty directory ``into``, then check out its
    revision (detached). Git's own message is the error's."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # never wait for a password

    def git(step: str, *argv: str, cwd: Path | None = None) -> None:
        try:
            done = subprocess.run(
                ["git", step, *argv],
                cwd=cwd,
                capture_output=True,
                text=True,
                env=env,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise WorkspaceError(f"git {step} took more than {timeout:g} s") from None
        except OSError as exc:
            raise WorkspaceError(f"git cannot run on this node: {exc}") from None
        if done.returncode != 0:
            said = " ".join(done.stderr.split()) or f"status {done.returncode}"
            raise WorkspaceError(f"git {step} of {source.url} failed: {said[:1000]}")

    git("clone", "--quiet", "--no-checkout", "--", source.url, str(into))
    git("checkout", "--quiet", "--detach", source.revision, "--", cwd=into)
