"""An integration whose framework is missing says which extra to install (SPEC A3)."""

from __future__ import annotations

import importlib
import sys

import pytest

CASES = [
    ("pydantic_ai", "pydantic_ai", "toolpool[pydantic-ai]"),
    ("openai_agents", "agents", "toolpool[openai-agents]"),
    ("langchain", "langchain_core", "toolpool[langchain]"),
]


@pytest.mark.spec("A3")
@pytest.mark.parametrize(("integration", "framework", "extra"), CASES)
def test_A3_a_missing_framework_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, integration: str, framework: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, framework, None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, f"toolpool.integrations.{integration}", raising=False)
    with pytest.raises(ModuleNotFoundError) as raised:
        importlib.import_module(f"toolpool.integrations.{integration}")
    assert raised.value.name == framework
    assert f"pip install '{extra}'" in str(raised.value)
