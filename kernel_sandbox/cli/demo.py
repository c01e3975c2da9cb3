"""``kernel-sandbox demo``: the README's main job, runnable on a fresh machine.

Without an API key it shows the sandbox (state kept across calls, a plot's PNG brought
back) and replays the example agent session shipped in ``notebooks/`` in a fresh
sandbox, writing the replayed notebook and its HTML.  With ``OPENAI_API_KEY`` set it
runs a live agent session on the same data instead of the replay.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from ..config import DEFAULT_IMAGE
from ..sync import Sandbox

EXAMPLE = Path("notebooks") / "example-analysis.ipynb"
DATA = Path("notebooks") / "data" / "sales.csv"
LIVE_PROMPT = (
    "There is a CSV file at /sandbox/sales.csv with a month of daily sales for three "
    "regions. Load it, describe it, plot units sold per region over time and tell me "
    "which region grows fastest."
)
PLOT = """\
import matplotlib.pyplot as plt
import numpy as np
xs = np.linspace(0, 4 * np.pi, 200)
plt.figure(figsize=(6, 3))
plt.plot(xs, np.sin(xs) * counter, label=f"sin(x) * {counter}")
plt.legend(); plt.title("drawn inside the sandbox")
plt.show()
"""


def sandbox_tour(image: str, output: Path) -> None:
    """Start a sandbox, keep state across calls, bring a plot back as a PNG file."""
    output.mkdir(parents=True, exist_ok=True)
    click.echo(f"starting a sandbox from {image} (no network, non-root, limits on) ...")
    started = time.monotonic()
    with Sandbox.create(image=image) as sb:
        click.echo(f"  ready in {time.monotonic() - started:.2f}s (container {sb.id})")
        first = sb.run_python("counter = 20\nprint('counter set to', counter)")
        click.echo(f"  call 1: {first.text}")
        second = sb.run_python("counter += 1\ncounter * 2")
        click.echo(f"  call 2: counter * 2 -> {second.text}   (state kept between calls)")
        plot = sb.run_python(PLOT)
        pngs = plot.images("image/png")
        if not pngs:
            raise click.ClickException(f"the plot did not come back as a PNG: {plot.text}")
        target = output / "plot.png"
        target.write_bytes(pngs[0])
        click.echo(f"  call 3: plot -> {plot.text}")
        click.echo(f"  saved the PNG the kernel sent back: {target} ({len(pngs[0]):,} bytes)")
        shell = sb.run_shell("python --version && whoami")
        click.echo(f"  shell beside the kernel: {shell.stdout.strip().replace(chr(10), ', ')}")
    click.echo("sandbox closed: container and host files removed")


def replay_example(image: str, output: Path) -> bool:
    """Replay the shipped example session; write the new notebook and its HTML."""
    from ..notebook import export_notebook, replay

    if not EXAMPLE.exists():
        raise click.ClickException(f"{EXAMPLE} not found: run the demo from the repository root")
    target = output / "example-analysis.replayed.ipynb"
    click.echo(f"\nreplaying the recorded agent session {EXAMPLE} in a fresh sandbox ...")
    report = replay(
        EXAMPLE,
        image=image,
        output=target,
        on_cell=lambda c: click.echo(f"  {c.label:<14} {c.verdict:<9} {c.headline}"),
    )
    html = export_notebook(target, "html")
    click.echo(f"  {report.summary}")
    click.echo(f"  replayed notebook: {target}\n  as HTML (plots inline): {html}")
    return report.ok


def live_session(image: str, output: Path, model: str | None) -> bool:
    """Run a live agent session on the example data; record and export it."""
    from ..agent import Agent
    from ..notebook import export_notebook
    from .agent import Progress

    with Sandbox.create(image=image) as sb:
        sb.files.upload(DATA, "sales.csv")
        agent = Agent(model=model, sandbox=sb, notebook_dir=output, listeners=[Progress()])
        click.echo(f"\nlive agent session with {agent.model} (OPENAI_API_KEY is set) ...")
        result = agent.run(LIVE_PROMPT)
    click.echo(f"\n{result.answer}")
    if result.notebook_path:
        html = export_notebook(result.notebook_path, "html")
        click.echo(f"\nnotebook: {result.notebook_path}\nas HTML: {html}")
    return result.ok


@click.command()
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Sandbox image.")
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=Path("demo-output"),
    show_default=True,
    help="Where the demo writes what it produced.",
)
@click.option(
    "--live/--replay",
    default=None,
    help="Live agent session (default when OPENAI_API_KEY is set) or replay.",
)
@click.option("--model", help="Model for the live session (default: $KERNEL_SANDBOX_MODEL).")
def demo(image: str, output: Path, live: bool | None, model: str | None) -> None:
    """Run the demo: a stateful sandbox, then an agent session as a notebook."""
    sandbox_tour(image, output)
    if live is None:
        live = bool(os.environ.get("OPENAI_API_KEY"))
    ok = live_session(image, output, model) if live else replay_example(image, output)
    if not ok:
        sys.exit(1)
