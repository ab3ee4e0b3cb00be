"""What the admin CLI prints, from what it read: pure functions, no cluster."""

from __future__ import annotations

import datetime as dt

from bucketnotify.admin.output import table
from bucketnotify.admin.views import age, dump_entry, notification_row, stats_document, stats_rows
from bucketnotify.delivery.model.queue import Entry, QueueName, QueueStats, ShardStats
from bucketnotify.delivery.peers.ownership import LeaseHolder, LeaseSettings, partition_of

NOW = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)


def test_age_is_the_largest_whole_unit_as_kubectl_shows_it() -> None:
    def created(seconds: int) -> str:
        return (NOW - dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")

    assert [age(created(s), NOW) for s in (5, 59, 60, 3599, 3600, 86399, 86400 * 3)] == [
        "5s",
        "59s",
        "1m",
        "59m",
        "1h",
        "23h",
        "3d",
    ]
    assert age(None, NOW) == "-"


def test_a_table_aligns_columns_and_shows_a_header_alone() -> None:
    assert table(["A", "LONGER"], [["xyz", "1"], ["", "22"]]) == (
        "A     LONGER\nxyz   1\n      22\n"
    )
    assert table(["NAME", "AGE"], []) == "NAME   AGE\n"


def test_notification_rows_spell_out_the_default_events_and_every_filter() -> None:
    obj = {
        "metadata": {"namespace": "ns", "name": "n", "creationTimestamp": "2024-05-01T11:00:00Z"},
        "spec": {
            "bucket": "photos",
            "topicRef": {"name": "web"},
            "filter": {"key": {"regex": "^a.*"}, "tags": [{"name": "k", "value": "v"}]},
        },
    }
    assert notification_row(obj, NOW, True) == [
        "ns",
        "n",
        "photos",
        "web",
        "ObjectCreated:*,ObjectRemoved:*",
        "regex=^a.*,tag:k=v",
        "-",
        "1h",
    ]


def test_the_owner_column_tells_live_expired_released_and_never_taken_apart() -> None:
    queue = QueueName("ns", "orders")
    leases = LeaseSettings(namespace="ns", partitions=1024)
    shards = range(4)
    partitions = [partition_of(queue, s, leases.partitions) for s in shards]
    assert len(set(partitions)) == 4
    holders = {
        partitions[0]: LeaseHolder("r1", expired=False),
        partitions[1]: LeaseHolder("r2", expired=True),
        partitions[2]: LeaseHolder("", expired=True),
    }
    stats = QueueStats({s: ShardStats(s, 10 * s, 0) for s in shards})
    document = stats_document(queue, stats, holders, leases)
    assert [s["owner"] for s in document["shards"]] == ["r1", None, None, None]
    assert document["shards"][3]["lease"] is None
    assert [row[5] for row in stats_rows(document)] == [
        "r1",
        "none (expired: r2)",
        "-",
        "-",
        "",
    ]
    assert stats_rows(document)[-1] == ["total", "6", "60", "0", "", ""]


def test_a_dumped_body_that_is_not_json_is_shown_as_text() -> None:
    entry = Entry(id="b.000000", event_id="e", body=b"not json \xff", ingest_time=0.5)
    assert dump_entry(1, entry) == {
        "shard": 1,
        "id": "b.000000",
        "eventId": "e",
        "attempts": 0,
        "ingestTime": "1970-01-01T00:00:00.500000Z",
        "notBefore": None,
        "body": "not json \ufffd",
    }


def test_a_dumped_entry_that_failed_shows_its_first_and_last_failure() -> None:
    entry = Entry(
        id="b.000000",
        event_id="e",
        body=b"{}",
        ingest_time=0.5,
        attempts=2,
        not_before=9.0,
        first_failure=1.0,
        last_failure=8.0,
        last_error="503 Service Unavailable",
    )
    dumped = dump_entry(0, entry)
    assert (dumped["firstFailure"], dumped["lastFailure"], dumped["lastError"]) == (
        "1970-01-01T00:00:01.000000Z",
        "1970-01-01T00:00:08.000000Z",
        "503 Service Unavailable",
    )
    assert dumped["notBefore"] == "1970-01-01T00:00:09.000000Z" and dumped["attempts"] == 2
