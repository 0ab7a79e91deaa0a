"""Every setting, fed wrong types and values through the file, the environment and the
flags, is refused in one line naming the setting and where it came from (SPEC E2,
E3); a few real ``toolpool daemon run`` / ``daemon start`` runs with bad settings end
with that line, the configuration's exit code, no traceback and nothing left running.

The wrong values are drawn from each setting's kind, with oracles of their own (a
regular expression for an integer, Python's ``float`` for a number), not from the
loader's parsers.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolpool.cli import build_parser
from toolpool.cli.daemon import daemon_flags
from toolpool.client.control import ExitCode
from toolpool.daemon.config import load_config
from toolpool.daemon.config_table import LIMIT_SETTINGS, SETTINGS, ConfigError, Setting
from toolpool.daemon.value_kinds import (
    Address,
    Boolean,
    Choice,
    Integer,
    Names,
    Number,
    PathKind,
)

from .daemon_support import ROOT, daemon_env

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- wrong values, by kind -----------------------------------------------------------------

_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_LISTS = st.lists(_SCALARS, max_size=3)
_TABLES = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2)


def _wrong_native(setting: Setting) -> st.SearchStrategy[Any]:
    """TOML values the setting must refuse: a wrong type, or out of range."""
    kind = setting.kind
    others = st.one_of(_LISTS, _TABLES)
    match kind:
        case Integer():
            return st.one_of(
                st.booleans(),
                st.floats(allow_nan=False, allow_infinity=False),
                st.text(max_size=8),
                others,
                st.integers(max_value=kind.minimum - 1),
            )
        case Number():
            low = st.floats(max_value=kind.minimum, exclude_max=not kind.above)
            return st.one_of(st.booleans(), st.text(max_size=8), others, low)
        case Boolean():
            return st.one_of(st.integers(), st.floats(allow_nan=False), st.text(), others)
        case Choice():
            wrong = st.text(max_size=10).filter(lambda s: s.strip().lower() not in kind.choices)
            return st.one_of(wrong, st.integers(), st.booleans(), others)
        case PathKind():
            blank = st.text(alphabet=" \t", max_size=3)
            return st.one_of(blank, st.integers(), st.booleans(), st.floats(), others)
        case Address():
            return st.one_of(_bad_addresses(), st.integers(), st.booleans(), others)
        case Names():
            not_a_list = st.one_of(st.integers(), st.booleans(), st.text(), _TABLES)
            has_a_non_string = st.lists(st.one_of(st.integers(), st.booleans()), min_size=1)
            bad = st.lists(_bad_name(setting), min_size=1, max_size=2)
            return st.one_of(not_a_list, has_a_non_string, bad)
    raise AssertionError(f"no strategy for {kind}")


def _wrong_text(setting: Setting) -> st.SearchStrategy[str] | None:
    """Text (a variable, a flag) the setting must refuse; None when there is none: a
    list of paths takes any text."""
    kind = setting.kind
    match kind:
        case Integer():
            integer = re.compile(r"\s*[+-]?[0-9]+\s*")
            return st.one_of(
                st.text(max_size=8).filter(lambda s: not integer.fullmatch(s)),
                st.integers(max_value=kind.minimum - 1).map(str),
            )
        case Number():
            low = st.floats(max_value=kind.minimum, exclude_max=not kind.above).map(repr)
            return st.one_of(
                st.text(max_size=8).filter(lambda s: not _finite_number(s)),
                st.sampled_from(["nan", "inf", "-inf"]),
                low,
            )
        case Boolean():
            words = ("true", "1", "yes", "on", "false", "0", "no", "off")
            return st.text(max_size=6).filter(lambda s: s.strip().lower() not in words)
        case Choice():
            return st.text(max_size=10).filter(lambda s: s.strip().lower() not in kind.choices)
        case PathKind():
            return st.text(alphabet=" \t", max_size=3)
        case Address():
            return _bad_addresses()
        case Names() if kind.choices is None and kind.pattern is None and not _modules(setting):
            return None
        case Names():
            good = st.sampled_from(kind.choices) if kind.choices else st.just("")
            items = st.lists(good, max_size=2).flatmap(
                lambda ok: _bad_name(setting).map(lambda bad: [*ok, bad])
            )
            return items.map(",".join)
    raise AssertionError(f"no strategy for {kind}")


def _modules(setting: Setting) -> bool:
    return setting.name == "tool_modules"


def _bad_name(setting: Setting) -> st.SearchStrategy[str]:
    kind = setting.kind
    assert isinstance(kind, Names)
    if _modules(setting):  # a module no one has
        return st.from_regex(r"no_such_module_[a-z]{1,8}", fullmatch=True)
    word = st.text(alphabet=st.characters(blacklist_characters=",\0"), min_size=1, max_size=10)
    if kind.choices is not None:
        return word.filter(lambda s: s.strip() and s.strip() not in kind.choices)
    if kind.pattern is not None:
        pattern = re.compile(kind.pattern)
        return word.filter(lambda s: s.strip() and not pattern.fullmatch(s.strip()))
    return st.just("")


def _bad_addresses() -> st.SearchStrategy[str]:
    return st.one_of(
        # A TOML file is UTF-8: no lone surrogate (st.characters alone may draw one).
        st.text(
            alphabet=st.characters(blacklist_characters=":", blacklist_categories=("Cs",)),
            max_size=10,
        ),
        st.sampled_from([":80", "[]:80", "host:65536", "host:99999", "host:", "host:http"]),
    )


def _finite_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def toml_value(value: Any) -> str:
    """A Python value as TOML (what the strategies draw: scalars, lists, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes are TOML's, but TOML forbids a raw DEL
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


# --- the loader, in-process ----------------------------------------------------------------


def refused(flags: dict[str, Any], env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(flags, env=env)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def _every(settings_: tuple[Setting, ...]) -> st.SearchStrategy[Setting]:
    return st.sampled_from(settings_)


@pytest.mark.spec("E2")
@PROPERTY
@given(data=st.data(), setting=_every(SETTINGS))
def test_E2_a_wrong_value_in_the_file_is_one_line_naming_it(
    data: st.DataObject, setting: Setting
) -> None:
    value = data.draw(_wrong_native(setting))
    with tempfile.TemporaryDirectory(prefix="cfgprop-") as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(f"{setting.name} = {toml_value(value)}\n")
        message = refused({}, {"TOOLPOOL_CONFIG": str(path)})
    assert setting.name in message
    assert str(path) in message


@pytest.mark.spec("E2")
@PROPERTY
@given(data=st.data(), setting=_every(LIMIT_SETTINGS), table=st.sampled_from(["limits", "bash"]))
def test_E2_a_wrong_limit_in_the_file_is_one_line_naming_it(
    data: st.DataObject, setting: Setting, table: str
) -> None:
    value = data.draw(_wrong_native(setting))
    header = "[limits]" if table == "limits" else "[tool_limits.bash]"
    with tempfile.TemporaryDirectory(prefix="cfgprop-") as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(f"{header}\n{setting.name} = {toml_value(value)}\n")
        message = refused({}, {"TOOLPOOL_CONFIG": str(path)})
    assert f"{path} {header}: {setting.name} = " in message


@pytest.mark.spec("E2")
@PROPERTY
@given(data=st.data(), setting=_every((*SETTINGS, *LIMIT_SETTINGS)))
def test_E2_a_wrong_variable_is_one_line_naming_it(data: st.DataObject, setting: Setting) -> None:
    wrong = _wrong_text(setting)
    if wrong is None:
        return  # every text is a list of paths
    text = data.draw(wrong.filter(lambda s: "\0" not in s))  # no variable holds a NUL
    message = refused({}, {setting.env: text})
    assert f"environment {setting.env}: {setting.name} = " in message


@pytest.mark.spec("E2", "E3")
@PROPERTY
@given(data=st.data(), setting=_every((*SETTINGS, *LIMIT_SETTINGS)))
def test_E3_a_wrong_flag_is_one_line_naming_it(data: st.DataObject, setting: Setting) -> None:
    wrong = _wrong_text(setting)
    if wrong is None:
        return
    text = data.draw(wrong)
    # The flag as the command line parses it, then the loader: the real path of a flag.
    args = build_parser().parse_args(["daemon", "start", f"{setting.flag}={text}"])
    message = refused(daemon_flags(args), {})
    assert f"flag {setting.flag}: {setting.name} = " in message


@pytest.mark.spec("E2", "E3")
@PROPERTY
@given(
    data=st.data(),
    setting=_every(LIMIT_SETTINGS),
    tool=st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
)
def test_E3_a_wrong_tool_limit_flag_is_one_line_naming_it(
    data: st.DataObject, setting: Setting, tool: str
) -> None:
    wrong = _wrong_text(setting)
    assert wrong is not None
    text = data.draw(wrong.filter(lambda s: s.strip() == s))
    item = f"{tool}.{setting.name}={text}"
    args = build_parser().parse_args(["daemon", "start", "--tool-limit", item])
    message = refused(daemon_flags(args), {})
    assert f"flag --tool-limit {tool}.{setting.name}: {setting.name} = {text!r}" in message


# --- real runs -----------------------------------------------------------------------------


def toolpool(
    tmp: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolpool", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**daemon_env(tmp), **(env or {})},
        timeout=120,
        check=False,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("toolpool: error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


@pytest.mark.spec("E2")
@pytest.mark.parametrize("action", ["run", "start"])
@pytest.mark.parametrize(
    ("flags", "env", "file", "expected"),
    [
        (["--max-workers=-1"], {}, "", "flag --max-workers: max_workers = '-1'"),
        (["--max-workers", "2"], {"TOOLPOOL_MIN_WORKERS": "5"}, "", "min_workers = 5 (environment"),
        (["--sandbox-disabled", "bwrapp"], {}, "", "'bwrapp' is not allowed"),
        (["--tool-module", "no_such_tools"], {}, "", "no module 'no_such_tools'"),
        ([], {}, "max_workers = 'four'\n", "config.toml: max_workers = 'four'"),
    ],
)
def test_E2_a_daemon_with_a_bad_setting_says_so_in_one_line(
    tmp_path: Path,
    action: str,
    flags: list[str],
    env: dict[str, str],
    file: str,
    expected: str,
) -> None:
    runtime = tmp_path / "rt"
    config = tmp_path / "config.toml"
    config.write_text(file)
    done = toolpool(
        tmp_path, "daemon", action, "--runtime-dir", str(runtime), "--config", str(config),
        *flags, env=env,
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE
    assert expected in one_error_line(done)
    assert not (runtime / "daemon.pid").exists()  # no daemon runs


@pytest.mark.spec("E2")
def test_E2_daemon_start_shows_this_runs_own_error(tmp_path: Path) -> None:
    # A module that is there (the configuration finds it) but fails as the daemon
    # imports it: only the daemon itself can tell, and start shows its line.
    module = tmp_path / "failing_tools.py"
    runtime = tmp_path / "rt"
    for reason in ("the first reason", "the second reason"):
        module.write_text(f"raise RuntimeError({reason!r})\n")
        done = toolpool(
            tmp_path, "daemon", "start", "--runtime-dir", str(runtime),
            "--min-workers=1", f"--tool-modules=toolpool.tools,{module}",
        )  # fmt: skip
        assert done.returncode == ExitCode.FAILED
        line = one_error_line(done)
        assert "the daemon exited at start" in line
        assert f"RuntimeError: {reason}" in line
        assert not (runtime / "daemon.pid").exists()
    assert "the first reason" not in line  # the log holds both; start shows its own
    assert "the first reason" in (runtime / "daemon.log").read_text()
