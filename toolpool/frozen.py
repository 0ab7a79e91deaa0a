"""Frozen dataclasses made from every field's value, without their ``__init__``.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its
own ``__setattr__`` refuses): a lookup and a wrapper's call per field, most of what it
costs to read a small message or event off the wire. ``maker(cls)`` is a function of
the same arguments, every field given in order, that stores them through the slots'
own descriptors instead: the same instance for half the work. It is for readers of
the wire, which have every value at hand. This module depends on nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """``cls(*values)``, every field's value given, in the fields' order. For a
    slotted frozen dataclass whose ``__init__`` only stores its arguments (no
    ``__post_init__``, no field left out of it) a function that makes the instance
    without calling ``__init__``; for any other class, ``cls`` itself."""
    if not _plain_frozen(cls):
        return cls
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    for i, name in enumerate(names):
        scope[f"set{i}"] = cls.__dict__[name].__set__
    arguments = ", ".join(f"v{i}" for i in range(len(names)))
    stores = "".join(f"    set{i}(self, v{i})\n" for i in range(len(names)))
    # Written out as dataclasses writes __init__: one call per field, no loop.
    exec(f"def make({arguments}):\n    self = new(cls)\n{stores}    return self\n", scope)
    make: Callable[..., T] = scope["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    make.__doc__ = f"A {cls.__name__} of every field's value (``frozen.maker``)."
    return make


def _plain_frozen(cls: type[Any]) -> bool:
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        return False
    if hasattr(cls, "__post_init__"):
        return False
    return all(f.init for f in dataclasses.fields(cls))
