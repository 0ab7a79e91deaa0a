"""Run by tests/test_unprivileged_daemon.py as a throw-away uid, with the Python of a
venv that holds the installed wheel (never the checkout): starts a daemon as that uid,
runs sessions of each layered kind, stops it, and prints what it saw as JSON.

    python unprivileged_scenario.py BASE IMAGE MINE
      BASE/home: HOME; BASE/ws: the workspace; MINE: a host directory the uid owns
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolpool import Client, ToolCall


def call(session: Any, name: str, **arguments: Any) -> dict[str, Any]:
    (result,) = session.submit([ToolCall("c", name, arguments)]).results()
    return {"text": result.text, "error": result.error_code and result.error_code.value}


def holders() -> int:
    """This uid's layer holders running now."""
    import psutil

    mine = os.getuid()
    return sum(
        1
        for p in psutil.process_iter(["uids", "cmdline"])
        if p.info["uids"]
        and p.info["uids"].real == mine
        and any("layer_holder" in part for part in p.info["cmdline"] or [])
    )


def main() -> None:
    base, image, mine = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    home, workspace = base / "home", base / "ws"
    runtime = home / "rt"
    daemon = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "toolpool"),
            "daemon", "run", "--runtime-dir", str(runtime), "--min-workers", "1",
            "--image-dirs", str(Path(image).parent), "--image-cache", str(home / "cache"),
            "--log-file", str(home / "daemon.log"), "--log-level", "debug",
        ],
    )  # fmt: skip
    seen: dict[str, Any] = {"uid": os.getuid()}
    try:
        client = None
        deadline = time.monotonic() + 60
        while client is None and time.monotonic() < deadline:
            try:
                client = Client(runtime_dir=runtime, timeout=60).__enter__()
            except Exception:
                time.sleep(0.1)
        assert client is not None, "the daemon never answered"
        with client.session(workspace, workspace_mode="overlay") as session:
            seen["write"] = call(session, "write", path="by_tool.txt", content="tool\n")
            look = "cat by_tool.txt; echo changed > kept.txt; mkdir sub; cd sub"
            seen["command"] = call(session, "bash", command=look)
            seen["pwd"] = call(session, "bash", command="pwd")
            seen["read"] = call(session, "read", path="kept.txt")
            seen["grep"] = call(session, "grep", pattern="changed")
            seen["environment"] = client.status()["sessions"][session.id]["environment"]
            seen["host_during"] = sorted(os.listdir(workspace))
        with client.session(workspace, root="overlay") as session:
            probe = (
                "touch /usr/local/toolpool-probe 2>/dev/null; echo usr_local=$?; "
                "echo x > /var/tmp/toolpool-probe 2>/dev/null; echo var_tmp=$?; "
                f"echo mine > {mine}/probe; echo mine=$?; cat {mine}/probe; "
                "cat /etc/apt/apt.conf.d/99toolpool-sandbox 2>/dev/null | head -c 100; "
                "ls /root 2>/dev/null; echo root_home=$?; "
                "cat /proc/1/root/etc/hostname 2>/dev/null; echo pid1_root=$?"
            )
            seen["root"] = call(session, "bash", command=probe)
            seen["root_environment"] = client.status()["sessions"][session.id]["environment"]
        with (
            client.session(workspace, root={"image": image}) as first,
            client.session(workspace, root={"image": image}) as second,
        ):
            look = "cat /etc/kept.txt; echo $GREETING; ls -ln /etc/kept.txt; echo mine > /etc/mine"
            seen["image"] = call(first, "bash", command=look)
            seen["image_again"] = call(first, "bash", command="cat /etc/mine")
            seen["image_other"] = call(second, "bash", command="cat /etc/mine 2>&1; echo $?")
        with client.session(workspace, workspace_mode="overlay", root={"image": image}) as parent:
            call(parent, "bash", command="echo one > branch.txt; echo img > /etc/branch")
            mark = parent.checkpoints()[-1]
            call(parent, "bash", command="echo two > branch.txt; rm /etc/branch")
            (fork,) = parent.fork(at=mark.id)
            seen["fork_at_mark"] = call(fork, "bash", command="cat branch.txt /etc/branch")
            call(fork, "bash", command="echo fork > branch.txt; echo fork > /etc/branch")
            seen["parent_after_fork"] = call(parent, "bash", command="cat branch.txt")
            seen["holders_of_family"] = holders()
            seen["rewound"] = parent.rewind(mark.id).checkpoint == mark.id
            seen["after_rewind"] = call(parent, "bash", command="cat branch.txt /etc/branch")
            seen["fork_after_rewind"] = call(fork, "bash", command="cat branch.txt /etc/branch")
            seen["diff"] = parent.diff()
            fork.close()
        with client.session(workspace, workspace_mode="overlay") as parent:
            # A fork's sandbox runs in the family's holder, a copy of the parent's
            # overlays in its namespace, while the parent reads 2 MiB through them and
            # then rewinds past them (B13); the file is read-only and a MiB more lies in
            # directories of mode 000 and 0555, which the daemon's user must get past
            write = (
                "head -c 2097152 /dev/zero > big; chmod 444 big; mkdir -p sealed/in ro; "
                "head -c 1048576 /dev/zero > sealed/in/f; head -c 1048576 /dev/zero > ro/f; "
                "chmod 000 sealed; chmod 555 ro"
            )
            call(parent, "bash", command=write)
            start = parent.checkpoints()[0]
            (fork,) = parent.fork(at=start.id)
            call(fork, "bash", command="true")
            call(parent, "bash", command="cat big > /dev/null; echo more > more")
            parent.rewind(start.id)
            environment = client.status()["sessions"][parent.id]["environment"]
            seen["used_after_rewind"] = environment["layer_used_bytes"]
            fork.close()
        client.__exit__(None, None, None)
    finally:
        daemon.terminate()
        seen["daemon_exit"] = daemon.wait(60)
    seen["host_after"] = sorted(os.listdir(workspace))
    # The sessions' layers and sockets; the rest of a stopped daemon's runtime dir (its
    # logs) is removed at its next start.
    seen["layers_left"] = sorted(str(p) for p in runtime.glob("workers-*/s/*"))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
