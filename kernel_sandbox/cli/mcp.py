"""``kernel-sandbox mcp``: one sandbox over stdio for an MCP client (IDE, assistant)."""

from __future__ import annotations

from pathlib import Path

import click

from ..config import DEFAULT_IMAGE
from .run import network_option

__all__ = ["mcp"]


@click.command()
@click.option("--image", default=DEFAULT_IMAGE, show_default=True)
@click.option("--timeout", default=30.0, show_default=True, type=float, help="Default per call.")
@click.option("--memory-limit", default="1g", show_default=True)
@click.option("--allow-network", is_flag=True, help="Same as --network full.")
@click.option(
    "--network",
    default="none",
    show_default=True,
    callback=network_option,
    help="none, packages (the host pip's index through the egress proxy), full, or host "
    "patterns separated by commas.",
)
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Notebook of the session (default: ~/.local/share/kernel-sandbox/mcp-sessions/).",
)
def mcp(
    image: str,
    timeout: float,
    memory_limit: str,
    allow_network: bool,
    network: str | list[str],
    record: Path | None,
) -> None:
    """Serve one sandbox over MCP stdio; it starts on the first call, ends with the process."""
    from .._extras import require_extra
    from ..config import SandboxConfig

    with require_extra("server", "kernel-sandbox mcp"):
        import anyio

        from ..mcp import StdioSandbox, build_mcp_server

    if allow_network and network == "none":
        network = "full"
    config = SandboxConfig(image=image, timeout=timeout, memory_limit=memory_limit, network=network)
    source = StdioSandbox(config, record)
    server = build_mcp_server(source)

    async def main() -> None:
        try:
            await server.run_stdio_async()
        finally:
            with anyio.CancelScope(shield=True):
                await source.close()

    anyio.run(main)
