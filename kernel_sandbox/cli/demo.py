"""``kernel-sandbox demo``: the README's main job, runnable on a fresh machine."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ..config import DEFAULT_IMAGE
from ..sync import Sandbox

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


@click.command()
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Sandbox image.")
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=Path("demo-output"),
    show_default=True,
    help="Where the demo writes what it produced.",
)
def demo(image: str, output: Path) -> None:
    """Run the demo: a stateful sandbox that draws a plot and hands back the PNG."""
    sandbox_tour(image, output)
