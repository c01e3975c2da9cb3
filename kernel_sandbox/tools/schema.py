"""JSON schemas for OpenAI function calling, derived from pydantic parameter models.

The same pydantic model that validates a model's arguments produces the schema the
model sees, so the two cannot drift apart.  Strict mode (structured outputs) demands
``additionalProperties: false``, *every* property in ``required`` and optional values
expressed as nullable types; it also rejects many keywords pydantic emits (``title``,
``default``, bounds).  :func:`parameters_schema` produces that shape; bounds stay in the
pydantic model, which still enforces them.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel

__all__ = [
    "SchemaFormat",
    "chat_tool",
    "parameters_schema",
    "responses_tool",
]

SchemaFormat = Literal["chat", "responses"]

#: Keywords kept in strict schemas; everything else pydantic emits is dropped.
_STRICT_KEYWORDS = frozenset(
    {"type", "description", "enum", "properties", "required", "additionalProperties", "items"}
)

#: Branches with these keywords cannot be folded into a ``type: [X, "null"]`` list.
_COMPOUND = frozenset({"properties", "items", "$ref", "anyOf", "allOf", "oneOf"})


def _merge_nullable(branches: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``anyOf: [{type: X, ...}, {type: null}]`` as ``{type: [X, "null"], ...}``."""
    types: list[str] = []
    merged: dict[str, Any] = {}
    for branch in branches:
        kind = branch.get("type")
        if not isinstance(kind, str) or set(branch) & _COMPOUND:
            return None
        types.append(kind)
        if "enum" in branch:
            merged.setdefault("enum", []).extend(branch["enum"])
    if "null" in types and "enum" in merged:
        merged["enum"].append(None)
    merged["type"] = types
    return merged


def _strict(node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node or "allOf" in node:
        raise TypeError("parameter models must not use nested models ($ref); flatten them")
    if "anyOf" in node:
        merged = _merge_nullable(node["anyOf"])
        if merged is None:
            raise TypeError(f"cannot express {node['anyOf']!r} in a strict schema")
        node = {**{k: v for k, v in node.items() if k != "anyOf"}, **merged}
    out = {k: v for k, v in node.items() if k in _STRICT_KEYWORDS}
    if "properties" in out:
        out["properties"] = {name: _strict(prop) for name, prop in out["properties"].items()}
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = _strict(out["items"])
    return out


def _loose(node: dict[str, Any]) -> dict[str, Any]:
    node = {k: v for k, v in node.items() if k != "title"}
    if "properties" in node:
        node["properties"] = {name: _loose(prop) for name, prop in node["properties"].items()}
        node["additionalProperties"] = False
    return node


def parameters_schema(
    model: type[BaseModel],
    *,
    strict: bool = True,
    descriptions: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON schema of a parameter model, shaped for function calling.

    ``strict`` gives the structured-outputs shape (all properties required, optional
    ones nullable); otherwise optional properties keep their defaults and stay out of
    ``required``.  ``descriptions`` replaces property descriptions (e.g. with the
    configured default timeout).
    """
    schema = copy.deepcopy(model.model_json_schema())
    if "$defs" in schema:
        raise TypeError(f"{model.__name__} must not use nested models; flatten its fields")
    for name, text in (descriptions or {}).items():
        if name in schema.get("properties", {}):
            schema["properties"][name]["description"] = text
    result = _strict(schema) if strict else _loose(schema)
    result.pop("description", None)  # the model's docstring belongs to the tool, not here
    result.setdefault("properties", {})
    result.setdefault("required", [])
    result["type"] = "object"
    return result


def chat_tool(
    name: str, description: str, parameters: dict[str, Any], *, strict: bool = True
) -> dict[str, Any]:
    """A Chat Completions tool: ``{"type": "function", "function": {...}}``."""
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def responses_tool(
    name: str, description: str, parameters: dict[str, Any], *, strict: bool = True
) -> dict[str, Any]:
    """A Responses API function tool: ``{"type": "function", "name": ..., ...}``."""
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": parameters,
        "strict": strict,
    }
