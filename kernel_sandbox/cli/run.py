"""``kernel-sandbox run`` and ``kernel-sandbox shell``: one-off work in a fresh sandbox."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ..config import DEFAULT_IMAGE
from ..contexts import normalise_language
from ..results import output_text
from ..sync import Sandbox

#: What may reach the user's terminal from a sandbox: text, newlines, tabs and SGR
#: colours (``ESC [ 1;31 m``).  Every other escape -- OSC (window title, clipboard),
#: DCS/APC/PM/SOS strings, other CSI (cursor moves, screen clears, reports), two-byte
#: escapes, 8-bit C1 forms -- and every other control character is removed.
_TERMINAL = re.compile(
    r"(\x1b\[[0-9;]{0,32}m)"  # kept
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|\x1b[ -~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def terminal_safe(text: str) -> str:
    """``text`` with every terminal control but SGR colours, newlines and tabs removed."""
    return _TERMINAL.sub(lambda m: m.group(1) or "", text)


#: The image (and its kernelspec) ``run --language`` uses when no --image is given.
LANGUAGE_IMAGES = {
    "r": ("kernel-sandbox:r", "ir"),
    "javascript": ("kernel-sandbox:javascript", "deno"),
    "typescript": ("kernel-sandbox:javascript", "deno"),
    "bash": ("kernel-sandbox:polyglot", "bash"),
}
_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg", "image/gif": "gif"}


def sandbox_options(fn: Any) -> Any:
    """Options shared by commands that start a sandbox."""
    fn = click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Sandbox image.")(
        fn
    )
    fn = click.option(
        "--timeout",
        type=float,
        default=60,
        show_default=True,
        help="Seconds before the code is interrupted.",
    )(fn)
    fn = click.option(
        "--network",
        is_flag=False,
        flag_value="full",
        default="none",
        show_default=True,
        callback=network_option,
        help=(
            "What the sandbox may reach: none, packages (the host pip's index, through the "
            "host's egress proxy), full (alone: --network), or host patterns separated by "
            "commas (e.g. 'packages,files.example.org')."
        ),
    )(fn)
    return fn


def parse_network(value: str) -> str | list[str]:
    """A network policy from the command line (a list: comma-separated host patterns);
    a bad one is a usage error."""
    from ..config import SandboxConfig
    from ..errors import ConfigError

    network: str | list[str] = value
    if value not in ("none", "packages", "full"):
        network = [part.strip() for part in value.split(",") if part.strip()]
    try:
        SandboxConfig(network=network)
    except ConfigError as exc:
        raise click.BadParameter(str(exc).removeprefix("invalid SandboxConfig: ")) from None
    return network


def network_option(ctx: click.Context, param: click.Parameter, value: str) -> str | list[str]:
    """Click callback: ``--network`` as ``SandboxConfig.network`` wants it."""
    return parse_network(value)


def _save_image(output: dict[str, Any], directory: Path, index: int) -> Path | None:
    for mime, ext in _EXTENSIONS.items():
        payload = output.get("data", {}).get(mime)
        if payload is None:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"output-{index}.{ext}"
        if ext == "svg":
            path.write_text(payload if isinstance(payload, str) else "".join(payload))
        else:
            path.write_bytes(base64.b64decode(payload))
        return path
    return None


@click.command()
@click.argument(
    "file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("-c", "--code", help="Code to run instead of a file.")
@click.option(
    "--language",
    "-l",
    default="python",
    show_default=True,
    help="python, r, javascript, typescript or bash (any the image has a kernel for); "
    "without --image, our image for it.",
)
@click.option(
    "--save-images",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Directory for images the code shows.",
)
@sandbox_options
@click.pass_context
def run(
    ctx: click.Context,
    file: Path | None,
    code: str | None,
    language: str,
    save_images: Path,
    image: str,
    timeout: float,
    network: str | list[str],
) -> None:
    """Run a FILE (or -c CODE) of --language in a fresh sandbox; print outputs, save images.

    Exits with status 1 when the code raised, timed out or crashed the kernel.
    """
    language = normalise_language(language)
    settings: dict[str, Any] = {}
    if ctx.get_parameter_source("image") != ParameterSource.COMMANDLINE:
        image, kernel = LANGUAGE_IMAGES.get(language, (image, None))
        if kernel is not None:
            settings["kernel"] = kernel  # the image's own kernel for it: one kernel runs
    if (file is None) == (code is None):
        raise click.UsageError("give either FILE or -c CODE")
    source = code if code is not None else file.read_text()  # type: ignore[union-attr]
    saved = 0

    def show(output: dict[str, Any]) -> None:
        nonlocal saved
        path = _save_image(output, save_images, saved + 1)
        if path is not None:
            saved += 1
            click.echo(f"[saved {path}]")
        text = terminal_safe(output_text(output))
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            click.echo(text, err=True)
        elif text and path is None:
            click.echo(text)

    with Sandbox.create(image=image, network=network, timeout=timeout, **settings) as sb:
        execution = sb.run_code(source, language, on_output=show)
    if execution.message:
        click.echo(f"[{terminal_safe(execution.message)}]", err=True)
    if not execution.ok:
        sys.exit(1)


@click.command()
@click.argument("command")
@click.option("--cwd", help="Working directory inside the sandbox (default /sandbox).")
@sandbox_options
def shell(
    command: str, cwd: str | None, image: str, timeout: float, network: str | list[str]
) -> None:
    """Run a shell COMMAND in a fresh sandbox; exit with the command's status."""
    with Sandbox.create(image=image, network=network, timeout=timeout) as sb:
        result = sb.run_shell(command, cwd=cwd)
    click.echo(terminal_safe(result.stdout), nl=False)
    click.echo(terminal_safe(result.stderr), nl=False, err=True)
    sys.exit(124 if result.timed_out else result.exit_code)
