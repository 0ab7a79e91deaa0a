"""Calls on workers: the queues of calls waiting for one, the frames that give calls
to workers (several to a frame where calls may be held: ``holding.py``, SPEC H4), and
each call's life on its worker until its one ``done`` — its result, its cancel, its
wall time and ``cancel_grace``, a withdrawal, its worker's death — all callbacks and
timers, without a task or a future per call (the states: ``calls.py``).

Stopping a call (cancel, wall time, grace, kill) is ``call_stops.py``'s (``stops``).
``Dispatch`` sends through the ``Supervisor`` and asks the pool that keeps the
workers (a ``Keeper``: ``WorkerPool``) whether a worker must retire after a call,
to retire it, and to start workers for calls that wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from toolpool.pool.call_stops import CallStops
from toolpool.pool.calls import answered, call_end, failed, lost, overran, unstarted
from toolpool.pool.holding import Rules, plan
from toolpool.pool.planner import CallEnd
from toolpool.pool.shells import ShellSupervisor
from toolpool.pool.supervisor import Supervisor
from toolpool.pool.workers import (
    Call,
    CallState,
    Escalation,
    Kind,
    OutcomeStatus,
    PoolConfig,
    PoolOutcome,
    Worker,
    WorkerState,
)
from toolpool.protocol import (
    Message,
    Preview,
    Progress,
    Result,
    ShellRequest,
    Shutdown,
    Withdrawn,
)

log = logging.getLogger("toolpool.pool")

_QUEUED, _HELD, _RUNNING = CallState.QUEUED, CallState.HELD, CallState.RUNNING
_STOPPING, _KILLING, _ENDED = CallState.STOPPING, CallState.KILLING, CallState.ENDED
_IDLE, _BUSY = WorkerState.IDLE, WorkerState.BUSY
_RETIRING, _DEAD = WorkerState.RETIRING, WorkerState.DEAD


class Keeper(Protocol):
    """What the dispatch asks of the pool that keeps the workers."""

    def retire_reason(self, worker: Worker, end: CallEnd) -> str | None:
        """Why ``worker`` must take no further call after one that ended so."""

    def retire(self, worker: Worker, reason: str) -> None:
        """Shut ``worker`` down once its calls are over, and replace it."""

    def grow(self, kind: Kind) -> None:
        """Start workers, if the pool may, for the calls of this kind that wait."""


class Dispatch:
    """The calls on the pool, waiting or given (see the module)."""

    def __init__(
        self, config: PoolConfig, supervisor: Supervisor, shells: ShellSupervisor, keeper: Keeper
    ) -> None:
        self.config = config
        self.supervisor = supervisor
        self.shells = shells
        self.keeper = keeper
        # Calls waiting for a worker, by kind (offline or not; a binding's: ``bind``),
        # first come first served.
        self.queues: dict[Kind, deque[Call]] = {False: deque(), True: deque()}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.open = False
        self.broken: str | None = None  # why no call can run any more
        self.calls_done = 0
        self.sandbox_retries = 0  # what the workers' results said (SPEC X12)
        self._flush_due = False
        self._background: set[asyncio.Future[Any]] = set()  # shell answers
        self.stops = CallStops(config, supervisor, self._ran)  # cancels, kills
        depth, max_calls = config.worker_calls_per_frame, config.max_calls_per_worker
        self._at_max = Rules(depth, max_calls, hold=config.hold_calls)
        self._below_max = Rules(depth, max_calls, hold=False)

    def add(self, call: Call) -> None:
        """A new call waits for a worker: it is given one at the end of this turn of
        the event loop, with the others that came in it."""
        call.untrack = call.token.on_cancel(call.cancelled)
        self.queues[call.kind].append(call)
        self._flush_soon()

    def waiting(self, kind: Kind) -> int:
        queue = self.queues.get(kind)
        return 0 if queue is None else len(queue)

    def waiting_kinds(self) -> dict[Kind, int]:
        """How many calls wait, by kind (the kinds some wait for)."""
        return {kind: len(queue) for kind, queue in self.queues.items() if queue}

    def bind(self, kinds: Sequence[Kind]) -> None:
        """Calls of these kinds (a binding's) may come: their queues."""
        for kind in kinds:
            self.queues.setdefault(kind, deque())

    def unbind(self, kinds: Sequence[Kind], why: str) -> None:
        """No call of these kinds comes any more: those waiting end (``why``), and
        their queues go."""
        for kind in kinds:
            self.fail_queued(why, kind)
            self.queues.pop(kind, None)

    def held(self) -> int:
        """Calls given a busy worker, behind its running one."""
        workers = self.supervisor.workers.values()
        return sum(1 for w in workers for call in w.given if call.state is _HELD)

    async def settle(self) -> None:
        """Wait for the kills and shell answers under way; then end every call still
        given a worker whose end was never heard (the pool closed)."""
        await asyncio.gather(*self._background, *self.stops.kills, return_exceptions=True)
        for worker in list(self.supervisor.workers.values()):
            calls, worker.given = list(worker.given), deque()
            for call in calls:
                self.end(call, PoolOutcome(OutcomeStatus.LOST, cause="the pool closed"))

    def cancel(self, call: Call) -> None:
        """Stop ``call`` (its token fired): queued, it ends at once; held, its worker
        is told (``Cancel`` by ticket: it withdraws it, or stops it if it began);
        running, the worker is told, and killed after ``cancel_grace``."""
        state = call.state
        if state is _QUEUED:
            self.queues[call.kind].remove(call)
            self.end(call, unstarted())
        elif state is _HELD:
            if not call.cancel_sent:
                self.stops.send_cancel(call)
        elif state is _RUNNING:
            self.stops.stop(call)

    # -- giving calls to workers (SPEC H4) ---------------------------------------------

    def _flush_soon(self) -> None:
        """Give the waiting calls to workers at the end of this turn of the loop: the
        calls that become ready together go together."""
        if not self._flush_due and self.loop is not None:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if not self.open:
            return
        workers = self.supervisor.workers.values()
        for kind, queue in self.queues.items():
            if not queue and not self._holding(kind):
                continue
            decided = plan(
                queue,
                workers,
                kind,
                max_workers=self.config.max_workers,
                at_max=self._at_max,
                below_max=self._below_max,
            )
            for worker, calls in decided.frames:
                self._give(worker, calls)
            if decided.frames:
                self.queues[kind] = deque(c for c in queue if c.state is _QUEUED)
            if decided.waiting:
                self.keeper.grow(kind)
            for call in decided.recalls:  # to run on a worker that has nothing to do
                call.recalled = True
                self.stops.send_cancel(call, running=False)

    def _give(self, worker: Worker, calls: list[Call]) -> None:
        """Send ``calls`` to ``worker`` in one frame: behind its calls, or the first
        runs at once (its wall time counts from now)."""
        given = worker.given
        if given:
            for call in given:
                call.behind = True
        else:
            refused = self.supervisor.processes.apply_limits(worker, calls[0].limits)
            if refused is not None:  # none of them can run there: they share those limits
                for call in calls:
                    self.end(call, failed(refused))
                self._flush_soon()  # the worker is still free for the calls behind them
                return
            worker.state = _BUSY
        last = len(calls) - 1
        for i, call in enumerate(calls):
            call.worker = worker
            call.behind = i < last
            if given:
                call.state = _HELD
            else:
                self._run(call)
            given.append(call)
        self.supervisor.send_calls(worker, [call.frame for call in calls])

    def _run(self, call: Call) -> None:
        """``call`` runs, as far as we know: its wall time counts from now."""
        assert self.loop is not None
        call.state = _RUNNING
        call.timer = self.loop.call_later(call.limits.wall_seconds, self.stops.past_wall_time, call)

    def _promote(self, worker: Worker) -> None:
        """The first of the worker's calls ended (or went): the next runs now."""
        if not worker.given or worker.state is _DEAD:
            return
        head = worker.given[0]
        if head.state is not _HELD:
            return
        if head.cancel_sent:  # a Cancel is on its way to it: it stops, or was withdrawn
            head.state = _RUNNING
            self.stops.stop(head)
        else:
            self._run(head)

    def _again(self, calls: list[Call]) -> None:
        """``calls`` never ran to their end where they were given: back in the queue,
        in the order they came (by ticket: before the calls that came after them), to
        run elsewhere — unless nobody wants them now."""
        for call in calls:
            call.worker = None
            call.behind = call.cancel_sent = call.recalled = call.past_wall_time = False
            if call.unwanted:
                self.end(call, unstarted())
            elif not self.open or self.broken is not None:
                self.end(call, failed(self.broken or "the pool is closed"))
            elif call.kind not in self.queues:  # its binding ended meanwhile
                self.end(call, failed("its session's tools were unbound (the session closed)"))
            else:
                call.state = _QUEUED
                queue = self.queues[call.kind]
                at = 0
                while at < len(queue) and queue[at].ticket < call.ticket:
                    at += 1
                queue.insert(at, call)
                self._flush_soon()

    # -- what workers say, and their ends ---------------------------------------------

    def worker_message(self, worker: Worker, message: Message) -> None:
        match message:
            case Result():
                call = self._from(worker, message.call_id)
                if call is None:
                    return
                binding = worker.binding
                if binding is not None and binding.egress:
                    # What the proxy said of the call, read while the worker's token
                    # still names it (N7).
                    self.shells.sandboxes.egress.drain()
                worker.given.popleft()
                retries = message.usage.get("sandbox_retries")
                if retries:
                    self.sandbox_retries += int(retries)
                stopping = call.state is _STOPPING or call.state is _KILLING
                outcome = answered(worker, message, Escalation.ANSWERED if stopping else None)
                if call.past_wall_time:
                    outcome = overran(outcome, call.limits)
                self._promote(worker)  # it started as this one ended
                self._ran(worker, call, outcome, stopping)
            case Progress():
                call = self._from(worker, message.call_id)
                if call is not None:
                    call.on_progress(message.data)
            case Preview():
                call = self._from(worker, message.call_id)
                if call is not None and call.on_preview is not None:
                    call.on_preview(message.data, message.truncated)
            case Withdrawn():
                call = next((c for c in worker.given if c.ticket == message.ticket), None)
                if call is not None:
                    self._given_back(worker, call)
            case ShellRequest():
                call = self._from(worker, message.call_id)
                if call is not None:
                    self._in_background(self._answer_shell(worker, call, message))
            case _:
                log.debug("ignored %s from %s", message.type.value, worker.id)

    def _from(self, worker: Worker, call_id: str) -> Call | None:
        """The call a message of the worker's is from: the first given it — the worker
        runs its calls in order, and its messages come in order. Or a later one (no
        two calls at a worker share an id), when the worker gave back those before it
        and their ``Withdrawn``, on its control line, has not come yet (a Result on
        its call line overtook it): those never started, and are given back now."""
        given = worker.given
        if not given:
            return None
        if given[0].call_id == call_id:
            return given[0]
        call = next((c for c in given if c.call_id == call_id), None)
        if call is None:
            log.debug("dropped a message of %s from %s: no such call", call_id, worker.id)
            return None
        while given[0] is not call:
            self._given_back(worker, given[0])
        return call

    def _given_back(self, worker: Worker, call: Call) -> None:
        """The worker gave a call back unstarted (a Cancel, a recall, or the call
        before it left the worker unfit)."""
        first = worker.given[0] is call
        worker.given.remove(call)
        if call.timer is not None:  # the pool took it to run: the call before had ended
            call.timer.cancel()
            call.timer = None
        if first:
            self._promote(worker)
        self._again([call])
        if not worker.given:
            self._free(worker)

    def worker_exited(self, worker: Worker) -> None:
        """Its calls end as lost — but those not known to have run to their end (held,
        or with a call held behind them) run again elsewhere, read-only as they are,
        at most ``HOLD_RETRIES`` times each (SPEC H4)."""
        calls, worker.given = list(worker.given), deque()
        again: list[Call] = []
        for i, call in enumerate(calls):
            if call.state is _KILLING:
                continue  # being killed: it ends when the kill is done
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
            ran = i == 0 and call.state is not _HELD
            outcome = lost(worker, call.limits)
            in_doubt = not ran or (outcome.status is OutcomeStatus.LOST and call.behind)
            if in_doubt and call.unwanted:
                # Cancelled: it need not run again, and may not be blamed for the crash.
                self.end(call, unstarted() if not ran else PoolOutcome(OutcomeStatus.CANCELLED))
            elif in_doubt and call.retries:
                call.retries -= 1
                call.suspect = True
                log.info("running %s again: its worker died, not known when", call.call_id)
                again.append(call)
            else:
                self._ran(worker, call, outcome, call.state is _STOPPING)
        self._again(again)

    def _ran(self, worker: Worker, call: Call, outcome: PoolOutcome, stopped: bool = True) -> None:
        """``call`` ran on ``worker`` and ended with ``outcome``: the worker is
        retired, or released, or keeps running the calls given it."""
        self.calls_done += 1
        worker.calls += 1
        if worker.state is _RETIRING:
            self.shut_down_when_free(worker)
        elif worker.state is not _DEAD:
            reason = self.keeper.retire_reason(worker, call_end(outcome, stopped))
            if reason is not None:
                self.keeper.retire(worker, reason)
            elif not worker.given:
                self.release(worker)
            elif self.queues.get(worker.kind):
                self._flush_soon()  # a place behind its running call is free
        self.end(call, outcome)

    def _free(self, worker: Worker) -> None:
        """No call is given ``worker`` any more (the last one went back unstarted)."""
        if worker.state is _RETIRING:
            self.shut_down_when_free(worker)
        else:
            self.release(worker)

    def release(self, worker: Worker) -> None:
        """The worker is free: it idles, and takes waiting calls at the end of this
        turn of the loop — or, with none waiting, calls held elsewhere."""
        if worker.state is _DEAD:
            return
        if worker.state is _RETIRING:  # retired before it was ready (its binding ended)
            self.shut_down_when_free(worker)
            return
        worker.state = _IDLE
        for queue in self.queues.values():
            if queue:
                self._flush_soon()
                return
        if self._holding(worker.kind):
            self._flush_soon()

    def _holding(self, kind: Kind) -> bool:
        """Whether a worker of this kind holds calls (a loop: this runs after most calls)."""
        for worker in self.supervisor.workers.values():
            if len(worker.given) > 1 and worker.kind == kind:
                return True
        return False

    def shut_down_when_free(self, worker: Worker) -> None:
        """Tell a retiring worker to shut down once no call is given it any more: not
        while a held call runs there, whose Result the exit could overtake (the
        zygote reports exits on another channel than the worker's frames)."""
        if worker.state is _RETIRING and not worker.given:
            self.supervisor.send(worker, Shutdown("retired"))

    def end(self, call: Call, outcome: PoolOutcome) -> None:
        """The call's one ``done``."""
        if call.state is _ENDED:
            return
        call.state = _ENDED
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.untrack is not None:
            call.untrack()
            call.untrack = None
        done, call.done = call.done, None
        if done is not None:
            try:
                done(outcome)
            except Exception:  # the caller's bug must not break the pool's records
                log.exception("the done callback of call %s raised", call.call_id)

    async def _answer_shell(self, worker: Worker, call: Call, request: ShellRequest) -> None:
        """A call's background shell request, for the session of that call."""
        reply = await self.shells.answer(request, call.context, call.limits)
        self.supervisor.send(worker, reply)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def fail_queued(self, why: str, kind: Kind | None = None) -> None:
        """End the calls waiting (for a worker of ``kind`` alone, when given)."""
        for each, queue in self.queues.items():
            if kind is not None and each != kind:
                continue
            while queue:
                self.end(queue.popleft(), failed(why))
