"""The admin CLI as a user runs it: a subprocess against the real API server and gateway.

Queues are filled through the store API (a local directory and a bucket on the gateway),
partition Leases are taken by real ``Ownership`` replicas, and what ``topic stats`` and
``topic dump`` print must be exactly that.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from bucketnotify.delivery.model.queue import Entry, QueueLimits, QueueName, QueueStore
from bucketnotify.delivery.peers.ownership import LeaseSettings, Ownership, partition_of
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.stores.s3 import S3Store
from bucketnotify.kube.apiserver import ApiClient, lease_path, micro_time
from devstack.gateway import gateway_settings
from tests.kubeapi import api_client
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.processes import Result, run_cli
from tests.records import event
from tests.resources import apply
from tests.s3 import connection

pytestmark = pytest.mark.integration

PARTITIONS = 2
HTTP = {"http": {"url": "http://127.0.0.1:9/hook"}}


Cli = Callable[..., Awaitable[Result]]


@pytest.fixture()
def cli(kube: LocalService, crds: None) -> Cli:
    """``bucketnotify`` with the admin kubeconfig and whatever else a test passes."""

    async def run(*args: str, **env: str) -> Result:
        return await run_cli({"KUBECONFIG": kube["KUBECONFIG_ADMIN"], **env}, *args)

    return run


@pytest.fixture()
async def api(kube: LocalService) -> AsyncIterator[ApiClient]:
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        yield api


@dataclass(frozen=True)
class Queues:
    store: QueueStore
    env: dict[str, str]
    """What tells the CLI where the store and the Leases are."""


@pytest.fixture(params=["dir", "s3"])
async def queues(
    request: pytest.FixtureRequest, tmp_path: Path, rgw: LocalService, namespace: str
) -> AsyncIterator[Queues]:
    """An empty store of each kind, and the CLI settings that point at it."""
    leases = {
        "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
        "BUCKETNOTIFY_DELIVERY_PARTITIONS": str(PARTITIONS),
    }
    if request.param == "dir":
        root = tmp_path / "queues"
        yield Queues(
            LocalDirStore(root), {"BUCKETNOTIFY_DELIVERY_STORE": f"dir://{root}", **leases}
        )
        return
    bucket = f"admin-{uuid.uuid4().hex[:10]}"
    s3 = connection(rgw).s3()
    s3.create_bucket(Bucket=bucket)
    env = {"BUCKETNOTIFY_DELIVERY_STORE": f"s3://{bucket}", **gateway_settings(rgw), **leases}
    store = S3Store(connection(rgw), bucket)
    yield Queues(store, env)
    await store.aclose()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])
    s3.delete_bucket(Bucket=bucket)


async def commit(store: QueueStore, queue: QueueName, shard: int, *records: Any) -> list[Entry]:
    bodies = [json.dumps(r).encode() for r in records]
    now = time.time()
    reservation = await store.reserve(queue, shard, len(bodies), sum(map(len, bodies)), now)
    return await store.commit(
        reservation, [(f"ev-{shard}-{i}-{now}", b) for i, b in enumerate(bodies)], now
    )


def persistent_topic(kubectl: Kubectl, namespace: str, name: str, shards: int) -> QueueName:
    spec = {"endpoint": HTTP, "persistent": True, "delivery": {"shards": shards}}
    apply(kubectl, namespace, "Topic", name, spec)
    return QueueName(namespace, name)


def spread_name(namespace: str, shards: int) -> str:
    """A topic name whose shards fall into every partition, so each owner case shows."""
    for n in range(100):
        name = f"orders-{n}"
        hit = {partition_of(QueueName(namespace, name), s, PARTITIONS) for s in range(shards)}
        if len(hit) == PARTITIONS:
            return name
    raise AssertionError("no name spreads over the partitions")


def table(text: str) -> list[list[str]]:
    """Rows of a printed table, header first (cells are three or more spaces apart)."""
    return [re.split(r"\s{3,}", line.strip()) for line in text.splitlines() if line.strip()]


def edited_kubeconfig(source: str, target: Path, edit: Callable[[dict[str, Any]], None]) -> str:
    kubeconfig = yaml.safe_load(Path(source).read_text())
    edit(kubeconfig)
    target.write_text(yaml.safe_dump(kubeconfig))
    return str(target)


def parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- stats and dump -------------------------------------------------------------------------


async def test_stats_show_each_shards_entries_bytes_reservations_and_owner(
    cli: Cli, kubectl: Kubectl, namespace: str, queues: Queues, api: ApiClient
) -> None:
    """Done when the CLI's stats match the queue: every shard's numbers, and as owner the
    live holder of its partition Lease, an expired holder as none, a released one as -."""
    name = spread_name(namespace, 4)
    queue = persistent_topic(kubectl, namespace, name, shards=4)
    store = queues.store
    await store.create(queue, 4, QueueLimits())
    zero = await commit(store, queue, 0, event("a"), event("b"))
    one = await commit(store, queue, 1, event("c"))
    now = time.time()
    await store.reserve(queue, 3, 5, 500, now)  # open: counts
    await store.reserve(queue, 2, 1, 10, now - 3600)  # expired long ago: does not

    leases = LeaseSettings(namespace=namespace, partitions=PARTITIONS)
    a, b = Ownership(api, "replica-a", leases), Ownership(api, "replica-b", leases)

    async def renew() -> None:
        for _ in range(3):
            await a.tick()
            await b.tick()

    await renew()
    (a_partition,) = a.owned()
    (b_partition,) = b.owned()

    def expected(owner_of: Callable[[int], tuple[str | None, dict[str, Any] | None]]) -> Any:
        numbers = {
            0: (2, sum(len(e.body) for e in zero), 0),
            1: (1, len(one[0].body), 0),
            2: (0, 0, 0),
            3: (0, 0, 1),
        }
        shards = []
        for shard, (entries, size, reservations) in numbers.items():
            partition = partition_of(queue, shard, PARTITIONS)
            owner, lease = owner_of(partition)
            if lease is not None:
                lease = {
                    "name": f"bucketnotify-delivery-partition-{partition}",
                    "namespace": namespace,
                    **lease,
                }
            shards.append(
                {
                    "shard": shard,
                    "entries": entries,
                    "bytes": size,
                    "reservations": reservations,
                    "partition": partition,
                    "owner": owner,
                    "lease": lease,
                }
            )
        return {
            "topic": f"{namespace}/{name}",
            "entries": 3,
            "bytes": sum(s["bytes"] for s in shards),
            "reservations": 1,
            "shards": shards,
        }

    def live(partition: int) -> tuple[str | None, dict[str, Any] | None]:
        holder = "replica-a" if partition == a_partition else "replica-b"
        return holder, {"holder": holder, "expired": False}

    await renew()  # the CLI reads them well within their duration
    got = await cli("topic", "stats", name, "-n", namespace, "-o", "json", **queues.env)
    assert got.code == 0, got.err
    assert got.json() == expected(live)

    await renew()
    shown = await cli("topic", "stats", name, "-n", namespace, **queues.env)
    assert shown.code == 0, shown.err
    rows = table(shown.out)
    assert rows[0] == ["SHARD", "ENTRIES", "BYTES", "RESERVATIONS", "PARTITION", "OWNER"]
    want = expected(live)
    assert rows[1:-1] == [
        [
            str(s["shard"]),
            str(s["entries"]),
            str(s["bytes"]),
            str(s["reservations"]),
            str(s["partition"]),
            s["owner"],
        ]
        for s in want["shards"]
    ]
    assert rows[-1] == ["total", "3", str(want["bytes"]), "1"]

    # replica-b stopped renewing an hour ago (a crash); replica-a hands its Lease back (a
    # clean stop).
    await b.stop(release=False)
    await a.stop(release=True)
    path = lease_path(namespace, f"bucketnotify-delivery-partition-{b_partition}")
    lease = await api.get(path)
    lease["spec"]["renewTime"] = micro_time(dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    await api.replace(path, lease)

    def after(partition: int) -> tuple[str | None, dict[str, Any] | None]:
        if partition == b_partition:
            return None, {"holder": "replica-b", "expired": True}
        return None, {"holder": "", "expired": True}

    got = await cli("topic", "stats", name, "-n", namespace, "-o", "yaml", **queues.env)
    assert got.code == 0, got.err
    assert yaml.safe_load(got.out) == expected(after)
    shown = await cli("topic", "stats", name, "-n", namespace, **queues.env)
    owners = {int(r[0]): r[5] for r in table(shown.out)[1:-1]}
    assert owners == {
        s: "none (expired: replica-b)" if partition_of(queue, s, PARTITIONS) == b_partition else "-"
        for s in range(4)
    }


async def test_stats_without_any_lease_show_no_owner(
    cli: Cli, kubectl: Kubectl, namespace: str, queues: Queues
) -> None:
    queue = persistent_topic(kubectl, namespace, "quiet", shards=2)
    await queues.store.create(queue, 2, QueueLimits())
    got = await cli("topic", "stats", "quiet", "-n", namespace, "-o", "json", **queues.env)
    assert got.code == 0, got.err
    assert [(s["owner"], s["lease"]) for s in got.json()["shards"]] == [(None, None)] * 2
    shown = await cli("topic", "stats", "quiet", "-n", namespace, **queues.env)
    assert [r[5] for r in table(shown.out)[1:-1]] == ["-", "-"]


async def test_dump_gives_the_pending_records_shard_by_shard_in_commit_order(
    cli: Cli, kubectl: Kubectl, namespace: str, queues: Queues
) -> None:
    """Done when the CLI's dump matches the queue: every pending record, with its id and
    delivery state, oldest first in each shard; --max-entries and --shard narrow it."""
    queue = persistent_topic(kubectl, namespace, "orders", shards=3)
    store = queues.store
    await store.create(queue, 3, QueueLimits())
    first = await commit(store, queue, 0, event("a"), event("b"))
    second = await commit(store, queue, 0, event("c"))
    third = await commit(store, queue, 2, event("z"))
    retried = replace(first[1], attempts=3, not_before=time.time() + 60)
    await store.update(queue, 0, [retried])
    pending = [(0, first[0]), (0, retried), (0, second[0]), (2, third[0])]

    got = await cli("topic", "dump", "orders", "-n", namespace, **queues.env)
    assert got.code == 0, got.err
    dumped = got.json()
    assert [(d["shard"], d["id"], d["eventId"]) for d in dumped] == [
        (shard, e.id, e.event_id) for shard, e in pending
    ]
    assert [d["event"] for d in dumped] == [json.loads(e.body) for _, e in pending]
    assert [d["attempts"] for d in dumped] == [0, 3, 0, 0]
    assert [d["notBefore"] for d in dumped][::2] == [None, None]
    assert parse_time(dumped[1]["notBefore"]) == pytest.approx(retried.not_before, abs=1e-5)
    assert [parse_time(d["ingestTime"]) for d in dumped] == pytest.approx(
        [e.ingest_time for _, e in pending], abs=1e-5
    )

    async def dump(*args: str) -> list[str]:
        result = await cli("topic", "dump", "orders", "-n", namespace, *args, **queues.env)
        assert result.code == 0, result.err
        return [d["id"] for d in result.json()]

    ids = [e.id for _, e in pending]
    assert await dump("--max-entries", "2") == ids[:2]
    assert await dump("--max-entries", "3") == ids[:3]
    assert await dump("--shard", "2") == ids[3:]
    assert await dump("--shard", "1") == []
    assert await dump("--shard", "0", "--max-entries", "1") == ids[:1]

    missing = await cli("topic", "dump", "orders", "-n", namespace, "--shard", "3", **queues.env)
    assert (missing.code, missing.out) == (1, "")
    assert "has no shard 3" in missing.err


async def test_stats_and_dump_refuse_a_topic_that_is_not_persistent_or_has_no_queue(
    cli: Cli, kubectl: Kubectl, namespace: str, queues: Queues
) -> None:
    apply(kubectl, namespace, "Topic", "direct", {"endpoint": HTTP})
    persistent_topic(kubectl, namespace, "unserved", shards=2)  # no delivery replica yet
    for action in ("stats", "dump"):
        direct = await cli("topic", action, "direct", "-n", namespace, **queues.env)
        assert direct.code == 1
        assert direct.err == (
            f"error: topic {namespace}/direct is not persistent: the gateway pushes its "
            "events itself, so there is no queue\n"
        )
        unserved = await cli("topic", action, "unserved", "-n", namespace, **queues.env)
        assert unserved.code == 1
        assert f"the queue of topic {namespace}/unserved is not in the queue store" in (
            unserved.err
        )


async def test_a_ready_topic_with_nothing_queued_yet_shows_an_empty_queue(
    cli: Cli, kubectl: Kubectl, namespace: str, queues: Queues
) -> None:
    """A Ready persistent Topic whose queue the store does not hold yet (its first events
    may still wait in the gateway's own queue): stats show every shard of its spec empty
    and dump an empty list, exit 0, with a note on stderr saying why; not an error."""
    persistent_topic(kubectl, namespace, "quiet", shards=3)
    set_ready(kubectl, namespace, "topic", "quiet", "Synced")
    stats = await cli("topic", "stats", "quiet", "-n", namespace, "-o", "json", **queues.env)
    assert stats.code == 0, stats.err
    found = stats.json()
    assert (found["topic"], found["entries"], found["bytes"]) == (f"{namespace}/quiet", 0, 0)
    assert [(s["shard"], s["entries"], s["reservations"]) for s in found["shards"]] == [
        (0, 0, 0),
        (1, 0, 0),
        (2, 0, 0),
    ]
    assert f"topic {namespace}/quiet is Ready and nothing of it is queued yet" in stats.err
    dump = await cli("topic", "dump", "quiet", "-n", namespace, **queues.env)
    assert (dump.code, dump.json()) == (0, [])
    assert "nothing of it is queued yet" in dump.err


# --- list, get, rm --------------------------------------------------------------------------


def set_ready(
    kubectl: Kubectl, namespace: str, kind: str, name: str, reason: str, **more: str
) -> None:
    status: dict[str, object] = {
        **more,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": reason,
                "message": "in step with the gateway",
                "lastTransitionTime": "2024-01-01T00:00:00Z",
            }
        ],
    }
    kubectl.run(
        "patch", kind, name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


async def test_topic_list_get_and_rm(cli: Cli, kubectl: Kubectl, namespace: str) -> None:
    apply(kubectl, namespace, "Topic", "web", {"endpoint": HTTP})
    kafka = {"kafka": {"url": "kafka://127.0.0.1:19092"}}
    apply(kubectl, namespace, "Topic", "stream", {"endpoint": kafka, "persistent": True})
    set_ready(kubectl, namespace, "topic", "web", "Synced", gatewayRelease="tentacle")
    # The delivery status as the operator writes it (tests/e2e/test_delivery_health.py).
    ten_minutes_ago = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10, seconds=5)
    delivering = {
        "type": "Delivering",
        "status": "False",
        "reason": "EndpointFailing",
        "message": "no push has succeeded for 10 min",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
    }
    kubectl.run(
        "patch", "topic", "stream", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {
            "conditions": [delivering],
            "delivery": {
                "backlogEvents": 12000,
                "oldestPendingTime": ten_minutes_ago.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }}),
    )  # fmt: skip

    listed = await cli("topic", "list", "-n", namespace)
    assert listed.code == 0, listed.err
    rows = table(listed.out)
    assert rows[0] == [
        "NAME", "ENDPOINT", "PERSISTENT", "GATEWAY", "READY", "REASON",
        "DELIVERING", "BACKLOG", "OLDEST", "AGE",
    ]  # fmt: skip
    assert [r[:9] for r in rows[1:]] == [
        ["stream", "kafka", "true", "-", "-", "-", "False", "12000", "10m"],
        ["web", "http", "false", "tentacle", "True", "Synced", "-", "-", "-"],
    ]
    assert all(re.fullmatch(r"\d+[smhd]", r[9]) for r in rows[1:])

    everywhere = await cli("topic", "list", "-A")
    assert everywhere.code == 0, everywhere.err
    rows = table(everywhere.out)
    assert rows[0][:2] == ["NAMESPACE", "NAME"]
    assert [r[:3] for r in rows if r[0] == namespace] == [
        [namespace, "stream", "kafka"],
        [namespace, "web", "http"],
    ]

    as_json = await cli("topic", "list", "-n", namespace, "-o", "json")
    objects = as_json.json()
    assert [o["metadata"]["name"] for o in objects] == ["stream", "web"]
    assert all("managedFields" not in o["metadata"] for o in objects)
    assert objects[1]["status"]["conditions"][0]["reason"] == "Synced"

    got = await cli("topic", "get", "stream", "-n", namespace)
    assert got.code == 0, got.err
    stream = yaml.safe_load(got.out)
    stored = kubectl.get("topic", "stream", namespace)
    assert (stream["kind"], stream["metadata"]["uid"]) == ("Topic", stored["metadata"]["uid"])
    assert stream["spec"] == stored["spec"]
    assert stream["spec"]["endpoint"]["kafka"]["url"] == kafka["kafka"]["url"]
    got_json = await cli("topic", "get", "stream", "-n", namespace, "-o", "json")
    assert got_json.json() == stream

    removed = await cli("topic", "rm", "web", "-n", namespace)
    assert (removed.code, removed.out) == (0, f"topic {namespace}/web deleted\n")
    gone = await cli("topic", "get", "web", "-n", namespace)
    assert (gone.code, gone.out, gone.err) == (1, "", f"error: topic {namespace}/web not found\n")


async def test_rm_of_a_topic_with_a_finalizer_says_the_operator_finishes_it(
    cli: Cli, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "held", "namespace": namespace, "finalizers": ["test/hold"]},
            "spec": {"endpoint": HTTP},
        }
    )
    removed = await cli("topic", "rm", "held", "-n", namespace)
    assert removed.code == 0, removed.err
    assert removed.out == (
        f"topic {namespace}/held marked for deletion: the operator removes the gateway "
        "topic first\n"
    )
    kubectl.run(
        "patch", "topic", "held", "-n", namespace, "--type=merge",
        "-p", '{"metadata":{"finalizers":null}}',
    )  # fmt: skip


async def test_notification_list_and_get(cli: Cli, kubectl: Kubectl, namespace: str) -> None:
    apply(kubectl, namespace, "Topic", "web", {"endpoint": HTTP})
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "thumbs",
        {
            "bucket": "photos",
            "topicRef": {"name": "web"},
            "events": ["s3:ObjectCreated:Put", "s3:ObjectRemoved:*"],
            "filter": {
                "key": {"prefix": "img/", "suffix": ".jpg"},
                "metadata": [{"name": "x-amz-meta-color", "value": "red"}],
                "tags": [{"name": "env", "value": "prod"}],
            },
        },
    )
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "all",
        {"bucket": "logs", "topicRef": {"name": "web"}},
    )
    set_ready(kubectl, namespace, "bucketnotification", "thumbs", "Applied")

    listed = await cli("notification", "list", "-n", namespace)
    assert listed.code == 0, listed.err
    rows = table(listed.out)
    assert rows[0] == ["NAME", "BUCKET", "TOPIC", "EVENTS", "FILTERS", "READY", "AGE"]
    assert [r[:6] for r in rows[1:]] == [
        ["all", "logs", "web", "ObjectCreated:*,ObjectRemoved:*", "-", "-"],
        [
            "thumbs",
            "photos",
            "web",
            "ObjectCreated:Put,ObjectRemoved:*",
            "prefix=img/,suffix=.jpg,x-amz-meta-color=red,tag:env=prod",
            "True",
        ],
    ]

    got = await cli("notification", "get", "thumbs", "-n", namespace, "-o", "json")
    assert got.code == 0, got.err
    assert got.json()["spec"]["bucket"] == "photos"
    missing = await cli("notification", "get", "nope", "-n", namespace)
    assert (missing.code, missing.err) == (
        1,
        f"error: notification {namespace}/nope not found\n",
    )
    as_yaml = await cli("notification", "list", "-n", namespace, "-o", "yaml")
    assert [o["metadata"]["name"] for o in yaml.safe_load(as_yaml.out)] == ["all", "thumbs"]


async def test_the_namespace_defaults_to_the_kubeconfig_contexts(
    cli: Cli, kube: LocalService, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    apply(kubectl, namespace, "Topic", "web", {"endpoint": HTTP})

    def in_namespace(kubeconfig: dict[str, Any]) -> None:
        for context in kubeconfig["contexts"]:
            context["context"]["namespace"] = namespace

    path = edited_kubeconfig(kube["KUBECONFIG_ADMIN"], tmp_path / "kubeconfig", in_namespace)
    listed = await cli("topic", "list", KUBECONFIG=path)
    assert listed.code == 0, listed.err
    assert [r[0] for r in table(listed.out)[1:]] == ["web"]
    empty = await cli("topic", "list", "-n", f"{namespace}-none")
    assert (empty.code, empty.out, empty.err) == (
        0,
        "",
        f"no topics in namespace {namespace}-none\n",
    )


# --- failures -------------------------------------------------------------------------------


async def test_a_missing_topic_is_exit_code_1_with_its_name(
    cli: Cli, namespace: str, queues: Queues
) -> None:
    for action in ("get", "rm", "stats", "dump"):
        result = await cli("topic", action, "nope", "-n", namespace, **queues.env)
        assert (result.code, result.out, result.err) == (
            1,
            "",
            f"error: topic {namespace}/nope not found\n",
        ), action


async def test_an_unreachable_cluster_is_exit_code_3_without_a_traceback(
    kube: LocalService, tmp_path: Path
) -> None:

    def nowhere(kubeconfig: dict[str, Any]) -> None:
        for cluster in kubeconfig["clusters"]:
            cluster["cluster"]["server"] = "https://127.0.0.1:1"  # nothing listens there

    path = edited_kubeconfig(kube["KUBECONFIG_ADMIN"], tmp_path / "kubeconfig", nowhere)
    for args in (("topic", "list"), ("topic", "get", "x"), ("notification", "list", "-A")):
        result = await run_cli({"KUBECONFIG": path}, *args)
        assert result.code == 3, result
        assert result.err.startswith("error: cannot reach the API server at https://127.0.0.1:1")
        assert "Traceback" not in result.err

    no_config = await run_cli({"KUBECONFIG": str(tmp_path / "missing")}, "topic", "list")
    assert no_config.code == 3
    assert no_config.err == (
        "error: cannot read the Kubernetes configuration: no file of $KUBECONFIG exists\n"
    )


async def test_an_unreachable_store_is_exit_code_3_and_never_shows_the_secret_key(
    cli: Cli, kubectl: Kubectl, namespace: str, rgw: LocalService
) -> None:
    persistent_topic(kubectl, namespace, "orders", shards=2)
    env = {
        **gateway_settings(rgw),
        "BUCKETNOTIFY_GATEWAY_ENDPOINT": "http://127.0.0.1:1",
        "BUCKETNOTIFY_DELIVERY_STORE": "s3://queues",
    }
    for action in ("stats", "dump"):
        result = await cli("topic", action, "orders", "-n", namespace, **env)
        assert result.code == 3, result
        assert result.err.startswith("error: cannot read the queue store: ")
        assert "did not answer" in result.err
        assert rgw["RGW_SECRET_KEY"] not in result.out + result.err

    no_bucket = await cli(
        "topic", "stats", "orders", "-n", namespace,
        **{**gateway_settings(rgw), "BUCKETNOTIFY_DELIVERY_STORE": f"s3://none-{uuid.uuid4().hex[:8]}"},
    )  # fmt: skip
    assert no_bucket.code == 3
    assert "the bucket does not exist" in no_bucket.err


async def test_bad_settings_are_exit_code_1_and_name_the_variable_not_its_value(
    cli: Cli, kubectl: Kubectl, namespace: str
) -> None:
    persistent_topic(kubectl, namespace, "orders", shards=2)
    no_keys = await cli(
        "topic", "stats", "orders", "-n", namespace, BUCKETNOTIFY_DELIVERY_STORE="s3://queues"
    )
    assert (no_keys.code, no_keys.err) == (
        1,
        "error: an s3:// store needs BUCKETNOTIFY_GATEWAY_ENDPOINT, _ACCESS_KEY, _SECRET_KEY\n",
    )
    secret_looking = "ftp://user:hunter2@host"
    odd = await cli(
        "topic", "dump", "orders", "-n", namespace, BUCKETNOTIFY_DELIVERY_STORE=secret_looking
    )
    assert odd.code == 1
    assert "hunter2" not in odd.err
    bad_number = await cli(
        "topic", "stats", "orders", "-n", namespace, BUCKETNOTIFY_DELIVERY_PARTITIONS="hunter2"
    )
    assert bad_number.code == 1
    assert bad_number.err.startswith("error: invalid settings: BUCKETNOTIFY_DELIVERY_PARTITIONS: ")
    assert "hunter2" not in bad_number.err


async def test_rbac_refusal_is_exit_code_1_with_the_servers_reason(
    kube: LocalService, crds: None, namespace: str
) -> None:
    result = await run_cli(
        {"KUBECONFIG": kube["KUBECONFIG_NOBODY"]}, "topic", "list", "-n", namespace
    )
    assert result.code == 1
    assert result.err.startswith("error: forbidden: ")
    assert 'cannot list resource "topics"' in result.err


async def test_bad_arguments_are_exit_code_2(cli: Cli) -> None:
    for args in (
        ("topic",),
        ("topic", "dump", "x", "--max-entries", "0"),
        ("topic", "list", "-o", "xml"),
    ):
        result = await cli(*args)
        assert result.code == 2, args
        assert "usage:" in result.err


@pytest.mark.parametrize("queues", ["dir"], indirect=True)
async def test_the_rights_docs_cli_md_lists_are_enough_for_every_command(
    kube: LocalService, crds: None, kubectl: Kubectl, namespace: str, queues: Queues, tmp_path: Path
) -> None:
    """A user holding exactly what docs/cli.md lists (get/list on topics and
    bucketnotifications, delete on topics, list on leases in the Lease namespace) runs every
    command; without the leases right, ``topic stats`` is the one refused."""
    kubectl.run("create", "serviceaccount", "cli-user", "-n", namespace)

    def rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}

    rules = [
        rule("bucketnotify.io", "topics", "get", "list", "delete"),
        rule("bucketnotify.io", "bucketnotifications", "get", "list"),
        rule("coordination.k8s.io", "leases", "list"),
    ]
    kubectl.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "cli-user", "namespace": namespace},
            "rules": rules,
        }
    )
    kubectl.run(
        "create", "rolebinding", "cli-user", "-n", namespace, "--role=cli-user",
        f"--serviceaccount={namespace}:cli-user",
    )  # fmt: skip
    token = kubectl.run("create", "token", "cli-user", "-n", namespace).stdout.strip()

    def as_cli_user(kubeconfig: dict[str, Any]) -> None:
        for user in kubeconfig["users"]:
            user["user"] = {"token": token}

    path = edited_kubeconfig(kube["KUBECONFIG_ADMIN"], tmp_path / "kubeconfig", as_cli_user)
    queue = persistent_topic(kubectl, namespace, "orders", shards=2)
    await queues.store.create(queue, 2, QueueLimits())
    apply(kubectl, namespace, "Topic", "web", {"endpoint": HTTP})
    apply(
        kubectl, namespace, "BucketNotification", "all",
        {"bucket": "photos", "topicRef": {"name": "web"}},
    )  # fmt: skip

    async def run(*args: str) -> Result:
        return await run_cli({"KUBECONFIG": path, **queues.env}, *args, "-n", namespace)

    for args in (
        ("topic", "list"),
        ("topic", "get", "orders"),
        ("topic", "stats", "orders"),
        ("topic", "dump", "orders"),
        ("notification", "list"),
        ("notification", "get", "all"),
        ("topic", "rm", "web"),
    ):
        result = await run(*args)
        assert result.code == 0, (args, result)

    kubectl.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "cli-user", "namespace": namespace},
            "rules": rules[:2],
        }
    )
    refused = await wait_refused(run)
    assert 'cannot list resource "leases"' in refused.err


async def wait_refused(run: Callable[..., Awaitable[Result]]) -> Result:
    """``topic stats`` once the API server's RBAC has taken the narrowed Role (at once,
    but its authorizer cache may take a moment)."""
    deadline = time.monotonic() + 30
    while True:
        result = await run("topic", "stats", "orders")
        if result.code != 0 or time.monotonic() > deadline:
            assert result.code == 1, result
            return result
        await asyncio.sleep(0.5)


async def test_release_check_says_what_works_and_what_does_not(
    cli: Cli, namespace: str, start_operator: StartOperator
) -> None:
    """``release check`` (what the chart's ``helm test`` runs; the webhook part on the
    cluster tier, where the chart's webhook is served): with no operator running, the leader
    check fails and says so, exit 1; with the operator, it leads and a throw-away Topic
    becomes Ready on the gateway and is gone after its delete."""
    args = (
        "release", "check", "-n", namespace, "--leader-lease", "bucketnotify-operator",
        "--no-webhook", "--timeout", "60",
    )  # fmt: skip
    nobody = await cli(*args, "--no-topic")
    assert nobody.code == 1
    assert (
        nobody.out
        == f"FAIL  leader: no Lease {namespace}/bucketnotify-operator: is the operator running?\n"
    )

    start_operator()
    checked = await wait_for_leader(cli, args)
    assert checked.code == 0, checked.out + checked.err
    lines = checked.out.splitlines()
    assert re.fullmatch(r"ok    leader: \S+ leads \(renewed \d+ s ago\)", lines[0]), lines
    assert re.fullmatch(
        r"ok    topic: release-check-[0-9a-f]{8} Ready in \d+ s, then deleted and gone", lines[1]
    ), lines
    listed = await cli("topic", "list", "-n", namespace, "-o", "json")
    assert listed.json() == [], "the throw-away Topic is gone"


async def wait_for_leader(cli: Cli, args: tuple[str, ...]) -> Result:
    """The check once the operator has taken its Lease (it starts in a second or two)."""
    for _ in range(60):
        result = await cli(*args)
        if "no Lease" not in result.out:
            return result
        await asyncio.sleep(0.5)
    return result
