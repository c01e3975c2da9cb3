"""E2B's API on ``kernel-sandbox serve``: the E2B SDKs run unmodified against it.

Point the SDK at the server with ``E2B_API_URL=http://HOST:PORT/e2b`` (the control
API: :mod:`.control`), ``E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox`` (everything
inside a sandbox, routed by the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers the SDK
sends) and one of the server's keys as ``E2B_API_KEY``.  Inside a sandbox: envd's
Connect services :mod:`.process` and :mod:`.filesystem` (messages and services
generated from E2B's own ``.proto`` files into :mod:`.envd` by
``scripts/gen_e2b_envd.sh``), envd's ``/files`` (:mod:`.files`), and the code
interpreter's ``/execute`` and ``/contexts`` (:mod:`.interpreter`).  :mod:`.state`
holds what E2B adds to a tenancy lease and checks each sandbox's access token.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import Receive, Scope, Send

from ..limits import send_json_error
from ..settings import ServerSettings
from ..tenancy import Tenancy
from .control import router as control_router
from .files import router as files_router
from .filesystem import build_filesystem_app
from .interpreter import router as interpreter_router
from .process import build_process_app
from .snapshots import router as snapshots_router
from .state import E2bRegistry

__all__ = ["DEFAULT_TEMPLATES", "SANDBOX_PREFIX", "EnvdApp", "make_registry", "routers"]

#: Where the calls into a sandbox arrive (E2B_SANDBOX_URL's path); they carry the
#: sandbox's envd access token, not an API key.
SANDBOX_PREFIX = "/e2b/sandbox/"
#: E2B's own templates that start the server's default image unless configured.
DEFAULT_TEMPLATES = ("base", "code-interpreter-v1")

#: The routers of the E2B API, in the order they must be included (snapshots first:
#: its ``DELETE /templates/{id}`` comes before the control API's 501 for templates).
routers = (snapshots_router, control_router, files_router, interpreter_router)


def make_registry(tenancy: Tenancy, settings: ServerSettings) -> E2bRegistry:
    """The E2B registry of an app (templates: the defaults, then the server's setting)."""
    templates: Mapping[str, str] = {
        **{name: settings.default_image for name in DEFAULT_TEMPLATES},
        **settings.e2b_templates,
    }
    return E2bRegistry(tenancy, templates)


class EnvdApp:
    """envd's two Connect services behind ``/e2b/sandbox`` (mounted there)."""

    def __init__(self, registry: E2bRegistry, read_max_bytes: int) -> None:
        self.process = build_process_app(registry, read_max_bytes)
        self.filesystem = build_filesystem_app(registry, read_max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path.startswith("/process.Process/"):
            await self.process(scope, receive, send)
        elif path.startswith("/filesystem.Filesystem/"):
            await self.filesystem(scope, receive, send)
        elif scope["type"] == "http":
            await send_json_error(send, 404, f"no such envd route: {path}", [], scope)
