"""What an iopub output message must look like before the host uses it.

Code in a sandbox can sign and send any message on the kernel's sockets: a
``display_data`` whose ``data`` is a list, a ``stream`` without text, an ``error``
whose traceback is a number.  Taken as they come, such messages raised deep in the
host (an HTTP 500 and two tracebacks in the server's log per call).  Each output
message is checked here first; a malformed one becomes a short note in the call's
stderr, and the host logs it as one warning line, at most once per
:data:`~kernel_sandbox.limits.MALFORMED_WARNING_SECONDS` (the rest are counted).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..limits import MALFORMED_WARNING_SECONDS

__all__ = ["MALFORMED_WARNINGS", "RateLimitedWarning", "malformed", "malformed_note"]

log = logging.getLogger("kernel_sandbox.kernel")

_RICH = ("display_data", "execute_result", "update_display_data")


def _bundle_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"data is a {type(data).__name__}, not an object"
    for mime, value in data.items():
        if not isinstance(mime, str) or "/" not in mime:
            return "data has a key that is not a MIME type"
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            continue  # lines, as nbformat stores them
        if not isinstance(value, str) and not (isinstance(value, dict) and "json" in mime):
            return f"data[{mime[:40]!r}] is a {type(value).__name__}, not text"
    return None


def malformed(msg_type: str, content: Any) -> str | None:
    """Why an output message of ``msg_type`` cannot be used, or None when it can."""
    if not isinstance(content, dict):
        return "its content is not an object"
    if msg_type == "stream":
        if content.get("name") not in ("stdout", "stderr"):
            return "a stream that is neither stdout nor stderr"
        return None if isinstance(content.get("text"), str) else "a stream without text"
    if msg_type == "error":
        traceback = content.get("traceback", [])
        if not isinstance(content.get("ename", ""), str) or not isinstance(
            content.get("evalue", ""), str
        ):
            return "an error whose name or value is not text"
        if not isinstance(traceback, list) or not all(isinstance(t, str) for t in traceback):
            return "an error whose traceback is not a list of lines"
        return None
    if msg_type in _RICH:
        problem = _bundle_problem(content.get("data"))
        if problem:
            return problem
        if not isinstance(content.get("metadata", {}), dict):
            return "metadata is not an object"
        transient = content.get("transient", {})
        if not isinstance(transient, dict) or not isinstance(transient.get("display_id", ""), str):
            return "transient is not an object with a text display_id"
        count = content.get("execution_count")
        if msg_type == "execute_result" and not (count is None or type(count) is int):
            return "execution_count is not a number"
    return None


def malformed_note(msg_type: str, problem: str) -> str:
    """The line that stands in a call's stderr for a dropped malformed message."""
    return f"[kernel-sandbox dropped a malformed {msg_type[:40]} message: {problem}]\n"


class RateLimitedWarning:
    """One warning line per ``interval`` seconds; the ones in between are counted."""

    def __init__(
        self, interval: float = MALFORMED_WARNING_SECONDS, logger: logging.Logger = log
    ) -> None:
        self.interval = interval
        self.logger = logger
        self._next = 0.0
        self._skipped = 0
        self._lock = threading.Lock()

    def warn(self, message: str) -> bool:
        """Log ``message`` (at most 200 characters) unless one was logged just now."""
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                self._skipped += 1
                return False
            skipped, self._skipped = self._skipped, 0
            self._next = now + self.interval
        more = f" ({skipped} more since the last warning)" if skipped else ""
        self.logger.warning("%s%s", message[:200], more)
        return True


#: The process-wide limiter of malformed-message warnings.
MALFORMED_WARNINGS = RateLimitedWarning()
