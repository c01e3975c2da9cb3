"""Describes the Python of an image for wheel tags, as one JSON line.

Runs inside the image with whatever Python it has: no f-strings, works on 2.7 too.
That rules out ``-I`` (3.4+), so its first statement takes the working directory off
sys.path (``python -c`` puts it first): no module there stands in for its imports.
"""

import sys

if sys.path and sys.path[0] == "":
    del sys.path[0]

import glob
import json
import platform

try:
    import venv  # noqa: F401  (whether the image's Python can make a virtualenv)

    has_venv = True
except Exception:
    has_venv = False
libc, libc_version = platform.libc_ver()
if not libc and glob.glob("/lib/ld-musl-*"):
    libc = "musl"
print(
    json.dumps(
        {
            "version": list(sys.version_info[:3]),
            "implementation": getattr(getattr(sys, "implementation", None), "name", "cpython"),
            "machine": platform.machine(),
            "libc": libc,
            "libc_version": libc_version,
            "executable": sys.executable,
            "has_venv": has_venv,
        }
    )
)
