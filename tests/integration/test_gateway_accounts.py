"""Topics and BucketNotifications of a gateway user that lives in an account (Ceph 19+
"user accounts"), on the 20.2 gateway the tests run: the account is made with radosgw-admin,
its root user's keys go in a gatewayRef Secret. Also what 20.2 does with the Topic of a user
moved into an account after it made its topics.

Measured here (20.2.4): an account user's topics are the account's, with ARNs that name it
(``arn:aws:sns:<zonegroup>:RGW...:<name>``); an ARN with the account left empty does not find
them; a user moved into an account still reads its older topic by its old ARN, but ListTopics
no longer shows it, and a CreateTopic of the same name makes a second topic, the account's.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import Any

import boto3
import pytest

from devstack.gateway import ceph_tool
from devstack.servers.recording import RecordingHttpServer
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import DRIFT_INTERVAL_S, StartOperator
from tests.resources import apply, condition, gateway_secret, object_events
from tests.s3 import release_of
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


def admin(rgw: LocalService, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        ceph_tool(rgw, "radosgw-admin", *args), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def user_keys(rgw: LocalService, uid: str, *more: str) -> tuple[str, str]:
    made = admin(rgw, "user", "create", f"--uid={uid}", f"--display-name={uid}", *more)
    key = made["keys"][0]
    return str(key["access_key"]), str(key["secret_key"])


def client(rgw: LocalService, kind: str, keys: tuple[str, str]) -> Any:
    return boto3.client(
        kind,
        endpoint_url=rgw["RGW_ENDPOINT"],
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
        region_name=rgw["RGW_REGION"],
    )


@pytest.fixture()
def account(rgw: LocalService) -> str:
    """A new account on the gateway (20.2: every release that has accounts); its id."""
    release = release_of(rgw)
    assert (release.major or 0) >= 20, f"the lanes' gateway runs {release.name}, not 20.2"
    made = admin(rgw, "account", "create", f"--account-name=bn-{uuid.uuid4().hex[:8]}")
    return str(made["id"])


def topic_arn(sns: Any, arn: str) -> str | None:
    try:
        return str(sns.get_topic_attributes(TopicArn=arn)["Attributes"]["TopicArn"])
    except sns.exceptions.NotFoundException:
        return None


def test_an_account_users_topics_and_notifications_work_and_go(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    account: str,
) -> None:
    start_operator()
    keys = user_keys(
        rgw, f"bn-root-{uuid.uuid4().hex[:6]}", f"--account-id={account}", "--account-root"
    )
    gateway_secret(kubectl, namespace, "account", rgw["RGW_ENDPOINT"], *keys)
    sns, s3 = client(rgw, "sns", keys), client(rgw, "s3", keys)
    bucket = f"acct-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    with RecordingHttpServer() as receiver:
        apply(
            kubectl,
            namespace,
            "Topic",
            "orders",
            {
                "endpoint": {"http": {"url": f"{receiver.url}/hook"}},
                "gatewayRef": {"secretName": "account"},
            },
        )
        arn = condition(kubectl, namespace, "topic", "orders")["arn"]
        # The account's topic: its ARN names the account, and the ARN without it finds nothing.
        assert arn.split(":")[4] == account, arn
        assert topic_arn(sns, arn) == arn
        assert topic_arn(sns, f"arn:aws:sns:{rgw['RGW_REGION']}::{arn.split(':')[5]}") is None
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            "orders",
            {
                "bucket": bucket,
                "topicRef": {"name": "orders"},
                "events": ["s3:ObjectCreated:*"],
                "gatewayRef": {"secretName": "account"},
                "testEvent": False,
            },
        )
        condition(kubectl, namespace, "bucketnotification", "orders")
        configured = s3.get_bucket_notification_configuration(Bucket=bucket)
        assert [c["TopicArn"] for c in configured["TopicConfigurations"]] == [arn]
        s3.put_object(Bucket=bucket, Key="k", Body=b"x")
        got = wait_until(receiver.received, lambda r: len(r) == 1, 30, "the account's event")
        assert json.loads(got[0].body)["Records"][0]["s3"]["object"]["key"] == "k"

        # Drift checks later the operator still finds its topic by the ARN it holds: no
        # repair (a lookup that missed the account would rewrite it every interval).
        time.sleep(3 * DRIFT_INTERVAL_S)
        assert kubectl.get("topic", "orders", namespace)["status"]["arn"] == arn
        reasons = {e["reason"] for e in object_events(kubectl, namespace, "Topic", "orders")}
        assert "DriftRepaired" not in reasons, reasons

        kubectl.run("delete", "bucketnotification", "orders", "-n", namespace, "--wait=true")
        kubectl.run("delete", "topic", "orders", "-n", namespace, "--wait=true")
        assert topic_arn(sns, arn) is None, "the account's topic deleted with its Topic"
        assert not s3.get_bucket_notification_configuration(Bucket=bucket).get(
            "TopicConfigurations"
        )


def test_a_user_moved_into_an_account_moves_its_topic_at_the_next_write(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    account: str,
) -> None:
    """What 20.2 does with a user moved into an account: it still reads its older topic by the
    ARN without the account, but a CreateTopic of that name makes the account's topic. So the
    Topic stays Synced on its old topic until its next write (a spec change, or a repair),
    which moves it to the account's topic; the old topic is left as it was, and deleting the
    Topic deletes the account's topic only."""
    operator = start_operator()
    uid = f"bn-mv-{uuid.uuid4().hex[:6]}"
    keys = user_keys(rgw, uid)
    gateway_secret(kubectl, namespace, "mover", rgw["RGW_ENDPOINT"], *keys)
    sns = client(rgw, "sns", keys)
    spec = {
        "endpoint": {"http": {"url": "http://127.0.0.1:9/old"}},
        "gatewayRef": {"secretName": "mover"},
    }
    apply(kubectl, namespace, "Topic", "before", spec)
    old = condition(kubectl, namespace, "topic", "before")["arn"]
    assert old.split(":")[4] == "", old

    admin(rgw, "user", "modify", f"--uid={uid}", f"--account-id={account}", "--account-root")
    assert topic_arn(sns, old) == old, "the moved user reads its topic by its old ARN"
    listed = [t["TopicArn"] for t in sns.list_topics()["Topics"]]
    assert old not in listed, "ListTopics shows the account's topics only"
    # A change of the Topic is written with CreateTopic, which for the moved user makes the
    # account's topic of that name: the Topic moves to it; the old topic stays as it was.
    apply(
        kubectl,
        namespace,
        "Topic",
        "before",
        {**spec, "endpoint": {"http": {"url": "http://127.0.0.1:9/changed"}}},
    )
    status = wait_until(
        lambda: kubectl.get("topic", "before", namespace).get("status", {}),
        lambda st: st.get("arn") != old and st.get("observedGeneration") == 2,
        30,
        "the Topic's change written",
    )
    assert status["arn"].split(":")[4] == account, status["arn"]
    assert status["conditions"][0]["reason"] == "Synced"
    left = sns.get_topic_attributes(TopicArn=old)["Attributes"]
    assert "127.0.0.1:9/old" in left["EndPoint"], "the old topic stays as it was"

    said = [line for line in operator.log().splitlines() if "is left on the gateway" in line]
    assert len(said) == 1 and old in said[0] and status["arn"] in said[0], said

    kubectl.run("delete", "topic", "before", "-n", namespace, "--wait=true")
    assert topic_arn(sns, status["arn"]) is None, "the account's topic goes with the Topic"
    assert topic_arn(sns, old) == old, "the old topic is left behind (docs say how to remove it)"
    sns.delete_topic(TopicArn=old)
    assert topic_arn(sns, old) is None
