"""Drift checks of Topics answered by one ListTopics per gateway and interval (real RGW).

At 5,000 Topics one GetTopicAttributes per Topic and minute kept Ceph 16 busy (each reads
the tenant's whole topics object); the listing replaces them, so what it answers must be what
GetTopicAttributes would have, and what it cannot know must still be read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest

from bucketnotify.gateway.errors import GatewayError
from bucketnotify.gateway.notifications import NotificationClient, NotificationConfig
from bucketnotify.gateway.topic_listing import TopicListing
from bucketnotify.gateway.topics import GatewayTopic, TopicClient
from tests.localservices import LocalService
from tests.s3 import DEAD_ENDPOINT, connection, release_of, sns_client, unique


@pytest.fixture()
def topics(rgw: LocalService) -> Iterator[TopicClient]:
    client = TopicClient(connection(rgw))
    made_before = set(client.list_arns())
    yield client
    for arn in set(client.list_arns()) - made_before:
        client.delete(arn)
    client.close()


class Counted:
    """A TopicListing over the real gateway that counts the requests it makes."""

    def __init__(self, client: TopicClient, reuse_s: float) -> None:
        self.client = client
        self.lists = 0
        self.gets: list[str] = []
        self.listing = TopicListing(self._list_all, self._get, reuse_s)

    async def _list_all(self) -> dict[str, GatewayTopic]:
        self.lists += 1
        return await asyncio.to_thread(self.client.list_all)

    async def _get(self, arn: str) -> GatewayTopic | None:
        self.gets.append(arn)
        return await asyncio.to_thread(self.client.get, arn)

    async def find(self, arn: str) -> GatewayTopic | None:
        return await self.listing.find(arn.rpartition(":")[2], arn)


def test_the_listing_holds_each_topic_as_get_reads_it_and_no_notification_copies(
    rgw: LocalService, topics: TopicClient
) -> None:
    plain = topics.upsert(unique("lt"), {"push-endpoint": DEAD_ENDPOINT})
    # "&" in OpaqueData splits Ceph's echoed EndpointArgs: the attribute itself must be used.
    odd = topics.upsert(
        unique("lt"),
        {"push-endpoint": DEAD_ENDPOINT, "OpaqueData": "a&b=c", "persistent": "true"},
    )
    bucket = unique("lb")
    s3 = connection(rgw).s3()
    s3.create_bucket(Bucket=bucket)
    notifications = NotificationClient(connection(rgw), topics=topics)
    try:
        notifications.put(bucket, NotificationConfig(id="n1", topic_arn=plain, events=()))
        listed = topics.list_all()
        for arn in (plain, odd):
            name = arn.rpartition(":")[2]
            assert listed[name] == topics.get(arn)
        assert listed[odd.rpartition(":")[2]].opaque_data == "a&b=c"
        assert listed[odd.rpartition(":")[2]].persistent
        # The copy Ceph made for n1 has the topic's ARN and the name n1_<topic>.
        assert all(topic.arn.rpartition(":")[2] == name for name, topic in listed.items())
        assert f"n1_{plain.rpartition(':')[2]}" not in listed
    finally:
        notifications.delete(bucket, "n1", [plain])
        notifications.close()
        s3.delete_bucket(Bucket=bucket)


async def test_checks_share_one_listing_and_read_alone_what_it_cannot_tell(
    topics: TopicClient,
) -> None:
    first = topics.upsert(unique("lt"), {"push-endpoint": DEAD_ENDPOINT})
    second = topics.upsert(unique("lt"), {"push-endpoint": DEAD_ENDPOINT, "OpaqueData": "2"})
    counted = Counted(topics, reuse_s=3600)

    # Checks due together wait for one listing.
    found = await asyncio.gather(*(counted.find(arn) for arn in (first, second) * 5))
    assert [t.arn if t else None for t in found] == [first, second] * 5
    assert (counted.lists, counted.gets) == (1, [])

    # Made after the listing: read on its own, not reported missing.
    later = topics.upsert(unique("lt"), {"push-endpoint": DEAD_ENDPOINT})
    got = await counted.find(later)
    assert got is not None and got.arn == later
    # Deleted behind the operator's back after the listing: the listing still has it (seen
    # at the next one); one that never existed is read and missing.
    missing = f"{first.rpartition(':')[0]}:{unique('never')}"
    assert await counted.find(missing) is None
    assert counted.gets == [later, missing]

    # Written by the operator: read on its own until the next listing.
    topics.upsert(second.rpartition(":")[2], {"push-endpoint": DEAD_ENDPOINT, "OpaqueData": "3"})
    counted.listing.forget(second.rpartition(":")[2])
    got = await counted.find(second)
    assert got is not None and got.opaque_data == "3"
    assert counted.gets[-1] == second and counted.lists == 1


async def test_a_listing_older_than_the_interval_is_taken_again(topics: TopicClient) -> None:
    arn = topics.upsert(unique("lt"), {"push-endpoint": DEAD_ENDPOINT, "OpaqueData": "old"})
    counted = Counted(topics, reuse_s=0.5)
    got = await counted.find(arn)
    assert got is not None and got.opaque_data == "old"
    topics.upsert(arn.rpartition(":")[2], {"push-endpoint": DEAD_ENDPOINT, "OpaqueData": "new"})
    await asyncio.sleep(0.6)
    got = await counted.find(arn)
    assert got is not None and got.opaque_data == "new"
    assert (counted.lists, counted.gets) == (2, [])


async def test_a_refused_listing_falls_back_to_reading_each_topic(
    rgw: LocalService, topics: TopicClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ceph 16 refuses ListTopics over plain HTTP while any topic of the tenant holds a
    secret: the checks then read their topics one by one, without asking for a listing
    again within the interval."""
    plain = topics.upsert(unique("lt"), {"push-endpoint": DEAD_ENDPOINT})
    earlier = Counted(topics, reuse_s=1.0)
    assert await earlier.find(plain) is not None and earlier.lists == 1
    monkeypatch.setenv("AWS_CA_BUNDLE", rgw["RGW_CA_PEM"])
    over_tls = TopicClient(replace(connection(rgw), endpoint=rgw["RGW_TLS_ENDPOINT"]))
    secret = over_tls.upsert(
        unique("lt"), {"push-endpoint": "amqp://user:pass@127.0.0.1:9", "amqp-exchange": "x"}
    )
    try:
        with pytest.raises(GatewayError):
            topics.list_all()
        counted = Counted(topics, reuse_s=3600)
        for _ in range(3):
            got = await counted.find(plain)
            assert got is not None and got.arn == plain
        assert (counted.lists, counted.gets) == (1, [plain] * 3)
        # A listing taken before the refusal is out of date: it answers nothing any more.
        await asyncio.sleep(1.1)
        topics.upsert(plain.rpartition(":")[2], {"push-endpoint": DEAD_ENDPOINT, "OpaqueData": "x"})
        for _ in range(2):
            got = await earlier.find(plain)
            assert got is not None and got.opaque_data == "x"
        assert (earlier.lists, earlier.gets) == (2, [plain] * 2)
        # Over HTTPS the same tenant's listing is answered, the secret-holding topic in it.
        assert secret.rpartition(":")[2] in over_tls.list_all()
    finally:
        over_tls.delete(secret)
        over_tls.close()


def test_a_listing_longer_than_a_page_holds_every_topic(
    rgw: LocalService, topics: TopicClient
) -> None:
    """Ceph 20 answers ListTopics in pages of 100 topics of the whole tenant and writes
    ``NextToken`` where boto3 does not look (after ``ResponseMetadata``): read from the body,
    the pages are followed, and every topic is listed once."""
    made = [topics.upsert(unique("page"), {"push-endpoint": DEAD_ENDPOINT}) for _ in range(105)]
    listed = topics.list_all()
    assert {arn.rpartition(":")[2] for arn in made} <= set(listed)
    arns = topics.list_arns()
    assert set(made) <= set(arns)
    assert len(arns) == len(set(arns))
    if release_of(rgw).refuses_dotted_topic_names:  # 19 and later page: more than one here
        assert len(sns_client(rgw).list_topics()["Topics"]) < len(arns)
