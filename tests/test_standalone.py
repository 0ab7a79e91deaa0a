"""The repository stands alone: nothing in it refers to a path or a document outside
it (the spec it cites is docs/spec.md; links resolve inside the tree)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Names of things that live beside the repository, never in it.
OUTSIDE = re.compile(
    r"\.\./shared|shared/(SPEC|STYLE|seed|PERF)|\bSTYLE(\.md| habit)|PERF-NOTES|"
    r"\bthe seed\b|\bseed/\d|/work/(main|\.library)|\bissues? \d+\b",
    re.IGNORECASE,
)
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = [ROOT / name.decode() for name in listed if name]
    text = (".py", ".md", ".toml", ".cfg", ".txt", ".sh", "")
    return [
        f
        for f in files
        if f.is_file()
        and f.suffix in text
        and "bench/raw" not in str(f)
        and f.stat().st_size < 1 << 20
    ]


def test_nothing_refers_to_a_path_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    found = []
    for path in tracked_text_files():
        if path == this:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_every_relative_markdown_link_resolves_inside_the_repository() -> None:
    broken = []
    for path in tracked_text_files():
        if path.suffix != ".md":
            continue
        for target in MARKDOWN_LINK.findall(path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []
