"""A policy session's questions and records (SPEC N6, N8), the operator's ceiling
(N1) and pins (N10), through real daemons: a connection no rule names is put to the
client — answered for once or for the session, by the handler or not at all, never
more than 16 at a time — and every connection is on the record, in the audit log,
in ``toolpool audit`` and in ``status``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import AsyncClient, Client, ToolCall
from toolpool.client import ApprovalRequested, RequestFailed
from toolpool.daemon.config import ConfigError, load_config

from .daemon_support import ROOT, daemon_env, running_daemon
from .egress_support import REASON, Site, out, records, run, site, usable
from .shell_support import wait_until

needs_policy = pytest.mark.skipif(not usable(), reason=REASON)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not usable():
        pytest.skip(REASON)
    with site(tmp_path_factory.mktemp("asks")) as made:
        yield made


@pytest.fixture
def client(net: Site) -> Iterator[Client]:
    with Client(runtime_dir=net.daemon.runtime, timeout=120) as connected:
        yield connected


# --- asking (N6) -----------------------------------------------------------------------------


@needs_policy
@pytest.mark.spec("N6")
def test_N6_a_name_no_rule_names_is_asked_and_a_session_answer_is_remembered(
    client: Client, net: Site, workspace: Path
) -> None:
    asked: list[tuple[str, str, int, str, str]] = []

    def on_approval(request: ApprovalRequested) -> Any:
        asked.append((request.kind, request.host, request.port, request.call.id, request.label))
        if request.host == "asked.test":
            return "session"  # allowed, and not asked again this session
        if request.host == "raw.test":
            return request.approve()  # allowed this once
        return request.deny("not that one", scope="session")

    policy = {"allow": [], "ask": True}
    with client.session(workspace, network=policy, on_approval=on_approval) as session:
        first = run(session, "curl -sS http://asked.test/1; curl -sS http://asked.test/2", "k1")
        assert out(first).splitlines() == ["allowed /1", "allowed /2"]
        denied = run(session, "curl -sS http://evil.test/; curl -sS http://evil.test/", "k2")
        assert out(denied).splitlines() == [
            "toolpool refused evil.test:80 (client: not that one) by the session's network policy",
            "toolpool refused evil.test:80 (client, remembered for the session: not that one) "
            "by the session's network policy",
        ]
        once = run(session, "curl -sS -m 5 http://raw.test/; curl -sS -m 5 http://raw.test/", "k3")
        out(once)
    # One question for asked.test (remembered), one for evil.test (its denial too),
    # and two for raw.test (allowed once each time); each naming its host, port and call
    assert asked == [
        ("network", "asked.test", 80, "k1", "Connect to asked.test:80"),
        ("network", "evil.test", 80, "k2", "Connect to evil.test:80"),
        ("network", "raw.test", 80, "k3", "Connect to raw.test:80"),
        ("network", "raw.test", 80, "k3", "Connect to raw.test:80"),
    ]
    wait_until(lambda: len(records(net.audit, session.id)) >= 6, "six records")
    by = [r["by"] for r in records(net.audit, session.id) if r["host"] != "raw.test"]
    assert by == [
        "client",
        "client, remembered for the session",
        "client",
        "client, remembered for the session",
    ]
    assert net.evil.seen == []


@needs_policy
@pytest.mark.spec("N6")
def test_N6_without_a_handler_a_question_is_refused_at_once_saying_so(
    client: Client, net: Site, workspace: Path
) -> None:
    with client.session(workspace, network={"allow": [], "ask": True}) as session:
        result = run(session, "curl -sS http://asked.test/", "lonely")
    assert "the session has no on_approval handler to ask" in out(result)
    assert result.details["network_refused"] == [{"host": "asked.test", "port": 80, "by": "client"}]


@needs_policy
@pytest.mark.spec("N6", "N12")
async def test_N6_questions_are_bounded_16_pending_then_refused_and_unanswered_time_out(
    net: Site, workspace: Path
) -> None:
    asked: list[str] = []
    never: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def on_approval(request: ApprovalRequested) -> Any:
        asked.append(request.host)
        return never  # the user never answers

    # Given a command that asks for 30 names no rule names at once
    script = "for i in $(seq 30); do curl -sS -m 60 http://h$i.test/ & done; wait"
    client = AsyncClient(runtime_dir=net.daemon.runtime, timeout=120)
    policy = {"allow": [], "ask": True}
    async with (
        client,
        client.session(
            workspace, network=policy, on_approval=on_approval, approval_timeout=3
        ) as session,
    ):
        turn = await session.submit([ToolCall("flood", "bash", {"command": script})])
        (result,) = await turn.results(timeout=120)
    never.cancel()
    # Then 16 were asked and timed out unanswered, 14 refused at once without a question
    text = out(result)
    assert len(asked) == 16
    assert text.count("16 network approvals pending already") == 14
    assert text.count("(timeout: Not approved: no answer within 3 s.)") == 16
    assert len(result.details["network_refused"]) == 30


# --- records (N8) -------------------------------------------------------------------------------


@needs_policy
@pytest.mark.spec("N8")
def test_N8_every_connection_is_on_the_record_in_audit_and_status(
    client: Client, net: Site, workspace: Path, tmp_path: Path
) -> None:
    policy = {"allow": ["allowed.test"]}
    with client.session(workspace, network=policy) as session:
        run(session, "curl -sS http://allowed.test/one; curl -sS http://evil.test/", "r1")
        counters = client.status()["sessions"][session.id]["network"]["proxy"]
        assert counters["connections"] == 2 and counters["allowed"] == 1
        assert counters["denied"] == 1 and counters["bytes_down"] > 0
        assert client.status()["egress_proxy"]["pid"] is not None
        session_id = session.id
    wait_until(lambda: len(records(net.audit, session_id)) == 2, "both records")
    allowed, denied = records(net.audit, session_id)
    assert allowed["decision"] == "allow" and allowed["call"] == "r1"
    assert allowed["address"].startswith("127.0.0.1:") and allowed["duration_ms"] >= 0
    assert denied == {
        **denied,
        "host": "evil.test",
        "port": 80,
        "decision": "deny",
        "by": "no rule allows it",
        "bytes_up": 0,
        "bytes_down": 0,
    }
    shown = subprocess.run(
        [sys.executable, "-m", "toolpool", "audit", "--file", str(net.audit),
         "--session", session_id],
        cwd=ROOT, env=daemon_env(tmp_path), capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = [line for line in shown.stdout.splitlines() if " connect " in line]
    assert len(lines) == 2
    assert 'r1  connect allowed.test:80  allow by allow "allowed.test"' in lines[0]
    assert "connect evil.test:80  deny by no rule allows it  0 B up, 0 B down" in lines[1]


# --- the ceiling (N1) and pins (N10) -------------------------------------------------------------


@pytest.mark.spec("N1")
def test_N1_the_daemons_network_setting_is_a_ceiling(tmp_path: Path, workspace: Path) -> None:
    with (
        running_daemon(tmp_path, "--network=policy") as daemon,
        Client(runtime_dir=daemon.runtime, timeout=60) as client,
    ):
        for options in (
            {"network": "open"},
            {"allow_network": True},
            {"limits": {"network": True}},
        ):
            with pytest.raises(RequestFailed, match="this daemon's network setting is 'policy'"):
                client.session(workspace, **options).__enter__()
        with client.session(workspace, network={"allow": ["a.test"]}) as session:
            assert client.status()["sessions"][session.id]["network"]["mode"] == "policy"
    with (
        running_daemon(tmp_path, "--network=off", runtime=tmp_path / "r2") as daemon,
        Client(runtime_dir=daemon.runtime, timeout=60) as client,
    ):
        with pytest.raises(RequestFailed, match=r"network = \{'allow': \['a.test'\]"):
            client.session(workspace, network={"allow": ["a.test"]}).__enter__()
        with client.session(workspace) as session:  # off, as every session by default
            assert client.status()["sessions"][session.id]["network"] == {"mode": "off"}


@pytest.mark.spec("N1")
def test_N1_limits_network_past_the_ceiling_is_a_contradiction_the_operator_settles(
    tmp_path: Path,
) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"limits.network = true means network = 'open'"):
        load_config({"network": "policy", "limits": {"network": "true"}}, env=env)
    with pytest.raises(ConfigError, match=r"tool_limits.bash.network = true"):
        load_config({"network": "off", "tool_limit": ["bash.network=true"]}, env=env)
    assert load_config({"limits": {"network": "true"}}, env=env).network == "open"


@pytest.mark.spec("N10")
def test_N10_network_resolve_from_the_file_the_environment_and_the_flags(
    tmp_path: Path,
) -> None:
    toml = tmp_path / "toolpool" / "config.toml"
    toml.parent.mkdir()
    toml.write_text('[network_resolve]\n"file.test" = "10.0.0.1"\n"both.test" = "10.0.0.2:80"\n')
    env = {
        "XDG_CONFIG_HOME": str(tmp_path),
        "TOOLPOOL_NETWORK_RESOLVE": "env.test=[::1]:8443, both.test=10.0.0.3",
    }
    made = load_config({"network_resolve": ["Flag.Test=127.0.0.1:9"]}, env=env)
    assert made.network_resolve == {
        "file.test": ("10.0.0.1", None),
        "both.test": ("10.0.0.3", None),  # the environment over the file
        "env.test": ("::1", 8443),
        "flag.test": ("127.0.0.1", 9),
    }
    with pytest.raises(
        ConfigError,
        match=r"flag --network-resolve: network_resolve 'x.test' = 'nowhere': expected an IP",
    ):
        load_config({"network_resolve": ["x.test=nowhere"]}, env=env)
    with pytest.raises(ConfigError, match="expected NAME=IP or NAME=IP:PORT"):
        load_config({"network_resolve": ["x.test"]}, env=env)
    toml.write_text('network_resolve = "a=b"\n')
    with pytest.raises(ConfigError, match="network_resolve must be a table"):
        load_config({}, env={"XDG_CONFIG_HOME": str(tmp_path)})
