"""S3 event records for tests: shaped like the gateway's (the reference's example) for
endpoint tests, and minimal ones with only the fields the ingest and the worker read."""

from __future__ import annotations

import uuid
from typing import Any


def s3_record(
    *,
    bucket: str = "mybucket1",
    key: str = "myimage1.jpg",
    event_name: str = "ObjectCreated:Put",
    region: str = "zonegroup1",
    request_id: str | None = None,
    id2: str = "14d2-zone1-zonegroup1",
    event_time: str = "2019-11-22T13:47:35.124724Z",
) -> dict[str, Any]:
    return {
        "eventVersion": "2.1",
        "eventSource": "ceph:s3",
        "awsRegion": region,
        "eventTime": event_time,
        "eventName": event_name,
        "userIdentity": {"principalId": "tester"},
        "requestParameters": {"sourceIPAddress": ""},
        "responseElements": {
            "x-amz-request-id": request_id or f"{uuid.uuid4()}.5330.903595",
            "x-amz-id-2": id2,
        },
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "mynotif1",
            "bucket": {
                "name": bucket,
                "ownerIdentity": {"principalId": "tester"},
                "arn": f"arn:aws:s3:{region}::{bucket}",
                "id": "503a4c37-85eb-47cd-8681-2817e80b4281.5332.38",
            },
            "object": {
                "key": key,
                "size": "1024",
                "eTag": "37b51d194a7513e45b56f6524f2d51f2",
                "versionId": "",
                "sequencer": "F7E6D75DC742D108",
                "metadata": [],
                "tags": [],
            },
        },
        "eventId": "",
        "opaqueData": "",
    }


def event(
    key: Any = "k",
    *,
    bucket: Any = "b",
    sequencer: str | None = None,
    request_id: str | None = None,
    configuration_id: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """An S3 event record with only what the ingest and the worker read: the event name,
    bucket and key, and the request id, configuration id and sequencer when given (they make
    up the event's identity with the rest, see ``ingest.event_id``). ``fields``: further
    top-level fields, or replacements (``eventName``). ``key`` and ``bucket`` may be of any
    type, for bodies the ingest must refuse."""
    record: dict[str, Any] = {"eventName": "ObjectCreated:Put"}
    if request_id is not None:
        record["responseElements"] = {"x-amz-request-id": request_id}
    s3: dict[str, Any] = {}
    if configuration_id is not None:
        s3["configurationId"] = configuration_id
    s3["bucket"] = {"name": bucket}
    s3["object"] = {"key": key} if sequencer is None else {"key": key, "sequencer": sequencer}
    record["s3"] = s3
    return {**record, **fields}
