"""Bucket notifications on the gateway through its S3 API (``/<bucket>?notification``).

Raw requests signed with botocore's SigV4 signer: boto3's S3 model knows only the S3Key
filter and silently drops Ceph's S3Metadata and S3Tags filters, so the XML is built and
parsed here.

What Ceph 16.2 does, measured on the test gateway (docs/gateway-compatibility.md), and what follows:

- It files a notification under its Id *and* its topic: a PUT that gives an existing Id
  another topic adds a second entry with the same Id beside the old one, ``GET
  ?notification=<id>`` shows only one of them and a DELETE removes one. ``put`` deletes the
  old entries first when the topic changes; ``get`` and ``delete`` work from the full list.
- A PUT keeps the bucket's other Ids (AWS would replace the whole configuration); an empty
  configuration is refused (400 MalformedXML). ``put`` reads, merges and writes the whole
  configuration anyway, so it never drops another Id on a gateway that replaces.
- A PUT naming a topic that does not exist is refused with 404 NoSuchKey, after the entries
  before it were applied. A notification outlives its topic, so another Id's entry can name
  a deleted topic: ``put`` sends its own entry first and checks that it landed.
- ``DELETE ?notification`` without an Id, or with an empty one, deletes every notification
  of the bucket: ``delete`` refuses an empty Id.
- Error answers carry a Code and no Message.
- A PUT also makes a topic of the user named ``<id>_<topic name>``, a copy of the topic
  (``topic_to_unique`` in Ceph's ``rgw_rest_pubsub.cc``), and ``DELETE ?notification=<id>``
  removes the bucket's entry first and that copy second, each a separate write. Either
  write can fail on its own (500 when another write to the user's topics came between), and
  a second DELETE then finds no entry and answers 200 while the copy stays, or answers 200
  with the entry kept. ``delete_entries`` therefore re-reads the configuration until the Id
  is gone, and ``remove_copy`` deletes the copy by its name with DeleteTopic (which takes
  any topic of the user) and reads it back.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from bucketnotify.api.notification import EVENT_TYPES
from bucketnotify.gateway import obs
from bucketnotify.gateway.connection import GatewayConnection, GatewayKind
from bucketnotify.gateway.errors import (
    GatewayError,
    GatewayInvalidArgument,
    GatewayServerError,
    GatewayUnreachable,
    error_code,
    error_for_response,
)
from bucketnotify.gateway.topics import TopicClient

__all__ = ["FilterRule", "NotificationClient", "NotificationConfig", "copy_topic_arn"]

S3_NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"

# As connection.CLIENT_CONFIG: short, and no retries of our own (the operator backs off).
TIMEOUT = httpx.Timeout(20.0, connect=5.0)

# What Ceph stores for a configuration without any Event, and reports back.
DEFAULT_EVENTS = ("s3:ObjectCreated:*", "s3:ObjectRemoved:*")

# Ceph 16 also takes its own event names and reports them back under the S3 name; Ceph 20
# reports the "Noncurrent" events (the one spelling 18 takes too) as "NonCurrent".
EVENT_ALIASES = {
    "OBJECT_CREATE": "s3:ObjectCreated:*",
    "OBJECT_DELETE": "s3:ObjectRemoved:Delete",
    "DELETE_MARKER_CREATE": "s3:ObjectRemoved:DeleteMarkerCreated",
    "s3:ObjectLifecycle:Expiration:NonCurrent": "s3:ObjectLifecycle:Expiration:Noncurrent",
    "s3:ObjectLifecycle:Transition:NonCurrent": "s3:ObjectLifecycle:Transition:Noncurrent",
}

# The events Ceph 16 knows; newer releases know more (GatewayRelease.refused_events). Only
# used to explain a refusal.
CEPH16_EVENTS = frozenset(
    e for e in EVENT_TYPES if e.startswith(("s3:ObjectCreated:", "s3:ObjectRemoved:"))
)

# Ceph keeps one slot per key rule and reports them in this order.
KEY_RULE_ORDER = ("prefix", "suffix", "regex")

# Reads of the configuration after a DELETE before the Id is declared kept: a DELETE that
# answered 200 can have left the entry (see the module's notes), and one more DELETE then
# removes it.
DELETE_ROUNDS = 3


def copy_topic_arn(topic_arn: str, id: str) -> str:
    """The ARN of the copy of ``topic_arn`` Ceph 16 makes for notification ``id``.

    ``arn:aws:sns:<zonegroup>:<tenant>:<topic>`` becomes ``...:<id>_<topic>``. Only the name
    counts (Ceph's DeleteTopic and GetTopicAttributes look the topic up by the ARN's last
    part); the copy keeps the original's ARN in its own attributes, which is why ListTopics
    shows the original ARN once more per notification instead of the copy's name.
    """
    prefix, _, name = topic_arn.rpartition(":")
    if not prefix or not name:
        raise ValueError(f"not a topic ARN: {topic_arn!r}")
    return f"{prefix}:{id}_{name}"


@dataclass(frozen=True)
class FilterRule:
    """One filter rule.

    ``name`` is ``prefix``, ``suffix`` or ``regex`` in a key filter, the metadata key (with
    its ``x-amz-meta-`` prefix) in a metadata filter and the tag key in a tag filter.
    """

    name: str
    value: str


@dataclass(frozen=True)
class NotificationConfig:
    """One notification (a TopicConfiguration) of a bucket, in a normal form.

    Normalised on construction, the way Ceph 16 stores it, so that what ``put`` sends
    compares equal to what ``get`` reads back afterwards:

    - no events, or exactly ``s3:ObjectCreated:*`` and ``s3:ObjectRemoved:*``, become
      ``()``: Ceph stores an empty list as those two and reports them back.
    - Ceph's own event names (``OBJECT_CREATE``, ...) become the S3 names it reports.
      Other events keep their order and repetitions, as Ceph keeps them.
    - key rules are ordered prefix, suffix, regex, and rules with an empty value dropped
      (Ceph stores an empty rule as no rule).
    - metadata and tag rules are sorted by name, then value (Ceph keeps them in a map).
    """

    id: str
    topic_arn: str
    events: tuple[str, ...]
    key_filters: tuple[FilterRule, ...] = ()
    metadata_filters: tuple[FilterRule, ...] = ()
    tag_filters: tuple[FilterRule, ...] = ()

    def __post_init__(self) -> None:
        events = tuple(EVENT_ALIASES.get(event, event) for event in self.events)
        if sorted(events) == sorted(DEFAULT_EVENTS):
            events = ()
        key_filters = sorted(
            (rule for rule in self.key_filters if rule.value),
            key=lambda rule: _key_rule_rank(rule.name),
        )
        # Set through object.__setattr__: the class is frozen, and lists given by a caller
        # must become tuples too, or they would never compare equal to a parsed config.
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "key_filters", tuple(key_filters))
        object.__setattr__(self, "metadata_filters", _sorted_rules(self.metadata_filters))
        object.__setattr__(self, "tag_filters", _sorted_rules(self.tag_filters))


def _key_rule_rank(name: str) -> int:
    # A name Ceph does not know sorts last; the gateway refuses it anyway.
    return KEY_RULE_ORDER.index(name) if name in KEY_RULE_ORDER else len(KEY_RULE_ORDER)


def _sorted_rules(rules: Iterable[FilterRule]) -> tuple[FilterRule, ...]:
    return tuple(sorted(rules, key=lambda rule: (rule.name, rule.value)))


# `list` is a method name in NotificationClient
Configs = list[NotificationConfig]
Topics = list[str]


class NotificationClient:
    """GET, PUT and DELETE of ``/<bucket>?notification`` for one gateway user.

    Blocking (httpx): call it from a worker thread in async code. Safe to share between
    threads; building one costs a TLS context (memory and CPU, docs/performance-notes.md),
    so share one per connection rather than make one per call.
    ``topics`` serves the removal of Ceph's topic copies; made from ``connection`` if None.
    """

    def __init__(self, connection: GatewayConnection, topics: TopicClient | None = None) -> None:
        self._endpoint = connection.endpoint.rstrip("/")
        self._credentials = Credentials(connection.access_key, connection.secret_key)
        self._region = connection.region
        self._kind = connection.kind
        # The CA boto3 would use: httpx alone reads SSL_CERT_FILE, not AWS_CA_BUNDLE, and
        # failed every request to a gateway with a private CA.
        self._http = httpx.Client(timeout=TIMEOUT, verify=connection.ssl_context())
        self._topics = topics if topics is not None else TopicClient(connection)

    def close(self) -> None:
        self._http.close()

    def count_requests(self, counted: Callable[[str], None]) -> None:
        """Call ``counted(operation)`` for every HTTP request sent (the topic client's
        requests are its own to count)."""

        def on_request(request: httpx.Request) -> None:
            counted(_OPERATIONS.get(request.method, request.method))

        self._http.event_hooks["request"].append(on_request)

    def __enter__(self) -> NotificationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list(self, bucket: str) -> Configs:
        """Every notification of the bucket, in the gateway's order."""
        body = self._send("GET", bucket, None, b"", f"GetBucketNotification {bucket}")
        return parse_configuration(body, self._kind)

    def get(self, bucket: str, id: str) -> NotificationConfig | None:
        """The bucket's notification with this Id, or None.

        Should a foreign client have left several entries with this Id (see the module's
        notes), the first is returned; ``list`` shows them all and ``put`` cleans them up.
        """
        for config in self.list(bucket):
            if config.id == id:
                return config
        return None

    def put(self, bucket: str, config: NotificationConfig) -> None:
        """Create or replace the notification with ``config.id``; the others stay.

        Not atomic: another writer between the read and the write can be overwritten on a
        gateway that replaces whole configurations (Ceph 16 does not).
        """
        self.put_many(bucket, [config])

    def put_many(self, bucket: str, configs: Configs) -> None:
        """Create or replace the notifications with these Ids (distinct) in one write; the
        bucket's other Ids stay.

        One refused entry refuses the write, and Ceph 16 applies the entries before it:
        the caller finds out which one by putting them one at a time.
        """
        ids = [config.id for config in configs]
        if not configs or len(set(ids)) != len(ids):
            raise ValueError(f"put_many takes distinct Ids, not {ids}")
        for config in configs:
            _check(config, self._kind)
        operation = f"PutBucketNotification {bucket}/{','.join(ids)}"
        current = self.list(bucket)
        for config in configs:
            same_id = [c for c in current if c.id == config.id]
            # OBS replaces the whole configuration on a PUT, so the one below replaces the Id.
            if self._kind == "ceph" and (
                len(same_id) > 1 or any(c.topic_arn != config.topic_arn for c in same_id)
            ):
                # A PUT would add an entry beside the old one instead of replacing it, and a
                # DELETE removes one entry at a time. Events are missed until the PUT below.
                for arn in self.delete_entries(bucket, config.id):
                    if arn != config.topic_arn:  # the PUT below remakes the copy of its topic
                        self._remove_copy_on_ceph(config.id, arn)
        others = [c for c in current if c.id not in ids]
        # Ours first: Ceph 16 applies the entries in order and stops at the first it cannot,
        # so a foreign entry that no longer applies cannot keep ours out.
        body = render_configuration([*configs, *others], self._kind)
        response = self._exchange("PUT", bucket, None, body, operation)
        if response.is_success:
            return
        code, detail = error_code(response.content)
        if code == "NoSuchKey" and others:
            # Ceph's answer when a topic of the configuration does not exist. When ours
            # are in place, it was another entry's (its topic deleted since it was set up):
            # a gateway that keeps other Ids keeps that one as it was (16.2 applies the
            # entries before the one it refuses).
            landed = self.list(bucket)
            if all(config in landed for config in configs):
                return
            if self._kind == "ceph":
                # Ceph 20 refuses the whole configuration instead. Every Ceph release keeps
                # the Ids a PUT does not name (measured on 16.2, 18.2 and 20.2), so ours
                # alone go in and the orphan stays as it was.
                response = self._exchange(
                    "PUT", bucket, None, render_configuration(configs, self._kind), operation
                )
                if response.is_success:
                    return
                code, detail = error_code(response.content)
        if code == "NoSuchKey":
            arns = ", ".join(sorted({config.topic_arn for config in configs}))
            detail = detail or f"is there a topic {arns}?"
        elif code == "InvalidArgument":
            # Ceph 16 and 18 say no more than the code for an unknown event, and 20 names
            # the notification's Id as the unknown event type: name the suspects.
            unknown = [e for config in configs for e in config.events if e not in CEPH16_EVENTS]
            if unknown:
                suspects = "events a Ceph 16 gateway does not know: " + ", ".join(unknown)
                detail = f"{detail} ({suspects})" if detail else suspects
        raise error_for_response(operation, response.status_code, code, detail)

    def delete(self, bucket: str, id: str, topic_arns: Iterable[str] = ()) -> None:
        """Delete the notification with this Id and Ceph's copies of its topics, and check
        that they are gone; what is not there is not an error.

        ``topic_arns``: topics the Id may have named besides those the bucket still shows
        (an entry removed by an earlier, failed DELETE no longer says which copy it left).
        """
        arns: set[str] = {*topic_arns, *self.delete_entries(bucket, id)}
        for arn in sorted(arns):
            self._remove_copy_on_ceph(id, arn)

    def delete_entries(self, bucket: str, id: str) -> Topics:
        """Delete every entry of the bucket with this Id until a read shows none; returns
        the topic ARNs the entries named (whose copies ``remove_copy`` deletes).

        Raises GatewayServerError when the Id is still there after DELETE_ROUNDS reads.
        """
        if not id:
            # An empty value deletes all the bucket's notifications.
            raise ValueError("a notification id must not be empty")
        if self._kind == "obs":
            return self._delete_by_rewrite(bucket, id)
        arns: Topics = []
        failure: GatewayServerError | None = None
        # At least one DELETE even when the read found none, so that a concurrent create loses.
        at_least = 1
        for _ in range(DELETE_ROUNDS):
            entries = [config for config in self.list(bucket) if config.id == id]
            arns += [c.topic_arn for c in entries if c.topic_arn not in arns]
            if not entries and not at_least:
                return arns
            for _ in range(max(len(entries), at_least)):
                try:
                    self._delete_one(bucket, id)
                except GatewayServerError as exc:
                    # The entry may be gone and the copy not: the next read says which.
                    failure = exc
            at_least = 0
        if not any(config.id == id for config in self.list(bucket)):
            return arns
        if failure is not None:
            raise failure
        raise GatewayServerError(
            f"DeleteBucketNotification {bucket}/{id}: the gateway answered success but still"
            f" has the Id after {DELETE_ROUNDS} tries"
        )

    def _delete_by_rewrite(self, bucket: str, id: str) -> Topics:
        """OBS has no DELETE of one Id (a Ceph extension): the configuration is written
        again without it (an empty one turns notifications off)."""
        current = self.list(bucket)
        mine = [c.topic_arn for c in current if c.id == id]
        if mine:
            body = render_configuration([c for c in current if c.id != id], self._kind)
            self._send("PUT", bucket, None, body, f"PutBucketNotification {bucket} without {id}")
        return mine

    def _remove_copy_on_ceph(self, id: str, topic_arn: str) -> None:
        # OBS makes no copies of its SMN topics (and has no SNS API to delete one with).
        if self._kind == "ceph":
            self.remove_copy(id, topic_arn)

    def remove_copy(self, id: str, topic_arn: str) -> None:
        """Delete the topic copy Ceph made of ``topic_arn`` for notification ``id``, and check
        that it is gone.

        Ceph's own DELETE of the notification removes it too; this is for the copy a failed
        DELETE (or the rollback of a failed PUT) left. Should another bucket of the user hold
        a notification with the same Id on the same topic, they share the copy: Ceph removes
        it in that case as well, and delivers from the bucket's own record of the topic.
        """
        arn = copy_topic_arn(topic_arn, id)
        if self._topics.get(arn) is None:
            return  # a read, so that a clean gateway costs no write to the user's topics
        self._topics.delete(arn)
        if self._topics.get(arn) is not None:
            raise GatewayServerError(
                f"DeleteTopic {arn}: the gateway answered success but kept the topic"
            )

    def _delete_one(self, bucket: str, id: str) -> None:
        self._send("DELETE", bucket, id, b"", f"DeleteBucketNotification {bucket}/{id}")

    def _send(self, method: str, bucket: str, id: str | None, body: bytes, operation: str) -> bytes:
        response = self._exchange(method, bucket, id, body, operation)
        if response.is_success:
            return response.content
        code, detail = error_code(response.content)
        raise error_for_response(operation, response.status_code, code, detail)

    def _exchange(
        self, method: str, bucket: str, id: str | None, body: bytes, operation: str
    ) -> httpx.Response:
        """One signed request; the gateway's answer, whatever its status."""
        # Path style, as connection.CLIENT_CONFIG: bucket names need no DNS records.
        url = f"{self._endpoint}/{quote(bucket, safe='')}?notification"
        if id is not None:
            url += "=" + quote(id, safe="")
        headers = {"Content-Type": "application/xml"} if body else {}
        request = AWSRequest(method=method, url=url, data=body, headers=headers)
        S3SigV4Auth(self._credentials, "s3", self._region).add_auth(request)
        try:
            return self._http.request(
                method, url, content=body, headers=dict(request.headers.items())
            )
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            # The exception's text may carry the URL; the type says enough.
            raise GatewayUnreachable(
                f"{operation}: the gateway did not answer ({type(exc).__name__})"
            ) from None
        except httpx.HTTPError as exc:
            raise GatewayError(f"{operation}: {type(exc).__name__}") from None


# The S3 names of what a request of ``_exchange`` is (all go to ``/<bucket>?notification``).
_OPERATIONS = {
    "GET": "GetBucketNotificationConfiguration",
    "PUT": "PutBucketNotificationConfiguration",
    "DELETE": "DeleteBucketNotification",
}


def _check(config: NotificationConfig, kind: GatewayKind) -> None:
    """Refuse what the gateway would store differently from what was sent, or cannot hold.

    Such a config would never compare equal to what ``get`` reads back: endless drift.
    """
    operation = f"PutBucketNotification {config.id}"
    if not config.id:
        raise GatewayInvalidArgument(f"{operation}: not sent: the notification id is empty")
    refused = obs.problem(config) if kind == "obs" else None
    if refused is not None:
        raise GatewayInvalidArgument(f"{operation}: not sent: {refused}")
    for filter_kind, rules in (("metadata", config.metadata_filters), ("tag", config.tag_filters)):
        names = [rule.name for rule in rules]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            # Ceph keeps only the first rule of a name, silently.
            raise GatewayInvalidArgument(
                f"{operation}: not sent: {filter_kind} filter names given more than once: "
                + ", ".join(repeated)
            )


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _child_text(element: ET.Element, name: str, strip: bool = True) -> str:
    for child in element:
        if _local(child.tag) == name:
            return (child.text or "").strip() if strip else child.text or ""
    return ""


def _rules(filter_element: ET.Element | None, name: str) -> tuple[FilterRule, ...]:
    if filter_element is None:
        return ()
    rules: list[FilterRule] = []
    for group in filter_element:
        if _local(group.tag) != name:
            continue
        for rule in group:
            if _local(rule.tag) == "FilterRule":
                # Unstripped: the gateway keeps a value's spaces, and so must the comparison
                # with the spec, or a prefix ending in a space is "drift" forever.
                rules.append(
                    FilterRule(
                        _child_text(rule, "Name", strip=False),
                        _child_text(rule, "Value", strip=False),
                    )
                )
    return tuple(rules)


def parse_configuration(body: bytes, kind: GatewayKind = "ceph") -> Configs:
    """The TopicConfigurations of a NotificationConfiguration document (in the dialect of
    ``kind``), in the normal form."""
    if not body.strip():
        return []
    try:
        root = ET.fromstring(body)  # noqa: S314 - the gateway's own answer
    except ET.ParseError as exc:
        raise GatewayError(f"the gateway's notification configuration is not XML: {exc}") from None
    configs: Configs = []
    for element in root:
        if _local(element.tag) != "TopicConfiguration":
            continue
        filter_element = next((c for c in element if _local(c.tag) == "Filter"), None)
        configs.append(
            NotificationConfig(
                id=_child_text(element, "Id", strip=False),
                topic_arn=_child_text(element, "Topic", strip=False),
                events=_events(element, kind),
                key_filters=_rules(filter_element, "Object" if kind == "obs" else "S3Key"),
                metadata_filters=_rules(filter_element, "S3Metadata"),
                tag_filters=_rules(filter_element, "S3Tags"),
            )
        )
    return configs


def _events(element: ET.Element, kind: GatewayKind) -> tuple[str, ...]:
    events = ((c.text or "").strip() for c in element if _local(c.tag) == "Event")
    return tuple(obs.to_s3_event(e) for e in events) if kind == "obs" else tuple(events)


def render_configuration(
    configs: Iterable[NotificationConfig], kind: GatewayKind = "ceph"
) -> bytes:
    """A NotificationConfiguration document in the dialect of ``kind``; for Ceph (S3's
    own), elements in the order Ceph reports them."""
    if kind == "obs":
        return obs.render(configs)
    root = ET.Element("NotificationConfiguration", xmlns=S3_NAMESPACE)
    for config in configs:
        element = ET.SubElement(root, "TopicConfiguration")
        ET.SubElement(element, "Id").text = config.id
        ET.SubElement(element, "Topic").text = config.topic_arn
        groups = (
            ("S3Key", config.key_filters),
            ("S3Metadata", config.metadata_filters),
            ("S3Tags", config.tag_filters),
        )
        if any(rules for _, rules in groups):
            filter_element = ET.SubElement(element, "Filter")
            for name, rules in groups:
                if not rules:
                    continue
                group = ET.SubElement(filter_element, name)
                for rule in rules:
                    rule_element = ET.SubElement(group, "FilterRule")
                    ET.SubElement(rule_element, "Name").text = rule.name
                    ET.SubElement(rule_element, "Value").text = rule.value
        for event in config.events:
            ET.SubElement(element, "Event").text = event
    document: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return document
