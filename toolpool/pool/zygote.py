"""The pool's handle on its zygote process (toolpool.worker.zygote): spawn workers,
hear how they ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolpool.errors import ToolpoolError
from toolpool.protocol import (
    HEADER_BYTES,
    Exited,
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
        on_death: Callable[[], None],
        env: dict[str, str] | None = None,
    ) -> None:
        self.tool_modules = list(tool_modules)
        self.log_dir = log_dir
        self._on_exit = on_exit
        self._on_death = on_death
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[int]] = {}
        self._closing = False
        self._env = env  # the workers' environment (None: this process's)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def log_path(self) -> Path:
        return self.log_dir / "zygote.log"

    async def start(self) -> None:
        argv = [sys.executable, "-m", "toolpool.worker.zygote", "--log-dir", str(self.log_dir)]
        for module in self.tool_modules:
            argv += ["--tool-module", module]
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
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
        self._reader = asyncio.ensure_future(self._read())

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
                if isinstance(message, Spawned):
                    future = self._pending.get(message.worker_id)
                    if future is not None and not future.done():
                        future.set_result(message.pid)
                elif isinstance(message, Exited):
                    self._on_exit(message)
        except asyncio.IncompleteReadError:
            pass  # the zygote ended
        except ProtocolError as exc:
            log.error("bad frame from the zygote: %s", exc)
        await process.wait()
        failure = ZygoteError(self._failure("the zygote exited"))
        for future in self._pending.values():
            if not future.done():
                future.set_exception(failure)
        if not self._closing:
            log.error("%s", failure)
            self._on_death()

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
