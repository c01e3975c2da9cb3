"""The agent: settings for talking to a model, and the blocking / async entry points.

::

    agent = Agent(model="gpt-4o-mini", budget=Budget(max_turns=10))
    result = agent.run("Load data.csv, describe it and plot the price over time")
    print(result.answer, result.notebook_path)

Any OpenAI-compatible endpoint works (``base_url``, ``api_key``; defaults from
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` and ``KERNEL_SANDBOX_MODEL``).  Each
:meth:`Agent.session` is one sandbox and one notebook; :meth:`Agent.run` and
:meth:`Agent.arun` are a session with a single prompt.  The multi-round loop itself is
in :mod:`kernel_sandbox.agent.loop`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..config import SandboxConfig
from ..errors import ConfigError
from ..notebook import DEFAULT_SESSION_DIR
from .budget import Budget, RetryPolicy
from .events import AgentListener
from .loop import AgentSession
from .results import AgentResult, AgentStatus, borrowed

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from ..protocols import SandboxLike
    from ..sync import Sandbox


__all__ = ["DEFAULT_MODEL", "MODEL_ENV", "Agent", "AgentResult", "AgentStatus"]

#: Environment variable naming the model when none is given.
MODEL_ENV = "KERNEL_SANDBOX_MODEL"
#: The model used when neither ``model`` nor ``KERNEL_SANDBOX_MODEL`` / ``OPENAI_MODEL`` is set.
DEFAULT_MODEL = "gpt-4o-mini"
#: Stands in for an API key on endpoints that need none (local servers).
NO_KEY = "no-key"


def _public_url(url: str | None) -> str | None:
    """``url`` without credentials or query, fit for notebook metadata."""
    if not url:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Agent:
    """A data-analysis agent: a model behind an OpenAI-compatible API, tools in a sandbox.

    ``sandbox`` lends an existing :class:`~kernel_sandbox.AsyncSandbox` (or a blocking
    ``Sandbox``) to every session, which then leaves it running; otherwise each session
    creates its own from ``config`` (or ``image``) and removes it at the end.
    ``tools_config`` picks the tools as in the manager API (default: all three, or the
    config's ``tools_config``).  ``vision`` shows plots to the model as images (the model
    must accept image input); without it the model sees named placeholders.  Sessions
    are recorded as notebooks in ``notebook_dir`` unless ``record=False``.  ``client``
    replaces the OpenAI client built from ``base_url`` / ``api_key``; its own retries
    are switched off, since ``retry`` governs them.  An ``AsyncSandbox`` belongs to the
    event loop that created it: lend one to :meth:`arun` / :meth:`session`, and a
    blocking ``Sandbox`` to :meth:`run`.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        client: AsyncOpenAI | None = None,
        sandbox: SandboxLike | Sandbox | None = None,
        config: SandboxConfig | None = None,
        image: str | None = None,
        tools_config: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        budget: Budget | None = None,
        retry: RetryPolicy | None = None,
        vision: bool = False,
        record: bool = True,
        notebook_dir: str | os.PathLike[str] = DEFAULT_SESSION_DIR,
        listeners: list[AgentListener] | None = None,
        completion_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = (
            model or os.environ.get(MODEL_ENV) or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
        )
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if key is None and self.base_url is None and client is None:
            raise ConfigError(
                "no API key for the model: set OPENAI_API_KEY (or pass api_key / --api-key), "
                "or point base_url / OPENAI_BASE_URL at an endpoint that needs none"
            )
        self._api_key = key or NO_KEY
        self.client = client
        self.sandbox = borrowed(sandbox)
        config = config or SandboxConfig()
        if image:
            config = config.with_overrides(image=image)
        self.config = config
        if tools_config is None:
            tools_config = getattr(config, "tools_config", None) or None
        self.tools_config = dict(tools_config) if tools_config is not None else None
        self.system_prompt = system_prompt
        self.budget = budget or Budget()
        self.retry = retry or RetryPolicy()
        self.vision = vision
        self.record = record
        self.notebook_dir = Path(notebook_dir)
        self.listeners: list[AgentListener] = list(listeners or [])
        self.completion_options = dict(completion_options or {})
        for reserved in ("model", "messages", "tools", "stream"):
            if reserved in self.completion_options:
                raise ConfigError(
                    f"completion_options may not set {reserved!r}; the agent sets it itself"
                )

    def make_client(self) -> AsyncOpenAI:
        """The OpenAI client for one session, SDK retries off: ``retry`` (tenacity) does them."""
        if self.client is not None:
            return self.client.with_options(max_retries=0)
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.base_url,
            api_key=self._api_key,
            max_retries=0,
            timeout=self.retry.request_timeout,
        )

    def describe(self) -> dict[str, Any]:
        """Settings worth keeping in a notebook's metadata (never the API key)."""
        return {
            "model": self.model,
            "base_url": _public_url(self.base_url),
            "vision": self.vision,
            "budget": self.budget.model_dump(),
            "retry": self.retry.model_dump(),
        }

    def session(
        self,
        *,
        sandbox: SandboxLike | Sandbox | None = None,
        notebook_path: str | os.PathLike[str] | None = None,
    ) -> AgentSession:
        """A new session (``async with agent.session() as s: await s.send(...)``)."""
        return AgentSession(self, sandbox=sandbox, notebook_path=notebook_path)

    async def arun(
        self, prompt: str, *, notebook_path: str | os.PathLike[str] | None = None
    ) -> AgentResult:
        """One prompt in a fresh session: work until the model answers or a budget ends it."""
        async with self.session(notebook_path=notebook_path) as session:
            return await session.send(prompt)

    def run(
        self, prompt: str, *, notebook_path: str | os.PathLike[str] | None = None
    ) -> AgentResult:
        """Blocking :meth:`arun`; safe inside a running event loop (e.g. Jupyter)."""
        from ..sync import run_sync

        return run_sync(self.arun(prompt, notebook_path=notebook_path))

    async def aresume(
        self,
        notebook: str | os.PathLike[str],
        prompt: str,
        *,
        allow_divergence: bool = False,
        notebook_path: str | os.PathLike[str] | None = None,
    ) -> AgentResult:
        """Go on with a recorded session: replay ``notebook`` in a fresh sandbox, restore
        its conversation, then work on ``prompt``; recorded in a new notebook that
        links its parent.  Raises ``ResumeDivergedError`` naming the first cell whose
        replay differs, unless ``allow_divergence``."""
        from .resume import resume_session

        session = await resume_session(
            self, notebook, allow_divergence=allow_divergence, notebook_path=notebook_path
        )
        async with session:
            return await session.send(prompt)

    def resume(
        self,
        notebook: str | os.PathLike[str],
        prompt: str,
        *,
        allow_divergence: bool = False,
        notebook_path: str | os.PathLike[str] | None = None,
    ) -> AgentResult:
        """Blocking :meth:`aresume`."""
        from ..sync import run_sync

        return run_sync(
            self.aresume(
                notebook, prompt, allow_divergence=allow_divergence, notebook_path=notebook_path
            )
        )

    def __repr__(self) -> str:
        return f"<Agent model={self.model!r} base_url={_public_url(self.base_url)!r}>"
