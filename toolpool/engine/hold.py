"""A switch that keeps turns from starting calls (SPEC L5).

The daemon turns a client's hold on when that client stops reading what it is sent
(its window of unacknowledged bytes is full): the client's turns start no new calls
(running calls go on) until the hold is off again. One hold is shared by every turn
of one client.
"""

from __future__ import annotations

from collections.abc import Callable


class Hold:
    def __init__(self) -> None:
        self._on = False
        self._waiting: list[Callable[[], None]] = []

    @property
    def on(self) -> bool:
        return self._on

    def set(self, on: bool) -> None:
        """Hold (True) or release (False); a release calls back the turns that wait."""
        if on == self._on:
            return
        self._on = on
        if not on:
            for release in list(self._waiting):
                release()

    def watch(self, release: Callable[[], None]) -> Callable[[], None]:
        """Call ``release()`` at every release, until the returned function is called."""
        self._waiting.append(release)

        def unwatch() -> None:
            if release in self._waiting:
                self._waiting.remove(release)

        return unwatch

    def __repr__(self) -> str:
        return f"<Hold {'on' if self._on else 'off'}>"
