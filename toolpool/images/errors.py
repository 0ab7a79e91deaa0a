"""Why an image was not prepared: one exception, a code that says which kind of why.

``code`` is ``image_refused`` (the path is not allowed: outside ``image_dirs``, a denied
path, images off), ``image_invalid`` (the image is broken or hostile: a digest that does
not match, a missing blob, an unknown media type, a member that escapes its layer) or
``limit_exceeded`` (a layer went past an unpack bound: bytes, entries, CPU, memory).
"""

from __future__ import annotations

from typing import Literal

from toolpool.errors import ToolpoolError

ImageErrorCode = Literal["image_refused", "image_invalid", "limit_exceeded"]


class ImageError(ToolpoolError):
    """An image that cannot be prepared, and why (``code``, ``message``)."""

    def __init__(self, message: str, *, code: ImageErrorCode = "image_invalid") -> None:
        super().__init__(f"{code}: {message}")
        self.message = message
        self.code: ImageErrorCode = code
