"""A session's network (SPEC N1) and how its policy judges a connection (N2): the
option's three forms and its old spellings, patterns and their matching, deny over
allow, addresses in every form a resolver reads, and the values an attacker's client
sends where a policy goes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolpool import ToolCall
from toolpool.egress.addresses import PinError, parse_pin, pin_text
from toolpool.egress.environment import call_mac, call_of, proxy_environment, token_user
from toolpool.egress.rules import Action, NetworkPolicy, Pattern, PolicyError, ip_literal
from toolpool.engine import Coordinator
from toolpool.models import ErrorCode
from toolpool.session_options import Network, SessionOptionError, SessionOptions
from toolpool.tools.bash import bash

from .daemon_support import ROOT
from .network_tools import fetch


def judged(policy: dict[str, Any], host: str, port: int = 443) -> tuple[Action, str]:
    verdict = NetworkPolicy.parse(policy).judge(host, port)
    return verdict.action, verdict.rule


# --- N1: the option ---


@pytest.mark.spec("N1")
def test_N1_network_is_off_by_default_and_takes_three_forms() -> None:
    assert SessionOptions().network is Network.OFF
    assert SessionOptions.parse({"network": "open"}).network is Network.OPEN
    policy = SessionOptions.parse({"network": {"allow": ["pypi.org"], "ask": True}}).network
    assert isinstance(policy, NetworkPolicy)
    assert policy.allow == (Pattern("pypi.org"),) and policy.ask


@pytest.mark.spec("N1")
def test_N1_allow_network_is_the_old_spelling_of_open_and_reads_back() -> None:
    old = SessionOptions.parse({"allow_network": True})
    assert old.network is Network.OPEN and old.allow_network
    new = SessionOptions.parse({"network": "open"})
    assert new.allow_network  # what the engine and the pool read
    assert SessionOptions.parse(old.to_wire()) == old == new
    with pytest.raises(SessionOptionError, match="old spelling of network = 'open'"):
        SessionOptions.parse({"allow_network": True, "network": {"allow": ["a.test"]}})


@pytest.mark.spec("N1")
@pytest.mark.parametrize(
    ("network", "message"),
    [
        ("sometimes", "expected 'off', 'open' or a policy"),
        (True, "expected 'off', 'open' or a policy"),
        ({"allow": "pypi.org"}, "allow: expected a list of patterns"),
        ({"allow": ["pypi.org"], "colour": 1}, "unknown key 'colour'"),
        ({"deny": ["ex ample.com"]}, "is not a host name"),
        ({"allow": ["a.*.com"]}, "a wildcard goes first and alone"),
        ({"allow": ["example.com:0"]}, "port must be a number from 1 to 65535"),
        ({"allow": ["example.com:99999"]}, "port must be a number from 1 to 65535"),
        ({"allow": ["[::1"]}, "has no closing ]"),
        ({"ask": "yes"}, "ask = 'yes': expected true or false"),
        ({"unix_sockets": ["relative.sock"]}, "is not an absolute path"),
        ({"allow": ["x" * 300]}, "is not a host name"),
        ({"allow": ["a.test"] * 2000}, None),  # duplicates fold: one rule
        ({"allow": [f"h{i}.test" for i in range(2000)]}, "at most 1024 patterns"),
    ],
)
def test_N1_a_bad_policy_is_refused_in_one_line_naming_it(
    network: Any, message: str | None
) -> None:
    if message is None:
        parsed = SessionOptions.parse({"network": network}).network
        assert isinstance(parsed, NetworkPolicy) and len(parsed.allow) == 1
        return
    with pytest.raises(SessionOptionError) as refused:
        SessionOptions.parse({"network": network})
    text = str(refused.value)
    assert text.startswith("session option network = ") and message in text
    assert "\n" not in text and len(text) < 600


_LABEL = st.text("abcxyz019-", min_size=1, max_size=8).filter(
    lambda s: not s.startswith("-") and not s.endswith("-")
)
_NAME = st.lists(_LABEL, min_size=2, max_size=4).map(".".join)
_PATTERN = st.one_of(
    _NAME,
    _NAME.map(lambda n: f"*.{n}"),
    st.tuples(_NAME, st.integers(1, 65535)).map(lambda t: f"{t[0]}:{t[1]}"),
    st.sampled_from(["*", "10.0.0.5", "[2001:db8::1]:8443", "2001:db8::2"]),
)


@pytest.mark.spec("N1")
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "allow": st.lists(_PATTERN, max_size=5),
            "deny": st.lists(_PATTERN, max_size=5),
            "ask": st.booleans(),
            "unix_sockets": st.lists(st.sampled_from(["/run/a.sock", "/var/b"]), max_size=2),
        },
    )
)
def test_N1_a_policy_reads_back_from_the_wire(policy: dict[str, Any]) -> None:
    parsed = SessionOptions.parse({"network": policy})
    assert SessionOptions.parse(parsed.to_wire()) == parsed


# --- N2: matching ---


@pytest.mark.spec("N2")
@pytest.mark.parametrize(
    ("policy", "host", "port", "action", "rule"),
    [
        # A name matches itself only; a wildcard its subdomains only, at any depth.
        ({"allow": ["example.com"]}, "example.com", 443, "allow", 'allow "example.com"'),
        ({"allow": ["example.com"]}, "www.example.com", 443, "deny", "no rule allows it"),
        ({"allow": ["*.example.com"]}, "a.b.example.com", 443, "allow", 'allow "*.example.com"'),
        ({"allow": ["*.example.com"]}, "example.com", 443, "deny", "no rule allows it"),
        ({"allow": ["*.example.com"]}, "badexample.com", 443, "deny", "no rule allows it"),
        # One form of a name: case, the trailing dot, IDNA.
        ({"allow": ["example.com"]}, "EXAMPLE.Com.", 443, "allow", 'allow "example.com"'),
        ({"allow": ["bücher.de"]}, "xn--bcher-kva.de", 443, "allow", 'allow "xn--bcher-kva.de"'),
        # A port narrows a pattern; without one it holds for every port.
        ({"allow": ["example.com:443"]}, "example.com", 22, "deny", "no rule allows it"),
        ({"allow": ["example.com"]}, "example.com", 22, "allow", 'allow "example.com"'),
        # Deny wins over allow, whatever the order.
        (
            {"allow": ["*.github.com"], "deny": ["gist.github.com"]},
            "gist.github.com",
            443,
            "deny",
            'deny "gist.github.com"',
        ),
        (
            {"allow": ["*"], "deny": ["*.evil.test:25"]},
            "mx.evil.test",
            25,
            "deny",
            'deny "*.evil.test:25"',
        ),
        ({"allow": ["*"], "deny": ["*.evil.test:25"]}, "mx.evil.test", 443, "allow", 'allow "*"'),
        # Nothing names it: asked about with ask, refused without.
        ({"allow": [], "ask": True}, "new.test", 443, "ask", "no rule names it"),
        ({"allow": []}, "new.test", 443, "deny", "no rule allows it"),
        # Not a name at all.
        ({"allow": ["*"]}, "bad name!", 443, "deny", "not a host name"),
    ],
)
def test_N2_names_and_ports_are_matched_deny_wins(
    policy: dict[str, Any], host: str, port: int, action: str, rule: str
) -> None:
    assert judged(policy, host, port) == (Action(action), rule)


@pytest.mark.spec("N2")
@pytest.mark.parametrize(
    "host",
    # 127.0.0.1 as a resolver reads it: every form is an address, never a name that
    # '*' or a wildcard could let through.
    [
        "127.0.0.1",
        "127.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "2130706433",
        "017700000001",
        "[::1]",
        "::1",
    ],
)
def test_N2_an_ip_address_in_any_form_is_refused_unless_a_rule_names_it(host: str) -> None:
    assert ip_literal(host) is not None
    assert judged({"allow": ["*", "*.0.1"], "ask": True}, host) == (
        Action.DENY,
        "an IP address that no rule names",
    )


@pytest.mark.spec("N2")
def test_N2_a_rule_naming_an_address_matches_it_in_every_spelling() -> None:
    policy = {"allow": ["10.0.0.5", "[2001:db8::1]:8443"]}
    assert judged(policy, "10.0.0.5")[0] is Action.ALLOW
    assert judged(policy, "0x0a000005")[0] is Action.ALLOW  # the same address
    assert judged(policy, "[2001:db8:0::1]", 8443)[0] is Action.ALLOW
    assert judged(policy, "2001:db8::1", 443)[0] is Action.DENY  # another port


# --- the call token (N3, N7) ---


@pytest.mark.spec("N3")
def test_N3_the_proxy_variables_name_the_call_and_cannot_be_made_up() -> None:
    key = bytes(range(16))
    env = proxy_environment(key.hex(), "call 1/ü")
    for name in ("http_proxy", "HTTPS_PROXY", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        assert name in env
    user = token_user("call 1/ü")
    assert env["http_proxy"].startswith(f"http://{user}:") and user.isascii()
    assert ":" not in user and "%" not in user  # nothing to quote, no colon (RFC 7617)
    assert env["all_proxy"].startswith("socks5h://") and env["all_proxy"].endswith("127.0.0.1:1080")
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1"
    assert env["GIT_HTTP_PROXY_AUTHMETHOD"] == "basic"
    # The proxy reads the call back; another call's id with this mac, or a mac made
    # with another key, names no call.
    assert call_of(key, user, call_mac(key, "call 1/ü")) == "call 1/ü"
    assert call_of(key, token_user("call 2"), call_mac(key, "call 1/ü")) == ""
    assert call_of(key, user, call_mac(b"other key", "call 1/ü")) == ""
    assert call_of(key, "", "") == "" and call_of(key, "t!!", call_mac(key, "x")) == ""
    # A call id too long for a token travels without one.
    assert "@" not in proxy_environment(key.hex(), "x" * 200)["http_proxy"]


# --- network_resolve (N10) ---


@pytest.mark.spec("N10")
@pytest.mark.parametrize(
    ("name", "target", "pinned"),
    [
        ("Mirror.Test.", "10.1.2.3", ("mirror.test", ("10.1.2.3", None))),
        ("mirror.test", "127.0.0.1:8080", ("mirror.test", ("127.0.0.1", 8080))),
        ("mirror.test", "[::1]:8443", ("mirror.test", ("::1", 8443))),
        ("mirror.test", "::1", ("mirror.test", ("::1", None))),
    ],
)
def test_N10_a_pin_is_a_name_and_an_address(name: str, target: str, pinned: Any) -> None:
    assert parse_pin(name, target) == pinned
    assert parse_pin(pinned[0], pin_text(pinned[1])) == pinned  # as the proxy gets it


@pytest.mark.spec("N10")
@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("mirror.test", "mirror.example"),
        ("mirror.test", "1.2.3.4:0"),
        ("bad name", "1.2.3.4"),
        ("mirror.test", 1234),
    ],
)
def test_N10_a_bad_pin_is_refused(name: str, target: Any) -> None:
    with pytest.raises((PinError, PolicyError)):
        parse_pin(name, target)


# --- fail closed (N3) ---


@pytest.mark.spec("N3")
async def test_N3_without_the_daemons_pool_a_policy_sessions_command_is_refused(
    workspace: Path,
) -> None:
    # In-process there is no namespace and no proxy to carry a policy out: the
    # command is refused, never run with the network the process has.
    coordinator = Coordinator([bash, fetch])
    try:
        session = coordinator.open_session(workspace, network={"allow": ["pypi.org"]})
        results = await coordinator.run_turn(
            session,
            [
                ToolCall("c1", "bash", {"command": "echo ran > ran.txt"}),
                ToolCall("c2", "fetch", {"url": "http://pypi.org/"}),
            ],
        )
    finally:
        coordinator.close()
    assert [r.error_code for r in results] == [ErrorCode.SANDBOX_FAILED] * 2
    assert all("network is a policy" in r.text for r in results)
    assert not (workspace / "ran.txt").exists()


@pytest.mark.spec("N3")
def test_N3_a_daemon_not_run_as_root_refuses_a_policy_namespace_saying_so() -> None:
    # The namespaces are made in the daemon's own user namespace: an unprivileged
    # process cannot, and says why rather than run a command with another network.
    drop = "os.setgroups([]); os.setgid(65534); os.setuid(65534)" if os.geteuid() == 0 else ""
    script = (
        "import os\nfrom toolpool.sandbox.netns import NetnsError, SessionNetwork\n"
        f"{drop}\n"  # after the imports: nobody may not read the interpreter's home
        "try:\n    SessionNetwork.make((3128,))\nexcept NetnsError as exc:\n    print(exc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert "a network policy needs a daemon run as root" in done.stdout
