"""A delivery replica told to stop (SIGTERM: a pod deleted, a rolling update).

It says it is not ready at once, so the Service stops sending it requests, and it lets the
round under way finish its removals before it hands its Leases back: a successor on the same
queue store does not push that round's events again. Real processes, apiserver and store;
the test plays the gateway and the operator (it makes the token Secret).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devstack.servers.recording import RecordingHttpServer, keys_of
from tests.delivery import push_records
from tests.e2e.conftest import dir_replica
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program, free_port
from tests.resources import apply, token_secret
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


@pytest.fixture()
def replica_settings() -> dict[str, str]:
    # Queued, not pushed inside the ingest's answer: the round holds the push.
    return {"DIRECT_DELIVERY": "false"}


def readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as answer:
            return int(answer.status), json.load(answer)
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def test_a_stopping_replica_is_unready_at_once_and_its_round_finishes_before_it_goes(
    kubectl: Kubectl,
    namespace: str,
    kube: LocalService,
    replica: tuple[Program, int],
    queues: Path,
) -> None:
    program, port = replica
    # The endpoint answers only when the test lets it: a round is still pushing when the
    # stop comes, and for as long as the test looks.
    answer = threading.Event()
    with RecordingHttpServer(hold=answer) as endpoint, contextlib.ExitStack() as stack:
        stack.callback(answer.set)
        apply(
            kubectl,
            namespace,
            "Topic",
            "slow",
            {
                "endpoint": {"http": {"url": endpoint.url}},
                "persistent": True,
                "delivery": {"shards": 1},
            },
        )
        token = token_secret(kubectl, namespace, "slow")
        keys = ["a", "b", "c"]
        wait_until(
            lambda: push_records(port, namespace, "slow", token, keys),
            lambda status: status == 200,
            30,
            "the ingest taking the events",
        )
        wait_until(lambda: endpoint.in_flight, lambda n: n > 0, 20, "a push under way")
        assert readyz(port)[0] == 200

        program.process.send_signal(signal.SIGTERM)
        # At once means while the round's push is still under way (it cannot end before the
        # endpoint answers), not within a time a busy machine may exceed.
        _, body = wait_until(
            lambda: readyz(port), lambda seen: seen[0] == 503, 30, "/readyz 503", 0.05
        )
        assert body["ready"] is False and "stopping" in str(body), body
        assert program.process.poll() is None, "unready before it goes, not gone"
        # It waits for the push under way (the endpoint's answer) and its removal.
        answer.set()
        assert program.process.wait(timeout=30) == 0, program.log()[-3000:]

        assert sorted(keys_of(endpoint.received())) == keys

        # A successor on the same queue store finds nothing left to push.
        successor_port = free_port()
        successor = dir_replica(kube, namespace, queues, "replica-2", successor_port, {})
        try:
            # One shard, delivered in order: an event left in the queue would go out before
            # this one.
            assert push_records(successor_port, namespace, "slow", token, ["after"]) == 200
            again: list[str] = []
            wait_until(
                lambda: again.extend(keys_of(endpoint.received())) or again,
                lambda got: "after" in got,
                30,
                "the successor's push",
            )
            assert again == ["after"], "pushed again after a graceful stop"
        finally:
            successor.stop()
