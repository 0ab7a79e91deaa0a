"""Outbound-only network for a bubblewrap-confined command (SPEC X3).

A command of a network-allowed session gets its own network namespace, connected to
the outside by pasta (Debian package passt) with no port forwarded in either
direction and the host's loopback not mapped. pasta copies the host's primary
addresses into the namespace, so connecting to them reaches the namespace itself;
every other address of this host (secondary addresses, IPv6 link-local, other
interfaces) gets a ``prohibit`` policy rule inside the namespace, installed before
the command starts (the command has no capabilities and cannot remove it).
A resolver on loopback or on this host's own address is reached through one pasta
DNS forward, and the command sees an /etc/resolv.conf naming the forwarded address.
What this host's addresses and resolver are is hostnet.py; the rules, netlink.py.

    net = OutboundNetwork()
    argv = ["bwrap", ..., *net.bwrap_args(), "--", *command]   # after --ro-bind / /
    proc = subprocess.Popen(argv, pass_fds=net.pass_fds(), ...)
    try:
        net.start(timeout=5)   # the command is blocked until this returns
        proc.wait()
    finally:
        net.close()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from toolpool.sandbox import linux
from toolpool.sandbox.hostnet import DNS_FORWARD_ADDRESS, HostNetwork
from toolpool.sandbox.netlink import RULE_PRIORITY, NetworkSetupError, add_prohibit_rules

_FIX = "install Debian package passt (apt-get install passt)"

__all__ = ["DNS_FORWARD_ADDRESS", "HostNetwork", "NetworkSetupError", "OutboundNetwork", "probe"]


class OutboundNetwork:
    """One command's outbound-only network namespace; see the module docstring."""

    def __init__(self, pasta: str | None = None, host: HostNetwork | None = None) -> None:
        found = pasta or shutil.which("pasta")
        if found is None:
            raise NetworkSetupError(f"pasta not found: {_FIX}")
        self._pasta = found
        self._host = host or HostNetwork.read()
        self._info_r, self._info_w = os.pipe()
        self._block_r, self._block_w = os.pipe()
        self._child_fds = [self._info_w, self._block_r]
        self._resolv_fd: int | None = None
        inside = self._host.resolv_conf_inside()
        if inside is not None:
            read, write = os.pipe()
            os.write(write, inside.encode())  # small: fits the pipe buffer
            os.close(write)
            self._resolv_fd = read
            self._child_fds.append(read)
        self._helper: subprocess.Popen[bytes] | None = None
        self._ns_fds: list[int] = []
        self.child_pid: int | None = None

    def bwrap_args(self) -> list[str]:
        """bubblewrap options; put them after the root mounts (``--ro-bind / /``)."""
        args = ["--unshare-net", "--info-fd", str(self._info_w), "--block-fd", str(self._block_r)]
        if self._resolv_fd is not None:
            args += ["--ro-bind-data", str(self._resolv_fd), "/etc/resolv.conf"]
        return args

    def pass_fds(self) -> tuple[int, ...]:
        return tuple(self._child_fds)

    def start(self, timeout: float = 5.0) -> None:
        """Connect the namespace of the bubblewrap just spawned, then let its command
        run. On failure the blocked command is killed and NetworkSetupError raised."""
        deadline = time.monotonic() + timeout
        self._close_child_fds()
        try:
            pid = self._read_child_pid(deadline)
            self.child_pid = pid
            self._ns_fds = [os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)]
            same_userns = (
                os.stat(f"/proc/{pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino
            )
            if not same_userns:
                self._ns_fds.append(os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC))
            self._prohibit_host(pid, same_userns, deadline)
            self._spawn_helper(same_userns)
            self._wait_configured(pid, deadline)
        except BaseException:
            if self.child_pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(self.child_pid, signal.SIGKILL)
            raise
        os.write(self._block_w, b"1")
        os.close(self._block_w)
        self._block_w = -1

    def close(self, wait: bool = False) -> None:
        """Stop pasta and close every descriptor; call once bubblewrap has ended.

        pasta is killed at once (it keeps nothing worth flushing), but its exit takes
        tens of milliseconds (the kernel tears down its tap device): unless ``wait``,
        a thread reaps it so the caller need not wait."""
        self._close_child_fds()
        helper, self._helper = self._helper, None
        if helper is not None:
            if helper.poll() is None:
                helper.kill()
            if helper.stderr is not None:
                helper.stderr.close()
            if wait:
                helper.wait()
            else:
                threading.Thread(target=helper.wait, name="toolpool-pasta-reaper").start()
        for fd in (self._info_r, self._block_w, *self._ns_fds):
            if fd >= 0:
                os.close(fd)
        self._info_r = self._block_w = -1
        self._ns_fds = []

    def __enter__(self) -> OutboundNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- steps of start() ---------------------------------------------------------------

    def _close_child_fds(self) -> None:
        for fd in self._child_fds:
            os.close(fd)
        self._child_fds = []

    def _read_child_pid(self, deadline: float) -> int:
        data = b""
        while True:
            with contextlib.suppress(ValueError):
                info = json.loads(data)
                return int(info["child-pid"])
            left = deadline - time.monotonic()
            if left <= 0 or not linux.readable(self._info_r, left):
                raise NetworkSetupError("bubblewrap did not report its child in time")
            chunk = os.read(self._info_r, 4096)
            if not chunk:
                raise NetworkSetupError("bubblewrap ended before reporting its child")
            data += chunk

    def _prohibit_host(self, pid: int, same_userns: bool, deadline: float) -> None:
        nets = list(self._host.local)
        if not nets:
            return
        if same_userns or os.geteuid() == 0:
            # Root may enter a namespace that a child user namespace owns: no process.
            add_prohibit_rules(self._ns_fds[0], nets)
            return
        # Another user namespace (unprivileged bubblewrap): only a single-threaded
        # process may enter it, so let nsenter run ip there (one -batch per family).
        ip, nsenter = shutil.which("ip"), shutil.which("nsenter")
        if ip is None or nsenter is None:
            raise NetworkSetupError(
                "ip and nsenter are needed (Debian packages iproute2, util-linux)"
            )
        script = ""
        for version in (4, 6):
            rules = [
                f"rule add to {n} prohibit pref {RULE_PRIORITY}\n"
                for n in nets
                if n.version == version
            ]
            if rules:
                script += f"{ip} -{version} -batch - <<'END'\n{''.join(rules)}END\n"
        argv = [nsenter, f"--user=/proc/{pid}/ns/user", f"--net=/proc/{pid}/ns/net"]
        argv += ["--preserve-credentials", "/bin/sh", "-ec", script]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=max(deadline - time.monotonic(), 0.1),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NetworkSetupError(f"cannot add the namespace's rules: {exc}") from exc
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()
            raise NetworkSetupError(f"cannot add the namespace's rules: {why}")

    def _spawn_helper(self, same_userns: bool) -> None:
        net_fd = self._ns_fds[0]
        argv = [self._pasta, "--foreground", "--quiet", "--config-net", "--no-map-gw"]
        argv += ["-t", "none", "-u", "none", "-T", "none", "-U", "none"]
        if self._host.dns_host is not None:
            # pasta sends them to the first nameserver of the host's resolv.conf.
            argv += ["--dns-forward", DNS_FORWARD_ADDRESS]
        if os.geteuid() == 0:
            # As "nobody" pasta could not enter a namespace root made; it still
            # drops every capability but CAP_NET_BIND_SERVICE and CAP_SYS_ADMIN.
            argv += ["--runas", "0"]
        if not same_userns:
            argv += ["--userns", f"/proc/self/fd/{self._ns_fds[1]}"]
        argv += ["--netns", f"/proc/self/fd/{net_fd}"]
        try:
            self._helper = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=tuple(self._ns_fds),
            )
        except OSError as exc:
            raise NetworkSetupError(f"cannot start pasta: {exc}; {_FIX}") from exc

    def _wait_configured(self, pid: int, deadline: float) -> None:
        """Until pasta has given the namespace its addresses and default routes."""
        want_v4 = any(n.version == 4 for n in self._host.local) and _has_default(
            "/proc/self/net/route", 4
        )
        want_v6 = _has_default("/proc/self/net/ipv6_route", 6)
        pause = 0.0002
        while True:
            ready = (not want_v4 or _has_default(f"/proc/{pid}/net/route", 4)) and (
                not want_v6 or _has_default(f"/proc/{pid}/net/ipv6_route", 6)
            )
            if ready:
                return
            helper = self._helper
            if helper is not None and helper.poll() is not None:
                why = b""
                if helper.stderr is not None:
                    why = helper.stderr.read()
                lines = [
                    ln for ln in why.decode(errors="replace").splitlines() if "syslog" not in ln
                ]
                detail = lines[-1] if lines else f"exit status {helper.returncode}"
                if "tun" in detail:
                    detail += " (pasta needs read-write access to /dev/net/tun)"
                # Seen ~1 start in 100 on a loaded machine: "Couldn't switch to pasta
                # namespaces". The command is still blocked: starting over is safe.
                raise NetworkSetupError(
                    f"pasta failed to connect the namespace: {detail}", again=True
                )
            if time.monotonic() > deadline:
                raise NetworkSetupError("pasta did not configure the namespace in time")
            time.sleep(pause)
            pause = min(pause * 2, 0.002)


def _has_default(path: str, version: int) -> bool:
    """Whether a routing table in /proc has a default route through a device other
    than lo."""
    try:
        text = Path(path).read_text()
    except OSError:
        return False
    for line in text.splitlines():
        words = line.split()
        if version == 4 and len(words) > 7:
            default, device = words[1] == words[7] == "00000000", words[0]
        elif version == 6 and len(words) == 10:
            default, device = words[0] == "0" * 32 and words[1] == "00", words[9]
        else:
            continue
        if default and device != "lo":
            return True
    return False


# -- probe -------------------------------------------------------------------------------


def probe(timeout: float = 10.0) -> tuple[bool, str]:
    """Whether commands can get an outbound-only namespace here, and why not."""
    pasta, bwrap = shutil.which("pasta"), shutil.which("bwrap")
    if pasta is None:
        return False, f"pasta not installed ({_FIX})"
    if bwrap is None:
        return False, "bwrap not installed (Debian package bubblewrap)"
    try:
        net = OutboundNetwork(pasta)
    except (NetworkSetupError, OSError) as exc:
        return False, str(exc)
    with net:
        argv = [bwrap, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/"]
        argv += ["--dev", "/dev", "--proc", "/proc", *net.bwrap_args(), "--", "true"]
        try:
            proc = subprocess.Popen(
                argv, pass_fds=net.pass_fds(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        except OSError as exc:
            return False, f"cannot run bwrap: {exc}"
        try:
            net.start(timeout)
            _, err = proc.communicate(timeout=timeout)
        except (NetworkSetupError, subprocess.TimeoutExpired) as exc:
            proc.kill()
            proc.communicate()
            return False, str(exc)
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            return False, f"bwrap failed: {lines[-1] if lines else proc.returncode}"
    refused = len(net._host.local)
    dns = f", DNS forwarded to {net._host.dns_host}" if net._host.dns_host else ""
    return True, f"pasta ({pasta}), outbound only, {refused} host addresses refused{dns}"
