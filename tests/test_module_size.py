"""Every module under toolpool/ stays small: 450 lines or fewer (a module past a few
hundred lines holds two ideas; split it along its seam)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450


def _lines() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted((ROOT / "toolpool").rglob("*.py"))
    }


def test_every_module_is_at_most_450_lines() -> None:
    over = {name: count for name, count in _lines().items() if count > MAX_LINES}
    assert over == {}, f"split these along their seams (at most {MAX_LINES} lines): {over}"
