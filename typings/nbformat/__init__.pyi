# Types for the parts of nbformat that kernel_sandbox calls.  nbformat ships py.typed
# but leaves these functions unannotated, so `mypy --strict` would reject every call;
# the signatures below follow nbformat 5.x (nbformat/__init__.py, notebooknode.py).
import os
from typing import IO, Any

from . import v4 as v4
from . import validator as validator
from .notebooknode import NotebookNode as NotebookNode
from .notebooknode import from_dict as from_dict
from .validator import ValidationError as ValidationError
from .validator import validate as validate

__all__ = [
    "NotebookNode",
    "ValidationError",
    "from_dict",
    "read",
    "reads",
    "v4",
    "validate",
    "write",
    "writes",
]

def read(
    fp: str | os.PathLike[str] | IO[str],
    as_version: int,
    capture_validation_error: dict[str, Any] | None = None,
    **kwargs: Any,
) -> NotebookNode: ...
def reads(
    s: str,
    as_version: int,
    capture_validation_error: dict[str, Any] | None = None,
    **kwargs: Any,
) -> NotebookNode: ...
def write(
    nb: NotebookNode,
    fp: str | os.PathLike[str] | IO[str],
    version: int = ...,
    capture_validation_error: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None: ...
def writes(
    nb: NotebookNode,
    version: int = ...,
    capture_validation_error: dict[str, Any] | None = None,
    **kwargs: Any,
) -> str: ...
