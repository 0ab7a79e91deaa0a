"""The one test whose traffic leaves the machine (SPEC N3): pip installs a package
from pypi.org through a policy session's proxy, allowed pypi.org and
files.pythonhosted.org and nothing else; the audit shows both tunnels, and the same
session is refused another host with the rule named.

``--isolated`` keeps pip from the machine's own configuration (a local wheel
directory or index would answer instead of PyPI); ``--target`` installs into the
session's private /tmp. Where this host itself cannot reach pypi.org there is
nothing to show, and the test says so."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from toolpool import Client

from .egress_support import REASON, out, records, run, site, usable
from .shell_support import wait_until


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not usable(), reason=REASON)
@pytest.mark.timeout(300)
@pytest.mark.spec("N3", "N8", "N5")
def test_N3_pip_installs_from_pypi_through_the_proxy_and_nothing_else_is_reached(
    tmp_path: Path, workspace: Path
) -> None:
    if not _pypi_reachable():
        pytest.skip("this host cannot reach pypi.org itself: no outbound access to show")
    policy = {"allow": ["pypi.org", "files.pythonhosted.org"]}
    pip = (
        f"{sys.executable} -m pip install --isolated --no-cache-dir "
        "--disable-pip-version-check --index-url https://pypi.org/simple "
        "--target /tmp/pkgs six 2>&1 | tail -1; ls /tmp/pkgs"
    )
    with (
        site(tmp_path) as net,
        Client(runtime_dir=net.daemon.runtime, timeout=280) as client,
        client.session(workspace, network=policy) as session,
    ):
        installed = out(run(session, pip, "pip"))
        refused = run(session, "curl -sS https://example.com/ 2>&1; true", "other")
        session_id = session.id
        wait_until(lambda: len(records(net.audit, session_id)) >= 3, "the records")
        seen = records(net.audit, session_id)
    assert installed.splitlines()[0].startswith("Successfully installed six-")
    assert "six.py" in installed.splitlines()
    tunnels = {(r["host"], r["via"], r["decision"]) for r in seen if r["call"] == "pip"}
    assert tunnels == {
        ("pypi.org", "connect", "allow"),
        ("files.pythonhosted.org", "connect", "allow"),
    }
    assert all(r["bytes_down"] > 0 for r in seen if r["call"] == "pip")
    assert refused.details["network_refused"] == [
        {"host": "example.com", "port": 443, "by": "no rule allows it"}
    ]
    assert "example.com:443 (no rule allows it)" in refused.text
