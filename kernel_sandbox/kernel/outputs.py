"""Turn the iopub messages of one request into nbformat v4 outputs, as Jupyter does.

Consecutive stream chunks of the same stream are merged; ``clear_output`` (with and
without ``wait``) and ``update_display_data`` behave as in the notebook; outputs keep
their order.  Messages are raw jupyter_client dicts (TypedDict-shaped) and never leave
this layer except as output dicts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OUTPUT_MSG_TYPES", "OutputCollector"]

OUTPUT_MSG_TYPES = frozenset(
    {"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"}
)
Message = dict[str, Any]
Output = dict[str, Any]


class OutputCollector:
    """Accumulates the outputs of one execution.

    ``add`` returns the output that a live listener should see (the new or updated
    output), or ``None`` when the message changed nothing visible yet.
    """

    def __init__(self) -> None:
        self.outputs: list[Output] = []
        self._clear_pending = False
        # display_id -> indexes of outputs showing that display
        self._displays: dict[str, list[int]] = {}

    def add(self, msg: Message) -> Output | None:
        msg_type = msg["header"]["msg_type"]
        content = msg["content"]
        if msg_type == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
            return None
        if msg_type == "update_display_data":
            return self._update_display(content)
        if msg_type not in OUTPUT_MSG_TYPES:
            return None
        if self._clear_pending:
            self._clear()
        output = _output_from(msg_type, content)
        if msg_type == "stream":
            output["text"] = _carriage_return(output["text"])
            last = self.outputs[-1] if self.outputs else None
            if last and last["output_type"] == "stream" and last["name"] == output["name"]:
                last["text"] = _carriage_return(last["text"] + output["text"])
                return dict(output)
        display_id = content.get("transient", {}).get("display_id")
        if display_id:
            self._displays.setdefault(display_id, []).append(len(self.outputs))
        self.outputs.append(output)
        return output

    def _clear(self) -> None:
        self.outputs.clear()
        self._displays.clear()
        self._clear_pending = False

    def _update_display(self, content: dict[str, Any]) -> Output | None:
        display_id = content.get("transient", {}).get("display_id")
        updated = None
        for index in self._displays.get(display_id or "", []):
            output = self.outputs[index]
            output["data"] = content["data"]
            output["metadata"] = content.get("metadata", {})
            updated = output
        return updated


def _output_from(msg_type: str, content: dict[str, Any]) -> Output:
    """The nbformat v4 output for an iopub message, as ``nbformat.v4.output_from_msg``
    builds it but without validating it against the schema on every message (that
    costs 0.1-0.35 ms per output on the per-call path; notebooks are validated when
    they are written).
    """
    if msg_type == "stream":
        return {"output_type": "stream", "name": content["name"], "text": content["text"]}
    if msg_type == "error":
        return {
            "output_type": "error",
            "ename": content["ename"],
            "evalue": content["evalue"],
            "traceback": list(content["traceback"]),
        }
    output: Output = {
        "output_type": msg_type,
        "data": content["data"],
        "metadata": content.get("metadata", {}),
    }
    if msg_type == "execute_result":
        output["execution_count"] = content["execution_count"]
    return output


def _carriage_return(text: str) -> str:
    """Apply ``\\r`` the way a terminal would (progress bars overwrite their line).

    A trailing ``\\r`` is kept, so the next chunk still overwrites that line.
    """
    if "\r" not in text:
        return text
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            pieces = [p for p in line.split("\r") if p]
            tail = "\r" if line.endswith("\r") else ""
            line = (pieces[-1] if pieces else "") + tail
        lines.append(line)
    return "\n".join(lines)
