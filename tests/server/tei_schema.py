"""Validate a body against a schema of TEI's published openapi.json (vendored in
tei_reference/, see NOTICE.md there). OpenAPI 3.0's `nullable: true` becomes JSON Schema's
"or null" before jsonschema checks it."""
from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import jsonschema

SPEC_PATH = Path(__file__).parent / "tei_reference" / "openapi.json"


def _nullable_to_json_schema(node):
    if isinstance(node, dict):
        node = {k: _nullable_to_json_schema(v) for k, v in node.items()}
        if node.pop("nullable", False):
            return {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_nullable_to_json_schema(v) for v in node]
    return node


@functools.lru_cache(maxsize=1)
def spec() -> dict:
    return json.loads(SPEC_PATH.read_text())


@functools.lru_cache(maxsize=1)
def _components() -> dict:
    return _nullable_to_json_schema(copy.deepcopy(spec()["components"]))


def validate(schema_name: str, body) -> None:
    """Raise jsonschema.ValidationError unless `body` matches components.schemas[schema_name]."""
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": _components()}
    jsonschema.validate(body, root, cls=jsonschema.Draft202012Validator)


def response_schema(path: str, status: int) -> str:
    """The schema name TEI's spec gives for `path`'s `status` response."""
    content = spec()["paths"][path]["post" if path != "/info" else "get"]["responses"][
        str(status)]["content"]
    return content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
