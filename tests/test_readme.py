"""The README's Python example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)[0]
    (tmp_path / "README.md").write_text("one two three four\n")
    done = subprocess.run(
        [sys.executable, "-c", example],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "1 False 4"
