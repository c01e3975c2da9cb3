"""ToolResult: what a tool call hands back, small enough to paste into a conversation.

A model sees ``result.model_dump_json()``: compact text, images and other binary data
as *named placeholders* (``[image/png #1, 23.4 KB]``), long text cut head + tail with a
marker saying how much was left out.  Python callers (the notebook recorder, a vision
helper) still get everything: the full nbformat outputs live in an excluded field, and
:meth:`ToolResult.images` / :meth:`ToolResult.image_parts` decode them.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from ..results import decoded_size, format_size, output_text

__all__ = [
    "Artifact",
    "ToolResult",
    "ToolStatus",
    "capped_note",
    "render_outputs",
    "truncate_middle",
]

ToolStatus = Literal["success", "error", "timeout"]

#: Image types a vision model accepts as ``image_url`` data URLs.
VISION_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def truncate_middle(text: str, limit: int) -> tuple[str, int]:
    """Cut ``text`` to about ``limit`` characters, keeping its head and its tail.

    Returns the text and the number of characters left out.  The cut falls on line
    boundaries when one is near, and a marker in the middle says how much is missing,
    so a model knows the output is incomplete (and the tail keeps tracebacks).
    """
    if len(text) <= limit:
        return text, 0
    head_budget = limit // 2
    tail_budget = limit - head_budget
    head = text[:head_budget]
    tail = text[len(text) - tail_budget :]
    newline = head.rfind("\n")
    if newline > head_budget * 0.8:
        head = head[: newline + 1]
    newline = tail.find("\n")
    if 0 <= newline < tail_budget * 0.2:
        tail = tail[newline + 1 :]
    omitted = len(text) - len(head) - len(tail)
    lines = text.count("\n", len(head), len(text) - len(tail))
    marker = f"[... {omitted:,} characters ({lines:,} lines) omitted ...]"
    sep_head = "" if head.endswith("\n") else "\n"
    sep_tail = "" if not tail or tail.startswith("\n") else "\n"
    return f"{head}{sep_head}{marker}{sep_tail}{tail}", omitted


def capped_note(text: str, truncated_bytes: int) -> str:
    """``text`` ending with a line saying the sandbox dropped output, when it did.

    The sandbox's own marker sits in the middle of the text, where a later cut for the
    model (:func:`truncate_middle`) may remove it; the last line always survives.
    """
    if not truncated_bytes:
        return text
    note = (
        f"[output capped by the sandbox: {format_size(truncated_bytes)} dropped from the "
        "middle; print less, or write large output to a file and read parts of it]"
    )
    return f"{text}\n{note}" if text else note


class Artifact(BaseModel):
    """A binary output (image, PDF, ...) named in the text instead of inlined."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Placeholder name used in `output`, e.g. 'image/png #1'.")
    mime_type: str
    size: int = Field(description="Decoded size in bytes.")
    output_index: int = Field(default=0, exclude=True, repr=False)

    @property
    def placeholder(self) -> str:
        """The text shown to a model in place of the data."""
        return f"[{self.name}, {format_size(self.size)}]"


def render_outputs(outputs: list[dict[str, Any]]) -> tuple[str, list[Artifact]]:
    """nbformat outputs as compact text, with every binary payload a numbered placeholder.

    Text outputs are rendered like :attr:`Execution.text` (streams verbatim, rich data
    by its plain view, tracebacks without colour codes).
    """
    artifacts: list[Artifact] = []
    parts: list[str] = []
    for index, output in enumerate(outputs):

        def placeholder(mime: str, payload: Any, index: int = index) -> str:
            artifact = Artifact(
                name=f"{mime} #{len(artifacts) + 1}",
                mime_type=mime,
                size=decoded_size(payload),
                output_index=index,
            )
            artifacts.append(artifact)
            return artifact.placeholder

        parts.append(output_text(output, placeholder))
    return "\n".join(p for p in parts if p).strip("\n"), artifacts


class ToolResult(BaseModel):
    """The outcome of one tool call; never an exception, whatever went wrong.

    ``status`` is ``success``, ``error`` (the code raised, the command failed, the
    arguments were wrong, the sandbox is gone, ...) or ``timeout``.  ``output`` is the
    text for the model, ``error`` a one-line reason when something failed.  ``metadata``
    carries ``execution_count``, ``exit_code``, ``state_lost`` and whatever else the tool
    knows.  ``artifacts`` names the binary outputs; their data is in :attr:`outputs`,
    which is excluded from serialisation so the JSON stays small.
    """

    model_config = ConfigDict(extra="forbid")

    status: ToolStatus
    tool_name: str
    output: str = ""
    error: str | None = None
    execution_time: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[Artifact] = Field(default_factory=list)
    #: Full nbformat outputs (with base64 data) for Python callers; never serialised.
    outputs: list[dict[str, Any]] = Field(default_factory=list, exclude=True, repr=False)
    #: The untruncated text when ``output`` was cut; never serialised.
    full_output: str | None = Field(default=None, exclude=True, repr=False)

    @field_serializer("execution_time")
    def _round_time(self, value: float) -> float:
        return round(value, 3)

    @property
    def ok(self) -> bool:
        """True when the tool call succeeded."""
        return self.status == "success"

    @classmethod
    def failure(
        cls,
        tool_name: str,
        error: str,
        *,
        status: ToolStatus = "error",
        output: str = "",
        metadata: dict[str, Any] | None = None,
    ) -> ToolResult:
        """An error result with a message the model can act on."""
        return cls(
            status=status,
            tool_name=tool_name,
            output=output,
            error=error,
            metadata=dict(metadata or {}),
        )

    def images(self, mime: str = "image/png") -> list[bytes]:
        """Decoded images of one MIME type, in output order."""
        return [self.artifact_bytes(a) for a in self.artifacts if a.mime_type == mime]

    def artifact_bytes(self, artifact: Artifact | str) -> bytes:
        """The data behind one placeholder, given the artifact or its name."""
        if isinstance(artifact, str):
            found = next((a for a in self.artifacts if a.name == artifact), None)
            if found is None:
                names = ", ".join(a.name for a in self.artifacts) or "none"
                raise KeyError(f"no artifact named {artifact!r}; this result has: {names}")
            artifact = found
        payload = self.outputs[artifact.output_index]["data"][artifact.mime_type]
        if isinstance(payload, str):
            return base64.b64decode(payload)
        return json.dumps(payload).encode() if not isinstance(payload, bytes) else payload

    def image_parts(self) -> list[dict[str, Any]]:
        """Images as Chat Completions ``image_url`` content parts (base64 data URLs)."""
        parts = []
        for artifact in self.artifacts:
            if artifact.mime_type not in VISION_MIMES:
                continue
            payload = self.outputs[artifact.output_index]["data"][artifact.mime_type]
            if not isinstance(payload, str):
                continue
            url = f"data:{artifact.mime_type};base64,{payload.replace(chr(10), '')}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        return parts

    def to_message_content(self, *, vision: bool = False) -> str | list[dict[str, Any]]:
        """Content for the ``tool`` message that answers this call.

        Without ``vision`` (or without images) it is the compact JSON string; with it,
        a list of content parts: the JSON as text, then every image as an image part
        (placeholders in the JSON tell the model which image is which).
        """
        text = self.model_dump_json()
        images = self.image_parts() if vision else []
        if not images:
            return text
        return [{"type": "text", "text": text}, *images]

    def to_tool_message(self, tool_call_id: str, *, vision: bool = False) -> dict[str, Any]:
        """A complete Chat Completions ``tool`` message for this result."""
        return {
            "role": "tool",
            "tool_call_id": tool_call_id,
            "name": self.tool_name,
            "content": self.to_message_content(vision=vision),
        }
