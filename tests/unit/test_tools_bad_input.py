"""Bad tool calls without a daemon: properties of parsing, validation and error sentences.

Hypothesis generates what a model might send; the in-memory sandbox of test_tools.py
plays the sandbox.  tests/integration/test_bad_input.py throws the same at a real one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.testing import LocalKernelHost
from kernel_sandbox.tools import ToolSet
from kernel_sandbox.tools.base import argument_problems, called_name, parse_arguments
from kernel_sandbox.tools.files import FileParams
from kernel_sandbox.tools.python import PythonParams
from kernel_sandbox.tools.shell import ShellParams

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5)
    ),
    max_leaves=30,
)
nasty_text = st.one_of(
    st.text(),
    st.text(alphabet=st.sampled_from('{}[]":,0-e\x00\\u')),
    st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),
)
PARAMS = [PythonParams, ShellParams, FileParams]
#: No sentence about bad arguments needs more than this.
SENTENCE_BOUND = 600
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(arguments=json_values.map(json.dumps) | nasty_text | json_values)
def test_parse_arguments_gives_a_dict_or_one_bounded_sentence(arguments: Any) -> None:
    try:
        parsed = parse_arguments(arguments)
    except ValueError as exc:
        assert 0 < len(str(exc)) < SENTENCE_BOUND
    else:
        assert isinstance(parsed, dict)


def test_parse_arguments_survives_deep_nesting_and_giant_integers() -> None:
    for text in ("[" * 100_000, '{"a":' * 100_000, '{"timeout": ' + "9" * 5000 + "}"):
        try:
            parse_arguments(text)
        except ValueError as exc:
            assert len(str(exc)) < SENTENCE_BOUND
        else:
            raise AssertionError("accepted")


@PROPERTY
@given(params=st.sampled_from(PARAMS), raw=st.dictionaries(st.text(), json_values, max_size=6))
def test_validation_errors_are_one_bounded_sentence_each(params: Any, raw: dict[str, Any]) -> None:
    try:
        params.model_validate(raw)
    except ValidationError as exc:
        problems = argument_problems(exc)
        assert len(problems) == exc.error_count()
        for sentence in problems:
            assert "argument" in sentence
            assert len(sentence) < SENTENCE_BOUND, sentence[:200]
            sentence.encode("utf-8")  # no lone surrogate echoed back


@PROPERTY
@given(name=json_values | nasty_text)
def test_called_name_is_short_and_serialisable(name: Any) -> None:
    shown = called_name(name)
    assert len(shown) <= 100
    shown.encode("utf-8")


@PROPERTY
@given(
    name=st.sampled_from(["python_executor", "shell_executor", "file_operation", "nope"])
    | json_values,
    arguments=json_values | nasty_text,
)
def test_toolset_execute_never_raises_and_stays_small(name: Any, arguments: Any) -> None:
    # A real sandbox, closed: random arguments that happen to be valid must not run
    # random code on this machine (a local host is no sandbox); they get an error result.
    config = SandboxConfig(host="local")
    sandbox = AsyncSandbox(config, LocalKernelHost("unit", config), "unit")
    asyncio.run(sandbox.close())
    result = asyncio.run(ToolSet(sandbox).execute(name, arguments))
    assert result.status in {"success", "error", "timeout"}
    assert len(result.model_dump_json()) < 20_000
    if result.status == "error":
        assert result.error
