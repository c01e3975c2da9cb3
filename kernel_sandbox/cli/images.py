"""``kernel-sandbox images build`` and ``kernel-sandbox images list``."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import click
from click.core import ParameterSource

from ..backends.docker import docker_client
from ..backends.docker.images import build_images, list_images
from ..backends.docker.images.builder import HELPER_NAMES, IMAGE_NAMES
from ..backends.docker.runtimes import describe

NAMES = [*IMAGE_NAMES, *HELPER_NAMES]


@click.group("images")
def images() -> None:
    """Build and list the sandbox images."""


@images.command("build")
@click.argument("names", nargs=-1, type=click.Choice(NAMES))
@click.option("--force", is_flag=True, help="Rebuild the named images even if they exist.")
@click.option(
    "--airgapped",
    is_flag=True,
    help="Make the base with debootstrap instead of pulling python:3.11-slim "
    "(needs root and debootstrap; chosen by itself when no registry answers).",
)
@click.option(
    "--pip",
    "pip_mode",
    type=click.Choice(["host", "build"]),
    default="host",
    show_default=True,
    help="host: the host's pip downloads wheels, the build installs them offline. "
    "build: pip runs inside the build and needs an index it can reach.",
)
@click.option(
    "--pip-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="PIP_CERT",
    help="CA bundle pip inside the build should trust (TLS-intercepting proxy); "
    "default $PIP_CERT. Giving it on the command line implies --pip build.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print only the summary, not the build log.")
@click.pass_context
def build(
    ctx: click.Context,
    names: tuple[str, ...],
    force: bool,
    airgapped: bool,
    pip_mode: str,
    pip_cert: Path | None,
    quiet: bool,
) -> None:
    """Build NAMES (default: python datascience) if missing; also: base, standin, server.

    \b
    python       kernel-sandbox:python       Python 3.11, ipykernel, git, user sandbox
    datascience  kernel-sandbox:datascience  + numpy, pandas, matplotlib, scipy, ...
    r            kernel-sandbox:r            + R, IRkernel, ggplot2, dplyr, tidyr, readr, data.table
    javascript   kernel-sandbox:javascript   + Deno's JavaScript/TypeScript kernel
    polyglot     kernel-sandbox:polyglot     python (datascience), R, JavaScript and bash kernels
    base         kernel-sandbox-base:bookworm  Debian + Python via debootstrap
    standin      python:3.11-slim  a plain Python (no ipykernel) made from the base,
                 for tests and examples where no registry can be reached
    server       kernel-sandbox:server  `kernel-sandbox serve` for a cluster (deploy/kubernetes):
                 kernel-sandbox:python plus this checkout's server; rebuilt when the source changed
    """
    if ctx.get_parameter_source("pip_cert") == ParameterSource.COMMANDLINE:
        pip_mode = "build"
    reports = asyncio.run(
        build_images(
            names,
            force=force,
            airgapped=airgapped,
            pip="build" if pip_mode == "build" else "host",
            pip_cert=pip_cert,
            progress=lambda line: click.echo(line, err=True),
            quiet=quiet,
        )
    )
    for report in reports:
        short = report.image_id.removeprefix("sha256:")[:12]
        if report.action == "built":
            click.echo(f"{report.tag:30} built ({short}) in {report.seconds:.0f} s")
        else:
            click.echo(f"{report.tag:30} present ({short}), nothing to do")


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _age(created: dt.datetime) -> str:
    seconds = (dt.datetime.now(dt.UTC) - created).total_seconds()
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit} ago"
    return "just now"


@images.command("list")
def list_() -> None:
    """Show our images, derived and custom ones, the base, what is missing, and runtimes."""
    listing = asyncio.run(list_images())
    rows = [("TAG", "ID", "SIZE", "CREATED", "KIND")]
    for image in listing.images:
        kind = f"derived from {image.derived_from}" if image.derived_from else image.kind
        rows.append((image.tag, image.id, _size(image.size), _age(image.created), kind))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        padded = [cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)]
        click.echo("  ".join([*padded, row[4]]))
    for tag in listing.missing:
        click.echo(f"missing: {tag} (build it with `kernel-sandbox images build`)")
    click.echo(describe(docker_client().api.info()))
