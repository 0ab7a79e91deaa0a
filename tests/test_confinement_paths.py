"""Race-free path resolution (SPEC X4) and hidden paths in the file tools (X9).

The adversarial part: a thread exchanges a workspace directory and a symlink to an
outside directory (renameat2 RENAME_EXCHANGE) as fast as it can while the file tools
work through both names; nothing from outside may come back, nothing outside may be
created or changed.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolpool import ToolCall, ToolError
from toolpool.engine import Coordinator
from toolpool.sandbox.policy import Policy, active_policy, set_active_policy
from toolpool.sandbox.profile import active_profile
from toolpool.tool import ToolContext
from toolpool.tools import FILE_TOOLS, read_tool, write_tool
from toolpool.tools.bash import bash
from toolpool.tools.support.paths import Access, open_beneath, open_path, resolve
from toolpool.tools.support.ripgrep import run_ripgrep

from .tool_support import read_whole, text, tool_context

MARKER = "OUTSIDE-7f3a9c2e51d04b8e"
# Seconds each tool runs against the swapper: 6 tools, about 11 s in all.
_SECONDS_PER_TOOL = 1.8
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_RENAMEAT2_SYSCALL = {"x86_64": 316, "aarch64": 276}


def _tool(name: str) -> Any:
    tools: list[Any] = list(FILE_TOOLS)
    (tool,) = [t for t in tools if t.name == name]
    return tool


def _exchanger() -> Callable[[bytes, bytes], int]:
    """renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE): libc's, or the syscall."""
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "renameat2"):
        fn = libc.renameat2
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
        fn.argtypes += [ctypes.c_uint]
        return lambda a, b: int(fn(_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE))
    number = _RENAMEAT2_SYSCALL.get(os.uname().machine)
    if number is None:
        pytest.skip(f"no renameat2 number known for {os.uname().machine}")
    libc.syscall.restype = ctypes.c_long
    return lambda a, b: int(libc.syscall(number, _AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE))


class Swapper:
    """A thread exchanging two names as fast as it can, until stopped."""

    def __init__(self, a: Path, b: Path) -> None:
        self.a, self.b = os.fsencode(a), os.fsencode(b)
        self.exchange = _exchanger()
        self.swaps = 0
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="swapper", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.exchange(self.a, self.b) == 0:
                self.swaps += 1
            else:
                self.failures += 1

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.fixture
def arena(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with a directory ``d`` and a symlink ``l`` to an outside directory
    that holds the marker, in a file's content and in a file's name."""
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    (workspace / "d").mkdir(parents=True)
    outside.mkdir()
    (workspace / "d" / "f.txt").write_text("inside content A\n")
    (outside / "f.txt").write_text(f"content {MARKER}\n")
    (outside / f"{MARKER}.txt").write_text(f"content {MARKER}\n")
    (outside / "sub").mkdir()
    (workspace / "l").symlink_to(outside)
    return workspace, outside


def _snapshot(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``directory``: (mode, size, mtime), by relative path."""
    found: dict[str, tuple[int, int, int]] = {}
    for parent, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(parent, name))
            rel = os.path.relpath(os.path.join(parent, name), directory)
            found[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
    st = os.lstat(directory)
    found["."] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def _hammer(seconds: float, call: Callable[[str, int], str]) -> tuple[int, int]:
    """Call ``call(name, i)`` with ``name`` "d" and "l" in turn for ``seconds``;
    each output, or refusal, must hold nothing from outside. (ok, refused) counts."""
    ok = refused = i = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        i += 1
        try:
            output = call("dl"[i % 2], i)
            ok += 1
        except ToolError as exc:
            output = exc.message
            refused += 1
        assert MARKER not in output, output
    return ok, refused


def _read(ctx: ToolContext) -> Callable[[str, int], str]:
    near_miss = MARKER[:-1] + "x.txt"  # missing: suggestions must not list outside

    def call(name: str, i: int) -> str:
        # A file, the directory itself, or a missing file named like the one outside
        path = (f"{name}/f.txt", name, f"{name}/{near_miss}")[i % 3]
        return text(read_tool.execute({"path": path}, ctx))

    return call


def _write(ctx: ToolContext) -> Callable[[str, int], str]:
    def call(name: str, i: int) -> str:
        path = f"{name}/new-{i}.txt" if i % 4 else f"{name}/made-{i}/deeper/new.txt"
        return str(write_tool.execute({"path": path, "content": f"written {i}\n"}, ctx))

    return call


def _edit(ctx: ToolContext) -> Callable[[str, int], str]:
    edit = _tool("edit")

    def call(name: str, i: int) -> str:
        path = f"{name}/f.txt"
        seen = text(read_tool.execute({"path": path}, ctx))
        assert MARKER not in seen
        letter = re.search(r"inside content (\w)", seen)
        assert letter is not None, seen
        old = letter.group(0)
        new = "inside content " + ("B" if letter.group(1) == "A" else "A")
        return str(edit.execute({"path": path, "old_string": old, "new_string": new}, ctx))

    return call


def _ls(ctx: ToolContext) -> Callable[[str, int], str]:
    ls = _tool("ls")
    return lambda name, i: str(ls.execute({"path": name if i % 3 else "."}, ctx))


def _glob(ctx: ToolContext) -> Callable[[str, int], str]:
    glob = _tool("glob")
    return lambda name, i: str(
        glob.execute({"pattern": "**/*.txt", **({"path": name} if i % 3 else {})}, ctx)
    )


def _grep(ctx: ToolContext) -> Callable[[str, int], str]:
    grep = _tool("grep")

    def call(name: str, i: int) -> str:
        args: dict[str, Any] = {"pattern": "content", "output_mode": "content"}
        if i % 3 == 0:
            args["path"] = name
        elif i % 3 == 1:
            args["path"] = f"{name}/f.txt"
        return str(grep.execute(args, ctx))

    return call


def _run_against_swapper(
    arena: tuple[Path, Path], tools: list[Callable[[ToolContext], Callable[[str, int], str]]]
) -> None:
    workspace, outside = arena
    ctx = tool_context(workspace)
    before = _snapshot(outside)
    results: dict[str, tuple[int, int]] = {}
    with Swapper(workspace / "d", workspace / "l") as swapper:
        for make in tools:
            results[make.__name__] = _hammer(_SECONDS_PER_TOOL, make(ctx))
    # Then nothing outside was created or changed
    assert _snapshot(outside) == before
    # And the race was real: the swapper swapped, the tools worked between swaps
    print(f"swaps={swapper.swaps} (failed {swapper.failures}); (ok, refused) {results}")
    assert swapper.swaps > 0
    assert all(ok > 0 for ok, _ in results.values()), results


@pytest.mark.spec("X4")
def test_a_swapper_cannot_lead_read_write_edit_or_ls_outside(arena: tuple[Path, Path]) -> None:
    # Given a workspace directory and a symlink to outside, exchanged without pause,
    # When read, write, edit and ls work through both names
    # Then no byte from outside comes back and nothing outside changes
    _run_against_swapper(arena, [_read, _write, _edit, _ls])


@pytest.mark.spec("X4")
def test_a_swapper_cannot_lead_glob_or_grep_outside(arena: tuple[Path, Path]) -> None:
    if not active_profile().active("landlock"):
        pytest.skip("rg is confined by Landlock read rules only where Landlock is on")
    _run_against_swapper(arena, [_glob, _grep])


# -- the symlink rules ---------------------------------------------------------------


@pytest.mark.spec("X4")
def test_an_absolute_link_into_the_workspace_is_followed(workspace: Path) -> None:
    (workspace / "sub").mkdir()
    (workspace / "sub" / "real.txt").write_text("real\n")
    (workspace / "alias.txt").symlink_to(workspace.resolve() / "sub" / "real.txt")
    (workspace / "aliasdir").symlink_to(workspace.resolve() / "sub")
    ctx = tool_context(workspace)
    assert resolve("alias.txt", ctx, Access.READ) == workspace.resolve() / "sub" / "real.txt"
    assert "real" in read_whole(ctx, "aliasdir/real.txt")


@pytest.mark.spec("X4")
@pytest.mark.parametrize("absolute", [True, False])
def test_a_link_pointing_outside_is_refused(workspace: Path, outside: Path, absolute: bool) -> None:
    target = outside if absolute else Path("..") / "outside"
    (workspace / "out").symlink_to(target)
    ctx = tool_context(workspace)
    for access in Access:
        with pytest.raises(ToolError, match=r"is a symlink .* that points outside"):
            resolve("out/secret.txt", ctx, access)


@pytest.mark.spec("X4")
def test_dotdot_goes_to_the_real_parent_and_may_not_escape(workspace: Path) -> None:
    (workspace / "sub" / "deeper").mkdir(parents=True)
    (workspace / "link").symlink_to(workspace.resolve() / "sub" / "deeper")
    ctx = tool_context(workspace)
    # ".." after a link is the parent of its target, as the kernel has it
    assert resolve("link/../x.txt", ctx, Access.WRITE) == workspace.resolve() / "sub" / "x.txt"
    assert resolve("sub/deeper/../../a", ctx, Access.READ) == workspace.resolve() / "a"
    with pytest.raises(ToolError, match=r"outside the workspace"):
        resolve("sub/../../x.txt", ctx, Access.READ)
    with pytest.raises(ToolError, match=r"outside the workspace"):
        resolve("link/../../../x.txt", ctx, Access.READ)


@pytest.mark.spec("X4")
def test_link_chains(workspace: Path, outside: Path) -> None:
    ws = workspace.resolve()
    (ws / "real.txt").write_text("real\n")
    # A chain that stays inside is followed to its end
    (ws / "one").symlink_to("two")
    (ws / "two").symlink_to(ws / "three")
    (ws / "three").symlink_to("real.txt")
    ctx = tool_context(workspace)
    assert resolve("one", ctx, Access.READ) == ws / "real.txt"
    # A chain that passes outside is refused, even though it would come back in
    (outside / "back").symlink_to(ws / "real.txt")
    (ws / "via").symlink_to(outside / "back")
    with pytest.raises(ToolError, match=r"points outside"):
        resolve("via", ctx, Access.READ)
    # A loop ends with a clear error
    (ws / "loop1").symlink_to("loop2")
    (ws / "loop2").symlink_to("loop1")
    with pytest.raises(ToolError, match=r"too many levels of symbolic links"):
        resolve("loop1", ctx, Access.READ)


@pytest.mark.spec("X4")
def test_a_resolved_path_stays_pinned_when_its_directory_is_swapped(
    arena: tuple[Path, Path],
) -> None:
    # Given "d/f.txt" resolved (held by its directory's fd)
    workspace, _ = arena
    ctx = tool_context(workspace)
    exchange = _exchanger()
    with open_path("d/f.txt", ctx, Access.READ) as target:
        # When d is swapped for the link to outside
        assert exchange(os.fsencode(workspace / "d"), os.fsencode(workspace / "l")) == 0
        # Then opening the target still opens the file inside
        fd = target.open(os.O_RDONLY)
        with open(fd, "rb") as f:
            assert f.read() == b"inside content A\n"
    # And a fresh resolution of d/f.txt is refused: d is the link now
    with pytest.raises(ToolError, match=r"points outside"):
        resolve("d/f.txt", ctx, Access.READ)


@pytest.mark.spec("X4")
def test_write_creates_missing_directories_and_writes_through_inside_links(
    workspace: Path,
) -> None:
    ws = workspace.resolve()
    (ws / "sub").mkdir()
    (ws / "alias").symlink_to("sub")
    ctx = tool_context(workspace)
    write_tool.execute({"path": "alias/new/deeper/f.txt", "content": "x\n"}, ctx)
    assert (ws / "sub" / "new" / "deeper" / "f.txt").read_text() == "x\n"
    assert (ws / "alias").is_symlink()
    # No temporary file is left behind
    assert os.listdir(ws / "sub" / "new" / "deeper") == ["f.txt"]


@pytest.mark.spec("X4")
def test_open_beneath_never_crosses_a_link(workspace: Path, outside: Path) -> None:
    (workspace / "out").symlink_to(outside)
    fd = os.open(workspace, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match=r"symbolic links|Not a directory"):
            os.close(open_beneath(fd, "out/secret.txt", os.O_RDONLY))
        with pytest.raises(OSError, match=r"cross-device|link"):
            os.close(open_beneath(fd, "../outside/secret.txt", os.O_RDONLY))
    finally:
        os.close(fd)


@pytest.mark.spec("X4")
def test_ripgrep_under_landlock_cannot_read_outside(workspace: Path, outside: Path) -> None:
    if not active_profile().active("landlock"):
        pytest.skip("Landlock is off: rg runs unconfined")
    (workspace / "a.txt").write_text("secret inside\n")
    ctx = tool_context(workspace)
    lines: list[str] = []
    ended = run_ripgrep(
        ["--", "secret", ".", str(outside)],
        workspace.resolve(),
        ctx,
        lambda line: lines.append(line) is None,
    )
    assert any("secret inside" in line for line in lines)
    assert not any("top secret" in line for line in lines)
    assert "Permission denied" in ended.stderr
    # And the worker that started rg is not itself restricted.
    assert (outside / "secret.txt").read_text()


# -- hidden paths (X9) ---------------------------------------------------------------


@pytest.fixture
def hidden(workspace: Path, outside: Path) -> Iterator[Path]:
    """A policy hiding ``secrets`` inside the workspace (and the outside dir)."""
    secrets = workspace.resolve() / "secrets"
    secrets.mkdir()
    (secrets / "key.txt").write_text("private key\n")
    (workspace / "public.txt").write_text("public key\n")
    before = active_policy()
    set_active_policy(Policy(hidden=(str(secrets), str(outside))))
    try:
        yield secrets
    finally:
        set_active_policy(before)


@pytest.mark.spec("X9")
@pytest.mark.parametrize(
    ("tool_name", "args"),
    [
        ("read", {"path": "secrets/key.txt"}),
        ("read", {"path": "secrets"}),
        ("ls", {"path": "secrets"}),
        ("glob", {"pattern": "*", "path": "secrets"}),
        ("grep", {"pattern": "key", "path": "secrets/key.txt"}),
        ("edit", {"path": "secrets/key.txt", "old_string": "private", "new_string": "x"}),
        ("write", {"path": "secrets/key.txt", "content": "gone"}),
        ("write", {"path": "secrets/new.txt", "content": "planted"}),
        ("read", {"path": "alias.txt"}),  # a link inside, to the hidden file
    ],
)
def test_every_file_tool_refuses_a_hidden_path(
    workspace: Path, hidden: Path, tool_name: str, args: dict[str, Any]
) -> None:
    (workspace / "alias.txt").symlink_to(hidden / "key.txt")
    ctx = tool_context(workspace)
    with pytest.raises(ToolError, match=r"Access denied: .* hidden by the deny_read policy"):
        text(_tool(tool_name).execute(args, ctx))
    assert (hidden / "key.txt").read_text() == "private key\n"
    assert not (hidden / "new.txt").exists()


@pytest.mark.spec("X9")
def test_walks_and_searches_skip_hidden_paths(workspace: Path, hidden: Path) -> None:
    ctx = tool_context(workspace)
    listing = str(_tool("ls").execute({}, ctx))
    assert "public.txt" in listing
    assert "secrets" not in listing
    assert "secrets" not in text(read_tool.execute({"path": "."}, ctx))
    found = str(_tool("glob").execute({"pattern": "**/*.txt"}, ctx))
    assert "public.txt" in found
    assert "secrets" not in found
    # A glob of the model's cannot bring it back: the exclusion comes last
    for args in ({"glob": "secrets/**"}, {"glob": "*.txt"}, {"output_mode": "content"}):
        try:
            matches = str(_tool("grep").execute({"pattern": "key", **args}, ctx))
        except ToolError as exc:  # rg: "No files were searched" when all is excluded
            matches = exc.message
        assert "private" not in matches
        assert "secrets" not in matches


@pytest.mark.spec("X9")
def test_a_hidden_path_holding_the_workspace_leaves_the_workspace_visible(
    tmp_path: Path, workspace: Path
) -> None:
    # Given a hidden path that contains the workspace (a workspace under /root)
    (workspace / "a.txt").write_text("mine\n")
    before = active_policy()
    set_active_policy(Policy(hidden=(str(tmp_path),)))
    try:
        # Then the workspace is still the session's to read and list
        ctx = tool_context(workspace)
        assert "mine" in read_whole(ctx, "a.txt")
        assert "a.txt" in str(_tool("ls").execute({}, ctx))
    finally:
        set_active_policy(before)


@pytest.mark.spec("X8")
async def test_X8_a_call_id_cannot_name_a_spill_file_elsewhere(workspace: Path) -> None:
    """The call id is the model's: bash's spill file is named from it, cut to safe
    characters, never a path ("../../x") nor an earlier call's file."""
    coordinator = Coordinator([bash])
    session = coordinator.open_session(workspace)
    scratch = session.scratch_dir
    assert scratch is not None
    try:
        spills = []
        for call_id in ("../../escape", "../../escape", "a/b"):
            (result,) = await coordinator.run_turn(
                session, [ToolCall(call_id, "bash", {"command": "seq 1 300000"})]
            )
            spills.append(Path(result.text.splitlines()[-1].split(": ", 1)[1]))
        assert all(p.parent == scratch / "bash" and p.is_file() for p in spills)
        assert len(set(spills)) == 3  # the same id twice: two files
        assert spills[0].name.startswith("______escape-")
        assert not (scratch.parent / "escape.log").exists()
        assert not list(scratch.parent.parent.glob("escape*"))
    finally:
        coordinator.close()
