"""The local Ceph RGW is real: SNS topics, bucket notifications and pushed event JSON."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from bucketnotify.gateway.release import GatewayRelease, detect_release
from devstack.servers.recording import HttpReceiver, RecordingHttpServer
from tests.localservices import LocalService
from tests.s3 import release_of, s3_client, sns_client
from tests.waiting import wait_until


@pytest.fixture()
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


def test_topic_notification_and_pushed_events(rgw: LocalService, receiver: HttpReceiver) -> None:
    """An object PUT and DELETE on a notified bucket reach an HTTP endpoint as event JSON."""
    s3 = s3_client(rgw)
    sns = sns_client(rgw)
    suffix = uuid.uuid4().hex[:8]
    bucket, topic_name, config_id = f"smoke-{suffix}", f"smoke-{suffix}", f"cfg-{suffix}"

    s3.create_bucket(Bucket=bucket)
    arn = sns.create_topic(Name=topic_name, Attributes={"push-endpoint": receiver.url})["TopicArn"]
    try:
        assert arn.endswith(f":{topic_name}")
        attrs = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
        assert attrs["EndPoint"]  # the gateway echoes the endpoint it will push to
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "TopicConfigurations": [
                    {
                        "Id": config_id,
                        "TopicArn": arn,
                        "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
                    }
                ]
            },
        )

        s3.put_object(Bucket=bucket, Key="hello.txt", Body=b"hello", Metadata={"team": "a"})
        (created,) = receiver.next_records()
        assert created["eventName"] == "ObjectCreated:Put"
        assert created["eventSource"] == "ceph:s3"
        assert created["eventVersion"] == "2.2"
        assert created["s3"]["configurationId"] == config_id
        assert created["s3"]["bucket"]["name"] == bucket
        assert created["s3"]["object"]["key"] == "hello.txt"
        assert created["s3"]["object"]["size"] == 5
        # Ceph 16.2 also puts request headers into metadata (docs/gateway-compatibility.md):
        # look only for ours.
        metadata = {m["key"]: m["val"] for m in created["s3"]["object"]["metadata"]}
        assert metadata["x-amz-meta-team"] == "a"

        s3.delete_object(Bucket=bucket, Key="hello.txt")
        (removed,) = receiver.next_records()
        assert removed["eventName"] == "ObjectRemoved:Delete"
        assert removed["s3"]["object"]["key"] == "hello.txt"
    finally:
        s3.delete_bucket(Bucket=bucket)
        sns.delete_topic(TopicArn=arn)


def test_the_gateway_says_which_release_it_runs(rgw: LocalService) -> None:
    """What a Topic may ask of a gateway depends on its release: the operator learns it from
    the gateway (Server header on 20, ``/admin/info`` on 18 and 16), over HTTP and HTTPS."""
    plain = detect_release(rgw["RGW_ENDPOINT"])
    assert plain.name == rgw["CEPH_RELEASE"]
    assert plain.learned_from == ("server-header" if plain.name == "tentacle" else "admin-info")
    tls = detect_release(
        rgw["RGW_TLS_ENDPOINT"], ssl.create_default_context(cafile=rgw["RGW_CA_PEM"])
    )
    assert tls == plain


def test_the_gateways_own_push_carries_cloudevents_headers_where_its_release_sends_them(
    rgw: LocalService,
) -> None:
    """Ceph 16.2 takes cloudevents=true on a topic it pushes itself and sends no ce-*
    header; 18 and 20 send them. The operator refuses cloudEvents on a non-persistent Topic
    only where the gateway's release does not send them (docs/operator.md)."""
    s3 = s3_client(rgw)
    sns = sns_client(rgw)
    suffix = uuid.uuid4().hex[:8]
    bucket = f"ce-{suffix}"
    s3.create_bucket(Bucket=bucket)
    with RecordingHttpServer() as server:
        attributes = {"push-endpoint": server.url, "cloudevents": "true"}
        arn = sns.create_topic(Name=f"ce-{suffix}", Attributes=attributes)["TopicArn"]
        try:
            stored = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
            assert "cloudevents=true" in json.loads(stored["EndPoint"])["EndpointArgs"]
            s3.put_bucket_notification_configuration(
                Bucket=bucket,
                NotificationConfiguration={
                    "TopicConfigurations": [
                        {"Id": "ce", "TopicArn": arn, "Events": ["s3:ObjectCreated:*"]}
                    ]
                },
            )
            s3.put_object(Bucket=bucket, Key="k", Body=b"x")
            (pushed,) = wait_until(server.received, bool, 20, "the gateway's push")
        finally:
            s3.delete_object(Bucket=bucket, Key="k")
            s3.delete_bucket(Bucket=bucket)
            sns.delete_topic(TopicArn=arn)
    headers = {name: value for name, value in pushed.headers if name.startswith("ce-")}
    release = GatewayRelease(rgw["CEPH_RELEASE"], "setting")
    if not release.sends_cloud_events:
        assert headers == {}
        assert [r["s3"]["object"]["key"] for r in json.loads(pushed.body)["Records"]] == ["k"]
        return
    # The headers our delivery service derives from a record (delivery.endpoints.http) are
    # the ones the gateway sends for it.
    body = json.loads(pushed.body)
    assert [r["s3"]["object"]["key"] for r in body["Records"]] == ["k"]
    (record,) = body["Records"]
    # 18 and 20 write ce-time to the nanosecond, the record's eventTime to the microsecond
    # (ours is eventTime): the same instant.
    assert re.sub(r"(\.\d{6})\d*Z$", r"\1Z", headers.pop("ce-time")) == record["eventTime"]
    assert headers == {
        "ce-specversion": "1.0",
        "ce-type": f"com.amazonaws.{record['eventName']}",
        "ce-id": f"{record['responseElements']['x-amz-request-id']}"
        f".{record['responseElements']['x-amz-id-2']}",
        "ce-source": f"ceph:s3.{record['awsRegion']}.{bucket}",
        "ce-subject": "k",
    }


def test_a_topic_is_found_by_the_arns_last_part_and_from_20_2_its_account(
    rgw: LocalService,
) -> None:
    """GetTopicAttributes and DeleteTopic never look at the ARN's partition and region. 16.2
    and 18.2 look at its last part alone: an ARN naming another account still finds (and
    deletes) the topic. 20.2 also matches the account (empty for a user outside an
    account): such an ARN is NotFound to read, and DeleteTopic answers success but deletes
    nothing."""
    release = release_of(rgw)
    sns = sns_client(rgw)
    name = f"arn-{uuid.uuid4().hex[:8]}"
    arn = sns.create_topic(Name=name, Attributes={"push-endpoint": "http://127.0.0.1:9/x"})[
        "TopicArn"
    ]
    _, _, _, _, account, _ = arn.split(":")
    elsewhere_same_account = f"arn:aws-cn:sns:nowhere-1:{account}:{name}"
    other_account = f"arn:aws:sns:nowhere-1:000000000000:{name}"

    def found(topic_arn: str) -> str | None:
        try:
            return str(sns.get_topic_attributes(TopicArn=topic_arn)["Attributes"]["TopicArn"])
        except sns.exceptions.ClientError as refused:
            # 18.2's 404 has a body boto3 cannot read a code from; 20.2 says NotFound.
            assert refused.response["ResponseMetadata"]["HTTPStatusCode"] == 404, refused
            return None

    try:
        assert account != "000000000000"
        assert found(elsewhere_same_account) == arn
        if (release.major or 0) >= 20:
            assert found(other_account) is None
            sns.delete_topic(TopicArn=other_account)
            assert found(arn) == arn, "a DeleteTopic naming another account deleted it"
        else:
            assert found(other_account) == arn
            sns.delete_topic(TopicArn=other_account)
            assert found(arn) is None
    finally:
        sns.delete_topic(TopicArn=arn)


async def test_debians_radosgw_builds_do_not_push_to_kafka_themselves(
    rgw: LocalService, kafka: LocalService
) -> None:
    """Debian's radosgw 16.2, 18.2 and 20.2, the builds the tests run, are built without
    Kafka: a non-persistent Kafka topic is made, but the gateway cannot make its push
    ("unknown schema in: kafka://...") and nothing reaches the broker. Persistent Topics
    reach Kafka through our delivery service."""
    s3, sns = s3_client(rgw), sns_client(rgw)
    suffix = uuid.uuid4().hex[:8]
    bucket, name = f"kafka-{suffix}", f"kafka-{suffix}"
    endpoint = f"kafka://{kafka['KAFKA_BOOTSTRAP']}"
    s3.create_bucket(Bucket=bucket)
    arn = sns.create_topic(
        Name=name, Attributes={"push-endpoint": endpoint, "kafka-ack-level": "broker"}
    )["TopicArn"]
    gateway_log = Path(rgw["CEPH_LOG"])
    logged_before = (await asyncio.to_thread(gateway_log.stat)).st_size

    def logged_since() -> str:
        with gateway_log.open("rb") as log:
            log.seek(logged_before)
            return log.read().decode(errors="replace")

    try:
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "TopicConfigurations": [
                    {"Id": "k", "TopicArn": arn, "Events": ["s3:ObjectCreated:*"]}
                ]
            },
        )
        s3.put_object(Bucket=bucket, Key="pushed.txt", Body=b"x")  # pushed within the PUT
        # Why nothing arrives: the push itself fails in the gateway, not on its way.
        await asyncio.to_thread(
            wait_until,
            logged_since,
            lambda text: f"unknown schema in: {endpoint}" in text,
            20,
            "the gateway to log that it has no Kafka",
        )
        consumer = AIOKafkaConsumer(
            name,
            bootstrap_servers=kafka["KAFKA_BOOTSTRAP"],
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            polled = await consumer.getmany(timeout_ms=15_000)
        finally:
            await consumer.stop()
        keys = [
            json.loads(m.value)["Records"][0]["s3"]["object"]["key"]
            for messages in polled.values()
            for m in messages
            if m.value is not None
        ]
        assert keys == [], f"this {release_of(rgw)} gateway pushed to Kafka after all"
    finally:
        s3.delete_object(Bucket=bucket, Key="pushed.txt")
        s3.delete_bucket(Bucket=bucket)
        sns.delete_topic(TopicArn=arn)
