"""The operator and the delivery service scoped to many namespaces, as a platform team with a
namespace per tenant team runs them (``BUCKETNOTIFY_NAMESPACES``, the chart's
``watchNamespaces``).

kopf keeps a watch stream open per watched resource and namespace; each holds a connection
of its pool. With a pool that did not count them, 8 namespaces took every connection and
the operator never reconciled anything. Real everything: the apiserver, the gateway pushing
to two delivery replicas behind a balancer, an HTTP endpoint.
"""

from __future__ import annotations

import json
import queue
import uuid

import pytest

from devstack.servers.recording import HttpReceiver
from tests.delivery import StartCluster, push_records
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.resources import apply, condition, token_secret
from tests.s3 import s3_client

pytestmark = pytest.mark.usefixtures("crds")

NAMESPACES = 50


def test_fifty_namespaces_reconcile_and_deliver_and_an_unlisted_one_is_left_alone(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    run = uuid.uuid4().hex[:8]
    scoped = [f"mn-{run}-{i:02d}" for i in range(NAMESPACES)]
    outside = f"mn-{run}-outside"
    for name in [*scoped, outside]:
        kubectl.run("create", "namespace", name)
    listed = json.dumps(scoped)

    cluster = delivery_cluster("s3")
    # The Leases stay in the test's own namespace, which is not one of the watched ones, as
    # the chart keeps them in the release namespace.
    for replica in ("replica-a", "replica-b"):
        cluster.start(replica, namespaces=listed)
    balancer = cluster.front()
    start_operator(ingest_url=balancer.url, namespaces=listed)

    s3 = s3_client(rgw)
    with HttpReceiver() as receiver:
        buckets = {}
        for ns in (scoped[0], scoped[-1], outside):
            bucket = f"mn-{uuid.uuid4().hex[:12]}"
            s3.create_bucket(Bucket=bucket)
            buckets[ns] = bucket
            # Gateway topics are per tenant: a name of its own keeps other tests' out.
            apply(
                kubectl,
                ns,
                "Topic",
                "events",
                {
                    "endpoint": {"http": {"url": receiver.url}},
                    "persistent": True,
                    "delivery": {"handoff": "sync"},
                    "name": f"mn-{uuid.uuid4().hex[:8]}",
                },
            )
            apply(
                kubectl,
                ns,
                "BucketNotification",
                "uploads",
                {
                    "bucket": bucket,
                    "topicRef": {"name": "events"},
                    "testEvent": False,
                    "events": ["s3:ObjectCreated:Put"],
                },
            )
        for ns in (scoped[0], scoped[-1]):
            condition(kubectl, ns, "topic", "events")
            condition(kubectl, ns, "bucketnotification", "uploads")
            s3.put_object(Bucket=buckets[ns], Key=f"from-{ns}", Body=b"x")

        arrived: set[str] = set()
        expected = {f"from-{scoped[0]}", f"from-{scoped[-1]}"}
        while arrived != expected:
            try:
                records = receiver.next_records(timeout=60)
            except queue.Empty:
                pytest.fail(f"arrived {sorted(arrived)} of {sorted(expected)}")
            arrived |= {r["s3"]["object"]["key"] for r in records}

    # The operator reconciled the others long ago; the unlisted namespace's objects have
    # neither its finalizer nor a status.
    for kind in ("topic", "bucketnotification"):
        name = "events" if kind == "topic" else "uploads"
        left = kubectl.get(kind, name, outside)
        assert not left["metadata"].get("finalizers"), left["metadata"]
        assert not left.get("status"), left["status"]
    # The delivery service does not serve a Topic of an unlisted namespace, even one that
    # has an ingest token Secret as the operator would make it.
    token = token_secret(kubectl, outside, "events")
    for port in cluster.ports.values():
        assert push_records(port, outside, "events", token, ["k"]) == 404
