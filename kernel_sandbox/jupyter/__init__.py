"""Sandboxed kernels for any Jupyter client: a kernel provisioner and kernelspecs.

``kernel-sandbox kernelspec install`` writes a kernelspec whose
``metadata.kernel_provisioner`` names
:class:`~kernel_sandbox.jupyter.provisioner.SandboxProvisioner` (entry point
``kernel-sandbox`` in ``jupyter_client.kernel_provisioners``); jupyter_client
(JupyterLab, Notebook, nbclient, nbconvert, papermill...) then starts that kernel in a
sandbox instead of as a local process.  The provisioner module is imported by
jupyter_client when a kernel starts, not here.
"""

from __future__ import annotations

from .kernelspec import PROVISIONER_NAME, install_kernelspec, kernelspec_json, remove_kernelspec

__all__ = ["PROVISIONER_NAME", "install_kernelspec", "kernelspec_json", "remove_kernelspec"]
