"""The daemon's configuration: defaults < TOML file < environment < flags."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from toolpool.daemon.config import POOL_SETTINGS, DaemonConfig, load_config, tool_registry
from toolpool.daemon.config_table import LIMIT_SETTINGS, SETTINGS, ConfigError
from toolpool.pool import PoolConfig
from toolpool.sandbox.limits import Limits, MiB
from toolpool.sandbox.policy import Policy


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults_without_any_file(tmp_path: Path) -> None:
    config = load_config({}, env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert config == DaemonConfig(runtime_dir=config.runtime_dir)
    assert config.tool_modules == ("toolpool.tools",)


def test_each_layer_is_stronger_than_the_one_before(tmp_path: Path) -> None:
    toml = write(
        tmp_path / "config.toml",
        """
        min_workers = 1
        max_workers = 6
        max_tool_concurrency = 4
        tool_modules = ["toolpool.tools", "my.tools"]
        sandbox_disabled = ["landlock"]

        [limits]
        wall_seconds = 30
        memory_bytes = 268435456

        [tool_limits.bash]
        wall_seconds = 600
        """,
    )
    env = {
        "TOOLPOOL_CONFIG": str(toml),
        "TOOLPOOL_MAX_WORKERS": "5",
        "TOOLPOOL_MAX_TOOL_ERRORS": "7",
        "TOOLPOOL_LIMITS_WALL_SECONDS": "45",
        "TOOLPOOL_TOOL_MODULES": "a.b, c.d",
    }
    # a.b and c.d are only names here: whether they import is not this test's question
    config = load_config({"max_workers": 3, "min_workers": None}, env=env, check_modules=False)
    assert config.min_workers == 1  # TOML (the flag was not given)
    assert config.max_workers == 3  # flag beats environment beats TOML
    assert config.max_tool_errors == 7  # environment
    assert config.max_tool_concurrency == 4  # TOML
    assert config.tool_modules == ("a.b", "c.d")  # environment list, comma-separated
    assert config.sandbox_disabled == frozenset({"landlock"})
    assert config.limits.wall_seconds == 45  # environment over [limits]
    assert config.limits.memory_bytes == 256 * MiB
    assert config.tool_limits == {"bash": {"wall_seconds": 600.0}}


def test_xdg_config_path_is_read(tmp_path: Path) -> None:
    (tmp_path / "toolpool").mkdir()
    write(tmp_path / "toolpool" / "config.toml", "max_tool_concurrency = 2\n")
    assert load_config({}, env={"XDG_CONFIG_HOME": str(tmp_path)}).max_tool_concurrency == 2


@pytest.mark.parametrize(
    ("text", "env", "problem"),
    [
        ("colour = 'blue'\n", {}, "unknown setting 'colour'"),
        ("min_workers = 'many'\n", {}, "min_workers = 'many'"),
        ("[limits]\nwarp = 9\n", {}, "unknown limit 'warp'"),
        ("[limits]\nwall_seconds = -1\n", {}, r"\[limits\]: wall_seconds = -1: expected a number"),
        ("[tool_limits.bash]\nwarp = 1\n", {}, r"\[tool_limits.bash\]: unknown limit"),
        ("min_workers = = 1\n", {}, "config.toml"),
        ("", {"TOOLPOOL_MAX_WORKERS": "lots"}, "environment TOOLPOOL_MAX_WORKERS: max_workers"),
        ("", {"TOOLPOOL_LOG_LEVEL": "loud"}, "expected one of debug, info"),
        ("min_workers = 5\n", {"TOOLPOOL_MAX_WORKERS": "2"}, "min_workers = 5 .*config.toml"),
        ("max_workers = 4.5\n", {}, "max_workers = 4.5: expected an integer"),
        ("max_workers = '4'\n", {}, "max_workers = '4': expected an integer"),  # TOML has types
        ("sandbox_disabled = ['bwrapp']\n", {}, "'bwrapp' is not allowed: .* session, netns"),
        ("require_sandbox = 'bwrap'\n", {}, "expected a list of sandbox mechanisms"),
        ("tool_modules = ['no_such_module_here']\n", {}, "no module 'no_such_module_here'"),
        ("tcp = 'localhost'\n", {}, "expected HOST:PORT"),
        ("curve_secret_key = 'k'\n", {}, "curve_secret_key = .* needs curve_authorized_keys"),
        ("max_worker = 4\n", {}, "did you mean 'max_workers'"),
    ],
)
def test_bad_settings_say_where_they_came_from(
    tmp_path: Path, text: str, env: dict[str, str], problem: str
) -> None:
    toml = write(tmp_path / "config.toml", text)
    with pytest.raises(ConfigError, match=problem) as refused:
        load_config({}, env={"TOOLPOOL_CONFIG": str(toml), **env})
    assert "\n" not in str(refused.value)


def test_an_explicit_config_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no configuration file"):
        load_config({"config": tmp_path / "missing.toml"}, env={})


def test_mcp_servers_file_from_toml_environment_or_flag(tmp_path: Path) -> None:
    toml = write(tmp_path / "config.toml", 'mcp_servers = "~/.config/toolpool/mcp.json"\n')
    from_toml = load_config({}, env={"TOOLPOOL_CONFIG": str(toml)})
    from_env = load_config(
        {}, env={"XDG_CONFIG_HOME": str(tmp_path), "TOOLPOOL_MCP_SERVERS": "e.json"}
    )
    from_flag = load_config(
        {"mcp_servers": tmp_path / "f.json"}, env={"TOOLPOOL_CONFIG": str(toml)}
    )
    assert load_config({}, env={"XDG_CONFIG_HOME": str(tmp_path)}).mcp_servers is None
    assert from_toml.mcp_servers == Path(os.path.expanduser("~/.config/toolpool/mcp.json"))
    assert from_env.mcp_servers == Path("e.json")
    assert from_flag.mcp_servers == tmp_path / "f.json"


@pytest.mark.spec("E2")
def test_every_setting_has_one_description_in_the_table() -> None:
    # A setting added to DaemonConfig without its row would be read from nowhere (the
    # tables, [limits], [tool_limits.TOOL] and [network_resolve], have readers of their own).
    tables = {"limits", "tool_limits", "network_resolve"}
    fields = {f.name for f in dataclasses.fields(DaemonConfig)} - tables
    assert [s.name for s in SETTINGS] == [
        f.name for f in dataclasses.fields(DaemonConfig) if f.name in fields
    ]
    assert {s.name for s in LIMIT_SETTINGS} == {
        f.name for f in dataclasses.fields(DaemonConfig().limits)
    }
    for setting in (*SETTINGS, *LIMIT_SETTINGS):
        assert setting.doc and setting.kind.allowed


@pytest.mark.spec("E2")
def test_a_config_made_in_code_meets_the_same_table() -> None:
    with pytest.raises(ConfigError, match=r"min_workers = 3 .* max_workers = 2"):
        DaemonConfig(min_workers=3, max_workers=2)
    with pytest.raises(ConfigError, match="sandbox_disabled"):
        DaemonConfig(sandbox_disabled=frozenset({"bwrapp"}))


@pytest.mark.spec("E3")
def test_flags_limits_and_tool_limits_as_text(tmp_path: Path) -> None:
    toml = write(tmp_path / "c.toml", "[tool_limits.bash]\nwall_seconds = 600\nnetwork = true\n")
    config = load_config(
        {
            "config": toml,
            "worker_cpus": "0.5",
            "cancel_grace": "3",
            "tool_modules": "toolpool.tools, tests.worker_tools",
            "private_run": "false",
            "limits": {"memory_bytes": "1048576", "network": "yes"},
            "tool_limit": ["bash.wall_seconds=30", "grep.output_bytes=4096"],
        },
        env={"TOOLPOOL_LIMITS_MEMORY_BYTES": "2097152"},
    )
    assert (config.worker_cpus, config.cancel_grace) == (0.5, 3.0)
    assert config.tool_modules == ("toolpool.tools", "tests.worker_tools")
    assert config.private_run is False
    assert config.limits.memory_bytes == MiB  # the flag over the environment
    assert config.limits.network is True
    assert config.tool_limits == {
        "bash": {"wall_seconds": 30.0, "network": True},  # the flag over the file, per limit
        "grep": {"output_bytes": 4096},
    }


@pytest.mark.spec("E3")
@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ("bash", "expected TOOL.LIMIT=VALUE"),
        ("bash.wall_seconds", "expected TOOL.LIMIT=VALUE"),
        ("bash.wall_secs=3", "unknown limit 'wall_secs' .did you mean 'wall_seconds'"),
        ("bash.wall_seconds=soon", "flag --tool-limit bash.wall_seconds: wall_seconds = 'soon'"),
    ],
)
def test_a_bad_tool_limit_flag_says_which(item: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config({"tool_limit": [item]}, env={})


def test_a_tool_module_that_fails_is_one_line_naming_it(tmp_path: Path) -> None:
    broken = write(tmp_path / "broken.py", "import no_such_dependency_here\n")
    load_config({"tool_modules": str(broken)}, env={})  # it is there: found
    with pytest.raises(ConfigError, match=r"broken.py' cannot be loaded: ModuleNotFoundError"):
        tool_registry([str(broken)])
    assert [spec.name for spec in tool_registry(["tests.worker_tools"])][:1]


def test_the_readmes_configuration_example_loads(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Configuration") :]
    example = section[
        section.index("```toml\n") + 8 : section.index("\n```", section.index("```toml"))
    ]
    toml = write(tmp_path / "config.toml", example)
    # my_package.tools is the reader's: only the names are judged here
    config = load_config({}, env={"TOOLPOOL_CONFIG": str(toml)}, check_modules=False)
    assert config.tool_modules == ("toolpool.tools", "my_package.tools")
    assert config.tool_limits == {"bash": {"memory_bytes": 2 * 1024 * MiB}}
    assert config == DaemonConfig(
        runtime_dir=config.runtime_dir,
        tool_modules=config.tool_modules,
        tool_limits=config.tool_limits,
    )  # every other value in it is the default it documents


# -- the pool's configuration, made from the daemon's ---------------------------------------


def _changed(value: Any) -> Any:
    """A value of the kind of ``value``, other than it, that the setting allows."""
    match value:
        case bool():
            return not value
        case int():
            return value + 1
        case float():
            return value + 0.5
        case frozenset():
            return frozenset({"landlock"})  # sandbox_disabled
        case Limits():
            return dataclasses.replace(value, wall_seconds=7.0, processes=9)
        case dict():
            return {"pinned.example": ("127.0.0.1", 8080)}  # network_resolve
    raise AssertionError(f"no other value for {value!r}: teach _changed its kind")


@pytest.mark.spec("E11")
def test_E11_every_setting_the_pool_has_reaches_it_as_set(tmp_path: Path) -> None:
    # Given a daemon's configuration with every setting the pool has too off its default
    assert {"min_workers", "max_workers", "limits", "hold_calls", "layer_bytes"} <= set(
        POOL_SETTINGS
    )
    changed = {name: _changed(getattr(DaemonConfig(), name)) for name in POOL_SETTINGS}
    config = DaemonConfig(
        **changed, image_dirs=(str(tmp_path / "images"),), image_cache=tmp_path / "cache"
    )
    policy = Policy(hidden=("/secret",), private_run=False)
    # When the daemon makes its pool's configuration
    pool = config.pool_config(
        runtime_dir=tmp_path / "workers-1", tool_modules=("a", "b.py"), policy=policy
    )
    # Then each of them is there as set, and what the daemon made as it made it
    assert {name: getattr(pool, name) for name in POOL_SETTINGS} == changed
    assert (pool.runtime_dir, pool.tool_modules, pool.policy) == (
        tmp_path / "workers-1",
        ("a", "b.py"),
        policy,
    )
    assert (pool.image_dirs, pool.image_cache) == ((tmp_path / "images",), tmp_path / "cache")


@pytest.mark.spec("E11")
def test_E11_a_setting_the_pool_has_too_has_the_pools_default(tmp_path: Path) -> None:
    # Given the defaults: a daemon's configuration and a program's pool
    daemon, program = DaemonConfig(), PoolConfig()
    # Then every setting they share has one default
    assert {n: getattr(daemon, n) for n in POOL_SETTINGS} == {
        n: getattr(program, n) for n in POOL_SETTINGS
    }
    # And the daemon's pool differs from a program's only in what the daemon makes
    made = daemon.pool_config(runtime_dir=tmp_path, tool_modules=("x",), policy=Policy())
    unmade = dataclasses.replace(made, runtime_dir=None, tool_modules=(), policy=program.policy)
    assert unmade == program  # the image cache nobody set is the pool's own default too
