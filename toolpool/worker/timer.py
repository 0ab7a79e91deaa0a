"""A one-shot timer that a thread can wait on beside its sockets: a Linux timerfd.

The worker holds a finished call's result for the next one's (``Channel.end_call``)
at most ``result_hold`` seconds, and the I/O thread must send it if the call after it
runs longer. Waking that thread to tell it a hold began cost the worker more than the
messages saved (measured: ~30 µs of the I/O thread's CPU a frame of eight no-op calls,
its wake-up and its take of the GIL while the main thread runs the next calls). A
timerfd armed by the main thread wakes nobody unless it expires — only when the next
call does outlast the hold — and arming or disarming it is one system call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


_libc = ctypes.CDLL(None, use_errno=True)
_create = _libc.timerfd_create
# Without argtypes (each converts its argument on every call) or errno handling: its
# arguments are small ints, byref()s and None, which ctypes passes as they are; with
# a valid descriptor and structure, timerfd_settime cannot fail.
_settime = ctypes.CDLL(None).timerfd_settime


class OneShotTimer:
    """A timer of a fixed delay: ``arm`` starts it (again), ``disarm`` stops it; its
    ``fileno`` becomes readable when it expires, until ``clear``."""

    def __init__(self, delay: float) -> None:
        fd: int = _create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self._fd = fd
        whole = int(delay)
        # At least a nanosecond: an all-zero value disarms instead.
        value = _Timespec(whole, max(1, int((delay - whole) * 1e9)))
        # Built once: each arm or disarm passes the same two structures.
        self._armed = ctypes.byref(_Itimerspec(_Timespec(0, 0), value))
        self._disarmed = ctypes.byref(_Itimerspec(_Timespec(0, 0), _Timespec(0, 0)))

    def fileno(self) -> int:
        return self._fd

    def arm(self) -> None:
        _settime(self._fd, 0, self._armed, None)

    def disarm(self) -> None:
        _settime(self._fd, 0, self._disarmed, None)

    def clear(self) -> None:
        """Take the expiry that made the timer readable (none: nothing)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)

    def close(self) -> None:
        os.close(self._fd)
