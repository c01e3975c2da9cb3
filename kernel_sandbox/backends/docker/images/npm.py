"""Packages of the npm registry for an image build, fetched by the host's own npm.

The JavaScript kernel is Deno, whose npm package ``@deno/linux-x64-glibc`` holds its
single binary.  As with wheels (:mod:`.wheels`), the host downloads it (``npm pack``,
through whatever registry, proxy and CA the host's npm is set up with) into a cache,
and the build copies the tarball in with no network: nothing inside the image ever
talks to a registry.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ....errors import ImageError
from .wheels import Progress, wheel_cache_dir

__all__ = ["DENO_PACKAGE", "npm_pack"]

#: Deno's binary for glibc x86-64 Linux, pinned: images are rebuilt on purpose only.
DENO_PACKAGE = "@deno/linux-x64-glibc@2.9.6"
#: Seconds ``npm pack`` may take (a ~42 MB download).
_NPM_DEADLINE = 600


def npm_pack(spec: str, progress: Progress) -> Path:
    """The tarball of npm package ``spec`` (``name@version``), downloaded once and cached."""
    cache = wheel_cache_dir().parent / "npm"
    cache.mkdir(parents=True, exist_ok=True)
    name, _, version = spec.rpartition("@")
    expected = cache / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if expected.is_file():
        return expected
    npm = shutil.which("npm")
    if npm is None:
        raise ImageError(
            f"building this image needs {spec} from the npm registry, fetched by the host's "
            "npm: install npm (Debian: `apt-get install -y npm`), or put the tarball "
            f"`npm pack {spec}` made elsewhere at {expected}"
        )
    progress(f"$ npm pack {spec}")
    try:
        done = subprocess.run(
            [npm, "pack", spec, "--pack-destination", str(cache)],
            capture_output=True,
            text=True,
            timeout=_NPM_DEADLINE,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"`npm pack {spec}` did not finish in {_NPM_DEADLINE} s") from exc
    if done.returncode != 0 or not expected.is_file():
        tail = "\n".join((done.stderr or done.stdout).splitlines()[-15:])
        raise ImageError(f"`npm pack {spec}` failed (exit {done.returncode}):\n{tail}")
    return expected
