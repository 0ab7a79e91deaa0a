"""``python -m toolpool.worker.zygote``: a warm process that forks workers.

Why a zygote rather than ``multiprocess`` or one ``python -m`` per worker: it
imports toolpool and the tool modules once, stays single-threaded (fork is safe),
and forks a ready worker in a few milliseconds, so a crashed worker is replaced
almost at once; the coordinator's threads and sockets never reach a worker; and,
as the workers' parent, it reaps them and reports exactly how each one ended
(exit code or signal: the cause of a worker's death in a call's result).

It talks to the pool over stdin/stdout with length-prefixed protocol frames
(``Spawn`` → ``Spawned``; ``Exited`` and ``Heartbeat`` unasked). Its first heartbeat
says the tool modules imported; then one follows every interval, from the loop
itself (a timer on its select: no thread, so a fork stays safe), which never waits
longer than a fork or a frame. A zygote whose heartbeats stop is hung: the pool
kills it and starts another (SPEC L1). It dies with the coordinator (parent death
signal), and its workers die with it.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import selectors
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import BinaryIO

from toolpool.protocol import Exited, Heartbeat, Spawn, Spawned, read_frame, write_frame
from toolpool.registry import ToolRegistry, tools_in_module
from toolpool.sandbox import linux, seccomp
from toolpool.worker.main import WorkerConfig, serve

ZYGOTE_ID = "zygote"  # the worker_id of the zygote's heartbeats


def _rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _load(modules: list[str]) -> ToolRegistry:
    # The daemon registered these modules' tools first, checking their schemas (T1);
    # a worker never checks arguments, so it never loads jsonschema (ToolRegistry).
    registry = ToolRegistry(check_schemas=False)
    for module in modules:
        for tool in tools_in_module(module):
            registry.add(tool)
    return registry


def _child(message: Spawn, registry: ToolRegistry, log_dir: Path, keep: list[int]) -> None:
    """In the forked worker: detach from the zygote's plumbing, then serve."""
    try:
        os.setsid()  # a terminal's signals are not for workers
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Open first, then dup onto 0-2: closing first would hand out 0 and 1 again.
        devnull = os.open(os.devnull, os.O_RDWR)
        log_path = log_dir / f"worker-{message.worker_id}.log"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(log_fd, 2)
        for fd in {*keep, devnull, log_fd} - {0, 1, 2}:
            os.close(fd)
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
        )
        # A crash in C code (a segfault in an extension) leaves every thread's stack
        # in the worker's log.
        faulthandler.enable(sys.stderr, all_threads=True)
        code = serve(WorkerConfig.from_dict(message.config), registry)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
    os._exit(code)


def run(
    modules: list[str],
    log_dir: Path,
    stdin: BinaryIO,
    stdout: BinaryIO,
    heartbeat_interval: float = 0.5,
) -> int:
    registry = _load(modules)
    seccomp.prepare()  # once here, not in every worker
    write_frame(stdout, Heartbeat(ZYGOTE_ID, _rss()))  # started: the modules imported
    next_beat = time.monotonic() + heartbeat_interval
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector via wake_w
    selector = selectors.DefaultSelector()
    selector.register(stdin, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    workers: set[int] = set()
    while True:
        for key, _ in selector.select(max(0.0, next_beat - time.monotonic())):
            if key.fileobj is stdin:
                message = read_frame(stdin)
                if message is None:
                    return 0  # the pool closed our stdin: its workers die with us
                if not isinstance(message, Spawn):
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(message, registry, log_dir, [wake_r, wake_w, stdin.fileno(), 1])
                workers.add(pid)
                write_frame(stdout, Spawned(message.worker_id, pid))
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
        for pid, status in linux.reap_children():
            if pid not in workers:
                continue  # an orphan a dead worker left us
            workers.discard(pid)
            if os.WIFSIGNALED(status):
                write_frame(stdout, Exited(pid, signal=os.WTERMSIG(status)))
            else:
                write_frame(stdout, Exited(pid, exit_code=os.waitstatus_to_exitcode(status)))
        now = time.monotonic()
        if now >= next_beat:
            write_frame(stdout, Heartbeat(ZYGOTE_ID, _rss()))
            next_beat = now + heartbeat_interval


def main() -> int:
    parser = argparse.ArgumentParser(prog="toolpool-zygote")
    parser.add_argument("--tool-module", action="append", default=[])
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    args = parser.parse_args()
    try:
        linux.die_with_parent(signal.SIGKILL)
    except ProcessLookupError:
        return 1
    linux.become_subreaper()  # what a dead worker leaves is re-parented here, and reaped
    stdin = os.fdopen(0, "rb", buffering=0)
    stdout = os.fdopen(1, "wb", buffering=0)
    # Our stdout carries frames: anything else printed goes to stderr, its log; and
    # so does the stack of a crash in C code.
    sys.stdout = sys.stderr
    faulthandler.enable(sys.stderr, all_threads=True)
    return run(args.tool_module, args.log_dir, stdin, stdout, args.heartbeat_interval)


if __name__ == "__main__":
    sys.exit(main())
