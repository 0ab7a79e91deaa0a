"""The client checks what it trusts (SPEC X10): a runtime dir, endpoint file or socket
that is not the user's own, or that others may write to, is refused with a clear
error before any connection is made. Needs root, to make files of another uid."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolpool import Client, ClientError
from toolpool.client.core import resolve_endpoint
from toolpool.client.errors import DaemonUnavailable, UntrustedEndpoint
from toolpool.runtime import ENDPOINT_NAME, SOCKET_NAME, RuntimeDirError, write_private

NOBODY = 65534

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


class Listener:
    """A real listening unix socket that counts the connections it was offered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o600)
        self.sock.listen(8)
        self.sock.setblocking(False)

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


def fake_daemon(runtime: Path) -> Listener:
    """A runtime dir laid out as a daemon leaves it: 0700, endpoint file, socket."""
    runtime.mkdir(mode=0o700, exist_ok=True)
    listener = Listener(runtime / SOCKET_NAME)
    endpoint = {"pid": os.getpid(), "ipc": f"ipc://{runtime / SOCKET_NAME}", "tcp": None}
    write_private(runtime / ENDPOINT_NAME, json.dumps(endpoint))
    return listener


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[tuple[Path, Listener]]:
    path = tmp_path / "rt"
    listener = fake_daemon(path)
    try:
        yield path, listener
    finally:
        listener.close()


def refused(runtime: Path, listener: Listener, *words: str) -> str:
    with pytest.raises(UntrustedEndpoint) as caught:
        Client(runtime_dir=runtime, connect_timeout=0.5, timeout=0.5)
    message = str(caught.value)
    for word in words:
        assert word in message, message
    assert listener.connections() == 0  # refused before any connection
    return message


@pytest.mark.spec("X10")
def test_X10_a_private_runtime_dir_is_trusted(runtime: tuple[Path, Listener]) -> None:
    path, _ = runtime
    assert resolve_endpoint(None, path).address == f"ipc://{path / SOCKET_NAME}"


@needs_root
@pytest.mark.spec("X10")
def test_X10_a_runtime_dir_of_another_user_is_refused(runtime: tuple[Path, Listener]) -> None:
    path, listener = runtime
    os.chown(path, NOBODY, NOBODY)
    message = refused(path, listener, str(path), f"uid {NOBODY}", "TOOLPOOL_RUNTIME_DIR")
    assert "runtime dir" in message


@pytest.mark.spec("X10")
@pytest.mark.parametrize("mode", [0o770, 0o702, 0o777])
def test_X10_a_runtime_dir_others_may_write_to_is_refused(
    runtime: tuple[Path, Listener], mode: int
) -> None:
    path, listener = runtime
    os.chmod(path, mode)
    refused(path, listener, str(path), "writable by others", oct(mode))


@pytest.mark.spec("X10")
def test_X10_a_runtime_dir_others_may_only_read_is_trusted(
    runtime: tuple[Path, Listener],
) -> None:
    path, _ = runtime
    os.chmod(path, 0o755)  # no one else can plant a file there (the daemon makes it 0700)
    assert resolve_endpoint(None, path).address == f"ipc://{path / SOCKET_NAME}"


@pytest.mark.spec("X10")
def test_X10_a_symlinked_runtime_dir_is_refused(
    tmp_path: Path, runtime: tuple[Path, Listener]
) -> None:
    path, listener = runtime
    link = tmp_path / "link"
    link.symlink_to(path)
    refused(link, listener, str(link), "symlink")


@pytest.mark.spec("X10")
@pytest.mark.parametrize("mode", [0o602, 0o620, 0o666])
def test_X10_an_endpoint_file_others_may_write_to_is_refused(
    runtime: tuple[Path, Listener], mode: int
) -> None:
    path, listener = runtime
    os.chmod(path / ENDPOINT_NAME, mode)
    refused(path, listener, str(path / ENDPOINT_NAME), "endpoint file", "writable by others")


@needs_root
@pytest.mark.spec("X10")
def test_X10_an_endpoint_file_of_another_user_is_refused(
    runtime: tuple[Path, Listener],
) -> None:
    path, listener = runtime
    os.chown(path / ENDPOINT_NAME, NOBODY, NOBODY)
    refused(path, listener, str(path / ENDPOINT_NAME), f"uid {NOBODY}")


@pytest.mark.spec("X10")
def test_X10_a_symlinked_endpoint_file_is_refused(
    tmp_path: Path, runtime: tuple[Path, Listener]
) -> None:
    path, listener = runtime
    elsewhere = tmp_path / "elsewhere.json"
    (path / ENDPOINT_NAME).rename(elsewhere)
    (path / ENDPOINT_NAME).symlink_to(elsewhere)
    refused(path, listener, str(path / ENDPOINT_NAME), "symlink")


@needs_root
@pytest.mark.spec("X10")
def test_X10_an_endpoint_naming_another_users_socket_is_refused(tmp_path: Path) -> None:
    """The report this fixes: a runtime dir of ours whose endpoint file names the
    socket of another user's daemon (in their directory)."""
    theirs = tmp_path / "theirs"
    listener = fake_daemon(theirs)
    try:
        os.chown(theirs / SOCKET_NAME, NOBODY, NOBODY)
        os.chown(theirs, NOBODY, NOBODY)
        ours = tmp_path / "ours"
        ours.mkdir(mode=0o700)
        endpoint = {"pid": 1, "ipc": f"ipc://{theirs / SOCKET_NAME}", "tcp": None}
        write_private(ours / ENDPOINT_NAME, json.dumps(endpoint))
        refused(ours, listener, str(theirs), f"uid {NOBODY}")
        os.chown(theirs, 0, 0)  # their socket in a directory of ours: still refused
        refused(ours, listener, str(theirs / SOCKET_NAME), "daemon socket", f"uid {NOBODY}")
    finally:
        listener.close()


@pytest.mark.spec("X10")
def test_X10_a_socket_that_is_a_symlink_or_world_writable_is_refused(
    tmp_path: Path, runtime: tuple[Path, Listener]
) -> None:
    path, listener = runtime
    os.chmod(path / SOCKET_NAME, 0o666)
    refused(path, listener, str(path / SOCKET_NAME), "daemon socket", "writable by others")
    os.chmod(path / SOCKET_NAME, 0o600)
    (path / SOCKET_NAME).rename(tmp_path / "real.sock")
    (path / SOCKET_NAME).symlink_to(tmp_path / "real.sock")
    refused(path, listener, str(path / SOCKET_NAME), "symlink")


@pytest.mark.spec("X10")
def test_X10_the_refusal_is_a_client_error_and_a_runtime_dir_error(
    runtime: tuple[Path, Listener],
) -> None:
    path, _ = runtime
    os.chmod(path, 0o777)
    with pytest.raises(ClientError):
        resolve_endpoint(None, path)
    with pytest.raises(RuntimeDirError):
        resolve_endpoint(None, path)


@pytest.mark.spec("X10")
def test_X10_no_runtime_dir_or_endpoint_file_is_still_no_daemon(tmp_path: Path) -> None:
    with pytest.raises(DaemonUnavailable, match="no toolpool daemon"):
        resolve_endpoint(None, tmp_path / "missing")
    (tmp_path / "empty").mkdir(mode=0o700)
    with pytest.raises(DaemonUnavailable, match="no toolpool daemon"):
        resolve_endpoint(None, tmp_path / "empty")
