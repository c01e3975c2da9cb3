"""``kernel-sandbox replay`` and ``kernel-sandbox export``: notebooks after the session."""

from __future__ import annotations

from pathlib import Path

import click

from ..notebook.media import DEFAULT_IMAGE_RMS
from ..notebook.normalise import DEFAULT_REL_TOL
from ..notebook.report import CellReplay

_NOTEBOOK = click.Path(exists=True, dir_okay=False, path_type=Path)
_COLOURS = {
    "same": "green",
    "differs": "red",
    "new error": "red",
    "size only": "yellow",
    "skipped": "yellow",
    "ignored": "yellow",
}


def _print_cell(cell: CellReplay) -> None:
    """``cell 7 [In 5]  differs    python  the failing (or first) line``, then the diff."""
    verdict = click.style(f"{cell.verdict:<10}", fg=_COLOURS.get(cell.verdict))
    click.echo(f"{cell.label:<16} {verdict} {cell.language or cell.kind:<6} {cell.headline}")
    for line in cell.diff.splitlines():
        click.echo(f"    {line}")


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
@click.option(
    "--rel-tol",
    type=float,
    default=DEFAULT_REL_TOL,
    show_default=True,
    help="Relative difference allowed between floats in text outputs.",
)
@click.option(
    "--image-rms",
    type=float,
    default=DEFAULT_IMAGE_RMS,
    show_default=True,
    help="RMS pixel difference (0-255) allowed between same-size images.",
)
def replay(
    notebook: Path,
    image: str | None,
    output: Path | None,
    timeout: float | None,
    rel_tol: float,
    image_rms: float,
) -> None:
    """Re-execute NOTEBOOK's code cells in a fresh sandbox and compare outputs.

    Prints one line per cell (its index, In [n], verdict and the line that raised or
    its first code line) with a short diff, writes the replayed notebook (recorded
    outputs and diffs in each cell's metadata), and exits with status 1 when any
    cell's outputs differ.  What is tolerated is listed in docs/concepts/notebooks.md; cell tags
    (nbval-skip, nbval-ignore-output, raises-exception, nondeterministic) steer it.
    """
    from ..config import DEFAULT_IMAGE
    from ..notebook.compare import Tolerance
    from ..notebook.replay import recorded_image, replayed_path
    from ..notebook.replay import replay as run_replay
    from ..notebook.storage import read_notebook

    chosen = image or recorded_image(read_notebook(notebook)) or DEFAULT_IMAGE
    click.echo(f"replaying {notebook} in {chosen}")
    report = run_replay(
        notebook,
        image=image,
        timeout=timeout,
        output=output,
        tolerance=Tolerance(rel_tol=rel_tol, image_rms=image_rms),
        on_cell=_print_cell,
    )
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
    """Export NOTEBOOK to HTML (readable offline, plots and replay verdicts included) or Python."""
    from ..notebook.export import export_notebook

    target = export_notebook(notebook, fmt, output)  # type: ignore[arg-type]
    click.echo(str(target))
