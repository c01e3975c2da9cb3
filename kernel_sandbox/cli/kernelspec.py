"""``kernel-sandbox kernelspec install|list|remove``: sandboxed kernels for Jupyter."""

from __future__ import annotations

from typing import Literal

import click

from ..config import DEFAULT_IMAGE

__all__ = ["kernelspec"]


@click.group()
def kernelspec() -> None:
    """Kernelspecs whose kernels run in a sandbox (JupyterLab, nbclient, nbconvert...)."""


@kernelspec.command("install")
@click.option(
    "--kernel",
    default="python3",
    show_default=True,
    help="The image's kernel to sandbox: python3, ir (R), deno (JavaScript/TypeScript), "
    "bash, or any kernelspec name of a custom image.",
)
@click.option("--name", help="Kernelspec name [default: kernel-sandbox, kernel-sandbox-KERNEL].")
@click.option(
    "--image",
    help=f"Sandbox image [default: {DEFAULT_IMAGE} for python3, else the image of that "
    "kernel: kernel-sandbox:r, :javascript, :polyglot].",
)
@click.option("--language", help="The kernel's language, for a kernel not of our images.")
@click.option("--display-name", help="Name shown in Jupyter's launcher.")
@click.option("--memory-limit", default="1g", show_default=True)
@click.option("--cpu-limit", default=1.0, show_default=True, type=float)
@click.option("--timeout", default=None, type=float, help="Default per-cell limit (none).")
@click.option("--allow-network", is_flag=True, help="Give the kernel a network (off by default).")
@click.option("--host", "host_name", default="", help="Kernel host entry point (default: docker).")
@click.option("--user", "user_install", is_flag=True, help="Install for this user only.")
@click.option("--prefix", help="Install under PREFIX/share/jupyter/kernels (e.g. a venv).")
@click.option(
    "--cwd-mode",
    type=click.Choice(["copy", "mount", "none"]),
    default="copy",
    show_default=True,
    help="The notebook's folder in the sandbox: a bounded copy, a read-only mount, or none.",
)
def install(
    kernel: str,
    name: str | None,
    image: str | None,
    language: str | None,
    display_name: str | None,
    memory_limit: str,
    cpu_limit: float,
    timeout: float | None,
    allow_network: bool,
    host_name: str,
    user_install: bool,
    prefix: str | None,
    cwd_mode: Literal["copy", "mount", "none"],
) -> None:
    """Install a kernelspec: no network, limits and a non-root user unless told otherwise."""
    from ..config import SandboxConfig
    from ..contexts import KNOWN_KERNELS
    from ..jupyter import install_kernelspec
    from .run import LANGUAGE_IMAGES

    if image is None:
        known = KNOWN_KERNELS.get(kernel)
        image = LANGUAGE_IMAGES.get(known.speaks, (DEFAULT_IMAGE, None))[0] if known else None
        if image is None:
            raise click.UsageError(
                f"--kernel {kernel} is not one of our images' kernels: give --image"
            )
    name = name or ("kernel-sandbox" if kernel == "python3" else f"kernel-sandbox-{kernel}")
    fields: dict[str, object] = {
        "image": image,
        "kernel": kernel,
        "memory_limit": memory_limit,
        "cpu_limit": cpu_limit,
        "network_enabled": allow_network,
    }
    if timeout is not None:
        fields["timeout"] = timeout
    path = install_kernelspec(
        name,
        SandboxConfig(**fields),
        display_name=display_name,
        host=host_name,
        user=user_install,
        prefix=prefix,
        cwd_mode=cwd_mode,
        language=language,
    )
    click.echo(f"installed kernelspec {name!r} in {path}")
    click.echo(f"use it: jupyter nbconvert --execute --ExecutePreprocessor.kernel_name={name} ...")


@kernelspec.command("list")
def list_() -> None:
    """The installed kernelspecs that run in a sandbox."""
    from jupyter_client.kernelspec import KernelSpecManager

    from ..jupyter import PROVISIONER_NAME

    for name, info in sorted(KernelSpecManager().get_all_specs().items()):
        meta = info["spec"].get("metadata", {}).get("kernel_provisioner", {})
        if meta.get("provisioner_name") == PROVISIONER_NAME:
            sandbox = meta.get("config", {}).get("sandbox", {})
            image, kernel = sandbox.get("image", "?"), sandbox.get("kernel", "python3")
            click.echo(f"{name}\t{kernel}\t{image}\t{info['resource_dir']}")


@kernelspec.command("remove")
@click.argument("name")
def remove(name: str) -> None:
    """Remove an installed kernelspec."""
    from ..jupyter.kernelspec import remove_kernelspec

    click.echo(f"removed {remove_kernelspec(name)}")
