"""The host pip's own idea of its package index and CA bundle (``network="packages"``).

Read from ``pip config list`` — which already merges the configuration files and the
``PIP_*`` environment variables — so the sandbox reaches exactly the index this host's
pip would, through the same CA.  File URLs (local wheel directories) mean nothing inside
a sandbox and are ignored, and so are credentials in an index URL: they stay on the host.
"""

from __future__ import annotations

import ast
import functools
import logging
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

__all__ = ["PYPI_FILES_HOST", "PYPI_INDEX", "PipSettings", "host_pip_settings", "parse_pip_config"]

log = logging.getLogger(__name__)

#: pip's default index, used when its configuration names none.
PYPI_INDEX = "https://pypi.org/simple"
#: Where that index serves its files from.
PYPI_FILES_HOST = "files.pythonhosted.org"
#: Which configuration wins for a key: the environment, then command sections, then global.
_PRECEDENCE = (":env:", "install", "download", "global")
_PIP_CONFIG_TIMEOUT = 30.0


@dataclass(frozen=True)
class PipSettings:
    """What the sandbox needs of the host pip's configuration."""

    index_url: str = PYPI_INDEX
    extra_index_urls: tuple[str, ...] = ()
    #: pip's ``cert`` setting: the CA bundle the host trusts for the index (or None).
    cert: str | None = None

    def index_patterns(self) -> list[str]:
        """Host patterns (``name:port``) for every index, plus PyPI's file host."""
        patterns = []
        for url in (self.index_url, *self.extra_index_urls):
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            host = parts.hostname or ""
            host = f"[{host}]" if ":" in host else host
            patterns.append(f"{host}:{port}")
            if parts.hostname == "pypi.org":
                patterns.append(f"{PYPI_FILES_HOST}:443")
        return list(dict.fromkeys(patterns))


def _network_url(url: str) -> str | None:
    """``url`` without credentials if it is http(s), else None (file URLs, paths)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.username or parts.password:
        log.warning("an index URL in pip's configuration has credentials; they stay on the host")
        netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


def parse_pip_config(listing: str) -> PipSettings:
    """Settings from the output of ``pip config list`` (``section.key='value'`` lines)."""
    values: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        values[(section, key.replace("_", "-"))] = str(value)

    def first(key: str) -> str | None:
        for section in _PRECEDENCE:
            if (section, key) in values:
                return values[(section, key)]
        return None

    index = _network_url(first("index-url") or PYPI_INDEX) or PYPI_INDEX
    extras: list[str] = []
    for section in _PRECEDENCE:
        for url in values.get((section, "extra-index-url"), "").split():
            kept = _network_url(url)
            if kept is not None and kept != index and kept not in extras:
                extras.append(kept)
    return PipSettings(index, tuple(extras), first("cert") or None)


@functools.lru_cache(maxsize=1)
def host_pip_settings() -> PipSettings:
    """The host pip's settings, read once per process; pip's defaults if pip cannot tell."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=_PIP_CONFIG_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not read pip's configuration (%s); using pip's defaults", exc)
        return PipSettings()
    if done.returncode != 0:
        log.warning("`pip config list` failed: %s; using pip's defaults", done.stderr.strip())
        return PipSettings()
    return parse_pip_config(done.stdout)
