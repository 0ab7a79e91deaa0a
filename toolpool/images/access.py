"""Which image paths a session may name: under ``image_dirs``, clear of denied paths.

An image is refused when ``image_dirs`` is empty (images are off), when its real path
(every symlink resolved) lies outside every image dir, and when it is, holds or lies
inside a denied path (``deny_read``, the daemon's runtime dir). The checks compare real
paths, so a symlink in ``image_dirs`` that points elsewhere names what it points to.
``check_open`` repeats them on the path an opened fd really has, so a path swapped
between the check and the open is caught too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from toolpool.images.errors import ImageError
from toolpool.sandbox.policy import is_under


def admit(image: Path, allowed_dirs: Sequence[Path], denied: Sequence[Path]) -> Path:
    """The image's real path, or ImageError(``image_refused``) saying why not."""
    if not image.is_absolute():
        raise ImageError(f"the image path {str(image)!r} is not absolute", code="image_refused")
    if not allowed_dirs:
        raise ImageError("images are off: image_dirs is empty", code="image_refused")
    real = Path(os.path.realpath(image))
    _check(image, real, allowed_dirs, denied)
    return real


def check_open(image: Path, fd: int, allowed_dirs: Sequence[Path], denied: Sequence[Path]) -> None:
    """Refuse when what ``fd`` has open does not pass the same checks (a swapped path)."""
    really = Path(os.readlink(f"/proc/self/fd/{fd}"))
    _check(image, really, allowed_dirs, denied)


def _check(image: Path, real: Path, allowed_dirs: Sequence[Path], denied: Sequence[Path]) -> None:
    shown = str(image) if str(real) == str(image) else f"{image} (really {real})"
    if not any(is_under(str(real), os.path.realpath(d)) for d in allowed_dirs):
        dirs = ", ".join(str(d) for d in allowed_dirs)
        raise ImageError(f"{shown} lies outside image_dirs ({dirs})", code="image_refused")
    for path in denied:
        hidden = os.path.realpath(path)
        if is_under(str(real), hidden):
            raise ImageError(
                f"{shown} is or lies inside {path}, which is denied", code="image_refused"
            )
        if is_under(hidden, str(real)):
            raise ImageError(f"{shown} holds {path}, which is denied", code="image_refused")
