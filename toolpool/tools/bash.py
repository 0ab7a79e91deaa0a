"""``bash``: run a shell command in the workspace, confined, streaming its output.

The command runs as ``bash -c`` in its own process group, stdin from /dev/null, in
the sandbox the machine offers (toolpool.sandbox.command: bubblewrap, Landlock,
seccomp). Output streams as progress while it runs; the model gets at most
``MAX_OUTPUT_CHARS`` (head and tail, with a marker) and the whole output stays in a
spill file in the session's scratch directory, up to the call's ``spill_bytes``
limit (then a truncation note; SPEC X8). On timeout or cancel the whole
process tree is ended — SIGTERM, a grace period, SIGKILL — children that called
setsid or nohup included. A background process that keeps the output pipe open
does not hold the call: once the shell exits, the pipe is drained for a bounded time.

With ``run_in_background`` the command is started through ``ToolContext.shells``
instead (in a worker: by the pool, confined the same way) and the call returns at
once with the shell's id; ``bash_output`` and ``kill_shell`` (tools/shells.py) read
and end it. Where no executor offers background shells (in-process) it is refused.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from toolpool.cancel import Cancelled
from toolpool.errors import ToolError
from toolpool.runtime import spill_name
from toolpool.sandbox.command import confined
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.terminate import (
    ProcessGroup,
    ProcessSet,
    ProcessTree,
    Together,
    terminate,
)
from toolpool.tool import Arguments, InterruptBehavior, ToolContext
from toolpool.tools.head_tail import HeadAndTail
from toolpool.tools.paths import display

DEFAULT_TIMEOUT = 120
MAX_TIMEOUT = 600
MAX_OUTPUT_CHARS = 30_000
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL when ending the command
DRAIN_AFTER_EXIT = 1.0  # seconds to keep reading after the shell exited
STREAM_INTERVAL = 0.1  # seconds between progress reports
STREAM_LIMIT = 1_000_000  # characters streamed as progress; the rest only in the spill file
_CHUNK = 65536

DESCRIPTION = f"""\
Runs a bash command in the workspace and returns its output (stdout and stderr
interleaved) and exit code.

Use it for things only a shell can do: building, running tests, git, package
managers, running scripts. Do NOT use it to read, search or edit files: use read,
grep, glob, ls, edit and write, which are faster, safer and keep the read-before-write
record that edit and write need.

- The working directory is the workspace root; each call starts a fresh shell
  (cd and exported variables do not carry over to the next call).
- stdin is empty: interactive commands (editors, pagers, prompts) cannot work. Pass
  flags such as --yes or --no-pager.
- timeout: seconds before the command is stopped (default {DEFAULT_TIMEOUT}, at most
  {MAX_TIMEOUT}).
- Output longer than {MAX_OUTPUT_CHARS} characters is cut in the middle; the full output
  is saved to a file whose path the result gives (read it with read if you need it).
- Everything the command starts, background processes included, is ended when the
  command finishes or is stopped: do not rely on servers outliving the call.
- run_in_background: true starts the command and returns at once with a shell id,
  for long-running commands (a dev server, a watcher, a long build). Read its new
  output with bash_output and stop it with kill_shell; it ends by itself when the
  session ends or after the daemon's background time limit (timeout does not
  apply). Do not add "&".
- Depending on the session, the network may be unavailable and only the workspace
  writable.
- Give a short description (5-10 words) of what the command does, e.g. "Run the unit
  tests".
"""


class _Output:
    """The command's output as it arrives: to the spill file up to ``spill_limit``
    bytes (then a truncation note), the head and tail kept for the model, fresh text
    streamed as progress now and then."""

    def __init__(self, spill: Path, ctx: ToolContext, spill_limit: int) -> None:
        self.spill_path = spill
        # Only the daemon's user may read it: another user must not see what ran (X8).
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(spill, flags, 0o600)
        self._spill = os.fdopen(fd, "wb")
        self._spill_limit = spill_limit
        self.spilled = 0  # bytes in the spill file, the note aside
        self.spill_truncated = False
        self._ctx = ctx
        self._kept = HeadAndTail(MAX_OUTPUT_CHARS)
        self._unsent: list[str] = []
        self._unsent_chars = 0
        self._streamed = 0
        self._last_sent = time.monotonic()
        self._lock = threading.Lock()

    def add(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            if self._streamed + self._unsent_chars <= STREAM_LIMIT:
                # Past the streaming limit nothing more is kept to stream: a fast
                # writer must not pile up in memory between two reports.
                self._unsent.append(text)
                self._unsent_chars += len(text)
            self._write_spill(text)
            self._kept.add(text)
        self.stream()

    def _write_spill(self, text: str) -> None:
        if self.spill_truncated:
            return
        data = text.encode("utf-8", errors="replace")
        room = self._spill_limit - self.spilled
        if len(data) > room:
            data = data[:room]
            self.spill_truncated = True
        self._spill.write(data)
        self.spilled += len(data)
        if self.spill_truncated:
            note = f"\n[output truncated at {self._spill_limit} bytes: spill_bytes]\n"
            self._spill.write(note.encode())

    def stream(self, final: bool = False) -> None:
        """Send what arrived since the last report, at most every STREAM_INTERVAL."""
        with self._lock:
            now = time.monotonic()
            if not self._unsent or (not final and now - self._last_sent < STREAM_INTERVAL):
                return
            chunk = "".join(self._unsent)
            self._unsent.clear()
            self._unsent_chars = 0
            self._last_sent = now
            if self._streamed >= STREAM_LIMIT:
                return
            if self._streamed + len(chunk) > STREAM_LIMIT:
                chunk = chunk[: STREAM_LIMIT - self._streamed] + "\n[output streaming stopped]\n"
            self._streamed += len(chunk)
        if chunk:
            self._ctx.report_progress(chunk)

    def close(self) -> None:
        self.stream(final=True)
        self._spill.close()

    @property
    def total_chars(self) -> int:
        return self._kept.total

    def text(self) -> tuple[str, bool]:
        """What the model sees, and whether it was cut."""
        with self._lock:
            return self._kept.text()


def _read_output(fd: int, output: _Output, stop: threading.Event) -> None:
    """Read the pipe until EOF, or until ``stop`` is set (the drain ran out)."""
    decoder = _Utf8Decoder()
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], 0.05)
        if not ready:
            output.stream()
            continue
        try:
            data = os.read(fd, _CHUNK)
        except OSError:
            break
        if not data:
            break
        output.add(decoder.decode(data))
    output.add(decoder.decode(b"", final=True))


class _Utf8Decoder:
    """Incremental UTF-8 decoding: a character split across reads stays whole."""

    def __init__(self) -> None:
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, data: bytes, final: bool = False) -> str:
        return str(self._decoder.decode(data, final))


class Bash:
    name = "bash"
    description = DESCRIPTION
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to run."},
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_TIMEOUT,
                "description": f"Seconds before it is stopped (default {DEFAULT_TIMEOUT}).",
            },
            "description": {
                "type": "string",
                "description": "What the command does, in 5-10 words.",
            },
            "run_in_background": {
                "type": "boolean",
                "description": "Start it in the background and return at once with a "
                "shell id; read its output with bash_output, stop it with kill_shell.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def label(self) -> str:
        return "Bash"

    def read_only(self, args: Arguments) -> bool:
        return False  # a command can do anything; the kernel cannot tell ls from rm

    def concurrency_safe(self, args: Arguments) -> bool:
        return False

    def interrupt_behavior(self, args: Arguments) -> InterruptBehavior:
        return InterruptBehavior.CANCEL

    def activity(self, args: Arguments) -> str:
        command = _shown(str(args.get("command", "")))
        if args.get("run_in_background"):
            return f"Starting in the background: {command}"
        return f"Running: {command}"

    def permissions(self) -> list[str]:
        return ["exec", "read", "write", "network"]

    def call_limits(self, args: Arguments) -> dict[str, Any]:
        # The pool's wall-time limit must leave room for our own timeout and clean-up.
        timeout = float(args.get("timeout") or DEFAULT_TIMEOUT)
        return {"wall_seconds": timeout + KILL_GRACE + DRAIN_AFTER_EXIT + 5}

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        command = str(args["command"])
        if not command.strip():
            raise ToolError("The command is empty.")
        if args.get("run_in_background"):
            return self._start_in_background(command, ctx)
        timeout = min(float(args.get("timeout") or DEFAULT_TIMEOUT), MAX_TIMEOUT)
        if ctx.scratch_dir is None:
            raise ToolError("This session has no scratch directory for the command's output.")
        spill_dir = ctx.scratch_dir / "bash"
        spill_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        limits = ctx.limits or Limits()
        output = _Output(spill_dir / spill_name(ctx.call_id, ".log"), ctx, limits.spill_bytes)
        env = {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"}
        with confined(
            ["bash", "-c", command],
            workspace=ctx.workspace,
            writable=ctx.extra_roots,
            network=ctx.allow_network,
            tmp_bytes=limits.tmp_bytes,
            env=env,
        ) as box:
            process = subprocess.Popen(
                box.argv,
                cwd=ctx.workspace,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=box.pass_fds,
                env=box.env,
            )
            try:
                box.started()
            except ToolError:  # the sandbox could not be completed: the command never ran
                process.kill()
                process.wait()
                output.close()
                raise
        assert process.stdout is not None
        stop = threading.Event()
        reader = threading.Thread(
            target=_read_output, args=(process.stdout.fileno(), output, stop), daemon=True
        )
        reader.start()
        # In bubblewrap's PID namespace nothing outlives bubblewrap: its tree is all
        # there is (a /proc scan for the process group would cost ~2 ms per call).
        group: ProcessSet = ProcessTree(process.pid)
        if "bwrap" not in box.layers:
            group = Together(ProcessGroup(process.pid), group)
        started = time.monotonic()
        timed_out = False
        try:
            exit_code = self._wait(process, ctx, started + timeout)
            if exit_code is None:
                timed_out = True
                terminate(group, grace=KILL_GRACE)
                exit_code = process.wait()
        except (Cancelled, KeyboardInterrupt):
            terminate(group, grace=KILL_GRACE)
            process.wait()
            raise
        finally:
            # Background processes may hold the pipe: read on for a moment, then stop.
            reader.join(DRAIN_AFTER_EXIT)
            stop.set()
            terminate(group, grace=KILL_GRACE)
            reader.join()
            process.stdout.close()
            output.close()
            box.finish()
        text, cut = output.text()
        sandbox_failure = box.failure(exit_code, text[:4096])
        if sandbox_failure is not None:
            raise ToolError(sandbox_failure, code="sandbox_failed", details={"output": text[:4096]})
        lines = [text.rstrip("\n")] if text.strip() else ["(no output)"]
        if timed_out:
            lines.append(f"Command timed out after {timeout:g} s and was stopped.")
        lines.append(f"Exit code: {exit_code}")
        spill = display(output.spill_path, ctx)  # in the scratch dir: absolute
        if output.spill_truncated:
            lines.append(
                f"Output ({output.total_chars} characters) saved to {spill}, "
                f"truncated at {limits.spill_bytes} bytes (the spill_bytes limit)."
            )
        elif cut:
            lines.append(f"Full output ({output.total_chars} characters): {spill}")
        if timed_out:
            raise ToolError("\n".join(lines), details={"exit_code": exit_code, "timed_out": True})
        return "\n".join(lines)

    @staticmethod
    def _start_in_background(command: str, ctx: ToolContext) -> str:
        if ctx.shells is None:
            raise ToolError(
                "Background commands are not available here (this executor offers no "
                "background shells): run the command without run_in_background."
            )
        shell = ctx.shells.start(command)
        return (
            f"Started background shell {shell.shell_id}: {_shown(command)}. "
            "Read its output with bash_output, stop it with kill_shell."
        )

    @staticmethod
    def _wait(process: subprocess.Popen[bytes], ctx: ToolContext, deadline: float) -> int | None:
        """The exit code, or None at the deadline. Raises Cancelled when the call is
        cancelled (the worker raises it by signal; in-process we look at the token)."""
        # A pidfd wakes us the moment the process exits; Popen.wait(timeout) polls
        # with sleeps of up to 50 ms, which a short command would pay in full.
        pidfd = os.pidfd_open(process.pid)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if select.select([pidfd], [], [], min(remaining, 0.05))[0]:
                    return process.wait()
                if ctx.cancelled:
                    source = ctx.cancel_token.source
                    assert source is not None
                    raise Cancelled(source) from None
        finally:
            os.close(pidfd)


def _shown(command: str) -> str:
    """A command on one line, at most 80 characters."""
    command = " ".join(command.split())
    return command if len(command) <= 80 else command[:79] + "…"


bash = Bash()
