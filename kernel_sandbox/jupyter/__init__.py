"""Sandboxed kernels for any Jupyter client: a kernel provisioner and kernelspecs.

``kernel-sandbox kernelspec install`` writes a kernelspec whose
``metadata.kernel_provisioner`` names :class:`SandboxProvisioner`; jupyter_client
(JupyterLab, Notebook, nbclient, nbconvert, papermill...) then starts that kernel in a
sandbox instead of as a local process.
"""

from __future__ import annotations

from .kernelspec import PROVISIONER_NAME, install_kernelspec, kernelspec_json
from .provisioner import SandboxProvisioner

__all__ = ["PROVISIONER_NAME", "SandboxProvisioner", "install_kernelspec", "kernelspec_json"]
