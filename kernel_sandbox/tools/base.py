"""Tools for language models: the Tool base, options, the registry and ToolSet.

A :class:`Tool` is a parameter model (pydantic; it validates arguments *and* produces
the JSON schema) plus an async ``run`` against an :class:`~kernel_sandbox.AsyncSandbox`.
A :class:`ToolSet` binds the enabled tools to one sandbox: it hands out schemas in the
Chat Completions or Responses format and executes calls.  Whatever goes wrong inside a
call (unknown tool, unparsable JSON, a wrong argument, a dead sandbox, a bug) comes back
as a :class:`ToolResult` with ``status="error"`` and a message the model can act on.
Only mistakes of the *caller* (a bad ``tools_config``) raise, as ``ConfigError``.

Tools know the sandbox API and nothing of agents or notebooks.
"""

from __future__ import annotations

import abc
import json
import logging
import reprlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError, SandboxClosedError, SandboxError
from ..events import call_context
from .results import ToolResult, truncate_middle
from .schema import SchemaFormat, chat_tool, parameters_schema, responses_tool

if TYPE_CHECKING:
    from ..protocols import SandboxLike

__all__ = [
    "MIN_TIMEOUT",
    "PATH_MAX",
    "OsText",
    "Text",
    "Tool",
    "ToolOptions",
    "ToolSet",
    "available_tools",
    "called_name",
    "make_tools",
    "register_tool",
]

log = logging.getLogger(__name__)

ToolsConfig = Mapping[str, "Mapping[str, Any] | ToolOptions"]


def _valid_unicode(value: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); they cannot be sent to the kernel, the
    # engine or back to the model, so they are refused before anything runs.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"contains {value[exc.start]!r} at position {exc.start}, which is not valid "
            "Unicode text (a lone surrogate); send UTF-8 text"
        ) from None
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(
            f"contains a NUL character at position {value.index(chr(0))}; commands and "
            "paths cannot hold one"
        )
    return value


#: Shortest timeout a model may ask for, in seconds.  Shorter ones interrupt the code
#: before it can start; on a loaded host the kernel may then miss the interrupt grace
#: and be restarted, losing every variable over a typo such as 1e-3 for 1e3.
MIN_TIMEOUT = 1.0
#: Longest path Linux accepts (PATH_MAX), in characters; longer ones fail in the engine.
PATH_MAX = 4096
#: A string argument: any valid Unicode text.
Text = Annotated[str, AfterValidator(_valid_unicode)]
#: A string the operating system gets as a path or an argument: valid text, no NUL.
OsText = Annotated[str, AfterValidator(_valid_unicode), AfterValidator(_no_nul)]


class ToolOptions(BaseModel):
    """Options every tool accepts in ``tools_config``; tools add their own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    description: str | None = Field(
        default=None, description="Replace the description the model sees."
    )
    max_output_chars: int = Field(
        default=8000,
        ge=200,
        description="Longer output is cut head + tail, with a marker saying how much is missing.",
    )


class Tool(abc.ABC):
    """One function a model can call, run against a sandbox."""

    #: The name the model calls.
    name: ClassVar[str]
    #: Arguments: validates calls and produces the JSON schema.
    Params: ClassVar[type[BaseModel]]
    #: Options accepted in ``tools_config[name]``.
    Options: ClassVar[type[ToolOptions]] = ToolOptions

    def __init__(self, options: ToolOptions | Mapping[str, Any] | None = None) -> None:
        if isinstance(options, ToolOptions):
            if not isinstance(options, self.Options):
                options = self.Options.model_validate(options.model_dump())
            self.options = options
        else:
            self.options = self.Options.model_validate(dict(options or {}))

    @abc.abstractmethod
    def describe(self, sandbox: SandboxLike) -> str:
        """What the model reads about this tool, for this sandbox."""

    def parameter_descriptions(self, sandbox: SandboxLike) -> dict[str, str]:
        """Property descriptions that depend on options or the sandbox."""
        return {}

    @abc.abstractmethod
    async def run(self, sandbox: SandboxLike, params: Any) -> ToolResult:
        """Execute validated arguments; may raise, the ToolSet turns that into a result."""

    def description(self, sandbox: SandboxLike) -> str:
        """The configured description, or the built-in one."""
        return self.options.description or self.describe(sandbox)

    def schema(
        self, sandbox: SandboxLike, format: SchemaFormat = "chat", *, strict: bool = True
    ) -> dict[str, Any]:
        """The tool in OpenAI's Chat Completions or Responses function format."""
        params = parameters_schema(
            self.Params, strict=strict, descriptions=self.parameter_descriptions(sandbox)
        )
        build = chat_tool if format == "chat" else responses_tool
        return build(self.name, self.description(sandbox), params, strict=strict)

    def validate(self, arguments: Mapping[str, Any]) -> BaseModel:
        """Validated arguments; raises ``ValidationError``."""
        return self.Params.model_validate(dict(arguments))


_REGISTRY: dict[str, type[Tool]] = {}


def register_tool(cls: type[Tool]) -> type[Tool]:
    """Class decorator: make a tool available by name in ``tools_config``."""
    _REGISTRY[cls.name] = cls
    return cls


def available_tools() -> dict[str, type[Tool]]:
    """Every registered tool class by name (the built-in ones included: the package's
    ``__init__`` imports their modules, which register them, before this one is used)."""
    return dict(_REGISTRY)


def _option_problem(name: str, exc: ValidationError, cls: type[Tool]) -> str:
    known = ", ".join(cls.Options.model_fields)
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(options)"
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown option {where!r} (known: {known})")
        else:
            problems.append(f"{where}: {err['msg']}")
    return f"tools_config[{name!r}]: " + "; ".join(problems)


def make_tools(tools_config: ToolsConfig | None = None) -> list[Tool]:
    """Tool instances for a ``tools_config``; ``None`` means every built-in tool.

    Raises ``ConfigError`` naming the tool or option that is wrong.
    """
    registry = available_tools()
    if tools_config is None:
        tools_config = {
            name: {} for name in ("python_executor", "shell_executor", "file_operation")
        }
    tools = []
    for name, options in tools_config.items():
        cls = registry.get(name)
        if cls is None:
            raise ConfigError(
                f"tools_config names an unknown tool {name!r}; available: {', '.join(registry)}"
            )
        if options is None:
            options = {}
        if not isinstance(options, Mapping | ToolOptions):
            raise ConfigError(
                f"tools_config[{name!r}] must be a dict of options, e.g. {{}}; got {options!r}"
            )
        try:
            tool = cls(options)
        except ValidationError as exc:
            raise ConfigError(_option_problem(name, exc, cls)) from exc
        if tool.options.enabled:
            tools.append(tool)
    return tools


#: Bounded reprs of what a model sent: two levels deep, long strings cut in the middle.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 60, 60


def _short_repr(value: Any) -> str:
    """A repr of at most ~60 characters, whatever the value: huge, deeply nested, odd."""
    try:
        text = _SHOWN.repr(value)
    except (ValueError, RecursionError):  # ints beyond the str() digit limit, deep nesting
        text = "..."
    return text if len(text) <= 60 else text[:57] + "..."


def _describe_value(value: Any) -> str:
    return f"{type(value).__name__} {_short_repr(value)}"


def called_name(name: object) -> str:
    """A name as a result or an error shows it: the name sent, cut short if it is absurd.

    Models send any JSON value as a tool name; echoing a 10 MB one back would flood the
    conversation, and a list cannot even be looked up.
    """
    text = _printable(name) if isinstance(name, str) else _short_repr(name)
    return text if len(text) <= 100 else text[:97] + "..."


def _expected(params: type[BaseModel]) -> str:
    parts = []
    for name, field in params.model_fields.items():
        parts.append(f"{name}{'' if field.is_required() else ' (optional)'}")
    return ", ".join(parts)


def argument_problems(exc: ValidationError) -> list[str]:
    """Pydantic errors as sentences that name the argument a model got wrong."""
    problems = []
    for err in exc.errors():
        arg = _short_repr(".".join(str(p) for p in err["loc"]))
        kind = err["type"]
        got = _describe_value(err.get("input"))
        if kind == "missing":
            problems.append(f"missing required argument {arg}")
        elif kind == "extra_forbidden":
            problems.append(f"unexpected argument {arg}")
        elif kind == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            shown = _short_repr(err.get("input"))
            problems.append(f"argument {arg} must be one of {expected}; got {shown}")
        elif kind in ("string_type", "float_type", "float_parsing", "int_type", "int_parsing"):
            want = "a string" if kind == "string_type" else "a number"
            problems.append(f"argument {arg} must be {want}; got {got}")
        elif kind == "value_error":  # our own validators: their sentence says it all
            problems.append(f"argument {arg} {err['ctx']['error']}")
        else:
            problems.append(f"argument {arg}: {err['msg']}; got {got}")
    return problems


def parse_arguments(arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Arguments as a dict; raises ValueError with a sentence for the model."""
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        raise ValueError(f"arguments must be a JSON object; got {_describe_value(arguments)}")
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the arguments are not valid JSON ({exc.msg} at line {exc.lineno} column "
            f"{exc.colno}): {_short_repr(arguments)}; send one JSON object with string "
            "values escaped"
        ) from None
    except RecursionError:
        raise ValueError(
            "the arguments nest arrays or objects too deeply to be read; send one flat JSON object"
        ) from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise ValueError(f"the arguments cannot be read as JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"the arguments must be a JSON object; got {_describe_value(parsed)}")
    return parsed


class ToolSet:
    """The enabled tools of one sandbox: schemas for the model, execution of its calls.

    ``tools_config`` maps tool names to their options (``{"python_executor": {}}``);
    only named tools are enabled.  Without it, every built-in tool is.
    """

    def __init__(self, sandbox: SandboxLike, tools_config: ToolsConfig | None = None) -> None:
        self.sandbox = sandbox
        self._tools = {tool.name: tool for tool in make_tools(tools_config)}

    @classmethod
    def from_tools(cls, sandbox: SandboxLike, tools: list[Tool]) -> ToolSet:
        """A ToolSet of ready-made tool instances (custom tools included)."""
        toolset = cls(sandbox, {})
        toolset._tools = {tool.name: tool for tool in tools}
        return toolset

    @property
    def names(self) -> list[str]:
        """Names of the enabled tools."""
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, if enabled."""
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def schema_map(self, format: SchemaFormat = "chat", *, strict: bool = True) -> dict[str, Any]:
        """``{name: schema}``, as ms-enclave's ``get_sandbox_tools`` returns it."""
        return {n: t.schema(self.sandbox, format, strict=strict) for n, t in self._tools.items()}

    def schemas(
        self, format: SchemaFormat = "chat", *, strict: bool = True
    ) -> list[dict[str, Any]]:
        """The list to pass as ``tools=`` to ``chat.completions.create`` (or ``responses``)."""
        return list(self.schema_map(format, strict=strict).values())

    async def execute(self, name: str, arguments: str | Mapping[str, Any] | None) -> ToolResult:
        """Run one call; never raises (except on cancellation)."""
        started = time.monotonic()
        result = await self._execute(name, arguments)
        result.execution_time = time.monotonic() - started
        tool = self._lookup(name)
        limit = tool.options.max_output_chars if tool else ToolOptions().max_output_chars
        return _fit_for_model(result, limit, self.sandbox.config.max_output_bytes)

    def _lookup(self, name: object) -> Tool | None:
        # a model may send any JSON value as the name, a list included (unhashable)
        return self._tools.get(name) if isinstance(name, str) else None

    async def _execute(self, name: str, arguments: str | Mapping[str, Any] | None) -> ToolResult:
        tool = self._lookup(name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return ToolResult.failure(
                called_name(name),
                f"unknown tool {_short_repr(name)}; the available tools are: {available}",
            )
        try:
            raw = parse_arguments(arguments)
        except ValueError as exc:
            return ToolResult.failure(name, f"{exc}. Expected arguments: {_expected(tool.Params)}")
        try:
            params = tool.validate(raw)
        except ValidationError as exc:
            problems = "; ".join(argument_problems(exc))
            return ToolResult.failure(
                name, f"invalid arguments: {problems}. Expected arguments: {_expected(tool.Params)}"
            )
        try:
            with call_context(tool=name):  # the sandbox tags its events with it
                return await tool.run(self.sandbox, params)
        except SandboxClosedError as exc:
            return ToolResult.failure(
                name, f"the sandbox is no longer running ({exc}); nothing was executed"
            )
        except SandboxError as exc:
            down = await self.sandbox.health()
            if down:
                return ToolResult.failure(name, f"the sandbox is not running: {down}")
            return ToolResult.failure(name, f"the sandbox could not run this call: {exc}")
        except Exception as exc:  # a bug must not end the agent's session
            log.exception("tool %s failed", name)
            return ToolResult.failure(
                name, f"internal error in {name}: {type(exc).__name__}: {exc}"
            )

    def __repr__(self) -> str:
        return f"<ToolSet {self.names} sandbox={getattr(self.sandbox, 'id', '?')}>"


def _fit_for_model(result: ToolResult, limit: int, full_limit: int) -> ToolResult:
    """Cut long text, and make the text JSON can carry (a file read as utf-7 may decode
    to lone surrogates, which would make ``model_dump_json`` raise in the agent).

    ``full_output`` keeps at most ``full_limit`` characters (the sandbox's
    ``max_output_bytes``): the outputs it is made of are capped per kind, but their
    text together could still be a few times that."""
    result.output = _printable(result.output)
    result.error = _printable(result.error) if result.error else result.error
    text, omitted = truncate_middle(result.output, limit)
    if omitted:
        result.full_output, _ = truncate_middle(result.output, full_limit)
        result.output = text
        result.metadata["output_truncated"] = True
        result.metadata["omitted_chars"] = omitted
    if result.error and len(result.error) > limit:
        result.error, _ = truncate_middle(result.error, limit)
    return result


def _printable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
