"""Every requirement id of docs/spec.md is proven by a marked test."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "spec.md"


def spec_ids() -> set[str]:
    return set(re.findall(r"^- ([A-Z]\d+)\.", SPEC.read_text(), flags=re.MULTILINE))


def cited_ids() -> set[str]:
    cited: set[str] = set()
    for test_file in (ROOT / "tests").glob("test_*.py"):
        for args in re.findall(r"spec\(([^)]*)\)", test_file.read_text()):
            cited.update(re.findall(r'"([A-Z]\d+)"', args))
    return cited


def test_every_spec_id_has_a_test() -> None:
    ids = spec_ids()
    prefixes = {i[0] for i in ids}
    # Every section the spec has counts, the ones later work adds included.
    assert {"T", "F", "P", "S", "M", "D", "X"} <= prefixes, "the spec's id format changed"
    assert sorted(ids - cited_ids(), key=lambda i: (i[0], int(i[1:]))) == []


def test_tests_cite_only_ids_the_spec_has() -> None:
    assert sorted(cited_ids() - spec_ids()) == []
