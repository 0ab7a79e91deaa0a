"""Who may ship tools with a session, and what the daemon and a bound worker let in
(SPEC A6): the daemon's checks, read as a hostile client would write its frame; a
TCP client against the default; a worker bound to one session handed another's
call; a payload that does not load."""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from toolpool import Client, RequestFailed, ToolCall
from toolpool.client.shipping import pack
from toolpool.daemon.records import BadRequest
from toolpool.daemon.shipped import WORKERS_PYTHON, SessionTools, admit
from toolpool.protocol import (
    MAX_SHIPPED_BYTES,
    MAX_SHIPPED_SCHEMA_BYTES,
    MAX_SHIPPED_TOOLS,
    Result,
    ShippedTools,
    Withdrawn,
)

from .daemon_support import running_daemon
from .direct_worker import DirectWorker


def _noop() -> str:
    """Nothing."""
    return "done"


def _shipped(**changes: Any) -> ShippedTools:
    """What a client sends for ``_noop``, with ``changes`` to its one definition."""
    packed = pack([_noop])
    return dataclasses.replace(packed, tools=(dataclasses.replace(packed.tools[0], **changes),))


def _refusal(shipped: ShippedTools, setting: SessionTools = SessionTools.LOCAL, **kw: Any) -> str:
    with pytest.raises(BadRequest) as refused:
        admit(shipped, setting, local=kw.get("local", True))
    assert refused.value.message.startswith("session tools refused: ")
    return refused.value.message


@pytest.mark.spec("A6")
def test_A6_the_daemon_admits_what_it_can_judge_and_nothing_else() -> None:
    # Given a well-formed tool: admitted as a spec whose answers are the client's values
    (spec,) = admit(_shipped(read_only=True, concurrency_safe=True), SessionTools.LOCAL, local=True)
    assert spec.steady_plan == (True, False) and spec.has_preflight is False
    # Then who ships, and the Python that pickled, are judged first
    assert "session_tools = 'off'" in _refusal(_shipped(), SessionTools.OFF)
    assert "over TCP" in _refusal(_shipped(), local=False)
    admit(_shipped(), SessionTools.ANY, local=False)  # the operator let TCP clients in
    other = dataclasses.replace(_shipped(), python="2.7")
    assert "'2.7'" in _refusal(other) and repr(WORKERS_PYTHON) in _refusal(other)
    # ... then each definition, as a tool module's would be (T1)
    assert "'no name'" in _refusal(_shipped(name="no name"))
    assert "JSON Schema" in _refusal(_shipped(schema={"type": "object", "properties": 3}))
    assert "interrupt_behavior" in _refusal(_shipped(interrupt_behavior="explode"))
    twice = _shipped()
    twice = dataclasses.replace(twice, tools=twice.tools * 2)
    assert "two tools are named '_noop'" in _refusal(twice)
    assert "empty" in _refusal(dataclasses.replace(_shipped(), tools=()))
    huge = dataclasses.replace(_shipped(), payload=b"x" * (MAX_SHIPPED_BYTES + 1))
    assert f"{MAX_SHIPPED_BYTES:,}" in _refusal(huge)
    # ... and no more work than a few compiled schemas, however large the frame (L10)
    many = _shipped()
    many = dataclasses.replace(many, tools=many.tools * (MAX_SHIPPED_TOOLS + 1))
    assert f"more than {MAX_SHIPPED_TOOLS}" in _refusal(many)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4000)}}
    assert f"more than {MAX_SHIPPED_SCHEMA_BYTES:,}" in _refusal(_shipped(schema=wide))
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"x": deep}}
    assert "schema cannot be read" in _refusal(_shipped(schema=deep))
    nested: dict[str, Any] = {"type": "object"}
    for _ in range(400):  # as deep as a frame can carry (msgpack packs 512 levels)
        nested = {"type": "object", "properties": {"x": nested}}
    assert "nested too deep" in _refusal(_shipped(schema=nested))


@pytest.mark.spec("A6")
def test_A6_the_daemons_own_activity_and_hooks_come_from_the_definition() -> None:
    (spec,) = admit(
        _shipped(activity="Doing {what}", validates=True, previews=True),
        SessionTools.LOCAL,
        local=True,
    )
    # A format string over the arguments; a hostile one answers nothing, never raises
    assert spec.activity({"what": "it"}) == "Doing it"
    assert spec.activity({}) is None
    # validate and preview are the worker's to run: the daemon knows only that they exist
    assert spec.has_validate and spec.has_preview


@pytest.mark.spec("A6")
def test_A6_a_tcp_client_ships_only_where_the_operator_says(
    tmp_path: Path, workspace: Path
) -> None:
    call = ToolCall("1", "_noop", {})
    for setting, admitted in (("local", False), ("any", True)):
        flags = ("--tcp", "127.0.0.1:0", "--session-tools", setting)
        with running_daemon(tmp_path, *flags) as daemon:  # one after the other
            endpoint = str(daemon.endpoint()["tcp"])
            with Client(endpoint) as client:
                if not admitted:
                    with pytest.raises(RequestFailed) as refused:
                        client.session(workspace, tools=[_noop])
                    assert refused.value.code == "bad_request"
                    assert "session_tools" in refused.value.message
                    assert client.status()["sessions"] == {}
                    continue
                with client.session(workspace, tools=[_noop]) as session:
                    (done,) = session.submit([call]).results()
                assert done.text == "done", done.text
            # The same daemon's Unix socket admits its own user
            with (
                Client(runtime_dir=daemon.runtime) as local,
                local.session(workspace, tools=[_noop]) as session,
            ):
                (done,) = session.submit([call]).results()
            assert done.text == "done", done.text


@pytest.mark.spec("A6")
def test_A6_a_bound_worker_refuses_another_sessions_call(tmp_path: Path, workspace: Path) -> None:
    def whose() -> int:
        """This worker's pid."""
        return os.getpid()

    # Given a worker bound to session "mine", with its tools loaded
    worker = DirectWorker(tmp_path, workspace, bound=("mine", pack([whose]).payload))
    try:
        # When a call of another session comes (the pool never sends one)
        worker.send(worker.execute("whose", {}, "c1", session="theirs"))
        (theirs,) = worker.receive()
        worker.send(worker.execute("whose", {}, "c2", session="mine"))
        (mine,) = worker.receive()
    finally:
        worker.close()
    # Then it runs only its own session's
    assert isinstance(theirs[0], Result) and isinstance(mine[0], Result)
    assert theirs[0].result["is_error"]
    assert "runs no other session's calls" in theirs[0].result["content"][0]["text"]
    assert not mine[0].result.get("is_error")
    assert mine[0].result["content"][0]["text"] != str(os.getpid())


@pytest.mark.spec("A6")
def test_A6_a_payload_that_does_not_load_is_said_and_no_call_runs(
    tmp_path: Path, workspace: Path
) -> None:
    # Given a worker bound to a session whose payload is no pickle
    bad = b"not a pickle " + uuid.uuid4().hex.encode()
    worker = DirectWorker(tmp_path, workspace, bound=("mine", bad))
    try:
        # Then its handshake says why, on both lines ...
        assert all("UnpicklingError" in ready.failure for ready in worker.ready), worker.ready
        # ... and a call given it all the same is handed back, never run
        worker.send(worker.execute("whose", {}, "c1", session="mine"))
        (answer,) = worker.receive()
    finally:
        worker.close()
    assert isinstance(answer[0], Withdrawn), answer
