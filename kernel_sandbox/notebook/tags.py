"""Cell tags that steer replay, as nbval and nbclient read them, and who sets them.

=========================  ==========================================================
tag                        replay
=========================  ==========================================================
``nbval-skip``             does not run the cell (``skip-execution``, nbclient's name,
                           works too); verdict ``skipped``
``nbval-ignore-output``    runs the cell, does not compare its outputs; ``ignored``
``raises-exception``       an error is the expected outcome: errors match by name
                           (the message may change), a replay that does not raise
                           ``differs``, and an error is never a ``new error``
``nondeterministic``       runs the cell and compares what the outputs *are*
                           (streams, MIME types, error names) but not their values:
                           random draws, timings, clocks
=========================  ==========================================================

Tags live in ``cell.metadata.tags`` (nbformat's standard place), so Jupyter, nbval and
nbclient see the same tags.  nbval's older spellings count too: the tag
``nbval-raises-exception`` and the comment lines ``# NBVAL_SKIP``,
``# NBVAL_IGNORE_OUTPUT`` (``# PYTEST_VALIDATE_IGNORE_OUTPUT``) and
``# NBVAL_RAISES_EXCEPTION`` in the source.  The recorder adds ``nondeterministic``
when the agent says so (``metadata={"nondeterministic": True}``) or when
:func:`nondeterminism` recognises timed or unseeded random code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "IGNORE_OUTPUT",
    "NONDETERMINISTIC",
    "RAISES_EXCEPTION",
    "SKIP",
    "cell_tags",
    "nondeterminism",
    "seeds_randomness",
]

SKIP = frozenset({"nbval-skip", "skip-execution"})
IGNORE_OUTPUT = "nbval-ignore-output"
RAISES_EXCEPTION = "raises-exception"
NONDETERMINISTIC = "nondeterministic"

_TIMED = re.compile(
    r"(?m)^\s*%%?(?:time|timeit)\b|\btime\.(?:time|perf_counter|monotonic|process_time)(?:_ns)?\(|"
    r"\b(?:datetime|date)\.(?:now|today|utcnow)\(|\bpd\.Timestamp\.now\(|\buuid\.uuid[14]\(|"
    r"\bos\.getpid\(|\bsecrets\."
)
_RANDOM = re.compile(
    r"\b(?:np|numpy)\.random\.(?!seed\b|default_rng\(\s*\d)\w+|\brandom\.(?!seed\b)\w+\(|"
    r"\bdefault_rng\(\s*\)|\btorch\.rand\w*\("
)
_SEED = re.compile(
    r"\b(?:seed|manual_seed)\(\s*\w|\bdefault_rng\(\s*\d|\bRandomState\(\s*\d|random_state\s*=\s*\d"
)


_ALIASES = {
    "nbval-raises-exception": RAISES_EXCEPTION,
    "NBVAL_RAISES_EXCEPTION": RAISES_EXCEPTION,
    "NBVAL_IGNORE_OUTPUT": IGNORE_OUTPUT,
    "PYTEST_VALIDATE_IGNORE_OUTPUT": IGNORE_OUTPUT,
    "NBVAL_SKIP": "nbval-skip",
    "NBVAL_CHECK_OUTPUT": "nbval-check-output",
}


def cell_tags(cell: Mapping[str, Any]) -> set[str]:
    """The tags of a cell (``metadata.tags`` and nbval's comment markers), aliases resolved.

    As in nbval, a comment marker wins over a metadata tag: ``# NBVAL_CHECK_OUTPUT``
    undoes an ``nbval-ignore-output`` tag, and ``# NBVAL_IGNORE_OUTPUT`` an
    ``nbval-check-output`` one.
    """
    raw = cell.get("metadata", {}).get("tags", [])
    tags = (
        {_ALIASES.get(t, t) for t in raw if isinstance(t, str)} if isinstance(raw, list) else set()
    )
    source = cell.get("source", "")
    markers = set()
    for line in ("".join(source) if isinstance(source, list) else source).splitlines():
        line = line.strip()
        if line.startswith("#") and line.lstrip("#").strip() in _ALIASES:
            markers.add(_ALIASES[line.lstrip("#").strip()])
    if "nbval-check-output" in markers and IGNORE_OUTPUT not in markers:
        tags.discard(IGNORE_OUTPUT)
    return tags | markers


def seeds_randomness(code: str) -> bool:
    """True when ``code`` seeds a random generator (later random cells are reproducible)."""
    return bool(_SEED.search(code))


def nondeterminism(code: str, seeded: bool = False) -> str | None:
    """Why ``code``'s output cannot repeat (timed, clock, unseeded random), or None.

    ``seeded`` says an earlier cell of the session seeded the generators; random
    calls are then reproducible on a replay that runs every cell in order.
    """
    if match := _TIMED.search(code):
        return f"timed or clock-dependent: {match.group().strip()}"
    if not seeded and not seeds_randomness(code) and (match := _RANDOM.search(code)):
        return f"random without a seed: {match.group()}"
    return None
