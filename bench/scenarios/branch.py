"""Scenario: a session branches (SPEC B1–B4), through a daemon run as root, beside what
a user would otherwise do, in the same run.

For workspaces of 1k, 10k and 100k files of 16 bytes (1k and 5k in the quick bench),
100 to a directory, each in rounds interleaved in a random order:

- ``fork``: ``session.fork()`` of a session whose layers froze a small change — the
  client's round trip, the fork's layers made (its tmpfs, its overlay stacked on the
  parent's frozen layers, its register copied);
- ``checkpoint``: a turn whose command appends a line to a file, then the checkpoint
  its end made, as the daemon timed it (``Checkpoint.duration_ms``: the session's
  sandbox ended, the upper layer frozen, a new one mounted);
- ``rewind``: ``session.rewind()`` to the checkpoint before such a turn — the round
  trip, the sandbox ended, the layers put back;
- beside them: ``cp -a`` of the tree, ``git worktree add`` of a repository holding it
  (a fork's nearest peer), ``git stash`` of one changed file and ``git checkout -- .``
  (a rewind's).

``disk per fork``: what a fork's tmpfs holds after it wrote one small file, beside the
tree's size. And 32 forks of one prepared session (10k files, 2k in the quick bench,
and a changed file), each running a command at once (a daemon of 32 workers): all
must succeed; memory per fork is its sandbox's resident memory (bubblewrap, the
holder, the command) read while they all run, and its layer's bytes (the workers are
the pool's, shared by every session).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.common import daemon
from toolpool import Client, ToolCall

NAME = "branch"
FORKS_AT_ONCE = 32


def _tree(root: Path, files: int) -> int:
    """``files`` files of 16 bytes, 100 to a directory; the tree's bytes."""
    for n in range(files):
        directory = root / f"d{n // 100:04d}"
        if n % 100 == 0:
            directory.mkdir(parents=True)
        (directory / f"f{n % 100:02d}.txt").write_bytes(b"0123456789abcde\n")
    return 16 * files


def _git(cwd: Path, *argv: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=b@b", *argv],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def _ms(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return (time.perf_counter() - began) * 1000


def _ran(session: Any, command: str) -> None:
    (result,) = session.submit([ToolCall("c", "bash", {"command": command})]).results()
    assert not result.is_error, result.text


def _sizes(quick: bool) -> list[int]:
    # cp -a and git worktree add of a 10k tree take seconds each here: the quick bench
    # keeps to smaller trees, and fewer rounds.
    return [1000, 5000] if quick else [1000, 10_000, 100_000]


def run(quick: bool, workspace: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "a workspace overlay needs a daemon run as root"}
    rounds = 3 if quick else 15
    found: dict[str, Any] = {"rounds": rounds, "sizes": {}}
    flags = ("--max-sessions-per-client", str(FORKS_AT_ONCE + 8))
    with (
        tempfile.TemporaryDirectory(prefix="toolpool-bench-branch-", dir=workspace) as tmp,
        daemon(2, *flags) as running,
        Client(runtime_dir=running.runtime, timeout=300) as client,
    ):
        place = Path(tmp)
        for files in _sizes(quick):
            found["sizes"][str(files)] = _one_size(client, place / str(files), files, rounds)
    # At once means a worker each: a daemon of FORKS_AT_ONCE workers for that part.
    with (
        tempfile.TemporaryDirectory(prefix="toolpool-bench-branch-", dir=workspace) as tmp,
        daemon(FORKS_AT_ONCE, *flags) as running,
        Client(runtime_dir=running.runtime, timeout=300) as client,
    ):
        at_once = 2000 if quick else 10_000
        found["forks_at_once"] = _forks_at_once(client, Path(tmp) / "at-once", at_once)
    return found


def _one_size(client: Client, place: Path, files: int, rounds: int) -> dict[str, Any]:
    tree = place / "tree"
    tree.mkdir(parents=True)
    tree_bytes = _tree(tree, files)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "tree")
    samples: dict[str, list[float]] = {
        "fork": [],
        "checkpoint": [],
        "rewind": [],
        "cp -a": [],
        "git worktree add": [],
        "git stash": [],
        "git checkout -- .": [],
    }
    fork_disk: list[float] = []
    with client.session(tree, workspace_mode="overlay") as session:
        _ran(session, "echo changed >> d0000/f00.txt")  # a layer frozen at its end

        def fork() -> None:
            began = time.perf_counter()
            (child,) = session.fork()
            samples["fork"].append((time.perf_counter() - began) * 1000)
            _ran(child, "echo mine > mine.txt")
            status = client.status()["sessions"][child.id]["environment"]
            fork_disk.append(float(status["layer_used_bytes"]))
            child.close()

        def checkpoint() -> None:
            _ran(session, "echo again >> d0000/f01.txt")
            samples["checkpoint"].append(session.checkpoints()[-1].duration_ms)

        def rewind() -> None:
            mark = session.checkpoints()[-1]
            _ran(session, "echo undone >> d0000/f02.txt")
            samples["rewind"].append(_ms(lambda: session.rewind(mark.id)))

        def copy() -> None:
            target = place / "copy"
            samples["cp -a"].append(_ms(lambda: _run(["cp", "-a", str(tree), str(target)])))
            shutil.rmtree(target)

        def worktree() -> None:
            target = place / "worktree"
            samples["git worktree add"].append(
                _ms(lambda: _git(tree, "worktree", "add", "-q", "--detach", str(target)))
            )
            _git(tree, "worktree", "remove", "--force", str(target))

        def stash() -> None:
            (tree / "d0000" / "f03.txt").write_text("changed\n")
            samples["git stash"].append(_ms(lambda: _git(tree, "stash", "-q")))
            _git(tree, "stash", "drop", "-q")

        def checkout() -> None:
            (tree / "d0000" / "f04.txt").write_text("changed\n")
            samples["git checkout -- ."].append(_ms(lambda: _git(tree, "checkout", "--", ".")))

        actions = [fork, checkpoint, rewind, copy, worktree, stash, checkout]
        # A copy of the large trees takes seconds to minutes: fewer rounds of those two.
        copies = rounds if files < 10_000 else min(rounds, 3)
        order = random.Random(files)
        for n in range(rounds):
            order.shuffle(actions)
            for action in actions:
                if n < copies or action not in (copy, worktree):
                    action()
    return {
        "files": files,
        "tree_bytes": tree_bytes,
        "p50_ms": {name: round(statistics.median(v), 3) for name, v in samples.items()},
        "samples_ms": {name: [round(x, 3) for x in v] for name, v in samples.items()},
        "copy_rounds": copies,
        "fork_disk_bytes": statistics.median(fork_disk),
    }


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _forks_at_once(client: Client, place: Path, files: int) -> dict[str, Any]:
    """32 forks of one prepared session, each running a command at once."""
    place.mkdir()
    _tree(place, files)
    with client.session(place, workspace_mode="overlay") as session:
        _ran(session, "echo prepared > prepared.txt")
        began = time.perf_counter()
        forks = session.fork(FORKS_AT_ONCE)
        forked_ms = (time.perf_counter() - began) * 1000
        try:
            began = time.perf_counter()
            # Each command holds its sandbox a moment, so that all 32 run at once and
            # their memory is read while they do (a turn's end ends its sandbox).
            command = "cat prepared.txt; echo {n} > n; sleep 1"
            turns = [
                fork.submit([ToolCall("c", "bash", {"command": command.format(n=n)})])
                for n, fork in enumerate(forks)
            ]
            rss, layers = _while_running(client, [fork.id for fork in forks])
            results = [turn.results()[0] for turn in turns]
            ran_ms = (time.perf_counter() - began) * 1000
        finally:
            for fork in forks:
                fork.close()
    ok = sum(not r.is_error and r.text.startswith("prepared") for r in results)
    return {
        "forks": FORKS_AT_ONCE,
        "files": files,
        "succeeded": ok,
        "fork_all_ms": round(forked_ms, 1),
        "commands_all_ms": round(ran_ms, 1),
        "rss_per_fork_mib": round(statistics.median(rss) / 2**20, 2),
        "layer_per_fork_bytes": statistics.median(layers),
    }


def _while_running(client: Client, session_ids: list[str]) -> tuple[list[int], list[float]]:
    """Each session's sandbox's resident memory and its layer's bytes, read once every
    session's sandbox runs (or after a hang guard of 60 s, with what runs then)."""
    deadline = time.monotonic() + 60
    while True:
        status = client.status()["sessions"]
        boxes = {s: [b for b in status[s]["sandboxes"] if "pid" in b] for s in session_ids}
        if all(boxes.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    rss, layers = [], []
    for session_id in session_ids:
        layers.append(float(status[session_id]["environment"].get("layer_used_bytes", 0)))
        total = 0
        for box in boxes[session_id]:
            try:
                holder = psutil.Process(int(box["pid"]))
                processes = [holder, holder.parent(), *holder.children(recursive=True)]
                total += sum(p.memory_info().rss for p in processes if p is not None)
            except psutil.Error:
                continue  # ended meanwhile: counted as nothing
        rss.append(total)
    return rss, layers


def report(data: dict[str, Any]) -> list[str]:
    if "skipped" in data:
        return ["", "## Branch", "", f"Skipped: {data['skipped']}."]
    lines = [
        "",
        "## Branch",
        "",
        f"Through the daemon, medians of {data['rounds']} interleaved rounds per tree "
        "(files of 16 bytes, 100 to a directory): `fork()` (its round trip), the checkpoint "
        "a command's turn ended with (as the daemon timed it), `rewind()` (its round trip); "
        "beside them what a user would otherwise do: `cp -a` of the tree, `git worktree "
        "add`, and for a rewind `git stash` of one change and `git checkout -- .`.",
        "",
        "| files | fork ms | checkpoint ms | rewind ms | cp -a ms | git worktree add ms "
        "| git stash ms | git checkout ms | disk per fork |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in data["sizes"].values():
        m = size["p50_ms"]
        lines.append(
            f"| {size['files']} | {m['fork']:.2f} | {m['checkpoint']:.2f} | "
            f"{m['rewind']:.2f} | {m['cp -a']:.1f} | {m['git worktree add']:.1f} | "
            f"{m['git stash']:.1f} | {m['git checkout -- .']:.1f} | "
            f"{size['fork_disk_bytes'] / 1024:.0f} KiB of a {size['tree_bytes'] / 1024:.0f} "
            "KiB tree |"
        )
    at_once = data["forks_at_once"]
    lines += [
        "",
        f"{at_once['forks']} forks of one prepared session ({at_once['files']} files) made in "
        f"{at_once['fork_all_ms']:.0f} ms, each running a command at once: "
        f"{at_once['succeeded']} succeeded in {at_once['commands_all_ms']:.0f} ms; per fork "
        f"{at_once['rss_per_fork_mib']:.1f} MiB resident (its sandbox) and "
        f"{at_once['layer_per_fork_bytes'] / 1024:.0f} KiB of layer.",
    ]
    return lines
