"""Text normalisation and number-tolerant text comparison for replay.

Two rules keep these from hiding real changes: every pattern works inside one line
(no ``\\s`` that could cross a line break), and no pattern removes a digit unless the
line says it is a timing (``Wall time:``, ``%timeit``'s ``per loop``, a progress
bar's rate, a ``took``/``elapsed`` line) or the digits are a memory address after
``at``.  Everything else that varies between runs is data: a changed timestamp,
epoch second or random number is reported, and a cell whose output is random by
design is tagged ``nondeterministic`` instead (see :mod:`.tags`).

Numbers are then compared with a relative tolerance (floats only; integers exactly),
so ``0.30000000000000004`` and ``0.3`` match while ``1500000000`` and ``1999999999``
do not.  The "What replay ignores" table (docs/concepts/notebooks.md) lists every
rule; each one has a test that a changed value still differs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..results import strip_ansi

__all__ = [
    "DEFAULT_ABS_TOL",
    "DEFAULT_REL_TOL",
    "NumberTolerance",
    "normalise_text",
    "texts_match",
]

#: Floats may differ this much, relatively (rounding noise, not a changed value).
DEFAULT_REL_TOL = 1e-9
#: ... or this much absolutely (0: values near zero must match to ``rel_tol`` too).
DEFAULT_ABS_TOL = 0.0

_TIMING_WORDS = re.compile(
    r"(?i)\b(?:time|times|took|elapsed|duration|runtime|wall|cpu|per loop|finished in|done in)\b"
)
_UNIT = r"(?:ns|µs|us|ms|s|sec|secs|seconds)"
_DURATION = re.compile(rf"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?[ \t]?{_UNIT}(?![A-Za-z])")
_SUBSTITUTIONS: list[tuple[re.Pattern[str], str]] = [
    # IPython >= 8 prints the Greek mu (U+03BC); older versions the micro sign (U+00B5).
    (re.compile("\u03bc"), "\u00b5"),
    # a repr's memory address: "<Foo object at 0x7f3a...>", "<function f at 0x...>"
    (re.compile(r"\bat 0x[0-9a-fA-F]{6,16}\b"), "at 0x…"),
    (re.compile(r"/tmp/ipykernel_\d+/\d+\.py"), "<cell>"),
    # a version-4 UUID is random by definition (uuid1/3/5 ones are data: kept)
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\b"),
        "<uuid4>",
    ),
    # display(..., display_id=True) draws a random uuid4().hex
    (re.compile(r"<DisplayHandle display_id=[0-9a-f]{32}>"), "<DisplayHandle display_id=…>"),
    (re.compile(r"/tmp/tmp[a-z0-9_]{6,}"), "/tmp/<tmp>"),
    # %timeit, IPython >= 7: "1.2 ms ± 3 µs per loop (mean ± std. dev. of 7 runs, 1,000 loops each)"
    (
        re.compile(
            r"[\d.]+[ \t]?[nµum]?s ± [\d.]+[ \t]?[nµum]?s per loop "
            r"\(mean ± std\. dev\. of \d+ runs?, [\d,]+ loops? each\)"
        ),
        "<timeit>",
    ),
    # %timeit, older IPython: "1000 loops, best of 3: 1.5 ms per loop"
    (re.compile(r"[\d,]+ loops?, best of \d+: [\d.]+[ \t]?[nµum]?s per loop"), "<timeit>"),
    (
        re.compile(
            r"The slowest run took [\d.]+ times longer than the fastest\.[^\n]*\n?"
            r"(?:[^\n]*intermediate result is being cached\.?\n?)?"
        ),
        "",
    ),
    # %time: "CPU times: user 1.2 ms, sys: 0 ns, total: 1.2 ms" / "Wall time: 3.1 s"
    (re.compile(r"(?m)^(CPU times: |Wall time: )[^\n]*"), r"\1<timing>"),
    # tqdm: "[00:01<00:00,  9.52it/s]"
    (
        re.compile(r"\[\d+:\d\d(?::\d\d)?<[\d:?]+,[ \t]*[\d.?]+[ \t]?(?:it/s|s/it|[kMG]?B/s)\]"),
        "[<rate>]",
    ),
]
_TRAILING_SPACES = re.compile(r"[ \t]+$", re.MULTILINE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w])")


def normalise_text(text: str | list[str]) -> str:
    """Text with ANSI codes, addresses, timings and trailing spaces neutralised.

    Each rule is line-local; see the module docstring for what is never touched.
    """
    if isinstance(text, list):
        text = "".join(text)
    text = strip_ansi(text).replace("\r\n", "\n")
    for pattern, placeholder in _SUBSTITUTIONS:
        text = pattern.sub(placeholder, text)
    if _TIMING_WORDS.search(text):
        text = "\n".join(
            _DURATION.sub("<duration>", line) if _TIMING_WORDS.search(line) else line
            for line in text.split("\n")
        )
    return _TRAILING_SPACES.sub("", text).strip("\n").rstrip()


@dataclass(frozen=True)
class NumberTolerance:
    """How far two printed numbers may be apart and still be the same value.

    Floats (a ``.`` or an exponent) match when ``math.isclose(a, b, rel_tol, abs_tol)``;
    integers must be equal, because an integer that changed is a changed count or id.
    """

    rel_tol: float = DEFAULT_REL_TOL
    abs_tol: float = DEFAULT_ABS_TOL

    def numbers_match(self, a: str, b: str) -> bool:
        """True when the two number tokens are the same value within the tolerance."""
        if a == b:
            return True
        if _is_int(a) and _is_int(b):
            return int(a) == int(b)
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        return math.isclose(x, y, rel_tol=self.rel_tol, abs_tol=self.abs_tol)


def _is_int(token: str) -> bool:
    return not any(c in token for c in ".eE")


def _tokens(text: str) -> list[str]:
    """``text`` split into alternating non-number and number pieces (numbers at odd places)."""
    pieces: list[str] = []
    last = 0
    for match in _NUMBER.finditer(text):
        pieces.append(text[last : match.start()])
        pieces.append(match.group())
        last = match.end()
    pieces.append(text[last:])
    return pieces


def texts_match(a: str, b: str, tolerance: NumberTolerance | None = None) -> bool:
    """True when ``a`` and ``b`` (already normalised) differ only in numbers within tolerance."""
    if a == b:
        return True
    tol = tolerance or NumberTolerance()
    left, right = _tokens(a), _tokens(b)
    if len(left) != len(right):
        return False
    for i, (x, y) in enumerate(zip(left, right, strict=True)):
        if i % 2 == 0:
            if x != y:
                return False
        elif not tol.numbers_match(x, y):
            return False
    return True
