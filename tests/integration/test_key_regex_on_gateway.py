"""Every construct the operator's key regex check accepts, run by the real gateway.

On Ceph 16.2 a key regex that ``std::regex`` cannot compile aborts radosgw at the next upload
to the bucket (docs/gateway-compatibility.md), so what ``regex_problem`` lets through must
compile there, and match there as the grammar says. One bucket carries a notification per
regex; each key written says, through the configuration ids of its events, which regexes
matched it whole.
"""

from __future__ import annotations

import contextlib
import queue
import re
import uuid
from collections.abc import Iterator

import pytest

from bucketnotify.gateway.key_regex import regex_problem
from bucketnotify.gateway.notifications import FilterRule, NotificationClient, NotificationConfig
from bucketnotify.gateway.topics import TopicClient
from devstack.servers.recording import HttpReceiver
from tests.localservices import LocalService
from tests.s3 import connection

# (gateway regex, the same in Python's syntax where that differs, a key it matches whole)
REGEXES = [
    ("img/[0-9]+\\.jpg", None, "img/42.jpg"),
    ("^photos/.*\\.(jpe?g|png)$", None, "photos/a.png"),
    ("(?:ab)+c", None, "ababc"),
    ("(a|b)\\1x", None, "aax"),
    ("x{2,3}?y", None, "xxy"),
    ("g{1,}", None, "ggg"),
    ("[^a-c]z", None, "dz"),
    ("\\x41\\u0042", None, "AB"),
    ("(?=d)\\w+", None, "dog"),
    ("(?!c)\\w+", None, "dig"),
    ("\\d{3}-\\s?\\S", None, "123-x"),
    ("a\\.b\\/c\\-d", "a\\.b/c-d", "a.b/c-d"),
    ("[\\d-]+", None, "1-2"),
    ("a\\b", None, "a"),
    ("\\Bx", "(?!)x", "never-matched"),
    ("[\\cJ]?k", "[\\n]?k", "k"),
    ("[\\b]?b", "[\\x08]?b", "b"),
    ("f(o)*?", None, "foo"),
    (".a.", None, "xay"),
    ("ключ/ü.*", None, "ключ/ü1"),
]


@pytest.fixture()
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


def test_every_accepted_construct_compiles_and_matches_on_the_gateway(
    rgw: LocalService, receiver: HttpReceiver
) -> None:
    for regex, _, _ in REGEXES:
        assert regex_problem(regex) is None, regex
    s3 = connection(rgw).s3()
    topics = TopicClient(connection(rgw))
    notifications = NotificationClient(connection(rgw))
    bucket = f"rx-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    arn = topics.upsert(f"rx-{uuid.uuid4().hex[:10]}", {"push-endpoint": receiver.url})
    try:
        for number, (regex, _, _) in enumerate(REGEXES):
            notifications.put(
                bucket,
                NotificationConfig(
                    f"rx-{number}",
                    arn,
                    ("s3:ObjectCreated:Put",),
                    key_filters=(FilterRule("regex", regex),),
                ),
            )
        keys = sorted({key for _, _, key in REGEXES} | {"img/x.jpg", "abac", "cat", "12-x", "z"})
        matched: dict[str, set[str]] = {key: set() for key in keys}
        for key in keys:
            # Non-persistent: the gateway pushed before it answered the PUT.
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
        with contextlib.suppress(queue.Empty):
            while True:
                for record in receiver.next_records(timeout=3):
                    matched[record["s3"]["object"]["key"]].add(record["s3"]["configurationId"])
        expected = {
            key: {
                f"rx-{n}"
                for n, (regex, python, _) in enumerate(REGEXES)
                if re.fullmatch(python or regex, key)
            }
            for key in keys
        }
        assert matched == expected
        assert all(matched[key] for _, _, key in REGEXES if key != "never-matched")
    finally:
        for config in notifications.list(bucket):
            notifications.delete(bucket, config.id)
        for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)
        topics.delete(arn)
        notifications.close()
