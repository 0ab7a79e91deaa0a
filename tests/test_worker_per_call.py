"""What a worker does around every call, made cheap without changing what it reports:
peak memory, the cgroup counters a call starts from, the sweep's question, the
signal handlers, the idle wait that heartbeats (docs/workers.md, "A call's life in
a worker")."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolpool import ToolCall, tools_in_module
from toolpool.engine import Coordinator
from toolpool.models import ErrorCode
from toolpool.pool import PoolExecutor
from toolpool.sandbox import linux
from toolpool.sandbox.cgroups import CallAccounting
from toolpool.sandbox.limits import CallLimits, Limits
from toolpool.worker.lines import receive_timeout_ms
from toolpool.worker.memory import PeakMemory
from toolpool.worker.watch import CallWatch

from .support import EventLog, PoolFactory, pool_factory, until

MODULE = "tests.worker_tools"


def _status_kib(field: bytes) -> int:
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(field + b":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field!r} in /proc/self/status")


# --- peak memory ---------------------------------------------------------------------


def _grow(megabytes: int) -> None:
    blob = bytearray(megabytes << 20)
    blob[:: resource.getpagesize()] = b"x" * len(blob[:: resource.getpagesize()])
    del blob  # freed before the call ends: the peak must still show it


def _in_a_thread(work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()  # the thread has exited when the call ends

    return run


@pytest.mark.spec("D2")
@pytest.mark.parametrize(
    ("work", "grown_mib"),
    [
        (lambda: None, 0),
        (lambda: _grow(64), 64),
        (_in_a_thread(lambda: _grow(64)), 64),
    ],
    ids=["nothing", "grows and frees", "a thread grows, frees and exits"],
)
def test_D2_peak_memory_is_the_high_water_mark_of_the_call(
    work: Callable[[], None], grown_mib: int
) -> None:
    # Given a peak-memory reading reset at a call's start
    memory = PeakMemory()
    try:
        memory.reset()
        memory.started(resource.getrusage(resource.RUSAGE_SELF))
        resident_before = _status_kib(b"VmRSS") << 10
        # When the call does its work
        work()
        peak = memory.read(resource.getrusage(resource.RUSAGE_SELF))
        high_water = _status_kib(b"VmHWM") << 10
    finally:
        memory.close()
    # Then the peak is the kernel's high-water mark (read a moment later: the
    # interpreter may have grown a page or two since), and it saw what was freed
    assert high_water - (1 << 20) <= peak <= high_water
    assert peak >= resident_before + (grown_mib << 20) - (4 << 20)


@pytest.mark.spec("D2")
def test_D2_peak_memory_reads_status_when_the_rusage_cannot_tell() -> None:
    # Given a call whose start rusage claims an older peak far above the worker's
    # memory (as after a thread that exited at a higher peak)
    fields = [0] * resource.struct_rusage.n_fields
    fields[2] = 1 << 40  # ru_maxrss, KiB
    claimed = resource.struct_rusage(fields)
    memory = PeakMemory()
    try:
        memory.reset()
        memory.started(claimed)
        # When the call ends, with a rusage that could not be the peak either
        peak = memory.read(claimed)
    finally:
        memory.close()
    # Then the answer is VmHWM from /proc/self/status, not the rusage's figure
    assert peak < 1 << 40
    assert abs(peak - (_status_kib(b"VmHWM") << 10)) <= 1 << 20


# --- the cgroup counters a call starts from ------------------------------------------------


class FakeAccounting:
    """A worker's cgroup counters, set by the test; counts the reads of each."""

    active = True

    def __init__(self) -> None:
        self.cpu = 0.0
        self.oom = 0
        self.pids = 0
        self.reads: Counter[str] = Counter()

    def cpu_seconds(self) -> float:
        self.reads["cpu"] += 1
        return self.cpu

    def oom_kills(self) -> int:
        self.reads["oom"] += 1  # only begin and end read it (not the watcher's looks)
        return self.oom

    def pids_refusals(self) -> int:
        return self.pids

    def kill_others(self, own: int) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture
def watched() -> Iterator[tuple[CallWatch, FakeAccounting]]:
    accounting = FakeAccounting()
    watch = CallWatch(accounting)  # type: ignore[arg-type]
    yield watch, accounting
    watch.close()


@pytest.mark.spec("X7")
def test_X7_a_call_starts_from_the_counters_its_predecessor_ended_with(
    watched: tuple[CallWatch, FakeAccounting],
) -> None:
    watch, accounting = watched
    limits = Limits()
    # Given a first call, which reads the counters at its start and its end
    watch.begin(limits)
    assert watch.end() is None
    assert accounting.reads["oom"] == 2
    # When the next call starts and an OOM kill happens during it
    watch.begin(limits)
    accounting.oom = 1
    # Then its start read nothing more, and its end sees the kill as its own
    assert accounting.reads["oom"] == 2
    assert watch.end() == ("memory_bytes", 0)
    # And the call after it, started from that end, is not blamed for it
    watch.begin(limits)
    assert watch.end() is None


@pytest.mark.spec("X7")
def test_X7_counters_that_moved_after_a_call_are_read_anew_after_rebase(
    watched: tuple[CallWatch, FakeAccounting],
) -> None:
    watch, accounting = watched
    limits = Limits()
    watch.begin(limits)
    assert watch.end() is None
    # Given counters that moved after the call's end (what the sweep ended)
    accounting.oom, accounting.pids = 3, 2
    # When the runner rebases before the next call
    watch.rebase()
    watch.begin(limits)
    # Then that call starts from fresh reads, and is not blamed for either
    assert watch.end() is None


@pytest.mark.spec("X7")
def test_X7_a_call_whose_end_was_never_seen_leaves_fresh_reads_to_the_next(
    watched: tuple[CallWatch, FakeAccounting],
) -> None:
    watch, accounting = watched
    limits = Limits()
    watch.begin(limits)
    watch.end()
    watch.begin(limits)  # this call's end is never seen (a signal cut it short)
    accounting.oom = 1
    reads = accounting.reads["oom"]
    watch.begin(limits)
    assert accounting.reads["oom"] == reads + 1  # read afresh at the start
    assert watch.end() is None


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        (b"oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", b"oom_kill", 7),  # v1
        (b"low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\noom_group_kill 0\n", b"oom_kill", 2),  # v2
        (b"low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n", b"max", 4),
        (b"max 12", b"max", 12),  # no final newline
        (b"usage_usec 123456\nuser_usec 1\n", b"usage_usec", 123456),
        (b"oom_kill_disable 1\n", b"oom_kill", 0),  # a longer key is not the key
        (b"", b"max", 0),
        (b"max x\n", b"max", 0),
    ],
)
def test_keyed_cgroup_files_are_read_by_key(
    tmp_path: Path, text: bytes, key: bytes, value: int
) -> None:
    path = tmp_path / "keyed"
    path.write_bytes(text)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert CallAccounting._key(fd, key) == value
    finally:
        os.close(fd)


# --- the sweep's question, the address space, process groups -------------------------------


def test_D4_has_children_answers_for_running_and_exited_children() -> None:
    # In a fresh interpreter, which has no child of its own to begin with.
    script = textwrap.dedent(
        """
        import os, time
        from toolpool.sandbox import linux
        answers = [linux.has_children()]
        pid = os.fork()
        if pid == 0:
            time.sleep(0.2)
            os._exit(0)
        answers.append(linux.has_children())  # running
        time.sleep(0.5)
        answers.append(linux.has_children())  # exited, not reaped
        os.waitpid(pid, 0)
        answers.append(linux.has_children())  # reaped
        print(answers)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[False, True, True, False]"


@pytest.mark.spec("D3")
def test_D3_the_address_space_a_call_grows_from_is_the_process_size() -> None:
    limits = CallLimits(limit_address_space=True)
    try:
        size = limits._address_space()
        vm_size = _status_kib(b"VmSize") << 10
    finally:
        limits.close()
    assert abs(size - vm_size) <= 4 << 20  # the interpreter may map an arena between


def test_D4_process_group_members_are_every_process_of_the_group() -> None:
    # Given a shell in its own process group, with two children
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        parent = psutil.Process(shell.pid)
        for _ in range(200):
            if len(parent.children()) == 2:
                break
            psutil.wait_procs([], timeout=0.01)
        # When its members are listed
        members = set(linux.process_group_members(shell.pid))
        # Then they are the shell and its children, and nothing else
        assert members == {shell.pid, *(c.pid for c in parent.children())}
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


# --- in a worker ---------------------------------------------------------------------------


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    async with pool_factory(
        min_workers=1,
        max_workers=1,
        tool_modules=(MODULE,),
        heartbeat_interval=0.1,
        heartbeat_misses=300,
        cancel_grace=30,
    ) as make:
        yield make


@pytest.mark.spec("D4")
async def test_D4_a_call_after_one_that_replaced_the_cancel_handler_is_still_cancellable(
    make_pool: PoolFactory, workspace: Path
) -> None:
    pool = await make_pool()
    coordinator = Coordinator(tools_in_module(MODULE), executor=PoolExecutor(pool))
    session = coordinator.open_session(workspace)
    # Given a call that left SIGTERM ignored in its worker
    (first,) = await coordinator.run_turn(session, [ToolCall("a", "ignore_term", {"seconds": 0})])
    assert first.text == "ignored"
    # When the next call on the same worker is interrupted
    log = EventLog()
    turn = coordinator.submit(session, [ToolCall("b", "nap", {"seconds": 60})], on_event=log)
    await until(lambda: bool(log.starts()))
    await asyncio.sleep(0.3)  # let the worker get into the tool
    turn.interrupt()
    (second,) = await turn
    # Then the worker's handler answered it: it was armed again for that call
    assert second.error_code is ErrorCode.INTERRUPTED
    assert second.details["escalation"] == "answered"
    assert second.details["worker"] == first.details["worker"]


@pytest.mark.spec("D2")
@pytest.mark.spec("D2")
@given(st.floats(min_value=-1.0, max_value=3600.0, allow_nan=False))
def test_D2_the_idle_receive_never_waits_past_the_heartbeat(wait: float) -> None:
    # A worker waits for its next call in a receive whose timeout is set only when
    # it changes; whatever the time left to the next heartbeat, the timeout is no
    # longer (the millisecond a receive rounds up to aside), and at least 1 ms
    timeout = receive_timeout_ms(wait)
    assert 1 <= timeout <= max(0.0, wait) * 1000 + 1
    # and above a tenth of a second it changes only every tenth of a second
    if timeout > 100:
        assert timeout % 100 == 0
        assert timeout > max(0.0, wait) * 1000 - 100


@pytest.mark.spec("D2")
async def test_D2_an_idle_worker_keeps_heartbeating(
    make_pool: PoolFactory, workspace: Path
) -> None:
    # Given an idle pool whose worker should heartbeat every 0.05 s (silence is judged
    # only after the fixture's 300 misses: a busy machine's delay never kills it here)
    pool = await make_pool(heartbeat_interval=0.05)
    coordinator = Coordinator(tools_in_module(MODULE), executor=PoolExecutor(pool))
    try:
        (pid,) = pool.worker_pids().values()
        (worker,) = pool._workers.values()
        # When no call comes, its heartbeats still arrive: it is seen again and again
        # (a worker that only listened for calls would never be seen while idle)
        seen: set[float] = set()

        def heard_three_times() -> bool:
            seen.add(worker.last_seen)
            return len(seen) > 3

        await until(heard_three_times)
        # Then it is the same worker, and it serves the next call
        assert pool.worker_pids() == {"w1": pid}
        session = coordinator.open_session(workspace)
        (result,) = await coordinator.run_turn(session, [ToolCall("c", "noop", {})])
        assert result.text == "ok"
        assert result.details["worker"] == "w1"
    finally:
        coordinator.close()


@pytest.mark.spec("D2")
async def test_D2_a_call_counts_the_cpu_of_the_children_it_reaped_and_the_next_does_not(
    make_pool: PoolFactory, workspace: Path
) -> None:
    # Given a worker whose call runs a child that spins the CPU, then a no-op call
    pool = await make_pool()
    coordinator = Coordinator(tools_in_module(MODULE), executor=PoolExecutor(pool))
    session = coordinator.open_session(workspace)
    spin = ToolCall("a", "spin_children", {"seconds": 0.4, "rounds": 1})
    (spun,) = await coordinator.run_turn(session, [spin])
    (after,) = await coordinator.run_turn(session, [ToolCall("b", "noop", {})])
    # Then the child's CPU is the first call's (read at its end), not the next one's
    # (which starts from that read rather than reading the children's CPU again)
    assert spun.details["worker"] == after.details["worker"]
    assert spun.details["usage"]["cpu_seconds"] >= 0.4
    assert after.details["usage"]["cpu_seconds"] < 0.4
