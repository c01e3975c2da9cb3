"""Runs INSIDE an image being derived, with the image's own Python (CPython >= 3.8).

``venv``: make /opt/venv (seeing the image's own packages) and install ipykernel and
pip into it from the wheelhouse in /tmp/ks/wheels, without any index or network.
``user``: make the non-root user ``sandbox`` and the working directory /sandbox.
Only the standard library is used, so images without useradd or pip work too.
Kept compatible with Python 3.8: no newer syntax here (annotations stay unevaluated).
"""

from __future__ import annotations

import glob
import os
import pwd
import subprocess
import sys

VENV = "/opt/venv"
WHEELS = "/tmp/ks/wheels"
USER = "sandbox"
WORKDIR = "/sandbox"


def make_venv() -> None:
    subprocess.check_call(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", VENV]
    )
    pip_wheels = sorted(glob.glob(WHEELS + "/pip-*.whl"))
    if not pip_wheels:
        sys.exit("kernel-sandbox: no pip wheel in the wheelhouse")
    # pip runs straight from its wheel, so the image needs neither pip nor ensurepip.
    pip = [VENV + "/bin/python", pip_wheels[-1] + "/pip", "install", "--no-index"]
    pip += ["--find-links", WHEELS, "--no-cache-dir", "--disable-pip-version-check"]
    pip += ["--no-warn-script-location"]
    # pip itself goes into the venv even if the image has one, so `pip install` in
    # the sandbox installs into the venv.
    subprocess.check_call([*pip, "--ignore-installed", "pip"])
    subprocess.check_call([*pip, "ipykernel", "dill"])
    subprocess.check_call([VENV + "/bin/python", "-c", "import ipykernel"])


def _append(path: str, line: str) -> None:
    with open(path, "a+") as f:
        f.seek(0)
        text = f.read()
        f.write(("" if not text or text.endswith("\n") else "\n") + line + "\n")


def _free_id(used: set[int], start: int = 1000) -> int:
    while start in used:
        start += 1
    return start


def make_user() -> None:
    import grp

    try:
        entry = pwd.getpwnam(USER)
        uid, gid, home = entry.pw_uid, entry.pw_gid, entry.pw_dir
    except KeyError:
        # uid 1000 like kernel-sandbox:python when it is free; else the next free one.
        uid = _free_id({p.pw_uid for p in pwd.getpwall()})
        try:
            gid = grp.getgrnam(USER).gr_gid
        except KeyError:
            used_gids = {g.gr_gid for g in grp.getgrall()}
            gid = uid if uid not in used_gids else _free_id(used_gids)
            _append("/etc/group", f"{USER}:x:{gid}:")
            if os.path.exists("/etc/gshadow"):
                _append("/etc/gshadow", f"{USER}:!::")
        home = "/home/" + USER
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        _append("/etc/passwd", f"{USER}:x:{uid}:{gid}::{home}:{shell}")
        if os.path.exists("/etc/shadow"):
            _append("/etc/shadow", f"{USER}:!:19000:0:99999:7:::")
    for path in (home, WORKDIR):
        if not os.path.isdir(path):
            os.makedirs(path)
        os.chown(path, uid, gid)
    print(f"kernel-sandbox: user {USER} uid={uid} gid={gid} home={home}")


if __name__ == "__main__":
    {"venv": make_venv, "user": make_user}[sys.argv[1]]()
    if sys.argv[1] == "user":
        os.remove(os.path.abspath(__file__))
