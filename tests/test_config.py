"""The daemon's configuration: defaults < TOML file < environment < flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolpool.daemon.config import ConfigError, DaemonConfig, load_config
from toolpool.sandbox.limits import MiB


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
    config = load_config({"max_workers": 3, "min_workers": None}, env=env)
    assert config.min_workers == 1  # TOML (the flag was not given)
    assert config.max_workers == 3  # flag beats environment beats TOML
    assert config.max_tool_errors == 7  # environment
    assert config.max_tool_concurrency == 4  # TOML
    assert config.tool_modules == ("a.b", "c.d")  # environment list, comma-separated
    assert config.sandbox_disabled == frozenset({"landlock"})
    assert config.limits.wall_seconds == 45  # environment over [limits]
    assert config.limits.memory_bytes == 256 * MiB
    assert config.tool_limits == {"bash": {"wall_seconds": 600}}


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
        ("[limits]\nwall_seconds = -1\n", {}, "must be a positive number"),
        ("[tool_limits.bash]\nwarp = 1\n", {}, r"\[tool_limits.bash\]: unknown limit"),
        ("min_workers = = 1\n", {}, "config.toml"),
        ("", {"TOOLPOOL_MAX_WORKERS": "lots"}, "environment"),
        ("", {"TOOLPOOL_LOG_LEVEL": "loud"}, "expected debug, info"),
    ],
)
def test_bad_settings_say_where_they_came_from(
    tmp_path: Path, text: str, env: dict[str, str], problem: str
) -> None:
    toml = write(tmp_path / "config.toml", text)
    with pytest.raises(ConfigError, match=problem):
        load_config({}, env={"TOOLPOOL_CONFIG": str(toml), **env})


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
