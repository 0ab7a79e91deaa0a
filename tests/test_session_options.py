"""Session options: one list, one check, in the client, the in-process coordinator and
the daemon alike (SPEC E6) — tried with the values an attacker's client, or a typo,
sends: a string where a list of roots goes, a limit that is none, a negative one, a
timeout that is no number, a table that is no table."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from toolpool import Client, ToolCall, ToolEnd, ToolStart
from toolpool.client import RequestFailed
from toolpool.client.connection import Connection
from toolpool.engine import Coordinator
from toolpool.protocol import PROTOCOL_VERSION, Hello, OpenSession, decode, encode
from toolpool.session_options import DAEMON_OPTIONS, SessionOptionError, SessionOptions

from .daemon_support import Daemon, shared_daemon
from .support import Work, work_call

# What the attacker sent, and the message every checker answers with.
BAD: list[tuple[dict[str, Any], str]] = [
    ({"approval_timeout": "x"}, "approval_timeout = 'x': expected a number more than 0"),
    ({"approval_timeout": float("inf")}, "approval_timeout = inf: expected a finite number"),
    ({"extra_roots": "abc"}, "extra_roots = 'abc': expected a list of paths"),
    ({"extra_roots": ["/a", 3]}, "extra_roots = ['/a', 3]: expected a list of paths"),
    ({"limits": {"bogus": 5}}, "limits = {'bogus': 5}: 'bogus' is not a limit (known:"),
    ({"limits": {"wall_seconds": -1}}, "wall_seconds = -1: expected a number more than 0"),
    ({"limits": {"memory_bytes": 1.5}}, "memory_bytes = 1.5: expected an integer more than 0"),
    ({"limits": {"processes": 2**22 + 1}}, "processes = 4194305: expected an integer of at most"),
    ({"limits": {"memory_bytes": 2**63}}, "memory_bytes = 9223372036854775808: expected an"),
    ({"limits": {"network": "yes"}}, "network = 'yes': expected true or false"),
    ({"limits": "lots"}, "limits = 'lots': expected a table of limits"),
    ({"allow_network": "true"}, "allow_network = 'true': expected true or false"),
    ({"max_tool_errors": True}, "max_tool_errors = True: expected an integer of 0 or more"),
    ({"max_tool_concurrency": -2}, "max_tool_concurrency = -2: expected an integer"),
    ({"turn_output_chars": "many"}, "turn_output_chars = 'many': expected an integer"),
    ({"gate": "sometimes"}, "gate = 'sometimes': expected one of 'allow', 'ask', 'policy'"),
    ({"on_error": "stop"}, "on_error = 'stop': expected one of 'continue', 'cancel_siblings'"),
    ({"tool_profile": "cursor"}, "tool_profile = 'cursor': expected one of 'toolpool'"),
    ({"policy": "allow all"}, "policy = 'allow all': expected a list of rules"),
    ({"policy": [{"action": "maybe"}]}, "policy rule 0: a policy rule needs an action"),
    ({"extra_roots": "x" * 10_000}, "extra_roots = 'xxxx"),
    ({"colour": "blue"}, "unknown session option 'colour' (known: extra_roots, allow_network"),
]


@pytest.mark.spec("E6")
@pytest.mark.parametrize(("options", "message"), BAD)
def test_E6_a_bad_option_is_refused_naming_it_and_its_value(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(SessionOptionError) as refused:
        SessionOptions.parse(options)
    text = str(refused.value)
    assert message in text
    assert text.startswith(("session option ", "unknown session option "))
    assert "\n" not in text and len(text) < 500  # one line, whatever was sent


@pytest.mark.spec("E6")
def test_E6_options_are_a_table() -> None:
    with pytest.raises(SessionOptionError, match="session options must be a table, not"):
        SessionOptions.parse(["gate", "ask"])  # type: ignore[arg-type]


_ROOTS = st.lists(st.text(min_size=1, max_size=8), max_size=3)
_OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "extra_roots": _ROOTS,
        "allow_network": st.booleans(),
        "max_tool_errors": st.integers(0, 10),
        "limits": st.fixed_dictionaries(
            {}, optional={"wall_seconds": st.floats(0.5, 600), "processes": st.integers(1, 64)}
        ),
        "gate": st.sampled_from(["allow", "ask", "policy"]),
        "policy": st.lists(
            st.fixed_dictionaries(
                {"action": st.sampled_from(["allow", "ask", "deny"])},
                optional={"tool": st.text(max_size=5), "read_only": st.booleans()},
            ),
            max_size=3,
        ),
        "approval_timeout": st.floats(0.1, 1000),
        "max_tool_concurrency": st.integers(0, 32),
        "turn_output_chars": st.integers(0, 10**6),
        "on_error": st.sampled_from(["continue", "cancel_siblings"]),
        "tool_profile": st.sampled_from(["toolpool", "claude-code", "codex"]),
    },
)


@pytest.mark.spec("E6")
@given(_OPTIONS)
def test_E6_what_the_wire_carries_reads_back_to_the_same_options(options: dict[str, Any]) -> None:
    parsed = SessionOptions.parse(options)
    assert SessionOptions.parse(parsed.to_wire()) == parsed


# --- the one list, as users read it ----------------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "sessions.md"


@pytest.mark.spec("E6")
def test_E6_the_docs_table_lists_every_option_in_order_with_its_default() -> None:
    # Given the table users read, and the one list it must follow
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \|", DOCS.read_text(), flags=re.MULTILINE)
    fields = [f.name for f in dataclasses.fields(SessionOptions)]
    # Then it has every option, in the list's order, and no other
    assert [name for name, _ in rows] == fields
    # and each default as the wire carries it ("—": the daemon's setting applies)
    defaults = SessionOptions().to_wire(also=fields)
    for name, shown in rows:
        expected = "—" if defaults[name] is None else f"`{json.dumps(defaults[name])}`"
        assert shown == expected, name


DAEMONS = {"gate": "ask", "policy": [{"action": "deny", "tool": "bash"}], "approval_timeout": 5}


@pytest.mark.spec("E6")
def test_E6_the_options_a_daemon_carries_out_are_marked_once() -> None:
    assert set(DAEMONS) == DAEMON_OPTIONS
    # What the engine's session takes: the rest as given, a daemon's at their defaults
    given = SessionOptions.parse({**DAEMONS, "shell": "persistent", "limits": {"processes": 9}})
    assert given.for_engine() == SessionOptions.parse(
        {"shell": "persistent", "limits": {"processes": 9}}
    )
    assert SessionOptions().for_engine() == SessionOptions()


# --- the in-process coordinator ---------------------------------------------------------


@pytest.mark.spec("E6")
def test_E6_the_coordinator_checks_what_it_is_given(workspace: Path) -> None:
    coordinator = Coordinator([Work()])
    try:
        with pytest.raises(SessionOptionError, match="'bogus' is not a limit"):
            coordinator.open_session(workspace, limits={"bogus": 5, "wall_seconds": -1})
        with pytest.raises(SessionOptionError, match="wall_seconds = -1"):
            coordinator.open_session(workspace, limits={"wall_seconds": -1})
        for name, value in DAEMONS.items():  # each a daemon's, refused in-process
            with pytest.raises(SessionOptionError, match=f"session option {name} = .*a daemon's"):
                coordinator.open_session(workspace, **{name: value})
        assert coordinator.sessions == {}  # nothing opened on the way
    finally:
        coordinator.close()


@pytest.mark.spec("E6", "S3")
async def test_E6_a_sessions_concurrency_is_its_own_in_process_too(workspace: Path) -> None:
    coordinator = Coordinator([Work()], max_tool_concurrency=10)
    try:
        serial = coordinator.open_session(workspace, max_tool_concurrency=1)
        seen: list[Any] = []
        calls = [work_call("a", 30), work_call("b", 30)]
        await coordinator.run_turn(serial, calls, on_event=seen.append)
    finally:
        coordinator.close()
    # Two safe calls, one after the other: b starts once a has ended
    order = [(type(e).__name__, e.call_id) for e in seen if isinstance(e, ToolStart | ToolEnd)]
    assert order == [("ToolStart", "a"), ("ToolEnd", "a"), ("ToolStart", "b"), ("ToolEnd", "b")]


# --- the client, and the daemon that trusts no client ----------------------------------------


@pytest.mark.spec("E6")
@pytest.mark.parametrize(("options", "message"), BAD[:6])
def test_E6_the_client_refuses_before_it_sends(options: dict[str, Any], message: str) -> None:
    connection = Connection("ipc:///nowhere", timeout=7.0)
    connection.start()
    try:
        with pytest.raises(RequestFailed) as refused:
            connection.open_session("/ws", options, None)
        assert refused.value.code == "bad_request"
        assert message in refused.value.message
        assert connection.take_outgoing() == []  # nothing left for the daemon
    finally:
        connection.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with shared_daemon(tmp_path_factory.mktemp("options")) as daemon:
        yield daemon


@pytest.mark.spec("E6")
def test_E6_the_daemon_checks_for_itself_with_the_same_words(
    daemon: Daemon, workspace: Path
) -> None:
    # A client that skips the library's check: raw frames on the daemon's socket
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 10_000)
    socket.connect(str(daemon.endpoint()["ipc"]))
    try:
        socket.send(encode(Hello("h", PROTOCOL_VERSION, "raw")))
        decode(socket.recv())
        for n, (options, message) in enumerate(BAD):
            socket.send(encode(OpenSession(f"o{n}", str(workspace), options)))
            reply = decode(socket.recv())
            assert reply.code == "bad_request", (options, reply)  # type: ignore[union-attr]
            assert message in reply.message, (options, reply)  # type: ignore[union-attr]
    finally:
        socket.close()
        context.term()
    # And no session was opened by any of them; the daemon serves on
    with Client(runtime_dir=daemon.runtime, timeout=30) as client:
        assert client.status()["session_tables"]["sessions"] == 0
        with client.session(workspace, extra_roots=[str(workspace)]) as session:
            (listing,) = session.submit([ToolCall("l", "ls", {})]).results()
    assert not listing.is_error
