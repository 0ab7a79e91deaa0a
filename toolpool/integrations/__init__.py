"""toolpool under the agent frameworks (SPEC A3): each module adapts a toolbox
(``toolpool.client.toolbox``: one session, one open turn) to one framework, in that
framework's own terms, and is installed with its extra:

- ``toolpool.integrations.pydantic_ai``: a pydantic-ai toolset (``toolpool[pydantic-ai]``);
- ``toolpool.integrations.openai_agents``: the OpenAI Agents SDK's function tools
  (``toolpool[openai-agents]``);
- ``toolpool.integrations.langchain``: LangChain tools and a LangGraph tool node
  (``toolpool[langchain]``).

Importing one whose framework is missing raises ``ModuleNotFoundError`` naming the
framework's module (``name``) and the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, integration: str) -> ModuleType:
    """``module`` (a framework), imported; ModuleNotFoundError naming the extra when
    the framework is not installed (an error inside an installed one goes through)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        root = module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != root:
            raise
        raise ModuleNotFoundError(
            f"toolpool.integrations.{integration} needs {root}: pip install 'toolpool[{extra}]'",
            name=root,
        ) from exc
