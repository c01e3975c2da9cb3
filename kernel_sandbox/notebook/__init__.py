"""Sessions as Jupyter notebooks: record them, replay them, export them.

- :class:`NotebookRecorder` listens to a sandbox (and is fed by the agent loop) and
  keeps a valid ``.ipynb`` on disk after every step.
- :func:`areplay` / :func:`replay` (its blocking twin) re-execute a notebook in
  a fresh sandbox and compare every cell's outputs with the recorded ones, within a
  :class:`Tolerance` and as the cells' tags (:mod:`.tags`) say.
- :func:`export_notebook` turns a notebook into HTML (plots embedded, verdicts shown,
  nothing loaded from the network) or a script.
"""

from .cells import META_KEY
from .compare import Comparison, Tolerance, compare_outputs, normalise_outputs, normalise_text
from .export import export_notebook
from .recorder import DEFAULT_SESSION_DIR, NotebookRecorder, new_session_path
from .replay import CellReplay, ReplayReport, areplay, replay, replayed_path
from .storage import read_notebook, validate_notebook, write_notebook_atomic

__all__ = [
    "DEFAULT_SESSION_DIR",
    "META_KEY",
    "CellReplay",
    "Comparison",
    "NotebookRecorder",
    "ReplayReport",
    "Tolerance",
    "areplay",
    "compare_outputs",
    "export_notebook",
    "new_session_path",
    "normalise_outputs",
    "normalise_text",
    "read_notebook",
    "replay",
    "replayed_path",
    "validate_notebook",
    "write_notebook_atomic",
]
