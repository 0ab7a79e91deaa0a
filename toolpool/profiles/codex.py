"""Codex CLI's tool set over toolpool's built-ins: ``shell`` and ``apply_patch``.

``shell`` takes Codex's argv list (``["bash", "-lc", "…"]``), its ``workdir`` and its
``timeout_ms``, runs the command with the built-in ``bash`` and answers as Codex's
shell does: a JSON object of the output and its metadata (exit code, duration in
seconds). Codex itself intercepts a patch sent through the shell — argv
``["apply_patch", PATCH]`` (or ``applypatch``), or a ``bash -lc`` script that is only
``apply_patch <<'EOF' … EOF`` (optionally after ``cd DIR &&``) — and so does this
adapter: such a call is the built-in ``apply_patch``'s, its validate, preview,
guard and capabilities (interrupt behaviour, read-only-ness) included.

``apply_patch`` is the built-in itself: it takes Codex's ``{"input": PATCH}``
already, and a Responses ``custom_tool_call`` to it arrives in that shape
(providers/openai_responses.py).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import time
from collections.abc import Sequence
from typing import Any

from toolpool.adapter import Adapter, tool_named
from toolpool.errors import ToolError
from toolpool.registry import ToolSpec
from toolpool.tool import Arguments, ToolContext

PROFILE = "codex"
NAMES = ("shell", "apply_patch")

SHELL_DESCRIPTION = """\
Runs a shell command and returns its output.
- The arguments to `shell` are passed to execvp(). Most terminal commands should be \
prefixed with ["bash", "-lc"].
- Always set the `workdir` param when using the shell function. Do not use `cd` \
unless absolutely necessary.
- The command runs confined, in the workspace; timeout_ms stops it (default 120000, \
at most 600000).
- To change files, use apply_patch (a patch sent through the shell as \
["apply_patch", PATCH] is applied too)."""

SHELL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The command to execute",
        },
        "workdir": {
            "type": "string",
            "description": "The working directory to execute the command in",
        },
        "timeout_ms": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "The timeout for the command in milliseconds",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}

_SHELLS = frozenset({"bash", "sh", "zsh"})
_SCRIPT_FLAGS = frozenset({"-c", "-lc"})
_PATCH_COMMANDS = frozenset({"apply_patch", "applypatch"})
# The whole script: `apply_patch <<'EOF'` … `EOF`, optionally after `cd DIR &&`.
_HEREDOC = re.compile(
    r"\A\s*(?:cd\s+(?P<dir>'[^']*'|\"[^\"]*\"|[^\s;&|'\"]+)\s*&&\s*)?"
    r"(?:apply_patch|applypatch)\s*<<-?\s*(?P<q>['\"]?)(?P<tag>\w+)(?P=q)[ \t]*\n"
    r"(?P<body>.*?)\n?(?P=tag)[ \t]*\n?\s*\Z",
    re.S,
)
_PATCH_PATHS = re.compile(r"^(\*\*\* (?:Add File|Update File|Delete File|Move to): )(.+)$", re.M)


def script_of(argv: Sequence[str]) -> str | None:
    """The script of ``["bash", "-lc", SCRIPT]`` (bash, sh or zsh, -c or -lc)."""
    if len(argv) == 3 and posixpath.basename(argv[0]) in _SHELLS and argv[1] in _SCRIPT_FLAGS:
        return argv[2]
    return None


def patch_of(argv: Sequence[str], workdir: str | None = None) -> str | None:
    """The patch of a shell call that is only an apply_patch (the forms Codex
    intercepts), its paths joined to the directory it runs in; None for any other
    command."""
    directory = workdir
    if len(argv) == 2 and argv[0] in _PATCH_COMMANDS:
        patch = argv[1]
    else:
        script = script_of(argv)
        found = None if script is None else _HEREDOC.match(script)
        if found is None:
            return None
        patch = found.group("body")
        if found.group("dir"):
            cd = shlex.split(found.group("dir"))[0]
            directory = cd if directory is None else posixpath.join(directory, cd)
    if directory in (None, "", "."):
        return patch
    return _PATCH_PATHS.sub(lambda m: m.group(1) + posixpath.join(directory, m.group(2)), patch)


def command_line(argv: Sequence[str]) -> str:
    """The bash command line that runs ``argv``: a shell's script as it is, any other
    argv quoted word by word."""
    script = script_of(argv)
    return script if script is not None else shlex.join(argv)


def exec_output(output: str, exit_code: int, seconds: float) -> str:
    """A command's result as Codex's shell gives it to the model."""
    payload = {
        "output": output,
        "metadata": {"exit_code": exit_code, "duration_seconds": round(seconds, 1)},
    }
    return json.dumps(payload, ensure_ascii=False)


def split_exit_code(text: str) -> tuple[str, int]:
    """bash's result text → (its output with any notes, the exit code)."""
    head, marker, tail = text.rpartition("Exit code: ")
    code, _, notes = tail.partition("\n")
    if not marker or not (head == "" or head.endswith("\n")) or not code.lstrip("-").isdigit():
        raise ToolError(f"the shell's result has no exit code: {text[:200]!r}")
    output = head.removesuffix("\n")
    if output == "(no output)":
        output = ""
    return (f"{output}\n{notes}" if notes else output), int(code)


class Shell(Adapter):
    """Codex's ``shell`` over ``bash``, with Codex's interception of apply_patch."""

    profile = PROFILE

    def __init__(self, bash: Any, apply_patch: Any | None) -> None:
        super().__init__(bash, name="shell", description=SHELL_DESCRIPTION, schema=SHELL_SCHEMA)
        # The built-in apply_patch, checked where it is registered (as the target is).
        self.patcher = None if apply_patch is None else ToolSpec(apply_patch, check_schema=False)
        timeout = self.target.schema.get("properties", {}).get("timeout", {})
        self.max_seconds: float | None = timeout.get("maximum")

    def route(self, args: Arguments) -> tuple[ToolSpec, Arguments]:
        if self.patcher is not None:
            patch = patch_of(args["command"], args.get("workdir"))
            if patch is not None:
                return self.patcher, {"input": patch}
        return self.target, self.arguments(args)

    def arguments(self, args: Arguments) -> Arguments:
        command = command_line(args["command"])
        workdir = args.get("workdir")
        if workdir and workdir != ".":
            command = f"cd -- {shlex.quote(workdir)} && {command}"
        routed: Arguments = {"command": command}
        if "timeout_ms" in args:
            seconds = args["timeout_ms"] / 1000
            routed["timeout"] = (
                seconds if self.max_seconds is None else min(seconds, self.max_seconds)
            )
        return routed

    def execute(self, args: Arguments, ctx: ToolContext) -> str:
        started = time.monotonic()
        spec, routed = self._checked(args)
        if spec is self.target:
            # Codex's shell starts in its workdir, or the workspace: never where the
            # session's last command ended (SPEC V10).
            home = f"cd -- {shlex.quote(str(ctx.workspace))} && "
            routed = {**routed, "command": home + routed["command"]}
        try:
            output = spec.execute_fn(routed, ctx)
        except ToolError as exc:
            if spec is self.target and "exit_code" in exc.details:  # timed out: still output
                text, code = split_exit_code(exc.message)
                message = exec_output(text, code, time.monotonic() - started)
                raise ToolError(message, details=exc.details, code=exc.code) from None
            raise
        seconds = time.monotonic() - started
        if spec is not self.target:  # the patch, applied: Codex shows it as a command's
            return exec_output(f"{output}\n", 0, seconds)
        return exec_output(*split_exit_code(str(output)), seconds)


def adapters(builtins: Sequence[Any]) -> list[Adapter]:
    """Codex's ``shell`` over the built-in ``bash`` (and ``apply_patch``), if present."""
    bash = tool_named(builtins, "bash")
    if bash is None:
        return []
    return [Shell(bash, tool_named(builtins, "apply_patch"))]
