"""Running one call inside a worker: context, limits, cancellation, clean-up, usage.

The tool runs in the worker's main thread, so that a signal reaches it: SIGTERM
(cancel, SPEC D4) raises ``Cancelled`` in a plain function, or cancels the task of
an ``async`` one — a tool that ignores SIGTERM is killed with its worker after the
grace period; SIGXCPU (the per-call CPU allowance is spent) raises
``LimitExceeded``. Whatever the tool started is ended after the call, orphans that
called setsid included (the worker is their subreaper).

Where the worker can read its cgroups, a watcher thread counts each call over every
process in them (SPEC X7): when the call's CPU allowance is spent, or the pids limit
refused a fork, it kills the call's processes (every member but the worker), and
SIGXCPU interrupts the tool if its own code spends the CPU or it does not return;
an OOM kill during the call is seen in the memory cgroup's counter. Such a call's
result is ``limit_exceeded``, naming the limit and its value.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import inspect
import os
import resource
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

import msgpack

from toolpool.cancel import Cancelled, CancelSource, CancelToken
from toolpool.egress.environment import proxy_environment, worker_token
from toolpool.file_reads import RecordingRegister
from toolpool.models import ErrorCode, Stage, ToolCall, ToolResult
from toolpool.outcomes import result_from_exception, result_from_output
from toolpool.preflight import capped, failed_as, not_a_verdict, refusal
from toolpool.protocol import (
    CallContext,
    CallStatus,
    Execute,
    Preview,
    Progress,
    Result,
    encode,
)
from toolpool.registry import ToolRegistry, ToolSpec
from toolpool.sandbox import linux
from toolpool.sandbox.cgroups import CallAccounting
from toolpool.sandbox.command import sandbox_retries
from toolpool.sandbox.limits import CallLimits, Limits, named
from toolpool.sandbox.terminate import ProcessTree, terminate
from toolpool.tool import ToolContext, ValidationResult
from toolpool.worker.call_context import CallPlaces, tool_context
from toolpool.worker.channel import Channel
from toolpool.worker.memory import PeakMemory
from toolpool.worker.output import LimitExceeded, PrintedOutput
from toolpool.worker.shells import WorkerShells
from toolpool.worker.watch import CallWatch, stopped_by_limit

if TYPE_CHECKING:
    import asyncio


def _cancel_errors() -> tuple[type[BaseException], ...]:
    """What a cancelled call raises: ``Cancelled``, and asyncio's ``CancelledError``
    once asyncio is loaded (an async tool's, or a tool's own loop's). Evaluated as the
    exception is matched, so that a worker that runs no async tool never imports
    asyncio (some 8 MB of every worker's memory)."""
    loaded = sys.modules.get("asyncio")
    return (Cancelled, loaded.CancelledError) if loaded is not None else (Cancelled,)


# How long what a call left running gets between SIGTERM and SIGKILL.
SWEEP_GRACE = 0.5

# A validate's or a preview's answer that is never awaitable (``Runner._now``).
_PLAIN_ANSWERS = (ValidationResult, str)

# signal.getsignal without its conversion to the Handlers enum, which for a Python
# handler raises and catches a ValueError whose message holds the handler's repr:
# 5 µs a call, for each signal, against 0.1 µs. _signal is the C module that signal
# wraps (it has no stub); where it lacks getsignal, the wrapper does the job slower.
_getsignal: Callable[[int], object] = getattr(
    importlib.import_module("_signal"), "getsignal", signal.getsignal
)


@dataclass(slots=True)
class _Running:
    ticket: int
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Future[Any] | None = None


class Runner:
    """Runs the calls a worker receives, one at a time, in the main thread."""

    def __init__(
        self,
        registry: ToolRegistry,
        channel: Channel,
        *,
        limit_address_space: bool,
        cgroup_procs: Sequence[str] = (),
    ) -> None:
        self.registry = registry
        self.channel = channel
        self.limits = CallLimits(limit_address_space=limit_address_space)
        self._parsed: tuple[dict[str, Any], Limits] | None = None  # the last limits seen
        self._places: tuple[CallContext, CallPlaces] | None = None  # the last context's paths
        self._running: _Running | None = None
        self._early_cancel: int | None = None  # a cancel signal raised before the tool ran
        self._call_limits = Limits()
        self._proxied = ""  # the policy session whose proxy variables are set (N11)
        self._loop: asyncio.AbstractEventLoop | None = None  # made for the first async tool
        self._pid = os.getpid()
        self._memory = PeakMemory()
        self._children_cpu: float | None = None  # see _cpu_seconds
        # A result's size, as the wire will carry it, when its frame is past the output
        # limit. One packer, reused: msgpack.packb makes a packer and its buffer per
        # call (4 µs for a small result, 2 reused).
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        self._watch = CallWatch(CallAccounting(cgroup_procs) if cgroup_procs else None)
        self._shells = WorkerShells(channel)  # the calls' ToolContext.shells
        # Bound once: the handlers installed are these objects, so a look at the
        # installed ones is an identity test.
        self._cancel_handler = self._on_cancel
        self._cpu_handler = self._on_cpu_limit

    def _cpu_seconds(self, me: resource.struct_rusage) -> float:
        """CPU time of the worker (``me``, its own rusage) and of its reaped children,
        at a call's end. The children's part is kept for the next call's start: only
        a call reaps children (its tool, or the sweep after it), so between two calls
        it does not move, and reading it again would cost a call a system call."""
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        children = self._children_cpu = kids.ru_utime + kids.ru_stime
        return me.ru_utime + me.ru_stime + children

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
        self._memory.close()
        self._watch.close()
        self.limits.close()

    # -- signals -------------------------------------------------------------------

    def arm(self) -> None:
        """Install the cancel and CPU-limit handlers: at the start, and checked before
        every call (a tool may have replaced them in the last one)."""
        if _getsignal(signal.SIGTERM) is not self._cancel_handler:
            signal.signal(signal.SIGTERM, self._cancel_handler)
        if _getsignal(signal.SIGXCPU) is not self._cpu_handler:
            signal.signal(signal.SIGXCPU, self._cpu_handler)

    def _limits(self, raw: dict[str, Any]) -> Limits:
        """Parsed limits; calls of a session mostly carry the same ones."""
        if self._parsed is None or self._parsed[0] != raw:
            self._parsed = (raw, Limits.from_dict(raw))
        return self._parsed[1]

    def _places_of(self, context: CallContext) -> CallPlaces:
        """The context's paths as ``Path``s; calls of a session carry the same ones
        (most often the very same object: ``decode`` keeps the last one it read)."""
        places = self._places
        if places is not None and (places[0] is context or places[0] == context):
            return places[1]
        made = CallPlaces.of(context)
        self._places = (context, made)
        return made

    def _on_cancel(self, signum: int, frame: FrameType | None) -> None:
        running = self._running
        target = self.channel.take_cancel_target()
        if running is None:
            # Idle; or the call it is for has ended, or is about to start its tool
            # (``run`` looks at this before it does).
            self._early_cancel = target
            return
        if target is not None and target != running.ticket:
            return  # raised for a call that has ended since: never another's
        if running.loop is not None and running.task is not None:
            running.loop.call_soon_threadsafe(running.task.cancel)
            return
        raise Cancelled(CancelSource.ABORT)

    def _on_cpu_limit(self, signum: int, frame: FrameType | None) -> None:
        if self._running is not None:
            cpu = named(self._call_limits, "cpu_seconds")
            raise LimitExceeded(f"used up its CPU time limit ({cpu})")

    # -- one call ------------------------------------------------------------------

    def run(self, message: Execute) -> Result:
        """Run one call; its ``Result``."""
        return self.answer(message)[0]

    def answer(self, message: Execute) -> tuple[Result, bytes]:
        """Run one call; its ``Result`` and the frame that carries it, the result
        within the call's output limit (or the error that says it was not)."""
        result = self._run(message)
        frame = encode(result)
        limit = self._call_limits.output_bytes
        if len(frame) <= limit:
            # The frame holds the tool's result and a little more: only a frame past
            # the limit has the result itself measured (a second packing of it).
            return result, frame
        size = len(self._packer.pack(result.result))
        if size <= limit:
            return result, frame
        call = ToolCall(message.call_id, message.tool, message.arguments)
        refused = ToolResult.error(
            call,
            ErrorCode.LIMIT_EXCEEDED,
            f"The result is {size} bytes, more than the output limit of "
            f"{limit} bytes. Ask for less (a narrower query, an offset).",
        )
        result = dataclasses.replace(result, status=CallStatus.ERROR, result=refused.to_dict())
        return result, encode(result)

    def _run(self, message: Execute) -> Result:
        call = ToolCall(message.call_id, message.tool, message.arguments)
        spec = self.registry.get(message.tool)
        limits = self._limits(message.limits)
        files = RecordingRegister(message.stamps)
        token = CancelToken()
        context = message.context
        if context.egress and self._proxied != context.egress:
            # A policy session's own worker (N11): its tools use its proxy. The token
            # names the worker, not the call (libraries keep the proxy they first
            # read): the pool knows which call the worker runs.
            os.environ.update(
                proxy_environment(context.egress, worker_token(self.channel.worker_id))
            )
            self._proxied = context.egress
        self._shells.begin(call.id, (context.session_id, context.allow_network))
        ctx = tool_context(
            message.context,
            call,
            files,
            token,
            lambda data: self.channel.send(Progress(call.id, data)),
            limits,
            self._places_of(message.context),
            self._shells,
        )
        started = time.monotonic()
        self._memory.reset()
        me = resource.getrusage(resource.RUSAGE_SELF)  # after the reset: see PeakMemory
        children, self._children_cpu = self._children_cpu, None
        if children is None:  # the first call, or the last one's end was not reached
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            children = kids.ru_utime + kids.ru_stime
        cpu_before = me.ru_utime + me.ru_stime + children
        retries_before = sandbox_retries()  # starts the call's tool retries (SPEC X12)
        self._memory.started(me)
        printed = PrintedOutput(ctx.progress, limits.output_bytes)
        stdout, stderr = sys.stdout, sys.stderr
        status = CallStatus.OK
        stopped: tuple[str, int] | None = None
        self._call_limits = limits
        try:
            if spec is None:
                raise LookupError(f'tool "{call.name}" is not loaded in this worker')
            self.limits.apply(limits, me.ru_utime + me.ru_stime)
            self.arm()
            self._watch.begin(limits)
            sys.stdout = sys.stderr = printed
            self._running = _Running(message.ticket)
            if self._early_cancel == message.ticket:
                raise Cancelled(CancelSource.ABORT)
            # P6, P7 (a tool with neither passes them: nothing to run).
            preflight = message.stage is not Stage.EXECUTE and spec.has_preflight
            refused = self._preflight(spec, call, ctx) if preflight else None
            if refused is not None:
                result = refused
            elif message.stage is Stage.PREPARE:
                status = CallStatus.PREPARED
                result = ToolResult(call.id, call.name, ())
            elif spec.is_async:
                result = result_from_output(call, self._now(spec.execute_fn(call.arguments, ctx)))
            else:
                result = result_from_output(call, spec.execute_fn(call.arguments, ctx))
            self._running = None
            printed.flush()
        except _cancel_errors():
            self._running = None
            token.cancel(CancelSource.ABORT)  # the tool's own threads look at it
            status = CallStatus.CANCELLED
            result = ToolResult.error(call, ErrorCode.CANCELLED, "Tool execution cancelled.")
        except LimitExceeded as exc:
            self._running = None
            status = CallStatus.ERROR
            result = ToolResult.error(call, ErrorCode.LIMIT_EXCEEDED, f"The tool {exc}.")
        except MemoryError:
            self._running = None
            status = CallStatus.ERROR
            result = ToolResult.error(
                call,
                ErrorCode.LIMIT_EXCEEDED,
                f"The tool ran out of memory ({named(limits, 'memory_bytes')}).",
            )
        except OSError as exc:
            self._running = None
            status = CallStatus.ERROR
            result = result_from_exception(call, exc)
            if exc.errno == errno.EFBIG:
                size = limits.file_size_bytes
                text = f"The tool wrote past the file size limit ({size} bytes)."
                result = ToolResult.error(call, ErrorCode.LIMIT_EXCEEDED, text)
        except BaseException as exc:  # the tool's failure is a result, whatever it raised
            self._running = None
            status = CallStatus.ERROR
            result = result_from_exception(call, exc)
        finally:
            self._running = None
            if os.getpid() != self._pid:
                os._exit(0)  # a process the tool forked must not go on as a worker
            stopped = self._watch.end()
            sys.stdout, sys.stderr = stdout, stderr
            swept = self._sweep()
            if swept or stopped is not None:
                # The counters moved, or processes of the call ended after they were
                # read: the next call reads them anew (CallWatch).
                self._watch.rebase()
        if stopped is not None and result.error_code is not ErrorCode.LIMIT_EXCEEDED:
            result = stopped_by_limit(call, result, limits, *stopped)
        if status in (CallStatus.OK, CallStatus.PREPARED) and result.is_error:
            status = CallStatus.ERROR  # a limit met while it prepared, too
        if self._shells.details:  # a background shell started, read or ended: which
            details = {**result.details, **self._shells.details}
            result = dataclasses.replace(result, details=details)
        me = resource.getrusage(resource.RUSAGE_SELF)
        usage: dict[str, Any] = {
            "wall_seconds": round(time.monotonic() - started, 6),
            "cpu_seconds": round(self._cpu_seconds(me) - cpu_before, 6),
            "peak_rss_bytes": self._memory.read(me),
        }
        # What the limit watcher killed and what the sweep ended: both were the call's.
        ended = swept + (stopped[1] if stopped is not None else 0)
        if ended:
            usage["ended_processes"] = ended
        if retried := sandbox_retries() - retries_before:
            usage["sandbox_retries"] = retried
        stamps = files.changes_dict() if files.changes else {}  # most calls record none
        return Result(call.id, status, result.to_dict(), usage, stamps)

    def _preflight(self, spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> ToolResult | None:
        """P6 and P7 here, under the call's limits (SPEC L10): the refusal or the failed
        preview that ends the call, or None — the preview, cut at its cap, sent ahead
        of the call's execution. A limit met on the way is the call's limit."""
        try:
            verdict = self._now(spec.validate_now(call.arguments, ctx))
            if not isinstance(verdict, ValidationResult):
                raise not_a_verdict(verdict)
        except MemoryError:
            raise
        except Exception as exc:
            return failed_as(call, exc, ErrorCode.VALIDATION_FAILED)
        refused = refusal(call, verdict)
        if refused is not None:
            return refused
        try:
            preview = self._now(spec.preview_now(call.arguments, ctx))
        except MemoryError:
            raise
        except Exception as exc:
            return failed_as(call, exc, ErrorCode.PREVIEW_FAILED)
        if preview is not None:
            data, truncated = capped(preview)
            self.channel.send(Preview(call.id, data, truncated))
        return None

    def _now(self, value: Any) -> Any:
        """``value``, or what it resolves to when it is awaitable (an async tool's)."""
        # What a plain validate or preview answers, known without inspect.isawaitable,
        # whose look at the Awaitable ABC costs a call more than the rest of ``_now``.
        if value is None or type(value) in _PLAIN_ANSWERS:
            return value
        if not inspect.isawaitable(value):
            return value
        if inspect.iscoroutine(value):
            return self._run_async(value)
        return self._run_async(_awaited(value))

    def _run_async(self, work: Any) -> Any:
        if self._loop is None:
            import asyncio

            self._loop = asyncio.new_event_loop()
        task = self._loop.create_task(work)
        assert self._running is not None
        self._running.loop, self._running.task = self._loop, task
        return self._loop.run_until_complete(task)

    def _sweep(self) -> int:
        """End every process the call left behind (SPEC D4); count them."""
        if not linux.has_children():
            return 0  # the common case, in one system call instead of a /proc walk
        report = terminate(ProcessTree(os.getpid(), include_root=False), grace=SWEEP_GRACE)
        linux.reap_children()
        return len(report.pids)


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value
