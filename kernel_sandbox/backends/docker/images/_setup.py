"""Runs INSIDE an image being derived, with the image's own Python (CPython >= 3.8).

``venv``: make /opt/venv (seeing the image's own packages), install ipykernel and pip
(and dill) into it from the wheelhouse in /tmp/ks/wheels without any index or network, and write
the venv as a tar to stdout (the host adds it to the derived image; nothing of the
image runs during that build).  It runs confined, as uid 65534 with /opt/venv an
in-memory mount it owns (see ``confined.py``), so pip's own output goes to stderr.
Only the standard library is used, so images without pip work too.
Kept compatible with Python 3.8: no newer syntax here (annotations stay unevaluated).
"""

from __future__ import annotations

import glob
import subprocess
import sys
import tarfile

VENV = "/opt/venv"
WHEELS = "/tmp/ks/wheels"


def _run(argv: list[str]) -> None:
    subprocess.check_call(argv, stdout=sys.stderr)


def make_venv() -> None:
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", VENV])
    pip_wheels = sorted(glob.glob(WHEELS + "/pip-*.whl"))
    if not pip_wheels:
        sys.exit("kernel-sandbox: no pip wheel in the wheelhouse")
    # pip runs straight from its wheel, so the image needs neither pip nor ensurepip.
    pip = [VENV + "/bin/python", pip_wheels[-1] + "/pip", "install", "--no-index"]
    pip += ["--find-links", WHEELS, "--no-cache-dir", "--disable-pip-version-check"]
    pip += ["--no-warn-script-location"]
    # pip itself goes into the venv even if the image has one, so `pip install` in
    # the sandbox installs into the venv.
    _run([*pip, "--ignore-installed", "pip"])
    _run([*pip, "ipykernel", "dill"])
    _run([VENV + "/bin/python", "-c", "import ipykernel"])
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        tar.add(VENV, arcname=VENV.lstrip("/"))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    {"venv": make_venv}[sys.argv[1]]()
