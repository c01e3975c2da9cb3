"""The kernel's tracebacks: stock IPython's text, made without rebuilding pygments' parts.

The launcher (``programs/launcher.py``, "Tracebacks") keeps one lexer class and the
style and formatter made for the same options; these tests hold that the text is stock's,
byte for byte, for tracebacks of many shapes, and that the kernel does use its way.
"""

from __future__ import annotations

import json
import re

from kernel_sandbox.sandbox import AsyncSandbox

# A module with a real file (stack_data reads its source), frames of several shapes.
MODULE = """
def nested(depth):
    if depth == 0:
        return {"a": 1}["b"]
    return nested(depth - 1)


def in_comprehension():
    return [1 / x for x in (2, 1, 0)]


class Thing:
    @property
    def broken(self):
        return self.missing + (
            1,
            2,
        )


def chained():
    try:
        raise ValueError("first " * 20)
    except ValueError as exc:
        raise RuntimeError("second") from exc
"""

# Formats each failure with the kernel's own traceback formatter, first as the kernel
# does it now, then with IPython's and stack_data's own functions put back; prints both.
COMPARE = """
import json, sys, importlib
import stack_data.core, stack_data.utils
from IPython.core import ultratb
sys.path.insert(0, "/tmp")
import tbmod
formatter = get_ipython().InteractiveTB

def in_cell(x):
    return undefined_here + tbmod.nested(x)

failures = [
    lambda: tbmod.nested(3),
    tbmod.in_comprehension,
    lambda: tbmod.Thing().broken,
    tbmod.chained,
    lambda: in_cell(1),
    lambda: compile("x = (1,\\n 2 +", "<made>", "exec"),
    lambda: exec("1 / 0"),
]

def texts():
    out = []
    for failure in failures:
        try:
            failure()
        except BaseException:
            out.append(formatter.structured_traceback(*sys.exc_info()))
    return out

ours_records = ultratb.VerboseTB.get_records
ours_lines = stack_data.core._pygmented_with_ranges
ours = texts()
ultratb.VerboseTB.get_records = ours_records.__globals__["stock_records"]
stack_data.core._pygmented_with_ranges = stack_data.utils._pygmented_with_ranges
stock = texts()
ultratb.VerboseTB.get_records = ours_records
stack_data.core._pygmented_with_ranges = ours_lines
print(json.dumps({
    "records": ours_records.__name__,
    "lines": ours_lines.__name__,
    "ours": ours,
    "stock": stock,
}))
"""


async def test_tracebacks_are_stocks_text_made_the_cheap_way(py_sandbox: AsyncSandbox) -> None:
    await py_sandbox.files.write("/tmp/tbmod.py", MODULE)
    first = await py_sandbox.run_python("1 / 0")  # the first traceback sets the way up
    assert first.error is not None and first.error.ename == "ZeroDivisionError"
    run = await py_sandbox.run_python(COMPARE)
    assert run.ok, run.text
    found = json.loads(run.stdout)
    # the kernel formats with the launcher's functions, not IPython's and stack_data's own
    assert (found["records"], found["lines"]) == ("records", "pygmented_with_ranges")
    ours, stock = found["ours"], found["stock"]
    assert len(ours) == len(stock) == 7
    for mine, theirs in zip(ours, stock, strict=True):
        assert mine == theirs
    joined = "\n".join("\n".join(lines) for lines in ours)
    assert "\x1b[" in joined  # coloured, as the kernel's tracebacks are before cleaning
    plain = re.sub(r"\x1b\[[0-9;]*m", "", joined)
    for expected in (
        "KeyError",
        "ZeroDivisionError",
        "AttributeError",
        "RuntimeError",
        "NameError",
        "SyntaxError",
        "return {",
        "raise RuntimeError",
    ):
        assert expected in plain, expected
