"""The pool's handle on its zygote process (toolpool.worker.zygote): spawn workers,
hear how they ended, and when the zygote last spoke (its heartbeats: SPEC L1)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolpool.errors import ToolpoolError
from toolpool.protocol import (
    HEADER_BYTES,
    Exited,
    Heartbeat,
    ProtocolError,
    Spawn,
    Spawned,
    decode,
    frame_length,
    framed,
)

log = logging.getLogger(__name__)


class ZygoteError(ToolpoolError):
    """The zygote could not start (a tool module failed to import…) or died."""


class Zygote:
    def __init__(
        self,
        tool_modules: Sequence[str],
        log_dir: Path,
        on_exit: Callable[[Exited], None],
        on_death: Callable[[str], None],
        *,
        heartbeat_interval: float,
        env: dict[str, str] | None = None,
        append_log: bool = False,
    ) -> None:
        self.tool_modules = list(tool_modules)
        self.log_dir = log_dir
        self.heartbeat_interval = heartbeat_interval
        self._on_exit = on_exit
        self._on_death = on_death  # called with how it ended, unless we closed it
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[int]] = {}
        self._closing = False
        self._env = env  # the workers' environment (None: this process's)
        self._append_log = append_log  # a replacement keeps what the one before logged
        self.started: asyncio.Future[None] | None = None  # its first heartbeat
        self.last_seen = time.monotonic()  # its last frame
        self.kill_reason: str | None = None  # set when the pool kills it (hung…)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def log_path(self) -> Path:
        return self.log_dir / "zygote.log"

    async def start(self) -> None:
        argv = [sys.executable, "-m", "toolpool.worker.zygote", "--log-dir", str(self.log_dir)]
        argv += ["--heartbeat-interval", str(self.heartbeat_interval)]
        for module in self.tool_modules:
            argv += ["--tool-module", module]
        self.started = asyncio.get_running_loop().create_future()
        mode = os.O_APPEND if self._append_log else os.O_TRUNC
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | mode, 0o600)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_fd,
                env=self._env,
            )
        finally:
            os.close(log_fd)
        self.last_seen = time.monotonic()
        self._reader = asyncio.ensure_future(self._read())

    async def wait_started(self, timeout: float) -> None:
        """Until its first heartbeat (its tool modules imported); ZygoteError, with
        the end of its log, when it dies or stays silent for ``timeout`` seconds."""
        assert self.started is not None
        try:
            await asyncio.wait_for(asyncio.shield(self.started), timeout)
        except TimeoutError:
            raise ZygoteError(self._failure(f"the zygote did not start in {timeout:g} s")) from None

    async def spawn(self, worker_id: str, config: dict[str, Any], timeout: float) -> int:
        """Ask for a worker; its pid once the zygote forked it."""
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            raise ZygoteError(self._failure("the zygote is not running"))
        future = asyncio.get_running_loop().create_future()
        self._pending[worker_id] = future
        try:
            process.stdin.write(framed(Spawn(worker_id, config)))
            await process.stdin.drain()
            return await asyncio.wait_for(future, timeout)
        except (ConnectionError, TimeoutError) as exc:
            raise ZygoteError(self._failure(f"spawning {worker_id} failed: {exc!r}")) from exc
        finally:
            self._pending.pop(worker_id, None)

    async def _read(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        try:
            while True:
                header = await process.stdout.readexactly(HEADER_BYTES)
                message = decode(await process.stdout.readexactly(frame_length(header)))
                self.last_seen = time.monotonic()
                if isinstance(message, Heartbeat):
                    if self.started is not None and not self.started.done():
                        self.started.set_result(None)
                elif isinstance(message, Spawned):
                    future = self._pending.get(message.worker_id)
                    if future is not None and not future.done():
                        future.set_result(message.pid)
                elif isinstance(message, Exited):
                    self._on_exit(message)
        except asyncio.IncompleteReadError:
            pass  # the zygote ended
        except ProtocolError as exc:
            log.error("bad frame from the zygote: %s", exc)
        code = await process.wait()
        failure = ZygoteError(self._failure("the zygote exited"))
        waiting: list[asyncio.Future[Any]] = [*self._pending.values()]
        for future in [*waiting, *([self.started] if self.started else [])]:
            if not future.done():
                future.set_exception(failure)
                future.exception()  # retrieved: whoever awaits it still gets it
        if not self._closing:
            log.error("%s", failure)
            self._on_death(self.kill_reason or _describe(code))

    def _failure(self, what: str) -> str:
        """``what``, with the end of the zygote's log (an import error…)."""
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            tail = []
        return what + (": " + " | ".join(tail) if tail else "")

    async def close(self, timeout: float = 5.0) -> None:
        """Close its stdin (it exits, its workers with it) and wait for it."""
        self._closing = True
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._reader is not None:
            await self._reader


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"it was killed by {signal.Signals(-returncode).name}"
    return f"it exited with status {returncode}"
