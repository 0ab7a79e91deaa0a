"""Where the pool's workers come from and how they end: the sandbox profile, the
private runtime directory, the workers' socket (and who may connect to it), the
zygote that forks them (and the one that replaces it when it dies), their cgroups,
and their termination (``toolpool.sandbox.terminate``, the one place processes are
ended).

It knows nothing of calls or waiters: ``WorkerPool`` (``pool.py``) keeps the records
and decides, through the planner, what to start and retire.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import zmq

from toolpool.pool.peers import LOCAL_DOMAIN, PeerGuard
from toolpool.pool.workers import Kind, PoolConfig, PoolError, Worker, WorkerState
from toolpool.pool.zygote import Zygote, ZygoteError
from toolpool.protocol import MAX_FRAME_BYTES, Exited, Message, encode
from toolpool.sandbox import linux
from toolpool.sandbox.cgroups import CgroupTree, WorkerCgroup
from toolpool.sandbox.layers import remove_layers
from toolpool.sandbox.limits import CgroupLimits, Limits
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.terminate import (
    CgroupMembers,
    ProcessSet,
    ProcessTree,
    TerminationReport,
    Together,
    terminate,
)
from toolpool.worker.channel import CONTROL_SUFFIX
from toolpool.worker.main import WorkerConfig
from toolpool.zmqloop import LoopSocket

# sizeof(sockaddr_un.sun_path) on Linux, less its terminating NUL.
SOCKET_PATH_MAX = 107
# A worker's connections to the pool's socket: its calls' line and its control line.
CONNECTIONS_PER_WORKER = 2

log = logging.getLogger("toolpool.pool")


class WorkerProcesses:
    def __init__(
        self,
        config: PoolConfig,
        on_frames: Callable[[list[bytes]], None],
        on_exit: Callable[[Exited], None],
        on_zygote_death: Callable[[str], None],
    ) -> None:
        self.config = config
        self.profile = SandboxProfile.nothing()
        self.endpoint = ""
        self.policy = config.policy
        self.cgroups: CgroupTree | None = None
        self._on_frames = on_frames
        self._on_exit = on_exit
        self._on_zygote_death = on_zygote_death
        self._zygote: Zygote | None = None
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._router: LoopSocket | None = None
        self._guard: PeerGuard | None = None
        self._runtime_dir: Path | None = None
        self._owns_runtime_dir = False
        self._connected: dict[int, int] = {}  # worker pid → connections it made
        # Cgroups being made in a thread (``prepare``), by worker id; and the ids of
        # workers forgotten meanwhile, whose cgroup is removed as soon as it exists.
        self._making: dict[str, asyncio.Future[tuple[WorkerCgroup, int]]] = {}
        self._abandoned: set[str] = set()

    @property
    def runtime_dir(self) -> Path:
        """The pool's runtime directory (X2: no command sees it); once open."""
        assert self._runtime_dir is not None, "the pool is not open"
        return self._runtime_dir

    async def open(self) -> None:
        """Probe the sandbox, open the socket and start the zygote."""
        loop = asyncio.get_running_loop()
        self.profile = await loop.run_in_executor(
            None, SandboxProfile.probe, self.config.sandbox_disabled
        )
        if self.profile.active("cgroups"):
            self.cgroups = CgroupTree.probe()
        for line in self.profile.describe():
            log.info("sandbox: %s", line)
        if self.config.runtime_dir is None:
            self._runtime_dir = Path(tempfile.mkdtemp(prefix="toolpool-"))
            self._owns_runtime_dir = True
        else:
            self._runtime_dir = self.config.runtime_dir
            self._runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._runtime_dir, 0o700)
        self.endpoint = f"ipc://{self._runtime_dir}/workers.sock"
        socket_path = len(os.fsencode(self.endpoint.removeprefix("ipc://")))
        if socket_path > SOCKET_PATH_MAX:  # say so, rather than fail in bind with a traceback
            raise PoolError(
                f"the workers' socket {self.endpoint.removeprefix('ipc://')} is {socket_path} "
                f"bytes long, more than a Unix socket path may be ({SOCKET_PATH_MAX}): "
                "use a shorter runtime dir (--runtime-dir, or a shorter TMPDIR)"
            )
        # Workers and the commands they start never see the runtime dir (X2).
        self.policy = dataclasses.replace(
            self.config.policy, hidden=(*self.config.policy.hidden, str(self._runtime_dir))
        )
        self._context = zmq.Context()
        # Only a worker, and only with its two lines (calls and control), may
        # connect: a Python tool that opens another connection cannot pose as a
        # worker that has not yet connected and be handed other sessions' calls (X2).
        self._guard = PeerGuard(
            self._context, lambda pid: not self._admits(pid), "a process that is no new worker"
        )
        self._guard.start()
        router = self._context.socket(zmq.ROUTER)
        router.zap_domain = LOCAL_DOMAIN.encode()
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, 0)  # a send never blocks the loop
        router.bind(self.endpoint)
        self._router = LoopSocket(router, self._on_frames)
        self._zygote = self._new_zygote(replacement=False)
        await self._zygote.start()

    def _new_zygote(self, *, replacement: bool) -> Zygote:
        assert self._runtime_dir is not None
        return Zygote(
            self.config.tool_modules,
            self._runtime_dir,
            self._on_exit,
            self._on_zygote_death,
            heartbeat_interval=self.config.heartbeat_interval,
            env=self.policy.worker_environment(),
            append_log=replacement,
        )

    async def restart_zygote(self) -> None:
        """Start a new zygote in place of one that died, and wait for its first
        heartbeat; ZygoteError (with the end of its log) when it does not start."""
        if self._zygote is not None:
            await self._zygote.close()
        self._zygote = self._new_zygote(replacement=True)
        try:
            await self._zygote.start()
        except OSError as exc:
            raise ZygoteError(f"the zygote could not be started: {exc}") from exc
        try:
            await self._zygote.wait_started(self.config.spawn_timeout)
        except ZygoteError:
            await self.kill_zygote("it did not start")
            raise

    def zygote_silence(self) -> float | None:
        """Seconds since the running zygote last spoke; None before its first
        heartbeat, or when it is gone."""
        if self._zygote is None or not self.zygote_started:
            return None
        return time.monotonic() - self._zygote.last_seen

    @property
    def zygote_started(self) -> bool:
        """Whether the zygote sent its first heartbeat (its tool modules imported)."""
        started = None if self._zygote is None else self._zygote.started
        return started is not None and started.done() and started.exception() is None

    async def kill_zygote(self, reason: str) -> None:
        """SIGKILL the zygote and its workers (a stopped process cannot act on a
        SIGTERM); its reader reports the death, with ``reason``."""
        zygote = self._zygote
        if zygote is None or zygote.pid is None:
            return
        zygote.kill_reason = zygote.kill_reason or reason
        tree = ProcessTree(zygote.pid)
        await asyncio.get_running_loop().run_in_executor(None, lambda: terminate(tree, grace=0))

    async def close(self, workers: Iterable[Worker]) -> None:
        """Stop the zygote and the socket; remove the cgroups (``workers``' too) and
        the runtime directory. The workers must have ended."""
        # Cgroups still being made become their workers' (or are removed) first.
        await asyncio.gather(*self._making.values(), return_exceptions=True)
        if self._zygote is not None:
            await self._zygote.close()
        if self._router is not None:
            self._router.close()
            self._router = None
        if self._guard is not None:
            self._guard.stop()  # before the context ends: it holds a socket in it
            self._guard = None
        if self._context is not None:
            self._context.term()
        for worker in workers:
            if worker.cgroup is not None:
                worker.cgroup.remove()
        if self.cgroups is not None:
            self.cgroups.close()
        if self._owns_runtime_dir and self._runtime_dir is not None:
            try:  # never through a session's layer still mounted (V12)
                remove_layers(self._runtime_dir)
            except OSError as exc:
                log.error("the runtime dir stays: %s", exc)

    # -- one worker ---------------------------------------------------------------------

    def new_worker(self, worker_id: str, kind: Kind) -> Worker:
        """A worker's record; ``prepare`` makes its cgroup."""
        return Worker.of_kind(worker_id, kind, asyncio.get_running_loop().create_future())

    async def prepare(self, worker: Worker) -> WorkerConfig:
        """Make the worker's cgroup, with the pool's limits, and the configuration it
        starts with. The cgroup is made in a thread: its mkdir and limit writes take
        milliseconds of system calls, which every other call's events would wait for
        on the event loop (a cancelled call's ``tool_end`` waited for its worker's
        replacement). Raises OSError when the cgroup cannot be made."""
        if self.cgroups is not None:
            making = asyncio.get_running_loop().run_in_executor(None, self._make_cgroup, worker.id)
            self._making[worker.id] = making
            making.add_done_callback(lambda done: self._made(worker, done))
            await asyncio.shield(making)
        cgroup = worker.cgroup
        return WorkerConfig(
            worker_id=worker.id,
            endpoint=self.endpoint,
            heartbeat_interval=self.config.heartbeat_interval,
            limits=self.config.limits.to_dict(),
            profile=self.profile.to_dict(),
            policy=self.policy.to_dict(),
            cgroup_procs=tuple(str(p) for p in cgroup.procs_files()) if cgroup else (),
            offline=worker.offline,
            netns=worker.netns,
            netns_inode=worker.netns_inode,
            limit_address_space=cgroup is None or "memory" not in cgroup.controllers,
            **_bound(worker),
        )

    def _make_cgroup(self, worker_id: str) -> tuple[WorkerCgroup, int]:
        """In a thread: the cgroup with the pool's limits, and its OOM kills so far."""
        cgroup = self.new_cgroup(worker_id, self.config.limits)
        return cgroup, cgroup.oom_kills()

    def new_cgroup(self, name: str, limits: Limits) -> WorkerCgroup:
        """A cgroup under the pool's, for a worker or a background shell: ``limits``'
        ``CgroupLimits`` and the workers' CPU quota. Raises OSError when it cannot be
        made (nothing of it is left then)."""
        assert self.cgroups is not None
        cgroup = self.cgroups.create(name)
        try:
            CgroupLimits.of(limits).write(cgroup)
            cgroup.set_cpu(self.config.worker_cpus)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def _made(self, worker: Worker, done: asyncio.Future[tuple[WorkerCgroup, int]]) -> None:
        """On the loop: a cgroup made is the worker's, or removed when the worker was
        forgotten meanwhile (whoever waited for it may be gone: nothing is lost)."""
        self._making.pop(worker.id, None)
        if done.cancelled() or done.exception() is not None:
            self._abandoned.discard(worker.id)
            return  # prepare raises it, if anyone still waits
        cgroup, oom_kills = done.result()
        if worker.id in self._abandoned:
            self._abandoned.discard(worker.id)
            cgroup.remove()
            return
        worker.cgroup, worker.oom_baseline = cgroup, oom_kills
        worker.cgroup_limits = CgroupLimits.of(self.config.limits)

    async def spawn(self, worker: Worker, config: WorkerConfig) -> int:
        """Have the zygote fork the worker; its pid (ZygoteError when it cannot)."""
        assert self._zygote is not None
        return await self._zygote.spawn(worker.id, config.to_dict(), self.config.spawn_timeout)

    def apply_limits(self, worker: Worker, limits: Limits) -> str | None:
        """Write a call's cgroup limits to the worker's cgroup, unless it has them;
        why not, when the kernel refuses them (a v1 memory limit below what the
        worker already uses: no call with them can run there)."""
        wanted = CgroupLimits.of(limits)
        if worker.cgroup is None or worker.cgroup_limits == wanted:
            return None
        try:
            wanted.write(worker.cgroup)
        except OSError as exc:
            worker.cgroup_limits = None  # written in part, maybe: the next call writes all
            why = exc.strerror or str(exc)
            return f"its worker's cgroup refused the call's limits ({wanted}): {why}"
        worker.cgroup_limits = wanted
        return None

    def oom_killed(self, worker: Worker) -> bool:
        return worker.cgroup is not None and worker.cgroup.oom_kills() > worker.oom_baseline

    def exited(self, pid: int) -> None:
        """A worker's process is gone: its pid may come back as a new worker."""
        self._connected.pop(pid, None)

    def forget(self, worker: Worker) -> None:
        """End what is left in the worker's cgroup and remove it (once it is made,
        when it is being made)."""
        if worker.id in self._making:
            self._abandoned.add(worker.id)
        if worker.cgroup is not None:
            worker.cgroup.kill_all()
            worker.cgroup.remove()

    def send(self, worker: Worker, message: Message, *, control: bool = False) -> None:
        """Send ``message`` to the worker, on its control line when ``control``
        (``Cancel``: its I/O thread reads that one at once, even while a call runs)."""
        if self._router is None or worker.state is WorkerState.DEAD:
            return
        identity = worker.id + CONTROL_SUFFIX if control else worker.id
        try:
            self._router.send([identity.encode(), encode(message)])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: it has not connected, or has gone
            log.info("could not send %s to %s: %s", message.type.value, identity, exc)

    def send_parts(self, worker: Worker, parts: list[bytes]) -> None:
        """Send encoded messages to the worker's call line as one ZeroMQ message, a
        part each (a worker reads them in order)."""
        if self._router is None or worker.state is WorkerState.DEAD:
            return
        try:
            self._router.send([worker.id.encode(), *parts])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: it has not connected, or has gone
            log.info("could not send %d calls to %s: %s", len(parts), worker.id, exc)

    async def terminate(
        self, workers: Iterable[Worker], reason: str, *, grace: float = 0
    ) -> TerminationReport | None:
        """End the workers and everything in their cgroups or under them: SIGTERM,
        ``grace`` seconds, then SIGKILL (``grace=0``: SIGKILL at once)."""
        workers = list(workers)
        if not workers:
            return None
        targets: list[ProcessSet] = []
        for worker in workers:
            worker.kill_reason = worker.kill_reason or reason
            targets.append(ProcessTree(worker.pid))
            if worker.cgroup is not None:
                targets.append(CgroupMembers(worker.cgroup.procs_files()))
        report = await asyncio.get_running_loop().run_in_executor(
            None, lambda: terminate(Together(*targets), grace=grace)
        )
        for worker in workers:
            if worker.cgroup is not None:
                worker.cgroup.kill_all()
        return report

    # -- who is who ---------------------------------------------------------------------

    @property
    def zygote_pid(self) -> int | None:
        return None if self._zygote is None else self._zygote.pid

    def _admits(self, pid: int) -> bool:
        """Whether a connection from ``pid`` may speak to the workers' socket: a child
        of our zygote that has not yet made both its connections (called from the ZAP
        thread)."""
        made = self._connected.get(pid, 0)
        if made >= CONNECTIONS_PER_WORKER or self.zygote_pid is None:
            return False
        try:
            if psutil.Process(pid).ppid() != self.zygote_pid:
                return False
        except psutil.Error:
            return False
        self._connected[pid] = made + 1
        return True

    def confines(self, pid: int) -> bool:
        """Whether ``pid`` is one of the pool's confined processes: the zygote, a
        worker, or anything they started (X2). Safe to call from any thread."""
        zygote = self.zygote_pid
        ancestors = {zygote} if zygote else set()
        marker = None if self.cgroups is None else f"/{self.cgroups.parent}/"
        return linux.lineage_includes(pid, ancestors, marker)


def _bound(worker: Worker) -> dict[str, Any]:
    """What a worker bound to a session's shipped tools starts with: the session it
    serves alone, and the pickle it loads once confined (SPEC A6)."""
    binding = worker.binding
    if binding is None:
        return {}
    return {"session_tools": binding.payload, "bound_session": binding.session_id}
