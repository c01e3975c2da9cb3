"""The ``argv`` of a sandboxed kernelspec: refuse to run a kernel on this machine.

A jupyter_client that knows kernel provisioners (7 and later) never runs ``argv`` for
these specs; an older one would start it here, outside any sandbox.  So it exits with
an explanation instead.
"""

from __future__ import annotations

import sys

MESSAGE = (
    "this kernelspec starts its kernel in a kernel_sandbox sandbox through the "
    "'kernel-sandbox' kernel provisioner, which needs jupyter_client >= 7 with "
    "kernel_sandbox installed in the same environment; refusing to run the kernel "
    "unsandboxed on this machine"
)

if __name__ == "__main__":
    print(MESSAGE, file=sys.stderr)
    sys.exit(1)
