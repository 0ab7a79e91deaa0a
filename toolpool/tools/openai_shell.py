"""OpenAI's shells (SPEC F16): the Responses API's ``shell`` tool (``shell_call`` items)
and its older ``local_shell`` (``local_shell_call`` items), carried out as the
session's ``bash`` carries out a command.

``shell``: an ``action`` of ``commands`` (run one after another, each as its own
``bash -c`` in the session's sandbox, each one's working directory carried to the
next as the session's ``bash`` carries it, V10), ``timeout_ms`` (for all of them
together: the default is bash's, 120 s, at most 600 s) and ``max_output_length``
(characters of stdout and stderr together, all commands counted, kept from the
start: the Agents SDK's cut). Each command's stdout and stderr are read apart, so
that the answer — a ``shell_call_output`` — gives each command's stdout, stderr and
outcome (``{"type": "exit", "exit_code": N}`` or ``{"type": "timeout"}``). A
command that times out ends the call: the ones after it do not run, and the answer
lists the commands that ran. A command's exit code is not the call's failure: the
outcome says it. toolpool bounds what it keeps of each stream as ``bash`` does
(head and tail, the whole in a spill file), and the answer to ``max_output_length``
characters, at most ``bash``'s 30,000 (its bound without one).

``local_shell``: an ``action`` of ``type: "exec"``, ``command`` (an argv),
``env``, ``working_directory`` and ``timeout_ms``, run as Codex's ``shell`` runs
its argv (``profiles/codex.py``: ``bash -lc`` scripts as they are, a patch sent
through it applied as ``apply_patch``), and answered with Codex's exec output (the
JSON of the output and its exit code). ``user`` is not honoured: every command runs
as the daemon's user, confined.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from toolpool.adapter import Adapter
from toolpool.declared import OPENAI, OPENAI_LOCAL_SHELL, OPENAI_SHELL
from toolpool.errors import ToolError
from toolpool.tool import Arguments, ToolContext, ToolOutput
from toolpool.tools.bash import DEFAULT_TIMEOUT, MAX_TIMEOUT, layer_note
from toolpool.tools.support.command_output import MAX_OUTPUT_CHARS
from toolpool.tools.support.command_run import DRAIN_AFTER_EXIT, KILL_GRACE, Finished, run_command
from toolpool.tools.support.kinds import CommandTool

MAX_COMMANDS = 64  # commands in one action: each is a process tree of its own

SHELL_DESCRIPTION = """\
OpenAI's shell tool (declared to the model as {"type": "shell"}): runs the \
action's commands one after another in the session's shell, confined, and answers \
with each command's stdout, stderr and outcome."""

ACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "commands": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "maxItems": MAX_COMMANDS,
            "description": "Shell commands, run one after another.",
        },
        "timeout_ms": {
            "type": ["integer", "null"],
            "exclusiveMinimum": 0,
            "description": "For all the commands together.",
        },
        "max_output_length": {
            "type": ["integer", "null"],
            "minimum": 0,
            "description": "Characters of stdout and stderr kept, all commands together.",
        },
    },
    "required": ["commands"],
}


def _timeout(action: Arguments) -> float:
    """The action's time, in seconds: its timeout_ms, at most bash's maximum."""
    given = action.get("timeout_ms")
    return DEFAULT_TIMEOUT if given is None else min(given / 1000, MAX_TIMEOUT)


class OpenAIShell(CommandTool):
    """Not read-only, not concurrency-safe, cancelled by an interrupt: a command, as
    ``bash``'s; its permissions are bash's."""

    name = OPENAI_SHELL
    label_text = "Shell"
    description = SHELL_DESCRIPTION
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"action": ACTION_SCHEMA},
        "required": ["action"],
        "additionalProperties": False,
    }

    def activity(self, args: Arguments) -> str:
        """The commands on one line, at most 80 characters (read no further: the
        daemon asks at the call's start, L10)."""
        action = args.get("action")
        commands = action.get("commands") if isinstance(action, dict) else None
        shown = ""
        for command in commands if isinstance(commands, list) else ():
            shown += (" ; " if shown else "") + " ".join(str(command)[:81].split())
            if len(shown) > 80:
                break
        return f"Running: {shown if len(shown) <= 80 else shown[:79] + '…'}"

    def call_limits(self, args: Arguments) -> dict[str, Any]:
        # The pool's wall-time limit leaves room for the commands' ends and drains.
        action = args.get("action") or {}
        count = len(action.get("commands") or ())
        slack = KILL_GRACE + DRAIN_AFTER_EXIT * max(count, 1) + 5
        return {"wall_seconds": _timeout(action) + slack}

    def execute(self, args: Arguments, ctx: ToolContext) -> ToolOutput:
        action = args["action"]
        commands: list[str] = action["commands"]
        timeout = _timeout(action)
        deadline = time.monotonic() + timeout
        entries: list[dict[str, Any]] = []
        notes: list[str] = []
        layer_full = None
        for command in commands:
            run = run_command(command, ctx, deadline, split_stderr=True)
            entries.append(_ran(run))
            if run.note is not None:
                notes.append(run.note)
            layer_full = layer_note(run, ctx) or layer_full
            if run.timed_out:
                notes.append(f"Timed out after {timeout:g} s: the command was stopped.")
                break
        limit = action.get("max_output_length")
        _cut(entries, MAX_OUTPUT_CHARS if limit is None else min(limit, MAX_OUTPUT_CHARS))
        details: dict[str, Any] = {"shell_output": entries}
        if limit is not None:
            details["max_output_length"] = limit
        text = _rendered(commands, entries, notes)
        if layer_full is not None:
            raise ToolError(f"{text}\n{layer_full}", code="limit_exceeded", details=details)
        return ToolOutput(text, details)


def _entry(stdout: str, stderr: str, exit_code: int | None) -> dict[str, Any]:
    outcome = {"type": "timeout"} if exit_code is None else {"type": "exit", "exit_code": exit_code}
    return {"stdout": stdout, "stderr": stderr, "outcome": outcome}


def _ran(run: Finished) -> dict[str, Any]:
    stdout, _ = run.output.text()
    stderr = "" if run.errors is None else run.errors.text()[0]
    return _entry(stdout, stderr, None if run.timed_out else run.exit_code)


def _cut(entries: list[dict[str, Any]], limit: int) -> None:
    """At most ``limit`` characters of stdout and stderr in all, kept from the start:
    each command's stdout, then its stderr, in order (as the Agents SDK cuts)."""
    room = limit
    for entry in entries:
        for stream in ("stdout", "stderr"):
            kept = entry[stream][: max(room, 0)]
            room -= len(kept)
            entry[stream] = kept


def _rendered(commands: Sequence[str], entries: list[dict[str, Any]], notes: list[str]) -> str:
    """The answer as text, for every format but the Responses API's own item."""
    chunks: list[str] = []
    for command, entry in zip(commands, entries, strict=False):
        lines = [f"$ {command}"]
        if entry["stdout"]:
            lines.append(entry["stdout"].rstrip("\n"))
        if entry["stderr"]:
            lines += ["stderr:", entry["stderr"].rstrip("\n")]
        outcome = entry["outcome"]
        lines.append(
            "timed out" if outcome["type"] == "timeout" else f"exit code: {outcome['exit_code']}"
        )
        chunks.append("\n".join(lines))
    return "\n\n".join([*chunks, *notes])


# --- local_shell: Codex's exec, from a local_shell_call's action ------------------------

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

LOCAL_SHELL_DESCRIPTION = """\
OpenAI's local_shell tool (declared as {"type": "local_shell"}, for codex-mini): \
runs the action's argv as Codex's shell runs it, confined, and answers with the JSON \
of its output and exit code."""

LOCAL_ACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"const": "exec"},
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "env": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        "timeout_ms": {"type": ["integer", "null"], "exclusiveMinimum": 0},
        "working_directory": {"type": ["string", "null"]},
        "user": {"type": ["string", "null"]},
    },
    "required": ["command"],
}


def codex_arguments(action: Arguments) -> Arguments:
    """The Codex ``shell`` call a local_shell action is: its argv (behind ``export``s
    of its ``env``), ``workdir`` and ``timeout_ms``. A variable name that is not one
    is refused: it would be shell text."""
    argv: list[str] = list(action["command"])
    env = action.get("env") or {}
    bad = [name for name in env if not _ENV_NAME.fullmatch(name)]
    if bad:
        raise ToolError(f"env holds names that are no variable names: {bad!r}.")
    if env:
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        script = argv[2] if len(argv) == 3 and argv[1] in ("-c", "-lc") else shlex.join(argv)
        argv = ["bash", "-lc", f"export {exports}; {script}"]
    codex: Arguments = {"command": argv}
    if action.get("working_directory"):
        codex["workdir"] = action["working_directory"]
    if action.get("timeout_ms") is not None:
        codex["timeout_ms"] = action["timeout_ms"]
    return codex


class OpenAILocalShell(Adapter):
    """``local_shell`` over Codex's ``shell`` (``profiles/codex.py``: over ``bash``, or
    ``apply_patch`` for a patch sent through it), every capability theirs; given it
    where the tool set is assembled (``toolpool/toolset.py``)."""

    profile = OPENAI

    def __init__(self, codex: Adapter) -> None:
        super().__init__(
            codex.target,
            name=OPENAI_LOCAL_SHELL,
            description=LOCAL_SHELL_DESCRIPTION,
            schema={
                "type": "object",
                "properties": {"action": LOCAL_ACTION_SCHEMA},
                "required": ["action"],
                "additionalProperties": False,
            },
            label="Shell",
        )
        self.codex = codex

    def route(self, args: Arguments) -> tuple[Any, Arguments]:
        return self.codex.route(codex_arguments(args["action"]))

    def execute(self, args: Arguments, ctx: ToolContext) -> Any:
        return self.codex.execute(codex_arguments(args["action"]), ctx)
