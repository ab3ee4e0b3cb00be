"""CustomResourceDefinitions generated from the pydantic models.

The API server accepts only structural OpenAPI v3 schemas: no ``$ref``, no ``anyOf`` for
optional fields, no ``title``, no ``null`` defaults. ``structural`` rewrites a pydantic JSON
schema into that form; ``crd`` wraps it with names, printer columns and the status
subresource. ``make crds`` writes the result to ``crds/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from bucketnotify.api.common import GROUP, VERSION

__all__ = ["CrdInfo", "crd", "structural"]

JsonSchema = dict[str, Any]


def structural(model: type[BaseModel]) -> JsonSchema:
    """The structural OpenAPI v3 schema of ``model`` (validation mode, camelCase names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, JsonSchema] = raw.pop("$defs", {})
    return _rewrite(raw, defs)


def _rewrite(node: JsonSchema, defs: dict[str, JsonSchema]) -> JsonSchema:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return _rewrite(merged, defs)
    any_of = node.get("anyOf")
    if any_of is not None:
        # Optional[X] is anyOf [X, null]: the API server expresses "may be absent" by
        # leaving the field out of `required`, so only X remains.
        concrete = [s for s in any_of if s.get("type") != "null"]
        if len(concrete) != 1:
            raise ValueError(f"unions are not structural: {node}")
        outer = {k: v for k, v in node.items() if k != "anyOf"}
        return _rewrite({**concrete[0], **outer}, defs)

    out: JsonSchema = {}
    for key, value in node.items():
        if key in {"title", "additionalProperties"}:
            continue
        if key == "default" and value is None:
            continue
        if key == "properties":
            out[key] = {name: _rewrite(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _rewrite(value, defs)
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" not in out:
        # A free-form JSON document (e.g. a topic policy): kept as the user wrote it.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("format") == "date-time":
        out = {"type": "string", "format": "date-time", **_keep_description(out)}
    return out


def _keep_description(node: JsonSchema) -> JsonSchema:
    return {"description": node["description"]} if "description" in node else {}


@dataclass(frozen=True)
class CrdInfo:
    """Names and presentation of one custom resource kind."""

    kind: str
    plural: str
    short_names: list[str]
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    description: str
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    categories: list[str] = field(default_factory=lambda: ["bucketnotify"])
    object_rules: list[dict[str, str]] = field(default_factory=list)
    """CEL rules on the whole object: the only place where ``self.metadata.name`` (of the
    metadata, only name and generateName are visible to CEL) meets the spec."""


def crd(info: CrdInfo) -> dict[str, Any]:
    """The CustomResourceDefinition manifest for ``info``."""
    spec_schema = structural(info.spec_model)
    status_schema = structural(info.status_model)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{info.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.kind.lower(),
                "shortNames": info.short_names,
                "categories": info.categories,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": info.printer_columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": info.description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                            **(
                                {"x-kubernetes-validations": info.object_rules}
                                if info.object_rules
                                else {}
                            ),
                        }
                    },
                }
            ],
        },
    }


def ready_columns(*before_age: dict[str, Any]) -> list[dict[str, Any]]:
    """Ready and Reason from the Ready condition, the message at priority 1, then
    ``before_age`` and the Age, last as kubectl's own tables have it."""
    ready = '.status.conditions[?(@.type=="Ready")]'
    return [
        {"name": "Ready", "type": "string", "jsonPath": f"{ready}.status"},
        {"name": "Reason", "type": "string", "jsonPath": f"{ready}.reason"},
        {"name": "Message", "type": "string", "jsonPath": f"{ready}.message", "priority": 1},
        *before_age,
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
