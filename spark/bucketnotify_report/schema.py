"""The Spark schema of delivery records, built from ``bucketnotify.records.FIELDS``."""

from __future__ import annotations

from typing import Final

from pyspark.sql import types as T

from bucketnotify.records import FIELDS, SCHEMA_VERSION, Outcome

__all__ = ["OUTCOMES", "RECORD_SCHEMA", "REQUIRED", "SCHEMA_VERSION"]

_TYPES: Final[dict[str, T.DataType]] = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
}

RECORD_SCHEMA: Final = T.StructType(
    [T.StructField(f.name, _TYPES[f.type], f.nullable) for f in FIELDS]
)
"""What one JSON line must be. ``from_json`` ignores nullability, so ``REQUIRED`` is checked."""

REQUIRED: Final = tuple(f.name for f in FIELDS if not f.nullable)
OUTCOMES: Final = tuple(o.value for o in Outcome)
