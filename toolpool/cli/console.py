"""Events as lines on a terminal, for the CLI and the demo."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from toolpool.models import (
    Event,
    MessageEnd,
    MessageStart,
    ToolEnd,
    ToolStart,
    ToolUpdate,
    TurnEnd,
    UpdateKind,
)


def terminal() -> Console:
    """The console the commands print to: no highlighting of their own, long lines
    kept whole."""
    return Console(highlight=False, soft_wrap=True)


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_event(event: Event | Any, console: Console) -> None:
    """Print one event as one line (a preview as its own block); also an approval
    request the client passes along (``toolpool.client.ApprovalRequested``)."""
    if getattr(event, "type", None) == "approval_request":
        approval: Any = event
        state = "answered" if approval.answered else "waiting for an answer"
        console.print(f"[yellow]  ? {approval.call.id} approve {approval.label}?[/] ({state})")
        return
    match event:
        case ToolStart():
            activity = f" [dim]{escape(event.activity)}[/]" if event.activity else ""
            args = escape(_short(event.arguments))
            console.print(f"[cyan]▶ {event.call_id}[/] [bold]{event.label}[/] {args}{activity}")
        case ToolUpdate(kind=UpdateKind.PREVIEW):
            console.print(f"[magenta]  ◇ {event.call_id} preview[/]")
            console.print(escape(str(event.data)).rstrip(), style="dim", highlight=False)
        case ToolUpdate():
            console.print(f"[blue]  … {event.call_id}[/] {escape(_short(event.data))}")
        case ToolEnd():
            result = event.result
            mark = "[red]✗" if result.is_error else "[green]✓"
            code = f" ({result.error_code.value})" if result.error_code else ""
            console.print(f"{mark} {event.call_id}[/]{code} {escape(_short(result.text))}")
        case MessageStart() | MessageEnd():
            pass  # the same content as tool_end; shown only in --verbose listings
        case TurnEnd():
            errors = sum(r.is_error for r in event.results)
            console.print(f"[bold]■ turn end[/]: {len(event.results)} results, {errors} errors")
