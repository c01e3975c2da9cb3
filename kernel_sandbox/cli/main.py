"""Entry point of ``kernel-sandbox``: wires the command groups, turns errors into one line.

Command modules are imported only when their command runs, so ``--help`` and small
commands start fast.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

# jsonschema, which nbformat validates notebooks with, imports rfc3987_syntax whenever it
# is installed (jupyter_events' format extras bring it); building its grammar at import
# costs this process 3-4 s at every start (37 s on a loaded host: an MCP client's
# handshake timed out).  No schema this program validates has an IRI format, so the
# command line does without it; the library leaves the import machinery alone.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

from ..errors import SandboxError  # noqa: E402

# command name -> (module, attribute) under kernel_sandbox.cli
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("demo", "demo", "Run the demo: the README's main job."),
    "images": ("images", "images", "Build and list sandbox images."),
    "run": ("run", "run", "Run a Python file or -c CODE in a fresh sandbox."),
    "shell": ("run", "shell", "Run a shell command in a fresh sandbox."),
    "agent": ("agent", "agent", "Run an agent session; record it as a notebook."),
    "replay": ("notebook", "replay", "Re-execute a notebook in a fresh sandbox; compare."),
    "export": ("notebook", "export", "Export a session notebook to HTML or a Python script."),
    "ps": ("admin", "ps", "List running sandboxes."),
    "attach": ("attach", "attach", "Open a console on a running sandbox's live kernel."),
    "gc": ("admin", "gc", "Remove orphaned sandboxes (owner process gone)."),
    "serve": ("serve", "serve", "Serve sandboxes over HTTP (ms-enclave API, /v1, MCP)."),
    "mcp": ("mcp", "mcp", "Serve one sandbox to an MCP client over stdio."),
    "kernelspec": ("kernelspec", "kernelspec", "Jupyter kernelspecs that run in a sandbox."),
    "snapshot": ("snapshots", "snapshot", "Save a running sandbox's state (it runs on)."),
    "restore": ("snapshots", "restore", "Start a new sandbox from a snapshot."),
    "fork": ("snapshots", "fork", "Start N sandboxes with a running sandbox's state."),
    "pause": ("snapshots", "pause", "Save a sandbox and remove its container."),
    "resume": ("snapshots", "resume", "Bring a paused sandbox back under its id."),
    "snapshots": ("snapshots", "snapshots", "List (ls) or delete (rm) snapshots."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        command: click.Command = getattr(
            importlib.import_module(f"kernel_sandbox.cli.{module}"), attr
        )
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show debug logging and full tracebacks.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="warning",
    show_default=True,
    envvar="KERNEL_SANDBOX_LOG_LEVEL",
    help="What is logged (-v: debug); info adds each sandbox's start, adoption, pause, "
    "reaping and removal.",
)
@click.pass_context
def cli(ctx: click.Context, verbose: bool, log_level: str) -> None:
    """kernel-sandbox: stateful, safe Python sandboxes for LLM agents."""
    import logging

    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    logging.basicConfig(level=logging.DEBUG if verbose else log_level.upper())


def main(argv: list[str] | None = None) -> Any:
    """Run the CLI; a SandboxError is printed as one readable line, exit status 1."""
    try:
        return cli.main(args=argv, prog_name="kernel-sandbox", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except SandboxError as exc:
        if "-v" in sys.argv or "--verbose" in sys.argv:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    sys.exit(main())
