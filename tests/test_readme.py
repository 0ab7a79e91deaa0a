"""The README's Python examples run as written: the client ones against a real
daemon, in a directory with a README.md, the embedding one on its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolpool.sandbox.profile import SandboxProfile

from .daemon_support import daemon_env, running_daemon

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)


def run(code: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.spec("E1", "R3")
def test_readme_client_examples_run_against_a_daemon(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# my project\n\nIt uses toolpool.\n")
    with running_daemon(tmp_path) as daemon:
        env = {**daemon_env(tmp_path), "TOOLPOOL_RUNTIME_DIR": str(daemon.runtime)}
        blocking = run(EXAMPLES[0], project, env).splitlines()
        asynchronous = run(EXAMPLES[1], project, env).splitlines()
        anthropic = run(EXAMPLES[2], project, env).splitlines()
        traced = run(EXAMPLES[3], project, env)
    assert blocking[-3:] == [
        "1 ok Found 1 matching line in 1 file",
        "2 ok      1\t# my project",
        "3 ok hello from a sandbox",
    ]
    assert blocking[0] == "tool_start 1"
    assert "turn_end" in blocking[-4]
    assert asynchronous[0] == "tool_start"
    assert asynchronous[-2:] == ["./", "  README.md"]
    # E1: the SDK's own Message object, submitted as it is.
    assert anthropic == ["user toolu_1 False", "     1\t# my project"]
    # R3: the spans, printed by the SDK's console exporter, one trace.
    spans = {span["name"]: span for span in _printed_spans(traced)}
    assert set(spans) == {"execute_tool read", "toolpool.turn", "agent step"}
    assert spans["execute_tool read"]["parent_id"] == spans["toolpool.turn"]["context"]["span_id"]
    assert spans["toolpool.turn"]["parent_id"] == spans["agent step"]["context"]["span_id"]
    assert spans["execute_tool read"]["attributes"]["gen_ai.tool.call.id"] == "1"


def _printed_spans(text: str) -> list[dict[str, Any]]:
    """The JSON objects ConsoleSpanExporter printed, one after another."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        span, at = decoder.raw_decode(text, start)
        spans.append(span)
    return spans


def test_readme_embedding_example_runs(tmp_path: Path) -> None:
    assert run(EXAMPLES[4], tmp_path, daemon_env(tmp_path)).splitlines() == ["4"]


def _example(marker: str) -> str:
    (found,) = [e for e in EXAMPLES if marker in e]
    return found


@pytest.mark.spec("A3")
def test_readme_framework_examples_run_against_a_daemon(tmp_path: Path) -> None:
    """Each framework's example, as written, with its offline model or none: at most
    ten lines of glue between the client and the framework."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# my project\n\nIt uses toolpool.\n")
    examples = {
        name: _example(f"toolpool.integrations.{name}")
        for name in ("pydantic_ai", "openai_agents", "langchain")
    }
    for code in examples.values():  # the glue: what sits inside main()
        body = code.split("async def main() -> None:\n", 1)[1].split("\n\n", 1)[0]
        assert len(body.splitlines()) <= 10
    with running_daemon(tmp_path) as daemon:
        env = {**daemon_env(tmp_path), "TOOLPOOL_RUNTIME_DIR": str(daemon.runtime)}
        printed = {name: run(code, project, env) for name, code in examples.items()}
    assert "README.md" in printed["pydantic_ai"]  # TestModel called ls, and said so
    assert printed["openai_agents"].strip() == "['read', 'glob', 'grep']"
    assert printed["langchain"].startswith("success      1\t# my project")


@pytest.mark.spec("B3", "B8", "B10")
@pytest.mark.skipif(
    os.geteuid() != 0 or not SandboxProfile.probe().active("session"),
    reason="a workspace overlay needs session sandboxes and a daemon run as root",
)
def test_readme_best_of_n_example_forks_picks_and_commits(tmp_path: Path) -> None:
    (example,) = [e for e in EXAMPLES if "base.fork(" in e]
    project = tmp_path / "project"
    project.mkdir()
    with running_daemon(tmp_path) as daemon:
        env = {**daemon_env(tmp_path), "TOOLPOOL_RUNTIME_DIR": str(daemon.runtime)}
        printed = run(example, project, env).splitlines()
    assert printed == ["+    return a + b", "['calc.py']", "    return a + b"]


@pytest.mark.spec("A5")
def test_readme_session_tools_example_runs_against_a_daemon(tmp_path: Path) -> None:
    """The agent's own function, shipped with its session, runs pytest in a worker."""
    project = tmp_path / "project"
    project.mkdir()
    with running_daemon(tmp_path) as daemon:
        env = {**daemon_env(tmp_path), "TOOLPOOL_RUNTIME_DIR": str(daemon.runtime)}
        printed = run(_example("tools=[run_tests]"), project, env)
    assert printed.strip() == "pytest exited 5"  # no tests in the project: pytest says 5


SHELL = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)


@pytest.mark.spec("E9")
def test_readme_call_example_runs_as_written(tmp_path: Path) -> None:
    """The `toolpool call` example, in a shell whose PATH has the virtual environment
    (as the README says to activate it), in an empty directory: it makes its file."""
    (example,) = [block for block in SHELL if "toolpool call read" in block]
    project = tmp_path / "project"
    project.mkdir()
    with running_daemon(tmp_path) as daemon:
        env = {**daemon_env(tmp_path), "TOOLPOOL_RUNTIME_DIR": str(daemon.runtime)}
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", example], cwd=project, env=env,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project / "notes.txt").read_text() == "hello there\n"
