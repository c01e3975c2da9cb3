"""Adapters for the frameworks agents are built in, each a thin layer over a sandbox.

- :mod:`~kernel_sandbox.integrations.openai_agents` — the OpenAI Agents SDK: an
  ``agents.sandbox`` client (``KernelSandboxClient``) for Sandbox Agents, and the
  ``KernelPython`` capability, the stateful kernel as a tool (extra ``[openai-agents]``);
- :mod:`~kernel_sandbox.integrations.langchain` — ``sandbox_tools(sandbox)``, LangChain
  tools (extra ``[langchain]``);
- :mod:`~kernel_sandbox.integrations.smolagents` — ``KernelSandboxExecutor``, the code
  executor of a smolagents ``CodeAgent`` (extra ``[smolagents]``).

pydantic-ai needs no adapter: its MCP client drives ``kernel-sandbox serve``'s ``/mcp``
(see the frameworks page of the docs).  Each module imports its framework only when it
is imported itself, and names the extra to install when the framework is missing.
"""

from __future__ import annotations

__all__: list[str] = []
