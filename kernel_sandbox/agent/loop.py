"""AgentSession: the multi-round tool-calling loop, one sandbox, one notebook.

Each :meth:`AgentSession.send` is one task: the prompt goes to the model with the
sandbox's tools; every tool call it asks for (several per turn included) runs in the
sandbox, in order, and its result goes back as a ``tool`` message; this repeats until
the model answers in plain text or a :class:`~kernel_sandbox.agent.Budget` limit is
reached.  Model API errors are retried with backoff (:class:`RetryPolicy`, tenacity) and, when
retries run out, end the task with ``status="error"``; tool problems (unknown tool, bad
JSON, wrong arguments, exceptions in user code) are results the model sees and repairs.

Recording: the session listens to its sandbox and hands every execution, command and
file operation to a :class:`~kernel_sandbox.notebook.NotebookRecorder`, adding the
tool-call id, turn, tool name and model to the cell's metadata; messages become
markdown cells.  The recorder rewrites the notebook after each step, so it is valid
at any moment, ``kill -9`` included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SandboxClosedError
from ..events import emit
from ..notebook import NotebookRecorder, new_session_path
from ..sandbox import AsyncSandbox
from ..tools import ToolResult, ToolSet
from .budget import BudgetHit, BudgetTracker, TokenUsage, describe_api_error
from .events import (
    AgentEvent,
    AgentListener,
    AnswerGiven,
    BudgetExhausted,
    ModelFailed,
    ModelResponded,
    ModelRetrying,
    SessionEnded,
    SessionStarted,
    ToolCallFinished,
    ToolCallStarted,
    TurnStarted,
)
from .messages import (
    Message,
    ParsedCall,
    assistant_message,
    image_message,
    parse_reply,
    system_prompt,
    tool_message,
)
from .recording import Recording
from .results import AgentResult, AgentStatus, borrowed

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from ..protocols import SandboxLike
    from ..sync import Sandbox
    from .agent import Agent

__all__ = ["AgentSession"]

log = logging.getLogger(__name__)

_NOTEBOOK_STATUS = {"completed": "completed", "budget_exhausted": "budget_exhausted"}


class _TimeUp(Exception):
    """The time budget ran out during a model call or its retries."""


class _ModelFailure(Exception):
    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts


class AgentSession:
    """One conversation with the model, one sandbox, one notebook.

    Use it as ``async with agent.session() as session`` and call :meth:`send` once per
    task; the conversation (``messages``) and the sandbox's state carry over between
    tasks.  ``listeners`` receive :mod:`~kernel_sandbox.agent.events` events.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        sandbox: SandboxLike | Sandbox | None = None,
        notebook_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.agent = agent
        self.id = secrets.token_hex(8)
        self.listeners: list[AgentListener] = list(agent.listeners)
        self.messages: list[Message] = []
        self.sandbox: SandboxLike | None = borrowed(sandbox) or agent.sandbox
        self._owns_sandbox = self.sandbox is None
        self.toolset: ToolSet | None = None
        self.recording = Recording()
        self._notebook_path = Path(notebook_path) if notebook_path else None
        self.usage = TokenUsage()
        self.turns = 0
        self._client: AsyncOpenAI | None = None
        self._tools: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._started = False
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    @property
    def recorder(self) -> NotebookRecorder | None:
        """The session's notebook recorder (None when recording is off)."""
        return self.recording.recorder

    @property
    def notebook_path(self) -> Path | None:
        """Where the session is recorded (None when recording is off)."""
        return self.recording.path

    async def start(self) -> None:
        """Create (or adopt) the sandbox and the notebook; ``send`` calls it if needed."""
        if self._started:
            return
        if self._closed:
            raise SandboxClosedError("this agent session was closed; start a new one")
        agent = self.agent
        self._client = agent.make_client()
        if self.sandbox is None:
            try:
                self.sandbox = await AsyncSandbox.create(agent.config)
            except BaseException:
                await self._close_client()
                raise
        sandbox = self.sandbox
        try:
            self.toolset = ToolSet(sandbox, agent.tools_config)
            self._tools = self.toolset.schemas("chat")
            prompt = agent.system_prompt or system_prompt(
                working_dir=sandbox.working_dir,
                network=sandbox.config.network,
                vision=agent.vision,
                tools=self.toolset.names,
            )
            self.messages = [{"role": "system", "content": prompt}]
            if agent.record:
                path = self._notebook_path or new_session_path(agent.notebook_dir)
                recorder = NotebookRecorder(
                    path,
                    title=f"Agent session ({agent.model})",
                    metadata={
                        "session_id": self.id,
                        "kind": "agent",
                        "model": agent.model,
                        "agent": agent.describe(),
                        "tools": self.toolset.names,
                        "system_prompt": prompt,
                    },
                )
                recorder.describe_sandbox(sandbox)
                self.recording = Recording(recorder)
                sandbox.listeners.append(recorder)
        except BaseException:
            if self._owns_sandbox:
                await sandbox.close()
            await self._close_client()
            raise
        self._started = True
        await self._emit(
            SessionStarted(
                session_id=self.id,
                model=agent.model,
                sandbox_id=sandbox.id,
                image=sandbox.image,
                notebook_path=self.notebook_path,
            )
        )

    async def close(self) -> None:
        """Stop listening to the sandbox; remove it if this session created it."""
        if self._closed:
            return
        self._closed = True
        sandbox = self.sandbox
        recorder = self.recording.recorder
        if sandbox is not None and recorder is not None and recorder in sandbox.listeners:
            sandbox.listeners.remove(recorder)
        try:
            if self._owns_sandbox and sandbox is not None:
                await sandbox.close()
        finally:
            await self._close_client()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None and self.agent.client is None:  # a lent client stays open
            await client.close()

    async def __aenter__(self) -> AgentSession:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the loop ---------------------------------------------------------------------

    async def send(self, prompt: str) -> AgentResult:
        """Give the model a task and work on it until it answers or a budget ends it.

        Never raises for model API errors or tool problems: the result says what
        happened.  The notebook is updated after every step.
        """
        await self.start()
        async with self._lock:
            tracker = BudgetTracker(self.agent.budget)
            self.recording.step(NotebookRecorder.set_metadata, {"status": "running"})
            self.messages.append({"role": "user", "content": prompt})
            self.recording.step(NotebookRecorder.add_user_message, prompt)
            try:
                return await self._work(tracker)
            except BaseException as exc:
                reason = "interrupted" if not isinstance(exc, Exception) else repr(exc)
                self.recording.step(
                    NotebookRecorder.finish, "failed", f"the agent stopped: {reason}"
                )
                raise

    async def _work(self, tracker: BudgetTracker) -> AgentResult:
        counters = {"tool_calls": 0}
        last_text = ""
        while True:
            hit = tracker.exhausted()
            if hit is not None:
                return await self._end_budget(tracker, hit, last_text, counters)
            turn = tracker.turns + 1
            await self._emit(TurnStarted(session_id=self.id, turn=turn))
            started = time.monotonic()
            try:
                completion = await self._call_model(turn, tracker)
            except _TimeUp:
                hit = tracker.time_hit() or BudgetHit("time", tracker.budget.max_time or 0, 0)
                return await self._end_budget(tracker, hit, last_text, counters)
            except _ModelFailure as exc:
                return await self._end_error(tracker, exc.message, exc.attempts, counters)
            usage = TokenUsage.of(getattr(completion, "usage", None))
            tracker.add_turn(usage)
            self.turns += 1
            self.usage = self.usage + usage
            try:
                reply = parse_reply(completion)
            except ValueError as exc:
                return await self._end_error(tracker, str(exc), 1, counters)
            self.messages.append(assistant_message(reply))
            text = reply.text or reply.refusal or ""
            await self._emit(
                ModelResponded(
                    session_id=self.id,
                    turn=turn,
                    text=text,
                    tool_calls=[
                        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.calls
                    ],
                    usage=usage,
                    finish_reason=reply.finish_reason,
                    duration=time.monotonic() - started,
                )
            )
            meta = {
                "turn": turn,
                "model": self.agent.model,
                "finish_reason": reply.finish_reason,
                "usage": dataclasses.asdict(usage),
            }
            if not reply.calls:
                if reply.finish_reason == "length":
                    text += "\n\n[the reply was cut off at the model's output limit]"
                self.recording.step(NotebookRecorder.add_assistant_message, text, meta)
                await self._emit(AnswerGiven(session_id=self.id, text=text))
                return await self._finish(tracker, "completed", text, "", None, counters)
            if text:
                last_text = text
                self.recording.step(NotebookRecorder.add_assistant_message, text, meta)
            results: list[tuple[str, ToolResult]] = []
            for call in reply.calls:
                hit = tracker.time_hit()
                if hit is not None:  # the model still needs an answer to every call id
                    skipped = ToolResult.failure(call.name, f"not executed: {hit.message}")
                    self.messages.append(tool_message(call.id, skipped))
                    continue
                result = await self._run_tool(turn, call)
                counters["tool_calls"] += 1
                results.append((call.id, result))
                self.messages.append(tool_message(call.id, result))
            if self.agent.vision:
                images = image_message(results)
                if images is not None:
                    self.messages.append(images)

    async def _call_model(self, turn: int, tracker: BudgetTracker) -> Any:
        """One chat completion, retried by the policy; raises _TimeUp or _ModelFailure.

        The time budget bounds the whole call, retries and waits included.
        """
        client = self._client
        assert client is not None
        request: dict[str, Any] = {
            **self.agent.completion_options,
            "model": self.agent.model,
            "messages": self.messages,
        }
        if self._tools:
            request["tools"] = self._tools
        attempts = 0

        async def attempt() -> Any:
            nonlocal attempts
            attempts += 1
            return await client.chat.completions.create(**request)

        async def announce(attempt: int, delay: float, exc: BaseException) -> None:
            message = describe_api_error(exc)
            log.info("model call failed (%s); retry %d in %.2fs", message, attempt, delay)
            await self._emit(
                ModelRetrying(
                    session_id=self.id, turn=turn, attempt=attempt, delay=delay, error=message
                )
            )

        remaining = tracker.remaining_time()
        if remaining is not None and remaining <= 0:
            raise _TimeUp
        deadline = asyncio.timeout(remaining)
        try:
            async with deadline:
                return await self.agent.retry.retrying(announce)(attempt)
        except Exception as exc:
            if deadline.expired() or tracker.time_hit() is not None:
                raise _TimeUp from exc
            raise _ModelFailure(describe_api_error(exc), attempts) from exc

    async def _run_tool(self, turn: int, call: ParsedCall) -> ToolResult:
        """Run one call in the sandbox (never raises) and record it with its id."""
        assert self.toolset is not None
        await self._emit(
            ToolCallStarted(
                session_id=self.id,
                turn=turn,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
            )
        )
        context = {"tool_call_id": call.id, "tool": call.name, "turn": turn}
        context["model"] = self.agent.model
        result = ToolResult.failure(call.name, "the call was interrupted")
        try:
            if call.problem:
                result = ToolResult.failure(call.name or "unknown", call.problem)
            else:
                with self.recording.call(context):
                    result = await self.toolset.execute(call.name, call.arguments)
        except Exception as exc:  # ToolSet promises not to raise; a bug must not end the task
            log.exception("tool call %s failed", call.name)
            result = ToolResult.failure(call.name, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.recording.end_call(call, result)
        await self._emit(
            ToolCallFinished(
                session_id=self.id, turn=turn, call_id=call.id, name=call.name, result=result
            )
        )
        return result

    # -- endings ----------------------------------------------------------------------

    async def _end_budget(
        self, tracker: BudgetTracker, hit: BudgetHit, last_text: str, counters: dict[str, int]
    ) -> AgentResult:
        stop = f"[Stopped before a final answer: {hit.message}.]"
        answer = f"{last_text}\n\n{stop}" if last_text else stop
        self.recording.step(
            NotebookRecorder.add_note, f"**Stopped:** {hit.message}.", {"budget": hit.kind}
        )
        await self._emit(BudgetExhausted(session_id=self.id, kind=hit.kind, message=hit.message))
        return await self._finish(tracker, "budget_exhausted", answer, hit.message, hit, counters)

    async def _end_error(
        self, tracker: BudgetTracker, message: str, attempts: int, counters: dict[str, int]
    ) -> AgentResult:
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
        reason = f"the model API failed after {tries}: {message}"
        self.recording.step(
            NotebookRecorder.add_note, f"**Model API error:** {reason}", {"error": message}
        )
        await self._emit(ModelFailed(session_id=self.id, error=message, attempts=attempts))
        return await self._finish(tracker, "error", "", reason, None, counters)

    async def _finish(
        self,
        tracker: BudgetTracker,
        status: AgentStatus,
        answer: str,
        reason: str,
        hit: BudgetHit | None,
        counters: dict[str, int],
    ) -> AgentResult:
        def close_notebook(recorder: NotebookRecorder) -> None:
            # the conversation, so `agent --resume` can go on from this notebook
            recorder.set_metadata(
                usage=dataclasses.asdict(self.usage), turns=self.turns, messages=self.messages
            )
            recorder.finish(_NOTEBOOK_STATUS.get(status, "failed"), reason)

        self.recording.step(close_notebook)
        result = AgentResult(
            status=status,
            answer=answer,
            session_id=self.id,
            reason=reason,
            budget=hit.kind if hit else None,
            turns=tracker.turns,
            tool_calls=counters["tool_calls"],
            usage=tracker.usage,
            duration=tracker.elapsed,
            notebook_path=self.notebook_path,
        )
        await self._emit(
            SessionEnded(
                session_id=self.id,
                status=status,
                reason=reason,
                notebook_path=self.notebook_path,
            )
        )
        return result

    # -- events ---------------------------------------------------------------------

    async def _emit(self, event: AgentEvent) -> None:
        await emit(self.listeners, event)

    def __repr__(self) -> str:
        return f"<AgentSession {self.id} model={self.agent.model!r} turns={self.turns}>"
