"""A Topic's delivery health from the replicas' reports: the merge of several replicas'
pieces, the Delivering condition, when a status is worth a write, and what a replica
reports of its rounds."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bucketnotify.controller.delivery_status import CONDITION, desired, status_patch
from bucketnotify.delivery.model.outcomes import RoundResult
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.peers.leases import partition_of as lease_partition_of
from bucketnotify.delivery.recorded.health import DeliveryHealth
from bucketnotify.delivery_health import (
    Backlog,
    Report,
    ShardHealth,
    TopicHealth,
    delivery_status,
    judge,
    merge,
    partition_of,
    significant,
)

NOW = 1_800_000_000.0
PARTITIONS = 8
NS, TOPIC = "team-a", "orders"
SHARDS = 4


def owners(*replicas: str) -> dict[str, list[int]]:
    """The partitions of the Topic's shards, dealt to ``replicas`` in turn."""
    dealt: dict[str, list[int]] = {r: [] for r in replicas}
    for shard in range(SHARDS):
        dealt[replicas[shard % len(replicas)]].append(partition_of(NS, TOPIC, shard, PARTITIONS))
    return dealt


def report(replica: str, owned: list[int], updated: float = NOW, **topic: Any) -> Report:
    return Report(
        replica=replica,
        updated=updated,
        interval=30,
        partitions=PARTITIONS,
        owned=owned,
        topics={f"{NS}/{TOPIC}": TopicHealth(**topic)} if topic else {},
    )


def test_the_partition_is_the_one_the_leases_use() -> None:
    for shard in range(32):
        assert partition_of(NS, TOPIC, shard, 32) == lease_partition_of(
            QueueName(NS, TOPIC), shard, 32
        )


def test_two_replicas_pieces_make_the_topic() -> None:
    dealt = owners("a", "b")
    shards_a = [s for s in range(SHARDS) if s % 2 == 0]
    shards_b = [s for s in range(SHARDS) if s % 2 == 1]
    a = report(
        "a",
        dealt["a"],
        last_success=NOW - 50,
        shards={s: ShardHealth(oldest=NOW - 100 - s, waiting=2) for s in shards_a},
        backlog=Backlog(events=12, bytes=3400, at=NOW - 5),
    )
    b = report(
        "b",
        dealt["b"],
        last_success=NOW - 20,
        shards={s: ShardHealth(oldest=NOW - 300, waiting=1) for s in shards_b},
    )
    merged = merge(NS, TOPIC, SHARDS, [a, b], NOW)
    assert merged.unserved == []
    assert (merged.backlog_events, merged.backlog_bytes) == (12, 3400)
    assert merged.oldest == NOW - 300, "the oldest of every shard, whoever owns it"
    assert merged.waiting == 2 * len(shards_a) + len(shards_b)
    assert merged.last_success == NOW - 20
    assert merged.failing_since is None


def test_a_dead_replicas_report_is_ignored_and_its_shards_have_no_replica() -> None:
    dealt = owners("a", "b")
    a = report("a", dealt["a"], backlog=Backlog(events=0, bytes=0, at=NOW))
    stale = report("b", dealt["b"], updated=NOW - 2 * 30 - 16)
    merged = merge(NS, TOPIC, SHARDS, [a, stale], NOW)
    assert merged.unserved == [s for s in range(SHARDS) if s % 2 == 1]
    condition = judge(merged, failing_after_s=60, max_pending_age_s=900, now=NOW)
    assert (condition.status, condition.reason) == ("False", "NoReplica")
    assert "1, 3" in condition.message
    nobody = judge(
        merge(NS, TOPIC, SHARDS, [stale], NOW), failing_after_s=60, max_pending_age_s=900, now=NOW
    )
    assert (nobody.status, nobody.reason) == ("False", "NoReplica")


def test_after_a_hand_over_the_newer_report_speaks_for_the_shard() -> None:
    everything = owners("a")["a"]
    old = report(
        "a", everything, updated=NOW - 40, shards={0: ShardHealth(oldest=NOW - 500, waiting=9)}
    )
    new = report("b", everything, updated=NOW - 1, shards={0: ShardHealth(oldest=None, waiting=0)})
    merged = merge(NS, TOPIC, SHARDS, [old, new], NOW)
    assert (merged.oldest, merged.waiting) == (None, 0)


def test_failing_means_no_success_anywhere_since_the_first_failure() -> None:
    everything = owners("a")["a"]
    failing = report(
        "a",
        everything,
        last_success=NOW - 400,
        last_failure=NOW - 1,
        failure="503 Service Unavailable",
        failing_since=NOW - 300,
    )
    merged = merge(NS, TOPIC, SHARDS, [failing], NOW)
    assert merged.failing_since == NOW - 300
    condition = judge(merged, failing_after_s=60, max_pending_age_s=900, now=NOW)
    assert (condition.status, condition.reason) == ("False", "EndpointFailing")
    assert "503 Service Unavailable" in condition.message
    # Under the threshold: one refused push does not turn it.
    assert judge(merged, failing_after_s=301, max_pending_age_s=900, now=NOW).status == "True"
    # Another replica's push succeeded after that failure began: failing only since then.
    other = report("b", [], last_success=NOW - 30)
    both = merge(NS, TOPIC, SHARDS, [failing, other], NOW)
    assert both.failing_since == NOW - 30
    assert judge(both, failing_after_s=60, max_pending_age_s=900, now=NOW).status == "True"


def test_an_old_backlog_turns_it_false_and_an_empty_one_is_nothing_pending() -> None:
    everything = owners("a")["a"]
    old = report(
        "a",
        everything,
        shards={1: ShardHealth(oldest=NOW - 1000, waiting=1)},
        backlog=Backlog(events=1, bytes=100, at=NOW),
    )
    condition = judge(
        merge(NS, TOPIC, SHARDS, [old], NOW), failing_after_s=60, max_pending_age_s=900, now=NOW
    )
    assert (condition.status, condition.reason) == ("False", "BacklogTooOld")
    empty = report(
        "a",
        everything,
        shards={1: ShardHealth(oldest=NOW - 1000, waiting=1)},
        backlog=Backlog(events=0, bytes=0, at=NOW),
    )
    merged = merge(NS, TOPIC, SHARDS, [empty], NOW)
    assert merged.oldest is None, "the survey saw the queue empty after that round"
    condition = judge(merged, failing_after_s=60, max_pending_age_s=900, now=NOW)
    assert (condition.status, condition.reason) == ("True", "Delivering")
    assert "no event is waiting" in condition.message


def test_significance_rounds_counts_and_times() -> None:
    a = delivery_status(
        merge(
            NS,
            TOPIC,
            1,
            [report("a", owners("a")["a"], backlog=Backlog(events=12345, bytes=10, at=NOW))],
            NOW,
        )
    )
    b = {**a, "backlogEvents": 12399}
    c = {**a, "backlogEvents": 12600}
    assert significant(a) == significant(b)
    assert significant(a) != significant(c)
    t1 = {"lastSuccessTime": "2027-01-15T08:00:05Z"}
    assert significant(t1) == significant({"lastSuccessTime": "2027-01-15T08:00:55Z"})
    assert significant(t1) != significant({"lastSuccessTime": "2027-01-15T08:01:05Z"})
    assert significant({"backlogEvents": 0}) != significant({"backlogEvents": 1})


def snapshot(persistent: bool = True, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": TOPIC, "generation": 3, "resourceVersion": "9"},
        "spec": {
            "endpoint": {"http": {"url": "http://x"}},
            "persistent": persistent,
            **({"delivery": {"shards": SHARDS, "failingAfter": 10}} if persistent else {}),
        },
        "status": status
        or {"conditions": [{"type": "Ready", "status": "True", "reason": "Synced"}]},
    }


def test_a_topic_the_gateway_pushes_is_unknown_never_true() -> None:
    condition, delivery = desired(snapshot(persistent=False), [], NOW)
    assert (condition.status, condition.reason, delivery) == ("Unknown", "GatewayDelivers", None)


def test_a_write_only_when_the_condition_or_a_figure_changed() -> None:
    everything = owners("a")["a"]
    reports = [report("a", everything, backlog=Backlog(events=5, bytes=50, at=NOW))]
    snap = snapshot()
    condition, delivery = desired(snap, reports, NOW)
    assert (condition.status, condition.reason) == ("True", "Delivering")
    now = dt.datetime.fromtimestamp(NOW, dt.UTC)
    patch = status_patch(snap, condition, delivery, now)
    assert patch is not None
    assert patch["delivery"] == {"backlogEvents": 5, "backlogBytes": 50, "retrying": 0}
    (written,) = [c for c in patch["conditions"] if c["type"] == CONDITION]
    assert written["observedGeneration"] == 3
    assert [c["type"] for c in patch["conditions"]] == ["Ready", CONDITION], "Ready kept"
    # As written: nothing to write again.
    snap["status"] = {**snap["status"], **patch}
    assert status_patch(snap, condition, delivery, now) is None
    # A figure gone is removed by a null; the condition unchanged is not rewritten.
    gone = {"backlogEvents": 6, "backlogBytes": 50}
    patch = status_patch(snap, condition, gone, now)
    assert patch == {"delivery": {"backlogEvents": 6, "backlogBytes": 50, "retrying": None}}


def test_a_replica_reports_what_its_rounds_left_and_how_pushes_went() -> None:
    health = DeliveryHealth()
    queue = QueueName(NS, TOPIC)
    failed = RoundResult(listed=3, failed=3, left=3, oldest_left=NOW - 7)
    failed.errors.append("503 from http://user:hunter2@receiver/: Service Unavailable")
    health.round_done(queue, 0, failed)
    health.backlog(queue, 3, 300, NOW)
    shard0 = partition_of(NS, TOPIC, 0, PARTITIONS)
    got = health.report(replica="a", interval=30, partitions=PARTITIONS, owned={shard0}, now=NOW)
    topic = got.topics[f"{NS}/{TOPIC}"]
    assert topic.failing_since is not None and topic.last_success is None
    assert topic.shards == {0: ShardHealth(oldest=NOW - 7, waiting=3)}
    assert topic.backlog == Backlog(events=3, bytes=300, at=NOW)
    assert topic.failure is not None and "hunter2" not in topic.failure
    assert "hunter2" not in got.model_dump_json()
    health.round_done(queue, 0, RoundResult(listed=3, delivered=3))
    topic = health.report(
        replica="a", interval=30, partitions=PARTITIONS, owned={shard0}, now=NOW
    ).topics[f"{NS}/{TOPIC}"]
    assert topic.failing_since is None and topic.last_success is not None
    assert topic.shards[0] == ShardHealth(oldest=None, waiting=0)
    # Handed over: neither the shard nor the backlog is this replica's to report.
    topic = health.report(
        replica="a", interval=30, partitions=PARTITIONS, owned=set(), now=NOW
    ).topics[f"{NS}/{TOPIC}"]
    assert topic.shards == {} and topic.backlog is None
