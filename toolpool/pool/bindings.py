"""A pool's sessions' own workers (SPEC A5, A6, N11): each session's ``Binding`` —
its shipped tools, its network policy —, the queues its calls wait in, and its
workers' retirement when it ends. ``WorkerPool`` holds one (``pool.bindings``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from toolpool.pool.dispatch import Dispatch
from toolpool.pool.egress import SessionEgress
from toolpool.pool.workers import Binding, Kind, Worker, WorkerState


class SessionBindings:
    """The bindings of the pool's sessions, by session. ``retire(worker, why)``:
    the pool's, to retire a worker once its calls are over."""

    def __init__(
        self,
        dispatch: Dispatch,
        workers: Mapping[str, Worker],
        egress: SessionEgress,
        retire: Callable[[Worker, str], None],
    ) -> None:
        self._dispatch = dispatch
        self._workers = workers
        self._egress = egress
        self._retire = retire
        self._bindings: dict[str, Binding] = {}
        egress.ending.append(self._network_ended)
        egress.call_of_worker = self._call_of_worker

    def bind(self, session_id: str, payload: bytes = b"", *, egress: bool = False) -> Binding:
        """The pool's side of a session's own workers, which take no other session's
        call. ``payload``: its shipped tools' pickle, which goes, unread, to these
        workers, which load it once confined (the tools' calls name the binding:
        ``WorkerPool.submit(binding=…)``); ``egress``: the session's network is a
        policy, and its workers are forked into its network namespace (every call of
        the session's is theirs)."""
        binding = Binding(session_id, payload, egress)
        self._dispatch.bind([binding.kind(False), binding.kind(True)])
        self._bindings[session_id] = binding
        return binding

    def of_policy_session(self, session_id: str) -> Binding:
        """The binding of a policy session's calls: the one its session opened with,
        or one made at its first call (it ends with the session's network)."""
        binding = self._bindings.get(session_id)
        if binding is None or binding.ended:
            binding = self.bind(session_id, egress=True)
        return binding

    def netns_of(self, session_id: str) -> tuple[str, int]:
        """(In a thread.) Where a policy session's worker is forked: its network
        namespace's path and inode, made first if it is not yet. Raises
        SandboxStartError."""
        network = self._egress.network(session_id)
        return network.path, network.inode

    def workers(self, binding: Binding) -> list[int]:
        """The pids of the live workers of ``binding`` (``status``)."""
        return [
            w.pid
            for w in self._workers.values()
            if w.binding is binding and w.pid and w.state is not WorkerState.DEAD
        ]

    def unbind(self, binding: Binding) -> None:
        """The session closed: its workers retire (once their calls are over), and a
        call of its tools that still comes is refused."""
        if binding.ended:
            return
        binding.ended = True
        if self._bindings.get(binding.session_id) is binding:
            del self._bindings[binding.session_id]
        kinds: list[Kind] = list(binding.kinds.values())
        self._dispatch.unbind(kinds, "its session's tools were unbound (the session closed)")
        for worker in list(self._workers.values()):
            if worker.binding is binding:
                self._retire(worker, "its session closed")

    def _call_of_worker(self, worker_id: str) -> str:
        """The call a policy session's worker runs now ("" for none): what its proxy
        token names."""
        worker = self._workers.get(worker_id)
        if worker is None or worker.binding is None or not worker.given:
            return ""
        return worker.given[0].call_id

    def _network_ended(self, session_id: str) -> None:
        """A policy session's network ended (the session closed): its workers retire."""
        binding = self._bindings.get(session_id)
        if binding is not None and binding.egress:
            self.unbind(binding)

    def __repr__(self) -> str:
        return f"<SessionBindings [{len(self._bindings)} bound]>"
