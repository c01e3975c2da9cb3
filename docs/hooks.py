"""MkDocs hooks: reference pages generated from the code at build time.

``<!-- generated:sandbox-config -->`` becomes a table of :class:`SandboxConfig`'s fields
(type, default, description) and ``<!-- generated:cli -->`` the ``--help`` of every
``kernel-sandbox`` command, so neither can drift from the code: a field or option added
there shows up here on the next ``make docs``.
"""

from __future__ import annotations

from typing import Any

import click
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKERS = {
    "<!-- generated:sandbox-config -->": "sandbox_config_table",
    "<!-- generated:cli -->": "cli_help",
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each marker on a page with what it stands for."""
    for marker, name in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[name]())
    return markdown


def _cell(text: str) -> str:
    """Text for a table cell: no row break, no column break."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """A code span in a table cell (Markdown code spans are not HTML-unescaped)."""
    return f"`{_cell(text)}`"


def _type(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    # "or", not "|": a pipe inside a code span would still split the table's cell
    return str(annotation).replace("typing.", "").replace(" | ", " or ")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.get_default(call_default_factory=True, validated_data={})
        if isinstance(value, dict | list):
            return _code(repr(value))
        return "from the environment (see the description)"
    if info.default is PydanticUndefined:
        return "(required)"
    return _code(repr(info.default))


def sandbox_config_table() -> str:
    """A Markdown table of every SandboxConfig field, in declaration order."""
    from kernel_sandbox.config import SandboxConfig

    rows = ["| field | type | default | what it sets |", "|---|---|---|---|"]
    for name, info in SandboxConfig.model_fields.items():
        rows.append(
            f"| `{name}` | {_code(_type(info.annotation))} | {_default(info)} "
            f"| {_cell(info.description or '')} |"
        )
    return "\n".join(rows)


def cli_help() -> str:
    """The --help of ``kernel-sandbox`` and of every command and subcommand."""
    from kernel_sandbox.cli.main import cli

    parts: list[str] = []

    def walk(command: click.Command, path: list[str], parent: click.Context | None) -> None:
        ctx = click.Context(command, info_name=path[-1], parent=parent)
        level = "#" * min(len(path) + 1, 4)
        parts.append(f"{level} `{' '.join(path)}`\n\n```text\n{command.get_help(ctx)}\n```\n")
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], ctx)

    walk(cli, ["kernel-sandbox"], None)
    return "\n".join(parts)
