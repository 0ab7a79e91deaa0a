"""The daemon's logs: one JSON object per line, with the ids a reader filters on.

    log.info("call ended", extra={"turn": t, "call": c, "tool": name, "worker": w})

gives ``{"ts": "...", "level": "info", "logger": "...", "msg": "call ended",
"turn": "...", "call": "...", "tool": "...", "worker": "..."}``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The extra fields that become keys of their own.
FIELDS = ("session", "turn", "call", "tool", "worker", "client", "error", "ms")


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str = "info", path: Path | None = None) -> None:
    """Send toolpool's logs, as JSON lines, to ``path`` or stderr."""
    handler: logging.Handler = (
        logging.FileHandler(path, encoding="utf-8") if path else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(JsonLines())
    root = logging.getLogger("toolpool")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
