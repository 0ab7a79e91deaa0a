"""The command line: the demo the README's first command runs, in-process here (the
daemon's commands are tested against a real daemon in test_daemon.py)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolpool.cli import build_parser
from toolpool.cli.daemon import daemon_argv, daemon_flags
from toolpool.cli.messages import exit_for
from toolpool.client import DaemonUnavailable
from toolpool.client.control import ExitCode
from toolpool.daemon.config_table import LIMIT_SETTINGS, SETTINGS, ConfigError
from toolpool.profiles import PROFILES
from toolpool.providers import PROVIDERS

from .daemon_support import ROOT, daemon_env, running_daemon


@pytest.mark.spec("P3", "P7", "P9", "M2")
def test_demo_pushes_a_turn_through_the_pipeline_and_prints_its_events() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "demo", "--in-process"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # parallel reads and greps, the edit's diff, streamed test output, the end
    assert "✓ c2 calc/ops.py:6:    # TODO: handle overflow" in out
    assert "-    # TODO: handle overflow" in out
    assert "… c7 running test_mul" in out
    assert "turn end: 7 results, 0 errors" in out


def test_demo_without_a_daemon_says_how_to_start_one(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolpool", "demo", "--runtime-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3  # the exit code of "no daemon runs", for every command
    assert done.stderr.startswith("toolpool: error: no toolpool daemon runs")
    assert "toolpool daemon start" in done.stderr


def test_version_and_usage() -> None:
    for module in ("toolpool", "toolpool.cli"):  # the package, and the command's own
        version = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True, check=True
        )
        assert version.stdout.startswith("toolpool ")
    usage = subprocess.run(
        [sys.executable, "-m", "toolpool"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 2
    assert "COMMAND" in usage.stderr


def test_the_control_commands_leave_the_pool_unloaded(tmp_path: Path) -> None:
    # The daemon's configuration takes the pool's defaults from PoolConfig; the pool
    # itself, with the tools and the sandbox it imports, is the daemon's to load.
    probe = (
        "import sys; from toolpool.cli import main; "
        "code = main(['daemon', 'status', '--runtime-dir', sys.argv[1]]); "
        "print(code, sorted(m for m in sys.modules if m in ("
        "'toolpool.pool.pool', 'toolpool.pool.executor', 'toolpool.pool.supervisor')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "rt")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines()[-1] == f"{int(ExitCode.NOT_RUNNING)} []", done.stdout


def test_unknown_flags_are_refused_but_the_bench_gets_its_own() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "toolpool", "status", "--bogus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2
    assert "toolpool: error: unrecognized arguments: --bogus" in refused.stderr
    # `toolpool bench` hands every flag, --help too, to bench/run.py
    bench = subprocess.run(
        [sys.executable, "-m", "toolpool", "bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "usage: toolpool bench" in bench.stdout
    assert "--quick" in bench.stdout
    wrong = subprocess.run(
        [sys.executable, "-m", "toolpool", "bench", "--only", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 2
    assert "toolpool: error: bench: unknown scenarios ['nonsense']" in wrong.stderr


def toolpool(tmp: Path, *args: str, **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolpool", *args],
        capture_output=True,
        text=True,
        cwd=options.get("cwd", ROOT),
        env={**daemon_env(tmp), **options.get("env", {})},  # type: ignore[dict-item]
        timeout=120,
        check=False,
    )


def _command(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    """The parser of ``toolpool NAME [NAME …]``."""
    for name in names:
        (parser,) = (
            action.choices[name]
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
        )
    return parser


def _choices(parser: argparse.ArgumentParser, flag: str) -> tuple[str, ...]:
    (action,) = (action for action in parser._actions if flag in action.option_strings)
    return tuple(action.choices or ())


@pytest.mark.spec("F12")
def test_F12_the_commands_profiles_and_formats_are_their_owners_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the profiles' table and the providers': the command line's choices are theirs
    parser = build_parser()
    assert _choices(_command(parser, "tools"), "--profile") == tuple(PROFILES)
    assert _choices(_command(parser, "mcp", "serve"), "--tool-profile") == tuple(PROFILES)
    assert _choices(_command(parser, "tools"), "--format") == ("toolpool", *PROVIDERS)
    with pytest.raises(SystemExit):
        parser.parse_args(["tools", "--profile", "cursor"])
    # When a profile is added to its table, and nowhere else
    monkeypatch.setitem(PROFILES, "cursor", ())  # type: ignore[index]
    # Then every command that names a profile takes it
    again = build_parser()
    assert again.parse_args(["tools", "--profile", "cursor"]).profile == "cursor"
    assert again.parse_args(["mcp", "serve", "--tool-profile", "cursor"]).tool_profile == "cursor"


@pytest.mark.spec("E3")
def test_E3_every_setting_has_its_flag_of_the_same_name() -> None:
    # The flags come from the configuration's table: a new setting cannot lack one.
    (daemon,) = (
        parser
        for action in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
        for name, parser in action.choices.items()  # type: ignore[union-attr]
        if name == "daemon"
    )
    flags = {flag for action in daemon._actions for flag in action.option_strings}
    for setting in SETTINGS:
        assert "--" + setting.name.replace("_", "-") in flags
    for setting in LIMIT_SETTINGS:
        assert "--limits-" + setting.name.replace("_", "-") in flags
    assert {"--tool-limit", "--config", "--tool-module", "--sandbox-disable"} <= flags


@pytest.mark.spec("E3")
def test_E3_old_flag_spellings_work_with_a_deprecation_note(tmp_path: Path) -> None:
    done = toolpool(
        tmp_path, "daemon", "status", "--runtime-dir", str(tmp_path / "rt"),
        "--tool-module", "toolpool.tools", "--tool-module", "tests.worker_tools",
        "--sandbox-disable", "landlock", "--sandbox-disabled", "seccomp",
        "--limits-memory-bytes", "1048576", "--tool-limit", "bash.wall_seconds=5",
        "--worker-cpus", "0.5", "--cancel-grace", "1", "--private-run",
    )  # fmt: skip
    assert done.returncode == ExitCode.NOT_RUNNING, done.stderr
    assert "toolpool daemon is not running" in done.stdout
    notes = done.stderr.splitlines()
    assert notes == [
        "toolpool: note: --tool-module is deprecated: use --tool-modules A,B",
        "toolpool: note: --sandbox-disable is deprecated: use --sandbox-disabled A,B",
    ]


@pytest.mark.spec("E3")
def test_E3_flags_reach_the_config_and_the_background_daemon_in_their_new_spelling() -> None:
    from toolpool.daemon.config import load_config

    args = build_parser().parse_args(
        ["daemon", "start", "--tool-module", "toolpool.tools", "--sandbox-disable", "landlock",
         "--limits-wall-seconds", "9", "--tool-limit", "bash.memory_bytes=4096",
         "--worker-cpus", "0.5", "--private-run", "false"]
    )  # fmt: skip
    flags = daemon_flags(args)
    config = load_config(flags, env={})
    assert config.tool_modules == ("toolpool.tools",)
    assert config.sandbox_disabled == frozenset({"landlock"})
    assert config.limits.wall_seconds == 9
    assert config.tool_limits == {"bash": {"memory_bytes": 4096}}
    assert (config.worker_cpus, config.private_run) == (0.5, False)
    argv = daemon_argv(flags)
    assert "--tool-modules=toolpool.tools" in argv
    assert "--sandbox-disabled=landlock" in argv
    again = build_parser().parse_args(["daemon", *argv])
    assert load_config(daemon_flags(again), env={}) == config


@pytest.mark.spec("E2")
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["call", "read"], 2, "expected pairs of a tool name and its JSON arguments"),
        (["call", "read", "{nope"], 2, "call read: the arguments are not JSON"),
        (["call", "read", "[1]"], 2, "the arguments must be a JSON object"),
        (["call", "read", "{}"], 3, "no toolpool daemon runs"),
        (["status"], 3, "no toolpool daemon runs"),
        (["tools", "--endpoint", "ipc:///nonexistent/x.sock"], 3, "no toolpool daemon answers"),
        (["tools", "--tool-modules", "no_such_mod"], 2, "no module 'no_such_mod'"),
        (["tools", "--format", "yaml"], 2, "argument --format: invalid choice"),
        (["daemon", "--max-workers", "four"], 2, "max_workers = 'four'"),
        (["daemon", "stop", "--limits-wall-seconds", "-3"], 2, "wall_seconds = '-3'"),
        (["mcp", "serve", "--runtime-dir"], 2, "expected one argument"),
    ],
)
def test_E2_every_subcommand_one_prefix_one_table_no_traceback(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    runtime = ["--runtime-dir", str(tmp_path / "rt")] if args[-1] != "--runtime-dir" else []
    if "--endpoint" in args:
        runtime = []
    done = toolpool(tmp_path, *args, *runtime)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("toolpool: ")]
    assert any(line.startswith("toolpool: error: ") and message in line for line in errors)


def test_an_internal_error_is_one_line_unless_debugging(monkeypatch: pytest.MonkeyPatch) -> None:
    usage = (ConfigError,)
    assert exit_for(ConfigError("x"), usage, DaemonUnavailable) == (ExitCode.USAGE, "x")
    assert exit_for(DaemonUnavailable("y"), usage, DaemonUnavailable)[0] == ExitCode.NOT_RUNNING
    assert exit_for(OSError("z"), usage, DaemonUnavailable)[0] == ExitCode.FAILED
    monkeypatch.delenv("TOOLPOOL_DEBUG", raising=False)
    code, message = exit_for(KeyError("k"), usage, DaemonUnavailable)
    assert code == ExitCode.INTERNAL
    assert message == "internal error: KeyError: 'k' (TOOLPOOL_DEBUG=1 shows the traceback)"


@pytest.mark.spec("D5", "F3", "F5")
def test_call_runs_a_read_then_an_edit_in_one_session(tmp_path: Path, workspace: Path) -> None:
    (workspace / "notes.txt").write_text("hello world\n")
    with running_daemon(tmp_path) as daemon:
        edit = '{"path": "notes.txt", "old_string": "world", "new_string": "there"}'
        alone = toolpool(
            tmp_path, "call", "edit", edit, "--workspace", str(workspace),
            "--runtime-dir", str(daemon.runtime),
        )  # fmt: skip
        assert alone.returncode == ExitCode.FAILED  # a new session: no read before it
        assert "has not been read yet" in alone.stdout
        assert (workspace / "notes.txt").read_text() == "hello world\n"
        done = toolpool(
            tmp_path, "call", "read", '{"path": "notes.txt"}', "edit", edit,
            "--workspace", str(workspace), "--runtime-dir", str(daemon.runtime), "--print-result",
        )  # fmt: skip
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert (workspace / "notes.txt").read_text() == "hello there\n"
    assert done.stdout.index("▶ call-1 Read") < done.stdout.index("▶ call-2 Edit")


def test_tools_without_a_daemon_lists_the_configured_tools(tmp_path: Path) -> None:
    done = toolpool(
        tmp_path, "tools", "--format", "openai", "--runtime-dir", str(tmp_path / "rt"),
        "--tool-modules", "toolpool.tools,tests.worker_tools",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = [d["function"]["name"] for d in json.loads(done.stdout)]
    assert {"read", "edit", "bash", "noop"} <= set(names)
    config = tmp_path / "config" / "toolpool" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('tool_modules = ["tests.worker_tools"]\n')  # the user's file
    configured = toolpool(tmp_path, "tools", "--runtime-dir", str(tmp_path / "rt"))
    assert configured.returncode == 0, configured.stderr
    assert "read" not in {d["name"] for d in json.loads(configured.stdout)}


@pytest.mark.spec("E2")
def test_bench_from_an_installed_package_says_it_needs_the_checkout(tmp_path: Path) -> None:
    # The package alone, as a wheel installs it: no bench/ beside it.
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "toolpool", site / "toolpool", ignore=shutil.ignore_patterns("__pycache__")
    )
    done = toolpool(tmp_path, "bench", "--quick", cwd=tmp_path, env={"PYTHONPATH": str(site)})
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.startswith("toolpool: error: bench: the bench ships with toolpool's source")
    assert "Traceback" not in done.stderr
