"""What confined code may see: hidden paths, the environment, private /run (X2, X6, X9).

The daemon builds one ``Policy`` from its configuration and hands it to every worker;
the worker makes it the process's active policy. Commands get it from ``confined``
(bubblewrap hides every ``hidden`` path, the environment is built from the allowlist);
the file tools refuse hidden paths (``is_hidden``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Secrets a user keeps in their home: hidden from commands, refused by the file tools.
HOME_SECRETS = (
    ".ssh",
    ".aws",
    ".gnupg",
    ".config/gcloud",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
)
# When the daemon runs as root, commands without capabilities still pass owner checks
# on root's files: these are hidden too.
ROOT_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/root")

# Variables a command inherits from the daemon; everything else is dropped. Besides
# the locale and the terminal, where the machine keeps its CA certificates: a
# network-allowed command (pip, curl, git) must trust what the host trusts.
ENV_ALLOWED = (
    "PATH",
    "LANG",
    "TERM",
    "TZ",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)
ENV_ALLOWED_PREFIXES = ("LC_",)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


def default_deny_read(home: Path | None = None, *, root: bool | None = None) -> tuple[str, ...]:
    """The default ``deny_read``: the home's secrets, and root's files when root."""
    home = Path(os.path.expanduser("~")) if home is None else home
    root = os.geteuid() == 0 if root is None else root
    paths = [str(home / name) for name in HOME_SECRETS]
    if root:
        paths += ROOT_SECRETS
    return tuple(paths)


@dataclass(frozen=True, slots=True)
class Policy:
    """What confined code may see. ``hidden`` paths (deny_read, the runtime dir, key
    files) are absent inside commands and refused by the file tools; a workspace that
    lies inside a hidden path (under /root, say) stays visible."""

    hidden: tuple[str, ...] = ()
    env_passthrough: tuple[str, ...] = ()
    private_run: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        return cls(
            hidden=tuple(data.get("hidden", ())),
            env_passthrough=tuple(data.get("env_passthrough", ())),
            private_run=bool(data.get("private_run", True)),
        )

    @classmethod
    def default(cls, extra_hidden: Iterable[str | Path] = ()) -> Policy:
        return cls(hidden=(*default_deny_read(), *(str(p) for p in extra_hidden)))

    def hidden_paths(self) -> list[Path]:
        """The hidden paths as real paths (symlinks resolved), longest first."""
        return [Path(p) for p in _resolved(self.hidden)]

    def is_hidden(self, path: Path, roots: Iterable[Path] = ()) -> bool:
        """Whether the real path ``path`` lies in a hidden path. A hidden path that
        contains one of ``roots`` (the session's workspace under /root) hides only
        what lies outside those roots."""
        text = str(path)
        for hidden in _resolved(self.hidden):
            if not is_under(text, hidden):
                continue
            if any(is_under(text, str(r)) and is_under(str(r), hidden) for r in roots):
                continue
            return True
        return False

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A command's environment: the allowlist and ``env_passthrough`` taken from
        this process's environment, then ``extra`` (the tool's own variables)."""
        env: dict[str, str] = {}
        for name, value in os.environ.items():
            if (
                name in ENV_ALLOWED
                or name.startswith(ENV_ALLOWED_PREFIXES)
                or name in self.env_passthrough
            ):
                env[name] = value
        env.setdefault("PATH", DEFAULT_PATH)
        env.update(extra or {})
        return env

    def worker_environment(self) -> dict[str, str]:
        """The zygote's (so every worker's and Python tool's) environment: the
        command allowlist, plus what the interpreter and the tool modules need to
        import and find their home; never the daemon's secrets."""
        env = self.environment()
        for name, value in os.environ.items():
            if name in WORKER_ENV_ALLOWED or name.startswith(WORKER_ENV_PREFIXES):
                env[name] = value
        return env


# What workers keep besides ENV_ALLOWED (imports, home, temporary files, coverage).
WORKER_ENV_ALLOWED = ("HOME", "USER", "LOGNAME", "TMPDIR", "VIRTUAL_ENV", "XDG_RUNTIME_DIR")
WORKER_ENV_PREFIXES = ("PYTHON", "TOOLPOOL_", "COV_CORE_", "COVERAGE_")


@functools.lru_cache(maxsize=32)
def _resolved(hidden: tuple[str, ...]) -> tuple[str, ...]:
    """``hidden`` as real paths, longest first; resolved once per process (they are
    the operator's paths, not the model's): every file-tool call asks."""
    return tuple(sorted({os.path.realpath(p) for p in hidden}, key=lambda p: -p.count("/")))


def is_under(path: str, parent: str) -> bool:
    """Whether ``path`` is ``parent`` or lies beneath it (both real paths, as text)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


_active: Policy | None = None


def active_policy() -> Policy:
    """The policy of this process: set by the worker from its configuration, or the
    default (in-process execution)."""
    global _active
    if _active is None:
        _active = Policy.default()
    return _active


def set_active_policy(policy: Policy) -> None:
    global _active
    _active = policy
