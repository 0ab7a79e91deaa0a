"""Paired, interleaved medians: `true` through a session sandbox vs a plain fork-exec
vs today's per-call bubblewrap (``confined()``).

    python -m bench.session_spawn [--without-confined]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolpool.sandbox.command import confined
from toolpool.sandbox.session_box import SessionSandbox
from toolpool.sandbox.spawn import current_rlimits, own_cgroup_procs, spawn


def main(rounds: int = 200, with_confined: bool = True) -> None:
    base = Path(tempfile.mkdtemp(prefix="tps-bench-"))
    workspace = base / "ws"
    workspace.mkdir()
    box = SessionSandbox.start(roots=[workspace], network=False, tmp_bytes=1 << 24, socket_dir=base)
    cgroups, limits = own_cgroup_procs(), current_rlimits()
    null = os.open("/dev/null", os.O_RDWR)
    times: dict[str, list[float]] = {"spawn": [], "plain": [], "confined": []}

    def via_spawn() -> None:
        command = spawn(
            box.socket_path,
            ["true"],
            env={"PATH": "/usr/bin:/bin"},
            cwd=str(workspace),
            stdin=null,
            stdout=null,
            stderr=null,
            cgroup_procs=cgroups,
            rlimits=limits,
        )
        assert command.wait() == 0
        command.close()

    def plain() -> None:
        subprocess.run(["/bin/true"], check=True)

    def via_confined() -> None:
        with confined(["true"], workspace=workspace) as c:
            p = subprocess.Popen(c.argv, pass_fds=c.pass_fds, env=c.env, stdin=null, stdout=null)
            c.started()
            assert p.wait() == 0
            c.finish()

    runs = {"spawn": via_spawn, "plain": plain}
    if with_confined:  # a per-call bwrap leaves the kernel work (RCU) that slows the others
        runs["confined"] = via_confined
    try:
        for i in range(rounds):
            names = list(runs)
            order = (
                names[i % len(names) :] + names[: i % len(names)]
            )  # interleaved, each first in turn
            for name in order:
                start = time.perf_counter()
                runs[name]()
                times[name].append((time.perf_counter() - start) * 1000)
    finally:
        box.close()
        for fd in (*cgroups, null):
            os.close(fd)
        os.rmdir(workspace)
        os.rmdir(base)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    pairs = statistics.median(s - p for s, p in zip(times["spawn"], times["plain"], strict=True))
    for name, value in med.items():
        print(f"{name:9} median {value:.3f} ms")
    print(f"spawn - plain, paired median: {pairs:+.3f} ms", file=sys.stdout)


if __name__ == "__main__":
    main(with_confined="--without-confined" not in sys.argv)
