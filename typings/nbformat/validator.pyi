# See __init__.pyi: nbformat re-exports jsonschema's ValidationError.
from typing import Any

from jsonschema.exceptions import ValidationError as ValidationError

def validate(
    nbdict: Any = None,
    ref: str | None = None,
    version: int | None = None,
    version_minor: int | None = None,
    relax_add_props: bool = False,
    nbjson: Any = None,
) -> None: ...
