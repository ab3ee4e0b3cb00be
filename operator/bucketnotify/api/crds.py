"""The CRDs this project ships; ``python -m bucketnotify.api.crds DIR`` writes them as YAML."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from bucketnotify.api.crd import CrdInfo, crd, ready_columns
from bucketnotify.api.topic import TopicSpec, TopicStatus

__all__ = ["ALL", "TOPIC", "main", "render"]

TOPIC = CrdInfo(
    kind="Topic",
    plural="topics",
    short_names=["bntopic"],
    spec_model=TopicSpec,
    status_model=TopicStatus,
    description="A gateway topic: where the notifications of a bucket are pushed.",
    printer_columns=[
        {"name": "ARN", "type": "string", "jsonPath": ".status.arn"},
        {"name": "Persistent", "type": "boolean", "jsonPath": ".spec.persistent"},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpointKind"},
        *ready_columns(),
    ],
)

ALL = [TOPIC]


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-schemas out in full: anchors and aliases confuse readers and diffs."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(info: CrdInfo) -> str:
    manifest: dict[str, Any] = crd(info)
    header = "# Generated from operator/bucketnotify/api by `make crds`; do not edit.\n"
    return header + yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bucketnotify.api.crds OUTPUT_DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    for info in ALL:
        (out / f"{info.plural}.bucketnotify.io.yaml").write_text(render(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
