"""Sessions as Jupyter notebooks: record them, replay them, export them.

- :class:`NotebookRecorder` listens to a sandbox (and is fed by the agent loop) and
  keeps a valid ``.ipynb`` on disk after every step.
- :func:`replay_notebook` / :func:`replay` re-execute a notebook in a fresh sandbox
  and compare every cell's outputs with the recorded ones.
- :func:`export_notebook` turns a notebook into HTML (plots embedded) or a script.
"""

from .cells import META_KEY
from .compare import Comparison, compare_outputs, normalise_outputs, normalise_text
from .export import export_notebook
from .recorder import DEFAULT_SESSION_DIR, NotebookRecorder, new_session_path
from .replay import CellReplay, ReplayReport, replay, replay_notebook, replayed_path
from .storage import read_notebook, validate_notebook, write_notebook_atomic

__all__ = [
    "DEFAULT_SESSION_DIR",
    "META_KEY",
    "CellReplay",
    "Comparison",
    "NotebookRecorder",
    "ReplayReport",
    "compare_outputs",
    "export_notebook",
    "new_session_path",
    "normalise_outputs",
    "normalise_text",
    "read_notebook",
    "replay",
    "replay_notebook",
    "replayed_path",
    "validate_notebook",
    "write_notebook_atomic",
]
