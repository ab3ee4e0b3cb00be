"""Topics on the gateway through its SNS-compatible API.

Attribute names are exactly the reference's (``push-endpoint``, ``amqp-exchange``, ...);
``GatewayTopic`` is what GetTopicAttributes reports back, parsed.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import GatewayNotFound, mapped_errors

__all__ = ["GatewayTopic", "TopicClient", "next_token"]


@dataclass(frozen=True)
class GatewayTopic:
    """A topic as the gateway reports it."""

    arn: str
    name: str
    endpoint_address: str = field(repr=False)
    endpoint_args: dict[str, str] = field(repr=False)
    endpoint_topic: str
    persistent: bool
    opaque_data: str
    policy: str
    has_stored_secret: bool
    queue_limits: dict[str, str] = field(default_factory=dict)
    """``time_to_live`` and ``max_retries`` where the gateway keeps them as fields of their
    own (Ceph 20; ``None`` there means not set, and is left out); 18 keeps them among the
    endpoint's arguments."""

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> GatewayTopic:
        """From GetTopicAttributes: the endpoint is a JSON document in ``EndPoint``."""
        return cls.from_parts(attributes, json.loads(attributes.get("EndPoint") or "{}"))

    @classmethod
    def from_parts(cls, attributes: Mapping[str, str], endpoint: Mapping[str, Any]) -> GatewayTopic:
        """From the topic's fields and its endpoint's (ListTopics nests them as elements)."""
        # Ceph echoes the raw form fields (Attributes.entry.N.key/value) beside the flattened
        # attributes; only the flattened ones say what the topic is.
        args = {
            key: value
            for key, value in parse_qsl(endpoint.get("EndpointArgs", ""), keep_blank_values=True)
            if not key.startswith("Attributes.entry.") and key != "Version"
        }
        return cls(
            arn=attributes["TopicArn"],
            name=attributes.get("Name", ""),
            endpoint_address=endpoint.get("EndpointAddress", ""),
            endpoint_args=args,
            endpoint_topic=endpoint.get("EndpointTopic", ""),
            persistent=str(endpoint.get("Persistent", "false")).lower() == "true",
            opaque_data=attributes.get("OpaqueData", ""),
            # Its own attribute on 18 and 20; 16.2 has it among the endpoint's arguments only.
            policy=attributes.get("Policy") or args.get("Policy", ""),
            has_stored_secret=str(endpoint.get("HasStoredSecret", "false")).lower() == "true",
            queue_limits={
                name: str(endpoint[field_name])
                for name, field_name in (
                    ("time_to_live", "TimeToLive"),
                    ("max_retries", "MaxRetries"),
                )
                if str(endpoint.get(field_name, "None")) != "None"
            },
        )


class TopicClient:
    """CreateTopic, GetTopicAttributes, DeleteTopic and ListTopics for one gateway user.

    Blocking (boto3): call it from a worker thread in async code. boto3 clients may be
    shared between threads; building one costs tens of milliseconds of CPU.
    """

    def __init__(self, connection: GatewayConnection) -> None:
        self._sns = connection.sns()
        self._sns.meta.events.register("after-call.sns.ListTopics", _keep_body)

    def close(self) -> None:
        self._sns.close()

    def count_requests(self, counted: Callable[[str], None]) -> None:
        """Call ``counted(operation)`` for every HTTP request sent, retries included."""
        self._sns.meta.events.register("before-send.sns", _counting(counted))

    def upsert(self, name: str, attributes: Mapping[str, str]) -> str:
        """Create the topic, or replace its attributes when it exists; return its ARN."""
        with mapped_errors(f"CreateTopic {name}"):
            response = self._sns.create_topic(Name=name, Attributes=dict(attributes))
        return response["TopicArn"]

    def get(self, arn: str) -> GatewayTopic | None:
        """The topic, or None when the gateway has no topic with this ARN."""
        try:
            with mapped_errors(f"GetTopicAttributes {arn}"):
                response = self._sns.get_topic_attributes(TopicArn=arn)
        except GatewayNotFound:
            return None
        return GatewayTopic.from_attributes(response["Attributes"])

    def delete(self, arn: str) -> None:
        """Delete the topic; a topic already gone is not an error."""
        try:
            with mapped_errors(f"DeleteTopic {arn}"):
                self._sns.delete_topic(TopicArn=arn)
        except GatewayNotFound:
            pass

    def list_all(self) -> dict[str, GatewayTopic]:
        """Every topic of the user by name, attributes included: one request where ``get``
        of each costs one per topic (and Ceph 16 reads its whole topics object for each).

        Ceph lists a topic once more for every notification holding a copy of it (named
        ``<id>_<topic>``, the same ARN); only the topic itself, whose name is the ARN's, is
        kept. Over plain HTTP Ceph refuses the whole list (an error) as soon as one topic
        holds a secret.
        """
        topics: dict[str, GatewayTopic] = {}
        token = None
        while True:
            with mapped_errors("ListTopics"):
                response: Any = (
                    self._sns.list_topics(NextToken=token) if token else self._sns.list_topics()
                )
            for topic in parse_listing(response[RAW_BODY]):
                if topic.arn.rpartition(":")[2] == topic.name:
                    topics[topic.name] = topic
            token = next_token(response)
            if not token:
                return topics

    def list_arns(self) -> list[str]:
        """Every topic ARN of the user, each once (Ceph 19+ answers in pages, see
        ``next_token``)."""
        arns: list[str] = []
        token = None
        while True:
            with mapped_errors("ListTopics"):
                response: Any = (
                    self._sns.list_topics(NextToken=token) if token else self._sns.list_topics()
                )
            arns += [t["TopicArn"] for t in response.get("Topics", [])]
            token = next_token(response)
            if not token:
                # Ceph 16 and 18 list a topic once more for every notification holding a
                # copy of it.
                return list(dict.fromkeys(arns))


RAW_BODY = "bucketnotify:body"


def _counting(counted: Callable[[str], None]) -> Callable[..., None]:
    def before_send(event_name: str, **_: Any) -> None:
        # botocore names the event "before-send.<service>.<Operation>".
        counted(event_name.rsplit(".", 1)[-1])

    return before_send


def _keep_body(http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
    # boto3's SNS model keeps only TopicArn of each listed topic; Ceph sends it all.
    parsed[RAW_BODY] = http_response.content


def next_token(response: Any) -> str | None:
    """The token of the next page of a ListTopics answer, None after the last.

    Ceph 20 pages by 100 topics of the whole tenant (a user's own page may hold none of
    them) and writes ``NextToken`` after ``ResponseMetadata``, outside the result element
    where boto3 looks: without reading the body, every topic past the first page is
    missed."""
    token = response.get("NextToken")
    if token:
        return str(token)
    body = response.get(RAW_BODY)
    # Most answers have none (16.2, 18.2, a last page): no second parse of a long listing.
    if not body or b"NextToken" not in body:
        return None
    root = ET.fromstring(body)  # noqa: S314 - the gateway's own answer
    found = next((e.text for e in root.iter() if _local(e.tag) == "NextToken"), None)
    return found.strip() if found and found.strip() else None


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _fields(element: ET.Element) -> dict[str, str]:
    return {_local(child.tag): child.text or "" for child in element if len(child) == 0}


def parse_listing(body: bytes) -> list[GatewayTopic]:
    """The topics of a ListTopics answer, in its order (copies included)."""
    root = ET.fromstring(body)  # noqa: S314 - the gateway's own answer
    topics = []
    for member in root.iter():
        if _local(member.tag) != "member":
            continue
        endpoint = next((c for c in member if _local(c.tag) == "EndPoint"), None)
        attributes = _fields(member)
        if "TopicArn" in attributes:
            endpoint_fields = _fields(endpoint) if endpoint is not None else {}
            topics.append(GatewayTopic.from_parts(attributes, endpoint_fields))
    return topics
