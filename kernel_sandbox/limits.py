"""Every bound in one place: what a client, a tenant or a sandbox can make the host spend.

Each cap is a constant here with its unit and what it bounds in its docstring
(``SandboxConfig``, ``ServerSettings`` and ``EgressLimits`` fields are the caps a user
sets; their defaults that are caps live here too).  ``tests/unit/test_limits_proven.py``
pairs every one of them with the test that floods it.

Output caps: code in a sandbox can print a gigabyte in a second; the host must not hold
it.  Long output keeps its head and its tail (the tail is where errors and final
results are) and a marker line in between says how much was dropped.  The kernel's
output collector (``kernel/outputs.py``) and the shell's exec stream (``backends/``)
both cut this way and both use :func:`cap_notice`, so a user reads the same sentence.

In the sandbox: the programs of ``kernel_sandbox/programs/`` (and the egress relay)
run on the image's Python and cannot import this module, so their bounds stay where
they run; :data:`IN_SANDBOX` mirrors each one (a unit test checks the values match):

- ``programs/relay.py``: ``ROUTES`` (requests whose senders the relay remembers),
  ``SEND_QUEUE`` (messages each host-facing socket queues), ``IOPUB_DEADLINE``
  (seconds it waits for the kernel's first iopub message), ``LATE_QUIET`` and
  ``LATE_LIMIT`` (seconds a Deno kernel's ``idle`` is held for its request's late
  outputs: until iopub is quiet that long, at most the limit);
- ``programs/launcher.py``: ``SEND_QUEUE`` (messages each kernel socket queues),
  ``_PENDING_WAIT`` (seconds a paced iopub send waits for the host to read);
- ``programs/e2b_process.py``: ``MAX_LINE`` (bytes of one control line);
- ``programs/e2b_files.py``: ``MAX_WATCHED_DIRS`` (directories one recursive watch
  follows);
- ``programs/snapshot.py``: ``REASON_CHARS`` (characters of a reason a variable was
  not saved; the host cuts at :data:`SNAPSHOT_REPORT_TEXT_CHARS` again);
- ``programs/forwarder.py``: ``_MAX_CONNECTIONS`` (connections the in-sandbox egress
  relay, or an exact-ready kernel's bridge, carries at once per listener;
  ``EgressLimits.max_connections`` by default).
"""

from __future__ import annotations

import math
import os
import re
from collections import deque
from typing import NamedTuple

from .results import format_size

__all__ = [
    "ARCHIVE_CHUNK_BYTES",
    "ARCHIVE_MAX_MEMBERS",
    "ARCHIVE_MEMBER_COST_BYTES",
    "ATTACH_CELL_OUTPUT_BYTES",
    "CHECKPOINT_FILES",
    "CWD_COPY_DEADLINE",
    "CWD_COPY_MAX_BYTES",
    "CWD_COPY_MAX_FILES",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DOWNLOAD_WHOLE_BYTES",
    "DRAIN_BYTES",
    "DRAIN_LIMIT",
    "E2B_CONTROL_DEADLINE",
    "E2B_ENTRY_BYTES",
    "E2B_ENTRY_METADATA_BYTES",
    "E2B_FILE_OP_DEADLINE",
    "E2B_LIST_LIMIT",
    "E2B_MAX_DEPTH",
    "E2B_MAX_FRAME",
    "E2B_MAX_PROCESSES",
    "E2B_MAX_TIMEOUT",
    "E2B_MAX_UPLOAD_FILES",
    "E2B_MAX_WATCHERS",
    "E2B_METRICS_SAMPLES",
    "E2B_SUBSCRIBER_QUEUE",
    "E2B_WATCHER_EVENTS",
    "E2B_WATCH_SCAN_ENTRIES",
    "EGRESS_CA_BYTES",
    "EGRESS_PENDING_REFUSALS",
    "ENGINE_LOG_TAIL_BYTES",
    "EVENT_DETAIL_CHARS",
    "FILE_OP_DEADLINE",
    "FILE_OP_RATE",
    "FILE_STREAM_QUEUE",
    "GUARD_CHUNK_BYTES",
    "GUARD_STALL_LIMIT",
    "HEADER_TIMEOUT",
    "HELD_MESSAGES",
    "HOST_TASKS_CEILING",
    "IMAGE_ACCOUNT_FILE_BYTES",
    "IMAGE_DERIVE_SECONDS",
    "IMAGE_PROBE_SECONDS",
    "IMAGE_QUEUE_PER_KEY",
    "IMAGE_RESOLVE_WORKERS",
    "IMAGE_STEP_CHATTER_BYTES",
    "IMAGE_STEP_CPUS",
    "IMAGE_STEP_MEMORY_BYTES",
    "IMAGE_STEP_OUTPUT_BYTES",
    "IMAGE_STEP_PIDS",
    "IMAGE_STEP_TMP_BYTES",
    "IMAGE_VENV_BYTES",
    "IN_SANDBOX",
    "K8S_EXEC_CONNECT_SECONDS",
    "K8S_EXEC_STATUS_BYTES",
    "K8S_STATUS_READ_BYTES",
    "KEEP_ALIVE_TIMEOUT",
    "KERNEL_ARGS_MAX",
    "KERNEL_ARG_MAX_CHARS",
    "KERNEL_ENV_MAX_BYTES",
    "KILL_LIMIT",
    "LIST_ENTRY_BYTES",
    "LIST_LIMIT",
    "LIVE_CALL_OUTPUT_BYTES",
    "LIVE_PAGE_TEXT_CHARS",
    "LIVE_POLL_SECONDS",
    "MALFORMED_WARNING_SECONDS",
    "MAX_422_ERRORS",
    "MAX_422_TEXT",
    "MAX_BODY_BYTES_PER_KEY",
    "MAX_CALLS_PER_KEY",
    "MAX_CODE_CHARS",
    "MAX_CONNECTIONS",
    "MAX_CONTEXTS",
    "MAX_EVENT_BYTES",
    "MAX_HEAD_BYTES",
    "MAX_IMAGE_PIXELS",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_KERNELSPECS_BYTES",
    "MAX_MCP_LINE_BYTES",
    "MAX_MCP_SESSIONS_PER_KEY",
    "MAX_REQUEST_BYTES",
    "MAX_SIZE_BYTES",
    "MAX_SNAPSHOT_BYTES",
    "MAX_SNAPSHOT_FILES",
    "MAX_SNAPSHOT_REPORT_BYTES",
    "MAX_SOCKETS_CAP",
    "MAX_STREAMS_PER_KEY",
    "MCP_MAX_TEXT_CHARS",
    "MCP_REFUSED_HEAD_BYTES",
    "MESSAGE_OVERHEAD",
    "MIN_DISK_BYTES",
    "MIN_MEMORY_BYTES",
    "NOTEBOOK_CALL_IMAGES",
    "NOTEBOOK_CALL_OUTPUT_BYTES",
    "NOTEBOOK_EMBEDDED_FILE_BYTES",
    "NOTEBOOK_IMAGE_BYTES",
    "NOTEBOOK_LANGUAGE_INFO_CHARS",
    "NOTEBOOK_MAX_OUTPUT_BYTES",
    "NOTEBOOK_POINTER_CHARS",
    "NOTEBOOK_TURN_WAIT_SECONDS",
    "POOL_PING_SECONDS",
    "PROCESS_THREADS",
    "PSEUDO_FILE_BYTES",
    "PTY_MAX_PROCESSES",
    "PTY_UNREAD_BYTES",
    "PTY_UPDATE_BYTES",
    "RECEIVE_QUEUE",
    "REPLAY_PROBE_BYTES",
    "REPLY_AFTER_IDLE",
    "REPLY_TEXT_CHARS",
    "SESSION_TTL",
    "SMOLAGENTS_IMAGE_PIXELS",
    "SNAPSHOT_CONNECTION_BYTES",
    "SNAPSHOT_DEADLINE",
    "SNAPSHOT_RATE",
    "SNAPSHOT_REPORT_TEXT_CHARS",
    "STATUS_FIFO_READ_BYTES",
    "STATUS_FILE_READ_BYTES",
    "STATUS_FILE_READ_SECONDS",
    "STATUS_LINE_BYTES",
    "STREAM_EVENT_CONTENT",
    "STREAM_QUEUE_BYTES",
    "THREAD_WORKERS",
    "HeadTail",
    "InSandboxCap",
    "cap_notice",
    "json_shape_error",
    "parse_positive",
    "parse_size",
    "split_bytes",
    "utf8_len",
]

#: ``SandboxConfig.max_output_bytes`` by default: plenty for a person or a model to read.
DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024**2
#: ``SandboxConfig.max_file_bytes`` by default: a file read is held whole in memory.
DEFAULT_MAX_FILE_BYTES = 100 * 1024**2
#: Smallest ``memory_limit`` in bytes: the engine refuses less than 6 MiB and a kernel
#: cannot start in less; below it a value is refused (never read as "no limit").
MIN_MEMORY_BYTES = 32 * 1024**2
#: Smallest ``disk_limit`` in bytes: below it a sandbox cannot even start (the kernel
#: writes to /tmp and $HOME).
MIN_DISK_BYTES = 16 * 1024**2
#: Largest size in bytes any limit may name (1 PiB): past it a number is a typo or an
#: attempt to overflow the engine's 64-bit fields, refused instead of wrapped.
MAX_SIZE_BYTES = 1024**5

#: Bytes of one call's outputs a session notebook records (the caller gets them all,
#: up to ``max_output_bytes``); past it a long stream keeps its ends, the rest a note.
NOTEBOOK_CALL_OUTPUT_BYTES = 2 * 1024**2
#: Images one call records in the notebook; more keep their text form only.
NOTEBOOK_CALL_IMAGES = 16
#: Bytes of one recorded image (base64 as sent); a larger one keeps its text form.
NOTEBOOK_IMAGE_BYTES = 1024**2
#: Bytes of outputs one session notebook holds in all; later calls are recorded
#: without their outputs (a note says so), so a rewrite costs at most about this.
NOTEBOOK_MAX_OUTPUT_BYTES = 32 * 1024**2
#: Members a tar upload (``POST /sandbox/{id}/archive``) may hold; more: refused (400).
ARCHIVE_MAX_MEMBERS = 1000
#: Bytes each archive member counts toward the upload cap besides its size (its
#: header and the writes it costs in the sandbox): many empty members add up too.
ARCHIVE_MEMBER_COST_BYTES = 64 * 1024
#: Bytes of an archive member the server holds at once while it writes it.
ARCHIVE_CHUNK_BYTES = 1024**2
#: Bytes of a downloaded file the server reads whole before it answers: a file this
#: small that changes while read (``/proc`` and ``/sys`` files say 0 or 4096 bytes and
#: send others) is a 400 before any byte, not a response cut short.
DOWNLOAD_WHOLE_BYTES = 1024**2
#: Seconds between two warnings in the host's log about malformed messages from a
#: kernel (those in between are counted in the next): a sandbox cannot fill the log.
MALFORMED_WARNING_SECONDS = 10.0
#: Memory (bytes, swap included) of a container that runs a tenant image's code to
#: probe or derive it: the probe, the venv build and pip's check.
IMAGE_STEP_MEMORY_BYTES = 512 * 1024**2
#: Processes and threads of such a container.
IMAGE_STEP_PIDS = 64
#: CPUs of such a container.
IMAGE_STEP_CPUS = 1.0
#: Bytes of its /tmp (an in-memory filesystem; counts toward its memory).
IMAGE_STEP_TMP_BYTES = 256 * 1024**2
#: Seconds the probe of an image's Python may take before it is killed.
IMAGE_PROBE_SECONDS = 30.0
#: Seconds the venv build (or pip's check) of a derived image may take.
IMAGE_DERIVE_SECONDS = 300.0
#: Bytes of a probe's (or step's) printed output kept; the rest is dropped unread.
IMAGE_STEP_OUTPUT_BYTES = 64 * 1024
#: Bytes of such output after which the step is killed (a probe prints a line).
IMAGE_STEP_CHATTER_BYTES = 4 * 1024**2
#: Bytes of the venv a derive step hands back (its tar on stdout); past it: refused.
IMAGE_VENV_BYTES = 512 * 1024**2
#: Bytes of /etc/passwd or /etc/group read from an image to add the sandbox user.
IMAGE_ACCOUNT_FILE_BYTES = 1024**2
#: Threads that resolve (inspect, pull, probe, derive) images at once, apart from the
#: shared pool; on a server one key holds at most one of them (``IMAGE_QUEUE_PER_KEY``).
IMAGE_RESOLVE_WORKERS = 4
#: Image resolutions one key may have waiting on a server (one runs at a time per key).
IMAGE_QUEUE_PER_KEY = 4

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmg]?)$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(value: object, field: str = "size", minimum: int = 1) -> int:
    """Bytes in a size such as ``"512m"`` (binary units: k, m and g are powers of 1024).

    The one parser of every size limit (memory, disk, the server's maxima): what it
    returns is a whole number of bytes from ``minimum`` to :data:`MAX_SIZE_BYTES`.
    Zero in any spelling (``"0"``, ``"0k"``, ``"0.0g"``, ``" 0"``) is refused with a
    ``ValueError`` naming ``field``, since an engine reads a zero limit as none.
    """
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(
            f"{field}={value!r} is not a size; use a number with b, k, m or g, e.g. '512m'"
        )
    number = float(match[1]) * _UNITS[match[2].lower()]
    if not math.isfinite(number) or number > MAX_SIZE_BYTES:
        raise ValueError(f"{field}={value!r} is too large (at most {format_size(MAX_SIZE_BYTES)})")
    size = int(number)
    if size < max(minimum, 1):
        least = "more than zero" if minimum <= 1 else f"at least {format_size(minimum)}"
        raise ValueError(f"{field}={value!r} is too small: give {least} (zero is not 'unlimited')")
    return size


def parse_positive(value: object, field: str) -> float:
    """A finite number of CPUs or seconds above zero; ``ValueError`` naming ``field`` else.

    Booleans, NaN, infinities, zero and negative numbers are refused: each would read
    as "no limit" (or crash a comparison) further down.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{field}={value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{field}={value!r} is not a number") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{field}={value!r} must be a finite number above zero")
    return number


#: Contexts (kernels) a sandbox may run beside its own: each is a kernel process within
#: the sandbox's memory limit, and each holds a session (sockets, a reader) on the host.
MAX_CONTEXTS = 8
#: Bytes of the image's kernelspec listing the host reads (a few hundred per kernel).
MAX_KERNELSPECS_BYTES = 64 * 1024
#: Arguments a Jupyter client's ``extra_arguments`` may give a sandboxed kernel (each at
#: most 4 KiB); more are refused, with a warning in the client's log.
KERNEL_ARGS_MAX = 64
#: Bytes (names and values) of the environment a Jupyter client sets for a sandboxed
#: kernel that go into the sandbox; variables past it are dropped, with a warning.
KERNEL_ENV_MAX_BYTES = 64 * 1024
#: Files (and folders and links) of a notebook's folder copied into its sandbox
#: (``--cwd-mode copy``); a folder with more is not copied (the kernel starts empty).
CWD_COPY_MAX_FILES = 2000
#: Bytes of a notebook's folder copied into its sandbox (also at most the working
#: directory's share of ``disk_limit``); a larger folder is not copied.
CWD_COPY_MAX_BYTES = 128 * 1024**2

#: Bytes one snapshot may hold on the host (files, variables and tar headers together):
#: a sandbox that writes more is refused, its partial blob removed (``snapshot(max_bytes=)``
#: and a server's settings may lower it).
MAX_SNAPSHOT_BYTES = 4 * 1024**3
#: Entries (files, directories, links, variables; tar members) one snapshot may hold.
MAX_SNAPSHOT_FILES = 100_000
#: Files an exact snapshot's checkpoint may hold, stored or restored (gVisor's checkpoint
#: writes one to three): a checkpoint directory, or a stored archive, with more is refused.
CHECKPOINT_FILES = 16
#: Bytes of an exact snapshot's kernel connection (a small JSON this server stored) read
#: back from the store; a longer blob is refused as damaged.
SNAPSHOT_CONNECTION_BYTES = 64 * 1024
#: Bytes of the report (what was saved, what was not and why) the kernel may print.
MAX_SNAPSHOT_REPORT_BYTES = 4 * 1024**2
#: Seconds a snapshot or restore may take on top of moving its bytes at
#: :data:`SNAPSHOT_RATE`: a kernel that stops reading or writing never holds the host.
SNAPSHOT_DEADLINE = 120.0
#: Bytes per second a snapshot is granted (beyond :data:`SNAPSHOT_DEADLINE`).
SNAPSHOT_RATE = 20e6

# The server's edge: what one client may spend on ``kernel-sandbox serve``.  The first
# group holds without a key (before anyone is known); the rest is per key.

#: Seconds a connection has to send a whole request head (line and headers), counted
#: from the moment it connects or its previous response ended; past it, it is closed.
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection stays open between requests (uvicorn's own).
KEEP_ALIVE_TIMEOUT = 5.0
#: Bytes of one request head (URL and headers); past it the connection gets a 431.
MAX_HEAD_BYTES = 64 * 1024
#: Open client connections; at the cap the oldest one that is idle or still sending its
#: head is closed for a new one (a request being served is never cut).  Clamped below
#: the process's open-file limit, so sandboxes and the engine always get descriptors.
MAX_CONNECTIONS = 1000
#: Most nesting of arrays and objects in a JSON body (413 above), checked before parsing.
MAX_JSON_DEPTH = 64
#: Most values (array items, object members, strings) in one JSON body (413 above),
#: counted on the raw bytes before parsing: a parsed value costs ~50-100 bytes of memory,
#: so a 16 MiB body of ``{}`` (5.6 million objects, ~500 MB) is refused unparsed.
MAX_JSON_VALUES = 100_000
#: Bytes of one request body (413 past it), file uploads aside: a JSON body is parsed
#: whole, and parsing costs about four times the body (the bytes, the decoded text, the
#: values), so 8 MiB of JSON costs ~32 MB to read (code itself is capped at 1 MB).
MAX_REQUEST_BYTES = 8 * 1024**2
#: Bytes of JSON request bodies one key may have read in at once (429 past it; never
#: below ``max_request_bytes``): one full-size body and some small ones side by side,
#: ~50 MB of memory at most, however many the key sends.
MAX_BODY_BYTES_PER_KEY = 12 * 1024**2
#: Errors one 422 lists, and characters of each of its parts: what a refused body gets
#: back never grows with it (and never holds its input).
MAX_422_ERRORS = 20
MAX_422_TEXT = 200
#: Requests one key may have in flight at once (429 past it), streams included.
MAX_CALLS_PER_KEY = 16
#: Server-Sent-Event streams (``?stream=true`` calls, MCP's GET streams) one key may
#: hold open at once (429 past it).
MAX_STREAMS_PER_KEY = 4
#: Bytes of outputs one SSE stream holds for a reader that is slower than the kernel;
#: past it outputs are dropped from the stream (counted, reported in a ``dropped`` event)
#: and the final ``result`` event still carries them all, within ``max_output_bytes``.
STREAM_QUEUE_BYTES = 1024 * 1024
#: MCP sessions one key may hold open over HTTP; a new one past it ends the key's
#: longest-idle session.
MAX_MCP_SESSIONS_PER_KEY = 16
#: Seconds a live-page session cookie (``/ui?api_key=``) stays valid.
SESSION_TTL = 12 * 3600.0
#: Bytes of one JSON-RPC line ``kernel-sandbox mcp`` reads from stdin; a longer
#: line is skipped without being held and answered with an error.
MAX_MCP_LINE_BYTES = 16 * 1024**2
#: Bytes of a refused line's head that ``kernel-sandbox mcp`` keeps to find its id (the
#: error answers that id); the rest of the line is never held.
MCP_REFUSED_HEAD_BYTES = 4096
#: Bytes of a refused (413) body read and thrown away, so that the client, still
#: sending, reads the 413 instead of a reset connection; past this the connection closes.
DRAIN_BYTES = 64 * 1024 * 1024
#: Characters of one text output (and of an HTML output, of a markdown cell's source)
#: the live page renders; a longer text keeps its ends (the notebook has everything).
LIVE_PAGE_TEXT_CHARS = 200_000
#: Bytes of a running call's outputs the live page holds before the call's cell is
#: recorded (the call's result has them all).
LIVE_CALL_OUTPUT_BYTES = 1024 * 1024
#: Seconds a live page's cells request (a long poll) is held waiting for a change before
#: it is answered "no change".
LIVE_POLL_SECONDS = 20.0


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8; O(1) for ASCII text (CPython flags it), the usual case.

    A lone surrogate (JSON allows them) counts as one byte instead of raising.
    """
    return len(text) if text.isascii() else len(text.encode(errors="replace"))


def split_bytes(text: str, size: int) -> tuple[str, str]:
    """``text`` split after at most ``size`` UTF-8 bytes, never inside a character."""
    if text.isascii():
        return text[:size], text[size:]
    # "replace" maps every character, even a lone surrogate, to at least one byte, so
    # the characters that decode whole are exactly a prefix of ``text``.
    keep = len(text.encode(errors="replace")[:size].decode(errors="ignore"))
    return text[:keep], text[keep:]


def cap_notice(dropped_bytes: int, dropped_lines: int, limit: int) -> str:
    """The marker line that stands where output was dropped."""
    return (
        f"[... output capped: {dropped_bytes:,} bytes ({dropped_lines:,} lines) dropped here; "
        f"max_output_bytes={limit:,} keeps the first and last {format_size(limit // 2)} ...]\n"
    )


class HeadTail:
    """The first and last bytes of one byte stream within ``limit`` bytes.

    The first half of the budget keeps the start of the stream; later chunks go to a
    queue that is trimmed from its front, so it always holds the latest bytes.  What
    falls out is only counted (bytes and lines): memory stays at ``limit`` bytes
    however long the stream is, and each chunk costs one copy at most.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        #: Bytes and newlines dropped from the middle.
        self.dropped = 0
        self.dropped_lines = 0

    def add(self, chunk: bytes) -> None:
        """Take the next chunk of the stream."""
        room = self.limit // 2 - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        excess = self._tail_size - (self.limit - self.limit // 2)
        while excess > 0:
            first = self._tail[0]
            if len(first) <= excess:
                cut = self._tail.popleft()
            else:
                cut, self._tail[0] = first[:excess], first[excess:]
            self._tail_size -= len(cut)
            excess -= len(cut)
            self.dropped += len(cut)
            self.dropped_lines += cut.count(b"\n")

    def value(self) -> bytes:
        """The kept bytes, with the marker line (UTF-8) where the middle was dropped."""
        tail = b"".join(self._tail)
        if not self.dropped:
            return bytes(self._head) + tail
        newline = b"" if self._head.endswith(b"\n") else b"\n"
        notice = cap_notice(self.dropped, self.dropped_lines, self.limit).encode()
        return bytes(self._head) + newline + notice + tail


# -- interactive processes (kernel_sandbox.processes) ---------------------------------
#: Bytes of an interactive process's output the host holds until its caller reads them;
#: past this the process waits, as a writer to a full terminal does.
PTY_UNREAD_BYTES = 1 << 20
#: Interactive processes one Agents SDK sandbox session keeps at once (each holds one
#: process beside the kernel and one host stream reading it); starting one more ends
#: the one its caller used least recently (the SDK's own rule for choosing it).
PTY_MAX_PROCESSES = 16
#: Bytes of output one PTY call (``exec_command``, ``write_stdin``) returns at most,
#: whatever its wait and token budget; the rest waits in the process for the next call.
PTY_UPDATE_BYTES = 1 << 20

# -- the E2B-compatible API (kernel_sandbox.server.e2b) -------------------------------
#: Seconds an E2B sandbox may be given to live (create, connect, set_timeout); longer
#: asks are clamped (E2B's own cloud allows 24 hours).
E2B_MAX_TIMEOUT = 24 * 3600.0
#: Commands (envd ``process.Start``) that may run at once in one E2B sandbox; each holds
#: one process beside the kernel and one host thread reading it.
E2B_MAX_PROCESSES = 32
#: Directory watchers (``WatchDir`` and ``CreateWatcher``) one E2B sandbox may hold.
E2B_MAX_WATCHERS = 16
#: Events a non-streaming watcher keeps until ``GetWatcherEvents`` takes them; older
#: events are dropped past this.
E2B_WATCHER_EVENTS = 1000
#: Entries a recursive watcher lists in a directory that appeared while it watched
#: (what was made there before the directory's own watch began, told as created).
E2B_WATCH_SCAN_ENTRIES = 256
#: Bytes of one frame from an in-sandbox helper (a 64 KiB output chunk, an event, a
#: listing record); a larger frame ends the helper: it is not ours.
E2B_MAX_FRAME = 1 << 20
#: Output frames of one command buffered for one slow subscriber before it waits.
E2B_SUBSCRIBER_QUEUE = 64
#: Entries ``ListDir`` returns at most (all depths together); more is refused.
E2B_LIST_LIMIT = 10_000
#: Bytes of one entry of that listing at most (type, size, a 255-byte name,
#: separators): the listing's output is capped at ``(LIST_LIMIT + 1)`` times this.
LIST_ENTRY_BYTES = 300
#: Deepest ``ListDir`` depth honoured (deeper asks are clamped).
E2B_MAX_DEPTH = 32
#: Files one multipart ``POST /files`` may carry.
E2B_MAX_UPLOAD_FILES = 100
#: Seconds a control write to a running command (its stdin, a signal, a resize) may take:
#: it is one short process in the sandbox.
E2B_CONTROL_DEADLINE = 15.0
#: Bytes of one entry a file call's helper prints at most (a JSON line: a 4096-byte path,
#: names, mode...): a call's output is capped at its entries times this.
E2B_ENTRY_BYTES = 6000
#: Bytes of an entry's metadata (its ``user.e2b.*`` xattrs' keys and values) read at
#: most, and the most one upload may set (its ``X-Metadata-*`` headers).
E2B_ENTRY_METADATA_BYTES = 1024
#: Seconds a stat, mkdir, move or listing may take in the sandbox.
E2B_FILE_OP_DEADLINE = 60.0
#: Metrics samples one E2B sandbox keeps for ``get_metrics(start, end)``: each call
#: whose range reaches the present takes one; the oldest are dropped past this.
E2B_METRICS_SAMPLES = 720
#: Bytes of one E2B sandbox's record on the shared record directory (several workers or
#: replicas: :mod:`kernel_sandbox.server.e2b.shared`), its metadata and envVars the most
#: of it: a bigger record is refused at create, and a bigger file is read only to here
#: and ignored.
E2B_RECORD_BYTES = 1 << 20
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_shape_error(
    body: bytes | bytearray, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES
) -> str | None:
    """Why a JSON body is refused before it is parsed (too deep, too many values), or None.

    Parsing is what costs memory (a Python object per value), so this only counts, in
    linear time on the raw bytes and without building anything: string contents are
    taken out (escapes first, so an escaped quote never ends a string), then commas and
    brackets outside strings are counted and the nesting followed.  The count is an
    upper bound for valid JSON; whatever is not JSON is left for the parser to refuse.
    """
    if b"[" not in body and b"{" not in body:
        return None
    bare = body.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in body else body
    strings = bare.count(b'"') // 2
    if strings > max_values:
        return f"the JSON body holds more than {max_values:,} values"
    outside = b"".join(bare.split(b'"')[::2]) if strings else bare
    brackets = sum(outside.count(c) for c in (b"[", b"]", b"{", b"}"))
    if strings + outside.count(b",") + brackets // 2 > max_values:
        return f"the JSON body holds more than {max_values:,} values"
    depth = 0
    for match in _BRACKETS.finditer(outside):
        depth += 1 if match[0] in b"[{" else -1
        if depth > max_depth:
            return f"the JSON body nests deeper than {max_depth} arrays or objects"
    return None


# -- host threads (threads.py) ----------------------------------------------------
#: Worker threads of the shared executor for short blocking calls (engine and API calls,
#: file reads), and of each server key's own (asyncio's default executor's number).
#: Processes beside the kernel do not use them: see PROCESS_THREADS.
THREAD_WORKERS = min(32, (os.cpu_count() or 1) + 4)
#: Processes beside the kernel (execs: shell commands, file helpers, E2B commands and
#: watchers) one owner (a server key; or the process itself, for no key) runs at once,
#: each holding a host thread of its own while it runs; the next is refused.  Above what
#: one key's sandboxes ask for in common use (a key's 16 sandboxes x 16), below what
#: would strain a host (a blocked thread costs tens of KiB).
PROCESS_THREADS = 256


# -- the kernel's messages (kernel/) -----------------------------------------------
#: Room for headers and JSON quoting on top of ``max_output_bytes`` in one message.
MESSAGE_OVERHEAD = 1024**2
#: Characters of an execute_reply's ``ename``/``evalue`` kept (the outputs hold the rest).
REPLY_TEXT_CHARS = 8 * 1024
#: Seconds past ``interrupt_grace`` an interrupted kernel may go on sending (output it
#: queued before the interrupt) before it counts as stuck.
DRAIN_LIMIT = 10.0
#: Seconds an execute_reply (read from shell) may lag behind the ``idle`` status that
#: follows it (read from iopub); the call ends when it comes.  An ``idle`` without a
#: reply in this time was forged by the code (it can publish on iopub with the
#: request's id), and the call goes on.
REPLY_AFTER_IDLE = 1.0
#: Messages (per channel) each host socket queues before the kernel's side has to hold (or drop)
#: them: whatever the host does not read costs at most this many messages, each at
#: most ``max_output_bytes + MESSAGE_OVERHEAD`` bytes (``ZMQ_MAXMSGSIZE``).
RECEIVE_QUEUE = {"iopub": 4, "shell": 2, "control": 2}
#: Largest messages' worth of bytes each host socket may hold unread, frames of one
#: unfinished message included (``guard.py``): ``RECEIVE_QUEUE`` and ``MAXMSGSIZE`` bound
#: complete messages and single frames, this bounds everything.  A message over it (all
#: frames, each charged 64 bytes more) is never delivered: its connection is cut.
HELD_MESSAGES = 2
#: Sockets at most in the shared ZMQ context's table (one slot is a few bytes).
MAX_SOCKETS_CAP = 1 << 16
#: Bytes read from a socket at a time: the most a route holds per direction.
GUARD_CHUNK_BYTES = 1024 * 1024
#: Seconds a route may be held at its bound while the host receives nothing at all.
GUARD_STALL_LIMIT = 10.0
#: Seconds the supervisor gets to report the end of a kernel it was told to kill.
KILL_LIMIT = 5.0


# -- the sandbox's files, tools and notebooks --------------------------------------
#: Entries :meth:`AsyncFiles.list` returns at most; a larger directory is refused.
LIST_LIMIT = 10_000
#: Bytes of one entry of that listing at most (type, size, a 255-byte name,
#: separators): the listing's output is capped at ``(LIST_LIMIT + 1)`` times this.
LIST_ENTRY_BYTES = 300
#: Seconds any file operation may take on top of moving its bytes (at
#: :data:`FILE_OP_RATE`): a process the sandbox stops or blocks (a FIFO) never holds
#: the host longer.
FILE_OP_DEADLINE = 60.0
#: Bytes per second a file operation is granted (beyond :data:`FILE_OP_DEADLINE`).
FILE_OP_RATE = 10e6
#: Characters of ``detail`` (what was read, a listing) put into a FileOperated event.
EVENT_DETAIL_CHARS = 2000
#: Bytes of the largest streamed write whose bytes its FileOperated event carries (for a recorder to
#: embed and replay); a larger one is reported by size only.
STREAM_EVENT_CONTENT = 256 * 1024
#: Output pieces (64 KiB each at most) of a streamed read waiting for the consumer.
FILE_STREAM_QUEUE = 16
#: Bytes a streamed read takes of a file that says it has none (``/proc``'s and
#: ``/sys``'s files are small; ``/proc/self/pagemap`` is endless): past this it is
#: refused, as a file over the size cap is.
PSEUDO_FILE_BYTES = 1024**2
#: Bytes of the longest SSE line the remote client accepts (an output bigger than this
#: is an error).
MAX_EVENT_BYTES = 64 * 1024 * 1024
#: Characters of text one MCP tool result carries; the rest is cut in the middle.
MCP_MAX_TEXT_CHARS = 100_000
#: Characters of the longest cell a model may send.  Megabytes of code keep the kernel
#: compiling (and formatting the traceback of) one line where an interrupt cannot reach
#: it: the call ends "stuck" and the kernel is restarted, losing every variable.  Data belongs in a
#: file (file_operation), not in the source.
MAX_CODE_CHARS = 256 * 1024
#: Bytes of a written file a notebook cell embeds (for replay); larger ones are
#: described, not embedded (the notebook would balloon).
NOTEBOOK_EMBEDDED_FILE_BYTES = 256 * 1024
#: Characters a notebook keeps of each string a kernel reports of itself (its
#: ``language_info`` fields, its kernelspec's names): what the kernel says is the
#: sandbox's, so a kernel reporting a megabyte of "version" costs the notebook this.
NOTEBOOK_LANGUAGE_INFO_CHARS = 200
#: Pixels of the largest image compared by its pixels; larger ones are compared by their
#: bytes only: decoding and differencing one costs
#: about 10 bytes of host memory per pixel (a 2x retina plot is about 1.5 M pixels).
MAX_IMAGE_PIXELS = 8_000_000
#: Pixels (width x height) of the largest image the smolagents integration decodes into
#: an ``AgentImage``; larger ones are named in the logs instead of decoded on the host.
SMOLAGENTS_IMAGE_PIXELS = 40_000_000
#: Characters of a notebook pointer file read (a pointer is a path, at most PATH_MAX =
#: 4096 bytes); what is longer is not a pointer.
NOTEBOOK_POINTER_CHARS = 4096
#: Seconds a writer waits for a notebook's lock while a writer may keep its turn (a turn
#: FIFO is there, :mod:`kernel_sandbox.notebook.shared`); then it gives up (NotebookError:
#: its cells are written by a later write).  A poked keeper lets go after one write, so
#: only a keeper that cannot hear the poke holds it this long: one on another host
#: (``serve --keep-notebook-turns`` on a volume shared across nodes), which lets go
#: only when its calls stop.
NOTEBOOK_TURN_WAIT_SECONDS = 30.0
#: Characters of the answer of the replay's kernel probe (one small JSON line); a longer
#: answer is not one.
REPLAY_PROBE_BYTES = 4096
#: Characters of a name, reason or module name kept from a snapshot's report (the kernel
#: writes it; ``programs/snapshot.py`` cuts reasons at the same length).
SNAPSHOT_REPORT_TEXT_CHARS = 300
#: Seconds a pooled sandbox may take to answer a ping before it is discarded as unhealthy.
POOL_PING_SECONDS = 3.0
#: Characters of one kernel argument a Jupyter client's ``extra_arguments`` may pass on;
#: a longer one (or one holding a NUL) is dropped, with a warning.
KERNEL_ARG_MAX_CHARS = 4096
#: Seconds the copy of a notebook's folder (``--cwd-mode copy``) may take to unpack in
#: the sandbox.
CWD_COPY_DEADLINE = 60.0


# -- the kernel hosts (backends/) --------------------------------------------------
#: Bytes of the engine's log read back for a start error (lines can be 16 KiB each).
ENGINE_LOG_TAIL_BYTES = 64 * 1024
#: Bytes read at most from the status FIFO per check: a sandbox that writes into
#: it without pause cannot keep the host reading.
STATUS_FIFO_READ_BYTES = 1 << 20
#: Bytes of an unfinished status line; a longer one is not a report (they are ~20 bytes): dropped.
STATUS_LINE_BYTES = 256
#: Bytes of the tcp status file read (through the engine); it is one or two ~20-byte lines
#: (the supervisor truncates it), so this much is plenty; more is the sandbox's junk.
STATUS_FILE_READ_BYTES = 4096
#: Seconds a tcp status read may take: the file is the sandbox's, so it may be a FIFO.
STATUS_FILE_READ_SECONDS = 2.0
#: Bytes of an egress CA bundle; a larger one is not a CA bundle.
EGRESS_CA_BYTES = 16 * 1024**2
#: Egress refusals waiting to be reported to the sandbox's listeners (older: dropped).
EGRESS_PENDING_REFUSALS = 50
#: Bytes of a Kubernetes exec's status channel (one small JSON document; more is not a
#: status).
K8S_EXEC_STATUS_BYTES = 64 * 1024
#: Bytes of the supervisor's status file read from a pod (with a time limit): the sandbox can
#: replace it with a link to /dev/zero or a FIFO.
K8S_STATUS_READ_BYTES = 64 * 1024
#: Seconds to open a Kubernetes exec's websocket (TLS and the upgrade through the API
#: server to the kubelet).
K8S_EXEC_CONNECT_SECONDS = 30
#: Host tasks (processes and threads) one gVisor sandbox may hold at most, whatever its
#: ``pids_limit``: a host with the classic ``kernel.pid_max`` of 32768 keeps half for
#: everything else.  It covers the stub threads of up to 83 busy processes inside (see
#: ``backends/docker/runtimes.gvisor_host_pids``).
HOST_TASKS_CEILING = 16384


# -- the CLI ---------------------------------------------------------------------
#: Bytes of output ``kernel-sandbox attach`` records per cell (the console shows all of
#: it; the notebook keeps this).
ATTACH_CELL_OUTPUT_BYTES = 1 << 20


# -- in the sandbox (programs/): mirrors, see the module docstring -----------------


class InSandboxCap(NamedTuple):
    """A bound a program enforces inside the sandbox (it cannot import this module)."""

    #: The program's path in the package, e.g. ``programs/relay.py``.
    program: str
    #: The constant's name in that program.
    name: str
    #: Its value, which a unit test checks against the program's.
    value: int | float


#: Every bound the in-sandbox programs hold, as they hold it.
IN_SANDBOX = (
    InSandboxCap("programs/relay.py", "ROUTES", 4096),
    InSandboxCap("programs/relay.py", "SEND_QUEUE", 16),
    InSandboxCap("programs/relay.py", "IOPUB_DEADLINE", 60.0),
    InSandboxCap("programs/relay.py", "LATE_QUIET", 0.05),
    InSandboxCap("programs/relay.py", "LATE_LIMIT", 1.0),
    InSandboxCap("programs/launcher.py", "SEND_QUEUE", 16),
    InSandboxCap("programs/launcher.py", "_PENDING_WAIT", 10.0),
    InSandboxCap("programs/e2b_process.py", "MAX_LINE", 1 << 20),
    InSandboxCap("programs/e2b_files.py", "MAX_WATCHED_DIRS", 1000),
    InSandboxCap("programs/snapshot.py", "REASON_CHARS", SNAPSHOT_REPORT_TEXT_CHARS),
    InSandboxCap("programs/forwarder.py", "_MAX_CONNECTIONS", 32),
)
