"""The egress proxy's process (SPEC N3): started with its control socket, in its
cgroup, as ``nobody`` when the daemon is root, its stderr to ``egress.log``; ready
when it says so; ended by closing its control socket (killed if it lingers)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolpool.egress import control
from toolpool.egress.addresses import Pin, pin_text

START_SECONDS = 10.0  # the proxy's process says it serves within this
NOBODY = 65534


def start_proxy(
    runtime_dir: Path, pins: Mapping[str, Pin], cgroup_procs: Sequence[Path]
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """(In a thread.) The proxy's process and the pool's end of its control socket
    (non-blocking), once it said ``ready``. Raises OSError saying why not."""
    ours, theirs = control.pair()
    argv = [sys.executable, "-m", "toolpool.egress", "--control-fd", str(theirs.fileno())]
    argv += ["--pins", json.dumps({name: pin_text(pin) for name, pin in pins.items()})]
    for procs in cgroup_procs:
        argv += ["--cgroup-procs", str(procs)]
    if os.geteuid() == 0:
        argv += ["--user", str(NOBODY)]
    log_path = runtime_dir / "egress.log"
    with open(log_path, "ab") as log_file:
        os.chmod(log_path, 0o600)
        try:
            process = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
    ours.settimeout(START_SECONDS)
    try:
        got = control.receive(ours)
    except (OSError, control.ControlError) as exc:
        got, why = None, f" ({exc})"
    else:
        why = ""
    if got is None or got[0].get("op") != "ready":
        process.kill()
        process.wait()
        ours.close()
        raise OSError(f"the proxy did not start{why}; see {log_path}")
    ours.setblocking(False)
    return process, ours


def end_proxy(process: subprocess.Popen[bytes]) -> None:
    """The proxy ends when its control socket closes; killed if it does not."""
    try:
        process.wait(2.0)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
