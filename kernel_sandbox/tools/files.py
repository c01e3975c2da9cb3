"""file_operation: read, write, list and manage files in the sandbox.

The sandbox reports every file operation to its listeners itself (a
:class:`~kernel_sandbox.events.FileOperated` event tagged with the tool call), so
nothing here feeds a recorder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import FileOperationError, SandboxFileNotFoundError
from ..results import FileInfo, format_size
from .base import PATH_MAX, OsText, Text, Tool, ToolOptions, register_tool
from .results import ToolResult
from .schema import SchemaFormat
from .texts import where_text

if TYPE_CHECKING:
    from ..protocols import SandboxLike

__all__ = ["FileOperation", "FileOperationOptions", "FileParams", "Operation"]

Operation = Literal["read", "write", "append", "list", "delete", "exists", "mkdir"]
OPERATIONS: tuple[str, ...] = get_args(Operation)


class FileParams(BaseModel):
    """Arguments of file_operation."""

    model_config = ConfigDict(extra="forbid")

    operation: Operation = Field(description="What to do.")
    file_path: OsText = Field(max_length=PATH_MAX, description="Path in the sandbox.")
    content: Text | None = Field(default=None, description="Text for write and append.")
    encoding: OsText | None = Field(
        default=None, max_length=64, description="Text encoding; utf-8 when null."
    )


class FileOperationOptions(ToolOptions):
    """``tools_config["file_operation"]``."""

    operations: tuple[Operation, ...] = Field(
        default=OPERATIONS,  # type: ignore[arg-type]
        description="Operations the model may use, e.g. ('read', 'list', 'exists') for read-only.",
    )

    @field_validator("operations")
    @classmethod
    def _not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("needs at least one operation; disable the tool with enabled=False")
        return value


def _listing(path: str, entries: list[FileInfo]) -> str:
    if not entries:
        return f"{path} is empty"
    labels = [e.name + "/" if e.type == "directory" else e.name for e in entries]
    width = max(len(label) for label in labels) + 2
    noun = "entry" if len(entries) == 1 else "entries"
    lines = [f"{path} ({len(entries)} {noun})"]
    for label, entry in zip(labels, entries, strict=True):
        kind = {"directory": "directory", "file": format_size(entry.size)}.get(entry.type)
        lines.append(f"{label:<{width}}{kind or entry.type}")
    return "\n".join(lines)


@register_tool
class FileOperation(Tool):
    """Files in the sandbox through the engine, beside the kernel."""

    name = "file_operation"
    Params = FileParams
    Options = FileOperationOptions
    options: FileOperationOptions

    def describe(self, sandbox: SandboxLike) -> str:
        ops = self.options.operations
        known = {
            "read": "read returns a text file's content",
            "write": "write creates or replaces a file with `content` (parent directories are "
            "created)",
            "append": "append adds `content` to the end of a file",
            "list": "list shows a directory's entries with sizes",
            "delete": "delete removes a file or a whole directory",
            "exists": "exists tells whether a path exists",
            "mkdir": "mkdir creates a directory and its parents",
        }
        return (
            "Read, write and manage files in the sandbox (text files; use python_executor "
            "for binary data such as images or parquet). Operations: "
            + "; ".join(known[op] for op in ops)
            + ". Files are shared with python_executor and shell_executor. "
            + where_text(sandbox)
            + f" Output longer than {self.options.max_output_chars} characters is cut in the "
            "middle."
        )

    def parameter_descriptions(self, sandbox: SandboxLike) -> dict[str, str]:
        return {
            "operation": "One of: " + ", ".join(self.options.operations) + ".",
            "file_path": (
                f"File or directory path, absolute or relative to {sandbox.working_dir}."
            ),
            "content": "The text to write or append; null for other operations.",
            "encoding": "Text encoding for read, write and append; null means utf-8.",
        }

    def schema(
        self, sandbox: SandboxLike, format: SchemaFormat = "chat", *, strict: bool = True
    ) -> dict[str, Any]:
        schema = super().schema(sandbox, format, strict=strict)
        params = schema["function"]["parameters"] if format == "chat" else schema["parameters"]
        params["properties"]["operation"]["enum"] = list(self.options.operations)
        return schema

    async def run(self, sandbox: SandboxLike, params: FileParams) -> ToolResult:
        path = sandbox.resolve_path(params.file_path) if params.file_path.strip() else ""
        return await self._dispatch(sandbox, params, path)

    async def _dispatch(self, sandbox: SandboxLike, params: FileParams, path: str) -> ToolResult:
        op = params.operation
        fail = ToolResult.failure
        if op not in self.options.operations:
            allowed = ", ".join(self.options.operations)
            return fail(self.name, f"operation {op!r} is not enabled here; use one of: {allowed}")
        if not path:
            return fail(self.name, "file_path is empty; give a path such as 'notes.txt'")
        encoding = params.encoding or "utf-8"
        try:
            # not codecs.lookup: it also knows bytes-to-bytes codecs such as 'rot13'
            "".encode(encoding)
        except LookupError:
            return fail(self.name, f"unknown encoding {encoding!r}; use e.g. 'utf-8'")
        if op in ("write", "append") and params.content is None:
            return fail(self.name, f"operation {op!r} needs `content` (the text to {op})")
        try:
            return await self._operate(sandbox, params, path, encoding)
        except SandboxFileNotFoundError:
            down = await sandbox.health()
            if down:
                return fail(self.name, f"the sandbox is not running: {down}")
            return fail(
                self.name,
                f"no such file or directory in the sandbox: {path}; use operation 'list' on "
                "its parent directory to see what exists",
                metadata={"path": path},
            )
        except FileOperationError as exc:
            down = await sandbox.health()
            message = f"the sandbox is not running: {down}" if down else str(exc)
            return fail(self.name, message, metadata={"path": path})

    async def _operate(
        self, sandbox: SandboxLike, params: FileParams, path: str, encoding: str
    ) -> ToolResult:
        op, files = params.operation, sandbox.files

        def ok(output: str, **metadata: Any) -> ToolResult:
            return ToolResult(
                status="success",
                tool_name=self.name,
                output=output,
                metadata={"path": path, **metadata},
            )

        if op == "read":
            data = await files.read(path)
            try:
                text = data.decode(encoding)
            except UnicodeDecodeError as exc:
                return ToolResult.failure(
                    self.name,
                    f"{path} is not {encoding} text ({exc.reason} at byte {exc.start}, "
                    f"{format_size(len(data))}); open binary files with python_executor",
                    metadata={"path": path},
                )
            return ok(text, size=len(data))
        if op in ("write", "append"):
            try:
                payload = (params.content or "").encode(encoding)
            except UnicodeEncodeError as exc:
                return ToolResult.failure(
                    self.name,
                    f"`content` cannot be written as {encoding} ({exc.reason}: "
                    f"{exc.object[exc.start : exc.start + 1]!r} at position {exc.start}); "
                    "use encoding 'utf-8'",
                    metadata={"path": path},
                )
            if op == "write":
                await files.write(path, payload)
                return ok(f"wrote {format_size(len(payload))} to {path}", size=len(payload))
            await files.append(path, payload)
            return ok(f"appended {format_size(len(payload))} to {path}", size=len(payload))
        if op == "list":
            entries = await files.list(path)
            return ok(_listing(path, entries), entries=len(entries))
        if op == "delete":
            await files.remove(path)
            return ok(f"deleted {path}")
        if op == "exists":
            exists = await files.exists(path)
            return ok(f"{path} {'exists' if exists else 'does not exist'}", exists=exists)
        await files.mkdir(path)
        return ok(f"directory {path} is ready")
