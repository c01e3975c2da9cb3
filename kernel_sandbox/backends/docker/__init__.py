"""The Docker kernel host: every call to the Docker engine lives in this package.

- ``host.py``      :class:`DockerHost`, the :class:`~kernel_sandbox.backends.base.KernelHost`
- ``engine.py``    the SDK client, containers, volumes, listings, error translation
- ``exec.py``, ``attach.py``   processes beside the kernel, their output read bounded
- ``transfer.py``  file reads and writes through the archive API
- ``statedir.py``   the supervisor's state directory (in a host run directory, see
  :mod:`kernel_sandbox.rundirs`)
- ``writable.py``  the bounded writable area (in-memory volumes)
- ``gc.py``        orphans for ``kernel-sandbox gc``
- ``images/``      building, listing and deriving kernel-ready images
"""

from .engine import DockerEngine, docker_client
from .host import DockerHost

__all__ = ["DockerEngine", "DockerHost", "docker_client"]
