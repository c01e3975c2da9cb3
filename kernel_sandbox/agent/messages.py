"""Chat Completions messages for the agent loop: the system prompt, the model's tool
calls read defensively, and tool results written back compactly.

The model sees each tool result as the :class:`~kernel_sandbox.tools.ToolResult` JSON
(images named as placeholders, long text cut in the middle).  For vision models the
images follow in one ``user`` message after the turn's ``tool`` messages, because the
Chat Completions API accepts image parts only in user messages.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from ..tools.results import VISION_MIMES, ToolResult

__all__ = [
    "ParsedCall",
    "ParsedReply",
    "assistant_message",
    "image_message",
    "parse_reply",
    "system_prompt",
    "tool_message",
]

Message = dict[str, Any]


def system_prompt(
    *,
    working_dir: str = "/sandbox",
    network: bool | str | list[str] = False,
    vision: bool = False,
    tools: list[str] | None = None,
) -> str:
    """Instructions for a data-analysis agent working in one of our sandboxes."""
    tools = tools or ["python_executor", "shell_executor", "file_operation"]
    lines = [
        "You are a careful data analyst. You work in an isolated sandbox through tools "
        f"({', '.join(tools)}), and everything you run is recorded in a Jupyter notebook "
        "that a person will read and re-run.",
        "",
        "How the sandbox works:",
        "- python_executor runs code in a persistent IPython kernel, like notebook cells: "
        "variables, imports and loaded data stay in memory between calls. Build on earlier "
        "results instead of reloading or recomputing them.",
        f"- Files live in {working_dir} (the working directory) and persist for the whole "
        "session; every tool sees the same files.",
    ]
    if network is True or network == "full":
        lines.append("- The sandbox has network access, but prefer the installed libraries.")
    elif network is False or network == "none":
        lines.append(
            "- There is no network: you cannot pip install or download anything. Use the "
            "installed libraries (check with `import` if unsure)."
        )
    else:
        from ..network import describe_network

        lines.append(
            f"- {describe_network(network)} Prefer the installed libraries; install only "
            "what is missing."
        )
    if vision:
        lines.append(
            "- Plots (matplotlib figures, shown with plt.show()) and other images are shown "
            "to you as images right after the tool result that produced them; look at them."
        )
    else:
        lines.append(
            "- You cannot see images: plots appear only as placeholders such as "
            "[image/png #1, 20.1 KB] (the person reading the notebook sees them). Print the "
            "numbers behind a plot when you need to reason about it."
        )
    lines += [
        "- Long output is cut in the middle: print summaries (shape, dtypes, head(), "
        "describe()) rather than whole datasets.",
        "",
        "How to work:",
        "- Go in small steps and look at the data before analysing it.",
        "- When a call fails, read the error or traceback, fix the code and call again.",
        "- You may call several tools in one turn when the calls do not depend on each "
        "other; they run in order.",
        "- When you have the answer, reply in plain text without calling a tool: give the "
        "findings with their key numbers and name the files and plots you produced.",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ParsedCall:
    """One tool call as the loop uses it; never raises on odd input.

    ``problem`` is set when the call cannot be executed as a function call at all
    (e.g. a custom tool call); the loop then answers it with an error result.
    """

    id: str
    name: str
    arguments: str
    problem: str | None = None


@dataclass(frozen=True)
class ParsedReply:
    """The parts of a chat completion the loop needs."""

    text: str
    calls: list[ParsedCall]
    finish_reason: str | None
    refusal: str | None = None


def _arguments_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments)
    except (TypeError, ValueError):
        return str(arguments)


def _parse_call(raw: Any) -> ParsedCall:
    call_id = str(getattr(raw, "id", None) or f"call_{secrets.token_hex(6)}")
    kind = getattr(raw, "type", "function")
    function = getattr(raw, "function", None)
    if kind == "function" and function is not None:
        name = str(getattr(function, "name", None) or "")
        return ParsedCall(call_id, name, _arguments_text(getattr(function, "arguments", None)))
    custom = getattr(raw, "custom", None)
    name = str(getattr(custom, "name", None) or getattr(function, "name", None) or "")
    arguments = _arguments_text(getattr(custom, "input", None))
    return ParsedCall(
        call_id,
        name,
        arguments,
        problem=f"tool calls of type {kind!r} are not supported; call the tools as functions "
        "with JSON arguments",
    )


def parse_reply(completion: Any) -> ParsedReply:
    """Text, tool calls and finish reason of a chat completion.

    Raises ``ValueError`` only when there is no choice at all (the endpoint's fault).
    """
    choices = getattr(completion, "choices", None) or []
    if not choices:
        raise ValueError("the model endpoint returned a completion without choices")
    choice = choices[0]
    message = getattr(choice, "message", None)
    text = str(getattr(message, "content", None) or "")
    refusal = getattr(message, "refusal", None) or None
    calls = [_parse_call(raw) for raw in (getattr(message, "tool_calls", None) or [])]
    seen: set[str] = set()
    unique = []
    for parsed in calls:  # duplicate ids would make the tool messages ambiguous
        if parsed.id in seen:
            parsed = ParsedCall(
                f"{parsed.id}_{secrets.token_hex(3)}", parsed.name, parsed.arguments, parsed.problem
            )
        seen.add(parsed.id)
        unique.append(parsed)
    return ParsedReply(text, unique, getattr(choice, "finish_reason", None), refusal)


def assistant_message(reply: ParsedReply) -> Message:
    """The model's turn as it goes back into the conversation."""
    message: Message = {"role": "assistant", "content": reply.text or None}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name or "unnamed", "arguments": c.arguments or "{}"},
            }
            for c in reply.calls
        ]
    elif not reply.text:
        message["content"] = reply.refusal or ""
    return message


def tool_message(call_id: str, result: ToolResult) -> Message:
    """The ``tool`` message answering one call: the compact ToolResult JSON."""
    return {"role": "tool", "tool_call_id": call_id, "content": result.model_dump_json()}


def image_message(results: list[tuple[str, ToolResult]]) -> Message | None:
    """One ``user`` message carrying the images of a turn's results, or None without any."""
    parts: list[dict[str, Any]] = []
    for call_id, result in results:
        images = result.image_parts()
        if not images:
            continue
        names = ", ".join(a.name for a in result.artifacts if a.mime_type in VISION_MIMES)
        parts.append({"type": "text", "text": f"Images from tool call {call_id}: {names}"})
        parts.extend(images)
    if not parts:
        return None
    return {"role": "user", "content": parts}
