"""A small JSON Schema checker for the tests: the subset ``audit.schema.json`` uses (type,
enum, minimum, properties, required, additionalProperties, items, anyOf, local $ref).
jsonschema is not a dependency; this keeps the schema test runnable everywhere and failing
loudly on the first violation, with its JSON path."""

from __future__ import annotations

from typing import Any

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def validate(doc: Any, schema: dict[str, Any], root: dict[str, Any] | None = None,
             path: str = "$") -> None:
    """Raise ``AssertionError`` naming the path of the first place ``doc`` breaks ``schema``."""
    root = root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), ref
        validate(doc, root["$defs"][ref.split("/")[-1]], root, path)
        return
    if "anyOf" in schema:
        errors = []
        for sub in schema["anyOf"]:
            try:
                validate(doc, sub, root, path)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{path}: matches no alternative: {errors}")
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        assert any(_is(doc, n) for n in names), f"{path}: {doc!r:.60} is not {names}"
    if "enum" in schema:
        assert doc in schema["enum"], f"{path}: {doc!r} not in {schema['enum']}"
    if "minimum" in schema and _is(doc, "number"):
        assert doc >= schema["minimum"], f"{path}: {doc} < {schema['minimum']}"
    if isinstance(doc, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            assert key in doc, f"{path}: required key {key!r} missing"
        extra = schema.get("additionalProperties", True)
        for key, value in doc.items():
            if key in props:
                validate(value, props[key], root, f"{path}.{key}")
            elif extra is False:
                raise AssertionError(f"{path}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                validate(value, extra, root, f"{path}.{key}")
    if isinstance(doc, list) and "items" in schema:
        for i, value in enumerate(doc):
            validate(value, schema["items"], root, f"{path}[{i}]")
