"""Notebooks: read shows a notebook's cells with their outputs, notebook_edit replaces,
inserts and deletes cells by id, under read-before-write, written atomically (SPEC F7,
F1, F3, F5, P7)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat import v4

from toolpool import Client, ImageBlock, TextBlock, ToolCall, ToolError
from toolpool.tool import ToolContext, ToolOutput
from toolpool.tools import notebook_edit_tool, read_tool
from toolpool.tools.support.stamps import CODE_NOT_READ, CODE_STALE

from .daemon_support import Daemon, running_daemon
from .support import PNG_1X1
from .tool_support import text, tool_context


def make_notebook(path: Path, *, minor: int = 5) -> list[str]:
    """A real notebook at ``path``: a markdown cell, a code cell with a stream and an
    execute_result, a code cell with an image; its cell ids (none before 4.5)."""
    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        v4.new_markdown_cell("# Analysis\nSome *words*."),
        v4.new_code_cell(
            "print('hello')\n6 * 7",
            execution_count=1,
            outputs=[
                v4.new_output("stream", name="stdout", text="hello\n"),
                v4.new_output("execute_result", data={"text/plain": "42"}, execution_count=1),
            ],
        ),
        v4.new_code_cell(
            "plot()",
            execution_count=2,
            outputs=[
                v4.new_output(
                    "display_data",
                    data={
                        "image/png": base64.b64encode(PNG_1X1).decode(),
                        "text/plain": "<Figure size 640x480 with 1 Axes>",
                    },
                )
            ],
        ),
    ]
    ids = [c.id for c in nb.cells]
    if minor < 5:
        nb.nbformat_minor = minor
        for cell in nb.cells:
            del cell["id"]
    with open(path, "w", encoding="utf-8") as f:
        nbformat.write(nb, f, version=nbformat.NO_CONVERT)
    return ids if minor >= 5 else [f"cell-{i}" for i in range(len(nb.cells))]


def read_nb(ctx: ToolContext, path: str) -> list[Any]:
    output = read_tool.execute_content({"path": path}, ctx)
    return list(output.content if isinstance(output, ToolOutput) else output)


def nb_edit(ctx: ToolContext, **args: Any) -> str:
    """Validate, then execute, as the pipeline does (preview aside)."""
    verdict = notebook_edit_tool.validate(args, ctx)
    if not verdict.ok:
        raise ToolError(verdict.message, details={"validation_code": verdict.code})
    return notebook_edit_tool.execute(args, ctx)


def cells(path: Path) -> list[Any]:
    return list(nbformat.read(path, as_version=nbformat.NO_CONVERT).cells)


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return tool_context(workspace)


# --- read --------------------------------------------------------------------------------


@pytest.mark.spec("F7", "F1")
def test_F7_read_shows_cells_with_ids_types_and_outputs(workspace: Path, ctx: ToolContext) -> None:
    # Given a notebook with markdown, code with outputs, and an image output
    ids = make_notebook(workspace / "nb.ipynb")
    # When it is read
    blocks = read_nb(ctx, "nb.ipynb")
    # Then every cell is delimited with its id and type, its source whole
    first = blocks[0]
    assert isinstance(first, TextBlock)
    assert first.text.startswith("Notebook nb.ipynb: 3 cells (nbformat 4.5, python).")
    assert f'<cell id="{ids[0]}" type="markdown">\n# Analysis\nSome *words*.\n</cell>' in first.text
    assert (
        f'<cell id="{ids[1]}" type="code" execution_count="1">\nprint(\'hello\')\n6 * 7\n</cell>'
        in first.text
    )
    # and the outputs follow their cell: text as text
    assert f'<output cell="{ids[1]}" type="stream" name="stdout">\nhello\n</output>' in first.text
    assert f'<output cell="{ids[1]}" type="execute_result">\n42\n</output>' in first.text
    # and the image as an image block, where it stands, then the text after it
    image = blocks[1]
    assert isinstance(image, ImageBlock)
    assert (image.media_type, base64.b64decode(image.data)) == ("image/png", PNG_1X1)
    assert first.text.endswith(f"[image/png image, {len(PNG_1X1)} bytes]\n</output>")
    assert "<Figure size 640x480 with 1 Axes>" in text(blocks[2:])


@pytest.mark.spec("F7", "F2")
def test_F7_reading_a_notebook_is_a_whole_read(workspace: Path, ctx: ToolContext) -> None:
    make_notebook(workspace / "nb.ipynb")
    read_nb(ctx, "nb.ipynb")
    stamp = ctx.files.get(workspace / "nb.ipynb")
    assert stamp is not None and not stamp.partial


@pytest.mark.spec("F7")
def test_F7_a_notebook_before_4_5_names_its_cells_by_position(
    workspace: Path, ctx: ToolContext
) -> None:
    # Given an nbformat 4.4 notebook: no cell ids
    make_notebook(workspace / "old.ipynb", minor=4)
    # When it is read, Then its cells are cell-0, cell-1…, and it says why
    out = text(read_nb(ctx, "old.ipynb"))
    assert "(nbformat 4.4, python; its cells have no ids, so they are named cell-<index>" in out
    assert '<cell id="cell-0" type="markdown">' in out
    assert '<cell id="cell-2" type="code" execution_count="2">' in out
    # And notebook_edit takes those names, keeping the notebook 4.4 (no ids added)
    result = nb_edit(ctx, path="old.ipynb", cell_id="cell-1", new_source="x = 1")
    assert result.startswith("Replaced the source of code cell cell-1 in old.ipynb.")
    raw = json.loads((workspace / "old.ipynb").read_text())
    assert raw["nbformat_minor"] == 4
    assert all("id" not in cell for cell in raw["cells"])
    assert [c.source for c in cells(workspace / "old.ipynb")][1] == "x = 1"


@pytest.mark.spec("F7")
def test_F7_an_ipynb_that_is_no_notebook_is_read_as_text(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "broken.ipynb").write_text('{"cells": [\n')
    assert text(read_nb(ctx, "broken.ipynb")) == '     1\t{"cells": ['


# --- notebook_edit -------------------------------------------------------------------------


@pytest.mark.spec("F7", "F5")
def test_F7_replace_sets_the_source_and_clears_the_outputs(
    workspace: Path, ctx: ToolContext
) -> None:
    ids = make_notebook(workspace / "nb.ipynb")
    read_nb(ctx, "nb.ipynb")
    result = nb_edit(ctx, path="nb.ipynb", cell_id=ids[1], new_source="print('bye')")
    assert result == (
        f"Replaced the source of code cell {ids[1]} in nb.ipynb. Its outputs were cleared."
    )
    after = cells(workspace / "nb.ipynb")
    assert [c.id for c in after] == ids
    assert (after[1].source, after[1].outputs, after[1].execution_count) == (
        "print('bye')",
        [],
        None,
    )
    assert after[2].outputs  # the other cells are left alone
    # F5: a second edit needs no read
    nb_edit(ctx, path="nb.ipynb", cell_id=ids[0], new_source="# Title", cell_type="markdown")
    assert cells(workspace / "nb.ipynb")[0].source == "# Title"


@pytest.mark.spec("F7")
def test_F7_replace_with_another_cell_type_changes_the_type(
    workspace: Path, ctx: ToolContext
) -> None:
    ids = make_notebook(workspace / "nb.ipynb")
    read_nb(ctx, "nb.ipynb")
    nb_edit(ctx, path="nb.ipynb", cell_id=ids[0], new_source="import os", cell_type="code")
    first = cells(workspace / "nb.ipynb")[0]
    assert (first.cell_type, first.id, first.source, first.outputs) == (
        "code",
        ids[0],
        "import os",
        [],
    )


@pytest.mark.spec("F7")
def test_F7_insert_after_a_cell_or_at_the_top(workspace: Path, ctx: ToolContext) -> None:
    ids = make_notebook(workspace / "nb.ipynb")
    read_nb(ctx, "nb.ipynb")
    after = nb_edit(
        ctx,
        path="nb.ipynb",
        cell_id=ids[0],
        new_source="x = 1",
        cell_type="code",
        edit_mode="insert",
    )
    top = nb_edit(
        ctx, path="nb.ipynb", new_source="# Top", cell_type="markdown", edit_mode="insert"
    )
    now = cells(workspace / "nb.ipynb")
    assert [c.source for c in now] == [
        "# Top",
        "# Analysis\nSome *words*.",
        "x = 1",
        "print('hello')\n6 * 7",
        "plot()",
    ]
    assert len({c.id for c in now}) == 5  # new, distinct ids
    assert after == f"Inserted code cell {now[2].id} after cell {ids[0]} of nb.ipynb."
    assert top == f"Inserted markdown cell {now[0].id} at the top of nb.ipynb."


@pytest.mark.spec("F7")
def test_F7_delete_removes_the_cell(workspace: Path, ctx: ToolContext) -> None:
    ids = make_notebook(workspace / "nb.ipynb")
    read_nb(ctx, "nb.ipynb")
    result = nb_edit(ctx, path="nb.ipynb", cell_id=ids[1], new_source="", edit_mode="delete")
    assert result == f"Deleted code cell {ids[1]} from nb.ipynb; 2 left."
    assert [c.id for c in cells(workspace / "nb.ipynb")] == [ids[0], ids[2]]


@pytest.mark.spec("F7")
def test_F7_a_missing_cell_id_lists_the_ids_there_are(workspace: Path, ctx: ToolContext) -> None:
    ids = make_notebook(workspace / "nb.ipynb")
    read_nb(ctx, "nb.ipynb")
    before = (workspace / "nb.ipynb").read_bytes()
    with pytest.raises(ToolError) as caught:
        nb_edit(ctx, path="nb.ipynb", cell_id="nope", new_source="x")
    assert caught.value.message == (
        f"nb.ipynb has no cell with id 'nope'. Its cells: {ids[0]} (markdown), "
        f"{ids[1]} (code), {ids[2]} (code)."
    )
    assert (workspace / "nb.ipynb").read_bytes() == before


@pytest.mark.spec("F7")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"new_source": "x", "edit_mode": "insert"}, "cell_type is needed to insert a cell"),
        ({"new_source": "x"}, "cell_id is needed to replace a cell"),
        ({"new_source": "", "edit_mode": "delete"}, "cell_id is needed to delete a cell"),
    ],
)
def test_F7_arguments_that_cannot_work_are_refused_in_validate(
    workspace: Path, ctx: ToolContext, args: dict[str, Any], message: str
) -> None:
    make_notebook(workspace / "nb.ipynb")
    verdict = notebook_edit_tool.validate({"path": "nb.ipynb", **args}, ctx)
    assert not verdict.ok
    assert verdict.message.startswith(message)


@pytest.mark.spec("F7")
def test_F7_only_notebooks_are_edited(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "a.py").write_text("x = 1\n")
    verdict = notebook_edit_tool.validate({"path": "a.py", "cell_id": "a", "new_source": "x"}, ctx)
    assert (
        verdict.message
        == "notebook_edit changes Jupyter notebooks (.ipynb); use edit for other files."
    )


@pytest.mark.spec("F7", "F3")
def test_F3_notebook_edit_needs_a_read_and_refuses_a_change_since(
    workspace: Path, ctx: ToolContext
) -> None:
    path = workspace / "nb.ipynb"
    ids = make_notebook(path)
    args = {"path": "nb.ipynb", "cell_id": ids[0], "new_source": "# New"}
    # Never read: code 2
    verdict = notebook_edit_tool.validate(args, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_NOT_READ)
    # Read, then changed behind the model's back: code 3, at validate…
    read_nb(ctx, "nb.ipynb")
    st = path.stat()
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    nb.cells[0].source = "# Theirs"
    nbformat.write(nb, path)
    verdict = notebook_edit_tool.validate(args, ctx)
    assert (verdict.ok, verdict.code) == (False, CODE_STALE)
    # …and at execute, when the change came after validate (same size and mtime)
    ctx2 = tool_context(workspace)
    read_nb(ctx2, "nb.ipynb")
    assert notebook_edit_tool.validate(args, ctx2).ok
    data = path.read_bytes().replace(b"# Theirs", b"# Other!")
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, path.stat().st_mtime_ns))
    with pytest.raises(ToolError, match="changed since it was read") as caught:
        notebook_edit_tool.execute(args, ctx2)
    assert caught.value.details["validation_code"] == CODE_STALE
    assert cells(path)[0].source == "# Other!"


@pytest.mark.spec("F7", "P7")
def test_P7_notebook_edit_previews_a_diff_and_writes_atomically(
    workspace: Path, ctx: ToolContext
) -> None:
    path = workspace / "nb.ipynb"
    ids = make_notebook(path)
    path.chmod(0o640)
    read_nb(ctx, "nb.ipynb")
    args = {"path": "nb.ipynb", "cell_id": ids[0], "new_source": "# Results"}
    preview = notebook_edit_tool.preview(args, ctx)
    # The diff of the cell's source, named by the cell, not of the notebook's JSON
    cell = f"nb.ipynb#{ids[0]}"
    assert preview.startswith(f"--- a/{cell}\n+++ b/{cell}\n@@")
    assert "-# Analysis\n" in preview
    assert "+# Results\n" in preview
    assert '"cells"' not in preview
    inode = path.stat().st_ino
    nb_edit(ctx, **args)
    # A new file renamed over the old (atomic), the mode kept, no temporary left
    assert path.stat().st_ino != inode
    assert path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in workspace.iterdir()) == ["nb.ipynb"]
    # The JSON is nbformat's layout, still a valid notebook
    nbformat.validate(nbformat.read(path, as_version=nbformat.NO_CONVERT))
    assert path.read_text().endswith("}\n")


@pytest.mark.spec("F9", "F7")
def test_F9_a_stale_notebook_shows_its_cells_changed_and_the_retry_needs_no_read(
    workspace: Path, tmp_path: Path
) -> None:
    # Given a notebook read, whose cell someone else changed since
    ctx = tool_context(workspace, scratch_dir=tmp_path / "scratch")
    path = workspace / "nb.ipynb"
    ids = make_notebook(path)
    read_nb(ctx, "nb.ipynb")
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    nb.cells[0].source = "# Their title"
    nbformat.write(nb, path)
    # When the model edits a cell, Then the refusal diffs the cells as read shows them
    args = {"path": "nb.ipynb", "cell_id": ids[2], "new_source": "plot(2)"}
    verdict = notebook_edit_tool.validate(args, ctx)
    assert verdict.code == CODE_STALE
    assert (
        f'@@ -1,7 +1,6 @@\n Notebook: 3 cells (nbformat 4.5, python).\n <cell id="{ids[0]}"'
        in verdict.message
    )
    assert "\n-# Analysis\n-Some *words*.\n+# Their title\n" in verdict.message
    # and, the notebook being small, all its cells: that counts as a read
    assert (
        "It now reads (the whole notebook, images left out):\n"
        "Notebook: 3 cells (nbformat 4.5, python).\n"
        f'<cell id="{ids[0]}" type="markdown">\n# Their title\n</cell>\n'
    ) in verdict.message
    assert "image/png image, " in verdict.message
    assert "This counts as a read" in verdict.message
    assert nb_edit(ctx, **args).startswith(f"Replaced the source of code cell {ids[2]}")
    assert [c.source for c in cells(path)][0::2] == ["# Their title", "plot(2)"]


# --- through a real daemon ---------------------------------------------------------------


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running_daemon(tmp_path) as started:
        yield started


@pytest.mark.spec("F7", "D1")
def test_F7_read_and_notebook_edit_through_a_daemon(daemon: Daemon, workspace: Path) -> None:
    ids = make_notebook(workspace / "nb.ipynb")
    with (
        Client(runtime_dir=daemon.runtime, timeout=30) as client,
        client.session(workspace) as session,
    ):
        refused, read, edited = session.submit(
            [
                ToolCall(
                    "e0",
                    "notebook_edit",
                    {"path": "nb.ipynb", "cell_id": ids[1], "new_source": "1"},
                ),
                ToolCall("r", "read", {"path": "nb.ipynb"}),
                ToolCall(
                    "e1",
                    "notebook_edit",
                    {"path": "nb.ipynb", "cell_id": ids[1], "new_source": "2"},
                ),
            ]
        ).results()
    assert refused.details["validation_code"] == CODE_NOT_READ
    assert not read.is_error and not edited.is_error, (read.text, edited.text)
    assert any(isinstance(b, ImageBlock) for b in read.content)
    assert f'<cell id="{ids[1]}" type="code" execution_count="1">' in read.text
    assert cells(workspace / "nb.ipynb")[1].source == "2"
