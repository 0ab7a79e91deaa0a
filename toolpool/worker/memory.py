"""A worker's peak resident memory per call (SPEC D2: ``details.usage.peak_rss_bytes``),
measured at the cost of a write and a read of /proc per call."""

from __future__ import annotations

import os
import resource


class PeakMemory:
    """The process's peak resident memory per call: VmHWM, the mm's high-water mark,
    reset before each call (clear_refs 5).

    VmHWM is the larger of that mark and the resident size now, and
    /proc/self/status, its only source, costs ~13 µs to produce; statm (the resident
    size) ~2 µs. The rusage the runner reads anyway has ``ru_maxrss``: the larger of
    the same mark (its resident part from the kernel's per-CPU estimate, not the
    exact sum) and the peak of the threads that have exited, which the reset leaves
    alone. So ``max(ru_maxrss, resident)`` at the call's end is VmHWM whenever that
    older peak is no higher than VmHWM — which holds when the resident size at the
    end is at least ``ru_maxrss`` just after the reset (that older peak is below
    the latter; VmHWM is above the former). Where the check fails (the worker
    shrank, or a thread exited at a higher peak than the worker has now), the call
    reads VmHWM from status, as every call once did. The /proc files stay open:
    reading one again from offset 0 is a fresh answer, without an open and a close
    per call.
    """

    def __init__(self) -> None:
        self._status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        self._page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
        try:
            self._clear: int | None = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            self._clear = None
        self._floor_kib: int | None = None  # ru_maxrss after the reset

    def reset(self) -> None:
        if self._clear is not None:
            try:
                os.pwrite(self._clear, b"5", 0)
            except OSError:
                self._clear = None

    def started(self, usage: resource.struct_rusage) -> None:
        """The call starts; ``usage`` is the worker's rusage, read after ``reset``."""
        # Without a reset VmHWM is the worker's whole life: status it is.
        self._floor_kib = usage.ru_maxrss if self._clear is not None else None

    def read(self, usage: resource.struct_rusage) -> int:
        """The call's peak in bytes; ``usage`` is the worker's rusage at its end."""
        if self._floor_kib is not None:
            resident_kib = int(os.pread(self._statm, 64, 0).split()[1]) * self._page_kib
            if resident_kib >= self._floor_kib:
                return max(usage.ru_maxrss, resident_kib) * 1024
        status = os.pread(self._status, 4096, 0)
        at = status.find(b"VmHWM:")
        return int(status[at + 6 : status.index(b"kB", at)]) * 1024 if at >= 0 else 0

    def close(self) -> None:
        os.close(self._status)
        os.close(self._statm)
        if self._clear is not None:
            os.close(self._clear)
