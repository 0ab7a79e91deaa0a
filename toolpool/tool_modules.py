"""Where tools come from (SPEC T5): a module, by dotted name or ``.py`` path, and the
tools it offers.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from toolpool.errors import ToolDefinitionError
from toolpool.tool import Tool


def load_module(ref: str) -> ModuleType:
    """Import a module by dotted name, or from a ``.py`` file path."""
    if ref.endswith(".py") or "/" in ref:
        path = Path(ref).resolve()
        if not path.is_file():
            raise ToolDefinitionError(f"no tool module at {path}")
        name = f"toolpool_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ToolDefinitionError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(ref)
    except ImportError as exc:
        raise ToolDefinitionError(f"cannot import tool module {ref!r}: {exc}") from exc


def tools_in_module(ref: str) -> list[Any]:
    """T5: the tools a user module offers.

    A module lists them in ``TOOLS``; without that list, every module-level object
    that meets the contract (instances, not classes) is taken, in definition order.
    """
    module = load_module(ref)
    listed = getattr(module, "TOOLS", None)
    if listed is not None:
        return list(listed)
    return [
        obj
        for obj in vars(module).values()
        if not inspect.isclass(obj) and not inspect.ismodule(obj) and isinstance(obj, Tool)
    ]
