"""smolagents: a ``CodeAgent``'s code runs in a kernel_sandbox kernel.

:class:`KernelSandboxExecutor` is a smolagents ``RemotePythonExecutor`` (the base of
its E2B, Docker and Modal executors), so ``CodeAgent(tools, model,
executor=KernelSandboxExecutor())`` runs every code action in the sandbox's persistent
IPython kernel: variables stay between steps, tools are defined in the kernel from
their source, ``final_answer(...)`` ends the run, and displayed images come back as
``AgentImage`` s.

Nothing the sandbox produces is unpickled: the executor runs smolagents' safe
(JSON-only) serialisation and has no ``allow_pickle`` switch, so a final answer of an
unsupported type is an error the model reads, never a pickle the host loads.  Images
are decoded with a pixel bound.  Every call is recorded in the session notebook.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._extras import require_extra

with require_extra("smolagents", "kernel_sandbox.integrations.smolagents"):
    import PIL.Image
    from smolagents.agent_types import AgentImage
    from smolagents.local_python_executor import CodeOutput
    from smolagents.memory import ActionStep
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.utils import AgentError

from ..config import SandboxConfig
from ..limits import SMOLAGENTS_IMAGE_PIXELS as MAX_IMAGE_PIXELS
from ..notebook.recorder import NotebookRecorder, new_session_path
from ..notebook.storage import sessions_dir
from ..results import Execution
from ..sync import Sandbox

__all__ = ["MAX_IMAGE_PIXELS", "KernelSandboxExecutor"]

_IMAGE_MIMES = ("image/png", "image/jpeg")


def _image(payload: Any) -> AgentImage | None:
    """A base64 image of the sandbox as an AgentImage; None when it is not one we decode."""
    try:
        raw = base64.b64decode("".join(payload) if isinstance(payload, list) else payload)
        with PIL.Image.open(io.BytesIO(raw)) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                return None
            image.load()
            return AgentImage(image.copy())
    except (ValueError, TypeError, OSError, PIL.Image.DecompressionBombError):
        return None


def _text(execution: Execution) -> str:
    return "".join(
        str(o.get("text", "")) for o in execution.outputs if o["output_type"] == "stream"
    )


class KernelSandboxExecutor(RemotePythonExecutor):  # type: ignore[misc]
    """The code executor of a ``CodeAgent``, backed by one kernel_sandbox sandbox.

    Pass a blocking :class:`~kernel_sandbox.Sandbox` to use one you manage (it stays
    open after :meth:`cleanup`), or let the executor create one from ``config`` (any
    :class:`~kernel_sandbox.config.SandboxConfig` fields) on the kernel ``host``, which
    :meth:`cleanup` closes.  Each sandbox's calls go to a notebook in ``record_dir``
    (default ``sessions_dir("smolagents-sessions")``); :attr:`notebook` is its path.

    smolagents hands a code action's images to the model only through a step callback:
    ``CodeAgent(..., step_callbacks=[executor.show_images])`` adds the images the last
    action displayed to its step's ``observations_images``.
    """

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        *,
        config: SandboxConfig | Mapping[str, Any] | None = None,
        host: str = "docker",
        additional_imports: list[str] | None = None,
        logger: AgentLogger | None = None,
        record_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if sandbox is not None and not isinstance(sandbox, Sandbox):
            raise TypeError(
                "KernelSandboxExecutor runs smolagents' blocking code actions: pass a "
                f"kernel_sandbox.Sandbox, not {type(sandbox).__name__}"
            )
        if sandbox is not None and config is not None:
            raise TypeError("pass either a sandbox or a config to make one, not both")
        super().__init__(
            list(additional_imports or []), logger or AgentLogger(LogLevel.INFO), False
        )
        self.owns_sandbox = sandbox is None
        if sandbox is None:
            made = config if isinstance(config, SandboxConfig) else SandboxConfig(**(config or {}))
            sandbox = Sandbox.create(made, host=host)
        self.sandbox: Sandbox = sandbox
        directory = (
            Path(record_dir) if record_dir is not None else sessions_dir("smolagents-sessions")
        )
        self.notebook = new_session_path(directory, "smolagents")
        self.recorder: NotebookRecorder | None = NotebookRecorder.attach(
            sandbox, self.notebook, title="smolagents CodeAgent run"
        )
        #: The images the last code action displayed, in output order.
        self.last_images: list[AgentImage] = []
        self.installed_packages = self.install_packages(self.additional_imports)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run ``code`` in the kernel; a raised error becomes an ``AgentError`` the model
        reads, ``final_answer(...)`` a final ``CodeOutput``."""
        self.last_images = []
        execution = self.sandbox.run_python(code)
        logs = _text(execution)
        if execution.error is not None and execution.error.ename == self.FINAL_ANSWER_EXCEPTION:
            try:
                answer = self._deserialize_final_answer(execution.error.evalue, allow_pickle=False)
            except Exception as exc:  # what the sandbox sent is not a safe final answer
                raise AgentError(f"the final answer could not be read: {exc}", self.logger) from exc
            if isinstance(answer, PIL.Image.Image):
                answer = AgentImage(answer)
            return CodeOutput(output=answer, logs=logs, is_final_answer=True)
        if not execution.ok:
            if execution.error is not None:
                trace = "\n".join(execution.error.traceback) or execution.error.summary
                problem = f"{execution.error.ename}\n{execution.error.evalue}\n{trace}"
            else:
                problem = execution.message or f"the code ended with status {execution.status}"
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{problem}", self.logger)
        result: Any = None
        for output in execution.outputs:
            data = output.get("data") or {}
            images = [_image(data[m]) for m in _IMAGE_MIMES if m in data][:1]
            self.last_images += [i for i in images if i is not None]
            if output["output_type"] == "execute_result":
                result = images[0] if images and images[0] is not None else data.get("text/plain")
        if result is None and self.last_images:
            result = self.last_images[-1]
        return CodeOutput(output=result, logs=logs, is_final_answer=False)

    def show_images(self, step: ActionStep, **_: Any) -> None:
        """A ``step_callbacks`` entry: the last action's images join the step's
        observations, so the model sees them in its next turn."""
        if isinstance(step, ActionStep) and self.last_images:
            shown = [image.to_raw() for image in self.last_images]  # plain PIL images
            step.observations_images = [*(step.observations_images or []), *shown]
            self.last_images = []

    def cleanup(self) -> None:
        """Finish the notebook and close the sandbox if this executor made it."""
        if self.recorder is not None:
            self.recorder.finish("completed", "the smolagents run ended")
            self.recorder.detach(self.sandbox)
            self.recorder = None
        if self.owns_sandbox and not self.sandbox.closed:
            self.sandbox.close()

    def __enter__(self) -> KernelSandboxExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()
