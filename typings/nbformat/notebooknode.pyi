# See __init__.pyi: nbformat's NotebookNode, a dict with attribute access.
from collections.abc import Mapping
from typing import Any

class NotebookNode(dict[str, Any]):
    def __getattr__(self, key: str) -> Any: ...
    def __setattr__(self, key: str, value: Any) -> None: ...

# nbformat's from_dict also passes lists and scalars through; kernel_sandbox only ever
# converts mappings, so that is all this declares.
def from_dict(d: Mapping[str, Any]) -> NotebookNode: ...
