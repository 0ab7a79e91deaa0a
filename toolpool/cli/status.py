"""``toolpool status`` (the daemon's workers, queue, sessions and sandbox, read from its
answer) and ``toolpool doctor`` (this machine's sandbox mechanisms, tried here): what
each prints for a person.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Any

from rich.console import Console
from rich.markup import escape

from toolpool.cli.console import terminal
from toolpool.cli.endpoint import client_flags, connect
from toolpool.client.control import ExitCode, left_out


def add_to(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser("status", help="the daemon's workers, queue and sessions")
    status.add_argument("--json", action="store_true")
    client_flags(status)
    status.set_defaults(handler=show_status)

    doctor = commands.add_parser("doctor", help="show the sandbox profile this machine offers")
    doctor.set_defaults(handler=run_doctor)


def show_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        status = client.status()
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print_status(status, terminal())
    return ExitCode.OK


def run_doctor(args: argparse.Namespace) -> int:
    """Print which sandbox mechanisms this machine offers, and what is off and why."""
    return ExitCode.OK if doctor(terminal()) else ExitCode.FAILED


def print_status(status: dict[str, Any], console: Console) -> None:
    """The daemon's ``status`` answer, a few lines per part."""
    workers = ", ".join(f"{n} {state}" for state, n in status.get("workers", {}).items() if n)
    console.print(
        f"[bold]daemon[/] pid {status['pid']}, up {status['uptime_seconds']} s"
        + (" [yellow](draining)[/]" if status["draining"] else "")
    )
    console.print(
        f"[bold]workers[/] {workers or 'none'}; {status.get('queued_calls', 0)} calls queued"
    )
    console.print(
        f"[bold]limits[/] max_tool_concurrency {status['max_tool_concurrency']}, "
        f"max_tool_errors {status['max_tool_errors']}"
    )
    if status.get("running_as_root"):
        console.print(
            "[yellow]running as root[/]: commands run without capabilities but still pass "
            "owner checks on root's files; a dedicated unprivileged user is the safer way "
            "to run the daemon"
        )
    for line in left_out(status):  # what the daemon started without (E9)
        console.print(f"[yellow]{escape(line)}[/]")
    console.print(f"[bold]sessions[/] {len(status['sessions'])}, clients {status['clients']}")
    for session_id, info in status["sessions"].items():
        failing = ", ".join(f"{t}: {n}" for t, n in info["breaker_failures"].items()) or "none"
        opened = ", ".join(info["open_breakers"]) or "none"
        console.print(
            f"  {session_id} {info['workspace']}: {info['turns']} turns, failures {failing}, "
            f"breakers open: {opened}"
        )
        environment = info.get("environment", {})  # V12–V16
        if "layer_bytes" in environment:  # it has layers of its own
            used = environment.get("layer_used_bytes")
            held = "not made yet" if used is None else f"{used} bytes"
            root = environment.get("image") or environment["root"]
            console.print(
                f"    root {escape(root)}, workspace {environment['workspace_mode']}, "
                f"layers {held} of {environment['layer_bytes']}"
            )
        if "checkpoints" in environment:  # B1, B3
            parent = environment.get("forked_from")
            forked = "" if parent is None else f", forked from {escape(parent)}"
            console.print(f"    {environment['checkpoints']} checkpoints{forked}")
        for shell in info.get("shells", []):  # its background shells (F6)
            code = "" if shell["exit_code"] is None else f" (exit {shell['exit_code']})"
            console.print(
                f"    shell {shell['shell_id']} {shell['state']}{code}, pid {shell['pid']}, "
                f"{shell['output_bytes']} bytes: {escape(shell['command'])}"
            )
    console.print("[bold]sandbox[/]")
    for name, mechanism in status.get("sandbox", {}).items():
        mark = "[green]on [/]" if mechanism["active"] else "[yellow]off[/]"
        console.print(f"  {mark} {name}: {mechanism['detail']}")


def doctor(console: Console) -> bool:
    """Print which sandbox mechanisms this machine offers, and what is off and why;
    whether the confined command and (where on) the session sandbox work."""
    from toolpool.sandbox import SandboxProfile

    profile = SandboxProfile.probe()
    console.print("[bold]sandbox profile[/] (strongest available is applied):")
    for line in profile.describe():
        style = "green" if line.startswith("on") else "yellow"
        console.print(f"  [{style}]{line}[/]")
    from toolpool.sandbox.selfcheck import self_check

    ok, detail = self_check(profile)
    style = "green" if ok else "red"
    console.print(f"[bold]confined command[/]: [{style}]{'works' if ok else 'FAILS'}[/] — {detail}")
    from toolpool.sandbox.selfcheck import session_self_check

    # One sandbox per session (SPEC V1): where the mechanism is on, commands start in
    # it, so its failing is the doctor's failing; off, commands get a sandbox each.
    session_ok = True
    if profile.active("session"):
        session_ok, session_detail = session_self_check(profile)
        mark = "[green]works[/]" if session_ok else "[red]FAILS[/]"
    else:
        session_detail = "off: each command gets a sandbox of its own (see the profile above)"
        mark = "[yellow]off[/]"
    console.print(f"[bold]session sandbox[/]: {mark} — {session_detail}")
    from toolpool.sandbox.layers import layers_self_check

    layers_ok, layers_detail = layers_self_check()  # V12–V14
    mark = "[green]works[/]" if layers_ok else "[yellow]off[/]"
    what = "[bold]session layers[/] (overlay and image roots, overlay workspaces)"
    console.print(f"{what}: {mark} — {layers_detail}")
    if os.geteuid() == 0:
        console.print(
            "[yellow]running as root[/]: commands run without capabilities, but still pass "
            "owner checks on root's files; a dedicated unprivileged user is the safer way "
            "to run the daemon"
        )
    rg = shutil.which("rg")
    console.print(f"[bold]ripgrep[/]: {rg or 'missing (install the Debian package ripgrep)'}")
    return ok and session_ok
