"""Jupyter notebooks as the model sees and changes them (SPEC F7): ``read`` shows the
cells with their outputs, ``notebook_edit`` replaces, inserts or deletes a cell.

A cell is named by its ``id``. A notebook older than nbformat 4.5 has no cell ids
(nor has a cell that lacks one): such a cell is named ``cell-<index>``, its 0-based
position, shown by ``read`` and accepted by ``notebook_edit`` — a positional name,
so it moves when a cell is inserted or deleted before it. Edits keep the notebook's
nbformat version; a cell inserted into a 4.5 notebook gets a new random id.

Notebooks are parsed and written with ``nbformat`` (its JSON layout: one-space
indent, sorted keys, sources as lists of lines), without validation, which would
add ids of its own and so rename cells between two reads.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import functools
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from toolpool.errors import ToolError
from toolpool.models import ContentBlock, ImageBlock, TextBlock
from toolpool.tool import Arguments, image_block

if TYPE_CHECKING:
    from nbformat.notebooknode import NotebookNode

# One output's text past this is cut (a training loop's log…); sources never are.
MAX_OUTPUT_CHARS = 10_000
MAX_IMAGES = 20
MAX_IMAGE_BYTES = 3_750_000  # as read's images (5 MB of base64)
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_MAX_LISTED_IDS = 50


@dataclass(frozen=True, slots=True)
class _Nbformat:
    """nbformat's few parts used here, typed (it has no type hints)."""

    node: type[NotebookNode]
    reads: Callable[[str], Any]
    convert: Callable[[NotebookNode, int], NotebookNode]
    writes: Callable[[NotebookNode], str]
    new_code_cell: Callable[..., NotebookNode]
    new_markdown_cell: Callable[[str], NotebookNode]


@functools.cache
def _nbformat() -> _Nbformat:
    """nbformat, imported by the first notebook a call reads or edits: with traitlets
    it is some 50 modules, which every worker would carry otherwise."""
    import nbformat
    from nbformat import v4
    from nbformat.notebooknode import NotebookNode

    return _Nbformat(
        NotebookNode,
        cast(Callable[[str], Any], nbformat.reader.reads),
        cast(Callable[[NotebookNode, int], NotebookNode], nbformat.convert),
        cast(Callable[[NotebookNode], str], v4.writes),
        cast(Callable[..., NotebookNode], v4.new_code_cell),
        cast(Callable[[str], NotebookNode], v4.new_markdown_cell),
    )


def parse(data: bytes) -> NotebookNode:
    """The notebook in ``data``, as stored (not converted, not validated); a
    ValueError when it is not a notebook."""
    try:
        text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8")
        nb = _nbformat().reads(text)
    except Exception as exc:  # nbformat raises several kinds for a file that is not one
        raise ValueError(str(exc) or type(exc).__name__) from None
    if not isinstance(nb, _nbformat().node) or not isinstance(nb.get("nbformat"), int):
        raise ValueError("it holds no nbformat version")
    return nb


def _as_v4(nb: NotebookNode) -> NotebookNode:
    """A notebook older than nbformat 4 converted for showing (never written back)."""
    if nb.nbformat >= 4:
        return nb
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = _nbformat().convert(nb, 4)
    return converted


def cell_ids(nb: NotebookNode) -> list[str]:
    """Each cell's name: its id, or ``cell-<index>`` when it has none."""
    return [str(cell.get("id") or f"cell-{i}") for i, cell in enumerate(nb.cells)]


def version(nb: NotebookNode) -> str:
    return f"{nb.nbformat}.{nb.get('nbformat_minor', 0)}"


def _has_ids(nb: NotebookNode) -> bool:
    return (nb.nbformat, nb.get("nbformat_minor", 0)) >= (4, 5)


# --- read ----------------------------------------------------------------------------


def notebook_content(nb: NotebookNode, shown: str) -> list[ContentBlock]:
    """The notebook as ``read`` returns it: text blocks with each cell delimited by
    its id and type, its outputs after it, image outputs as image blocks."""
    blocks: list[ContentBlock] = []
    text: list[str] = []
    for part in _rendered(_as_v4(nb), shown, images=True):
        if isinstance(part, str):
            text.append(part)
            continue
        blocks.append(TextBlock("\n".join(text)))
        blocks.append(part)
        text = []
    if text:
        blocks.append(TextBlock("\n".join(text)))
    return blocks


def notebook_text(data: bytes) -> str | None:
    """The text ``read`` shows of the notebook in ``data`` (images left out), None
    when it is not a notebook: what a stale refusal diffs and shows (F9)."""
    try:
        nb = parse(data)
    except ValueError:
        return None
    return "\n".join(p for p in _rendered(_as_v4(nb), "", images=False) if isinstance(p, str))


def _rendered(nb: NotebookNode, shown: str, *, images: bool) -> Iterator[str | ImageBlock]:
    count = len(nb.cells)
    head = f"Notebook {shown}" if shown else "Notebook"
    about = f"nbformat {version(nb)}"
    language = nb.get("metadata", {}).get("kernelspec", {}).get("language")
    if language:
        about += f", {language}"
    if not _has_ids(nb):
        about += (
            "; its cells have no ids, so they are named cell-<index> (from 0), names "
            "that shift when a cell is inserted or deleted before them"
        )
    yield f"{head}: {count} {'cell' if count == 1 else 'cells'} ({about})."
    shown_images = 0
    for name, cell in zip(cell_ids(nb), nb.cells, strict=True):
        attributes = f'id="{name}" type="{cell.cell_type}"'
        if cell.cell_type == "code" and cell.get("execution_count") is not None:
            attributes += f' execution_count="{cell.execution_count}"'
        yield f"<cell {attributes}>\n{_source(cell)}\n</cell>"
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            for part in _output(output, name):
                if isinstance(part, str):
                    yield part
                elif not images:
                    continue  # the text alone: the output's element names the image
                elif shown_images < MAX_IMAGES:
                    shown_images += 1
                    yield part
                else:
                    yield f"[{part.media_type} image not shown: at most {MAX_IMAGES} per read]"


def _source(cell: NotebookNode) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _output(output: NotebookNode, cell: str) -> Iterator[str | ImageBlock]:
    kind = output.get("output_type", "?")
    match kind:
        case "stream":
            yield _element(
                cell,
                f'type="stream" name="{output.get("name", "stdout")}"',
                _text(output.get("text", "")),
            )
        case "error":
            trace = (
                "\n".join(output.get("traceback", []))
                or f"{output.get('ename')}: {output.get('evalue')}"
            )
            yield _element(cell, f'type="error" ename="{output.get("ename", "")}"', _text(trace))
        case "execute_result" | "display_data":
            data = output.get("data", {})
            for media_type in _IMAGE_TYPES:
                if media_type in data:
                    yield from _image(cell, kind, media_type, data[media_type])
                    break
            if "text/plain" in data:
                yield _element(cell, f'type="{kind}"', _text(data["text/plain"]))
            elif not any(t in data for t in _IMAGE_TYPES):
                kinds = ", ".join(sorted(data)) or "nothing"
                yield _element(cell, f'type="{kind}"', f"[no text or image output: {kinds}]")
        case _:
            yield _element(
                cell, f'type="{kind}"', "[an output of a kind this reader does not know]"
            )


def _element(cell: str, attributes: str, body: str) -> str:
    return f'<output cell="{cell}" {attributes}>\n{body}\n</output>'


def _text(value: Any) -> str:
    text = "".join(value) if isinstance(value, list) else str(value)
    text = _ANSI.sub("", text).rstrip("\n")
    if len(text) > MAX_OUTPUT_CHARS:
        more = len(text) - MAX_OUTPUT_CHARS
        text = f"{text[:MAX_OUTPUT_CHARS]}\n[output cut: {more:,} more characters]"
    return text


def _image(cell: str, kind: str, media_type: str, value: Any) -> Iterator[str | ImageBlock]:
    encoded = "".join(value) if isinstance(value, list) else str(value)
    try:
        raw = base64.b64decode(encoded, validate=False)
    except (binascii.Error, ValueError):
        yield _element(
            cell, f'type="{kind}" mime="{media_type}"', "[the image data is not valid base64]"
        )
        return
    if len(raw) > MAX_IMAGE_BYTES:
        yield _element(
            cell,
            f'type="{kind}" mime="{media_type}"',
            f"[image not shown: {len(raw):,} bytes, over the limit of {MAX_IMAGE_BYTES:,}]",
        )
        return
    yield _element(
        cell,
        f'type="{kind}" mime="{media_type}"',
        f"[{media_type} image, {len(raw):,} bytes]",
    )
    yield image_block(raw, media_type)


# --- notebook_edit --------------------------------------------------------------------

EDIT_MODES = ("replace", "insert", "delete")
CELL_TYPES = ("code", "markdown")


def arguments_problem(args: Arguments) -> str | None:
    """What is wrong with notebook_edit's arguments themselves, before any file."""
    mode = args.get("edit_mode", "replace")
    if mode == "insert" and "cell_type" not in args:
        return "cell_type is needed to insert a cell: code or markdown."
    if mode in ("replace", "delete") and not args.get("cell_id"):
        return f"cell_id is needed to {mode} a cell: the id read shows for it."
    return None


class NotebookPlan:
    """A cell edit worked out in memory: the changed cell's source before and after
    (its preview diffs those, SPEC F7) and the notebook's new bytes, serialised when
    first asked for — a preview never needs them (a notebook's JSON can be megabytes)."""

    def __init__(
        self, nb: NotebookNode, eol: bool, cell: str, before: str, after: str, summary: str
    ) -> None:
        self._nb = nb
        self._eol = "\n" if eol else ""  # the file ended with a newline: it still does
        self.cell = cell  # the cell's name as read shows it
        self.before = before
        self.after = after
        self.summary = summary

    @functools.cached_property
    def data(self) -> bytes:
        return (_nbformat().writes(self._nb) + self._eol).encode("utf-8")


def plan_notebook_edit(data: bytes, args: Arguments, shown: str) -> NotebookPlan:
    """Apply the cell edit to the notebook ``data`` (the file ``shown``) in memory;
    a ToolError when it is not a notebook, too old, or has no such cell."""
    problem = arguments_problem(args)
    if problem:
        raise ToolError(problem)
    try:
        nb = parse(data)
    except ValueError as exc:
        raise ToolError(f"{shown} is not a notebook nbformat can read ({exc}).") from None
    if nb.nbformat < 4:
        raise ToolError(
            f"{shown} is an nbformat {version(nb)} notebook; notebook_edit changes nbformat 4 "
            "notebooks (jupyter nbconvert --to notebook upgrades it)."
        )
    mode = args.get("edit_mode", "replace")
    source = args["new_source"]
    ids = cell_ids(nb)
    wanted = args.get("cell_id")
    index = _find(nb, ids, wanted, shown) if wanted else -1
    note = (
        ""
        if _has_ids(nb)
        else " Its cells are named by position (cell-<index>): read it again for their names now."
    )
    match mode:
        case "delete":
            cell = nb.cells.pop(index)
            left = len(nb.cells)
            summary = f"Deleted {cell.cell_type} cell {ids[index]} from {shown}; {left} left.{note}"
            name, before, after = ids[index], _source(cell), ""
        case "insert":
            cell = _new_cell(args["cell_type"], source, nb, ids)
            nb.cells.insert(index + 1, cell)
            where = f"after cell {ids[index]}" if index >= 0 else "at the top"
            name = cell.get("id") or f"cell-{index + 1}"
            summary = f"Inserted {args['cell_type']} cell {name} {where} of {shown}.{note}"
            before, after = "", source
        case _:
            old = nb.cells[index]
            kind = args.get("cell_type", old.cell_type)
            before = _source(old)
            cell = _new_cell(kind, source, nb, ids) if kind != old.cell_type else old
            cell.source = source
            if "id" in old:
                cell["id"] = old["id"]
            cell.metadata = old.get("metadata", {})
            cleared = ""
            if kind == "code":
                cleared = " Its outputs were cleared." if old.get("outputs") else ""
                cell.outputs = []
                cell.execution_count = None
            nb.cells[index] = cell
            summary = f"Replaced the source of {kind} cell {ids[index]} in {shown}.{cleared}"
            name, after = ids[index], source
    return NotebookPlan(nb, data.endswith(b"\n"), name, before, after, summary)


def _find(nb: NotebookNode, ids: list[str], wanted: str, shown: str) -> int:
    if wanted in ids:
        return ids.index(wanted)
    listed = ", ".join(
        f"{i} ({c.cell_type})" for i, c in zip(ids[:_MAX_LISTED_IDS], nb.cells, strict=False)
    )
    more = f" and {len(ids) - _MAX_LISTED_IDS} more" if len(ids) > _MAX_LISTED_IDS else ""
    cells = f"Its cells: {listed}{more}." if ids else "It has no cells: insert one without cell_id."
    raise ToolError(f"{shown} has no cell with id {wanted!r}. {cells}")


def _new_cell(kind: str, source: str, nb: NotebookNode, ids: list[str]) -> NotebookNode:
    nbf = _nbformat()
    cell = nbf.new_code_cell(source) if kind == "code" else nbf.new_markdown_cell(source)
    if not _has_ids(nb):
        del cell["id"]  # not in the schema before 4.5
    else:
        while cell.id in ids:  # random, 8 hex digits: a clash is rare, and refused
            cell.id = nbf.new_code_cell().id
    return cell
