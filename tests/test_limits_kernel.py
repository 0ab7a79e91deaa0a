"""SPEC X13: a call's limits reach the kernel through one mapping — the rlimits of
``toolpool.sandbox.limits.rlimits`` and the cgroup limits of ``CgroupLimits`` — for a
worker, each of its calls and a background shell, wherever the shell starts; and a
limit the kernel cannot take is refused where limits are made.

The processes here report their own rlimits (a child that prints what it has, as
circus's tests do), so each path is checked by what the kernel holds, not by what
the code meant to ask for."""

from __future__ import annotations

import dataclasses
import json
import math
import resource
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from toolpool.pool.shell_process import _launcher
from toolpool.pool.shell_spawn import _rlimits
from toolpool.sandbox import confine_exec
from toolpool.sandbox.cgroups import CgroupTree
from toolpool.sandbox.limits import (
    PER_CALL,
    CgroupLimits,
    Limits,
    MiB,
    capped,
    refusal,
    resource_number,
    rlimits,
)
from toolpool.sandbox.profile import SandboxProfile
from toolpool.session_options import SessionOptionError, SessionOptions

# A child's report: every rlimit the mapping names, as the kernel holds it.
REPORT = textwrap.dedent(
    """
    import json, resource, sys
    names = sys.argv[1:]
    print(json.dumps({n: resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in names}))
    """
)
NAMES = ("CORE", "NOFILE", "FSIZE", "CPU", "AS")
TIGHT = Limits(cpu_seconds=2.2, memory_bytes=300 * MiB, file_size_bytes=3 * MiB, open_files=77)


def reported(stdout: str) -> dict[str, tuple[int, int]]:
    return {name: (soft, hard) for name, (soft, hard) in json.loads(stdout).items()}


def within_ours(wanted: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """``wanted`` as a child of this process can have it: under our hard limits."""
    return {
        name: capped(soft, hard, resource.getrlimit(resource_number(name))[1])
        for name, (soft, hard) in wanted.items()
    }


# --- the one mapping ------------------------------------------------------------------------


@pytest.mark.spec("X13")
@pytest.mark.parametrize(
    ("limits", "address_space", "expected"),
    [
        (
            Limits(),
            False,
            {"CORE": (0, 0), "NOFILE": (1024, 1024), "FSIZE": (1 << 30, 1 << 30), "CPU": (60, 61)},
        ),
        # CPU rounds up to whole seconds, one at least; SIGKILL a second after SIGXCPU
        (Limits(cpu_seconds=2.2), False, {"CPU": (3, 4)}),
        (Limits(cpu_seconds=0.1), False, {"CPU": (1, 2)}),
        # memory_bytes is RLIMIT_AS only where no memory cgroup bounds the process
        (Limits(memory_bytes=5 * MiB), True, {"AS": (5 * MiB, 5 * MiB)}),
        (Limits(memory_bytes=5 * MiB), False, {"AS": None}),
    ],
)
def test_X13_each_limit_has_its_rlimit(
    limits: Limits, address_space: bool, expected: dict[str, tuple[int, int] | None]
) -> None:
    mapped = rlimits(limits, address_space=address_space)
    for name, value in expected.items():
        assert mapped.get(name) == value
    # Every name is one the kernel has: nothing maps to an rlimit that is not one
    assert all(isinstance(resource_number(name), int) for name in mapped)
    assert set(PER_CALL) <= set(rlimits(limits, address_space=True))


@pytest.mark.spec("X13")
def test_X13_a_shell_of_its_own_gets_the_mapping_through_the_exec_wrapper() -> None:
    # Given the exec wrapper's arguments for a shell with no cgroup (RLIMIT_AS too)
    argv = _launcher(None, TIGHT, unshare_net=False)
    # When the command it execs reports its rlimits
    done = subprocess.run(
        [*argv, sys.executable, "-I", "-S", "-c", REPORT, *NAMES],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # Then they are the mapping's, every one of them: the wrapper knows every name
    assert reported(done.stdout) == within_ours(rlimits(TIGHT, address_space=True))


@pytest.mark.spec("X13")
def test_X13_a_shell_in_its_sessions_sandbox_gets_the_mapping_never_above_a_hard_limit() -> None:
    # Given a daemon whose hard limit on open files is 200 (lowered in a child: a
    # lowered hard limit cannot be raised again)
    script = textwrap.dedent(
        """
        import json, resource
        from toolpool.pool.shell_spawn import _rlimits
        from toolpool.sandbox.limits import Limits, rlimits
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
        limits = Limits(open_files=100_000, cpu_seconds=4)
        given = _rlimits(None, limits)
        stack = resource.RLIMIT_STACK
        print(json.dumps({"nofile": given[resource.RLIMIT_NOFILE],
                          "cpu": given[resource.RLIMIT_CPU],
                          "as": given[resource.RLIMIT_AS],
                          "stack": given[stack] == resource.getrlimit(stack)}))
        """
    )
    # When a shell's rlimits are made there for a session asking for 100,000
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(done.stdout)
    # Then it gets 200 (no raise the kernel would refuse), the rest as mapped, and
    # what the mapping does not name is inherited as it is
    assert got["nofile"] == [200, 200]
    assert got["cpu"] == [4, 5]
    assert got["as"] == [Limits().memory_bytes] * 2  # no cgroup: memory is RLIMIT_AS
    assert got["stack"] is True
    # And with a memory cgroup there is no RLIMIT_AS from the mapping: inherited
    ours = _rlimits(_MemoryCgroup(), TIGHT)
    assert ours[resource.RLIMIT_AS] == resource.getrlimit(resource.RLIMIT_AS)


class _MemoryCgroup:
    """A cgroup as the mapping asks of one: which controllers bound it."""

    controllers = frozenset({"memory", "pids"})


@pytest.mark.spec("X13")
def test_X13_a_worker_sets_its_own_once_and_each_calls_soft_limits_per_call() -> None:
    # Given a worker process (a child: its hard limits cannot be raised again)
    script = textwrap.dedent(
        """
        import json, math, resource
        from toolpool.sandbox.limits import CallLimits, Limits, apply_process_limits
        def now(name):
            return resource.getrlimit(getattr(resource, "RLIMIT_" + name))
        hard = {n: now(n)[1] for n in ("CPU", "FSIZE", "AS")}
        apply_process_limits(Limits(open_files=77))
        per_call = CallLimits(limit_address_space=True)
        first = Limits(cpu_seconds=2.2, file_size_bytes=3 << 20, memory_bytes=300 << 20)
        before = per_call._address_space()
        per_call.apply(first, cpu_used=5.5)
        seen = {n: now(n) for n in ("CORE", "NOFILE", "CPU", "FSIZE", "AS")}
        seen["size"] = [before, per_call._address_space()]
        per_call.apply(Limits(file_size_bytes=5 << 20), cpu_used=5.5)
        seen["next_fsize"] = now("FSIZE")
        # The most a limit may be, over what the worker has used and maps already
        most = Limits(memory_bytes=2**63 - 1, cpu_seconds=float(2**62))
        per_call.apply(most, cpu_used=2.0**62)
        seen["most"] = [now("CPU")[0], now("AS")[0]]
        seen["hard"] = hard
        print(json.dumps(seen))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    seen = json.loads(done.stdout)
    mapped = rlimits(TIGHT, address_space=True)
    # Then its own are the mapping's for the pool's limits, soft and hard
    assert seen["CORE"] == [0, 0]
    assert seen["NOFILE"] == list(within_ours({"NOFILE": (77, 77)})["NOFILE"])
    # and a call's are the mapping's soft limits over where the process is: CPU from
    # what it used (5.5 s: from 6), address space from its size; hard ones untouched
    assert seen["CPU"] == [math.ceil(5.5) + mapped["CPU"][0], seen["hard"]["CPU"]]
    assert seen["FSIZE"] == [mapped["FSIZE"][0], seen["hard"]["FSIZE"]]
    assert seen["AS"][1] == seen["hard"]["AS"]
    before, after = seen["size"]
    assert before <= seen["AS"][0] - mapped["AS"][0] <= after
    # The next call's file size limit is its own
    assert seen["next_fsize"] == [5 << 20, seen["hard"]["FSIZE"]]
    # and a sum past what the kernel takes is the most it takes, not an error
    assert seen["most"] == [2**63 - 1, 2**63 - 1]


# --- cgroups --------------------------------------------------------------------------------


@pytest.mark.spec("X13")
def test_X13_cgroup_limits_are_one_object_per_limits_compared_by_value() -> None:
    a, b = Limits(memory_bytes=64 * MiB), Limits(memory_bytes=64 * MiB)
    assert CgroupLimits.of(a) is CgroupLimits.of(a)  # a session's calls: no new object
    assert CgroupLimits.of(a) == CgroupLimits.of(b)
    assert (CgroupLimits.of(a).memory_bytes, CgroupLimits.of(a).processes) == (64 * MiB, 256)
    assert CgroupLimits.of(a) != CgroupLimits.of(Limits(processes=8))
    assert "memory_bytes = 1024, processes = 8" in str(
        CgroupLimits.of(Limits(memory_bytes=1024, processes=8))
    )
    # Limits the cgroup does not carry leave it as it is
    assert CgroupLimits.of(Limits(cpu_seconds=3)) == CgroupLimits.of(Limits())
    # Each of its fields is the limit of that name
    limits = Limits(memory_bytes=5 * MiB, processes=7)
    for f in dataclasses.fields(CgroupLimits):
        assert getattr(CgroupLimits.of(limits), f.name) == getattr(limits, f.name)


_TREE = CgroupTree.probe() if SandboxProfile.probe().active("cgroups") else None


@pytest.mark.spec("X13")
@pytest.mark.skipif(
    _TREE is None or not {"memory", "pids"} <= _TREE.controllers,
    reason="no writable memory and pids cgroups here",
)
def test_X13_cgroup_limits_are_written_as_the_kernel_reads_them() -> None:
    assert _TREE is not None
    cgroup = _TREE.create("x13-write")
    try:
        CgroupLimits.of(Limits(memory_bytes=96 * MiB, processes=12)).write(cgroup)
        memory = cgroup.by_controller["memory"]
        v1 = (memory / "memory.limit_in_bytes").exists()
        limit_file = memory / ("memory.limit_in_bytes" if v1 else "memory.max")
        assert int(limit_file.read_text()) == 96 * MiB
        assert (cgroup.by_controller["pids"] / "pids.max").read_text().strip() == "12"
    finally:
        cgroup.remove()


# --- limits built to explode ------------------------------------------------------------------


HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"processes": 4 * 1024 * 1024 + 1}, "processes = 4194305: expected an integer of at most"),
    ({"memory_bytes": 2**64}, "memory_bytes = 18446744073709551616: expected an integer of at"),
    ({"open_files": 2**63}, "open_files = 9223372036854775808: expected an integer of at most"),
    ({"cpu_seconds": 1e300}, "cpu_seconds = 1e+300: expected a number of at most"),
    ({"cpu_seconds": float("nan")}, "cpu_seconds = nan: expected a number more than 0"),
    ({"memory_bytes": 10**5000}, "memory_bytes = <int too long to show>: expected an integer"),
    ({"memory_bytes": 64.0 * MiB}, "memory_bytes = 67108864.0: expected an integer more than 0"),
    ({"network": 1}, "network = 1: expected true or false"),
]


@pytest.mark.spec("X13", "E6")
@pytest.mark.parametrize(("limits", "message"), HOSTILE)
def test_X13_a_limit_the_kernel_cannot_take_is_refused_where_limits_are_made(
    limits: dict[str, Any], message: str
) -> None:
    # A session's limits: one line naming the option, the limit and the value
    with pytest.raises(SessionOptionError) as refused:
        SessionOptions.parse({"limits": limits})
    assert message in str(refused.value)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 600
    # Limits made directly (a pool's, a tool's own): the same rule, the same words
    with pytest.raises(ValueError, match="expected") as made:
        Limits().merged(limits)
    assert message in str(made.value)
    (name,) = limits
    assert refusal(name, limits[name]) in str(made.value)


@pytest.mark.spec("X13")
@pytest.mark.parametrize("item", ["NOPE=5", "__class__=5", "CPU=x", "CPU=5:y", "=5", "CPU"])
def test_X13_the_exec_wrapper_refuses_an_rlimit_it_does_not_know(item: str) -> None:
    argv = [sys.executable, "-I", "-S", confine_exec.__file__, "--rlimit", item, "--", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 126
    assert f"bad --rlimit {item}" in done.stderr
