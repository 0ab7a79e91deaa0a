"""Tools that misbehave on purpose, for the worker-pool tests (loaded by module path
into real workers: "tests.worker_tools")."""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolpool import ToolContext, ToolError, tool
from toolpool.sandbox import seccomp
from toolpool.sandbox.command import confined


@tool(read_only=True, label="Look Up")
def lookup(key: str) -> str:
    """Look up a key.

    Args:
        key: The key to look up.
    """
    return f"value of {key}"


@tool(permissions=["write"])
def write_note(path: str, text: str, ctx: ToolContext) -> str:
    """Write a note into the workspace.

    Args:
        path: File path relative to the workspace.
        text: What to write.
    """
    (ctx.workspace / path).write_text(text)
    return f"wrote {len(text)} characters to {path}"


@tool(read_only=True)
def print_lines(count: int) -> str:
    """Print the numbers below ``count``, one per line.

    Args:
        count: How many lines.
    """
    for i in range(count):
        print(i)
    return f"printed {count} lines"


@tool(read_only=True)
def noop() -> str:
    """Do nothing."""
    return "ok"


@tool(read_only=True, interrupt_behavior="cancel")
def nap(seconds: float) -> str:
    """Sleep, then answer (cancel-behaviour)."""
    time.sleep(seconds)
    return f"slept {seconds}"


@tool(read_only=True, interrupt_behavior="cancel")
def wait_for(name: str, ctx: ToolContext, timeout: float = 30.0) -> str:
    """Wait until the file ``name`` exists in the workspace (a test creates it once it
    has seen what it waits for); an error after ``timeout`` seconds, a hang guard.

    Args:
        name: The file's name, in the workspace.
        timeout: Seconds before giving up.
    """
    return _wait_for_file(ctx.workspace / name, timeout)


@tool(read_only=True, interrupt_behavior="block")
def chore_until(name: str, ctx: ToolContext, timeout: float = 30.0) -> str:
    """``wait_for`` with block behaviour: an interrupt lets it finish.

    Args:
        name: The file's name, in the workspace.
        timeout: Seconds before giving up.
    """
    return _wait_for_file(ctx.workspace / name, timeout)


def _wait_for_file(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise ToolError(f"{path.name} did not appear within {timeout:g} s")
        time.sleep(0.02)
    return f"{path.name} appeared"


@tool(read_only=True, interrupt_behavior="cancel")
def marked_nap(name: str, seconds: float, ctx: ToolContext) -> str:
    """Leave a mark that it started (``started-NAME`` in the workspace, appended to
    each time), then sleep: a test sees whether, and how often, a call ran.

    Args:
        name: The mark's name.
        seconds: How long to sleep.
    """
    with (ctx.workspace / f"started-{name}").open("a") as mark:
        mark.write("x")
    time.sleep(seconds)
    return f"{name} slept"


@tool(read_only=True, interrupt_behavior="cancel")
def exit_when(name: str, ctx: ToolContext) -> str:
    """Wait until the file ``name`` exists in the workspace, then exit the worker
    process outright (a crash under the call, at a moment the test picks)."""
    _wait_for_file(ctx.workspace / name, 30)
    os._exit(3)


@tool(read_only=True)
def vanish() -> str:
    """End the worker process outright, as a read-only tool may (a crash in C code)."""
    os._exit(3)


@tool(read_only=True, interrupt_behavior="block")
def chore(seconds: float) -> str:
    """Sleep, then answer (block-behaviour)."""
    time.sleep(seconds)
    return f"chore done after {seconds}"


@tool(read_only=True, interrupt_behavior="cancel")
async def async_nap(seconds: float) -> str:
    """Sleep on the event loop."""
    await asyncio.sleep(seconds)
    return "awake"


@tool(interrupt_behavior="cancel")
def ignore_term(seconds: float) -> str:
    """Ignore SIGTERM, then sleep."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return "ignored"


@tool
def hog_memory(megabytes: int) -> str:
    """Allocate (and touch) memory."""
    blob = b"x" * (megabytes * 1024 * 1024)
    return f"held {len(blob)} bytes"


@tool
def fork_bomb() -> str:
    """Fork until the kernel refuses (the error ends the call)."""
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)


@tool
def crash(kind: str) -> str:
    """Crash the worker: "segfault" or "abort"."""
    if kind == "segfault":
        ctypes.string_at(0)
    os.abort()


@tool
def raise_deep(text: str) -> str:
    """Fail two calls down with a ValueError naming ``text``."""

    def inner() -> str:
        raise ValueError(text)

    return inner()


@tool
def burn_cpu(seconds: float) -> str:
    """Spin the CPU."""
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
    return f"spun {n} times"


@tool
def spin_children(seconds: float, rounds: int) -> str:
    """Start child processes, one after another, each spinning the CPU for ``seconds``
    (under any per-process CPU limit), ``rounds`` times; a killed child does not stop
    it: it starts the next one."""
    spin = f"import time\nend = time.process_time() + {seconds}\n"
    spin += "while time.process_time() < end: pass"
    for _ in range(rounds):
        subprocess.run([sys.executable, "-c", spin], check=False)
    return f"spun {rounds} children"


@tool
def big_file(megabytes: int, ctx: ToolContext) -> str:
    """Write a file of this size into the workspace."""
    chunk = b"\0" * (1024 * 1024)
    with open(ctx.workspace / "big.bin", "wb") as f:
        for _ in range(megabytes):
            f.write(chunk)
    return "written"


@tool
def shout(megabytes: int) -> str:
    """Print a lot."""
    line = "x" * 1023
    for _ in range(megabytes * 1024):
        print(line)
    return "done"


@tool
def huge_result(megabytes: int) -> str:
    """Return a very large result."""
    return "y" * (megabytes * 1024 * 1024)


@tool
def escape_setsid() -> str:
    """Leave a setsid grandchild behind whose parent has already exited."""
    subprocess.run(["sh", "-c", "setsid sleep 1000 > /dev/null 2>&1 &"], check=True)
    return "escaped"


@tool
def exit_worker(code: int) -> str:
    """Exit the worker process outright."""
    os._exit(code)


@tool
def hold_gil(seconds: int) -> str:
    """Block in C while holding the GIL (libc sleep through PyDLL): the worker can
    neither heartbeat nor handle a signal."""
    ctypes.PyDLL(None).sleep(seconds)
    return "woke up"


@tool
def progress(steps: int, ctx: ToolContext) -> str:
    """Report progress, and print."""
    for i in range(steps):
        ctx.report_progress({"step": i})
    print("printed line")
    return "reported"


def _try_connect(port: int) -> str:
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        probe.connect(("127.0.0.1", port))
    except OSError as exc:
        return f"unreachable: {exc.strerror or exc}"
    finally:
        probe.close()
    return "reachable"


def _cgroup_memory_limit() -> int | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            limit = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"
            return int(limit.read_text()) if limit.exists() else None
    return None


@tool(read_only=True)
def report_limits(port: int, ctx: ToolContext) -> dict[str, Any]:
    """Report the limits this worker runs under, as seen from inside; the network
    check connects to a loopback ``port`` (an empty namespace has no usable lo)."""
    outside = Path("/etc/toolpool-write-test")
    with confined(
        ["sh", "-c", f"touch {ctx.workspace}/inside && touch {outside} 2>/dev/null; echo $?"],
        workspace=ctx.workspace,
        network=ctx.allow_network,
    ) as box:
        command = subprocess.Popen(
            box.argv, pass_fds=box.pass_fds, stdout=subprocess.PIPE, text=True, env=box.env
        )
        box.started()  # a network-allowed command waits for its namespace until then
        status, _ = command.communicate()
    box.finish()
    return {
        "pid": os.getpid(),
        "rlimits": {
            name: resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))[0]
            for name in ("CORE", "NOFILE", "FSIZE", "CPU", "AS")
        },
        "cpu_used": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
        "cgroup": Path("/proc/self/cgroup").read_text(),
        "cgroup_memory_limit": _cgroup_memory_limit(),
        "network": _try_connect(port),
        "command_wrote_inside": (ctx.workspace / "inside").exists(),
        "command_wrote_outside": outside.exists(),
        "command_status": status.strip(),
        "seccomp": Path("/proc/self/status").read_text().split("Seccomp:")[1].split()[0],
        "built_seccomp_here": os.getpid() in seccomp.BUILT_IN,
    }
