"""Tools for language models: python_executor, shell_executor, file_operation.

``ToolSet(sandbox, tools_config)`` gives OpenAI schemas (Chat Completions or Responses
format) and executes calls, returning a compact :class:`ToolResult`.
"""

from .base import Tool, ToolOptions, ToolSet, available_tools, make_tools, register_tool
from .code import CodeExecutor
from .files import FileOperation, FileOperationOptions
from .python import PythonExecutor, PythonExecutorOptions
from .results import Artifact, ToolResult, ToolStatus, truncate_middle
from .shell import ShellExecutor, ShellExecutorOptions

__all__ = [
    "Artifact",
    "CodeExecutor",
    "FileOperation",
    "FileOperationOptions",
    "PythonExecutor",
    "PythonExecutorOptions",
    "ShellExecutor",
    "ShellExecutorOptions",
    "Tool",
    "ToolOptions",
    "ToolResult",
    "ToolSet",
    "ToolStatus",
    "available_tools",
    "make_tools",
    "register_tool",
    "truncate_middle",
]
