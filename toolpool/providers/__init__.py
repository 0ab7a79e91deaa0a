"""Provider formats as plain dicts: calls in, results out, tool definitions out.

Model output is read straight from each provider's JSON (no provider SDK needed):
OpenAI Chat ``tool_calls``, OpenAI Responses ``function_call`` items, Anthropic
``tool_use`` blocks, Gemini ``functionCall`` parts. Results go back in each one's
shape, in call order, and tool definitions are exported for each, and for MCP::

    calls = parse_tool_calls(assistant_message)          # format detected
    results = await coordinator.run_turn(session, calls)
    messages.append(results_to_anthropic(results))       # or results_to_provider(..., name)
    tools = definitions(coordinator.registry, "gemini")

docs/providers.md shows one example per provider and the choices made for each.
"""

from toolpool.providers.anthropic import (
    calls_from_anthropic,
    results_to_anthropic,
    tools_to_anthropic,
)
from toolpool.providers.formats import (
    CALL_FORMATS,
    PROVIDERS,
    Provider,
    calls_from_toolpool,
    definitions,
    detect_call_format,
    parse_tool_calls,
    provider,
    results_to_provider,
)
from toolpool.providers.gemini import (
    SYNTHETIC_ID_PREFIX,
    calls_from_gemini,
    results_to_gemini,
    tools_to_gemini,
)
from toolpool.providers.mcp import results_to_mcp, tools_to_mcp
from toolpool.providers.openai_chat import (
    calls_from_openai_chat,
    results_to_openai_chat,
    tools_to_openai_chat,
)
from toolpool.providers.openai_responses import (
    calls_from_openai_responses,
    results_to_openai_responses,
    tools_to_openai_responses,
)

__all__ = [
    "CALL_FORMATS",
    "PROVIDERS",
    "SYNTHETIC_ID_PREFIX",
    "Provider",
    "calls_from_anthropic",
    "calls_from_gemini",
    "calls_from_openai_chat",
    "calls_from_openai_responses",
    "calls_from_toolpool",
    "definitions",
    "detect_call_format",
    "parse_tool_calls",
    "provider",
    "results_to_anthropic",
    "results_to_gemini",
    "results_to_mcp",
    "results_to_openai_chat",
    "results_to_openai_responses",
    "results_to_provider",
    "tools_to_anthropic",
    "tools_to_gemini",
    "tools_to_mcp",
    "tools_to_openai_chat",
    "tools_to_openai_responses",
]
