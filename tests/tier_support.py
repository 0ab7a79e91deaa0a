"""The suite's two tiers: which tests are slow, and the guard that keeps the rest fast.

A test is ``slow`` when it starts a real pool, daemon, cluster, sandbox, worker or
any other process, or needs a fixture that does (and a few take seconds on their
own, a property of many examples or a race): every test of ``SLOW_MODULES``,
every test that uses a fixture of ``SLOW_FIXTURES`` (directly or through another
fixture), and the tests named in ``SLOW_TESTS``. The conftest marks them at
collection; ``-m "not slow"`` runs the rest — the planner, the scheduler, the
pipeline, the protocol, the client's core, the rules, the tools on real files, the
profiles and the providers — in this process.

The guard (``FastTier``, an audit hook) holds the line in every run, the whole
suite's too: a test not marked slow that starts a process — other than the few
commands the file tools run themselves (``FAST_COMMANDS``) — fails, and so does one
that uses a fixture that started a process, whoever set it up first. A slow test
cannot slip into the fast tier unnoticed: the failure says where to mark it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

# Modules whose tests start processes (or share a module's daemon or pool), nearly all
# of them; a pure test among them goes with them.
SLOW_MODULES = frozenset(
    {
        "test_anthropic_tools",
        "test_background_in_session",
        "test_background_shell_limits",
        "test_background_shells",
        "test_branching",
        "test_chatty_tools",
        "test_cli",
        "test_cli_says",
        "test_client_threads",
        "test_confinement_commands",
        "test_confinement_daemon",
        "test_confinement_files",
        "test_confinement_limits",
        "test_confinement_network",
        "test_daemon",
        "test_egress_approvals",
        "test_egress_pip",
        "test_egress_sessions",
        "test_floods",
        "test_frame_counts_worker",
        "test_images",
        "test_integration_langchain",
        "test_integration_openai_agents",
        "test_integration_pydantic_ai",
        "test_layer_room",
        "test_mcp_serve",
        "test_openai_tools",
        "test_pool",
        "test_pool_holding",
        "test_pool_recovery",
        "test_providers_sdk",
        "test_readme",
        "test_sandbox",
        "test_sandbox_retry",
        "test_session_environments",
        "test_session_images",
        "test_session_sandbox",
        "test_session_tools",
        "test_session_tools_admission",
        "test_shell_persistence",
        "test_tool_bash",
        "test_toolbox",
        "test_tools_in_workers",
        "test_unprivileged_daemon",
        "test_wheel",
        "test_worker_answers",
        "test_worker_frames",
    }
)

# Fixtures, by name, that start a daemon, a pool, a cluster or a run of the bench: a
# test that uses one is slow, in whichever module defines it. (A fixture that starts a
# process and is not named here fails the fast test that uses it: the guard.)
SLOW_FIXTURES = frozenset({"daemon", "pooled", "quick_run", "ray_nodes"})

# The rest, one by one ("module::function", for all its parameters): tests of
# otherwise fast modules that start a process themselves, and the few that take
# seconds on their own (a property of many examples, a race run on purpose).
SLOW_TESTS = frozenset(
    {
        "test_limits_kernel::test_X13_a_shell_of_its_own_gets_the_mapping_through_the_exec_wrapper",
        "test_limits_kernel::test_X13_a_shell_in_its_sessions_sandbox_gets_the_mapping_never_above_a_hard_limit",
        "test_limits_kernel::test_X13_a_worker_sets_its_own_once_and_each_calls_soft_limits_per_call",
        "test_limits_kernel::test_X13_the_exec_wrapper_refuses_an_rlimit_it_does_not_know",
        "test_arguments_fast_path::test_P5_the_fast_path_never_changes_a_verdict",
        "test_arguments_fast_path::test_P5_random_schemas_get_the_verdicts_jsonschema_gives",
        "test_confinement_paths::test_a_swapper_cannot_lead_read_write_edit_or_ls_outside",
        "test_confinement_paths::test_a_swapper_cannot_lead_glob_or_grep_outside",
        "test_branch_layers::test_B13_the_room_of_layers_let_go_is_free_whatever_namespace_holds_a_copy",
        "test_branch_layers::test_B13_an_unprivileged_daemons_removal_gets_past_the_modes_a_layer_set",
        "test_audit::test_R1_R2_every_call_of_the_daemon_is_one_line_and_sigterm_loses_none",
        "test_audit::test_R1_audit_without_a_log_says_how_to_get_one",
        "test_audit_hostile::test_R6_a_daemon_with_a_planted_audit_log_says_so_in_one_line",
        "test_audit_hostile::test_R7_a_fifo_at_the_path_is_refused_not_waited_on",
        "test_audit_hostile::test_R7_a_lone_surrogate_or_a_byte_not_utf8_is_printed_not_the_end",
        "test_audit_hostile::test_R7_hostile_names_print_one_escaped_line_per_record",
        "test_audit_hostile::test_R7_json_lines_are_escaped_valid_and_parse_back_to_the_records",
        "test_config_properties::test_E2_a_daemon_with_a_bad_setting_says_so_in_one_line",
        "test_config_properties::test_E2_daemon_start_shows_this_runs_own_error",
        "test_confinement_paths::test_X8_a_call_id_cannot_name_a_spill_file_elsewhere",
        "test_egress_rules::test_N3_a_daemon_not_run_as_root_refuses_a_policy_namespace_saying_so",
        "test_mcp_import::test_D1_a_daemon_killed_outright_takes_its_bridges_and_servers_along",
        "test_mcp_import::test_D2_a_dead_bridge_is_an_error_result",
        "test_mcp_import::test_T5_a_server_reached_over_http_is_imported_too",
        "test_mcp_import::test_the_daemon_refuses_a_bad_mcp_servers_file",
        "test_ray::test_a_tethered_process_dies_with_its_parent",
        "test_ray::test_the_tether_does_not_start_an_orphan",
        "test_ray::test_what_dead_actors_left_is_removed_and_only_that",
        "test_session_root::test_V12_a_dead_daemons_layers_are_unmounted_at_the_next_start",
        "test_shell_bounds::test_L9_a_shells_cpu_rlimit_warns_with_sigxcpu_a_second_before_its_sigkill",
        "test_terminate::test_D4_real_processes_term_then_kill",
        "test_tiers::test_a_slow_test_may_start_processes",
        "test_tiers::test_a_fast_test_that_needs_a_process_fixture_fails_and_says_where_to_mark_it",
        "test_tool_apply_patch::test_a_session_applies_a_multi_file_patch_and_a_multi_edit",
        "test_tool_edit_write::test_F9_stale_refusals_through_a_daemon_across_two_workers",
        "test_tool_path_messages::test_the_spill_file_of_bash_is_named_absolutely",
        "test_worker_imports::test_the_zygote_loads_neither_the_client_nor_asyncio_nor_jsonschema",
        "test_worker_per_call::test_D2_a_call_counts_the_cpu_of_the_children_it_reaped_and_the_next_does_not",
        "test_worker_per_call::test_D2_an_idle_worker_keeps_heartbeating",
        "test_worker_per_call::test_D4_a_call_after_one_that_replaced_the_cancel_handler_is_still_cancellable",
        "test_worker_per_call::test_D4_has_children_answers_for_running_and_exited_children",
        "test_worker_per_call::test_D4_process_group_members_are_every_process_of_the_group",
        "test_workspace_overlay::test_V14_without_session_sandboxes_each_command_gets_the_overlay_bound_in_its_own",
    }
)

# What the fast tier may start: the commands the file tools run themselves (grep and
# glob's ripgrep, and ldd for what ripgrep needs under Landlock) and git, which the
# tests of a session's changes compare against.
FAST_COMMANDS = frozenset({"rg", "ldd", "git"})

HOW_TO_MARK = (
    "a test that starts a process is slow: name it in tests/tier_support.py "
    "(SLOW_MODULES, SLOW_FIXTURES or SLOW_TESTS)"
)


def is_slow(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the slow tier, by its module, fixtures or name."""
    module = Path(str(item.path)).stem
    if module in SLOW_MODULES or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    name = getattr(item, "originalname", item.name)
    return f"{module}::{name}" in SLOW_TESTS


class StartedInFastTier(Exception):
    """A test of the fast tier started a process, or needs a fixture that did."""


def started_program(event: str, args: tuple[Any, ...]) -> list[str] | None:
    """The command line an audit event starts a process with; None for any other
    event. A fork (``os.fork``, ``os.forkpty``) starts this program again."""
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        line = [argv] if isinstance(argv, str | bytes | os.PathLike) else list(argv)
        return [_text(line[0] if executable is None else executable), *map(_text, line[1:])]
    if event in ("os.posix_spawn", "os.posix_spawnp"):
        return [_text(args[0]), *map(_text, list(args[1])[1:])]
    if event == "os.spawn":
        return [_text(args[1]), *map(_text, list(args[2])[1:])]
    if event == "os.system":
        return ["/bin/sh", "-c", _text(args[0])]
    if event in ("os.fork", "os.forkpty"):
        return ["fork"]
    return None


def _text(word: Any) -> str:
    return os.fsdecode(word) if isinstance(word, str | bytes | os.PathLike) else str(word)


def _shown(line: Sequence[str]) -> str:
    return " ".join(line[:6]) + (" …" if len(line) > 6 else "")


class FastTier:
    """The guard: an audit hook (``sys.addaudithook(guard.audit)``) that refuses a
    process started while a test of the fast tier sets up or runs, and a record of
    the fixtures that started one (``process_fixtures``: (where defined, name))."""

    def __init__(self) -> None:
        self.test: str | None = None  # the fast test being set up or run
        self.started: list[str] = []  # what it started (or tried to)
        self.processes = 0  # processes started in this run, any test's, any fixture's
        self.process_fixtures: set[tuple[str, str]] = set()

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        line = started_program(event, args)
        if line is None or os.path.basename(line[0]) in FAST_COMMANDS:
            return
        self.processes += 1
        if self.test is not None:
            what = f"{self.test} started {_shown(line)}"
            self.started.append(what)
            raise StartedInFastTier(f"{what}: {HOW_TO_MARK}")

    @contextlib.contextmanager
    def watching(self, item: pytest.Item) -> Iterator[None]:
        """While ``item`` (unless slow) sets up or runs: what it starts is refused, and
        fails it even when the code it ran swallowed the refusal."""
        if item.get_closest_marker("slow") is not None:
            yield
            return
        self.test = item.nodeid
        try:
            yield
        finally:
            self.test = None
            started, self.started = self.started, []
        if started:
            raise StartedInFastTier(f"{'; '.join(started)}: {HOW_TO_MARK}")

    @contextlib.contextmanager
    def fixture(self, where: str, name: str) -> Iterator[None]:
        """Around a fixture's setup: remember it if it started a process."""
        before = self.processes
        try:
            yield
        finally:
            if self.processes != before:
                self.process_fixtures.add((where, name))

    def check_fixtures(self, item: pytest.Item) -> None:
        """A fast test must not use a fixture that started a process (in this run,
        for this test or one before it)."""
        if item.get_closest_marker("slow") is not None:
            return
        definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
        used = sorted(
            name
            for name in getattr(item, "fixturenames", ())
            if definitions.get(name)
            and (definitions[name][-1].baseid, name) in self.process_fixtures
        )
        if used:
            raise StartedInFastTier(
                f"{item.nodeid} uses {', '.join(used)}, which started a process: {HOW_TO_MARK}"
            )

    @contextlib.contextmanager
    def refused(self) -> Iterator[list[str]]:
        """For the guard's own tests: the processes the body started are refused, and
        the refusals, forgiven, are given back instead of failing the test."""
        refusals: list[str] = []
        with contextlib.suppress(StartedInFastTier):
            yield refusals
        refusals.extend(self.started)
        self.started.clear()
