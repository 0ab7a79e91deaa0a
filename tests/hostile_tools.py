"""Tools whose ``execute`` tries to get out, for the confinement tests (loaded by
module path into real workers: "tests.hostile_tools"). Each reports what it managed."""

from __future__ import annotations

import os

from toolpool import tool
from toolpool.tool import ToolContext


@tool
def reach_daemon(socket_path: str) -> str:
    """Try to speak to a daemon socket as a client would.

    Args:
        socket_path: The path of the daemon's socket.
    """
    from toolpool.client import Client, ClientError

    try:
        with Client(f"ipc://{socket_path}", connect_timeout=3.0, timeout=3.0) as client:
            status = client.status()
    except (ClientError, OSError) as exc:
        return f"refused: {type(exc).__name__}: {exc}"
    return f"answered: daemon pid {status['pid']}"


@tool(read_only=True)
def environment_value(name: str) -> str:
    """The value of an environment variable in the worker.

    Args:
        name: The variable's name.
    """
    return os.environ.get(name, "<unset>")


@tool
def join_pool(endpoint: str) -> str:
    """Connect to the workers' socket as a worker would, and say whether the pool
    let the connection through.

    Args:
        endpoint: The pool's ZeroMQ endpoint (ipc://…/workers.sock).
    """
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.ROUTING_ID, b"w999")
    monitor = socket.get_monitor_socket()
    try:
        socket.connect(endpoint)
        while monitor.poll(5000):
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "accepted"
            if event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                return "refused"
        return "no answer"
    finally:
        socket.disable_monitor()
        monitor.close()
        socket.close()
        context.term()


@tool
def kill_zygote() -> str:
    """SIGKILL this worker's parent, the zygote, and wait to die with it (the parent
    death signal comes a moment later)."""
    import signal
    import time

    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
    return "outlived the zygote"


@tool
def stop_zygote() -> str:
    """SIGSTOP this worker's parent, the zygote: it stops heartbeating and forking."""
    import signal

    os.kill(os.getppid(), signal.SIGSTOP)
    return "stopped the zygote"


@tool
def forge_result(shape: str, ctx: ToolContext) -> str:
    """Send the pool a Result of its own call that the coordinator cannot read — on
    the worker's own socket, ahead of the real one — then return normally.

    Args:
        shape: "empty" (no field of a result), "block" (a content block of no known
            type), "stamps" (a register entry, then one that is not a stamp).
    """
    import gc

    from toolpool.protocol import CallStatus, Result, encode
    from toolpool.worker.channel import Channel

    result: dict[str, object] = {"call_id": ctx.call_id, "tool_name": "forge_result"}
    stamps: dict[str, object] = {}
    if shape == "empty":
        result = {}
    elif shape == "block":
        result["content"] = [{"type": "hologram" * 100_000}]  # quoted by the error
    else:
        result["content"] = [{"type": "text", "text": "forged"}]
        # A readable entry, then one that is not: neither may be applied
        good = {"read_at": 1.0, "mtime_ns": 1, "size": 1, "content_hash": "0" * 16}
        stamps = {"/etc/hostname": good, "/etc/passwd": {"size": "huge"}}
    forged = encode(Result(ctx.call_id, CallStatus.OK, result, {}, stamps))  # type: ignore[arg-type]
    (channel,) = [o for o in gc.get_objects() if isinstance(o, Channel)]
    with channel._lock:
        channel._socket.send(forged)
    return "the real result"


@tool
def forge_frames(kind: str, ctx: ToolContext) -> str:
    """Send the pool frames a worker never sends, or sends only in another state, on
    the worker's own socket; then return normally.

    Args:
        kind: Which frames (see FORGED in tests/test_worker_answers.py).
    """
    import gc

    from toolpool.protocol import (
        CallContext,
        CallStatus,
        Execute,
        Heartbeat,
        Preview,
        Progress,
        Ready,
        Result,
        ShellAction,
        ShellRequest,
        Shutdown,
        Withdrawn,
        encode,
    )
    from toolpool.worker.channel import Channel

    mine = ctx.call_id
    frames: dict[str, list[bytes]] = {
        "garbage": [b"\xff\x00 not msgpack", b"\x93\x01\x02\x03", b""],
        "wrong way": [
            encode(Execute("x", "noop", {}, CallContext(workspace="/"), {})),
            encode(Shutdown("forged")),
        ],
        "ready again": [encode(Ready("w-nobody", 1)), encode(Ready("w-nobody", 1, failure="x"))],
        "heartbeats that lie": [
            encode(Heartbeat("w-someone-else", 1)),
            encode(Heartbeat("w-nobody", -5)),
        ],
        "withdrawn unknown": [encode(Withdrawn(2**40)), encode(Withdrawn(-1))],
        "another call's": [
            encode(Progress("not-mine", "hello")),
            encode(Preview("not-mine", "diff")),
            encode(Result("not-mine", CallStatus.OK, {"call_id": "not-mine"})),
        ],
        "shell nonsense": [
            encode(ShellRequest("not-mine", "r1", ShellAction.READ, shell_id="sh-1")),
            encode(ShellRequest(mine, "r2", ShellAction.READ, shell_id="../../etc")),
        ],
        "its own twice": [
            encode(Progress(mine, {"deep": [[[[[]]]]]})),
            encode(Preview(mine, "late preview")),
        ],
    }
    (channel,) = [o for o in gc.get_objects() if isinstance(o, Channel)]
    with channel._lock:
        for frame in frames[kind]:
            channel._socket.send(frame)
    return "the real result"


@tool(read_only=True)
def flood_progress(release: str, seen: str, ctx: ToolContext) -> str:
    """Write progress frames on the worker's own socket as fast as it takes them,
    past any coalescing in the worker, until the file ``release`` exists; once the
    file ``seen`` exists, write how many frames it had sent by then beside it
    (``seen``.count).

    Args:
        release: The path whose existence ends the flood.
        seen: The path another call creates.
    """
    import gc

    from toolpool.protocol import Progress, encode
    from toolpool.worker.channel import Channel

    frame = encode(Progress(ctx.call_id, "x"))
    (channel,) = [o for o in gc.get_objects() if isinstance(o, Channel)]
    sent, counted = 0, False
    while not os.path.exists(release):
        with channel._lock:  # let go between batches: the worker still heartbeats
            for _ in range(200):
                channel._socket.send(frame)
        sent += 200
        if not counted and os.path.exists(seen):
            with open(seen + ".count", "w") as f:
                f.write(str(sent))
            counted = True
    return f"sent {sent} frames"


@tool(read_only=True)
def unsendable_progress(kind: str, ctx: ToolContext) -> str:
    """Report progress that cannot cross the wire: "surrogate", a printed line that
    is no UTF-8 (a lone surrogate, as os.fsdecode makes of a bad name), or "object",
    a value msgpack has no form for.

    Args:
        kind: "surrogate" or "object".
    """
    print("fine so far")
    if kind == "surrogate":
        print("bad name: \udcff")
    else:
        ctx.report_progress(object())
    return "reported"


class PreviewBomb:
    """A tool whose validate and preview do what a tool's input can make them do:
    say where they run (``where``: the pid of each step, written under ``marks``),
    take their time (``sleep``: the preview says it started, then sleeps), grow
    (``allocate``: the preview holds that many bytes) or talk too much (``chars``:
    the preview's length)."""

    name = "preview_bomb"
    description = "A tool whose validate and preview cost what they are asked to."
    schema: dict[str, object] = {
        "type": "object",
        "properties": {
            "marks": {"type": "string"},
            "sleep": {"type": "number"},
            "allocate": {"type": "integer"},
            "chars": {"type": "integer"},
        },
        "required": ["marks"],
        "additionalProperties": False,
    }

    def _mark(self, args: dict[str, object], step: str) -> None:
        with open(f"{args['marks']}.{step}", "w") as f:
            f.write(str(os.getpid()))

    def validate(self, args: dict[str, object], ctx: object) -> object:
        from toolpool.tool import ValidationResult

        self._mark(args, "validate")
        return ValidationResult.passed()

    def preview(self, args: dict[str, object], ctx: object) -> str:
        import time

        self._mark(args, "preview")
        if args.get("sleep"):
            time.sleep(float(args["sleep"]))  # type: ignore[arg-type]
        if args.get("allocate"):
            held = bytearray(int(args["allocate"]))  # type: ignore[call-overload]
            held[::4096] = b"x" * len(held[::4096])  # touched: resident, not just reserved
        return "p\n" * (int(args.get("chars") or 2) // 2)  # type: ignore[call-overload]

    def execute(self, args: dict[str, object], ctx: ToolContext) -> str:
        self._mark(args, "execute")
        ctx.report_progress("executing")
        return "executed"


preview_bomb = PreviewBomb()
