"""What a session notebook keeps of each call's outputs, and of all of them together.

A call may return up to ``max_output_bytes`` of each kind of output (10 MiB by
default), and the recorder rewrites the whole notebook after every step: 25 calls of
10 MiB made a 240 MiB notebook, grew a server by 800 MB and each write by seconds.
So the notebook keeps less than the caller got, with a note where it kept less:

- one call's outputs: :data:`~kernel_sandbox.limits.NOTEBOOK_CALL_OUTPUT_BYTES` in
  all (a long stream keeps its head and tail), at most
  :data:`~kernel_sandbox.limits.NOTEBOOK_CALL_IMAGES` images of at most
  :data:`~kernel_sandbox.limits.NOTEBOOK_IMAGE_BYTES` each (past them an image keeps
  its text form);
- the whole notebook: :data:`~kernel_sandbox.limits.NOTEBOOK_MAX_OUTPUT_BYTES` of
  outputs; past it, calls are still recorded (their code, status, metadata) but
  their outputs are replaced by a note.

So a rewrite costs at most that much, however long the session: the writer's cost no
longer grows with what the code printed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nbformat.v4 import new_output

from ..limits import (
    NOTEBOOK_CALL_IMAGES,
    NOTEBOOK_CALL_OUTPUT_BYTES,
    NOTEBOOK_IMAGE_BYTES,
    NOTEBOOK_MAX_OUTPUT_BYTES,
    split_bytes,
    utf8_len,
)
from ..results import format_size

__all__ = ["OutputBudget", "output_size"]


def output_size(output: Any) -> int:
    """Bytes an output takes in the notebook's JSON (about: text counted as UTF-8)."""
    if output.get("output_type") == "stream":
        return _text_size(output.get("text", ""))
    if output.get("output_type") == "error":
        return sum(_text_size(line) for line in output.get("traceback", [])) + 256
    data = output.get("data") or {}
    return sum(
        _text_size(v) if isinstance(v, str | list) else len(json.dumps(v, default=str))
        for v in data.values()
    )


def _text_size(text: Any) -> int:
    if isinstance(text, list):
        return sum(utf8_len(str(line)) for line in text)
    return utf8_len(str(text))


def _is_image(output: Any) -> bool:
    return any(str(mime).startswith("image/") for mime in (output.get("data") or {}))


def _note(text: str) -> Any:
    return new_output("stream", name="stderr", text=f"[kernel-sandbox: {text}]\n")


def _cut_stream(output: Any, room: int) -> Any:
    text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
    head, rest = split_bytes(text, room // 2)
    _, tail = split_bytes(rest, max(utf8_len(rest) - room // 2, 0))
    dropped = utf8_len(text) - utf8_len(head) - utf8_len(tail)
    marker = f"\n[... {dropped:,} bytes not recorded in the notebook ...]\n"
    return {**output, "text": head + marker + tail}


class OutputBudget:
    """The notebook-wide budget of recorded outputs; :meth:`take` applies both caps."""

    def __init__(self, total: int = NOTEBOOK_MAX_OUTPUT_BYTES) -> None:
        self.total = total
        self.used = 0

    def take(self, outputs: Sequence[Any]) -> list[Any]:
        """The outputs one call records (with notes where it records less)."""
        if not outputs:
            return []
        if self.used >= self.total:
            return [
                _note(
                    f"outputs not recorded: this notebook holds its maximum of "
                    f"{format_size(self.total)} of outputs"
                )
            ]
        room = min(NOTEBOOK_CALL_OUTPUT_BYTES, self.total - self.used)
        kept: list[Any] = []
        images = dropped = dropped_images = 0
        for output in outputs:
            size = output_size(output)
            if _is_image(output):
                if images >= NOTEBOOK_CALL_IMAGES or size > NOTEBOOK_IMAGE_BYTES:
                    dropped_images += 1
                    plain = (output.get("data") or {}).get("text/plain")
                    if plain is None:
                        continue
                    output = {**output, "data": {"text/plain": plain}}
                    size = output_size(output)
                else:
                    images += 1
            if size <= room:
                kept.append(output)
                room -= size
            elif output.get("output_type") == "stream" and room > 1024:
                kept.append(_cut_stream(output, room))
                dropped += size - room
                room = 0
            else:
                dropped += size
        self.used += sum(output_size(o) for o in kept)
        if dropped:
            kept.append(
                _note(
                    f"{format_size(dropped)} of this call's outputs not recorded (a call "
                    f"records at most {format_size(NOTEBOOK_CALL_OUTPUT_BYTES)}; the caller "
                    "got them all)"
                )
            )
        if dropped_images:
            kept.append(
                _note(
                    f"{dropped_images} image(s) recorded as text only (a call records at "
                    f"most {NOTEBOOK_CALL_IMAGES} images of {format_size(NOTEBOOK_IMAGE_BYTES)})"
                )
            )
        return kept
