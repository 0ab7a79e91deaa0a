"""Tools of MCP servers, imported by the daemon: a small SDK-written server
(tests/mcp_fixture_server.py) started over stdio through a bridge process, its tools
run through the pipeline and the workers like any other."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from toolpool import Client, ErrorCode, ToolCall, ToolEnd, ToolStart, ToolUpdate
from toolpool.mcp.config import McpConfigError, parse_mcp_servers, proxy_tool_name
from toolpool.models import UpdateKind

from .daemon_support import (
    ROOT,
    Daemon,
    daemon_env,
    running_daemon,
    shared_daemon,
    start_daemon,
    stop_daemon,
)
from .test_mcp_serve import readme_mcp_blocks

FIXTURE_SERVER = ["-m", "tests.mcp_fixture_server", "--name"]


def fixture_server(name: str, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [*FIXTURE_SERVER, name], "cwd": str(ROOT), **extra}


def servers_file(directory: Path, servers: dict[str, Any]) -> Path:
    path = directory / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("mcp-daemon")
    servers = {
        "fixture": fixture_server("fixture"),
        "trusted": fixture_server("trusted", trusted=True),
        "broken": {"command": str(tmp / "no-such-server")},
    }
    # stopping it leaves no bridge or server behind either
    with shared_daemon(tmp, "--mcp-servers", str(servers_file(tmp, servers))) as started:
        yield started


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(runtime_dir=daemon.runtime, timeout=20) as connected:
        yield connected


def server_process(daemon: Daemon, name: str) -> psutil.Process:
    """The fixture server started for ``name`` (a grandchild: daemon → bridge → server)."""
    for process in psutil.Process(daemon.pid).children(recursive=True):
        with_name = process.cmdline()[-2:] == ["--name", name]
        if with_name and "tests.mcp_fixture_server" in process.cmdline():
            return process
    raise AssertionError(f"no fixture server {name!r} runs")


def bridge_process(daemon: Daemon, index: int) -> psutil.Process:
    for process in psutil.Process(daemon.pid).children():
        if "toolpool.mcp.bridge" in process.cmdline() and any(
            arg.endswith(f"bridge-{index}.json") for arg in process.cmdline()
        ):
            return process
    raise AssertionError(f"no bridge {index} runs")


def first_progress(turn: Any, call_id: str) -> ToolUpdate:
    for event in turn:
        if (
            isinstance(event, ToolUpdate)
            and event.call_id == call_id
            and event.kind is UpdateKind.PROGRESS
        ):
            return event
    raise AssertionError(f"{call_id} reported no progress")


# --- what is imported ---------------------------------------------------------------------


@pytest.mark.spec("T5", "S1")
def test_T5_the_servers_tools_appear_with_their_schema_and_trust(
    client: Client, daemon: Daemon
) -> None:
    definitions = {d["name"]: d for d in client.tools("mcp")}
    imported = sorted(name for name in definitions if name.startswith("mcp__"))
    assert imported == sorted(
        f"mcp__{server}__{tool}"
        for server in ("fixture", "trusted")
        for tool in ("echo", "pause", "slow", "fail", "picture")
    )
    echo = definitions["mcp__fixture__echo"]
    assert echo["inputSchema"]["required"] == ["text"]  # the server's schema, kept
    assert echo["title"] == "Echo"
    # Untrusted: the server's readOnlyHint is not believed; the tool runs alone.
    assert echo["annotations"]["readOnlyHint"] is False
    assert echo["_meta"]["toolpool/concurrencySafe"] is False
    # Trusted: read-only, so concurrency-safe; a tool without the hint stays unsafe.
    trusted_echo = definitions["mcp__trusted__echo"]
    assert trusted_echo["annotations"]["readOnlyHint"] is True
    assert trusted_echo["_meta"]["toolpool/concurrencySafe"] is True
    assert definitions["mcp__trusted__slow"]["_meta"]["toolpool/concurrencySafe"] is False
    # A server that cannot start is left out, and said so; the daemon serves the rest.
    assert not any(name.startswith("mcp__broken__") for name in definitions)
    left_out = [
        line for line in daemon.log_lines() if "MCP server broken is left out" in str(line["msg"])
    ]
    assert left_out, "the daemon's log names the server it left out"


# --- calls ------------------------------------------------------------------------------------


@pytest.mark.spec("P5", "M1")
def test_P5_imported_tools_run_through_the_pipeline(client: Client, workspace: Path) -> None:
    with client.session(workspace) as session:
        results = session.submit(
            [
                ToolCall("hi", "mcp__fixture__echo", {"text": "hello over MCP"}),
                ToolCall("bad", "mcp__fixture__echo", {}),
                ToolCall("coerced", "mcp__fixture__pause", {"seconds": "0.1"}),
                ToolCall("img", "mcp__trusted__picture", {}),
            ]
        ).results()
    hi, bad, coerced, img = results
    assert not hi.is_error
    assert hi.text == "hello over MCP"
    assert bad.error_code is ErrorCode.INVALID_ARGUMENTS  # P5 ran before any MCP call
    assert not coerced.is_error  # "0.1" → 0.1 by the pipeline, then sent to the server
    assert coerced.text.startswith("paused 0.1")
    assert [block.to_dict()["type"] for block in img.content] == ["image"]
    assert img.content[0].to_dict()["media_type"] == "image/png"


@pytest.mark.spec("P11", "F4")
def test_P11_a_server_error_is_an_error_result_that_counts(client: Client, workspace: Path) -> None:
    with client.session(workspace, max_tool_errors=2) as session:
        results = session.submit(
            [
                ToolCall("f1", "mcp__fixture__fail", {"message": "the disk is on fire"}),
                ToolCall("f2", "mcp__fixture__fail", {"message": "still on fire"}),
                ToolCall("f3", "mcp__fixture__fail", {"message": "unreached"}),
            ]
        ).results()
    first, second, third = results
    assert first.error_code is ErrorCode.EXECUTION_FAILED
    assert "the disk is on fire" in first.text
    assert "still on fire" in second.text
    assert third.error_code is ErrorCode.BREAKER_OPEN  # two counted failures opened it


@pytest.mark.spec("P9")
def test_P9_server_progress_becomes_tool_updates(client: Client, workspace: Path) -> None:
    with client.session(workspace) as session:
        turn = session.submit([ToolCall("s", "mcp__fixture__slow", {"seconds": 0.1})])
        updates = [
            e.data
            for e in turn
            if isinstance(e, ToolUpdate) and e.kind is UpdateKind.PROGRESS and e.call_id == "s"
        ]
        (result,) = turn.results()
    assert updates == ["step 1", "step 2", "step 3"]
    assert result.text == "slept 0.1"


@pytest.mark.spec("S1", "S2")
@pytest.mark.parametrize(
    ("server", "side_by_side"),
    [("trusted", True), ("fixture", False)],
    ids=["trusted", "untrusted"],
)
def test_S1_trusted_read_only_tools_run_side_by_side_untrusted_ones_alone(
    client: Client, workspace: Path, server: str, side_by_side: bool
) -> None:
    pause = f"mcp__{server}__pause"
    with client.session(workspace) as session:
        turn = session.submit(
            [ToolCall("p1", pause, {"seconds": 0.4}), ToolCall("p2", pause, {"seconds": 0.4})]
        )
        order = [(type(e).__name__, e.call_id) for e in turn if isinstance(e, ToolStart | ToolEnd)]
        assert not any(r.is_error for r in turn.results())
    both_started = order[:2] == [("ToolStart", "p1"), ("ToolStart", "p2")]
    assert both_started is side_by_side, order


@pytest.mark.spec("D4", "S4")
def test_D4_cancelling_a_call_cancels_the_mcp_request(
    client: Client, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"
    with client.session(workspace) as session:
        # The server would sleep past the test's end: only the cancel can end the call.
        turn = session.submit(
            [ToolCall("s", "mcp__fixture__slow", {"seconds": 3600, "marker": str(marker)})],
            open=True,
        )
        first_progress(turn, "s")  # the server is running it
        turn.cancel("s")
        result = turn.result("s", timeout=40)  # a hang guard: it ends within a second
        turn.close()
    assert result.error_code in (ErrorCode.INTERRUPTED, ErrorCode.CANCELLED)
    deadline = time.monotonic() + 30  # a hang guard, as above
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "cancelled"  # the server saw its request cancelled


# --- a server or a bridge that dies ---------------------------------------------------------


@pytest.mark.spec("D2", "D1")
def test_D2_killing_the_server_mid_call_is_an_error_result_and_the_daemon_goes_on(
    client: Client, daemon: Daemon, workspace: Path
) -> None:
    with client.session(workspace) as session:
        turn = session.submit([ToolCall("s", "mcp__fixture__slow", {"seconds": 45})], open=True)
        first_progress(turn, "s")
        killed = server_process(daemon, "fixture")
        killed.send_signal(signal.SIGKILL)
        result = turn.result("s", timeout=20)
        turn.add([ToolCall("again", "mcp__fixture__echo", {"text": "back"})])
        again = turn.result("again", timeout=30)
        turn.add([ToolCall("local", "read", {"path": "."})])
        local = turn.result("local", timeout=20)
        turn.close()
    assert result.error_code is ErrorCode.EXECUTION_FAILED
    assert 'MCP server "fixture" closed the connection' in result.text
    assert again.text == "back"  # the bridge started the server again
    assert server_process(daemon, "fixture").pid != killed.pid
    assert not local.is_error
    assert daemon.process.poll() is None


@pytest.mark.spec("D2")
def test_D2_a_dead_bridge_is_an_error_result(tmp_path: Path, workspace: Path) -> None:
    servers = servers_file(tmp_path, {"only": fixture_server("only")})
    daemon = start_daemon(tmp_path, "--mcp-servers", str(servers))
    try:
        bridge = bridge_process(daemon, 0)
        server = server_process(daemon, "only")
        bridge.send_signal(signal.SIGKILL)
        bridge.wait(10)
        server.wait(10)  # its stdin closed with the bridge: it exits
        with (
            Client(runtime_dir=daemon.runtime, timeout=20) as client,
            client.session(workspace) as session,
        ):
            results = session.submit(
                [
                    ToolCall("gone", "mcp__only__echo", {"text": "anyone?"}),
                    ToolCall("local", "noop", {}),
                ]
            ).results()
    finally:
        assert stop_daemon(daemon) == 0
    gone, local = results
    assert gone.error_code is ErrorCode.EXECUTION_FAILED
    assert 'the bridge of MCP server "only"' in gone.text
    assert local.text == "ok"


@pytest.mark.spec("D1")
def test_D1_a_daemon_killed_outright_takes_its_bridges_and_servers_along(
    tmp_path: Path,
) -> None:
    servers = servers_file(tmp_path, {"only": fixture_server("only")})
    daemon = start_daemon(tmp_path, "--mcp-servers", str(servers))
    try:
        left = [bridge_process(daemon, 0), server_process(daemon, "only")]
    finally:
        daemon.process.kill()
        daemon.process.wait()
    _, alive = psutil.wait_procs(left, timeout=15)
    assert alive == [], [p.cmdline() for p in alive]


@pytest.mark.spec("T5")
def test_T5_a_server_reached_over_http_is_imported_too(tmp_path: Path, workspace: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, *FIXTURE_SERVER, "web", "--http-port", str(port)],
        cwd=ROOT,
        env=daemon_env(tmp_path),
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 40  # a hang guard: it comes up in a second or two
        while True:
            with socket.socket() as attempt:
                if attempt.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the HTTP server did not come up"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/mcp"
        servers = servers_file(tmp_path, {"web": {"type": "http", "url": url}})
        with (
            running_daemon(tmp_path, "--mcp-servers", str(servers)) as daemon,
            Client(runtime_dir=daemon.runtime) as client,
            client.session(workspace) as session,
        ):
            echo = ToolCall("e", "mcp__web__echo", {"text": "by HTTP"})
            (result,) = session.submit([echo]).results()
    finally:
        server.terminate()
        server.wait(10)
    assert result.text == "by HTTP"


# --- configuration ------------------------------------------------------------------------------


def test_the_usual_mcp_servers_shape_is_read() -> None:
    servers = parse_mcp_servers(
        {
            "mcpServers": {
                "files": {"command": "npx", "args": ["-y", "server"], "env": {"K": "v"}},
                "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp", "trusted": True},
            }
        }
    )
    files, remote = servers
    assert (files.name, files.command, files.args, files.env) == (
        "files",
        "npx",
        ("-y", "server"),
        {"K": "v"},
    )
    assert not files.trusted
    assert (remote.url, remote.trusted) == ("http://127.0.0.1:9/mcp", True)


@pytest.mark.parametrize(
    ("servers", "problem"),
    [
        ([], "expected"),
        ({"mcpServers": {"x": {}}}, 'either "command"'),
        ({"mcpServers": {"x": {"command": "a", "url": "http://h"}}}, 'either "command"'),
        ({"mcpServers": {"x": {"command": "a", "args": "b"}}}, "args must be a list"),
        ({"mcpServers": {"x": {"command": "a", "env": {"K": 1}}}}, "env must map"),
        ({"mcpServers": {"x": {"command": "a", "trusted": "yes"}}}, "trusted must be"),
        ({"mcpServers": {"x": {"command": "a", "type": "http"}}}, "does not fit"),
        ({"mcpServers": {"x": {"url": "http://h/sse", "type": "sse"}}}, "not supported"),
        ({"mcpServers": {"x": {"command": "a", "disabled": True}}}, "unknown keys"),
    ],
)
def test_a_bad_mcp_servers_file_is_refused_with_where(servers: Any, problem: str) -> None:
    with pytest.raises(McpConfigError, match=problem):
        parse_mcp_servers(servers)


def test_the_readme_servers_file_is_read_as_written() -> None:
    files, search = parse_mcp_servers(readme_mcp_blocks()[1], "README.md")
    assert (files.command, files.trusted) == ("npx", False)
    assert (search.url, search.trusted) == ("http://127.0.0.1:8000/mcp", True)


def test_proxy_names_are_valid_tool_names_and_stay_apart() -> None:
    assert proxy_tool_name("files", "read_file") == "mcp__files__read_file"
    assert proxy_tool_name("my.server", "do it!") == "mcp__my_server__do_it_"
    long_a, long_b = (proxy_tool_name("s", "x" * 80 + tail) for tail in ("a", "b"))
    assert len(long_a) == len(long_b) == 64
    assert long_a != long_b


def test_the_daemon_refuses_a_bad_mcp_servers_file(tmp_path: Path) -> None:
    bad = tmp_path / "mcp.json"
    bad.write_text('{"mcpServers": {"x": {"command": 1}}}')
    finished = subprocess.run(
        [
            *(sys.executable, "-m", "toolpool", "daemon", "run"),
            *("--runtime-dir", str(tmp_path / "rt"), "--mcp-servers", str(bad)),
        ],
        cwd=ROOT,
        env=daemon_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert finished.returncode == 1
    assert "command must be a string" in finished.stderr
    assert not os.path.exists(tmp_path / "rt" / "daemon.pid")
