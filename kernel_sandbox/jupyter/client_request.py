"""What a Jupyter client asks of its kernel: ``extra_arguments`` and ``env``, filtered.

A stock kernel runs as a local process with the arguments and the environment its client
gave it (nbclient's ``--HistoryManager.hist_file=:memory:``, jupyter_server's
``JPY_SESSION_NAME``, a test's variables).  A sandboxed kernel gets them too, except:

- nothing of the host's own environment: jupyter_client starts from a copy of
  ``os.environ``, so a variable whose value is the host's is not the client's wish and
  stays out (the host's secrets never reach sandboxed code);
- nothing that steers the sandbox's own plumbing or loads code from host paths: the
  kernel's connection (its sockets, key, transport, connection file, parent process),
  the loader (``LD_*``, ``PYTHONPATH``, ``PYTHONHOME``...), the places the image sets
  (``PATH``, ``HOME``...), the egress proxy and trust settings, and our own
  ``KERNEL_SANDBOX_*`` variables;
- no more than :data:`~kernel_sandbox.limits.KERNEL_ARGS_MAX` arguments and
  :data:`~kernel_sandbox.limits.KERNEL_ENV_MAX_BYTES` of environment.

What is left out is named in the provisioner's log, never silently.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from ..limits import KERNEL_ARG_MAX_CHARS, KERNEL_ARGS_MAX, KERNEL_ENV_MAX_BYTES

__all__ = ["KERNEL_ARGS_ENV", "kernel_arguments", "kernel_env"]

#: The variable that carries the client's kernel arguments (JSON) to the launcher.
KERNEL_ARGS_ENV = "KERNEL_SANDBOX_KERNEL_ARGS"

# ipykernel's aliases and traits that make the kernel bind, sign or poll otherwise than
# the sandbox set up (any class: IPKernelApp, KernelApp, ConnectionFileMixin...).
_CONNECTION_ALIASES = frozenset(
    {"f", "ip", "transport", "hb", "shell", "iopub", "stdin", "control", "kernel", "parent"}
)
_CONNECTION_TRAITS = frozenset(
    {
        "connection_file", "ip", "transport", "shell_port", "iopub_port", "stdin_port",
        "control_port", "hb_port", "kernel_class", "outstream_class", "displayhook_class",
        "parent_handle", "interrupt", "key", "keyfile", "signature_scheme", "trio_loop",
    }
)  # fmt: skip
_REFUSED_CLASSES = frozenset({"Session", "ConnectionFileMixin"})

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REFUSED_PREFIXES = ("LD_", "DYLD_", "KERNEL_SANDBOX_", "JPY_PARENT", "JPY_INTERRUPT")
_REFUSED_NAMES = frozenset(
    {
        "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONPLATLIBDIR",
        "PYTHONEXECUTABLE", "PYTHONPYCACHEPREFIX", "PATH", "HOME", "USER", "LOGNAME",
        "SHELL", "PWD", "TMPDIR", "IPYTHONDIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR",
        "JUPYTER_PATH", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_PATH", "HTTP_PROXY",
        "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST",
    }
)  # fmt: skip


def _refused_option(name: str) -> bool:
    """Whether ``--name`` (an alias or ``Class.trait``) steers the sandbox's plumbing."""
    if "." not in name:
        return name in _CONNECTION_ALIASES
    cls, _, trait = name.rpartition(".")
    return trait in _CONNECTION_TRAITS or cls.rpartition(".")[2] in _REFUSED_CLASSES


def kernel_arguments(extra: Sequence[str]) -> tuple[list[str], list[str]]:
    """The client's kernel arguments to pass on, and those left out.

    Options only (``--Class.trait=value``, ``--flag``, or an option and its value as
    two arguments); positional arguments and the connection's options are left out.
    """
    kept: list[str] = []
    dropped: list[str] = []
    args = list(extra)
    i = 0
    while i < len(args):
        group = [args[i]]
        if "=" not in args[i] and i + 1 < len(args) and not args[i + 1].startswith("-"):
            group.append(args[i + 1])  # ``--Class.trait value``
        i += len(group)
        option = group[0]
        name = option[2:].split("=", 1)[0]
        fits = len(kept) + len(group) <= KERNEL_ARGS_MAX
        if (
            not option.startswith("--")
            or not name
            or _refused_option(name)
            or not fits
            or any(len(a) > KERNEL_ARG_MAX_CHARS or "\0" in a for a in group)
        ):
            dropped.extend(group)
        else:
            kept.extend(group)
    return kept, dropped


def _refused_name(name: str) -> bool:
    upper = name.upper()
    return upper in _REFUSED_NAMES or upper.startswith(_REFUSED_PREFIXES)


def kernel_env(
    env: Mapping[str, str], host_env: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The variables the client set for the kernel, and the names left out.

    ``host_env`` (default ``os.environ``): a variable with the host's own value is not
    the client's and is neither passed on nor reported.
    """
    host = os.environ if host_env is None else host_env
    kept: dict[str, str] = {}
    dropped: list[str] = []
    size = 0
    for name, value in sorted(env.items()):
        if host.get(name) == value:
            continue
        cost = len(name.encode()) + len(str(value).encode(errors="replace")) + 2
        if (
            not _NAME.match(name)
            or not isinstance(value, str)
            or "\0" in value
            or _refused_name(name)
            or size + cost > KERNEL_ENV_MAX_BYTES
        ):
            dropped.append(name)
            continue
        size += cost
        kept[name] = value
    return kept, dropped
