"""``kernel-sandbox replay`` and ``kernel-sandbox export``: notebooks after the session."""

from __future__ import annotations

from pathlib import Path

import click

from ..notebook.replay import CellReplay

_NOTEBOOK = click.Path(exists=True, dir_okay=False, path_type=Path)
_COLOURS = {"same": "green", "differs": "red", "new error": "red", "skipped": "yellow"}


def _print_cell(cell: CellReplay) -> None:
    verdict = click.style(f"{cell.verdict:<10}", fg=_COLOURS.get(cell.verdict))
    click.echo(f"[{cell.number:>3}] {verdict} {cell.kind:<6} {cell.headline}")
    for line in cell.diff.splitlines():
        click.echo(f"        {line}")


@click.command()
@click.argument("notebook", type=_NOTEBOOK)
@click.option("--image", help="Sandbox image to replay in (default: the recorded one).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the replayed notebook (default: NAME.replay.ipynb).",
)
@click.option("--timeout", type=float, help="Seconds allowed per cell (default: 30).")
def replay(notebook: Path, image: str | None, output: Path | None, timeout: float | None) -> None:
    """Re-execute NOTEBOOK's code cells in a fresh sandbox and compare outputs.

    Prints one line per cell (same / differs / new error), writes the replayed
    notebook, and exits with status 1 when any cell's outputs differ.  Addresses,
    timings, timestamps and image bytes are normalised before comparing.
    """
    from ..config import DEFAULT_IMAGE
    from ..notebook.replay import recorded_image, replayed_path
    from ..notebook.replay import replay as run_replay
    from ..notebook.storage import read_notebook

    chosen = image or recorded_image(read_notebook(notebook)) or DEFAULT_IMAGE
    click.echo(f"replaying {notebook} in {chosen}")
    report = run_replay(notebook, image=image, timeout=timeout, output=output, on_cell=_print_cell)
    click.echo(f"replayed notebook: {report.output or replayed_path(notebook)}")
    verdict = "all cells match" if report.ok else "outputs differ"
    click.echo(f"{report.summary} ({report.duration:.1f}s): {verdict}")
    if not report.ok:
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("notebook", type=_NOTEBOOK)
@click.option(
    "--to",
    "fmt",
    type=click.Choice(["html", "py"]),
    default="html",
    show_default=True,
    help="html: a page with the plots embedded; py: a Python script.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output file (default: the notebook's name with .html / .py).",
)
def export(notebook: Path, fmt: str, output: Path | None) -> None:
    """Export NOTEBOOK to HTML (readable in a browser, plots included) or Python."""
    from ..notebook.export import export_notebook

    target = export_notebook(notebook, fmt, output)  # type: ignore[arg-type]
    click.echo(str(target))
