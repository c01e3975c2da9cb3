"""``kernel-sandbox serve``: the HTTP server (ms-enclave's API, /v1, MCP at /mcp)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click

from .. import limits
from ..config import DEFAULT_IMAGE
from .run import parse_network

__all__ = ["SWITCH_INTERVAL", "serve"]

#: Seconds a thread may hold the GIL while another waits for it, in a server process.
SWITCH_INTERVAL = 0.0005
#: Exit status when the server could not start (uvicorn's).
STARTUP_FAILURE = 3


def _key_networks(items: tuple[str, ...], keys: tuple[str, ...]) -> dict[str, str | list[str]]:
    """``KEY=POLICY`` options by key id (the key itself is never stored in settings)."""
    from ..server.auth import key_id

    ids = {key: key_id(key) for key in keys}
    found: dict[str, str | list[str]] = {}
    for item in items:
        key, sep, policy = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=POLICY", param_hint="--key-network")
        found[ids.get(key, key)] = parse_network(policy)
    return found


def _templates(items: tuple[str, ...]) -> dict[str, str]:
    """``NAME=IMAGE`` options as a mapping."""
    found = {}
    for item in items:
        name, sep, image = item.partition("=")
        if not sep or not name or not image:
            raise click.BadParameter(f"{item!r}: give NAME=IMAGE", param_hint="--e2b-template")
        found[name] = image
    return found


def read_keys(api_keys: tuple[str, ...], key_file: Path | None) -> tuple[str, ...]:
    """Keys from the options, a file (one per line, ``#`` comments) and the environment."""
    keys = list(api_keys)
    if key_file is not None:
        for line in key_file.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                keys.append(line.strip())
    env = os.environ.get("KERNEL_SANDBOX_API_KEY")
    if env:
        keys.append(env)
    return tuple(dict.fromkeys(keys))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--api-key", "api_keys", multiple=True, help="An accepted key (repeatable).")
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File with one key per line; KERNEL_SANDBOX_API_KEY is read too.",
)
@click.option(
    "--name", default="default", show_default=True, help="Label of this server's sandboxes."
)
@click.option(
    "--allow-network", is_flag=True, help="Same as --max-network full (a bridge network)."
)
@click.option(
    "--max-network",
    default=None,
    help="The most network any key's sandboxes get: none (default), packages (the host "
    "pip's index through the egress proxy), full, or host patterns separated by commas.",
)
@click.option(
    "--key-network",
    "key_networks",
    multiple=True,
    metavar="KEY=POLICY",
    help="One key's own maximum (KEY is the key or its id; repeatable).",
)
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Default image.")
@click.option(
    "--allow-image",
    "allowed_images",
    multiple=True,
    help="Image reference pattern (repeatable; default: any image the engine has). "
    "Registry, each path part and the tag match apart: 'kernel-sandbox*' never matches "
    "'kernel-sandbox.example.com/x'.",
)
@click.option(
    "--pull",
    type=click.Choice(["never", "allowed"]),
    default="never",
    show_default=True,
    help="Pull an image the engine lacks from its registry, or refuse it.",
)
@click.option(
    "--derive",
    is_flag=True,
    help="Derive kernel-ready images from plain Python images clients name (off: "
    "such images start as they are).",
)
@click.option("--max-sandboxes", default=64, show_default=True, type=int)
@click.option("--max-sandboxes-per-key", default=16, show_default=True, type=int)
@click.option(
    "--max-request-bytes",
    default=limits.MAX_REQUEST_BYTES,
    show_default=True,
    type=int,
    help="Largest request body (JSON is parsed whole); file uploads: --max-upload-bytes.",
)
@click.option("--max-upload-bytes", default=100 * 1024 * 1024, show_default=True, type=int)
@click.option(
    "--idle-timeout", default=1800.0, show_default=True, type=float, help="Seconds; 0: never reap."
)
@click.option("--max-memory", default="2g", show_default=True)
@click.option("--max-cpu", default=2.0, show_default=True, type=float)
@click.option("--max-disk", default="1g", show_default=True, help="Most disk_limit per sandbox.")
@click.option("--max-timeout", default=600.0, show_default=True, type=float)
@click.option(
    "--pool-size", default=0, show_default=True, type=int, help="Warm sandboxes of --image."
)
@click.option(
    "--on-restart",
    type=click.Choice(["adopt", "remove", "restore", "keep"]),
    default="adopt",
    show_default=True,
    help="Sandboxes a killed run of this server left: adopt them for their keys (the "
    "same running kernels, variables kept), remove them, restore them for their keys "
    "(replaying their notebooks in fresh containers), or keep them.",
)
@click.option(
    "--record-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("notebooks") / "server",
    show_default=True,
    help="Where each sandbox's notebook is written.",
)
@click.option(
    "--record-flush-delay",
    type=click.FloatRange(0, 60),
    default=0.25,
    show_default=True,
    help="Seconds a recorded step may wait before its notebook is rewritten (steps in "
    "between coalesce; 0: on every step, on the request path).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name (fnmatch pattern; '*': any) requests may name in Host (repeatable; "
    "default: the loopback names on a loopback bind, else any).",
)
@click.option("--max-calls-per-key", default=limits.MAX_CALLS_PER_KEY, show_default=True, type=int)
@click.option(
    "--max-streams-per-key", default=limits.MAX_STREAMS_PER_KEY, show_default=True, type=int
)
@click.option(
    "--max-mcp-sessions-per-key",
    default=limits.MAX_MCP_SESSIONS_PER_KEY,
    show_default=True,
    type=int,
)
@click.option(
    "--max-connections",
    default=limits.MAX_CONNECTIONS,
    show_default=True,
    type=int,
    help="Open client connections (at most half the open-file limit).",
)
@click.option(
    "--header-timeout",
    default=limits.HEADER_TIMEOUT,
    show_default=True,
    type=float,
    help="Seconds a connection has to send a whole request head.",
)
@click.option(
    "--keep-alive-timeout",
    default=limits.KEEP_ALIVE_TIMEOUT,
    show_default=True,
    type=float,
    help="Seconds an idle keep-alive connection stays open.",
)
@click.option(
    "--pause-after",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds unused before a sandbox is paused (snapshot, container removed); the "
    "next call resumes it under the same id. Default: never.",
)
@click.option(
    "--snapshot-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where snapshots and paused sandboxes are kept (a volume; they survive a "
    "restart). Default: $KERNEL_SANDBOX_SNAPSHOTS, else snapshots/server.",
)
@click.option(
    "--e2b-template",
    "e2b_templates",
    multiple=True,
    metavar="NAME=IMAGE",
    help="An E2B template the E2B API (/e2b) starts as IMAGE (repeatable); 'base' and "
    "'code-interpreter-v1' are the default image unless named.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Server processes behind the one port (uses more cores); any serves any "
    "sandbox. They share --record-dir, which must be on this host.",
)
@click.option(
    "--replica",
    is_flag=True,
    help="One of several replicas of this server (the pods of a Deployment): they share "
    "--name, --record-dir and --snapshot-dir on a shared volume; any serves any sandbox, "
    "none removes sandboxes when it starts or stops, one at a time reaps (on Kubernetes "
    "the holder of a Lease).",
)
@click.option(
    "--keep-notebook-turns/--no-keep-notebook-turns",
    default=None,
    envvar="KERNEL_SANDBOX_KEEP_NOTEBOOK_TURNS",
    help="With workers or replicas: a process keeps a notebook's writing turn between "
    "its calls (written behind, coalesced; handed over through a FIFO, which only "
    "processes on one host hear). Default: workers do, replicas do not; give it to "
    "replicas whose shared volume is one node's (hostPath, local PersistentVolume).",
)
@click.option("--no-mcp", is_flag=True, help="Do not serve MCP at /mcp.")
def serve(
    host: str,
    port: int,
    api_keys: tuple[str, ...],
    api_key_file: Path | None,
    name: str,
    allow_network: bool,
    max_network: str | None,
    key_networks: tuple[str, ...],
    image: str,
    allowed_images: tuple[str, ...],
    pull: str,
    derive: bool,
    max_sandboxes: int,
    max_sandboxes_per_key: int,
    max_request_bytes: int,
    max_upload_bytes: int,
    idle_timeout: float,
    max_memory: str,
    max_cpu: float,
    max_disk: str,
    max_timeout: float,
    pool_size: int,
    on_restart: str,
    record_dir: Path,
    record_flush_delay: float,
    allowed_hosts: tuple[str, ...],
    max_calls_per_key: int,
    max_streams_per_key: int,
    max_mcp_sessions_per_key: int,
    max_connections: int,
    header_timeout: float,
    keep_alive_timeout: float,
    pause_after: float | None,
    snapshot_dir: Path | None,
    e2b_templates: tuple[str, ...],
    workers: int,
    replica: bool,
    keep_notebook_turns: bool | None,
    no_mcp: bool,
) -> None:
    """Serve sandboxes over HTTP: ms-enclave's REST API, /v1 (streaming) and MCP at /mcp."""
    from .._extras import require_extra

    with require_extra("server", "kernel-sandbox serve"):
        import uvicorn

        from ..server.app import build_app
        from ..server.connections import connection_cap, guarded_protocol
        from ..server.settings import ServerSettings

    keys = read_keys(api_keys, api_key_file)
    networks = {"max_network": parse_network(max_network)} if max_network is not None else {}
    settings = ServerSettings(
        host=host,
        port=port,
        api_keys=keys,
        name=name,
        allow_network=allow_network,
        key_networks=_key_networks(key_networks, keys),
        **networks,  # type: ignore[arg-type]
        default_image=image,
        allowed_images=allowed_images or ("*",),
        pull=pull,  # type: ignore[arg-type]
        derive=derive,
        max_sandboxes=max_sandboxes,
        max_sandboxes_per_key=max_sandboxes_per_key,
        max_request_bytes=max_request_bytes,
        max_upload_bytes=max_upload_bytes,
        idle_timeout=idle_timeout or None,
        max_memory=max_memory,
        max_cpu=max_cpu,
        max_disk=max_disk,
        max_timeout=max_timeout,
        pool_size=pool_size,
        on_restart=on_restart,  # type: ignore[arg-type]
        record_dir=record_dir,
        record_flush_delay=record_flush_delay,
        allowed_hosts=allowed_hosts,
        max_calls_per_key=max_calls_per_key,
        max_streams_per_key=max_streams_per_key,
        max_mcp_sessions_per_key=max_mcp_sessions_per_key,
        max_connections=max_connections,
        header_timeout=header_timeout,
        keep_alive_timeout=keep_alive_timeout,
        pause_after=pause_after,
        e2b_templates=_templates(e2b_templates),
        workers=workers,
        replica=replica,
        keep_notebook_turns=keep_notebook_turns,
    )
    if snapshot_dir is not None:
        settings = settings.model_copy(update={"snapshot_dir": snapshot_dir})
    settings.check_bind()
    click.echo(
        f"kernel-sandbox serving on http://{host}:{port} "
        f"({len(settings.api_keys)} API key(s); MCP {'off' if no_mcp else 'at /mcp'})",
        err=True,
    )
    # Worker threads (the notebook writer, the engine's SDK calls) hold the GIL for up
    # to the switch interval before the event loop gets it back: 5 ms by default, more
    # than a whole round trip; 0.5 ms keeps the loop's waits short.
    sys.setswitchinterval(SWITCH_INTERVAL)

    def config() -> uvicorn.Config:
        return uvicorn.Config(
            build_app(settings, mcp=not no_mcp),
            host=host,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=10,
            timeout_keep_alive=int(max(1, settings.keep_alive_timeout)),
            http=guarded_protocol(
                header_timeout=settings.header_timeout,
                max_head_bytes=limits.MAX_HEAD_BYTES,
                max_connections=connection_cap(settings.max_connections),
            ),
        )

    if workers == 1:
        server = uvicorn.Server(config())
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        if not server.started:
            sys.exit(STARTUP_FAILURE)  # as uvicorn.run: the port was taken, say
        return
    from ..server.workers import run_workers

    run_workers(settings, config, uvicorn.Config("unused:app", host=host, port=port))
