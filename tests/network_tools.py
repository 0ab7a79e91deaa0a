"""Python tools that reach for the network, for the network policy tests (SPEC N11):
they run in a policy session's own worker, in its network namespace."""

from __future__ import annotations

import os
import socket
import urllib.request
from typing import Any

from toolpool import tool


@tool
def fetch(url: str) -> dict[str, Any]:
    """Fetch ``url`` with urllib (it follows the proxy variables); what came back,
    or the error."""
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return {"status": response.status, "body": response.read(4096).decode()}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


@tool
def connect(host: str, port: int) -> dict[str, Any]:
    """Connect straight to ``host``:``port`` (no proxy); what happened."""
    try:
        with socket.create_connection((host, port), timeout=3):
            return {"connected": True}
    except OSError as exc:
        return {"connected": False, "error": str(exc)}


@tool
def proxy_variables() -> dict[str, str]:
    """The proxy variables this worker's process has."""
    return {k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")}


@tool
def leave_namespace(path: str) -> dict[str, Any]:
    """Try to enter the network namespace at ``path``: what happened."""
    import ctypes

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return {"left": False, "error": f"open: {exc.strerror}"}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, 0x40000000) != 0:
            return {"left": False, "error": os.strerror(ctypes.get_errno())}
        return {"left": True}
    finally:
        os.close(fd)
