"""A worker process: set up its confinement, connect, then run calls until told to
stop or until its parent (the zygote, and so the coordinator) dies."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.cancel import Cancelled
from toolpool.models import ErrorCode, ToolCall, ToolResult
from toolpool.protocol import CallStatus, Execute, Result, Shutdown, encode
from toolpool.registry import ToolRegistry
from toolpool.sandbox import linux, seccomp
from toolpool.sandbox.limits import Limits, apply_process_limits
from toolpool.sandbox.policy import Policy, set_active_policy
from toolpool.sandbox.profile import SandboxProfile, set_active_profile
from toolpool.worker import session_tools
from toolpool.worker.channel import RESULT_HOLD, Channel
from toolpool.worker.runner import Runner

log = logging.getLogger("toolpool.worker")

_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a worker is told when it is spawned."""

    worker_id: str
    endpoint: str
    heartbeat_interval: float = 0.5
    limits: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    cgroup_procs: tuple[str, ...] = ()
    offline: bool = False  # unshare the network namespace
    netns: str = ""  # or enter this one: a policy session's (SPEC N11)
    netns_inode: int = 0
    limit_address_space: bool = True  # no memory cgroup: RLIMIT_AS bounds each call
    # A worker bound to a session's shipped tools (SPEC A6): the session it serves
    # alone, and the pickle of its tools, loaded once the worker is confined.
    bound_session: str = ""
    session_tools: bytes = b""
    # How long a finished call's result may wait for the next one's, while a call waits.
    result_hold: float = RESULT_HOLD

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerConfig:
        values = dict(data)
        values["cgroup_procs"] = tuple(values.get("cgroup_procs", ()))
        return cls(**values)


def _unshare_network() -> None:
    if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")


def _enter_network(path: str, inode: int) -> None:
    """Into a policy session's namespace, where only its proxy listens (N11): the one
    of that ``inode``, not whatever the path names by now (its fd was reused)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino != inode:
            raise OSError(f"{path} is no longer the session's network namespace")
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path}, CLONE_NEWNET)")
    finally:
        os.close(fd)


def confine(config: WorkerConfig) -> SandboxProfile:
    """Apply the worker's own confinement, strongest first; return the profile."""
    profile = SandboxProfile.from_dict(config.profile)
    set_active_profile(profile)
    set_active_policy(Policy.from_dict(config.policy) if config.policy else Policy.default())
    for procs in config.cgroup_procs:
        Path(procs).write_text(str(os.getpid()))
    if config.netns:
        _enter_network(config.netns, config.netns_inode)
    elif config.offline:
        _unshare_network()
    apply_process_limits(Limits.from_dict(config.limits))
    if profile.active("seccomp"):
        seccomp.load_in_this_process("bound" if config.netns else "worker")
    return profile


def serve(config: WorkerConfig, registry: ToolRegistry) -> int:
    """The worker's life after fork: returns its exit status."""
    linux.die_with_parent(signal.SIGKILL)
    linux.become_subreaper()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the coordinator
    confine(config)
    failure = ""
    if config.session_tools:  # the client's code, loaded confined (SPEC A6)
        try:
            registry = session_tools.load(registry, config.session_tools)
        except session_tools.LoadFailure as exc:
            log.error("worker %s: its session's tools did not load", config.worker_id, exc_info=exc)
            failure = str(exc)
    channel = Channel(
        config.endpoint, config.worker_id, config.heartbeat_interval, config.result_hold
    )
    if failure:
        return _refuse_every_call(channel, failure)
    runner = Runner(
        registry,
        channel,
        limit_address_space=config.limit_address_space,
        cgroup_procs=config.cgroup_procs,
    )
    runner.arm()  # idle, SIGTERM does nothing: it only cancels calls
    channel.start()
    # After a call that was cancelled, met a limit or left processes, the pool retires
    # the worker: a call it sent ahead meanwhile goes back, to run on a fresh one.
    unfit = False
    try:
        while True:
            message = channel.receive()
            if isinstance(message, Shutdown):
                return 0
            if not isinstance(message, Execute):
                log.error("worker %s ignored a %s message", config.worker_id, message.type)
                continue
            if unfit:
                channel.withdraw(message.ticket)
                continue
            if not channel.begin_call(message.ticket):
                continue  # a Cancel took it back before it started
            bound = config.bound_session
            if bound and message.context.session_id != bound:
                # The pool never sends one; a worker that holds a session's code takes
                # no other session's call, whatever comes.
                channel.end_call(message.ticket, encode(_not_ours(message, bound)))
                continue
            try:
                result, frame = runner.answer(message)
            except Cancelled:
                # The cancel signal landed between the tool's end and our bookkeeping.
                call = ToolCall(message.call_id, message.tool, message.arguments)
                cancelled = ToolResult.error(call, ErrorCode.CANCELLED, "Tool execution cancelled.")
                result = Result(message.call_id, CallStatus.CANCELLED, cancelled.to_dict())
                frame = encode(result)
            channel.end_call(message.ticket, frame)
            unfit = _leaves_unfit(result)
    finally:
        runner.close()
        channel.close()


def _refuse_every_call(channel: Channel, failure: str) -> int:
    """The session's tools did not load: say so (``Ready`` with the failure) and take
    no call until the pool's ``Shutdown``."""
    channel.start(failure)
    try:
        while True:
            message = channel.receive()
            if isinstance(message, Shutdown):
                return 0
            if isinstance(message, Execute):
                channel.withdraw(message.ticket)
    finally:
        channel.close()


def _not_ours(message: Execute, bound: str) -> Result:
    call = ToolCall(message.call_id, message.tool, message.arguments)
    refused = ToolResult.error(
        call,
        ErrorCode.EXECUTION_FAILED,
        f"This worker holds the tools of session {bound} and runs no other session's calls.",
    )
    return Result(message.call_id, CallStatus.ERROR, refused.to_dict())


def _leaves_unfit(result: Result) -> bool:
    """Whether the pool retires the worker after this call: the planner's
    ``retire_reason``, as far as the worker can tell."""
    return (
        result.status is CallStatus.CANCELLED
        or result.result.get("error_code") == ErrorCode.LIMIT_EXCEEDED.value
        or bool(result.usage.get("ended_processes"))
    )
