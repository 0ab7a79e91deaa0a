"""Every requirement id of the SPEC sections built so far is proven by a marked test."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The sections whose every id must be cited by a test's spec(...) marker.
SECTIONS = ("T", "F", "P", "S", "M", "D")


def spec_path() -> Path:
    return Path(os.environ.get("TOOLPOOL_SPEC", ROOT.parent / "shared" / "SPEC.md"))


def test_every_spec_id_has_a_test() -> None:
    path = spec_path()
    assert path.is_file(), f"SPEC not found at {path}; set TOOLPOOL_SPEC"
    ids = set(re.findall(r"^- ([A-Z]\d+)\.", path.read_text(), flags=re.MULTILINE))
    wanted = {i for i in ids if i[0] in SECTIONS}
    assert len(wanted) >= 25, "the SPEC's id format changed; update this test"
    cited: set[str] = set()
    for test_file in (ROOT / "tests").glob("test_*.py"):
        for args in re.findall(r"spec\(([^)]*)\)", test_file.read_text()):
            cited.update(re.findall(r'"([A-Z]\d+)"', args))
    assert sorted(wanted - cited) == []
