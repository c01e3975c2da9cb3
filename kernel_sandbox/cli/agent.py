"""``kernel-sandbox agent "PROMPT"``: a live agent session, recorded as a notebook."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from ..notebook import DEFAULT_SESSION_DIR
from .run import sandbox_options

#: Exit status when a budget ended the session before the model answered.
EXIT_BUDGET = 3
_PREVIEW = 300


def _short(text: str, limit: int = _PREVIEW) -> str:
    text = text.strip("\n").rstrip()
    if len(text) <= limit:
        return text
    return text[: limit - 20].rstrip() + f" ... [{len(text) - limit + 20} more chars]"


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _call_preview(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError):
        return _short(arguments, 120)
    if not isinstance(args, dict):
        return _short(arguments, 120)
    for key in ("code", "command"):
        value = args.get(key)
        if isinstance(value, str):
            return value
    if name == "file_operation":
        return f"{args.get('operation')} {args.get('file_path')}"
    return _short(arguments, 120)


class Progress:
    """Prints agent events as they happen: turns, tool calls, short outputs, the answer."""

    def __call__(self, event: Any) -> None:
        from ..agent import events as ev

        if isinstance(event, ev.SessionStarted):
            click.echo(f"model {event.model}, sandbox {event.sandbox_id} ({event.image})")
            if event.notebook_path:
                click.echo(f"recording to {event.notebook_path}")
        elif isinstance(event, ev.ModelResponded):
            calls = len(event.tool_calls)
            what = f"{calls} tool call{'s' if calls != 1 else ''}" if calls else "answer"
            tokens = f", {event.usage.total_tokens} tokens" if event.usage.total_tokens else ""
            click.echo(click.style(f"[turn {event.turn}] ", bold=True) + f"{what}{tokens}")
            if calls and event.text:
                click.echo(_indent(_short(event.text), "  "))
        elif isinstance(event, ev.ToolCallStarted):
            preview = _call_preview(event.name, event.arguments)
            click.echo(click.style(f"  > {event.name or '?'}", fg="cyan"))
            click.echo(_indent(_short(preview)))
        elif isinstance(event, ev.ToolCallFinished):
            result = event.result
            colour = "green" if result.ok else "red"
            click.echo(
                "    "
                + click.style(result.status, fg=colour)
                + f" ({result.execution_time:.1f}s)"
                + (f": {result.error}" if result.error else "")
            )
            if result.output:
                click.echo(_indent(_short(result.output)))
        elif isinstance(event, ev.ModelRetrying):
            click.echo(
                click.style("  model API error", fg="yellow")
                + f" (attempt {event.attempt}): {event.error}; retrying in {event.delay:.1f}s"
            )


def _resume_image(notebook: Path, image: str) -> str:
    """The recorded image of a resumed session, unless --image chose another."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source("image") is not click.core.ParameterSource.DEFAULT:
        return image
    from ..notebook.replay import recorded_image
    from ..notebook.storage import read_notebook

    return recorded_image(read_notebook(notebook)) or image


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = val
    return labels


@click.command()
@click.argument("prompt")
@click.option(
    "--model", envvar="KERNEL_SANDBOX_MODEL", help="Model name [env KERNEL_SANDBOX_MODEL]."
)
@click.option(
    "--base-url", envvar="OPENAI_BASE_URL", help="OpenAI-compatible endpoint [env OPENAI_BASE_URL]."
)
@click.option("--api-key", envvar="OPENAI_API_KEY", help="API key [env OPENAI_API_KEY].")
@sandbox_options
@click.option(
    "--max-turns",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Most model calls.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    help="Most total tokens (as reported by the endpoint).",
)
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), help="Most wall seconds.")
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Retries of a failed model call.",
)
@click.option(
    "--notebook-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_SESSION_DIR,
    show_default=True,
    help="Where the session notebook is written.",
)
@click.option(
    "--vision/--no-vision",
    default=False,
    show_default=True,
    help="Show plots to the model as images (needs a vision model).",
)
@click.option(
    "--resume",
    "resume",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Go on with the session recorded in this notebook: its cells are replayed in a "
    "fresh sandbox, its conversation restored; a new notebook links it.",
)
@click.option(
    "--allow-divergence",
    is_flag=True,
    help="With --resume: go on even when a replayed cell's output differs.",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra label on the sandbox container (repeatable).",
)
def agent(
    prompt: str,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    image: str,
    timeout: float,
    network: str | list[str],
    max_turns: int,
    max_tokens: int | None,
    max_time: float | None,
    retries: int,
    notebook_dir: Path,
    vision: bool,
    resume: Path | None,
    allow_divergence: bool,
    labels: tuple[str, ...],
) -> None:
    """Let a model work on PROMPT in a fresh sandbox; print its progress and answer.

    The session is recorded as a notebook (path printed at the start and the end).
    PROMPT "-" reads the prompt from stdin.  Exit status: 0 when the model answered,
    1 when the model API failed, 3 when a budget (--max-turns/--max-tokens/--max-time)
    stopped it first.
    """
    from ..agent import Agent, Budget, RetryPolicy
    from ..config import SandboxConfig

    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="PROMPT")
    if resume is not None:
        image = _resume_image(resume, image)
    config = SandboxConfig(image=image, timeout=timeout, network=network, labels=_labels(labels))
    runner = Agent(
        model=model,
        base_url=base_url,
        api_key=api_key,
        config=config,
        budget=Budget(max_turns=max_turns, max_tokens=max_tokens, max_time=max_time),
        retry=RetryPolicy(max_retries=retries),
        vision=vision,
        notebook_dir=notebook_dir,
        listeners=[Progress()],
    )
    if resume is None:
        result = asyncio.run(runner.arun(prompt))
    else:
        click.echo(f"resuming {resume}: replaying its cells in a fresh sandbox ...")
        result = asyncio.run(runner.aresume(resume, prompt, allow_divergence=allow_divergence))
    if result.status == "error":
        click.echo(click.style("error: ", fg="red") + result.reason, err=True)
    else:
        click.echo(click.style("\nanswer:", bold=True))
        click.echo(result.answer)
    usage = result.usage.total_tokens
    click.echo(
        f"\n{result.turns} turns, {result.tool_calls} tool calls"
        + (f", {usage} tokens" if usage else "")
        + f", {result.duration:.1f}s"
    )
    if result.notebook_path:
        click.echo(f"notebook: {result.notebook_path}")
    if result.status == "error":
        raise click.exceptions.Exit(1)
    if result.status == "budget_exhausted":
        raise click.exceptions.Exit(EXIT_BUDGET)
