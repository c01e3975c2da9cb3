"""Contexts: several kernels in one sandbox, each with its own state, sharing its files.

A sandbox starts with one kernel (``SandboxConfig.kernel``, the *default context*).
``create_context(language="r")`` starts another kernel of the image in the same
sandbox (same files, processes, limits); ``run_code(code, language=...)`` without a
context runs in the first context of that language, made on first use, as E2B's code
interpreter does.  The kernels an image holds are its Jupyter kernelspecs, listed
inside the sandbox with jupyter_client (:data:`KERNELSPECS_SCRIPT`): any image with a
kernelspec works, ours or a user's.

Languages are named as users and models name them (``python``, ``r``,
``javascript``, ``typescript``, ``bash``); a kernelspec's own ``language`` field
("R", "typescript", ...) decides which kernels speak one (:data:`LANGUAGES`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import ConfigError, KernelError

__all__ = [
    "DEFAULT_CONTEXT",
    "KERNELSPECS_SCRIPT",
    "KNOWN_KERNELS",
    "LANGUAGES",
    "Context",
    "KernelSpecInfo",
    "kernel_for",
    "language_of",
    "normalise_language",
    "parse_kernelspecs",
]

#: The id of a sandbox's own kernel (``SandboxConfig.kernel``).
DEFAULT_CONTEXT = "default"

#: Each language a caller may name, with the kernelspec ``language`` values that speak
#: it (lower case).  Deno's kernel says "typescript" and runs JavaScript too.
LANGUAGES: dict[str, tuple[str, ...]] = {
    "python": ("python",),
    "r": ("r",),
    "javascript": ("javascript", "typescript"),
    "typescript": ("typescript",),
    "bash": ("bash", "sh"),
}
#: Other names for them.
_ALIASES = {"py": "python", "python3": "python", "js": "javascript", "ts": "typescript"}
_ALIASES |= {"sh": "bash", "shell": "bash", "node": "javascript", "deno": "typescript"}

#: Run with the image's kernel Python: every kernelspec it can find, as one JSON line.
KERNELSPECS_SCRIPT = """\
import json
from jupyter_client.kernelspec import KernelSpecManager
manager, found = KernelSpecManager(), {}
for name in sorted(manager.find_kernel_specs()):
    try:
        spec = manager.get_kernel_spec(name)
    except Exception:
        continue
    found[name] = {"language": spec.language, "display_name": spec.display_name,
                   "interrupt_mode": spec.interrupt_mode}
print(json.dumps(found))
"""


@dataclass(frozen=True)
class KernelSpecInfo:
    """One kernelspec an image holds (the fields of its ``kernel.json`` that matter here)."""

    name: str
    language: str
    display_name: str
    interrupt_mode: str = "signal"

    @property
    def speaks(self) -> str:
        """The language a caller names it by (``r``, ``javascript``, ...; else its own)."""
        return language_of(self.language)


@dataclass(frozen=True)
class Context:
    """One kernel of a sandbox: its id, language, kernelspec and working directory."""

    id: str
    language: str
    kernel: str
    cwd: str

    @property
    def is_default(self) -> bool:
        """True for the sandbox's own kernel (it cannot be removed)."""
        return self.id == DEFAULT_CONTEXT


#: The kernels of kernel_sandbox's images as their kernel.json in the image names them:
#: what is said of one without asking the image (a kernelspec for Jupyter, a notebook
#: of a sandbox that cannot be asked).
KNOWN_KERNELS: dict[str, KernelSpecInfo] = {
    "python3": KernelSpecInfo("python3", "python", "Python 3 (ipykernel)"),
    "ir": KernelSpecInfo("ir", "R", "R"),
    "deno": KernelSpecInfo("deno", "typescript", "Deno", "message"),
    "bash": KernelSpecInfo("bash", "bash", "Bash"),
}


def normalise_language(language: str) -> str:
    """``language`` as :data:`LANGUAGES` names it (case and aliases ignored)."""
    name = language.strip().lower()
    return _ALIASES.get(name, name)


def language_of(spec_language: str) -> str:
    """The language a kernelspec's ``language`` field stands for."""
    value = spec_language.strip().lower()
    for language, spoken in LANGUAGES.items():
        if value in spoken:
            return language
    return value


def kernel_for(language: str, specs: dict[str, KernelSpecInfo]) -> str:
    """The kernelspec of ``specs`` that runs ``language`` (``python3`` first for python).

    Raises :class:`~kernel_sandbox.errors.ConfigError` naming the languages the image has.
    """
    wanted = normalise_language(language)
    spoken = LANGUAGES.get(wanted, (wanted,))
    matches = [s.name for s in specs.values() if s.language.strip().lower() in spoken]
    if not matches:
        have = ", ".join(sorted({s.speaks for s in specs.values()})) or "none"
        ours = ", e.g. kernel-sandbox:polyglot" if wanted in LANGUAGES else ""
        raise ConfigError(
            f"this sandbox's image has no {language!r} kernel (its languages: {have}); "
            f"use an image that has one{ours}"
        )
    return "python3" if "python3" in matches else sorted(matches)[0]


def parse_kernelspecs(text: str) -> dict[str, KernelSpecInfo]:
    """The output of :data:`KERNELSPECS_SCRIPT` as :class:`KernelSpecInfo` by name."""
    try:
        raw = json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
    except ValueError as exc:
        raise KernelError(f"the image's kernelspecs could not be read: {text[:200]!r}") from exc
    if not isinstance(raw, dict):
        raise KernelError("the image's kernelspecs could not be read (not a JSON object)")
    return {
        str(name): KernelSpecInfo(
            str(name),
            str(spec.get("language", "")),
            str(spec.get("display_name", name)),
            str(spec.get("interrupt_mode") or "signal"),
        )
        for name, spec in raw.items()
        if isinstance(spec, dict)
    }
