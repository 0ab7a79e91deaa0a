"""Sandbox: limits, confinement, spawning and ending processes (SPEC D3, D4).

Knows nothing of tools. The worker and the coordinator build on it.
"""

from toolpool.sandbox.command import Confinement, confined
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.profile import SandboxProfile, active_profile, set_active_profile
from toolpool.sandbox.terminate import (
    CgroupMembers,
    Escalation,
    ProcessGroup,
    ProcessTree,
    TerminationReport,
    Together,
    terminate,
)

__all__ = [
    "CgroupMembers",
    "Confinement",
    "Escalation",
    "Limits",
    "ProcessGroup",
    "ProcessTree",
    "SandboxProfile",
    "TerminationReport",
    "Together",
    "active_profile",
    "confined",
    "set_active_profile",
    "terminate",
]
