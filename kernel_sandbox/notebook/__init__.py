"""Sessions as Jupyter notebooks: record them, replay them, export them.

- :class:`NotebookRecorder` listens to a sandbox (and is fed by the agent loop) and
  keeps a valid ``.ipynb`` on disk after every step.
- :func:`areplay` / :func:`replay` (its blocking twin) re-execute a notebook in
  a fresh sandbox and compare every cell's outputs with the recorded ones, within a
  :class:`Tolerance` and as the cells' tags (:mod:`.tags`) say.
- :func:`arewind` / :func:`rewind` fork a session from any recorded cell (its cells up
  to it replayed in a new sandbox); :func:`arebuild` / :func:`rebuild` make again, by
  replaying the cells that bound them, the variables a snapshot could not save.
- :func:`export_notebook` turns a notebook into HTML (plots embedded, verdicts shown,
  nothing loaded from the network) or a script.
"""

from .cells import META_KEY
from .compare import Comparison, Tolerance, compare_outputs, normalise_outputs, normalise_text
from .export import export_notebook
from .recorder import DEFAULT_SESSION_DIR, NotebookRecorder, new_session_path
from .replay import CellReplay, ReplayReport, areplay, replay, replayed_path
from .rewind import Rebuilt, Rewound, arebuild, arewind, rebuild, rewind
from .storage import read_notebook, validate_notebook, write_notebook_atomic

__all__ = [
    "DEFAULT_SESSION_DIR",
    "META_KEY",
    "CellReplay",
    "Comparison",
    "NotebookRecorder",
    "Rebuilt",
    "ReplayReport",
    "Rewound",
    "Tolerance",
    "arebuild",
    "areplay",
    "arewind",
    "compare_outputs",
    "export_notebook",
    "new_session_path",
    "normalise_outputs",
    "normalise_text",
    "read_notebook",
    "rebuild",
    "replay",
    "replayed_path",
    "rewind",
    "validate_notebook",
    "write_notebook_atomic",
]
